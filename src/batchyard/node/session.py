"""``job exec`` on a node (standard library only: the launcher runs under ``python -S``).

The server cannot reach a node, so the node opens the way: an exec session arrives in the
attempt's control (``sessions``), the launcher runs its command in the job's context (env,
work dir, container) in a pty or on pipes, and relays bytes over two node-channel long polls:
output chunks with a sequence number up (``POST .../sessions/ID/out``, resent until taken),
input, window sizes and the client's end down (``GET .../sessions/ID/in?after=SEQ``).

A failed gang whose job asks for ``limits.keep_alive_on_failure`` stays here (its ranks
killed, its container kept) serving sessions until the server releases it or the time is up."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from batchyard.node import proctree
from batchyard.node.channel import ChannelError

if TYPE_CHECKING:
    from batchyard.node.channel import Channel
    from batchyard.node.launcher import Launcher

READ = 1 << 16
TICK = 0.05
POST_DEADLINE = 60.0
NO_KEEP = ("succeeded", "canceled", "preempted")
DEFAULT_SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -i; "
                 "else exec sh -i; fi"]


def set_winsize(fd: int, rows: int, cols: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _controlling_tty() -> None:
    """preexec_fn (after setsid): the pty on fd 0 becomes the session's terminal, so the
    shell gets job control, SIGINT from Ctrl-C and SIGWINCH."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    proctree.die_with_parent()


class Process:
    """One command of a session: in a pty (``tty``: one output stream, raw bytes) or on
    pipes (stdout and stderr apart). Started by the thread that waits for it: a rank's
    parent-death signal fires when that thread ends."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, tty: bool,
                 rows: int = 24, cols: int = 80) -> None:
        self.tty = tty
        self.claimed: int | None = None  # a wait status another reaper collected for us
        self.code: int | None = None
        self._lost = 0  # looks at a pid another reaper took without handing its status on
        if tty:
            master, slave = os.openpty()
            set_winsize(slave, rows, cols)
            try:
                self.proc = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                    start_new_session=True, preexec_fn=_controlling_tty)
            except OSError:
                os.close(master)
                raise
            finally:
                os.close(slave)
            self.stdin: int | None = master
            self.outs = {master: "o"}
        else:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=proctree.die_with_parent)
            assert self.proc.stdin and self.proc.stdout and self.proc.stderr
            self.stdin = self.proc.stdin.fileno()
            self.outs = {self.proc.stdout.fileno(): "o", self.proc.stderr.fileno(): "e"}
        self.pid = self.proc.pid

    def write(self, data: bytes) -> None:
        if self.stdin is None:
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.stdin, view):]
            except OSError:
                return

    def resize(self, rows: int, cols: int) -> None:
        if self.tty and self.stdin is not None:
            set_winsize(self.stdin, rows, cols)

    def end_input(self) -> None:
        """The client's stdin ended: pipes close; a terminal gets its EOF character."""
        if self.tty:
            self.write(b"\x04")
        elif self.proc.stdin is not None and self.stdin is not None:
            self.stdin = None
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def chunks(self) -> Iterator[dict[str, bytes]]:
        """What the command wrote, as it comes (whatever is there at each read), until its
        streams end and it has exited."""
        open_fds = list(self.outs)
        while open_fds:
            ready, _, _ = select.select(open_fds, [], [], TICK * 4)
            got: dict[str, bytes] = {}
            for fd in ready:
                try:
                    data = os.read(fd, READ)
                except OSError:  # EIO: the pty's other side has closed
                    data = b""
                if data:
                    got[self.outs[fd]] = got.get(self.outs[fd], b"") + data
                else:
                    open_fds.remove(fd)
            if got:
                yield got
            elif not ready and self.exited() is not None:
                break  # exited; a leftover child holds the terminal: stop reading
        for fd in self.outs:
            if self.tty:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def exited(self) -> int | None:
        if self.code is not None:
            return self.code
        status = self.claimed
        if status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                status = self.claimed
                if status is None:
                    if os.path.exists(f"/proc/{self.pid}"):
                        return None  # (being reaped by the launcher's loop: claimed next)
                    self._lost += 1
                    if self._lost < 20:
                        return None
                    status = int(signal.SIGKILL)  # a teardown reaped it: killed
            else:
                if pid == 0:
                    return None
        self.code = proctree.exit_code(status)
        self.proc.returncode = self.code  # (a collected Popen must not wait for it again)
        return self.code

    def wait(self) -> int:
        while True:
            code = self.exited()
            if code is not None:
                return code
            time.sleep(TICK)

    def kill(self) -> None:
        """The whole session (the shell and what it started), as its own process group."""
        for sig in (signal.SIGHUP, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(self.pid, sig)
            if sig == signal.SIGHUP:
                deadline = time.time() + 1.0
                while time.time() < deadline and self.exited() is None:
                    time.sleep(TICK)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode())


