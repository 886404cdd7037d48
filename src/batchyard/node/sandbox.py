"""The rank sandbox: a job's code sees only its own directories, never the server's token,
database, TLS keys, log copies, the node's tickets and credentials, or other jobs' files.

Every job process the launcher starts on the host (the preparation command, the ranks, the
MPI daemons the relay starts, ``job exec`` sessions) is started through this file, run as a
script (``python -I -S sandbox.py SPEC -- ARGV``; standard library only). It enters a private
mount namespace, mounts an empty tmpfs over each *hidden root* (the server's home and data
root, the node's work dir: everything that holds secrets, databases, tickets or other jobs),
binds this attempt's own directories back at the same paths (job dir, attempt dir,
checkpoints, mounts, stdouterr, outputs, inputs, the metrics spool; the CA file and the
interpreter read-only) and then ``exec``s the command (``bwrap``'s monitor, by contrast,
dies on SIGTERM at once and leaves the rank without its grace period).

Each attempt has a PID namespace of its own on each machine (node/pidns.py): this file, run
for a job process, joins it and forks; the child mounts that namespace's ``/proc``, so no
process outside the job's on this machine is there to reach (``/proc/PID/root`` of a shell or
the server, ``/proc/PID/environ`` of another job's ranks); the parent forwards signals and
ends as the child did. The network namespace is shared (MPI, gloo and NCCL keep working;
the process tags, py-spy and cgroup OOM accounting work from the host's pids). Besides:

- the launcher is non-dumpable, and every job process has ``no_new_privs`` and, as root, no
  capability; a launcher that is not root runs its jobs in a user namespace of its own.
- where no PID namespace can be made, job processes share the node's (the launcher's log
  says so) and other dumpable processes of the same user stay reachable through ``/proc``.
  ``BATCHYARD_SANDBOX=job-user`` on a root node closes that too: the job runs as a uid of
  its own (``job_uid``: one per job, not in ``/etc/passwd``), so ``/proc`` of every other
  process is another user's; its own directories are chowned to that uid and root's home
  is hidden too (the interpreter re-shown read-only). Not the default: a job then reaches
  only world-readable paths outside its own directories (an interpreter or data under a
  0700 directory, a test's tmp dir), which existing jobs rely on.

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
MODE_ENV = "BATCHYARD_SANDBOX"  # auto (default) | job-user | off
UID_BASE = 1_600_000_000
UID_SPAN = 1 << 20
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
_LOCKED_FLAGS = 2 | 4 | 8 | 1024 | 2048 | 4096  # ST_NOSUID..ST_RELATIME == MS_* values
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


# --- inside: run as a script between the launcher and the job's command ---------------------

def _fail(libc_call: str) -> None:
    import ctypes

    errno = ctypes.get_errno()
    raise OSError(errno, f"{libc_call}: {os.strerror(errno)}")


def enter(spec: dict[str, object]) -> None:
    """Make this process's view of the file system the job's, and drop to its uid. In the
    job's PID namespace (node/pidns.py, joined already): a ``/proc`` of that namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    joined = bool(spec.get("pidns"))  # (in the keeper's user namespace too, when not root)
    uid, gid, cwd, parent = os.getuid(), os.getgid(), os.getcwd(), os.getppid()
    hide, rw, ro = (list(spec[key]) for key in ("hide", "binds", "ro_binds"))  # type: ignore[call-overload]
    if libc.unshare(CLONE_NEWNS | (0 if root or joined else CLONE_NEWUSER)) != 0:
        _fail("unshare")
    if not root and not joined:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)

    def mount(source: str | None, target: str, kind: str | None, flags: int,
              data: str | None = None) -> None:
        if libc.mount(source and source.encode(), target.encode(), kind and kind.encode(),
                      flags, data and data.encode()) != 0:
            _fail(f"mount {target}")

    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if joined:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    binds = []  # opened first: the tmpfs hides them
    for path, read_only in [(str(p), False) for p in rw] + [(str(p), True) for p in ro]:
        try:
            binds.append((os.open(path, os.O_PATH | os.O_CLOEXEC), path, read_only))
        except OSError:
            continue  # not there (an output never made): nothing to show
    for hidden in hide:
        mount("tmpfs", str(hidden), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for fd, path, read_only in binds:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        if read_only:
            flags = os.statvfs(path).f_flag & _LOCKED_FLAGS
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    for source, alias in spec.get("aliases") or []:  # type: ignore[attr-defined]
        if os.path.isdir(source):
            os.makedirs(alias, exist_ok=True)
            mount(source, alias, None, MS_BIND | MS_REC)
    job_uid = spec.get("uid")
    if root and isinstance(job_uid, int):
        os.setgroups([])
        os.setresgid(job_uid, job_uid, job_uid)
        os.setresuid(job_uid, job_uid, job_uid)  # takes every capability away too
        if spec.get("home"):
            os.environ["HOME"] = str(spec["home"])
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
        if spec.get("pidns"):
            _pidns().join(spec["pidns"])  # returns in the namespace; its parent forwards
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


def _pidns():  # type: ignore[no-untyped-def]
    """node/pidns.py, also from this file run as a script (its folder not on sys.path)."""
    if __package__:
        from batchyard.node import pidns

        return pidns
    import importlib

    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module("pidns")


# --- outside: what the launcher uses --------------------------------------------------------

def job_uid(plan: NodePlan) -> int:
    """One uid per job on this node (the same for its every attempt and node), far above any
    real user's, none in /etc/passwd."""
    import zlib

    key = f"{plan.workspace}/{plan.experiment}/{plan.job_name}/{plan.job_id}".encode()
    return UID_BASE + zlib.crc32(key) % UID_SPAN


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _outermost(paths: Iterable[str]) -> list[str]:
    """Sorted, without any path that lies under another of them."""
    out: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if path != "/" and not _under(path, out):
            out.append(path)
    return sorted(out)


def protect_process() -> None:
    """The launcher (and the agent) non-dumpable: a process of the same user without
    CAP_SYS_PTRACE (a rank in its user namespace) cannot read its /proc/PID/environ, fds,
    memory or root."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


class Sandbox:
    """One node's sandbox for one attempt: what to hide, what to show, as which uid."""

    def __init__(self, plan: NodePlan, dirs: NodeDirs, say: Callable[[str], None],
                 extra_rw: Iterable[Path] = ()) -> None:
        import contextlib
        from pathlib import Path

        from batchyard.node.pidns import socket_path

        self.say = say
        self.mode = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
        self.aliases: list[tuple[str, str]] = []  # (own dir, another path it is shown at)
        root = Path(plan.node_dir).resolve()
        hide = [str(root)] + [p for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]
        default_home = Path.home() / ".batchyard"
        if default_home.is_dir():
            hide.append(str(default_home))
        with contextlib.suppress(OSError):  # where the PID namespaces' keepers listen
            hide.append(os.path.dirname(socket_path(plan.attempt_uuid)))
        as_job_user = os.geteuid() == 0 and self.mode == "job-user"
        if as_job_user and Path.home() != Path("/"):
            hide.append(str(Path.home()))  # root's own (0700: the job's uid could not pass)
        self.hide = _outermost(str(Path(p).resolve()) for p in hide if Path(p).is_dir())
        attempt = Path(plan.attempt_dir)
        self.spool = attempt.parent / ".metrics-spool"
        self.own = [dirs.job_mount_root.parent, attempt, self.spool,
                    Path(plan.checkpoint_dir), dirs.stdouterr, *dirs.outputs.values(),
                    *extra_rw]
        shown = [*self.own, dirs.mount_root]
        shown += [Path(v) for v in dirs.inputs.values() if v.startswith("/")]
        shown += [Path(str(m["source"])) for m in plan.mounts
                  if m.get("kind") == "local" and str(m.get("source") or "").startswith("/")]
        package = Path(__file__).resolve().parents[2]
        interpreter = Path(plan.python or sys.executable)
        read_only = [package, Path(sys.prefix), Path(sys.base_prefix), interpreter.parent]
        if plan.ca_file:
            read_only.append(Path(plan.ca_file))
        self.binds = [p for p in _outermost(str(p) for p in shown) if _under(p, self.hide)]
        # Virtual nodes of one machine: a user's own mpiexec hands node 0's work dir to every
        # node's proxy (as the same path on machines of one layout): each node shows its own
        # there, as the other nodes' are hidden.
        node_dir = Path(plan.node_dir)
        if node_dir.name == plan.node_name:
            for name in set(plan.node_names) - {plan.node_name}:
                self.aliases.append((str(dirs.workdir), str(
                    node_dir.parent / name / dirs.workdir.relative_to(node_dir))))
        self.ro_binds = [p for p in _outermost(str(p) for p in read_only)
                         if _under(p, self.hide) and not _under(p, self.binds)]
        self.uid = job_uid(plan) if as_job_user else None
        self.home = dirs.job_temp / "home"
        self.attempt = plan.attempt_uuid
        self.keeper: Keeper | None = None  # the attempt's PID namespace here (node/pidns.py)
        self._how: str | None = None
        self.tag = plan.tag
        self.spawner: Spawner | None = None  # this sandbox's fork server (node/spawner.py)

    def spec(self) -> dict[str, object]:
        return {"hide": self.hide, "binds": self.binds, "ro_binds": self.ro_binds,
                "aliases": [a for a in self.aliases if _under(a[1], self.hide)],
                "uid": self.uid, "home": str(self.home) if self.uid is not None else None,
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
            if done.returncode != 0 and self.keeper is not None:
                self._no_pidns(f"joining it failed: {(done.stderr or '').strip()[-300:]}")
                done = self._try(how)
            if done.returncode == 0:
                if how == "bwrap":
                    self.uid = None  # bwrap cannot drop to another uid by itself
                who = f"as uid {self.uid}" if self.uid is not None else "as the launcher's user"
                self.say(f"sandbox ({how}, {who}): hidden {', '.join(self.hide)}; shown "
                         f"{', '.join(self.binds + self.ro_binds) or 'nothing more'}")
                if self.keeper is not None:
                    self.say("sandbox: a PID namespace of this attempt's own on this machine "
                             f"(its PID 1 is pid {self.keeper.pid1}): /proc shows the job's "
                             "processes only")
                elif self.uid is None:
                    self.say("WARNING: sandbox without a PID namespace: other processes of "
                             "this user outside the sandbox remain reachable through /proc "
                             "(BATCHYARD_SANDBOX=job-user as root: a uid per job)")
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
        """Last in the launcher's teardown: whatever is still in the PID namespace dies."""
        if self.spawner is not None:
            self.spawner.close()
            self.spawner = None
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None

    def own_dirs(self) -> None:
        """As root, this job's uid owns its own directories (and nothing else). The metrics
        spool is made now: one made later, inside, would be on the hiding tmpfs."""
        self.spool.mkdir(parents=True, exist_ok=True)
        if self.uid is None:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        for top in self.own:
            top.mkdir(parents=True, exist_ok=True)
            chown_tree(top, self.uid)

    def give(self, path: Path) -> None:
        """A directory the launcher made for the job's processes (Open MPI's session dir)."""
        if self.uid is not None:
            chown_tree(path, self.uid)

    def wrap(self, argv: list[str]) -> list[str]:
        return self._wrap(self.how(), argv)

    def _wrap(self, how: str, argv: list[str]) -> list[str]:
        if how == "ns":
            return [sys.executable, "-I", "-S", os.path.abspath(__file__),
                    json.dumps(self.spec()), "--", *argv]
        if how == "bwrap":
            out = ["bwrap", "--dev-bind", "/", "/", "--die-with-parent"]
            for hidden in self.hide:
                out += ["--tmpfs", hidden]
            for path in self.binds:
                out += ["--bind-try", path, path]
            for path in self.ro_binds:
                out += ["--ro-bind-try", path, path]
            return [*out, "--", *argv]
        return argv


def chown_tree(top: Path, uid: int) -> None:
    """``uid`` owns ``top`` and what is under it, links not followed, mounts not entered."""
    import contextlib

    with contextlib.suppress(OSError):
        os.lchown(top, uid, uid)
    for folder, subdirs, files in os.walk(top):
        subdirs[:] = [d for d in subdirs if not os.path.ismount(os.path.join(folder, d))]
        for name in subdirs + files:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(folder, name), uid, uid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
