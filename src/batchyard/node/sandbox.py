"""The rank sandbox: a job's code sees only its own directories, never the server's token,
database, TLS keys, log copies, the node's tickets and credentials, or other jobs' files;
it can write nothing but its own directories; and on a bare node it is not root.

Every job process the launcher starts on the host (the preparation command, the ranks, the
MPI daemons the relay starts, ``job exec`` sessions) is started through this file, run as a
script (``python -I -S sandbox.py SPEC -- ARGV``; standard library only). It joins the job's
cgroup (its ``pids.max``, node/cgroups.py), its PID namespace, enters a private mount
namespace where it makes the job's view (node/mountview.py: everything read-only but the
job's own folders, a private ``/tmp`` and ``/dev/shm``, the hidden folders empty), drops to
the job's uid (node/jobuser.py: one unprivileged uid per submitting user; uid 0 without any
capability only on a cluster created with ``--allow-root-jobs``) and then ``exec``s the
command (``bwrap``'s monitor, by contrast, dies on SIGTERM at once and leaves the rank
without its grace period). What the view holds is decided by the launcher (node/jobview.py).

Each attempt has a PID namespace of its own on each machine (node/pidns.py): this file, run
for a job process, joins it and forks; the child mounts that namespace's ``/proc``, so no
process outside the job's on this machine is there to reach (``/proc/PID/root`` of a shell or
the server, ``/proc/PID/environ`` of another job's ranks); the parent forwards signals and
ends as the child did. The network namespace is shared (MPI, gloo and NCCL keep working;
the process tags, py-spy and cgroup OOM accounting work from the host's pids). Besides:

- the launcher is non-dumpable, and every job process has ``no_new_privs``; a launcher that
  is not root runs its jobs as itself in a user namespace of its own.
- where no PID namespace can be made, job processes share the node's (the launcher's log
  says so).

Where namespaces cannot be made, ``bwrap`` (a setuid install) is tried; where neither works
the job runs unsandboxed and its launcher log says so. ``BATCHYARD_SANDBOX=off`` (the node's
operator) turns it off; ``BATCHYARD_PIDNS=off`` the PID namespace alone.

The MPI relay's execs (the orteds the ranks wait for) are started by this sandbox's fork
server (node/spawner.py), which runs this file's ``run`` in a fork of a process that has
imported it already; ``BATCHYARD_SPAWNER=off`` starts them as the rest, one ``python -I -S``
each.
"""

from __future__ import annotations

import json
import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from batchyard.node.env import NodeDirs
    from batchyard.node.pidns import Keeper
    from batchyard.node.plan import NodePlan
    from batchyard.node.spawner import Spawner

HIDE_ENV = "BATCHYARD_SANDBOX_HIDE"  # extra hidden roots, os.pathsep-separated (the backend's)
MODE_ENV = "BATCHYARD_SANDBOX"  # auto (default) | off
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


# --- inside: run as a script between the launcher and the job's command ---------------------

def _fail(libc_call: str) -> None:
    import ctypes

    errno = ctypes.get_errno()
    raise OSError(errno, f"{libc_call}: {os.strerror(errno)}")


