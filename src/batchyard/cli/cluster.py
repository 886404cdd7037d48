"""`batchyard cluster` (create/list/show/resize/delete, node list/exec)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from batchyard.cli import complete, groups
from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    cluster_opt,
    console,
    counts,
    emit,
    err_console,
    fail,
    handled,
    human_size,
    human_time,
    key_values,
    name_arg,
    pick_name,
    table,
    ws_name,
)

app = groups.cluster
node_app = typer.Typer(help="The nodes of a cluster.", no_args_is_help=True)
app.add_typer(node_app, name="node")


def _register_diagnose() -> None:
    from batchyard.cli.diagnose import diagnose

    app.command("diagnose")(diagnose)


_register_diagnose()

COLUMNS = [("name", "Name"), ("backend", "Backend", "id?"), ("vm_size", "VM size", "id?"),
           ("vm_priority", "Priority", "id?"), ("allocation_state", "Allocation"),
           ("current_nodes", "Nodes", "num"), ("counts", "Node states", "text")]
NODE_COLUMNS = [("name", "Node"), ("address", "Address", "id?"), ("state", "State"),
                ("job", "Job", "id?"), ("cpus", "vCPU", "num?"), ("gpus", "GPU", "num?"),
                ("gpu_devices", "GPU devices", "text"),
                ("runtime", "Containers", "id?"), ("images", "Images", "num?"),
                ("health", "Health", "text"), ("reason", "Reason", "text")]
NameOpt = typer.Option(None, "--name", "-n", help="The cluster's name (or give it as NAME).",
                       autocompletion=complete.clusters)


def _render_list(rows: list[dict[str, Any]]) -> None:
    table([{**r, "counts": counts(r.get("node_counts"))} for r in rows], COLUMNS,
          empty="no clusters")


def _render_nodes(rows: list[dict[str, Any]]) -> None:
    table([{**r, "cpus": r["resources"].get("cpus"), "gpus": r["resources"].get("gpus"),
            "job": r.get("job_id"), "gpu_devices": "\n".join(r.get("gpu_devices") or []),
            **_containers(r["resources"].get("containers")),
            "health": _health_text(r.get("health"))}
           for r in rows], NODE_COLUMNS, empty="no nodes")


def _health_text(found: dict[str, Any] | None) -> str | None:
    """The last periodic health check, the passes toward coming back, a hold."""
    if not found or not found.get("last"):
        return "held until enabled" if found and found.get("held") else None
    text = "ok" if found["last"].get("ok") else "failed"
    if found.get("passes"):
        text += f", passed {found['passes']} in a row"
    return text + (", held until enabled" if found.get("held") else "")


def _containers(found: dict[str, Any] | None) -> dict[str, Any]:
    """The node's runtime and how many images it has cached ("none": no runtime)."""
    if not found:
        return {"runtime": "none", "images": None}
    return {"runtime": f"{found.get('runtime')} {found.get('version') or ''}".strip(),
            "images": found.get("images")}


def scale_text(scale: dict[str, Any] | None) -> str:
    """``{"manual": {"target_node_count": 2}}`` as ``manual, 2 nodes``."""
    scale = scale or {}
    if scale.get("manual"):
        return f"manual, {scale['manual'].get('target_node_count', 0)} node(s)"
    auto = scale.get("autoscale") or {}
    if auto:
        text = f"autoscale, {auto.get('min_nodes', 0)}-{auto.get('max_nodes')} nodes"
        if auto.get("idle_seconds_before_scaledown") is not None:
            text += f", idle {auto['idle_seconds_before_scaledown']:g}s before scale-down"
        return text
    return "set by the backend"


def size_text(size: dict[str, Any] | None, gpu_models: list[str] | None = None) -> str:
    """The size's figures; its GPUs named as the nodes found them (nvidia-smi), else as the
    size table names them."""
    size = size or {}
    cpus = size.get("vcpus", size.get("cpus"))
    parts = [f"{value:g} {label}" for value, label in (
        (cpus, "vCPU"), (size.get("gpus"), "GPU"), (size.get("memory_gb"), "GB memory"))
        if isinstance(value, int | float) and (value or label != "GPU")]
    model = ", ".join(gpu_models) if gpu_models else size.get("gpu_model")
    if size.get("gpus") and model:
        parts[-2] += f" ({model})"
    if size.get("family"):
        parts.append(f"family {size['family']}")
    return ", ".join(parts) or "-"


