"""The multi-host harness itself, with real namespaces: if these fail, every multi-host product
test would fail for reasons that have nothing to do with the product."""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostkit import Host, HostNet, hostnet, require_root_netns

__all__ = ["hostnet"]  # the imported fixture: pytest finds it by name in this module
pytestmark = pytest.mark.timeout(60)

PY = sys.executable
PORT = 7070
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
    c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
print(c.recv(100).decode())
"""
# No ping(8) on this machine: a raw-socket ICMP echo is the same thing on the wire.
PING = r"""
import socket, struct, sys
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
body = struct.pack("!HH", 0x4B48, 1) + b"hostkit!"
pkt = struct.pack("!BBH", 8, 0, csum(b"\x08\x00\x00\x00" + body)) + body
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(2)
s.sendto(pkt, (sys.argv[1], 0))
while True:
    data, src = s.recvfrom(2048)
    icmp = data[(data[0] & 0xF) * 4:]
    if src[0] == sys.argv[1] and icmp[0] == 0 and icmp[4:6] == b"\x4b\x48":
        print("pong")
        break
"""


@pytest.fixture(scope="module")
def secret_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("server-home")
    (d / "token").write_text("s3cret")
    return d


@pytest.fixture(scope="module")
def pair(hostnet: HostNet, secret_dir: Path) -> tuple[Host, Host]:
    return hostnet.add_host("alpha"), hostnet.add_host("beta", hide=[secret_dir])


def serve(host: Host) -> subprocess.Popen[str]:
    proc = host.popen([PY, "-c", SERVER, host.addr, str(PORT)], stdout=subprocess.PIPE,
                      text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready and proc.stdout.readline().strip() == "ready"
    return proc


def running(pids: list[int]) -> list[int]:
    """Pids that still run. By pid, not netns inode: the kernel hands a freed nsfs inode number
    to the next namespace at once, so a concurrent run would look like a survivor."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(pid)
    return found


def connect(src: Host, dst: Host, timeout: float = 2) -> subprocess.CompletedProcess[str]:
    return src.run([PY, "-c", CLIENT, dst.addr, str(PORT), str(timeout)], timeout=10)


@pytest.mark.parametrize("direction", ["ab", "ba"])
def test_ping_and_tcp_between_hosts(pair: tuple[Host, Host], direction: str) -> None:
    src, dst = pair if direction == "ab" else pair[::-1]
    assert src.run([PY, "-c", PING, dst.addr], timeout=10).stdout.strip() == "pong"
    server = serve(dst)
    try:
        res = connect(src, dst)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == dst.name
    finally:
        server.kill()
        server.wait()


def test_hostname_and_etc_hosts(hostnet: HostNet, pair: tuple[Host, Host]) -> None:
    alpha, beta = pair
    for h in pair:
        assert h.run(["hostname"], check=True).stdout.strip() == h.name
        # The Debian quirk the product must survive: a host's own name is loopback.
        assert h.run(["getent", "hosts", h.name]).stdout.split()[0] == "127.0.1.1"
    assert beta.run(["getent", "hosts", "alpha"]).stdout.split()[0] == alpha.addr
    # A host created later is added to the /etc/hosts of those created before it.
    gamma = hostnet.add_host("gamma")
    assert alpha.run(["getent", "hosts", "gamma"]).stdout.split()[0] == gamma.addr
    assert gamma.run(["getent", "hosts", "beta"]).stdout.split()[0] == beta.addr


def test_env_and_venv_inside_host(pair: tuple[Host, Host], tmp_path: Path) -> None:
    env = dict(os.environ, HOSTKIT_PROBE="42")
    code = "import os, pytest, socket; print(os.environ['HOSTKIT_PROBE'], socket.gethostname())"
    res = pair[0].run([PY, "-c", code], env=env, cwd=tmp_path, check=True)
    assert res.stdout.split() == ["42", "alpha"]
    assert pair[0].run(["pwd"]).stdout.strip() == os.getcwd()  # nsenter would reset it to /
    assert pair[0].run(["pwd"], cwd=tmp_path).stdout.strip() == str(tmp_path)
    # nsenter keeps the root's /sys, so cgroup-based process tracking still works in a host.
    assert pair[0].run(["ls", "/sys/fs/cgroup"]).stdout == os.popen("ls /sys/fs/cgroup").read()


def test_work_dir_is_private(pair: tuple[Host, Host]) -> None:
    alpha, beta = pair
    f = alpha.work_dir / "only-on-alpha"
    alpha.run(["sh", "-c", f"echo hi > {f}"], check=True)
    assert alpha.read_file("only-on-alpha") == b"hi\n"
    assert beta.run(["test", "-e", str(f)]).returncode == 1
    assert not f.exists()  # not in the root mount namespace either
    with pytest.raises(FileNotFoundError):
        beta.read_file(f)