def enter(spec: dict[str, object]) -> None:
    """Make this process's view of the file system the job's (node/mountview.py), and drop
    to its uid. In the job's PID namespace (node/pidns.py, joined already): a ``/proc`` of
    that namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    joined = bool(spec.get("pidns"))  # (in the keeper's user namespace too, when not root)
    uid, gid, cwd, parent = os.getuid(), os.getgid(), os.getcwd(), os.getppid()
    if libc.unshare(CLONE_NEWNS | (0 if root or joined else CLONE_NEWUSER)) != 0:
        _fail("unshare")
    if not root and not joined:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    _sibling("mountview").enter({**spec, "proc": joined})
    job_uid = spec.get("uid")
    if spec.get("home"):
        os.environ["HOME"] = str(spec["home"])
    if root and isinstance(job_uid, int):
        os.setgroups([])
        os.setresgid(job_uid, job_uid, job_uid)
        os.setresuid(job_uid, job_uid, job_uid)  # takes every capability away too
        if spec.get("account"):
            os.environ["USER"] = os.environ["LOGNAME"] = str(spec["account"])
    elif root:
        # root stays uid 0 but loses every capability at exec (an empty bounding set): it
        # can neither unmount the tmpfs nor mount anything, nor pass file permissions
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        with open("/proc/self/status") as fh:
            if "CapBnd:\t0000000000000000" not in fh.read():
                raise OSError("could not drop the capability bounding set")
    # the launcher's death signal does not survive a change of uid: set it again
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != parent:
        raise OSError("the launcher is gone")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("prctl(no_new_privs)")
    try:
        os.chdir(cwd)  # the same path, now the bound directory
    except OSError:
        os.chdir("/")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: sandbox.py SPEC -- COMMAND...", file=sys.stderr)
        return 2
    try:
        spec = json.loads(argv[0])
    except ValueError as exc:
        print(f"batchyard sandbox: {exc}", file=sys.stderr)
        return 126
    return run(spec, argv[2:])


def run(spec: dict[str, object], command: list[str]) -> int:
    """Into the sandbox ``spec`` describes, then ``exec`` the command (node/spawner.py calls
    this in a fork of its own). Returns only when that failed: the exit code to end with."""
    try:
        if spec.get("cgroup"):  # the job's pids.max (node/cgroups.py), before anything forks
            fd = os.open(str(spec["cgroup"]), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if spec.get("pidns"):
            _sibling("pidns").join(spec["pidns"])  # returns in the namespace; its parent forwards
        enter(spec)
    except (OSError, ValueError, KeyError) as exc:
        print(f"batchyard sandbox: {exc}", file=sys.stderr)
        return 126
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as the launcher's Popen left them
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


def _sibling(name: str):  # type: ignore[no-untyped-def]
    """node/pidns.py or node/mountview.py, also from this file run as a script (its folder
    not on sys.path)."""
    import importlib

    if __package__:
        return importlib.import_module(f"batchyard.node.{name}")
    folder = os.path.dirname(os.path.abspath(__file__))
    if folder not in sys.path:
        sys.path.append(folder)
    return importlib.import_module(name)


# --- outside: what the launcher uses --------------------------------------------------------

def protect_process() -> None:
    """The launcher (and the agent) non-dumpable: a process of the same user without
    CAP_SYS_PTRACE (a rank in its user namespace) cannot read its /proc/PID/environ, fds,
    memory or root."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class Sandbox:
    """One node's sandbox for one attempt: the job's view (node/jobview.py), its PID
    namespace, its cgroup, and how its processes get in."""

    def __init__(self, plan: NodePlan, dirs: NodeDirs, say: Callable[[str], None],
                 extra_rw: Iterable[Path] = ()) -> None:
        from batchyard.node.cgroups import JobCgroup
        from batchyard.node.jobview import JobView

        self.say = say
        self.mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
        self.view = JobView(plan, dirs, list(extra_rw))
        self.readonly = True  # everything but the job's own folders (node/mountview.py)
        self.attempt = plan.attempt_uuid
        self.keeper: Keeper | None = None  # the attempt's PID namespace here (node/pidns.py)
        self.cgroup = JobCgroup(plan.tag, int(plan.max_pids or 4096))
        self._how: str | None = None
        self.tag = plan.tag
        self.spawner: Spawner | None = None  # this sandbox's fork server (node/spawner.py)

    @property
    def uid(self) -> int | None:
        return self.view.uid

    def spec(self) -> dict[str, object]:
        return {**self.view.spec(), "readonly": self.readonly,
                "cgroup": self.cgroup.procs if os.geteuid() == 0 else None,
                "pidns": self.keeper.spec() if self.keeper is not None else None}

    def how(self) -> str:
        """``ns`` (this file), ``bwrap`` or ``none``: found out once, by trying."""
        if self._how is None:
            self._how = self._probe()
        return self._how

    def _probe(self) -> str:
        import shutil

        if self.mode == "off":
            self.say("sandbox: off (BATCHYARD_SANDBOX=off): job processes see the whole "
                     "file system of this node, the server's files included")
            return "none"
        self.own_dirs()
        tried = []
        for how in ("ns", "bwrap"):
            if how == "bwrap" and not shutil.which("bwrap"):
                continue
            if how == "ns":
                self._own_pidns()
            done = self._try(how)
            if done.returncode != 0 and how == "ns" and "Function not implemented" in (
                    done.stderr or ""):
                self.readonly = False  # a kernel before 5.12: no mount_setattr
                self.say("WARNING: this kernel cannot make the job's view read-only "
                         f"({(done.stderr or '').strip()[-200:]}): only hidden folders stay "
                         "out of reach")
                done = self._try(how)
            if done.returncode != 0 and self.keeper is not None:
                self._no_pidns(f"joining it failed: {(done.stderr or '').strip()[-300:]}")
                done = self._try(how)
            if done.returncode == 0:
                if how == "bwrap":
                    self.view.uid = None  # bwrap cannot drop to another uid by itself
                self.say(f"sandbox ({how}, {self.view.described()})")
                if self.keeper is not None:
                    self.say("sandbox: a PID namespace of this attempt's own on this machine "
                             f"(its PID 1 is pid {self.keeper.pid1}): /proc shows the job's "
                             "processes only")
                elif self.uid is None:
                    self.say("WARNING: sandbox without a PID namespace: other processes of "
                             "this user outside the sandbox remain reachable through /proc")
                return how
            tried.append(f"{how}: {(done.stderr or '').strip()[-300:]}")
        self.say("WARNING: no sandbox could be made on this node (" + "; ".join(tried) +
                 "): job processes run unsandboxed and can read the server's files")
        return "none"

    def _try(self, how: str) -> subprocess.CompletedProcess[str]:
        import subprocess

        return subprocess.run(self._wrap(how, ["true"]), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, check=False)

    def _own_pidns(self) -> None:
        """Start the keeper of the job's PID namespace, or say why it cannot be."""
        from batchyard.node.pidns import Keeper

        keeper = Keeper(self.attempt, self.say)
        try:
            why = "BATCHYARD_PIDNS=off" if os.environ.get("BATCHYARD_PIDNS") == "off" \
                else keeper.start()
        except OSError as exc:
            why = str(exc)
        if why is None:
            self.keeper = keeper
        else:
            self._no_pidns(why)

    def _no_pidns(self, why: str) -> None:
        self.say(f"sandbox: no PID namespace could be made ({why}): job processes share "
                 "this node's, as without one")
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None

    def start_spawner(self) -> None:
        """A fork server for job processes (node/spawner.py): each then starts in a fork of
        a process that has made ready already, not a Python start-up of its own. Only for
        this file's own sandbox, and only in a launcher that is a child subreaper (the
        processes it forks are adopted by it)."""
        if self.how() != "ns" or self.spawner is not None:
            return
        if os.environ.get("BATCHYARD_SPAWNER") == "off":  # (the node's operator)
            return
        from batchyard.node.spawner import Spawner

        try:
            self.spawner = Spawner(self.tag)
        except OSError as exc:
            self.say(f"sandbox: no fork server ({exc}): job processes start the slower way")

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path,
              err: Path) -> int | None:
        """``argv`` started in the sandbox by the fork server, stdout and stderr appended to
        ``out`` and ``err``: its pid (the launcher's child, as from Popen), or None where
        there is no fork server (any more): the caller starts it with :meth:`wrap`."""
        if self.spawner is None:
            return None
        with open(out, "ab") as stdout, open(err, "ab") as stderr:
            try:
                return self.spawner.spawn(argv, env, str(cwd), stdout.fileno(),
                                          stderr.fileno(), self.spec())
            except OSError as exc:
                self.say(f"sandbox: the fork server failed ({exc}): job processes start "
                         "the slower way")
                self.spawner.close()
                self.spawner = None
                return None

    def close(self) -> None:
        """Last in the launcher's teardown: whatever is still in the PID namespace dies,
        then its cgroup, its /tmp and /dev/shm go."""
        if self.spawner is not None:
            self.spawner.close()
            self.spawner = None
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None
        self.cgroup.remove()
        self.view.close()

    def own_dirs(self) -> None:
        """The job's folders made and given to its uid, its cgroup made (as root)."""
        self.view.settle()
        if os.geteuid() != 0:
            self.say("WARNING: no pids limit per job (the launcher is not root: it cannot make "
                     "cgroups)")
            return
        why = self.cgroup.create()
        if why is None:
            self.say(f"sandbox: at most {self.cgroup.limit} processes per job on this node "
                     f"(pids.max of cgroup {self.cgroup.path})")
        else:
            self.say(f"WARNING: no pids limit per job on this node ({why})")

    def give(self, path: Path) -> None:
        """A directory the launcher made for the job's processes (Open MPI's session dir)."""
        self.view.give(path)

    def wrap(self, argv: list[str]) -> list[str]:
        return self._wrap(self.how(), argv)

    def _wrap(self, how: str, argv: list[str]) -> list[str]:
        if how == "ns":
            return [sys.executable, "-I", "-S", os.path.abspath(__file__),
                    json.dumps(self.spec()), "--", *argv]
        if how == "bwrap":
            out = ["bwrap", "--dev-bind", "/", "/", "--die-with-parent"]
            for hidden in self.view.hide:
                out += ["--tmpfs", hidden]
            for path, mode in self.view.binds:
                out += ["--bind-try" if mode == "rw" else "--ro-bind-try", path, path]
            return [*out, "--", *argv]
        return argv


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
