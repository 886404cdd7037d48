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
# bubblewrap: the rank sandbox's fallback where the launcher cannot make namespaces itself
command -v bwrap >/dev/null 2>&1 || apt_missing+=(bubblewrap)
# Slurm (slurmctld, slurmd, the client commands) and MUNGE for the Slurm backend's tests
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
  && command -v sbatch >/dev/null 2>&1 || apt_missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || apt_missing+=(munge)
# Container runtimes, image building and a registry for the container tests (tests/containerkit.py
# starts every daemon by hand; the packages' systemd units and init scripts are never used).
# /usr/bin/docker (docker.io's client, like its dockerd): a client-only /usr/local/bin/docker
# may come first on PATH; it talks to this daemon too, but its `docker build` needs buildx.
sbin_path="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
have() { PATH="$sbin_path" command -v "$1" >/dev/null 2>&1; }
{ have dockerd && have containerd && [ -x /usr/bin/docker ]; } || apt_missing+=(docker.io)
have runc || apt_missing+=(runc)
{ have podman && have conmon; } || apt_missing+=(podman)
have catatonit || apt_missing+=(catatonit)  # podman run --init
have debootstrap || apt_missing+=(debootstrap)  # the test images' root filesystems
have docker-registry || apt_missing+=(docker-registry)  # distribution 2.8, htpasswd auth
have htpasswd || apt_missing+=(apache2-utils)  # bcrypt for the registry's htpasswd file
# FUSE mounts of blob containers and buckets (ro_mount/rw_mount, azureBlobFileSystems), and
# the NFS client for fileServers mounts (mount.nfs)
have rclone || apt_missing+=(rclone)
have fusermount3 || apt_missing+=(fuse3)
have mount.nfs || apt_missing+=(nfs-common)
# PostgreSQL: a team server's database; the tests run a private instance of it (tests/pgkit.py)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || apt_missing+=(postgresql)
# Node.js and npm: Azurite and the OpenID provider of the single sign-on tests (below)
command -v npm >/dev/null 2>&1 || apt_missing+=(npm)
# Prometheus (and promtool): the /metrics test runs a real one on loopback (tests/promkit.py)
{ have prometheus && have promtool; } || apt_missing+=(prometheus)
if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing ${apt_missing[*]} (apt)"
    # no package may start its daemon (dockerd, docker-registry on :5000): deny service starts
    # for the install unless the machine already has a policy
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d
      own_policy=1
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${apt_missing[@]}" >/dev/null
    if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
  else
    echo "warning: ${apt_missing[*]} missing and not root; MPI jobs and tests (or the portal's browser tests, the container tests) will be skipped (and fail under CI=true or BATCHYARD_TEST_STRICT=1)" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import batchyard, torch, sklearn, mpi4py, fastapi, pytest, adlfs, s3fs, moto, cryptography, ray, playwright, jinja2, prometheus_client, mlflow, tensorboard, pynvml" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.installed ]; then
  echo "installing batchyard and its dependencies into .venv"
  # torch==2.13.0 pins the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q -e ".[dev,train,storage,ray,mlflow,tensorboard,gpu]" "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import batchyard, torch, sklearn, fastapi, pytest, ray, playwright, adlfs, mlflow, tensorboard"
  touch .venv/.installed
fi

# mpi4py's own demo scripts (the sdist carries them, the wheel does not): the MPI tests run
# them unchanged (tests/mpikit.py, mpi4py_demo)
mpi4py_version=$(.venv/bin/python -c "from importlib.metadata import version; print(version('mpi4py'))")
if [ ! -f ".cache/mpi4py-sdist/mpi4py-$mpi4py_version.tar.gz" ]; then
  echo "fetching mpi4py $mpi4py_version's source distribution (its demos) into .cache/mpi4py-sdist"
  .venv/bin/pip download -q --no-deps --no-binary :all: -d .cache/mpi4py-sdist "mpi4py==$mpi4py_version"
fi

# Azurite (the Azure Storage emulator) for the storage tests; moto's S3 server comes with the
# storage extra above.
if [ ! -x .cache/azurite/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "installing azurite (npm) into .cache/azurite"
    npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error azurite@3 >/dev/null
  else
    echo "warning: npm missing; Azure Blob storage tests will be skipped (and fail under CI=true or BATCHYARD_TEST_STRICT=1)" >&2
  fi
fi

# A real OpenID provider (npm oidc-provider, a certified implementation) for the single sign-on
# tests (tests/oidckit.py starts it on loopback). Pinned: its pages are driven by the tests.
OIDC_PROVIDER_VERSION=9.13.3
if [ ! -f .cache/oidc-provider/node_modules/oidc-provider/package.json ] \
   || ! grep -q "\"version\": \"$OIDC_PROVIDER_VERSION\"" .cache/oidc-provider/node_modules/oidc-provider/package.json; then
  if command -v npm >/dev/null 2>&1; then
    echo "installing oidc-provider@$OIDC_PROVIDER_VERSION (npm) into .cache/oidc-provider"
    npm install --prefix .cache/oidc-provider --no-audit --no-fund --loglevel=error \
      "oidc-provider@$OIDC_PROVIDER_VERSION" >/dev/null
  else
    echo "warning: npm missing; the single sign-on tests will be skipped" >&2
  fi
fi
