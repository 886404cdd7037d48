"""FUSE mounts of Azure Blob containers and S3 buckets on the node, through ``rclone mount``
(standard library only, like the launcher): what blobfuse was to Batch AI and AML.

rclone gets its credentials in its environment only (``RCLONE_AZUREBLOB_SAS_URL``,
``RCLONE_S3_*``), never on its command line, so ``ps`` shows none; an account key is turned
into a container SAS here (Azure's service-SAS signature, HMAC-SHA256), which also reaches
endpoints of any form (Azurite's ``http://host:port/account``). Its log stays in the node's
control directory (never shipped), since rclone may quote its configuration in an error.

A read-write mount writes back through rclone's VFS cache (``--vfs-cache-mode writes``,
uploads start at close) and is flushed before unmount: rclone's remote control (loopback, a
random user and password in its environment) is asked until no upload is queued or running,
since ``fusermount -u`` alone drops what is still queued. Every rclone carries the attempt's
process tag, and its device name names the tag, so a sweeper after a SIGKILLed launcher
kills it and lazily unmounts what it left (``sweep``)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchyard.storage.stores import azure_endpoint

SAS_VERSION = "2020-12-06"
MOUNT_WAIT = 30.0
FLUSH_WAIT = 600.0
DEVNAME = "batchyard"
# what rclone keeps of the launcher's environment: Go reads SSL_CERT_*; AWS_CA_BUNDLE would
# make its S3 client refuse to start ("unsupported transport")
KEEP_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
            "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")


class MountError(Exception):
    """A mount that could not be made or flushed; the message names it and the cause."""


def unavailable() -> str | None:
    """None when rclone can make a FUSE mount on this node, else why not."""
    if os.environ.get("BATCHYARD_NO_FUSE", "").strip() not in ("", "0"):
        return "BATCHYARD_NO_FUSE is set on this node"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this node"
    if not shutil.which("rclone"):
        return "rclone is not installed on this node"
    if not fusermount():
        return "fusermount3 (fuse3) is not installed on this node"
    return None


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def not_mountable(store: dict[str, Any]) -> str | None:
    """None when rclone can mount ``store``, else why not."""
    kind = store.get("kind")
    if kind == "s3":
        return None
    if kind != "azure_blob":
        return f"{kind} storage is copied, not mounted"
    creds = store.get("credentials") or {}
    if creds.get("account_key") or creds.get("sas_token"):
        return None
    conn = _conn_fields(creds.get("connection_string") or "")
    if conn.get("accountkey") or conn.get("sharedaccesssignature"):
        return None
    return "no account key or SAS for the container"


def _conn_fields(conn: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in conn.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def container_sas(account: str, key: str, container: str, expiry: float,
                  permissions: str = "racwdl") -> str:
    """A service SAS (query string) for one container, signed with the account key."""
    se = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))
    # sp, st, se, resource, si, sip, spr, sv, sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct
    fields = [permissions, "", se, f"/blob/{account}/{container}", "", "", "", SAS_VERSION,
              "c", "", "", "", "", "", "", ""]
    digest = hmac.new(base64.b64decode(key), "\n".join(fields).encode(), hashlib.sha256)
    sig = base64.b64encode(digest.digest()).decode()
    return urllib.parse.urlencode({"sv": SAS_VERSION, "se": se, "sr": "c", "sp": permissions,
                                   "sig": sig})


def remote_of(store: dict[str, Any], expiry: float) -> tuple[str, dict[str, str]]:
    """rclone's on-the-fly remote for ``store`` and the environment holding its secrets."""
    root = str(store["root"]).strip("/")
    creds: dict[str, str] = dict(store.get("credentials") or {})
    if store["kind"] == "s3":
        env = {"RCLONE_S3_PROVIDER": "Other" if store.get("endpoint") else "AWS",
               "RCLONE_S3_ENV_AUTH": "false"}
        for var, value in (("RCLONE_S3_ENDPOINT", store.get("endpoint")),
                           ("RCLONE_S3_REGION", store.get("region")),
                           ("RCLONE_S3_ACCESS_KEY_ID", creds.get("access_key_id")),
                           ("RCLONE_S3_SECRET_ACCESS_KEY", creds.get("secret_access_key"))):
            if value:
                env[var] = str(value)
        return f":s3:{root}", env
    conn = _conn_fields(creds.get("connection_string") or "")
    account = store.get("account_name") or conn.get("accountname") or ""
    endpoint = store.get("endpoint") or conn.get("blobendpoint")
    if not endpoint and conn.get("endpointsuffix"):
        proto = conn.get("defaultendpointsprotocol") or "https"
        endpoint = f"{proto}://{account}.blob.{conn['endpointsuffix']}"
    base = azure_endpoint(account, endpoint)
    container = root.split("/", 1)[0]
    key = creds.get("account_key") or conn.get("accountkey")
    sas = (creds.get("sas_token") or conn.get("sharedaccesssignature") or "").lstrip("?")
    if key:
        sas = container_sas(account, key, container, expiry)
    return f":azureblob:{root}", {"RCLONE_AZUREBLOB_SAS_URL": f"{base}/{container}?{sas}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_mounted(target: Path) -> bool:
    want = str(target)
    with contextlib.suppress(OSError), open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2 and _unescape(parts[1]) == want:
                return True
    return False


def _unescape(text: str) -> str:
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


@dataclass
class Mount:
    label: str
    target: Path
    read_only: bool
    proc: subprocess.Popen[bytes]
    log: Path
    cache: Path
    secrets: list[str]
    rc: tuple[int, str, str] | None = None  # port, user, password
    done: bool = field(default=False)
    broken: bool = field(default=False)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        tail = " | ".join(x.strip() for x in text.strip().splitlines()[-lines:])
        return scrub(tail, self.secrets)

    def _stats(self) -> dict[str, Any] | None:
        if self.rc is None:
            return None
        port, user, password = self.rc
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/vfs/stats", data=b"{}", method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data

    def pending(self) -> int:
        """Uploads rclone still has queued or running (0 for a read-only mount)."""
        stats = self._stats()
        cache = (stats or {}).get("diskCache") or {}
        return int(cache.get("uploadsInProgress") or 0) + int(cache.get("uploadsQueued") or 0)

    def flush(self, timeout: float = FLUSH_WAIT) -> None:
        """Wait until everything written is in the store (twice seen idle: a file closed by
        a process that just died is released asynchronously)."""
        if self.read_only or self.rc is None or self.done or self.broken:
            return
        self.broken = True  # until it is seen flushed: a failure is said once
        deadline = time.monotonic() + timeout
        idle = 0
        while idle < 2:
            if not _alive(self.proc.pid):
                raise MountError(f"{self.label}: rclone ended before its writes were flushed "
                                 f"({self.log_tail()})")
            try:
                idle = idle + 1 if self.pending() == 0 else 0
            except OSError as exc:
                raise MountError(f"{self.label}: rclone did not answer ({exc})") from None
            if time.monotonic() > deadline:
                raise MountError(f"{self.label}: uploads did not finish in {timeout:g}s")
            time.sleep(0.25)
        self.broken = False

    def unmount(self, timeout: float = 30.0) -> None:
        """Unmount (lazily when something still holds it open) and wait for rclone to end."""
        if self.done:
            return
        self.done = True
        tool = fusermount() or "fusermount3"
        if is_mounted(self.target) and _quiet([tool, "-u", str(self.target)]):
            _quiet([tool, "-uz", str(self.target)])  # still held open: detach it now
        deadline = time.monotonic() + timeout
        while _alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _alive(self.proc.pid):
                break
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, sig)
            time.sleep(1.0)
        shutil.rmtree(self.cache, ignore_errors=True)


