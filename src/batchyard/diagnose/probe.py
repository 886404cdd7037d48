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
    def close(self) -> None: ...


class MpiTransport:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size, self.name = self.comm.rank, self.comm.size, "mpi"

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
    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.device = "cpu"
        if backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            self.device = f"cuda:{local % max(1, torch.cuda.device_count())}"
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend=backend)
        self.rank, self.size, self.name = dist.get_rank(), dist.get_world_size(), backend

    def buffer(self, nbytes: int) -> Any:
        return self.torch.zeros(max(1, nbytes // 4), dtype=self.torch.float32,
                                device=self.device)

    def send(self, buf: Any, dest: int) -> None:
        self.dist.send(buf, dst=dest)

    def recv(self, buf: Any, src: int) -> None:
        self.dist.recv(buf, src=src)

    def barrier(self) -> None:
        self.dist.barrier()

    def _sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def allreduce(self, buf: Any) -> None:
        self.dist.all_reduce(buf)
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


def run(t: Transport, reps: int) -> dict[str, Any]:
    hosts = t.gather(os.environ.get("BATCHYARD_NODE_NAME") or socket.gethostname())
    pairs = []
    for i in range(t.size):
        for j in range(i + 1, t.size):
            if t.rank in (i, j):
                peer = j if t.rank == i else i
                lat = pingpong(t, peer, SMALL, reps)
                bw_time = pingpong(t, peer, LARGE, max(2, reps // 10))
                if t.rank == i:
                    pairs.append({"a": hosts[i], "b": hosts[j], "latency_us": lat * 1e6,
                                  "bandwidth_MBps": LARGE / bw_time / 1e6})
            t.barrier()
    buf = t.buffer(LARGE)
    t.allreduce(buf)
    t.barrier()
    start = time.perf_counter()
    n = max(2, reps // 10)
    for _ in range(n):
        t.allreduce(buf)
    elapsed = (time.perf_counter() - start) / n
    busbw = (LARGE / elapsed) * (2 * (t.size - 1) / t.size) / 1e6 if t.size > 1 else 0.0
    all_pairs = [p for chunk in t.gather(pairs) for p in chunk]
    return {"transport": t.name, "nodes": hosts, "pairs": all_pairs,
            "allreduce": {"bytes": LARGE, "time_ms": elapsed * 1e3, "busbw_MBps": busbw}}


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
