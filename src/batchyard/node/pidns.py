"""A PID namespace per attempt and machine for the rank sandbox (node/sandbox.py): ``/proc``
inside shows the job's own processes on this machine and nothing else, so no rank reaches
the server's files through ``/proc/PID/root`` of a process outside the sandbox, nor reads
another job's token in ``/proc/PID/environ``. Standard library only (``python -I -S``).

- The *keeper* (``pidns.py --keeper SOCKET [--user]``): it unshares a PID namespace (and,
  for a launcher that is not root, a user namespace owning it), forks its PID 1 (which only
  reaps orphans) and serves the namespace on a Unix socket to the launchers of the attempt
  on this machine: each holds a connection until its teardown's end (after the ranks' grace
  period and its own kills); when the last lets go, or dies, the keeper kills PID 1 and the
  kernel kills everything left in the namespace. Virtual nodes of one machine share it: a
  pid then means the same process to all of their ranks (UCX's shared memory transports,
  for one, find a peer on the same host by its pid).
- Every job process's sandbox helper joins it (:func:`join`): ``setns`` into the keeper's
  namespaces, then ``fork``; the child (in the namespace) mounts a fresh ``/proc`` in its
  private mount namespace, hides and drops as before and ``exec``s the command; the parent,
  the *forwarder* the launcher started, forwards every catchable signal to it and ends
  exactly as it did (the same code; killed by the same signal), so exit statuses, the grace
  period and the failure causes stay what they were; it is named ``by-fwd:CHILD`` (its
  child's host pid, for py-spy and OOM accounting). If it is killed, its child gets SIGKILL.

PID 1 keeps its capabilities (in the namespace's owning user namespace), so a job process,
which has none, cannot read its ``/proc/1/root`` or environment. Pids a job process sees
are the namespace's, not the host's."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from subprocess import Popen
    from typing import NoReturn

CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
FORWARDER = "by-fwd:"  # the forwarder's /proc/PID/comm, and its child's pid: no rank's own
SI_KERNEL = 0x80
# what a terminal sends its foreground process group (the rank is in it, or in its own)
_TTY_SIGNALS = {signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGWINCH,
                signal.SIGTTIN, signal.SIGTTOU}
START_TIMEOUT = 20.0
ZAP_WAIT = 5.0  # how long the keeper waits for the namespace to be empty


def _libc():  # type: ignore[no-untyped-def]
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _catchable() -> set[signal.Signals]:
    return set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


# --- the keeper (a script, started by the launcher) -----------------------------------------

def keeper(user: bool, path: str) -> int:
    """Serves the namespace at the Unix socket ``path`` to the launchers of the attempt on
    this machine (``"PID1 INODE KEEPER"``), and kills it once the last of them has let go
    (said ``bye``, or closed: died); none within START_TIMEOUT: none will come."""
    import select
    import socket
    import time

    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWPID | (CLONE_NEWUSER if user else 0)), "unshare")
    if user:  # the launcher's user owns the namespaces; ranks stay that user inside
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    alive_r, alive_w = os.pipe()  # PID 1 sees its end close when this process dies
    pid1 = os.fork()
    if pid1 == 0:
        os.close(alive_w)
        _pid1(libc, alive_r)
    os.close(alive_r)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
    except OSError:  # another launcher's keeper was first (or a dead one's socket is left)
        if _ask(path) is not None:
            os.kill(pid1, signal.SIGKILL)
            os.write(1, b"exists\n")
            return 0
        os.unlink(path)
        server.bind(path)
    server.listen(64)
    hello = f"{pid1} {os.stat(f'/proc/{pid1}/ns/pid').st_ino} {os.getpid()}\n".encode()
    os.write(1, b"ready\n")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    clients: list[socket.socket] = []  # the launchers that hold it (said "hold")
    waiting: list[socket.socket] = []  # told where it is, not holding it (yet)
    served, last = False, None
    while clients or not served:
        ready = select.select([server, *clients, *waiting], [], [],
                              None if served else START_TIMEOUT)[0]
        if not ready:
            break
        for conn in ready:
            if conn is server:
                new, _ = server.accept()
                with contextlib.suppress(OSError):
                    new.sendall(hello)
                    waiting.append(new)
                continue
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if conn in waiting:
                waiting.remove(conn)
                if data.startswith(b"hold"):
                    with contextlib.suppress(OSError):
                        conn.sendall(b"held\n")
                        clients.append(conn)
                        served = True
                else:
                    conn.close()
            elif not data or data.startswith(b"bye"):
                clients.remove(conn)
                if clients:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"more\n")
                    conn.close()
                else:
                    last = conn
    server.close()
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.kill(pid1, signal.SIGKILL)  # the kernel kills everything in the namespace
    # PID 1 ends once the namespace is empty, its zombies reaped too: those of a forwarder
    # that died first go to the host's reaper, which may never reap them (an init that
    # does not): waiting for it is bounded, and it then ends by itself whenever they go
    deadline = time.monotonic() + ZAP_WAIT
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid1, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    if last is not None:
        with contextlib.suppress(OSError):
            last.sendall(b"done\n")
    return 0


def _ask(path: str, bye: bool = False) -> bytes | None:
    """What the keeper at ``path`` says to a new launcher (None: no keeper there)."""
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(START_TIMEOUT)
    try:
        conn.connect(path)
        answer = conn.recv(128)
    except OSError:
        return None
    finally:
        conn.close()
    return answer or None


def _pid1(libc, alive: int) -> NoReturn:  # type: ignore[no-untyped-def]
    """Reaps what is orphaned in the namespace until it is killed. No signal handler: from
    inside, a namespace's PID 1 gets only the signals it handles (none: a rank cannot end
    it); the launcher's SIGKILL from outside ends it."""
    import select

    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:  # the keeper died before that: EOF
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1024)
    while True:
        signal.sigwaitinfo({signal.SIGCHLD})
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


