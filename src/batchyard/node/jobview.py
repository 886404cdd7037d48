"""What one attempt's job processes on one node see and who they are: the launcher's side of
the sandbox (node/sandbox.py runs it; node/mountview.py makes it in each process).

- **Hidden**: the node's work folder (every job's files, tickets, an agent's credential),
  the server's home, data root and TLS key (``plan.hide``, and the backend's
  ``BATCHYARD_SANDBOX_HIDE``), the default home, the PID namespaces' sockets; and, for a
  job that runs as an unprivileged uid, every folder on the way to what it is shown that
  the uid could not pass (a 0700 home or tmp dir): the job could not have reached anything
  else beneath it anyway.
- **Shown read-write** (the job's own): its node's job folder (work dir, temp), the attempt
  dir, checkpoints, stdouterr, outputs, the node's and the job's mounts (a local mount's
  source), the metrics spool, a private ``/tmp`` and ``/dev/shm`` (shared by the job's
  processes on this node, by nobody else). **Read-only**: everything else, the attempt's
  control folder (plans, status, the relay's socket) included, and inputs.
- **Who**: as root, an unprivileged uid per submitting user (node/jobuser.py), owner (0700)
  of the job's writable folders; uid 0 without capabilities only where the cluster allows
  root jobs; a launcher that is not root runs jobs as itself.

Every path a job named (inputs, mount sources, output and log folders) is checked again here,
resolved on this node, against the hidden folders (batchyard/pathguard.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from batchyard import pathguard
from batchyard.node import jobuser
from batchyard.node.env import NodeDirs
from batchyard.node.plan import NodePlan
from batchyard.node.sandbox import HIDE_ENV

SHM_ROOT = Path("/dev/shm/batchyard")


def under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(pathguard.within(path, r) for r in roots)


def outermost(paths: list[str]) -> list[str]:
    """Sorted, without any path that lies under another of them."""
    out: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if path != "/" and not under(path, out):
            out.append(path)
    return sorted(out)


def hidden_roots(plan: NodePlan) -> list[str]:
    """Every folder or file no job on this node may see (resolved; those that exist)."""
    from batchyard.node.pidns import socket_path

    found = [plan.node_dir, *os.environ.get(HIDE_ENV, "").split(os.pathsep), *plan.hide,
             str(Path.home() / ".batchyard")]
    with contextlib.suppress(OSError):  # where the PID namespaces' keepers listen
        found.append(os.path.dirname(socket_path(plan.attempt_uuid)))
    return list(dict.fromkeys(os.path.realpath(p) for p in found
                              if p and os.path.lexists(p)))


def own_roots(plan: NodePlan, dirs: NodeDirs) -> list[str]:
    """The job's own folders on this node and its workspace's datastores on the server's
    machine (where the paths it names may lead, though they lie in hidden folders)."""
    attempt = Path(plan.attempt_dir)
    return [str(p) for p in (dirs.job_mount_root.parent, attempt, attempt.parent / "checkpoints",
                             Path(plan.checkpoint_dir), attempt.parent / ".metrics-spool",
                             dirs.mount_root)] + list(plan.shared)


def _is_local(value: str) -> bool:
    return bool(value) and ("://" not in value or value.startswith("file://"))


def named_paths(plan: NodePlan, dirs: NodeDirs) -> list[tuple[str, str, bool]]:
    """(field, path, made) of every path on this node the job named or had resolved for it;
    ``made``: a folder the launcher makes for it (an output, the logs)."""
    out: list[tuple[str, str, bool]] = []
    for ident, item in plan.inputs.items():
        store = item.get("store") or {}
        if store.get("kind") == "local":
            out.append((f"inputs.{ident}.path", str(store["root"]), False))
        elif not store and _is_local(dirs.inputs.get(ident, "")):
            out.append((f"inputs.{ident}.path", dirs.inputs[ident], False))
    for i, mount in enumerate(plan.mounts):
        store = mount.get("store") or {}
        if mount.get("kind") == "local" and mount.get("source"):
            out.append((f"mounts[{i}].source", str(mount["source"]), False))
        elif store.get("kind") == "local":
            out.append((f"mounts[{i}].source", str(store["root"]), False))
    for ident, path in dirs.outputs.items():
        store = plan.outputs.get(ident, {}).get("store") or {}
        if store.get("kind") == "local":
            out.append((f"outputs.{ident}.path", str(store["root"]), False))
        out.append((f"outputs.{ident}", str(path), True))
    out.append(("stdouterr_path_prefix", str(dirs.stdouterr), True))
    return out


def refused(plan: NodePlan, dirs: NodeDirs) -> str | None:
    """Why a path the job names may not be used on this node (None: all may). Folders the
    launcher makes for the job (outputs, logs) must also land in its own folders or its
    mounts' sources, wherever links on the way lead: it makes them as root."""
    hidden, allowed = hidden_roots(plan), own_roots(plan, dirs)
    writable = [os.path.realpath(p) for p in allowed] + [
        os.path.realpath(str(m["source"])) for m in plan.mounts
        if m.get("kind") == "local" and m.get("source")]
    for field, path, made in named_paths(plan, dirs):
        try:
            found = pathguard.check(path, field, hidden, allowed=allowed,
                                    base=str(dirs.workdir))
        except pathguard.PathRefused as exc:
            return exc.message
        if made and not under(found, writable):
            return (f"{field}: {path} resolves to {found}, outside the job's own folders "
                    "and mounts")
    return None


