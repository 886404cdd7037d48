"""A real Prometheus (Debian's ``prometheus``, installed by scripts/setup.sh) for the tests:
listening on loopback, scraping the targets it is given every 3 s, with its data in a tmp
dir; started and stopped by pid. ``query`` asks its HTTP API."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml

from yardkit import wait_until


def available() -> bool:
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    def __init__(self, folder: Path, scrape: list[dict[str, Any]]) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # every 3 s, as long a timeout: a loaded test machine may take a second to answer
        config = {"global": {"scrape_interval": "3s", "evaluation_interval": "3s",
                             "scrape_timeout": "3s"},
                  "scrape_configs": scrape}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        log = open(self.folder / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
            return False

        wait_until(ready, 60, 0.2, "Prometheus to be ready")
        return self

    def log(self) -> str:
        path = self.folder / "prometheus.log"
        return path.read_text(errors="replace")[-3000:] if path.is_file() else ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        data = httpx.get(self.url + "/api/v1/targets", timeout=10).json()["data"]
        found: list[dict[str, Any]] = data["activeTargets"]
        return found

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_for(prom: Prometheus, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Until the query returns something; what it returned."""
    found: list[dict[str, Any]] = []

    def answered() -> bool:
        found[:] = prom.query(expr)
        return bool(found)

    try:
        wait_until(answered, timeout, 0.5, f"Prometheus to have {expr}")
    except AssertionError:
        raise AssertionError(f"{expr}: nothing after {timeout:g}s; targets "
                             f"{prom.targets()}\n{prom.log()}") from None
    return found
