"""`batchyard cluster diagnose`: ping-pong and allreduce over a cluster's nodes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from batchyard.cli.common import (
    Output,
    OutputOpt,
    WorkspaceOpt,
    client,
    console,
    emit,
    err_console,
    fail,
    handled,
    name_arg,
    pick_name,
    table,
    ws_name,
)

if TYPE_CHECKING:
    from batchyard.client.http import Client


def _mpi_available() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mpirun") is not None


def diagnose(
    name_arg_: str = name_arg("cluster"),
    name: str = typer.Option(None, "--name", "-n", help="Cluster to test (or give it as "
                             "NAME)."),
    workspace: str = WorkspaceOpt,
    transport: str = typer.Option("auto", "--transport",
                                  help="auto (MPI when present), mpi, gloo or nccl."),
    factor: float = typer.Option(2.0, "--factor", help="Flag nodes this many times slower "
                                 "than the median."),
    reps: int = typer.Option(200, "--reps", help="Round trips per measurement."),
    timeout: float = typer.Option(600, "--timeout"),
    output: Output = OutputOpt,
) -> None:
    """Measure latency and bandwidth between every pair of nodes, allreduce bandwidth within
    each node over all its GPUs and over the whole cluster with one rank per GPU (the seed's
    Intel MPI PingPong, built in). Nodes without GPUs run one rank each; a lone one runs two,
    so that there is a pair to measure."""
    with handled():
        name = pick_name(name_arg_, name, "cluster")
        c = client()
        ws = ws_name(workspace)
        cluster = c.get(f"/workspaces/{ws}/clusters/{name}")
        nodes = int(cluster["current_nodes"])
        if nodes < 1:
            fail(f"cluster {name} has no nodes; resize it first")
        gpus = min(int((n.get("resources") or {}).get("gpus") or 0)
                   for n in cluster.get("nodes") or [{}])
        if transport == "auto" and gpus:
            transport = "nccl"
        use_mpi = transport == "mpi" or (transport == "auto" and _mpi_available())
        if use_mpi and not _mpi_available():
            fail("--transport mpi: mpi4py or mpirun is not installed here")
        chosen = "mpi" if use_mpi else ("gloo" if transport == "auto" else transport)
        slots = int((cluster.get("size") or {}).get("vcpus") or 1)
        per_node = gpus or (min(2, slots) if nodes == 1 else 1)
        spec: dict[str, Any] = {
            "nodes": nodes,
            "distribution": {"type": "mpi" if use_mpi else "pytorch",
                             "processes_per_node": per_node,
                             "backend": "auto" if chosen in ("mpi", "auto") else chosen},
            "command": f"python -m batchyard.diagnose --transport "
                       f"{'mpi' if use_mpi else (transport if transport != 'auto' else 'auto')}"
                       f" --reps {reps}",
            "outputs": {"DIAG": {}},
        }
        job_name = f"diagnose-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        job = c.post(f"/workspaces/{ws}/jobs", {"spec": spec, "cluster": name,
                                                 "experiment": "diagnostics", "name": job_name})
        path = c.job_path(ws, job["experiment"], job_name)
        deadline = time.monotonic() + timeout
        what = f"{nodes} node(s) x {gpus} GPU(s)" if gpus else f"{nodes} node(s)"
        with console.status(f"diagnosing {what} of {name} over {chosen}"):
            while job["state"] not in ("succeeded", "failed", "canceled"):
                if time.monotonic() > deadline:
                    c.post(path + "/terminate")
                    fail(f"diagnose job {job_name} did not finish in {timeout:g}s", 1)
                time.sleep(0.3)
                job = c.get(path)
        if job["state"] != "succeeded":
            fail(f"diagnose job {job_name} {job['state']}: {job.get('message')} "
                 f"(see `batchyard job logs -e diagnostics -n {job_name}`)", 1)
        from batchyard.diagnose.report import flag_slow

        result = _fetch(c, path)
        result["job"] = job_name
        result["slow_nodes"] = flag_slow(result, factor)
        emit(result, output, _render)


def _fetch(c: Client, path: str) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "diagnose.json"
        c.download(path + "/files/content", str(target), path="outputs/DIAG/diagnose.json")
        data: dict[str, Any] = json.loads(target.read_text())
        return data


def _render(result: dict[str, Any]) -> None:
    rows = [{**p, "latency": f"{p['latency_us']:.1f}", "bw": f"{p['bandwidth_MBps']:.0f}"}
            for p in result["pairs"]]
    if rows:
        table(rows, [("a", "Node"), ("b", "Peer"), ("latency", "Latency (us, 8 B)"),
                     ("bw", "Bandwidth (MB/s, 4 MiB)")],
              title=f"ping-pong over {result['transport']}")
    for node in result.get("intra_node") or []:
        over = f"{len(node['gpus'])} GPU(s)" if node.get("gpus") else f"{node['ranks']} ranks"
        console.print(f"allreduce of {node['bytes'] // 2**20} MiB within node {node['node']} "
                      f"over {over}: {node['time_ms']:.2f} ms, bus bandwidth "
                      f"{node['busbw_MBps']:.0f} MB/s")
    ar = result["allreduce"]
    ranks = ar.get("ranks") or len(result["nodes"])
    across = f"{len(result['nodes'])} node(s)" + (
        f" ({ranks} ranks)" if ranks != len(result["nodes"]) else "")
    console.print(f"allreduce of {ar['bytes'] // 2**20} MiB over {across}: "
                  f"{ar['time_ms']:.2f} ms, bus bandwidth {ar['busbw_MBps']:.0f} MB/s")
    if result["slow_nodes"]:
        for slow in result["slow_nodes"]:
            err_console.print(f"[yellow]slow node {slow['node']}[/]: "
                              + "; ".join(slow["reasons"]))
    else:
        console.print("no node slower than the others")
