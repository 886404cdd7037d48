"""The node side of storage: ``python -m batchyard.storage.stage in|out|sync PLAN``.

The node launcher runs under ``python -S`` (no site-packages), so it starts this module as a
subprocess with the normal interpreter. It reads the node's plan file (mode 0600: the only
place where the stores' credentials live on the node), and

- ``in``: downloads Batch AI mount volumes backed by storage (to
  ``$AZ_BATCHAI_JOB_MOUNT_ROOT/<relativeMountPath>``) and inputs in ``download`` mode (and
  ``ro_mount`` where the launcher could not FUSE-mount it) into the node's input
  directories, through the node's content-addressed cache; what the launcher mounts
  (``fuse`` on the item) is only checked: the container or bucket is there and the
  credentials work;
- ``out``: uploads outputs bound to a datastore and writes back mount volumes;
- ``sync``: does ``out`` every ``--every`` seconds until stopped, so what a job wrote survives
  preemption.

It prints progress lines without credentials (every secret value is scrubbed from messages)
and writes ``<control>/node-<rank>.stage-<what>.json`` with the outcome; the exit code is 1
when a transfer failed, and the message names the mount or input and the cause.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from batchyard.node.env import NodeDirs, node_dirs
from batchyard.node.plan import AttemptPaths, NodePlan, write_json_atomic
from batchyard.storage.crypto import scrub
from batchyard.storage.stores import (
    check_reachable,
    open_fs,
    remote_path,
    secrets_of,
    url_of,
)
from batchyard.storage.transfer import Cache, Stats, download, upload


def work_items(plan: NodePlan, dirs: NodeDirs, direction: str) -> list[dict[str, Any]]:
    """What to move, in order: (label, store, local dir)."""
    items: list[dict[str, Any]] = []
    for mount in plan.mounts:
        store = mount.get("store")
        if not store:
            continue
        local = dirs.job_mount_root / mount["relative_path"]
        label = f"mount {mount['relative_path']} ({mount.get('origin', mount['kind'])})"
        if mount.get("fuse"):  # the launcher mounts it: only checked here
            if direction == "in":
                items.append({"label": label, "store": store, "local": local, "kind": "check",
                              "writable": not mount.get("read_only")})
        elif direction == "in" or not mount.get("read_only"):
            items.append({"label": label, "store": store, "local": local, "kind": "mount"})
    if direction == "in":
        for ident, spec in plan.inputs.items():
            if spec.get("store") and spec.get("mode") in ("download", "ro_mount"):
                items.append({"label": f"input {ident}", "store": spec["store"],
                              "local": Path(dirs.inputs[ident]),
                              "kind": "check" if spec.get("fuse") else "input",
                              "mode": spec["mode"]})
        for ident, spec in plan.outputs.items():
            if spec.get("store") and spec.get("fuse"):
                items.append({"label": f"output {ident}", "store": spec["store"],
                              "local": dirs.outputs[ident], "kind": "check",
                              "writable": True})
    else:
        for ident, spec in plan.outputs.items():
            if spec.get("store") and not spec.get("fuse"):
                items.append({"label": f"output {ident}", "store": spec["store"],
                              "local": dirs.outputs[ident], "kind": "output"})
    return items


def check_store(fs: Any, store: dict[str, Any], root: str, writable: bool) -> None:
    """Raise what a mount of ``store`` would meet: a missing container or bucket (or, read
    only, path), wrong credentials. A writable one's path may not exist yet."""
    if store["kind"] == "local":
        if not writable and not fs.exists(root):
            raise FileNotFoundError(root)
        return
    bucket = root.split("/", 1)[0]
    fs.ls(bucket, detail=False)  # wrong credentials or no such container: raised here
    if not writable and root.strip("/") != bucket and not fs.exists(root):
        raise FileNotFoundError(root)


def describe(exc: BaseException) -> str:
    """The cause of a storage failure in plain words."""
    name = type(exc).__name__
    text = str(exc).split("\n", 1)[0]
    low = f"{name} {exc}".lower()
    if isinstance(exc, FileNotFoundError) or "notfound" in low or "nosuchbucket" in low:
        return f"not found (missing container, bucket or path): {text}"
    if ("authenticat" in low or "forbidden" in low or "accessdenied" in low
            or "signature" in low or "403" in low or "invalidaccesskey" in low):
        return f"access denied (wrong key or credentials): {name}"
    if ("connect" in low or "unreachable" in low or "timeout" in low or "resolve" in low
            or "name or service" in low or "servicerequest" in low):
        return f"storage unreachable: {text}"
    return f"{name}: {text}"


