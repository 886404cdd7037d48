"""Job environments with another MPI than the host's Open MPI: virtualenvs with PyPI's
``mpich`` wheel (Hydra's mpiexec/mpirun and libmpi) or ``impi-rt`` (Intel MPI's runtime:
mpiexec.hydra, its mpirun script, libmpi and libfabric), plus ``mpi4py`` (its binary wheel
loads the libmpi of the venv it runs from), numpy and scikit-learn (what examples/mnist-mpi
imports). Jobs get one with ``environment.python: <venv>/bin/python``: the venv's bin, its
mpirun included, comes first on their PATH.

Debian's ``mpich`` package would fight Open MPI for /usr/bin/mpirun, so none is installed on
the host. Each venv is built once per machine (under /var/cache, shared by concurrent runs
through a lock) and checked before each use; a broken one is built again.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path("/var/cache/batchyard-tests")
FLAVOURS = {
    # flavour: (venv name, the MPI package, what MPI.Get_library_version() starts with)
    "mpich": ("mpich-venv", "mpich", "MPICH"),
    "intelmpi": ("impi-venv", "impi-rt", "Intel(R) MPI"),
}
CHECK = (
    "import sys, numpy, sklearn; from mpi4py import MPI; "
    "v = MPI.Get_library_version(); assert v.startswith(sys.argv[1]), v"
)


def _ok(venv: Path, library: str) -> bool:
    python = venv / "bin" / "python"
    if not python.is_file() or not (venv / "bin" / "mpirun").is_file():
        return False
    done = subprocess.run([str(python), "-c", CHECK, library], capture_output=True,
                          text=True, timeout=120)
    return done.returncode == 0


def mpi_venv(flavour: str = "mpich") -> Path:
    """The flavour's venv, built if missing or broken (PyPI is reachable wherever the tests
    run: a failed build fails the test, it does not skip it)."""
    name, package, library = FLAVOURS[flavour]
    venv = ROOT / name
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ok(venv, library):
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package, "mpi4py",
                              "numpy", "scikit-learn"], capture_output=True, text=True,
                             timeout=1200)
        if pip.returncode != 0 or not _ok(venv, library):
            shutil.rmtree(venv, ignore_errors=True)
            pytest.fail(f"could not build the {flavour} venv: {pip.stderr[-2000:]}")
        return venv


def mpi4py_demo(relative: str) -> str:
    """The text of one of mpi4py's own demo scripts (``demo/<relative>``), unchanged, from
    the source distribution of the mpi4py installed here: PyPI's sdist carries the demos the
    wheel leaves out. scripts/setup.sh fetches it into .cache/mpi4py-sdist; failing that it
    is fetched here (a failed fetch fails the test, it does not skip it)."""
    import tarfile
    from importlib.metadata import version

    wanted = version("mpi4py")
    name = f"mpi4py-{wanted}.tar.gz"
    for folder in (Path(__file__).resolve().parents[1] / ".cache" / "mpi4py-sdist",
                   ROOT / "mpi4py-sdist"):
        if (folder / name).is_file():
            break
    else:
        folder.mkdir(parents=True, exist_ok=True)
        with open(ROOT / ".mpi4py-sdist.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / name).is_file():
                got = subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                                      "--no-deps", "--no-binary", ":all:", "-d", str(folder),
                                      f"mpi4py=={wanted}"], capture_output=True, text=True,
                                     timeout=600)
                if got.returncode != 0:
                    pytest.fail(f"could not fetch mpi4py's sdist: {got.stderr[-2000:]}")
    with tarfile.open(folder / name) as tar:
        member = tar.extractfile(f"mpi4py-{wanted}/demo/{relative}")
        assert member is not None, relative
        return member.read().decode()
