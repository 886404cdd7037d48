#!/usr/bin/env bash
# Job preparation (Batch AI jobPreparation / batchyard `prepare`): runs on every node before
# the ranks start. The Batch AI recipe installed Intel MPI here; this one only checks that the
# node can run train_mpi.py and prints what it found.
set -euo pipefail

echo "jobprep on $(hostname): $(python --version 2>&1) at $(command -v python)"
python - <<'PY'
import mpi4py
import numpy
import sklearn
from mpi4py import MPI

print(f"numpy {numpy.__version__}, mpi4py {mpi4py.__version__}, scikit-learn {sklearn.__version__}")
print(MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip())
PY
if command -v mpirun >/dev/null 2>&1; then
    mpirun --version 2>&1 | sed -n 1p  # sed reads it all: head would SIGPIPE a long one (MPICH)
else
    echo "mpirun not found on PATH" >&2
    exit 1
fi
echo "jobprep done"
