#!/usr/bin/env bash
# The main job: PyTorch DDP on 2 nodes x 2 processes of the embedded local cluster, with its
# live logs, its accuracy and where the model was saved.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
batchyard cluster show -n local2 >/dev/null 2>&1 \
  || batchyard cluster create -n local2 -s Standard_D2_v2 -t 2 >/dev/null
name="mnist-ddp-$(date +%Y%m%d-%H%M%S)"
batchyard job create -f examples/mnist-ddp/job.yaml -c local2 -n "$name" --wait
echo
batchyard job file list -n "$name"