def test_hidden_path_is_empty(pair: tuple[Host, Host], secret_dir: Path) -> None:
    alpha, beta = pair
    assert beta.run(["ls", "-A", str(secret_dir)], check=True).stdout == ""
    assert alpha.read_file(secret_dir / "token") == b"s3cret"
    assert (secret_dir / "token").read_text() == "s3cret"


def test_link_down_partitions_and_link_up_heals(pair: tuple[Host, Host]) -> None:
    alpha, beta = pair
    server = serve(alpha)
    try:
        alpha.link_down()
        t0 = time.monotonic()
        res = connect(beta, alpha, timeout=1)
        assert res.returncode != 0
        assert re.search(r"timed out|unreachable", res.stderr, re.I), res.stderr
        assert time.monotonic() - t0 < 5
        alpha.link_up()
        res = connect(beta, alpha, timeout=5)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "alpha"
    finally:
        alpha.link_up()
        server.kill()
        server.wait()


def test_kill_all_leaves_no_pid(hostnet: HostNet) -> None:
    h = hostnet.add_host("doomed")
    leader = h.popen(["sleep", "300"])
    # A daemonised grandchild that the test process has no handle on.
    h.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"], check=True)
    assert len(h.pids()) >= 2
    h.kill_all()
    assert h.pids() == []
    assert leader.returncode is not None


def test_close_leaves_nothing_behind(secret_dir: Path) -> None:
    require_root_netns()

    def snapshot() -> tuple[set[str], str, set[str]]:
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return ({ln.split(":")[1].strip() for ln in links.splitlines()}, netns,
                set(Path("/proc/mounts").read_text().splitlines()))

    links0, netns0, mounts0 = snapshot()
    net = HostNet()
    work = Path(f"/var/lib/batchyard-hostkit-{os.getpid()}/a")  # unique: runs may be parallel
    a = net.add_host("a", work_dir=str(work))
    with pytest.raises(ValueError):
        net.add_host("a")
    with pytest.raises(ValueError):
        net.add_host("c", work_dir=str(secret_dir / "token"))
    b = net.add_host("b", hide=[secret_dir])
    procs = [h.popen(["sleep", "300"]) for h in (a, b)]
    b.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"], check=True)
    # A failure half-way through add_host (here: the bridge is gone) must not leak either.
    net.bridge_ip(f"link del {net.bridge}")
    with pytest.raises(RuntimeError, match="master"):
        net.add_host("broken")
    assert not list(net.dir.glob("broken.*"))
    pids = a.pids() + b.pids()
    assert len(pids) >= 3
    run_dir = net.dir
    net.close()
    net.close()  # idempotent

    links1, netns1, mounts1 = snapshot()
    assert links1 - links0 == set()
    assert netns1 == netns0
    # Ignore concurrent runs' mounts: only ours must be gone.
    assert {m for m in mounts1 - mounts0 if "/batchyard-hostkit/" not in m} == set()
    assert not any(str(run_dir) in m for m in mounts1)
    assert not run_dir.exists()
    assert not work.parent.exists()
    assert all(p.returncode is not None for p in procs)
    assert running(pids) == []
    with pytest.raises(RuntimeError):
        net.add_host("late")


def test_shared_mount_point_outlives_the_run_that_made_it() -> None:
    """Two runs, one new work_dir: the first run out must not rmdir it under the second, which
    would silently detach the second run's tmpfs."""
    require_root_netns()
    work = Path(f"/var/lib/batchyard-hostkit-{os.getpid()}")  # unique: runs may be parallel
    first, second = HostNet(), HostNet()
    try:
        first.add_host("one", work_dir=str(work))
        two = second.add_host("two", work_dir=str(work))
        first.close()
        assert work.is_dir()
        assert two.run(["stat", "-f", "-c", "%T", str(work)]).stdout.strip() == "tmpfs"
    finally:
        first.close()
        second.close()
    assert not work.exists()


ABORTED_RUN = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from hostkit import HostNet
net = HostNet()
h = net.add_host("orphan")
h.popen(["sleep", "300"])
print(net.dir, *h.pids(), flush=True)
time.sleep(300)
"""


def test_next_run_reaps_an_aborted_run() -> None:
    """A SIGKILLed test run has no atexit; the next HostNet must clean up after it."""
    require_root_netns()
    tests_dir = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([PY, "-c", ABORTED_RUN, tests_dir], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_dir, *pids = proc.stdout.readline().split()
    finally:
        proc.kill()  # the abort, and also what stops a failed test from leaking an orphan net
        proc.wait()
    assert pids
    # The abort left it behind (unless a concurrent run has already reaped it).
    assert Path(run_dir).exists() or not running([int(p) for p in pids])
    with HostNet() as net:
        assert not Path(run_dir).exists()
        assert not any(run_dir in m for m in Path("/proc/mounts").read_text().splitlines())
        assert net.subnet
    assert running([int(p) for p in pids]) == []
