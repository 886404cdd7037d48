"""The command groups of `batchyard` (their Typer apps: name, help, options), apart from the
modules that add their commands, and the help of the root's commands defined in other modules
(`COMMAND_HELP`): `batchyard --help` lists each group and command from here without importing
(or, with no .pyc files, compiling) those modules; running a group imports its module
(`main.PARTS`), which adds the commands to the same app."""

from __future__ import annotations

import typer

server = typer.Typer(help="Run the batchyard server (API + scheduler) in the background.",
                     no_args_is_help=True)
workspace = typer.Typer(help="Workspaces: namespaces for clusters, experiments and jobs.",
                        no_args_is_help=True)
cluster = typer.Typer(help="Clusters: named pools of nodes.", no_args_is_help=True)
experiment = typer.Typer(help="Experiments: named groups of jobs.", no_args_is_help=True)
job = typer.Typer(help="Jobs: gangs of processes running one command.", no_args_is_help=True)
sweep = typer.Typer(help="Hyperparameter sweeps: trials (jobs) with sampled parameters.",
                    no_args_is_help=True)
datastore = typer.Typer(help="Datastores: local directories, Azure Blob containers, S3 buckets.",
                        no_args_is_help=True)
user = typer.Typer(help="Users and service accounts (admin).", no_args_is_help=True)
token = typer.Typer(help="Personal tokens: make, list and revoke your API tokens.",
                    no_args_is_help=True)
team = typer.Typer(help="Teams: named groups of users that roles can be given to.",
                   no_args_is_help=True)
role = typer.Typer(help="Roles in a workspace: reader < contributor < owner.",
                   no_args_is_help=True)
usage = typer.Typer(help="vCPU and GPU use per node family against the workspace's quota; "
                    "`usage report`: GPU-, CPU- and node-hours by user, team, workspace, "
                    "cluster or size, with costs (admins).", invoke_without_command=True)
price = typer.Typer(help="Prices of node sizes, for the usage report's costs.",
                    no_args_is_help=True)
budget = typer.Typer(help="Budgets of GPU-hours per team: warn, or hold its jobs.",
                     no_args_is_help=True)
audit = typer.Typer(help="The audit trail: who did what, when, from where (admins, "
                    "workspace owners).", no_args_is_help=True)

# The help of the root's commands that other modules define (`main.PARTS`), given to Typer as
# their `help=` (their functions have no docstring): root help lists them without importing
# their modules.
COMMAND_HELP = {
    "portal": """Print the web portal's sign-in link (--open: open it, signed in).

    Starts the local server if none runs; sign in with the token `batchyard server token`
    prints, or let --open sign the browser in with a one-time link (as Jupyter's ?token=: it
    works once, for a short while, and is not the admin token).""",
    "agent": "Run the node agent (a long-running daemon, one per machine).",
    "login": """Sign in to a batchyard server and keep the credential for it.

    Stores it in ~/.batchyard/credentials ($BATCHYARD_HOME/credentials, mode 0600); later
    commands talk to that server until `batchyard logout`. On a server with single sign-on,
    it prints a URL and a code to enter there in any browser (the device flow: no browser is
    needed here) and waits until you have signed in. Else, or with --with-token (read from
    stdin) or BATCHYARD_TOKEN, it takes a personal token (asked for when not given).""",
    "logout": "Forget the stored login (of --server, else of the current server).",
    "whoami": "Who the server takes you for: user, admin or not, roles per workspace.",
}
