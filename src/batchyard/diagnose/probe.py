"""What runs on each rank of a diagnose job. Rank 0 writes ``diagnose.json`` to the DIAG
output; the CLI reads it back and prints the table."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any, Protocol

SMALL = 8
LARGE = 4 * 1024 * 1024


class Transport(Protocol):
    rank: int
    size: int
    name: str

    def send(self, buf: Any, dest: int) -> None: ...
    def recv(self, buf: Any, src: int) -> None: ...
    def barrier(self) -> None: ...
    def allreduce(self, buf: Any) -> None: ...
    def buffer(self, nbytes: int) -> Any: ...
    def gather(self, value: Any) -> list[Any]: ...
    def split(self, colors: list[int]) -> Transport: ...
    def close(self) -> None: ...


class MpiTransport:
    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank, self.size, self.name = self.comm.rank, self.comm.size, "mpi"

    def split(self, colors: list[int]) -> Transport:
        """The ranks of this rank's colour (every rank calls it, with every rank's colours)."""
        return MpiTransport(self.comm.Split(colors[self.rank], self.rank))

    def buffer(self, nbytes: int) -> Any:
        return bytearray(nbytes)

    def send(self, buf: Any, dest: int) -> None:
        self.comm.Send(buf, dest=dest)

    def recv(self, buf: Any, src: int) -> None:
        self.comm.Recv(buf, source=src)

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce(self, buf: Any) -> None:
        import numpy as np

        arr = np.frombuffer(buf, dtype=np.float32)
        out = np.empty_like(arr)
        self.comm.Allreduce(arr, out)

    def gather(self, value: Any) -> list[Any]:
        result: list[Any] = self.comm.allgather(value)
        return result

    def close(self) -> None:
        self.MPI.Finalize()


class TorchTransport:
    def __init__(self, backend: str, group: Any = None, parent: TorchTransport | None = None
                 ) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, group
        self.device: str = "cpu"
        self.name: str = backend
        if parent is not None:  # a subgroup: the parent's device, ranks within the group
            self.device, self.name = parent.device, parent.name
            self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
            return
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            self.device = f"cuda:{local % max(1, torch.cuda.device_count())}"
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend=backend)
        self.rank, self.size, self.name = dist.get_rank(), dist.get_world_size(), backend

    def split(self, colors: list[int]) -> Transport:
        """The ranks of this rank's colour: every rank creates every group, in one order."""
        mine: TorchTransport | None = None
        for colour in dict.fromkeys(colors):
            group = self.dist.new_group([r for r, c in enumerate(colors) if c == colour])
            if colour == colors[self.rank]:
                mine = TorchTransport(self.name, group, self)
        assert mine is not None
        return mine

    def buffer(self, nbytes: int) -> Any:
        return self.torch.zeros(max(1, nbytes // 4), dtype=self.torch.float32,
                                device=self.device)

    def send(self, buf: Any, dest: int) -> None:
        self.dist.send(buf, dst=dest)

    def recv(self, buf: Any, src: int) -> None:
        self.dist.recv(buf, src=src)

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)

    def _sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def allreduce(self, buf: Any) -> None:
        self.dist.all_reduce(buf, group=self.group)
        self._sync()

    def gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, value)
        return out

    def close(self) -> None:
        self.dist.destroy_process_group()


def pingpong(t: Transport, peer: int, nbytes: int, reps: int) -> float:
    """Seconds for one one-way message (half a round trip), averaged over ``reps``."""
    buf = t.buffer(nbytes)
    leader = t.rank < peer
    for _ in range(2):  # warm-up
        if leader:
            t.send(buf, peer)
            t.recv(buf, peer)
        else:
            t.recv(buf, peer)
            t.send(buf, peer)
    start = time.perf_counter()
    for _ in range(reps):
        if leader:
            t.send(buf, peer)
            t.recv(buf, peer)
        else:
            t.recv(buf, peer)
            t.send(buf, peer)
    return (time.perf_counter() - start) / (2 * reps)