class Relay(threading.Thread):
    """One session on this node: start, output up, input down, exit code last."""

    def __init__(self, channel: Channel, request: dict[str, Any],
                 start: Callable[[dict[str, Any]], Process],
                 on_start: Callable[[Process], None]) -> None:
        super().__init__(name=f"exec-{request['id']}", daemon=True)
        self.channel = channel
        self.request = request
        self.sid = str(request["id"])
        self._start = start
        self._on_start = on_start
        self.proc: Process | None = None
        self.gone = threading.Event()  # the server or the client has let go
        self._seq = 0

    def _post(self, body: dict[str, Any]) -> bool:
        self._seq += 1
        body["seq"] = self._seq
        try:
            self.channel.retrying("POST", f"/sessions/{self.sid}/out", body,
                                  deadline=time.time() + POST_DEADLINE, timeout=30.0)
        except ChannelError:
            self.gone.set()  # the session is over on the server (its client went away)
            return False
        except (OSError, ValueError):
            self.gone.set()
            return False
        return True

    def run(self) -> None:
        try:
            proc = self._start(self.request)
        except Exception as exc:  # (a missing command, a bad cwd, no container any more)
            self._post({"error": f"could not start {self.request.get('argv')}: {exc}",
                        "exit_code": 127})
            return
        self.proc = proc
        self._on_start(proc)
        feeder = threading.Thread(target=self._feed, name=f"exec-in-{self.sid}", daemon=True)
        feeder.start()
        self._post({"started": True, "pid": proc.pid})
        for got in proc.chunks():
            if not self._post({k: b64(v) for k, v in got.items()}):
                proc.kill()
                break
        code = proc.wait()
        if not self.gone.is_set():
            self._post({"exit_code": code})
        self.gone.set()

    def _feed(self) -> None:
        after = 0
        delay = 0.2
        while not self.gone.is_set():
            try:
                reply = self.channel.call("GET", f"/sessions/{self.sid}/in?after={after}"
                                          "&wait=20", timeout=30.0)
            except ChannelError:
                break
            except (OSError, ValueError):
                if self.gone.wait(delay):
                    return
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.2
            proc = self.proc
            assert proc is not None
            for item in reply.get("items") or []:
                after = max(after, int(item["seq"]))
                if "data" in item:
                    proc.write(unb64(item["data"]))
                elif "resize" in item:
                    proc.resize(int(item["resize"][0]), int(item["resize"][1]))
                elif item.get("eof"):
                    proc.end_input()
            if reply.get("closed"):
                break
        if self.proc is not None and self.proc.exited() is None:
            self.proc.kill()  # the client went away: nobody is there to end the shell


class AgentChannel:
    """What a Relay needs of a node channel, over an agent's own calls (``cluster node exec
    -it`` on a machine: no launcher there, the agent runs the session)."""

    def __init__(self, call: Callable[..., tuple[int, dict[str, Any]]], base: str) -> None:
        self._call = call  # (method, path, body, timeout) -> (status, reply)
        self.base = base

    def call(self, method: str, path: str, body: Any = None, *,
             timeout: float = 30.0) -> Any:
        status, reply = self._call(method, self.base + path, body, timeout)
        if status >= 500 or status == 429:
            raise OSError(f"server error {status}")
        if status >= 400:
            raise ChannelError(status, str((reply.get("error") or {}).get("message")))
        return reply

    def retrying(self, method: str, path: str, body: Any = None, *, deadline: float,
                 timeout: float = 30.0) -> Any:
        delay = 0.05
        while True:
            try:
                return self.call(method, path, body, timeout=timeout)
            except OSError:
                if time.time() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 1.6, 2.0)


def on_machine(call: Callable[..., tuple[int, dict[str, Any]]], base: str,
               request: dict[str, Any], node_name: str, work_dir: str) -> int:
    """One session an agent was asked for, in its node's directory as ``cluster node exec``
    runs commands there; its exit code once it has ended."""
    from batchyard.node.env import merged_environ

    def start(req: dict[str, Any]) -> Process:
        env = merged_environ({"BATCHYARD_NODE_NAME": node_name, "BATCHYARD_NODE_DIR": work_dir,
                              "TERM": str(req.get("term") or "xterm")})
        argv = [str(a) for a in req.get("argv") or []] or list(DEFAULT_SHELL)
        return Process(argv, env, work_dir, bool(req.get("tty")), int(req.get("rows") or 24),
                       int(req.get("cols") or 80))

    relay = Relay(AgentChannel(call, base), request, start, lambda _p: None)  # type: ignore[arg-type]
    relay.run()  # on the caller's thread: it waits for the command (parent-death signal)
    return relay.proc.code if relay.proc is not None and relay.proc.code is not None else 127