# --- a job process: join the namespace, then forward ----------------------------------------

def join(ns: dict[str, object]) -> None:
    """Into the keeper's namespaces and fork: returns in the child (PID namespace's member,
    its parent-death signal set); the parent forwards signals and ends as the child did."""
    libc = _libc()
    path = f"/proc/{int(ns['pid'])}/ns"  # type: ignore[call-overload]
    fds = []
    try:
        if ns.get("user"):
            fds.append((os.open(f"{path}/user", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWUSER))
        fds.append((os.open(f"{path}/pid", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWPID))
        if os.fstat(fds[-1][0]).st_ino != ns["ino"]:  # the keeper died, its pid reused
            raise OSError("the job's PID namespace is gone")
        for fd, kind in fds:
            _check(libc.setns(fd, kind), "setns")
    finally:
        for fd, _ in fds:
            os.close(fd)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # (a new user ns: set it again)
    catchable = _catchable()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, catchable)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != 0:  # the forwarder (outside the namespace: 0) is gone
            raise OSError("the launcher is gone")
        return
    libc.prctl(PR_SET_NAME, f"{FORWARDER}{child}".encode(), 0, 0, 0)  # (15 bytes at most)
    forward(child, catchable, int(ns["ino"]))


def _inside(pid: int, ino: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino == ino
    except OSError:
        return False


def forward(child: int, catchable: set[signal.Signals], ino: int) -> NoReturn:
    """Every signal sent to this process goes on to ``child``, except what it got by
    itself already: a terminal's signals to its foreground group, and signals from the
    namespace's own processes (a rank's ``kill 0`` reaches this process too)."""
    while True:
        info = signal.sigwaitinfo(catchable)
        sig = info.si_signo
        if sig == signal.SIGCHLD:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                exit_as(status)
            continue
        if info.si_code == SI_KERNEL and sig in _TTY_SIGNALS:
            continue
        if info.si_pid > 0 and _inside(info.si_pid, ino):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)


def exit_as(status: int) -> NoReturn:
    """End as a process with this wait status did: its exit code, or killed by its signal
    (without a core dump of this process)."""
    if os.WIFSIGNALED(status):
        import resource

        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def run_in(pid: int, argv: list[str]) -> NoReturn:
    """``argv`` (a tool of the launcher's: py-spy) in the PID namespace of ``pid``, with that
    namespace's ``/proc``: pids and thread ids there are what the process knows of itself
    (py-spy joins a Python thread to its native stack by the thread id Python saw)."""
    libc = _libc()
    fds = []
    if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
        fds.append((os.open(f"/proc/{pid}/ns/user", os.O_RDONLY), CLONE_NEWUSER))
    fds.append((os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY), CLONE_NEWPID))
    for fd, kind in fds:
        _check(libc.setns(fd, kind), "setns")
        os.close(fd)
    child = os.fork()
    if child == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _check(libc.unshare(0x00020000), "unshare")  # CLONE_NEWNS
        _check(libc.mount(None, b"/", None, 1 << 18 | 16384, None), "mount /")  # private
        _check(libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None), "mount /proc")
        os.execvp(argv[0], argv)
    exit_as(os.waitpid(child, 0)[1])


def ns_pid(pid: int) -> int | None:
    """``pid``'s pid in its own PID namespace when that is not this process's, else None."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            nspid = next(line for line in fh if line.startswith("NSpid:")).split()[1:]
    except (OSError, StopIteration):
        return None
    return int(nspid[-1]) if len(nspid) > 1 else None


# --- the launcher's side --------------------------------------------------------------------

def forwarded(pid: int) -> int | None:
    """The host pid of the job process a forwarder stands for (its child), else None; from
    its name, still there while it is a zombie."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            name = fh.read().strip()
        return int(name[len(FORWARDER):]) if name.startswith(FORWARDER) else None
    except (OSError, ValueError):
        return None


