"""The seed's Horovod (PyTorch) MNIST, Horovod-style on what is installed here: a PyTorch MLP
trained data-parallel on scikit-learn's bundled 8x8 digits (no downloads), gradients averaged
across ranks with an MPI Allreduce (mpi4py) as Horovod's DistributedOptimizer does. Run it
under mpirun, or as an Azure ML ``PyTorch(..., distributed_backend='mpi')`` estimator through
``batchyard.compat.azureml`` (see seed001.py). Rank 0 logs the loss of every epoch and the test
accuracy with ``Run.get_context().log`` and saves the model to ./outputs.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

from batchyard.compat.azureml.core.run import Run


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    run = Run.get_context()

    x, y = load_digits_arrays()
    order = np.random.default_rng(args.seed).permutation(len(y))
    n_test = len(y) // 5
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 0.1
    features = torch.from_numpy(((x - mean) / std).astype(np.float32))
    labels = torch.from_numpy(y)
    shard = train[rank::size]  # each rank trains on its own slice, like a DistributedSampler

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    params = list(model.parameters())
    for p in params:  # hvd.broadcast_parameters: everyone starts from rank 0's weights
        buf = p.data.numpy()
        comm.Bcast(buf, root=0)
    optimizer = torch.optim.SGD(params, lr=args.lr * size, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps = comm.allreduce(len(shard), op=MPI.MIN) // args.batch_size
    rng = np.random.default_rng(args.seed + rank)
    if rank == 0:
        print(f"MPI world size {size}; {steps} steps per epoch per rank", flush=True)
    for epoch in range(args.epochs):
        perm = rng.permutation(shard)
        total = 0.0
        for step in range(steps):
            batch = perm[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(features[batch]), labels[batch])
            loss.backward()
            flat = np.concatenate([p.grad.numpy().ravel() for p in params])
            summed = np.empty_like(flat)
            comm.Allreduce(flat, summed, op=MPI.SUM)  # hvd.DistributedOptimizer
            offset = 0
            for p in params:
                n = p.grad.numel()
                p.grad.copy_(torch.from_numpy(summed[offset:offset + n] / size).view_as(p.grad))
                offset += n
            optimizer.step()
            total += loss.item()
        mean_loss = comm.allreduce(total, op=MPI.SUM) / (steps * size)
        if rank == 0:
            print(f"Train Epoch: {epoch + 1} Loss: {mean_loss:.4f}", flush=True)
            run.log("loss", mean_loss, step=epoch + 1)
    with torch.no_grad():
        accuracy = float((model(features[test]).argmax(1) == labels[test]).float().mean())
    if rank == 0:
        print(f"Test set: Accuracy: {accuracy:.4f}", flush=True)
        run.log("accuracy", accuracy)
        os.makedirs("outputs", exist_ok=True)
        torch.save(model.state_dict(), "outputs/model.pt")
    run.complete()  # sends every metric now
    comm.Barrier()


if __name__ == "__main__":
    main()