class JobView:
    """One attempt's view on one node (its ``spec`` goes to node/mountview.py)."""

    def __init__(self, plan: NodePlan, dirs: NodeDirs, extra_rw: list[Path]) -> None:
        root = os.geteuid() == 0
        self.plan, self.dirs = plan, dirs
        self.user = plan.job_user or "batchyard"
        self.as_job_user = root and not plan.allow_root  # (else: the launcher's uid)
        self.uid: int | None = None  # known once settled (the registry is on disk)
        job_local = dirs.job_mount_root.parent
        attempt = Path(plan.attempt_dir)
        self.control = attempt / ".batchyard"
        self.spool = attempt.parent / ".metrics-spool"
        self.home = dirs.job_temp / "home"
        self.tmp = job_local / "systmp"
        self.shm = SHM_ROOT / plan.tag.replace("/", "-")
        self.writable = [dirs.job_temp, dirs.workdir, dirs.shared_job_temp, dirs.stdouterr,
                         Path(plan.checkpoint_dir), self.spool, *dirs.outputs.values(),
                         self.control / "mpi", self.home, *extra_rw]
        rw = [job_local, attempt, dirs.mount_root, *self.writable]
        sources = [os.path.realpath(str(m["source"])) for m in plan.mounts
                   if m.get("kind") == "local" and str(m.get("source") or "").startswith("/")]
        rw += [Path(p) for p in sources]
        package = Path(__file__).resolve().parents[2]
        interpreter = Path(plan.python or sys.executable)
        ro = [package, Path(sys.prefix), Path(sys.base_prefix), self.control]
        if interpreter.is_absolute():
            for python in {interpreter, Path(os.path.realpath(interpreter))}:  # a venv's, and
                ro += [python.parent, python.parent.parent]  # the one it was made from
        inputs = [os.path.realpath(v) for v in dirs.inputs.values() if v.startswith("/")]
        ro += [Path(p) for p in inputs]
        # what the job's user named (not its workspace's datastores) it reaches as that
        # user would: a folder on the way its uid cannot pass is not passed for it
        self.named = [p for p in (*sources, *inputs)
                      if not under(p, [str(job_local), *plan.shared])]
        if plan.ca_file:
            ro.append(Path(plan.ca_file))
        self.binds = _layered([str(p) for p in rw], [str(p) for p in ro])
        hidden = hidden_roots(plan)
        self.hide_files = [p for p in hidden if not os.path.isdir(p)]
        self.hidden = outermost([p for p in hidden if os.path.isdir(p)])
        self.hide = list(self.hidden)
        self.aliases: list[tuple[str, str]] = []  # (own dir, another path it is shown at)
        # Virtual nodes of one machine: a user's own mpiexec hands node 0's work dir to every
        # node's proxy (as the same path on machines of one layout): each node shows its own
        # there, as the other nodes' are hidden.
        node_dir = Path(plan.node_dir)
        if node_dir.name == plan.node_name:
            for name in set(plan.node_names) - {plan.node_name}:
                self.aliases.append((str(dirs.workdir), str(
                    node_dir.parent / name / dirs.workdir.relative_to(node_dir))))
        self.etc: dict[str, str] = {}
        self.barred: list[str] = []  # named folders beyond what the job's uid may pass

    def settle(self) -> None:
        """The job's uid, its folders made and given to it, its account files, and the
        folders on the way that this uid could not pass hidden as well."""
        for path in (*self.writable, self.tmp):
            path.mkdir(parents=True, exist_ok=True)
        _private(self.tmp)
        with contextlib.suppress(OSError):
            SHM_ROOT.mkdir(mode=0o700, exist_ok=True)
            self.shm.mkdir(exist_ok=True)
            _private(self.shm)
        if not self.as_job_user:
            return
        self.uid = jobuser.uid_of(self.user)
        for top in self.writable:
            give(top, self.uid)
        self.etc = jobuser.account_files(self.control / "etc", self.user, self.uid,
                                         str(self.home))
        ways = [p for p, _ in self.binds if p not in self.named] + [str(self.dirs.workdir)]
        self.hide = outermost(self.hidden + jobuser.barriers(ways, self.uid))
        self.barred = [p for p in self.named if jobuser.barriers([p], self.uid)]

    def give(self, path: Path) -> None:
        """A folder the launcher made for the job's processes (a copied mount)."""
        if self.uid is not None:
            give(path, self.uid)

    def spec(self) -> dict[str, object]:
        shm = self.shm if self.shm.is_dir() else None
        # read-only folders need a bind only where hidden (else they are there, read-only)
        rw = [p for p, mode in self.binds if mode == "rw"]
        binds = [[p, mode] for p, mode in self.binds if p not in self.barred
                 and (mode == "rw" or under(p, [*self.hide, "/tmp", *rw]))]
        # under /tmp (the job's own from now on) only what leads to a bind needs hiding
        hide = [h for h in self.hide if not under(h, ["/tmp"])
                or any(under(p, [h]) for p, _ in binds)]
        return {"hide": hide, "hide_files": self.hide_files, "binds": binds,
                "tmp": str(self.tmp), "shm": str(shm) if shm else None, "etc": self.etc,
                "aliases": [a for a in self.aliases if under(a[1], self.hide)],
                "uid": self.uid, "home": str(self.home),
                "account": jobuser.account(self.user) if self.uid is not None else None}

    def described(self) -> str:
        who = (f"as {jobuser.account(self.user)} (uid {self.uid})" if self.uid is not None
               else "as root without capabilities (the cluster allows root jobs)"
               if self.plan.allow_root and os.geteuid() == 0 else "as the launcher's user")
        return (f"{who}; hidden {', '.join(self.hide)}; read-write: the job's own folders, "
                "a private /tmp and /dev/shm; everything else read-only")

    def close(self) -> None:
        """The private /tmp and /dev/shm go with the attempt."""
        import shutil

        for path in (self.tmp, self.shm):
            shutil.rmtree(path, ignore_errors=True)


