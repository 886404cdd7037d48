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
if [ $# -eq 0 ]; then
  # The store, API and reconciler tests once more on a real PostgreSQL (tests/pgkit.py)
  BATCHYARD_TEST_DB=postgresql python -m pytest -q -p no:cacheprovider \
    tests/integration/test_api_auth.py tests/integration/test_api_scale.py \
    tests/integration/test_cluster_lifecycle.py tests/integration/test_hardening.py \
    tests/integration/test_arrays_deps.py tests/integration/test_idempotent_submit.py \
    tests/integration/test_schemathesis.py tests/integration/test_workspace_delete.py \
    tests/integration/test_bad_spec_rows.py tests/integration/test_roles.py \
    tests/integration/test_route_matrix.py tests/integration/test_sso_login.py
fi