def _quiet(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, check=False, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=60).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def _alive(pid: int) -> bool:
    from batchyard.node.proctree import alive

    return alive(pid)


def scrub(text: str, secret_values: list[str]) -> str:
    for value in sorted(secret_values, key=len, reverse=True):
        if value:
            text = text.replace(value, "***")
    return text


def mount(label: str, store: dict[str, Any], target: Path, *, read_only: bool, tag: str,
          index: int, control: Path, cache_root: Path, expiry: float,
          started: Callable[[subprocess.Popen[bytes]], None] | None = None,
          uid: int | None = None) -> Mount:
    """``rclone mount`` of ``store`` at ``target``, returned once the mount is there;
    ``uid``: the job's (node/jobuser.py), shown as the owner of what is in it."""
    target.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(target))  # as /proc/mounts names it (no "..", no links)
    remote, secret_env = remote_of(store, expiry)
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(secret_env, BATCHYARD_PROC_TAG=tag)
    slug = tag.replace("/", "-")
    log = control / f"mount-{slug}-{index}.log"
    cache = cache_root / f"rclone-{slug}-{index}"
    argv = ["rclone", "mount", remote, str(target), "--config", "/dev/null",
            "--cache-dir", str(cache), "--devname", f"{DEVNAME}:{tag}:{index}",
            "--log-file", str(log), "--log-level", "INFO", "--allow-non-empty",
            "--poll-interval", "0"]
    if os.geteuid() == 0:
        argv.append("--allow-other")  # ranks may run as another user, or in a container
    if uid is not None:
        argv += ["--uid", str(uid), "--gid", str(uid)]
    rc = None
    if read_only:  # data that does not change while the job runs: listed once an hour
        argv += ["--read-only", "--dir-cache-time", "1h"]
    else:  # others (another node) may write there: their files show within seconds
        argv += ["--dir-cache-time", "5s"]
        rc = (_free_port(), secrets.token_hex(8), secrets.token_hex(16))
        env.update(RCLONE_RC_USER=rc[1], RCLONE_RC_PASS=rc[2])
        argv += ["--vfs-cache-mode", "writes", "--vfs-write-back", "0s",
                 "--rc", "--rc-addr", f"127.0.0.1:{rc[0]}"]
    control.mkdir(parents=True, exist_ok=True)
    from batchyard.node.proctree import die_with_parent

    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)
    if started is not None:
        started(proc)
    secret_list = [v for v in secret_env.values() if v] + ([rc[2]] if rc else [])
    secret_list += [urllib.parse.unquote(p.split("=", 1)[-1]) for v in secret_env.values()
                    for p in v.split("?", 1)[-1].split("&") if p.startswith("sig=")]
    made = Mount(label, target, read_only, proc, log, cache, secret_list, rc)
    deadline = time.monotonic() + MOUNT_WAIT
    while not is_mounted(target):
        if not _alive(proc.pid) or time.monotonic() > deadline:
            made.unmount(timeout=1.0)
            why = made.log_tail() or f"no mount after {MOUNT_WAIT:g}s"
            raise MountError(f"{label}: rclone mount at {target} failed: {why}")
        time.sleep(0.05)
    if rc is not None:  # its remote control listens a moment after the mount appears
        while True:
            try:
                made.pending()
                break
            except OSError:
                if time.monotonic() > deadline or not _alive(proc.pid):
                    made.unmount(timeout=5.0)
                    raise MountError(f"{label}: rclone's remote control did not start "
                                     f"({made.log_tail()})") from None
                time.sleep(0.1)
    return made