def run(plan_file: Path, direction: str, every: float | None = None,
        plan: NodePlan | None = None) -> int:
    plan = plan or NodePlan.load(plan_file)
    dirs = node_dirs(plan)
    secret_values = [s for m in plan.mounts for s in secrets_of(m.get("store") or {})]
    secret_values += [s for x in (*plan.inputs.values(), *plan.outputs.values())
                      for s in secrets_of(x.get("store") or {})]
    result_file = AttemptPaths(Path(plan.attempt_dir)).control / (
        f"node-{plan.node_rank}.stage-{direction}.json")
    cache = Cache(Path(plan.node_dir) / "cache")
    seen: dict[str, dict[str, tuple[int, int]]] = {}
    notes: list[str] = []
    total = Stats()

    def say(text: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} {scrub(text, secret_values)}\n")
        sys.stdout.flush()

    def one_pass(kind: str) -> tuple[bool, str | None]:
        for item in work_items(plan, dirs, kind):
            store, local, label = item["store"], Path(item["local"]), item["label"]
            where = url_of(store)
            started = time.time()
            try:
                check_reachable(store)
                fs = open_fs(store)
                root = remote_path(store)
                if item["kind"] == "check":
                    check_store(fs, store, root, bool(item.get("writable")))
                    say(f"{label}: {where} is there (it is mounted, not copied)")
                    continue
                if kind == "in":
                    ident = f"{store['kind']}:{store.get('endpoint') or ''}:" \
                            f"{store.get('account_name') or ''}"
                    stats = download(fs, root, local, store_id=ident, cache=cache)
                    if item["kind"] == "mount":
                        seen[label] = _snapshot(local)
                else:
                    if not local.exists():
                        continue
                    stats = upload(fs, local, root, seen=seen.setdefault(label, {}))
            except Exception as exc:
                message = f"{'stage-in' if kind == 'in' else 'stage-out'} of {label} from " \
                          f"{where} failed: {describe(exc)}"
                if kind != "in":
                    message = message.replace(" from ", " to ", 1)
                return False, scrub(message, secret_values)
            total.add(**{k: v for k, v in stats.as_dict().items()})
            say(f"{label} {'<-' if kind == 'in' else '->'} {where}: {stats.files} file(s), "
                f"{stats.bytes_transferred} B transferred, {stats.bytes_cached} B from cache, "
                f"{stats.bytes_skipped} B unchanged, {time.time() - started:.2f}s")
        return True, None

    if direction == "in":
        _load_seen(plan_file, seen)
        ok, message = one_pass("in")
        _save_seen(plan_file, seen)
    elif direction == "out":
        _load_seen(plan_file, seen)
        ok, message = one_pass("out")
        _save_seen(plan_file, seen)
    else:
        stop: list[bool] = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        _load_seen(plan_file, seen)
        ok, message = True, None
        while not stop:
            deadline = time.time() + (every or 60.0)
            while not stop and time.time() < deadline:
                time.sleep(0.2)
            if stop:
                break
            passed, problem = one_pass("out")
            _save_seen(plan_file, seen)
            if not passed:
                say(f"sync: {problem}")
    write_json_atomic(result_file, {"ok": ok, "message": message, "notes": notes,
                                    "stats": total.as_dict(), "ended_at": time.time()})
    if message:
        say(message)
    return 0 if ok else 1


def _snapshot(local: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for path in local.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            out[path.relative_to(local).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _seen_file(plan_file: Path) -> Path:
    return plan_file.with_name(plan_file.name.replace(".plan.json", ".stage-seen.json"))


def _load_seen(plan_file: Path, seen: dict[str, dict[str, tuple[int, int]]]) -> None:
    try:
        data = json.loads(_seen_file(plan_file).read_text())
    except (OSError, ValueError):
        return
    for label, files in data.items():
        seen[label] = {rel: (int(v[0]), int(v[1])) for rel, v in files.items()}


def _save_seen(plan_file: Path, seen: dict[str, dict[str, tuple[int, int]]]) -> None:
    write_json_atomic(_seen_file(plan_file), seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchyard.storage.stage")
    parser.add_argument("direction", choices=("in", "out", "sync"))
    parser.add_argument("plan", type=Path)
    parser.add_argument("--every", type=float, default=None)
    parser.add_argument("--plan-on-stdin", action="store_true",
                        help="read the plan (with its credentials) from stdin; PLAN's file "
                        "copy has them masked and only names the attempt's files")
    args = parser.parse_args(argv)
    given = NodePlan.from_dict(json.load(sys.stdin)) if args.plan_on_stdin else None
    return run(args.plan, args.direction, args.every, plan=given)


if __name__ == "__main__":
    raise SystemExit(main())