def jobs_text(c: dict[str, Any]) -> str:
    """Who a cluster's jobs run as and their limits per node, as `cluster show` says it."""
    from batchyard.spec.bytesize import human
    from batchyard.spec.cluster import DEFAULT_OUTPUT, DEFAULT_PIDS

    who = "root (--allow-root-jobs), / read-only" if c.get("allow_root_jobs") else \
        "an unprivileged uid per submitter"
    return (f"{who}; at most {c.get('max_pids') or DEFAULT_PIDS} processes and "
            f"{human(int(c.get('max_output') or DEFAULT_OUTPUT))} of outputs per job and node")


def _render_show(c: dict[str, Any]) -> None:
    data = {**c, "scale_text": scale_text(c.get("scale")), "counts": counts(c.get("node_counts")),
            "size_text": size_text(c.get("size"), c.get("gpu_models")),
            "created": human_time(c.get("created_at"))}
    if c.get("slurm"):
        data["slurm_text"] = ", ".join(f"{k} {v}" for k, v in c["slurm"].items() if v)
    if c.get("auto_storage"):
        data["auto_text"] = "$AZ_BATCHAI_MOUNT_ROOT/autobfs, autoafs (default datastore)"
    if c.get("image"):
        data["image_text"] = f"{c['image']} (recorded; nodes run their host's OS)"
    data["jobs_text"] = jobs_text(c)
    if c.get("health_check_every"):
        from batchyard.spec.durations import format_duration

        data["health_text"] = (f"every {format_duration(c['health_check_every'])}; back after "
                               f"{c.get('health_check_passes') or 3} passes in a row")
    if c.get("errors"):
        data["errors_text"] = "; ".join(str(e.get("message")) for e in c["errors"])
    key_values(data, [("name", "Name"), ("backend", "Backend"), ("vm_size", "VM size"),
                      ("size_text", "Node size"), ("image_text", "Image"),
                      ("auto_text", "Auto storage"), ("vm_priority", "Priority"),
                      ("scale_text", "Scale"), ("allocation_state", "Allocation"),
                      ("target_nodes", "Target nodes"), ("current_nodes", "Current nodes"),
                      ("counts", "Node states"), ("jobs_text", "Jobs run as"),
                      ("health_text", "Health checks"),
                      ("errors_text", "Error"),
                      ("slurm_text", "Slurm"), ("created", "Created")])
    if c.get("nodes"):
        _render_nodes(c["nodes"])


