"""Print and check the environment contract every batchyard rank gets (DESIGN §4).

Plain Python, no third-party imports. Every rank prints its view of the gang and checks that
the torchrun, batchyard, Azure Batch AI and Azure ML variables agree with each other; any
mismatch exits 1 with the reasons on stderr.

    python hello.py                      # inside a batchyard job
    python hello.py --rendezvous DIR     # also write DIR/rank-<RANK>.json (tests, benchmarks)
    python hello.py --sleep 30           # stay alive a while (cancel tests)
    torchrun --nproc-per-node 2 hello.py --allow-missing   # outside batchyard
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

STARTED_AT = time.time()

# Variables shown and recorded, in this order (missing ones are recorded as null).
SHOWN = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "BATCHYARD_JOB_ID",
    "BATCHYARD_ATTEMPT",
    "BATCHYARD_NODE_RANK",
    "BATCHYARD_NUM_NODES",
    "BATCHYARD_PROCESSES_PER_NODE",
    "BATCHYARD_NODE_IPS",
    "BATCHYARD_CHECKPOINT_DIR",
    "AZ_BATCH_MASTER_NODE",
    "AZ_BATCHAI_TASK_INDEX",
    "AZ_BATCHAI_JOB_MOUNT_ROOT",
    "AZ_BATCHAI_MPI_HOST_FILE",
    "AZUREML_RUN_ID",
    "AZUREML_EXPERIMENT_NAME",
    "CUDA_VISIBLE_DEVICES",
)
# Any other variable with one of these prefixes is recorded too ...
RECORDED_PREFIXES = ("BATCHYARD_", "AZ_BATCH", "AZUREML_", "TORCHELASTIC_", "OMPI_COMM_WORLD_")
# ... unless its name suggests a secret: rendezvous files must never hold a token.
SECRET_MARKERS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL")


def env_view() -> dict[str, str | None]:
    view: dict[str, str | None] = {name: os.environ.get(name) for name in SHOWN}
    for name in sorted(os.environ):
        secret = any(marker in name.upper() for marker in SECRET_MARKERS)
        if name.startswith(RECORDED_PREFIXES) and name not in view and not secret:
            view[name] = os.environ[name]
    return view


def node_ips(view: dict[str, str | None]) -> list[str]:
    raw = view.get("BATCHYARD_NODE_IPS")
    return [line.strip() for line in raw.splitlines() if line.strip()] if raw else []


class Checker:
    """Collects contract violations; a check whose inputs are unset is an error unless lenient."""

    def __init__(self, view: dict[str, str | None], allow_missing: bool) -> None:
        self.view = view
        self.allow_missing = allow_missing
        self.errors: list[str] = []

    def text(self, name: str) -> str | None:
        value = self.view.get(name)
        if value is None or value == "":
            if not self.allow_missing:
                self.errors.append(f"{name} is not set")
            return None
        return value

    def int(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            self.errors.append(f"{name}={value!r} is not an integer")
            return None

    def expect(self, ok: bool, message: str) -> None:
        if not ok:
            self.errors.append(message)


def check(view: dict[str, str | None], allow_missing: bool) -> list[str]:
    c = Checker(view, allow_missing)
    rank, world = c.int("RANK"), c.int("WORLD_SIZE")
    local_rank, local_world = c.int("LOCAL_RANK"), c.int("LOCAL_WORLD_SIZE")
    node_rank, by_node_rank = c.int("NODE_RANK"), c.int("BATCHYARD_NODE_RANK")
    group_rank, num_nodes = c.int("GROUP_RANK"), c.int("BATCHYARD_NUM_NODES")
    task_index = c.int("AZ_BATCHAI_TASK_INDEX")
    addr, port = c.text("MASTER_ADDR"), c.text("MASTER_PORT")
    az_master = c.text("AZ_BATCH_MASTER_NODE")
    ips = node_ips(view)
    if not ips and not allow_missing:
        c.errors.append("BATCHYARD_NODE_IPS is not set or empty")

    if node_rank is None:  # outside batchyard, torchrun's GROUP_RANK is the node rank
        node_rank = by_node_rank if by_node_rank is not None else group_rank
    if by_node_rank is not None:
        c.expect(by_node_rank == node_rank,
                 f"BATCHYARD_NODE_RANK={by_node_rank} != NODE_RANK={node_rank}")
    if group_rank is not None and node_rank is not None:
        c.expect(group_rank == node_rank, f"GROUP_RANK={group_rank} != NODE_RANK={node_rank}")
    if task_index is not None and node_rank is not None:
        c.expect(task_index == node_rank,
                 f"AZ_BATCHAI_TASK_INDEX={task_index} != NODE_RANK={node_rank}")
    if rank is not None and world is not None:
        c.expect(0 <= rank < world, f"RANK={rank} is not in [0, WORLD_SIZE={world})")
    if local_rank is not None and local_world is not None:
        c.expect(0 <= local_rank < local_world,
                 f"LOCAL_RANK={local_rank} is not in [0, LOCAL_WORLD_SIZE={local_world})")
    if (rank is not None and node_rank is not None
            and local_world is not None and local_rank is not None):
        expected = node_rank * local_world + local_rank
        c.expect(rank == expected,
                 f"RANK={rank} != NODE_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK="
                 f"{node_rank}*{local_world}+{local_rank}={expected}")
    if world is not None and num_nodes is not None and local_world is not None:
        expected = num_nodes * local_world
        c.expect(world == expected,
                 f"WORLD_SIZE={world} != BATCHYARD_NUM_NODES*LOCAL_WORLD_SIZE="
                 f"{num_nodes}*{local_world}={expected}")
    if num_nodes is not None and node_rank is not None:
        c.expect(0 <= node_rank < num_nodes,
                 f"NODE_RANK={node_rank} is not in [0, BATCHYARD_NUM_NODES={num_nodes})")
    if ips and num_nodes is not None:
        c.expect(len(ips) == num_nodes,
                 f"BATCHYARD_NODE_IPS has {len(ips)} lines, BATCHYARD_NUM_NODES={num_nodes}")
    if ips and addr is not None:
        c.expect(addr == ips[0],
                 f"MASTER_ADDR={addr} != first line of BATCHYARD_NODE_IPS ({ips[0]})")
    if az_master is not None and addr is not None and port is not None:
        c.expect(az_master == f"{addr}:{port}",
                 f"AZ_BATCH_MASTER_NODE={az_master} != MASTER_ADDR:MASTER_PORT={addr}:{port}")
    if port is not None:
        c.expect(port.isdigit() and 0 < int(port) < 65536, f"MASTER_PORT={port!r} is not a port")
    ppn = view.get("BATCHYARD_PROCESSES_PER_NODE")
    if ppn and local_world is not None:
        c.expect(ppn == str(local_world),
                 f"BATCHYARD_PROCESSES_PER_NODE={ppn} != LOCAL_WORLD_SIZE={local_world}")
    for role_name, plain in (("ROLE_RANK", rank), ("ROLE_WORLD_SIZE", world)):
        role_value = view.get(role_name)
        if role_value and plain is not None:
            c.expect(role_value == str(plain), f"{role_name}={role_value} != {plain}")
    return c.errors


def atomic_write_json(path: Path, data: object) -> None:
    """Write via a temporary file and rename, so a poller never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rendezvous", metavar="DIR", type=Path,
                        help="write DIR/rank-<RANK>.json with this rank's env view and start time")
    parser.add_argument("--sleep", metavar="SECONDS", type=float, default=0.0,
                        help="sleep this long after the checks before exiting")
    parser.add_argument("--allow-missing", action="store_true",
                        help="skip checks whose variables are unset (e.g. under bare torchrun)")
    args = parser.parse_args(argv)

    view = env_view()
    errors = check(view, args.allow_missing)
    rank = view.get("RANK") or "?"
    ips = node_ips(view)
    tag = f"[rank {rank}]"
    node = view.get("BATCHYARD_NODE_RANK") or view.get("NODE_RANK") or view.get("GROUP_RANK")
    print(
        f"{tag} hello from {socket.gethostname()} pid {os.getpid()}: "
        f"RANK={rank} WORLD_SIZE={view['WORLD_SIZE']} "
        f"LOCAL_RANK={view['LOCAL_RANK']} LOCAL_WORLD_SIZE={view['LOCAL_WORLD_SIZE']} "
        f"NODE_RANK={view['NODE_RANK']} BATCHYARD_NODE_RANK={view['BATCHYARD_NODE_RANK']} "
        f"GROUP_RANK={view['GROUP_RANK']} BATCHYARD_NUM_NODES={view['BATCHYARD_NUM_NODES']}",
        flush=True,
    )
    print(
        f"{tag} MASTER_ADDR={view['MASTER_ADDR']} MASTER_PORT={view['MASTER_PORT']} "
        f"AZ_BATCH_MASTER_NODE={view['AZ_BATCH_MASTER_NODE']} "
        f"AZ_BATCHAI_TASK_INDEX={view['AZ_BATCHAI_TASK_INDEX']} (node {node})",
        flush=True,
    )
    print(f"{tag} BATCHYARD_NODE_IPS: {', '.join(ips) if ips else '(unset)'}", flush=True)

    if args.rendezvous is not None:
        atomic_write_json(
            args.rendezvous / f"rank-{rank}.json",
            {
                "rank": int(rank) if rank.isdigit() else rank,
                "started_at": STARTED_AT,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "ok": not errors,
                "errors": errors,
                "node_ips": ips,
                "env": view,
            },
        )

    if errors:
        print(f"{tag} hello: environment contract violated:", file=sys.stderr)
        for error in errors:
            print(f"{tag}   - {error}", file=sys.stderr)
        sys.stderr.flush()
        return 1
    print(f"{tag} env contract OK", flush=True)

    result_dir = os.environ.get("BATCHYARD_OUTPUT_RESULT") or os.environ.get(
        "AZ_BATCHAI_OUTPUT_RESULT"
    )
    if result_dir and rank == "0":
        summary_path = Path(result_dir) / "summary.json"
        atomic_write_json(
            summary_path,
            {
                "world_size": int(view["WORLD_SIZE"] or 0),
                "num_nodes": int(view["BATCHYARD_NUM_NODES"] or len(ips)),
                "processes_per_node": int(view["LOCAL_WORLD_SIZE"] or 0),
                "master": f"{view['MASTER_ADDR']}:{view['MASTER_PORT']}",
                "node_ips": ips,
                "job_id": view["BATCHYARD_JOB_ID"],
                "attempt": view["BATCHYARD_ATTEMPT"],
                "rank0_started_at": STARTED_AT,
                "rank0_hostname": socket.gethostname(),
            },
        )
        print(f"{tag} summary written to {summary_path}", flush=True)

    if args.sleep > 0:
        print(f"{tag} sleeping {args.sleep:g} s", flush=True)
        time.sleep(args.sleep)
    print(f"{tag} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
