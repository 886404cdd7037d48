#!/usr/bin/env bash
# Everything batchyard and its tests need on a fresh Debian machine: Open MPI, Slurm, a virtualenv,
# batchyard itself (editable) with the dev and training extras, PyTorch's CPU build.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_missing=()
command -v mpirun >/dev/null 2>&1 || apt_missing+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] \
  || dpkg -s libopenmpi-dev >/dev/null 2>&1 || apt_missing+=(libopenmpi-dev)
# Debian's Chromium (and a font) for the portal's browser tests (Playwright drives /usr/bin/chromium)
[ -x /usr/bin/chromium ] || apt_missing+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || apt_missing+=(fonts-dejavu-core)
# ip and nsenter/unshare for the multi-host tests (hosts as network namespaces)
command -v ip >/dev/null 2>&1 || apt_missing+=(iproute2)
command -v nsenter >/dev/null 2>&1 || apt_missing+=(util-linux)
# Slurm (slurmctld, slurmd, the client commands) and MUNGE for the Slurm backend's tests
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
  && command -v sbatch >/dev/null 2>&1 || apt_missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || apt_missing+=(munge)
if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing ${apt_missing[*]} (apt)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${apt_missing[@]}" >/dev/null
  else
    echo "warning: ${apt_missing[*]} missing and not root; MPI jobs and tests (or the portal's browser tests) will be skipped" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import batchyard, torch, sklearn, mpi4py, fastapi, pytest, adlfs, s3fs, moto, cryptography, ray, playwright, jinja2" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.installed ]; then
  echo "installing batchyard and its dependencies into .venv"
  # torch==2.13.0 pins the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q -e ".[dev,train,storage,ray]" "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import batchyard, torch, sklearn, fastapi, pytest, ray, playwright, adlfs"
  touch .venv/.installed
fi

# Azurite (the Azure Storage emulator) for the storage tests; moto's S3 server comes with the
# storage extra above.
if [ ! -x .cache/azurite/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "installing azurite (npm) into .cache/azurite"
    npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error azurite@3 >/dev/null
  else
    echo "warning: npm missing; Azure Blob storage tests will be skipped" >&2
  fi
fi