def whoami() -> dict[str, Any]:
    """This rank's node, its rank on the node and, with GPUs, the one it drives."""
    local = int(os.environ.get("LOCAL_RANK") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
                or os.environ.get("MPI_LOCALRANKID") or 0)
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return {"node": os.environ.get("BATCHYARD_NODE_NAME") or socket.gethostname(),
            "local_rank": local, "gpu": gpus[local % len(gpus)] if gpus else None}


def allreduce_bw(t: Transport, reps: int) -> dict[str, Any]:
    """An all-reduce of LARGE bytes over ``t``'s ranks: time and bus bandwidth (NCCL's
    definition: the algorithm bandwidth x 2(n-1)/n)."""
    buf = t.buffer(LARGE)
    t.allreduce(buf)
    t.barrier()
    start = time.perf_counter()
    n = max(2, reps // 10)
    for _ in range(n):
        t.allreduce(buf)
    elapsed = (time.perf_counter() - start) / n
    busbw = (LARGE / elapsed) * (2 * (t.size - 1) / t.size) / 1e6 if t.size > 1 else 0.0
    return {"bytes": LARGE, "ranks": t.size, "time_ms": elapsed * 1e3, "busbw_MBps": busbw}


def run(t: Transport, reps: int) -> dict[str, Any]:
    """Ping-pong between nodes (their first ranks; between a lone node's ranks), then an
    all-reduce within each node over all its ranks (one per GPU), then over every rank."""
    ranks = t.gather(whoami())
    names = [r["node"] for r in ranks]
    nodes = list(dict.fromkeys(names))
    firsts = [names.index(n) for n in nodes]
    ends = firsts if len(nodes) > 1 else list(range(t.size))

    def label(rank: int) -> str:
        return names[rank] if len(nodes) > 1 else f"{names[rank]}/rank{ranks[rank]['local_rank']}"

    pairs = []
    for x, i in enumerate(ends):
        for j in ends[x + 1:]:
            if t.rank in (i, j):
                peer = j if t.rank == i else i
                lat = pingpong(t, peer, SMALL, reps)
                bw_time = pingpong(t, peer, LARGE, max(2, reps // 10))
                if t.rank == i:
                    pairs.append({"a": label(i), "b": label(j), "latency_us": lat * 1e6,
                                  "bandwidth_MBps": LARGE / bw_time / 1e6})
            t.barrier()
    intra: list[dict[str, Any]] = []
    if any(names.count(n) > 1 for n in nodes):  # every rank takes part in every split
        local = t.split([nodes.index(n) for n in names])
        found = allreduce_bw(local, reps)
        gpus = [r["gpu"] for r in ranks if r["node"] == names[t.rank] and r["gpu"]]
        mine = {"node": names[t.rank], **found, "gpus": gpus}
        intra = [x for x in t.gather(mine if local.rank == 0 else None) if x]
    overall = allreduce_bw(t, reps)
    all_pairs = [p for chunk in t.gather(pairs) for p in chunk]
    return {"transport": t.name, "nodes": nodes, "ranks": ranks, "pairs": all_pairs,
            "intra_node": intra, "allreduce": overall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchyard.diagnose")
    parser.add_argument("--transport", choices=["auto", "mpi", "gloo", "nccl"], default="auto")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    choice = args.transport
    if choice == "auto":
        choice = "mpi" if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ \
            else os.environ.get("BATCHYARD_DIST_BACKEND", "gloo")
    t: Transport = MpiTransport() if choice == "mpi" else TorchTransport(choice)
    result = run(t, args.reps)
    if t.rank == 0:
        out = os.environ.get("BATCHYARD_OUTPUT_DIAG") or "."
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "diagnose.json"), "w") as fh:
            json.dump(result, fh, indent=2)
        print(json.dumps(result))
    t.barrier()
    t.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