@app.command("create")
def create(
    name_arg_: str = name_arg("cluster"),
    name: str = typer.Option(None, "--name", "-n", help="Cluster name (or give it as NAME)."),
    workspace: str = WorkspaceOpt,
    vm_size: str = typer.Option(None, "--vm-size", "-s", help="Node size, e.g. Standard_NC6.",
                                autocompletion=complete.sizes),
    target: int = typer.Option(None, "--target", "-t", help="Node count (manual scale)."),
    min_nodes: int = typer.Option(None, "--min", help="Autoscale: minimum nodes."),
    max_nodes: int = typer.Option(None, "--max", help="Autoscale: maximum nodes."),
    vm_priority: str = typer.Option("dedicated", "--vm-priority",
                                    help="dedicated or lowpriority."),
    cpus: int = typer.Option(None, "--cpus", help="Explicit resources instead of a size."),
    gpus: int = typer.Option(None, "--gpus"),
    memory_gb: float = typer.Option(None, "--memory"),
    backend: str = typer.Option("local", "--backend", envvar="BATCHYARD_BACKEND",
                                help="local (default), machines (joined with `batchyard "
                                "agent`), ray, slurm."),
    heartbeat_timeout: float = typer.Option(None, "--heartbeat-timeout", help="Seconds "
                                            "without a heartbeat before a node (machines) or, "
                                            "after a server restart or failover, a node "
                                            "launcher is lost (default 30)."),
    preflight: str = typer.Option(None, "--preflight", help="Default pre-flight checks of "
                                  "its multi-node jobs: none, network, gpu or all."),
    health_every: str = typer.Option(None, "--health-check-every", help="local, machines: "
                                     "check idle nodes this often, e.g. 10m (disk, GPUs, "
                                     "server); a failing node is unusable until it passes "
                                     "3 times in a row."),
    address: str = typer.Option(None, "--address", help="Backend address (ray head)."),
    partition: str = typer.Option(None, "--partition", help="slurm: the partition whose nodes "
                                  "the cluster has (default: Slurm's default partition)."),
    account: str = typer.Option(None, "--account", help="slurm: sbatch --account."),
    qos: str = typer.Option(None, "--qos", help="slurm: sbatch --qos."),
    constraint: str = typer.Option(None, "--constraint", help="slurm: sbatch --constraint."),
    slurm_options: list[str] = typer.Option([], "--slurm-option", help="slurm: more sbatch "
                                            "options as KEY=VALUE (repeatable), e.g. mem=16G."),
    work_dir: str = typer.Option(None, "--work-dir", help="slurm: the node work dir on every "
                                 "Slurm node (default /tmp/batchyard-slurm)."),
    ray_token_file: str = typer.Option(None, "--ray-token-file", help="ray: file with the "
                                       "Ray cluster's auth token (never shown)."),
    idle_seconds: float = typer.Option(None, "--idle-seconds-before-scaledown",
                                       help="Autoscale: idle time before a node leaves."),
    setup_task: str = typer.Option(None, "--setup-task", help="Command run on every node "
                                   "when it joins (Batch AI nodeSetup.setupTask)."),
    provisioning_delay: float = typer.Option(None, "--provisioning-delay",
                                             help="local: seconds a new node takes to join."),
    preemption_rate: float = typer.Option(None, "--preemption-rate", help="Chaos for "
                                          "lowpriority clusters: evictions per node-hour."),
    file: Path = typer.Option(None, "--config-file", "-f", help="Batch AI cluster.json or "
                              "native cluster YAML."),
    ignore: list[str] = typer.Option([], "--ignore", help="Property to drop on purpose."),
    resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True),
    generate_ssh_keys: bool = typer.Option(False, "--generate-ssh-keys", hidden=True,
                                           help="Accepted for az compatibility (no ssh here)."),
    allow_root_jobs: bool = typer.Option(
        False, "--allow-root-jobs", help="Jobs may run as root on the nodes (no capability, "
        "the host's / read-only); else as an unprivileged uid of their submitter."),
    max_pids: int = typer.Option(None, "--max-pids", help="Processes one job may have on one "
                                 "node (pids.max; default 4096)."),
    max_output: str = typer.Option(None, "--max-output", help="Default limits.max_output of "
                                   "the cluster's jobs, e.g. 10G (default 10G)."),
    use_auto_storage: bool = typer.Option(
        False, "--use-auto-storage", help="Mount the workspace's default datastore in every "
        "job at $AZ_BATCHAI_MOUNT_ROOT/autobfs and autoafs (Batch AI's auto storage)."),
    image: str = typer.Option(None, "--image", "-i", help="Batch AI node image: "
                              "UbuntuLTS, UbuntuDSVM or publisher:offer:sku:version. Recorded "
                              "only: the nodes run their host's own OS."),
    user_name: str = typer.Option(None, "--user-name", "-u", help="Batch AI admin account: "
                                  "not used (see the warning it prints)."),
    password: str = typer.Option(None, "--password", "-p", help="Batch AI admin password: "
                                 "not used, never stored."),
    ssh_key: str = typer.Option(None, "--ssh-key", "-k", help="Batch AI admin SSH key: not "
                                "used (no ssh to nodes: `cluster node exec`)."),
    wait: bool = typer.Option(False, "--wait", help="Wait, showing progress, until the "
                              "nodes are idle."),
    wait_timeout: float = typer.Option(600.0, "--timeout", help="With --wait: give up after "
                                       "this many seconds (exit 1)."),
    output: Output = OutputOpt,
) -> None:
    """Create a cluster (`-s SIZE -t N`, or `--min/--max` to autoscale, or `-f cluster.json`)."""
    with handled():
        spec: dict[str, Any]
        if name_arg_ and name and name_arg_ != name:
            pick_name(name_arg_, name, "cluster")
        name = name_arg_ or name
        if file is not None:
            from batchyard.spec.loader import load_cluster_file

            if ignore:
                from batchyard.cli.job_create import _check_ignores, refused_properties

                _check_ignores(file.name, ignore, refused_properties(
                    lambda dropped: load_cluster_file(file, name, ignore=dropped)))
            spec = load_cluster_file(file, name, ignore=set(ignore)).model_dump(
                mode="json", exclude_none=True)
        else:
            if ignore:
                fail("--ignore applies to a cluster file (-f)")
            if not name:
                fail("give the cluster's name: NAME or -n NAME")
            spec = {"name": name, "backend": backend, "vm_priority": vm_priority}
            if vm_size:
                spec["vm_size"] = vm_size
            if cpus is not None or gpus is not None or memory_gb is not None:
                spec["resources"] = {"cpus": cpus or 1, "gpus": gpus or 0,
                                     "memory_gb": memory_gb or 4.0}
            if max_nodes is not None:
                spec["autoscale"] = {"min_nodes": min_nodes or 0, "max_nodes": max_nodes}
                if target is not None:
                    spec["autoscale"]["initial_node_count"] = target
                if idle_seconds is not None:
                    spec["autoscale"]["idle_seconds_before_scaledown"] = idle_seconds
            else:
                spec["manual"] = {"target_node_count": 1 if target is None else target}
            if address:
                spec["address"] = address
            if ray_token_file:
                spec["ray_token_file"] = ray_token_file
            if setup_task:
                spec["setup_task"] = {"command": setup_task}
            if provisioning_delay is not None:
                spec["provisioning_delay"] = provisioning_delay
            if preemption_rate is not None:
                spec["preemption_rate"] = preemption_rate
            if heartbeat_timeout is not None:
                spec["heartbeat_timeout"] = heartbeat_timeout
            if preflight:
                spec["preflight"] = preflight
            if health_every is not None:
                spec["health_check_every"] = _every(health_every)
            slurm = _slurm_settings(partition, account, qos, constraint, slurm_options, work_dir)
            if backend == "slurm":
                from batchyard.sdk.cluster import slurm_defaults

                slurm = {**slurm_defaults(), **slurm}
            if slurm and backend != "slurm":
                fail("--partition/--account/--qos/--constraint/--slurm-option/--work-dir are "
                     "for --backend slurm")
            if slurm:
                spec["slurm"] = slurm
            if backend == "slurm" and target is None:
                spec.pop("manual", None)
            if backend == "machines" and target is None and max_nodes is None:
                spec["manual"] = {"target_node_count": 0}
        from batchyard.cli.cluster_notes import (
            account_warning,
            apply_job_limits,
            apply_node_options,
            image_note,
        )

        apply_node_options(spec, use_auto_storage, image)
        apply_job_limits(spec, allow_root_jobs, max_pids, max_output)
        notes = account_warning(spec.get("backend", "local"), user_name, password, ssh_key,
                                file) + image_note(image)
        data = client().post(f"/workspaces/{ws_name(workspace)}/clusters", spec)
        for note in notes + list(data.get("warnings") or []):
            err_console.print(note, markup=False, highlight=False)
        if wait:
            from batchyard.cli.cluster_wait import wait_until_idle

            data = wait_until_idle(client(), ws_name(workspace), data["name"], wait_timeout)
        emit(data, output, _render_show)


