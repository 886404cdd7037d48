"""Data-parallel training with PyTorch DDP on scikit-learn's bundled 8x8 digits (no downloads).

Reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so it
runs unchanged under batchyard, torchrun, or Azure ML's PyTorch distribution:

    torchrun --nproc-per-node 4 train.py --epochs 5 --output-dir /tmp/model

Backend: nccl when CUDA is available (one device per local rank), else gloo; override with
--backend or BATCHYARD_DIST_BACKEND. With BATCHYARD_CHECKPOINT_DIR set, rank 0 saves ckpt.pt
after every epoch and a restarted job resumes from it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # inside a batchyard job, metrics go to the job (charts in the portal, `job metrics`)
    import batchyard
except ImportError:  # plain torchrun or Azure ML: the printed lines are the record
    batchyard = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Gang:
    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls) -> Gang:
        # A single process without torchrun is a gang of one.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo", "mpi"),
        default=os.environ.get("BATCHYARD_DIST_BACKEND") or "auto",
        help="torch.distributed backend (default: $BATCHYARD_DIST_BACKEND, else auto)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="where model.pt goes (default: $BATCHYARD_OUTPUT_MODEL, $AZ_BATCHAI_OUTPUT_MODEL, "
        "./outputs)",
    )
    parser.add_argument(
        "--write-param-hashes",
        action="store_true",
        help="every rank writes <output dir>/params-rank<k>.sha256 of its final parameters",
    )
    return parser.parse_args(argv)


def output_dir(explicit: Path | None) -> Path:
    """An explicit --output-dir wins; then the job's MODEL output; then ./outputs."""
    if explicit is not None:
        return explicit
    for name in ("BATCHYARD_OUTPUT_MODEL", "AZ_BATCHAI_OUTPUT_MODEL"):
        if os.environ.get(name):
            return Path(os.environ[name])
    return Path("outputs")


def pick_device(backend: str, local_rank: int) -> tuple[str, torch.device]:
    cuda = torch.cuda.is_available()
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if cuda and backend == "nccl":
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return backend, torch.device("cuda", index)
    return backend, torch.device("cpu")


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1797 8x8 images, pixels 0..16).

    Importing sklearn.datasets costs ~2 s of CPU per rank, so read its bundled CSV directly
    when it is where scikit-learn keeps it, and fall back to load_digits() otherwise.
    """
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            with gzip.open(csv, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.data, digits.target


def load_data(seed: int, test_fraction: float = 0.2) -> tuple[TensorDataset, TensorDataset]:
    """The same deterministic train/test split on every rank."""
    x, y = load_digits_arrays()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    # standardize each pixel with training-set statistics (+0.1 keeps always-blank pixels at 0)
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 0.1
    features = torch.from_numpy(((x - mean) / std).astype(np.float32))
    labels = torch.from_numpy(y.astype(np.int64))
    return (
        TensorDataset(features[train], labels[train]),
        TensorDataset(features[test], labels[test]),
    )


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def atomic_save(obj: object, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(gang: Gang, ckpt_path: Path | None) -> dict | None:
    """Rank 0 reads the checkpoint and broadcasts it, so nodes need not share a filesystem."""
    box: list[dict | None] = [None]
    if gang.rank == 0 and ckpt_path is not None and ckpt_path.exists():
        box[0] = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    if gang.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def evaluate(model: nn.Module, test: TensorDataset, gang: Gang, device: torch.device) -> float:
    """Each rank scores a shard of the test set; the counts are summed across the gang."""
    model.eval()
    x, y = test.tensors
    shard = slice(gang.rank, None, gang.world_size)
    with torch.no_grad():
        predicted = model(x[shard].to(device)).argmax(dim=1)
        counts = torch.tensor(
            [(predicted == y[shard].to(device)).sum().item(), len(y[shard])],
            dtype=torch.float64, device=device,
        )
    if gang.world_size > 1:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def log_metric(name: str, value: float, step: int) -> None:
    if batchyard is not None and os.environ.get("BATCHYARD_JOB_NAME"):
        batchyard.log_metric(name, value, step=step)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gang = Gang.from_env()
    if "OMP_NUM_THREADS" not in os.environ:
        # One intra-op thread per rank, as torchrun sets: this model is far too small to gain
        # from more, and ranks each running a thread per core were ~30x slower on 2 busy cores.
        torch.set_num_threads(1)
    backend, device = pick_device(args.backend, gang.local_rank)
    dist.init_process_group(backend=backend, rank=gang.rank, world_size=gang.world_size)
    lead = gang.rank == 0
    if lead:
        print(f"world size {gang.world_size}, backend {backend}, device {device}", flush=True)

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts them)
    train_set, test_set = load_data(args.seed)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, num_replicas=gang.world_size, rank=gang.rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    ckpt_dir = os.environ.get("BATCHYARD_CHECKPOINT_DIR")
    ckpt_path = Path(ckpt_dir) / "ckpt.pt" if ckpt_dir else None
    start_epoch, step = 0, 0
    checkpoint = load_checkpoint(gang, ckpt_path)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch, step = int(checkpoint["epoch"]), int(checkpoint["step"])
        if lead:
            print(f"resumed from epoch {start_epoch}", flush=True)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )

    samples, train_seconds = 0, 0.0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # sum of losses, batches
        began = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64, device=device)
            samples += len(y)
            step += 1
        train_seconds += time.perf_counter() - began
        dist.all_reduce(loss_sum)
        mean_loss = float(loss_sum[0] / loss_sum[1])
        if lead:
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean_loss:.4f}", flush=True)
            print(f"metric loss={mean_loss:.6f} step={step}", flush=True)
            log_metric("loss", mean_loss, step)
            if ckpt_path is not None:
                atomic_save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": epoch + 1, "step": step},
                    ckpt_path,
                )

    accuracy = evaluate(model, test_set, gang, device)
    totals = torch.tensor([float(samples), train_seconds], dtype=torch.float64, device=device)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    out = output_dir(args.output_dir)
    if lead:
        # samples seen by the whole gang / mean training wall time of a rank
        mean_seconds = float(totals[1]) / gang.world_size
        rate = float(totals[0]) / mean_seconds if mean_seconds > 0 else 0.0
        print(f"metric accuracy={accuracy:.6f} step={step}", flush=True)
        log_metric("accuracy", accuracy, step)
        print(f"samples/s: {rate:.0f}", flush=True)
        model_path = out / "model.pt"
        atomic_save(model.state_dict(), model_path)
        print(f"model saved to {model_path}", flush=True)
        print(f"test accuracy: {accuracy:.4f}", flush=True)
    if args.write_param_hashes:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"params-rank{gang.rank}.sha256").write_text(params_sha256(model) + "\n")
    dist.barrier()
    return 0


def run() -> None:
    """Leave with os._exit after tearing down the process group: gloo may otherwise abort
    (SIGABRT, rc 134) in its destructors at interpreter exit (DESIGN §7)."""
    try:
        code = main()
    except SystemExit as exc:  # argparse --help / usage errors, sys.exit("message")
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
    if batchyard is not None:
        try:  # os._exit skips atexit, where logged metrics are flushed otherwise
            batchyard.flush()
        except Exception:
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