def boxed(argv: list[str], tty: bool) -> list[str]:
    """``docker exec`` as the launcher builds it, made interactive: ``-i`` (and ``-t``)."""
    at = argv.index("exec") + 1
    return [*argv[:at], "-i", *(["-t"] if tty else []), *argv[at:]]


class Sessions:
    """The launcher's exec sessions: started from its control, claimed from its reaper,
    ended with it."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self._seen: set[str] = set()
        self._live: dict[int, Process] = {}
        self._early: dict[int, int] = {}
        self._lock = threading.Lock()
        self.released = threading.Event()

    def control(self, control: dict[str, Any]) -> None:
        if control.get("release"):
            self.released.set()
        channel = self.launcher.channel
        mine = (control.get("sessions") or {}).get(str(self.launcher.plan.node_rank)) or []
        for request in mine:
            with self._lock:
                if channel is None or request.get("id") in self._seen:
                    continue
                self._seen.add(str(request["id"]))
            try:
                Relay(channel, request, self._start, self._register).start()
            except Exception as exc:  # never the channel's control thread's end
                self.launcher.say(f"exec session {request.get('id')} failed to start: {exc}")

    def _register(self, proc: Process) -> None:
        with self._lock:
            self._live[proc.pid] = proc
            early = self._early.pop(proc.pid, None)
        if early is not None and proc.claimed is None:
            proc.claimed = early

    def claim(self, pid: int, status: int) -> bool:
        """The launcher's reaper collected ``pid``: if it is a session's, keep its status
        (one that ended before its session knew its pid is kept for it too)."""
        with self._lock:
            proc = self._live.get(pid)
            if proc is None:
                self._early[pid] = status
                while len(self._early) > 256:
                    self._early.pop(next(iter(self._early)))
                return False
        proc.claimed = status
        return True

    def _start(self, request: dict[str, Any]) -> Process:
        from pathlib import Path

        from batchyard.node.env import merged_environ, node_dirs, node_env

        launcher = self.launcher
        plan = launcher.plan
        dirs = node_dirs(plan)
        env = dict(launcher.base_env or node_env(plan, dirs))
        world = str(plan.world_size)
        env.update({"WORLD_SIZE": world, "BATCHYARD_WORLD_SIZE": world, "ROLE_WORLD_SIZE": world,
                    "BATCHYARD_EXEC_SESSION": str(request["id"])})
        tty = bool(request.get("tty"))
        if tty:
            env["TERM"] = str(request.get("term") or "xterm")
        argv = [str(a) for a in request.get("argv") or []] or list(DEFAULT_SHELL)
        cwd = dirs.workdir if dirs.workdir.is_dir() else Path(plan.node_dir)
        if launcher.box is not None:
            argv = boxed(launcher.boxed_argv(argv, env, cwd), tty)
        elif launcher.sandbox is not None:  # node/sandbox.py
            argv = launcher.sandbox.wrap(argv)
        rows, cols = request.get("rows") or 24, request.get("cols") or 80
        return Process(argv, merged_environ(env), str(cwd), tty, int(rows), int(cols))

    def close(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for proc in live:
            if proc.exited() is None:
                proc.kill()


def keep_alive(launcher: Launcher, state: str, extra: dict[str, Any]) -> None:
    """A failed gang's node stays for ``limits.keep_alive_on_failure``: its final state is
    reported first (the job fails at once, with its cause), then sessions are served until
    the server releases the node (the time is up, ``job terminate``, a retry) or the time is
    up here. Its ranks are already gone; its container stays."""
    plan = launcher.plan
    seconds = plan.keep_alive_on_failure
    if not seconds or state in NO_KEEP or launcher.channel is None \
            or launcher.stop_signal is not None:
        return
    try:
        _hold(launcher, state, extra, float(seconds))
    except Exception as exc:  # never in the way of the teardown that follows
        launcher.say(f"keep-alive ended by an error: {exc}")
    launcher.sessions.close()
    proctree.kill_everything(plan.tag, (), grace=0.0, reap=True)


def _hold(launcher: Launcher, state: str, extra: dict[str, Any], seconds: float) -> None:
    until = time.time() + seconds
    clock = time.strftime("%H:%M:%S", time.localtime(until))
    launcher.say(f"keeping this node for job exec until {clock} ({seconds:g}s, "
                 "limits.keep_alive_on_failure)")
    launcher.write_status(state=state, ended_at=time.time(), held_until=until, **extra)
    while time.time() < until and launcher.stop_signal is None:
        if launcher.sessions.released.wait(min(1.0, max(0.0, until - time.time()))):
            break
    launcher.say("released: ending the sessions left")
