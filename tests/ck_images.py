"""The container kit's test images (tests/containerkit.py): recipes, the apt mirror, rootfs
tarball building and caching, and importing them into an engine."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import strictkit
from ck_common import (
    CACHE,
    DATA,
    IMAGE_PATH,
    KIT_VERSION,
    REPO_PREFIX,
    SUITE,
    _clean_env,
    _flock,
    _private_dir,
    _root_reason,
    _sh,
    _umount_under,
    _which,
)

if TYPE_CHECKING:
    from ck_engines import Engine


# -- images -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """How one image's rootfs is made: debootstrap (``parent`` None) or the parent's tarball,
    then apt packages and pinned wheels (``requirements``, a file in tests/data/containers)
    installed inside it, then ``check`` (sh, in the image) must pass."""

    kind: str
    parent: str | None = None
    debootstrap: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    requirements: str | None = None
    check: str = ""
    cmd: str = "/bin/bash"

    def spec(self) -> dict[str, Any]:
        req = (DATA / self.requirements).read_text() if self.requirements else None
        return {"kit": KIT_VERSION, "suite": SUITE, "kind": self.kind, "parent": self.parent,
                "debootstrap": self.debootstrap, "apt": self.apt, "requirements": req,
                "check": self.check, "cmd": self.cmd, "cleanup": _CLEANUP, "path": IMAGE_PATH}


_MPI4PY_LIB = ("python3 -c 'import mpi4py; mpi4py.rc.initialize = False; "
               "from mpi4py import MPI; v = MPI.Get_library_version(); "
               "print(v.splitlines()[0]); assert \"{want}\" in v, v'")
RECIPES: dict[str, Recipe] = {r.kind: r for r in (
    Recipe("base", debootstrap=("python3", "python3-numpy", "procps", "iproute2"),
           check="python3 -c 'import numpy'\n"
                 "for c in bash sleep kill ps ip; do command -v $c >/dev/null; done"),
    Recipe("mpich", parent="base", apt=("python3-pip",), requirements="mpich-requirements.txt",
           check="mpirun --version | grep -q HYDRA\n"
                 "test \"$(command -v mpirun) $(command -v mpiexec)\" = "
                 "'/usr/local/bin/mpirun /usr/local/bin/mpiexec'\n"
                 + _MPI4PY_LIB.format(want="MPICH") + "\npython3 -c 'import sklearn.datasets'"),
    Recipe("openmpi", parent="base", apt=("openmpi-bin", "python3-mpi4py", "python3-pip"),
           requirements="openmpi-requirements.txt",
           check="mpirun --version | grep -q 'Open MPI'\n" + _MPI4PY_LIB.format(want="Open MPI")
                 + "\npython3 -c 'import sklearn.datasets'"),
    Recipe("torch", parent="base", apt=("python3-pip",), requirements="torch-requirements.txt",
           check="python3 -c 'import torch, torch.distributed, sklearn; print(torch.__version__)'"),
    Recipe("tiny", cmd="/bin/sh"),  # busybox-static only
)}
# run inside the image at the end of every build: smaller tarballs, nothing host-specific
_CLEANUP = ("apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* "
            "/var/log/dpkg.log /var/log/alternatives.log /usr/share/doc/* /usr/share/man/* "
            "/usr/share/info/* /usr/share/locale/* /root/.cache /tmp/* /var/tmp/*; "
            "find /usr /etc /var /root -xdev -name __pycache__ -prune -exec rm -rf {} +")
_MANYLINUX = [f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def apt_mirror() -> str:
    """The Debian archive this machine's apt uses (BATCHYARD_TEST_APT_MIRROR overrides), read
    from /etc/apt/sources.list and sources.list.d (one-line and deb822 formats)."""
    if env := os.environ.get("BATCHYARD_TEST_APT_MIRROR"):
        return env
    entries: list[tuple[str, list[str]]] = []  # (uri, suites)
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*"))]
    for f in files:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = f.read_text()
            if f.suffix == ".sources":
                for stanza in re.split(r"\n\s*\n", text):
                    fields: dict[str, str] = {}
                    for line in stanza.splitlines():
                        if ":" in line and not line.lstrip().startswith("#"):
                            k, v = line.split(":", 1)
                            fields[k.strip().lower()] = v.strip()
                    if "deb" in fields.get("types", "").split() and \
                            fields.get("enabled", "yes").lower() != "no":
                        entries += [(u, fields.get("suites", "").split())
                                    for u in fields.get("uris", "").split()]
            elif f.suffix == ".list" or f.name == "sources.list":
                for line in text.splitlines():
                    words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                    if len(words) >= 3 and words[0] == "deb":
                        entries.append((words[1], [words[2]]))
    archives = [(u.rstrip("/"), suites) for u, suites in entries
                if u.startswith(("http://", "https://")) and "debian" in u and "security" not in u]
    for uri, suites in archives:  # the main archive: a plain suite (bookworm), not -updates
        if any("-" not in s for s in suites):
            return uri
    if archives:
        return archives[0][0]
    return "http://deb.debian.org/debian"


@functools.cache
def images_unavailable() -> str | None:
    if reason := _root_reason():
        return reason
    if missing := [b for b in ("debootstrap", "unshare", "chroot", "tar", "mount", "apt-get")
                   if not _which(b)]:
        return f"test images need {', '.join(missing)} (apt-get install debootstrap)"
    return None


class ImageKit:
    """Builds (once per machine, cached by recipe hash) and imports the test images.

    ``name(kind, engine)`` -> the exact image name for that engine, importing it on first use;
    ``tarball(kind)`` -> the cached rootfs tarball; ``tag(kind)`` -> the 8-hex tag;
    ``build_derived(engine, ...)`` -> an image built FROM one of them. ``timings`` records
    what each build/import took (seconds), for the curious."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        self.timings: dict[str, float] = {}
        self._keys: dict[str, str] = {}

    # hashes and names
    def key(self, kind: str) -> str:
        if kind not in self._keys:
            recipe = RECIPES[kind]
            spec = recipe.spec()
            if recipe.parent:
                spec["parent_key"] = self.key(recipe.parent)
            self._keys[kind] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()
                                              ).hexdigest()
        return self._keys[kind]

    def tag(self, kind: str) -> str:
        return self.key(kind)[:8]

    def repo(self, kind: str) -> str:
        return REPO_PREFIX + kind

    def name(self, kind: str, engine: Engine) -> str:
        """The exact name to run ``kind`` with on ``engine`` (imported if not there yet)."""
        local = f"{self.repo(kind)}:{self.tag(kind)}"
        ref = engine.qualify(local)
        if ref in engine.imported or engine.has_image(ref):
            engine.imported.add(ref)
            return ref
        tar = self.tarball(kind)
        t0 = time.monotonic()
        engine.remove_images(engine.qualify(self.repo(kind)), keep=ref)
        recipe = RECIPES[kind]
        engine.import_image(tar, local, [f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8",
                                         f"CMD {json.dumps([recipe.cmd])}"])
        self.timings[f"import {kind} ({engine.name})"] = time.monotonic() - t0
        engine.imported.add(ref)
        return ref

    # building
    def tarball(self, kind: str) -> Path:
        """The rootfs tarball of ``kind``, built (with its parents) unless cached; several
        processes asking at once build it once (flock per image)."""
        if reason := images_unavailable():
            strictkit.missing(reason)
        key = self.key(kind)
        out = self._dir("images") / f"{kind}-{key[:16]}.tar"
        if out.exists():
            return out
        parent_kind = RECIPES[kind].parent
        parent = self.tarball(parent_kind) if parent_kind else None
        with _flock(self.cache / "locks" / f"{kind}-{key[:16]}.lock"):
            if out.exists():
                return out
            t0 = time.monotonic()
            work = _private_dir(f"build-{kind}-", self._dir("build"))
            try:
                tmp = work / "rootfs.tar"
                if kind == "tiny":
                    self._build_tiny(work, tmp)
                else:
                    self._build(RECIPES[kind], parent, work / "root", tmp)
                os.replace(tmp, out)
            finally:
                _umount_under([work])
                shutil.rmtree(work, ignore_errors=True)
            self.timings[f"build {kind}"] = time.monotonic() - t0
            self._prune_cache(kind, keep=out)
        return out

    def _dir(self, sub: str) -> Path:
        d = self.cache / sub
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _prune_cache(self, kind: str, keep: Path) -> None:
        """Drop tarballs of older recipes of the same kind (nobody can be using them: they
        are only read while importing, under no lock, so give them an hour)."""
        for old in (self.cache / "images").glob(f"{kind}-*.tar"):
            if old != keep and time.time() - old.stat().st_mtime > 3600:
                old.unlink(missing_ok=True)

    def _wheels(self, requirements: str) -> Path:
        """The pinned wheels of a requirements file, downloaded once with the host's pip for
        CPython 3.11 on manylinux x86_64 (the image's python3), into the cache."""
        text = (DATA / requirements).read_text()
        d = self._dir("wheels") / hashlib.sha256(text.encode()).hexdigest()[:16]
        with _flock(d.with_suffix(".lock")):
            if not (d / ".complete").exists():
                d.mkdir(exist_ok=True)
                (d / "requirements.txt").write_text(text)
                plat = [a for p in _MANYLINUX for a in ("--platform", p)]
                _sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                     "--only-binary", ":all:", "--python-version", "3.11", "--implementation",
                     "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none", *plat,
                     "-d", d, "-r", d / "requirements.txt"], timeout=1200,
                    what=f"pip download -r {requirements}")
                if "torch==" in text and not any(d.glob("torch-*+cpu-*.whl")):
                    raise RuntimeError(f"{requirements}: pip did not find a CPU build of torch "
                                       f"(got {[w.name for w in d.glob('torch-*')]})")
                (d / ".complete").touch()
        return d

    def _build(self, recipe: Recipe, parent: Path | None, root: Path, out: Path) -> None:
        root.mkdir()
        if parent is None:
            _sh(["debootstrap", "--variant=minbase", f"--include={','.join(recipe.debootstrap)}",
                 f"--cache-dir={self._dir('debs')}", SUITE, root, apt_mirror()], timeout=1200,
                what=f"debootstrap {SUITE} from {apt_mirror()}")
        else:
            _sh(["tar", "--numeric-owner", "-xpf", parent, "-C", root], what="unpack parent")
        wheels = self._wheels(recipe.requirements) if recipe.requirements else None
        inner = ["set -e"]
        if recipe.apt:
            inner += ["apt-get update -q", "apt-get install -y -q --no-install-recommends "
                      + " ".join(recipe.apt)]
        if wheels:
            inner.append("python3 -m pip install -q --no-index --find-links /mnt/wheels "
                         "--break-system-packages --no-cache-dir --no-compile "
                         "--root-user-action=ignore --disable-pip-version-check "
                         "-r /mnt/wheels/requirements.txt")
        inner += ["ldconfig", recipe.check or "true", _CLEANUP]
        q = shlex.quote
        r = q(str(root))
        outer = ["set -e",
                 f"mount -t proc proc {r}/proc", f"mount -t sysfs sysfs {r}/sys",
                 f"mount --rbind /dev {r}/dev",
                 f"printf '#!/bin/sh\\nexit 101\\n' > {r}/usr/sbin/policy-rc.d",
                 f"chmod 0755 {r}/usr/sbin/policy-rc.d"]
        if wheels:
            outer += [f"mkdir -p {r}/mnt/wheels",
                      f"mount --bind {q(str(wheels))} {r}/mnt/wheels"]
        outer += [f"chroot {r} /usr/bin/env -i PATH={IMAGE_PATH} HOME=/root LANG=C.UTF-8 "
                  f"DEBIAN_FRONTEND=noninteractive /bin/sh -c {q(chr(10).join(inner))}",
                  f"rm -f {r}/usr/sbin/policy-rc.d"]
        if wheels:
            outer += [f"umount {r}/mnt/wheels", f"rmdir {r}/mnt/wheels"]
        # a private mount namespace: proc, sys, dev and the wheels vanish with it, whatever fails
        _sh(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
             "\n".join(outer)], timeout=1800, what=f"building image {recipe.kind}")
        for d in ("proc", "sys", "dev/pts"):  # nothing of the host's may remain in the tarball
            if (root / d).is_dir() and any((root / d).iterdir()):
                raise RuntimeError(f"{root / d} not empty after the build")
        _sh(["tar", "--numeric-owner", "-C", root, "-cf", out, "."], what="tar rootfs")

    def _build_tiny(self, work: Path, out: Path) -> None:
        """busybox-static's binary plus a link per applet: a ~1 MB image, from the host's apt."""
        res = subprocess.run(["apt-get", "download", "busybox-static"], cwd=work,
                             capture_output=True, text=True, timeout=300, env=_clean_env())
        if res.returncode != 0:  # no lists yet on a fresh machine
            _sh(["apt-get", "update", "-q"], timeout=600)
            _sh(["apt-get", "download", "busybox-static"], timeout=300, cwd=work)
        deb = next(work.glob("busybox-static_*.deb"))
        _sh(["dpkg-deb", "-x", deb, work / "x"])
        busybox = (work / "x" / "bin" / "busybox").read_bytes()
        applets = _sh([work / "x" / "bin" / "busybox", "--list"]).stdout.split()
        files: dict[str, tuple[int, bytes]] = {
            "etc/passwd": (0o644, b"root:x:0:0:root:/root:/bin/sh\n"
                                  b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
            "etc/group": (0o644, b"root:x:0:\nnogroup:x:65534:\n"),
            "bin/busybox": (0o755, busybox)}
        with tarfile.open(out, "w") as tar:
            for d, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777),
                            ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("usr", 0o755),
                            ("usr/bin", 0o755), ("var", 0o755), ("var/tmp", 0o1777)):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
            for path, (mode, data) in files.items():
                info = tarfile.TarInfo(path)
                info.mode, info.size = mode, len(data)
                tar.addfile(info, io.BytesIO(data))
            for applet in applets:
                if applet != "busybox":
                    info = tarfile.TarInfo(f"bin/{applet}")
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
                    tar.addfile(info)

    def build_derived(self, engine: Engine, name: str, containerfile: str | Path | None = None,
                      base: str = "base", files: Mapping[str, str | bytes] | None = None,
                      timeout: float = 300) -> str:
        """``docker/podman build`` of ``containerfile`` (text or path; default
        tests/data/containers/derived.Containerfile with its hello.sh) whose ``FROM ${BASE}``
        gets the exact name of test image ``base``; ``files`` (name -> content) join the
        build context. RUN steps use the host network. Returns the engine's exact name."""
        if containerfile is None:
            containerfile = DATA / "derived.Containerfile"
            files = {"hello.sh": (DATA / "hello.sh").read_text(), **(files or {})}
        text = containerfile.read_text() if isinstance(containerfile, Path) else containerfile
        base_ref = self.name(base, engine)
        with tempfile.TemporaryDirectory(prefix="ckbuild-") as ctx:
            (Path(ctx) / "Containerfile").write_text(text)
            for rel, content in (files or {}).items():
                p = Path(ctx) / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    p.write_bytes(content)
                else:
                    p.write_text(content)
            t0 = time.monotonic()
            engine.build(Path(ctx), "Containerfile", name, {"BASE": base_ref}, timeout)
            self.timings[f"build_derived {name} ({engine.name})"] = time.monotonic() - t0
        return engine.qualify(name)


@dataclass
class KindImage:
    """One image kind (e.g. torch) whose tarball is already built: ``name(engine)``."""

    kit: ImageKit
    kind: str

    def name(self, engine: Engine) -> str:
        return self.kit.name(self.kind, engine)
