"""Data-parallel SGD over MPI, the ChainerMN pattern, in numpy (no deep-learning framework).

Rank 0 scatters shards of scikit-learn's bundled 8x8 digits; every rank computes gradients of a
one-hidden-layer MLP on its shard and an MPI Allreduce averages them, so all ranks take the
same step. Command line compatible with chainermn's examples/mnist/train_mnist.py:

    mpirun -np 8 python train_mpi.py -g --communicator non_cuda_aware -o result/

(-g and --communicator are accepted and ignored: this runs on CPUs.)
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batchsize", "-b", type=int, default=16, help="per rank")
    parser.add_argument("--epoch", "-e", type=int, default=20)
    parser.add_argument("--unit", "-u", type=int, default=64, help="hidden units")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", "-o", type=Path,
        help="where model.npz goes (default: $AZ_BATCHAI_OUTPUT_MODEL, $BATCHYARD_OUTPUT_MODEL, "
        "./result)",
    )
    parser.add_argument("--gpu", "-g", action="store_true", help="ignored (CPU only)")
    parser.add_argument("--communicator", default="naive", help="ignored (always MPI Allreduce)")
    return parser.parse_args(argv)


def output_dir(explicit: Path | None) -> Path:
    if explicit is not None and str(explicit):
        return explicit
    for name in ("AZ_BATCHAI_OUTPUT_MODEL", "BATCHYARD_OUTPUT_MODEL"):
        if os.environ.get(name):
            return Path(os.environ[name])
    return Path("result")


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


@dataclass
class Dataset:
    x: np.ndarray  # (n, 64) float64, standardized
    y: np.ndarray  # (n,) int64


def prepare_data(seed: int, test_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    x, y = load_digits_arrays()
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 0.1
    x = (x - mean) / std
    return Dataset(x[train], y[train]), Dataset(x[test], y[test])


def scatter_dataset(comm: MPI.Comm, dataset: Dataset | None, seed: int) -> Dataset:
    """Like chainermn.scatter_dataset: rank 0 shuffles and sends each rank an equal share."""
    shards: list[Dataset] | None = None
    if comm.rank == 0:
        assert dataset is not None
        order = np.random.default_rng(seed + 1).permutation(len(dataset.y))
        shards = [
            Dataset(dataset.x[part], dataset.y[part]) for part in np.array_split(order, comm.size)
        ]
    shard: Dataset = comm.scatter(shards, root=0)
    return shard


class MLP:
    """64 -> unit (ReLU) -> 10 (softmax); parameters live in one flat buffer so that a single
    Allreduce averages every gradient."""

    def __init__(self, unit: int, seed: int) -> None:
        self.shapes = {"W1": (64, unit), "b1": (unit,), "W2": (unit, 10), "b2": (10,)}
        sizes = [int(np.prod(s)) for s in self.shapes.values()]
        self.flat = np.zeros(sum(sizes))
        self.grad = np.zeros_like(self.flat)
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        offset = 0
        for (name, shape), size in zip(self.shapes.items(), sizes, strict=True):
            self.params[name] = self.flat[offset : offset + size].reshape(shape)
            self.grads[name] = self.grad[offset : offset + size].reshape(shape)
            offset += size
        rng = np.random.default_rng(seed)
        self.params["W1"][...] = rng.normal(0.0, np.sqrt(2.0 / 64), (64, unit))
        self.params["W2"][...] = rng.normal(0.0, np.sqrt(1.0 / unit), (unit, 10))

    def logits(self, x: np.ndarray) -> np.ndarray:
        hidden = np.maximum(x @ self.params["W1"] + self.params["b1"], 0.0)
        return hidden @ self.params["W2"] + self.params["b2"]

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean cross-entropy over the batch; fills self.grad."""
        p = self.params
        pre = x @ p["W1"] + p["b1"]
        hidden = np.maximum(pre, 0.0)
        logits = hidden @ p["W2"] + p["b2"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
        d_logits = probs
        d_logits[np.arange(n), y] -= 1.0
        d_logits /= n
        self.grads["W2"][...] = hidden.T @ d_logits
        self.grads["b2"][...] = d_logits.sum(axis=0)
        d_pre = (d_logits @ p["W2"].T) * (pre > 0)
        self.grads["W1"][...] = x.T @ d_pre
        self.grads["b1"][...] = d_pre.sum(axis=0)
        return loss

    def accuracy(self, data: Dataset) -> float:
        return float((self.logits(data.x).argmax(axis=1) == data.y).mean())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    lead = comm.rank == 0
    if lead:
        library = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
        print(f"MPI world size {comm.size} ({library})", flush=True)

    train = test = None
    if lead:
        train, test = prepare_data(args.seed)
    shard = scatter_dataset(comm, train, args.seed)
    # Every rank must run the same number of Allreduces per epoch, whatever its shard size.
    steps = comm.allreduce(len(shard.y), op=MPI.MIN) // args.batchsize
    if steps == 0:
        raise SystemExit(f"batch size {args.batchsize} exceeds the smallest shard")

    model = MLP(args.unit, args.seed)
    comm.Bcast(model.flat, root=0)  # identical start everywhere (like ChainerMN's broadcast)
    velocity = np.zeros_like(model.flat)
    summed = np.empty_like(model.grad)
    rng = np.random.default_rng(args.seed + 100 + comm.rank)
    began = time.perf_counter()
    for epoch in range(args.epoch):
        order = rng.permutation(len(shard.y))
        loss_total = 0.0
        for step in range(steps):
            batch = order[step * args.batchsize : (step + 1) * args.batchsize]
            loss_total += model.loss_and_grad(shard.x[batch], shard.y[batch])
            comm.Allreduce(model.grad, summed, op=MPI.SUM)
            velocity = 0.9 * velocity - args.lr * (summed / comm.size)
            model.flat += velocity
        mean_loss = comm.allreduce(loss_total, op=MPI.SUM) / (steps * comm.size)
        if lead:
            print(f"epoch {epoch + 1}/{args.epoch} loss {mean_loss:.4f}", flush=True)
            print(f"metric loss={mean_loss:.6f} step={(epoch + 1) * steps}", flush=True)
    seconds = time.perf_counter() - began

    if lead:
        assert test is not None
        accuracy = model.accuracy(test)
        rate = args.epoch * steps * args.batchsize * comm.size / seconds
        print(f"samples/s: {rate:.0f}", flush=True)
        out = output_dir(args.out)
        out.mkdir(parents=True, exist_ok=True)
        model_path = out / "model.npz"
        params = model.params
        np.savez(model_path, W1=params["W1"], b1=params["b1"], W2=params["W2"], b2=params["b2"])
        print(f"model saved to {model_path}", flush=True)
        print(f"test accuracy: {accuracy:.4f}", flush=True)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit:
        raise
    except BaseException:
        # One failed rank must not leave the others blocked in a collective.
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(code)
