"""Multi-host test harness: each "host" is a network + UTS + mount namespace on this machine.

Why: the product must cope with machines that differ in address, hostname and local disk, while
tests need the repo's venv everywhere and hosts that start in milliseconds. Hosts share the root
fs except a tmpfs ``work_dir``, hidden paths and /etc/hosts. The bridge has a netns of its own, so
nothing touches the root netns (the test process cannot reach a host: run clients in one). The
namespaces persist as nsfs bind mounts under ``/run/batchyard-hostkit/<id>/`` so processes can
join later via ``nsenter`` (``ip netns exec`` would remount /sys and hide the cgroup fs).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

import strictkit

RUN_ROOT = Path("/run/batchyard-hostkit")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_File = int | IO[Any] | None


def _sh(argv: Sequence[str], stdin: str | None = None) -> None:
    """Run a setup step and fail loudly: a half-built net gives confusing test failures."""
    p = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed (rc {p.returncode}): {p.stderr.strip()}")


def _ns_key(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _pids_in(ns: tuple[int, int]) -> list[int]:
    """Scan /proc: the only complete answer, since daemons in a host may re-parent or setsid."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone, or a zombie (no ns links)
                if _ns_key(f"/proc/{entry.name}/ns/net") == ns:
                    found.append(int(entry.name))
    return found