def _every(text: str) -> float:
    from batchyard.spec.durations import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        fail(f"--health-check-every: {exc}")
    if seconds <= 0:
        fail(f"--health-check-every: {text!r} is not a positive duration (e.g. 10m or 30s)")
    return seconds


def _slurm_settings(partition: str | None, account: str | None, qos: str | None,
                    constraint: str | None, options: list[str],
                    work_dir: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in (("partition", partition), ("account", account),
                                             ("qos", qos), ("constraint", constraint),
                                             ("work_dir", work_dir)) if v}
    parsed: dict[str, str] = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not key.strip():
            fail(f"--slurm-option: {item!r} is not KEY=VALUE (e.g. --slurm-option mem=16G)")
        parsed[key.strip().lstrip("-")] = value.strip() if sep else ""
    if parsed:
        out["options"] = parsed
    return out


@app.command("list")
def list_(workspace: str = WorkspaceOpt, output: Output = OutputOpt,
          resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
          ) -> None:
    """List clusters."""
    with handled():
        emit(client().get(f"/workspaces/{ws_name(workspace)}/clusters"), output, _render_list)


@app.command("show")
def show(name_arg_: str = name_arg("cluster"), name: str = NameOpt,
         workspace: str = WorkspaceOpt, output: Output = OutputOpt,
         resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
         ) -> None:
    """Show a cluster: scale, allocation state and node counts per state."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        emit(client().get(f"/workspaces/{ws_name(workspace)}/clusters/{name}"), output,
             _render_show)


@app.command("resize")
def resize(name_arg_: str = name_arg("cluster"), name: str = NameOpt,
           target: int = typer.Option(..., "--target", "-t", help="New node count."),
           workspace: str = WorkspaceOpt, output: Output = OutputOpt,
           resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
           ) -> None:
    """Resize a cluster (manual scale)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        data = client().post(f"/workspaces/{ws_name(workspace)}/clusters/{name}/resize",
                             {"target": target})
        emit(data, output, _render_show)