def stale_targets(tag: str, mounts_file: str = "/proc/self/mounts") -> list[str]:
    """Mount points of the rclone mounts of ``tag`` (found by their device name)."""
    found = []
    prefix = f"{DEVNAME}:{tag}:"
    with contextlib.suppress(OSError), open(mounts_file) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2 and _unescape(parts[0]).startswith(prefix) \
                    and parts[2].startswith("fuse"):
                found.append(_unescape(parts[1]))
    return found


def sweep_orphans(mounts_file: str = "/proc/self/mounts") -> int:
    """Lazily unmount batchyard's rclone mounts whose rclone is gone (a launcher SIGKILLed
    where no sweeper came after it, e.g. under Slurm); called by every launcher that mounts."""
    from batchyard.node.proctree import tagged_pids

    tags = set()
    with contextlib.suppress(OSError), open(mounts_file) as fh:
        for line in fh:
            device = _unescape(line.split(" ", 1)[0])
            if device.startswith(f"{DEVNAME}:") and device.count(":") >= 2:
                tags.add(device[len(DEVNAME) + 1:].rsplit(":", 1)[0])
    dead = [tag for tag in tags if not tagged_pids(tag)]
    return sum(sweep(tag, nfs_too=False) for tag in dead)


def sweep(tag: str, nfs_too: bool = True) -> int:
    """After a launcher died without its teardown (call it once the tag's processes are
    killed): lazily unmount every rclone mount it left. Returns how many."""
    tool = fusermount()
    targets = stale_targets(tag)
    for target in targets:
        _quiet([tool, "-uz", target] if tool else ["umount", "-l", target])
    if not nfs_too:
        return len(targets)
    from batchyard.node import nfs

    return len(targets) + nfs.sweep(tag)