def _kill_ns(ns: tuple[int, int], timeout: float = 10.0) -> None:
    """SIGKILL in a loop: a dying parent's children may still fork between two scans."""
    deadline = time.monotonic() + timeout
    while pids := _pids_in(ns):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes survive SIGKILL in netns {ns}: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _mounts_under(d: Path) -> list[str]:
    """Mount points at/below d, top-most first, from mountinfo (the truth after a crash)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if mp == str(d) or mp.startswith(f"{d}/"):
                found.append(mp)
    found.reverse()  # later mounts stack on earlier ones
    return sorted(found, key=lambda m: m.count("/"), reverse=True)


def _destroy_run_dir(d: Path) -> list[str]:
    """Kill, unmount and delete one run dir; keep going on errors so one leak is not many."""
    errors = []
    for f in sorted(d.glob("*.net")):
        try:
            _kill_ns(_ns_key(f))
        except Exception as e:  # e.g. not mounted yet after a partial failure
            errors.append(f"{f}: {e}")
    for mp in _mounts_under(d):
        try:
            _sh(["umount", "--lazy", mp])
        except RuntimeError as e:
            errors.append(str(e))
    shutil.rmtree(d, ignore_errors=True)
    return [*errors, f"{d} is left behind"] if d.exists() else errors


@contextlib.contextmanager
def _run_root_lock() -> Iterator[None]:
    """Serialise subnet choice, reaping and RUN_ROOT create/remove across concurrent runs.

    The lock is on RUN_ROOT's parent, which is never removed, so no lock file is left behind."""
    fd = os.open(RUN_ROOT.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        RUN_ROOT.mkdir(exist_ok=True)
        yield
    finally:
        os.close(fd)


def _gc_made_dirs() -> None:
    """Remove mount-point dirs some run created, once no live run mounts on them (call locked).

    Shared books, not per run: an rmdir in the root ns of a dir that another run's host mounts
    on succeeds and silently detaches that host's tmpfs (Linux >= 3.18)."""
    books = RUN_ROOT / "made-dirs"
    made = set(books.read_text().splitlines()) if books.exists() else set()
    in_use = [Path(p) for u in RUN_ROOT.glob("*/uses") for p in u.read_text().splitlines()]
    keep = []
    for d in sorted(map(Path, made), key=lambda p: len(p.parts), reverse=True):
        if any(d == u or d in u.parents for u in in_use):
            keep.append(f"{d}\n")
        else:
            with contextlib.suppress(OSError):
                d.rmdir()  # only if still empty: a test may have put files there
    if keep:
        books.write_text("".join(keep))
    else:
        books.unlink(missing_ok=True)


def _owner_id(pid: int) -> str:
    """pid plus start time, so a recycled pid or a not-yet-reaped zombie counts as dead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "dead"
    return "dead" if fields[0] in "ZX" else f"{pid} {fields[19]}"


class Host:
    """One simulated machine; processes enter it with nsenter, so it outlives any of them."""

    def __init__(self, net: HostNet, name: str, index: int, work_dir: Path) -> None:
        self.net, self.name, self.work_dir = net, name, work_dir
        self.addr, self.veth = f"{net.prefix}.{index}", f"ve{index}"  # host side is always eth0
        self.ns = {k: net.dir / f"{name}.{k}" for k in ("net", "uts", "mount")}
        self.procs: list[subprocess.Popen[Any]] = []

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.addr})"

    def enter(self, argv: Sequence[str | Path], cwd: str | Path | None = None) -> list[str]:
        """nsenter resets the cwd to / on entering the mount ns, so pass it explicitly."""
        wd = os.path.abspath(cwd) if cwd is not None else os.getcwd()
        return ["nsenter", f"--net={self.ns['net']}", f"--uts={self.ns['uts']}",
                f"--mount={self.ns['mount']}", f"--wd={wd}", "--", *map(str, argv)]

    def popen(self, argv: Sequence[str | Path], env: dict[str, str] | None = None,
              stdout: _File = None, stderr: _File = None, cwd: str | Path | None = None,
              text: bool = False) -> subprocess.Popen[Any]:
        """Own session, so a daemon's whole group can be signalled; remembered for reaping.

        Returns only once the child has joined the host (nsenter does that after exec), so
        pids() and kill_all() can never miss a process that is still on its way in."""
        proc = subprocess.Popen(self.enter(argv, cwd), env=dict(os.environ if env is None else env),
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True, text=text)
        self.procs.append(proc)
        key, deadline = _ns_key(self.ns["net"]), time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if _ns_key(f"/proc/{proc.pid}/ns/net") == key:
                    break
            time.sleep(0.001)
        return proc

    def run(self, argv: Sequence[str | Path], env: dict[str, str] | None = None,
            timeout: float = 60, check: bool = False,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
        """Like subprocess.run, but a timeout kills the whole group, not just the leader."""
        proc = self.popen(argv, env, subprocess.PIPE, subprocess.PIPE, cwd, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        finally:
            self.procs.remove(proc)
        res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            res.check_returncode()
        return res

    def pids(self) -> list[int]:
        return _pids_in(_ns_key(self.ns["net"]))

    def kill_all(self) -> None:
        """Also reap our own children, or they would linger as zombies of the test process."""
        _kill_ns(_ns_key(self.ns["net"]))
        for proc in self.procs:
            proc.wait(timeout=5)
        self.procs.clear()

    def link_down(self) -> None:
        """Down the bridge-side end: the host keeps its address but both sides see silence."""
        self.net.bridge_ip(f"link set {self.veth} down")

    def link_up(self) -> None:
        self.net.bridge_ip(f"link set {self.veth} up")

    def read_file(self, path: str | Path) -> bytes:
        """Relative paths are taken from work_dir, where a host's interesting files live."""
        p = subprocess.run(["nsenter", f"--mount={self.ns['mount']}", "cat", "--",
                            str(self.work_dir / path)], capture_output=True, timeout=20)
        if p.returncode != 0:
            raise FileNotFoundError(f"{self.name}:{path}: {p.stderr.decode().strip()}")
        return p.stdout


class HostNet:
    """A private L2 segment 10.231.X.0/24 whose bridge lives in a netns of its own."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(3)
        self.hosts: dict[str, Host] = {}
        self._closed = False
        self.dir, self.bridge = RUN_ROOT / self.id, f"br{self.id}"
        self.bridge_ns = self.dir / "bridge.net"
        atexit.register(self.close)
        try:
            with _run_root_lock():
                self._reap_stale()
                self.dir.mkdir()
                (self.dir / "owner").write_text(_owner_id(os.getpid()) + "\n")
                self.subnet = self._pick_subnet()
                (self.dir / "subnet").write_text(f"{self.subnet}\n")
            self.prefix = f"10.231.{self.subnet}"
            # nsfs (mount ns) bind mounts are refused inside a shared mount.
            _sh(["mount", "--bind", str(self.dir), str(self.dir)])
            _sh(["mount", "--make-private", str(self.dir)])
            self.bridge_ns.touch()
            _sh(["unshare", f"--net={self.bridge_ns}", "true"])
            self.bridge_ip(f"link set lo up\nlink add {self.bridge} type bridge forward_delay 0\n"
                           f"link set {self.bridge} up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> HostNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bridge_ip(self, batch: str) -> None:
        _sh(["nsenter", f"--net={self.bridge_ns}", "ip", "-batch", "-"], stdin=batch + "\n")

    @staticmethod
    def _reap_stale() -> None:
        """Clean up after runs whose process died (SIGKILL, crashed CI) so they don't pile up."""
        for d in filter(Path.is_dir, RUN_ROOT.iterdir()):
            try:
                owner = (d / "owner").read_text().split()
            except OSError:
                owner = []  # run dirs are made under the same lock: one without owner is debris
            if not owner or _owner_id(int(owner[0])) != " ".join(owner):
                _destroy_run_dir(d)
        _gc_made_dirs()

    def _pick_subnet(self) -> int:
        """Random X, avoiding live runs and anything the root namespace already routes."""
        used: set[int] = set()
        for d in RUN_ROOT.iterdir():
            with contextlib.suppress(OSError, ValueError):
                used.add(int((d / "subnet").read_text()))
        for what in ("addr", "route"):
            out = subprocess.run(["ip", "-4", "-o", what], capture_output=True, text=True).stdout
            used.update(int(x) for x in re.findall(r"\b10\.231\.(\d+)\.", out))
        free = sorted(set(range(1, 255)) - used)
        if not free:
            raise RuntimeError("no free 10.231.X.0/24 subnet")
        return random.choice(free)

    def add_host(self, name: str, hide: Sequence[str | Path] = (),
                 work_dir: str = "/var/lib/batchyard") -> Host:
        """The 127.0.1.1 self-mapping mimics Debian, which breaks naive gloo rendezvous."""
        if self._closed:
            raise RuntimeError("HostNet is closed")
        if not _NAME.match(name) or name in self.hosts or len(self.hosts) >= 250:
            raise ValueError(f"bad, duplicate or one too many host name: {name!r}")
        host = Host(self, name, len(self.hosts) + 1, Path(work_dir).absolute())
        hidden = [Path(h).absolute() for h in hide]
        points = [host.work_dir, *hidden]
        if bad := [p for p in points if (p.exists() and not p.is_dir()) or "\n" in str(p)]:
            raise ValueError(f"work_dir and hidden paths must be directories: {bad}")
        with _run_root_lock():  # mount points must exist; the last run out removes them
            with open(self.dir / "uses", "a") as fh:
                fh.writelines(f"{p}\n" for p in points)
            with open(RUN_ROOT / "made-dirs", "a") as fh:
                for p in points:
                    fh.writelines(f"{d}\n" for d in (p, *p.parents) if not d.exists())
                    p.mkdir(parents=True, exist_ok=True)
        hosts_file = self.dir / f"{name}.hosts"
        hosts_file.write_text(
            f"127.0.0.1 localhost\n127.0.1.1 {name}\n::1 localhost ip6-localhost ip6-loopback\n"
            + "".join(f"{h.addr} {h.name}\n" for h in [*self.hosts.values(), host]))
        q = shlex.quote
        script = "\n".join([
            "set -e",
            f"hostname {q(name)}",
            f"mount -t tmpfs -o mode=0755 hostkit-work {q(str(host.work_dir))}",
            *(f"mount -t tmpfs -o mode=0755 hostkit-hide {q(str(p))}" for p in hidden),
            f"mount --bind {q(str(hosts_file))} /etc/hosts",
            f"ip link add eth0 type veth peer name {host.veth} netns {q(str(self.bridge_ns))}",
            f"ip addr add {host.addr}/24 dev eth0",
            "ip link set lo up && ip link set eth0 up",
            f"nsenter --net={q(str(self.bridge_ns))} ip -batch - <<EOF",
            f"link set {host.veth} master {self.bridge}",
            f"link set {host.veth} up",
            "EOF",
        ])
        for f in host.ns.values():
            f.touch()
        try:
            _sh(["unshare", *(f"--{k}={f}" for k, f in host.ns.items()),
                 "--propagation", "private", "sh", "-c", script])
        except BaseException:
            self._drop(host)
            raise
        for h in self.hosts.values():  # append, so a concurrent reader never sees a short file
            with open(self.dir / f"{h.name}.hosts", "a") as fh:
                fh.write(f"{host.addr} {host.name}\n")
        self.hosts[name] = host
        return host

    def _drop(self, host: Host) -> None:
        """Undo a half-made host so the net stays usable after a failed add_host."""
        with contextlib.suppress(Exception):
            _kill_ns(_ns_key(host.ns["net"]))
        for f in [*host.ns.values(), self.dir / f"{host.name}.hosts"]:
            with contextlib.suppress(RuntimeError):  # keep the original error
                if str(f) in _mounts_under(f):
                    _sh(["umount", "--lazy", str(f)])
            f.unlink(missing_ok=True)

    def close(self) -> None:
        """Idempotent, and works from whatever state a failed setup left behind."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        errors = []
        for h in self.hosts.values():
            try:
                h.kill_all()
            except Exception as e:
                errors.append(f"{h.name}: {e}")
        with _run_root_lock():
            errors += _destroy_run_dir(self.dir)
            _gc_made_dirs()
            with contextlib.suppress(OSError):
                RUN_ROOT.rmdir()
        if errors:
            raise RuntimeError("HostNet.close: " + "; ".join(errors))


@functools.cache
def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "multi-host tests need root (network/UTS/mount namespaces)"
    if missing := [t for t in ("unshare", "nsenter", "ip", "mount") if not shutil.which(t)]:
        return f"multi-host tests need {', '.join(missing)}"
    probe = ("ip link add hkp0 type veth peer name hkp1 && ip link add hkpb type bridge"
             " && mount -t tmpfs hostkit-probe /tmp && hostname hostkit-probe")
    try:
        _sh(["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sh", "-c", probe])
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"cannot create namespaces/veth/bridge: {e}"
    return None


def require_root_netns() -> None:
    """Skip (not fail) where namespaces are unavailable, e.g. unprivileged CI containers."""
    if reason := _netns_unavailable():
        strictkit.missing(reason)


@pytest.fixture(scope="module")
def hostnet() -> Iterator[HostNet]:
    """One net per module: hosts are cheap, but sharing keeps a module under a second."""
    require_root_netns()
    with HostNet() as net:
        yield net
