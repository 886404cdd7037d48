"""A small PyTorch DDP training for sweeps: an MLP on scikit-learn's bundled 8x8 digits (no
downloads), SGD with the learning rate a sweep samples, ``val_accuracy`` logged on rank 0
after every epoch (``batchyard.log_metric``, flushed at once so an early-termination policy
sees each epoch as it ends). A learning rate far below ~1e-3 barely learns in a few epochs,
which is what makes it a good test of early termination.

    python train.py --lr 0.05 --epochs 6
    batchyard sweep create -f sweep.yaml          # native: a job file with `sweep:`
    batchyard sweep create -f sweep-aml.yml       # Azure ML v2 `type: sweep`
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from batchyard.sdk.metrics import flush, log_metric


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--epoch-seconds", type=float, default=0.0,
                        help="pace each epoch to at least this long (tests: time for the "
                        "server to judge each epoch before the next)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits CSV read directly (importing sklearn.datasets costs
    ~2 s per rank)."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            with gzip.open(csv, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data, data.target


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    x, y = digits()
    order = np.random.default_rng(args.seed).permutation(len(y))
    test, train = order[: len(y) // 5], order[len(y) // 5:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 0.1
    features = torch.from_numpy(((x - mean) / std).astype(np.float32))
    labels = torch.from_numpy(y)
    shard = train[rank::world]  # each rank its share of the training set
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                  nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed + rank)
    for epoch in range(1, args.epochs + 1):
        began = time.monotonic()
        model.train()
        perm = torch.from_numpy(shard)[torch.randperm(len(shard), generator=generator)]
        for start in range(0, len(perm) - args.batch_size + 1, args.batch_size):
            batch = perm[start:start + args.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(features[batch]), labels[batch]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            part = torch.from_numpy(test[rank::world])
            right = (model(features[part]).argmax(dim=1) == labels[part]).sum()
            counts = torch.tensor([float(right), float(len(part))], dtype=torch.float64)
        dist.all_reduce(counts)
        accuracy = float(counts[0] / counts[1])
        if rank == 0:
            print(f"epoch {epoch} val_accuracy {accuracy:.4f}", flush=True)
            log_metric("val_accuracy", accuracy, step=epoch)
            flush(10)
        time.sleep(max(0.0, args.epoch_seconds - (time.monotonic() - began)))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        flush(10)
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo can abort at interpreter exit (DESIGN §7)
