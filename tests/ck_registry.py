"""The container kit's private image registry (tests/containerkit.py): Debian's
``docker-registry`` with htpasswd auth, plain HTTP."""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import string
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ck_common import (
    DATA,
    USER,
    _clean_env,
    _die_with_parent,
    _free_port,
    _private_dir,
    _root_reason,
    _sh,
    _which,
)
from ck_engines import _insecure, _trust_insecure

if TYPE_CHECKING:
    from ck_engines import Engine
    from hostkit import Host


# -- registry ---------------------------------------------------------------------------------

def _registry_reason() -> str | None:
    if reason := _root_reason():
        return reason
    if not _which("docker-registry"):
        return "registry tests need docker-registry (apt-get install docker-registry)"
    return None


def _bcrypt(password: str) -> str:
    if htpasswd := _which("htpasswd"):
        out = _sh([htpasswd, "-niB", USER], input=password + "\n").stdout
        return out.strip().split(":", 1)[1]
    import crypt  # libxcrypt (Debian) does bcrypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


class Registry:
    """``docker-registry serve`` on ``address`` (127.0.0.1:PORT, or ``host``'s address inside
    a hostkit Host), plain HTTP, htpasswd auth for ``username``/``password``, storage in a temp
    dir. Podman engines of this session trust it as insecure (their registries.conf); dockerd
    needs nothing for 127.0.0.0/8, and ``DockerEngine(insecure_registries=[address])`` else."""

    def __init__(self, host: Host | None = None, username: str = USER,
                 anonymous: bool = False) -> None:
        self.host = host
        self.anonymous = anonymous  # no auth at all: a stand-in for a public registry
        self.username = username
        self.password = secrets.token_urlsafe(18)
        self.root = _private_dir("containerkit-registry-")
        self.log = self.root / "registry.log"
        self.address = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.pushed: list[str] = []
        self._closed = False
        atexit.register(self.close)

    def start(self, timeout: float = 30) -> Registry:
        try:
            (self.root / "data").mkdir()
            (self.root / "htpasswd").write_text(f"{self.username}:{_bcrypt(self.password)}\n")
            for _attempt in range(5):
                ip = self.host.addr if self.host is not None else "127.0.0.1"
                self.address = f"{ip}:{_free_port()}"
                template = string.Template((DATA / "registry-config.yml").read_text())
                conf = self.root / "config.yml"
                text = template.substitute(
                    addr=self.address, root=self.root / "data", htpasswd=self.root / "htpasswd",
                    secret=secrets.token_hex(16))
                if self.anonymous:
                    text = text[:text.index("\nauth:")] + "\n"
                conf.write_text(text)
                argv = [_which("docker-registry") or "docker-registry", "serve", str(conf)]
                with open(self.log, "ab") as log:
                    if self.host is not None:
                        self.proc = self.host.popen(argv, env=_clean_env(), stdout=log,
                                                    stderr=log)
                    else:
                        self.proc = subprocess.Popen(
                            argv, env=_clean_env(), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=log, start_new_session=True, preexec_fn=_die_with_parent)
                if self._wait_ready(timeout):
                    _trust_insecure(self.address)
                    return self
            raise RuntimeError(f"docker-registry did not start: {self.tail()}")
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> bool:
        """True once /v2/ answers 401 (auth on; 200 when anonymous); False if it exited."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if f"listening on {self.address}" in self.tail(50):
                if self.host is not None:
                    return True  # not reachable from here to probe
                with contextlib.suppress(OSError):
                    c = http.client.HTTPConnection(self.address, timeout=5)
                    c.request("GET", "/v2/")
                    status = c.getresponse().status
                    c.close()
                    if status == (200 if self.anonymous else 401):
                        return True
                    raise RuntimeError(f"registry /v2/ without credentials answered {status}")
            time.sleep(0.05)
        raise RuntimeError(f"docker-registry not ready after {timeout:g}s: {self.tail()}")

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def auth_config(self, password: str | None = None) -> dict[str, Any]:
        """The docker-style config.json content for this registry."""
        token = f"{self.username}:{self.password if password is None else password}"
        return {"auths": {self.address: {"auth": base64.b64encode(token.encode()).decode()}}}

    def write_auth(self, directory: str | Path, password: str | None = None) -> Path:
        """``directory``/config.json (dir 0700, file 0600), as the product's pull code writes
        it: ``DOCKER_CONFIG=directory docker pull`` or ``podman pull --authfile FILE``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        d.chmod(0o700)
        f = d / "config.json"
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.auth_config(password), fh)
        return f

    def ref(self, repo: str, tag: str = "latest") -> str:
        return f"{self.address}/{repo}:{tag}"

    def push(self, engine: Engine, image: str, repo: str | None = None,
             tag: str | None = None, keep_tag: bool = False) -> str:
        """Push local ``image`` as ADDRESS/``repo``:``tag`` (default: batchyard/NAME:TAG of
        the image) with our credentials; returns the remote reference. The remote tag is
        removed from the engine again unless ``keep_tag`` (so a later pull really pulls)."""
        last = image.rsplit("/", 1)[-1]
        name, _, itag = last.partition(":")
        remote = self.ref(repo or f"batchyard/{name}", tag or itag or "latest")
        if engine.name == "docker":
            with tempfile.TemporaryDirectory(prefix="cklogin-") as cfg:
                env = {"DOCKER_CONFIG": cfg}
                engine.run(["login", "--username", self.username, "--password-stdin",
                            self.address], input=self.password + "\n", env=env, timeout=60)
                engine.run(["tag", image, remote])
                try:
                    engine.run(["push", remote], env=env, timeout=600)
                finally:
                    if not keep_tag:
                        engine.run(["rmi", remote], check=False)
        else:
            creds = [] if self.anonymous else ["--creds", f"{self.username}:{self.password}"]
            engine.run(["push", "--tls-verify=false", *creds, image, f"docker://{remote}"],
                       timeout=600)
            if keep_tag:
                engine.run(["tag", image, remote])
        self.pushed.append(remote)
        return remote

    def tail(self, n: int = 15) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return "(no log)"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.address in _insecure:
            _insecure.remove(self.address)
        if not os.environ.get("CONTAINERKIT_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)
