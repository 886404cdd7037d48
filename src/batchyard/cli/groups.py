"""The command groups of `batchyard` (their Typer apps: name, help, options), apart from the
modules that add their commands: `batchyard --help` lists each group from here without
importing (or, with no .pyc files, compiling) those modules; running a group imports its
module (`main.PARTS`), which adds the commands to the same app."""

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