@app.command("delete")
def delete(name_arg_: str = name_arg("cluster"), name: str = NameOpt,
           workspace: str = WorkspaceOpt, output: Output = OutputOpt,
           resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True),
           yes: bool = typer.Option(False, "--yes", "-y", hidden=True)) -> None:
    """Delete a cluster (it must have no active jobs)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        client().delete(f"/workspaces/{ws_name(workspace)}/clusters/{name}")
        emit({"deleted": name}, output, lambda d: console.print(f"cluster {name} deleted"))


@node_app.command("list")
def node_list(cluster_arg: str = typer.Argument(None, metavar="CLUSTER", show_default=False,
                                              help="The cluster (or give it with -c).",
                                              autocompletion=complete.clusters),
              cluster: str = cluster_opt("The cluster."),
              workspace: str = WorkspaceOpt, output: Output = OutputOpt,
              resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
              ) -> None:
    """List a cluster's nodes with address, state and reason."""
    with handled():
        cluster = pick_name(cluster_arg, cluster, "cluster", "-c")
        emit(client().get(f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/nodes"),
             output, _render_nodes)


@node_app.command("exec", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})
def node_exec(ctx: typer.Context,
              cluster: str = cluster_opt("The cluster.", ...),
              node: str = typer.Option(..., "--node-id", "--node", "-n", help="Node name."),
              exec_: str = typer.Option(None, "--exec", help="Command line (run by bash)."),
              timeout: float = typer.Option(60.0, "--timeout"),
              stdin: bool = typer.Option(False, "--stdin", "-i", help="Pass stdin (a live "
                                         "session, as `job exec`)."),
              tty: bool = typer.Option(False, "--tty", "-t", help="A terminal: -it without a "
                                       "command is an interactive shell on the node."),
              workspace: str = WorkspaceOpt, output: Output = OutputOpt,
              resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
              ) -> None:
    """Run a command on a node: `--exec "cmd"` or `-- cmd args...`; `-it` for a shell.

    -i/-t open a live session over a WebSocket, as `job exec` (local and machines clusters:
    on a machine its agent runs it; on Slurm or Ray nodes use `job exec -it` in a job)."""
    with handled():
        argv = ["bash", "-c", exec_] if exec_ else list(ctx.args)
        if stdin or tty:
            from batchyard.cli.exec import run_session

            raise typer.Exit(run_session(
                client(), f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/nodes/{node}"
                "/exec", argv, stdin=True, tty=tty, extra={}))
        if not argv:
            fail("give a command: --exec \"...\" or -- CMD ARGS")
        data = client().post(
            f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/nodes/{node}/exec",
            {"argv": argv, "timeout": timeout})

        def render(d: dict[str, Any]) -> None:
            sys.stdout.write(d["stdout"])
            sys.stderr.write(d["stderr"])

        emit(data, output, render)
        raise typer.Exit(int(data["exit_code"]))