def _layered(rw: list[str], ro: list[str]) -> list[tuple[str, str]]:
    """(path, mode) to bind, outer first: a path under a kept one of the same mode is covered
    by it; under one of the other mode it is bound on top of it (the read-only control
    folder in the read-write attempt dir, the read-write ``mpi`` folder in that)."""
    modes = {os.path.normpath(p): "ro" for p in ro}
    modes.update({os.path.normpath(p): "rw" for p in rw})
    out: list[tuple[str, str]] = []
    for path in sorted(modes, key=lambda p: (p.count("/"), p)):
        kept = [(q, mode) for q, mode in out if pathguard.within(path, q)]
        if kept and max(kept, key=lambda k: len(k[0]))[1] == modes[path]:
            continue
        out.append((path, modes[path]))
    return out


def _private(path: Path) -> None:
    """A /tmp of the job's own: root's, sticky and open to all (the job's uid), like /tmp."""
    with contextlib.suppress(OSError):
        os.chown(path, 0, 0)
        os.chmod(path, 0o1777)


def give(top: Path, uid: int) -> None:
    """``uid`` owns ``top`` (0700: no other user's job reads it) and what is under it, links
    not followed, mounts not entered."""
    with contextlib.suppress(OSError):
        os.lchown(top, uid, uid)
        os.chmod(top, 0o700)
    for folder, subdirs, files in os.walk(top):
        subdirs[:] = [d for d in subdirs if not os.path.ismount(os.path.join(folder, d))]
        for name in subdirs + files:
            with contextlib.suppress(OSError):
                os.lchown(os.path.join(folder, name), uid, uid)


def sweep(tag: str) -> None:
    """What a launcher killed before its teardown left of its job's sandbox: the private
    /dev/shm (memory) and the cgroup (the backend's sweep, by the node's process tag)."""
    import shutil

    from batchyard.node.cgroups import remove_for

    shutil.rmtree(SHM_ROOT / tag.replace("/", "-"), ignore_errors=True)
    remove_for(tag)