def is_forwarder(pid: int) -> bool:
    return forwarded(pid) is not None


def socket_path(attempt_uuid: str) -> str:
    """One keeper per attempt and machine: the virtual nodes of one machine share it, so a
    rank's pid means the same process to all of them (UCX's and others' shared memory
    transports find a peer on the same host by its pid)."""
    folder = f"/tmp/by-pidns-{os.geteuid()}"
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.stat(folder).st_uid != os.geteuid() or os.stat(folder).st_mode & 0o077:
        raise OSError(f"{folder} is not this user's own")
    return f"{folder}/{attempt_uuid}"


class Keeper:
    """The attempt's PID namespace on this machine, as one node's launcher holds it."""

    def __init__(self, attempt_uuid: str, say: Callable[[str], None]) -> None:
        self.attempt, self.say = attempt_uuid, say
        self.user = os.geteuid() != 0
        self.proc: Popen[bytes] | None = None  # the keeper, when this launcher started it
        self.conn: socket.socket | None = None
        self.pid1 = self.ino = self.pid = 0

    def start(self) -> str | None:
        """None once it runs, else why it could not."""
        import socket
        import subprocess

        from batchyard.node import proctree

        path = socket_path(self.attempt)
        why = "no answer"
        for _ in range(3):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(START_TIMEOUT)
            try:
                conn.connect(path)
                hello = conn.recv(128).split()
                self.pid1, self.ino, self.pid = (int(x) for x in hello)
                conn.sendall(b"hold\n")
                if conn.recv(16) != b"held\n":  # (it was ending: a new one is started)
                    raise OSError("the keeper is ending")
            except (OSError, ValueError):
                conn.close()
            else:
                conn.settimeout(None)
                self.conn = conn
                proctree.spared.update({self.pid, self.pid1})  # stop() ends them
                return None
            argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), "--keeper", path]
            env = {"BATCHYARD_PROC_TAG": f"{self.attempt}/pidns", "PATH": os.environ.get(
                "PATH", "/usr/bin")}  # (no node's tag: no node's kills by tag end it)
            proc = subprocess.Popen(argv + (["--user"] if self.user else []), cwd="/", env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            proctree.spared.add(proc.pid)
            out = _first_line(proc)
            if out == b"ready\n":
                self.proc = proc
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
                continue  # and connect to it
            proc.kill()
            proc.wait()
            proctree.spared.discard(proc.pid)
            assert proc.stderr is not None
            why = (proc.stderr.read() or out).decode(errors="replace").strip()[-300:]
            if out != b"exists\n":  # (else another node's keeper was first: connect)
                return why or "the keeper did not start"
        return why

    def spec(self) -> dict[str, object]:
        return {"pid": self.pid1, "ino": self.ino, "user": self.user}

    def stop(self) -> None:
        """Let go; the last launcher to let go has the namespace killed (SIGKILL to PID 1:
        the kernel kills whatever is left in it) and waits until it is empty."""
        import contextlib
        import subprocess

        from batchyard.node import proctree

        conn, self.conn = self.conn, None
        answer = b""
        proctree.reap_children()  # (PID 1 ends once the namespace's zombies are reaped too)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.settimeout(15)
                conn.sendall(b"bye\n")
                answer = conn.recv(16)
            conn.close()
        if answer == b"more\n":
            self.say("sandbox: the PID namespace stays for the other nodes of this machine")
        proc, self.proc = self.proc, None
        if proc is not None and answer != b"more\n":
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        proctree.spared.difference_update({self.pid, self.pid1})


def _first_line(proc: Popen[bytes]) -> bytes:
    import select
    import time

    assert proc.stdout is not None
    line = b""
    deadline = time.monotonic() + START_TIMEOUT
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 64)
            if not chunk:
                break
            line += chunk
    return line


if __name__ == "__main__":
    if sys.argv[1:2] == ["--in"] and sys.argv[3:4] == ["--"]:
        try:
            run_in(int(sys.argv[2]), sys.argv[4:])
        except OSError as exc:
            print(f"batchyard PID namespace: {exc}", file=sys.stderr)
            sys.exit(126)
    if sys.argv[1:2] != ["--keeper"] or len(sys.argv) < 3:
        print("usage: pidns.py --keeper SOCKET [--user] | --in PID -- ARGV", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(keeper("--user" in sys.argv[3:], sys.argv[2]))
    except OSError as exc:
        print(f"batchyard PID namespace: {exc}", file=sys.stderr)
        sys.exit(126)