@app.command("auto-scale")
def auto_scale(name_arg_: str = name_arg("cluster"), name: str = NameOpt,
               min_nodes: int = typer.Option(..., "--min", help="Minimum nodes."),
               max_nodes: int = typer.Option(..., "--max", help="Maximum nodes."),
               idle_seconds: float = typer.Option(None, "--idle-seconds-before-scaledown"),
               workspace: str = WorkspaceOpt, output: Output = OutputOpt,
               resource_group: str = typer.Option(None, "--resource-group", "-g", hidden=True)
               ) -> None:
    """Make a cluster autoscale between --min and --max nodes."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        data = client().post(f"/workspaces/{ws_name(workspace)}/clusters/{name}/autoscale",
                             {"min_nodes": min_nodes, "max_nodes": max_nodes,
                              "idle_seconds_before_scaledown": idle_seconds})
        emit(data, output, _render_show)


@node_app.command("preempt")
def node_preempt(cluster: str = cluster_opt("The cluster.", ...),
                 node: str = typer.Option(..., "--node-id", "--node", "-n"),
                 workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Evict a low-priority node as the cloud would: its job gets the preemption notice
    (limits.checkpoint_signal, checkpoint_notice), then SIGTERM, and is requeued."""
    with handled():
        data = client().post(
            f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/nodes/{node}/preempt")
        emit(data, output, lambda d: console.print(f"node {d['name']} preempted"))


@node_app.command("enable")
def node_enable(cluster: str = cluster_opt("The cluster.", ...),
                node: str = typer.Option(..., "--node-id", "--node", "-n"),
                workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Make an unusable node (a failed pre-flight or setup task) usable again, once fixed."""
    with handled():
        data = client().post(
            f"/workspaces/{ws_name(workspace)}/clusters/{cluster}/nodes/{node}/enable")
        emit(data, output, lambda d: console.print(f"node {d['name']} is {d['state']}"))


file_app = typer.Typer(help="Files of a cluster's nodes (setup task output).",
                       no_args_is_help=True)
app.add_typer(file_app, name="file")


FileNameOpt = typer.Option(None, "--name", "-n", "--cluster", "-c",
                           help="The cluster's name (or give it as NAME).",
                           autocompletion=complete.clusters)


@file_app.command("list")
def file_list(name_arg_: str = name_arg("cluster"), name: str = FileNameOpt,
              workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """List the setup task's output files of every node."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        emit(client().get(f"/workspaces/{ws_name(workspace)}/clusters/{name}/files"), output,
             lambda d: table([{**f, "human": human_size(f.get("size"))} for f in d],
                             [("path", "Path", "path"), ("human", "Size", "num")],
                             empty=f"no setup task files on the nodes of {name}"))


@file_app.command("show")
def file_show(name_arg_: str = name_arg("cluster"), name: str = FileNameOpt,
              path: str = typer.Option(..., "--path", "-p", help="A path as `cluster file "
                                       "list` shows it."),
              workspace: str = WorkspaceOpt, output: Output = OutputOpt) -> None:
    """Print one of those files, as it is.

    -o json: {cluster, path, size, content}, the content decoded as UTF-8 (with replacement
    characters where it is not)."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        data = client().request("GET", f"/workspaces/{ws_name(workspace)}/clusters/{name}"
                                "/files/content", params={"path": path})
        raw = data if isinstance(data, bytes) else str(data).encode()
        if output == Output.json:
            emit({"cluster": name, "path": path, "size": len(raw),
                  "content": raw.decode("utf-8", errors="replace")}, output)
            return
        sys.stdout.buffer.write(raw)
