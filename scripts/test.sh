#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (real servers and processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check src tests bench examples
mypy
python -m pytest -q -p no:cacheprovider "$@"
