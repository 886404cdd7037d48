"""Real local storage servers for the storage tests and the staging bench: Azurite (Azure Blob,
installed by scripts/setup.sh with npm) and moto's S3 server (the `storage` extra), each on a
free loopback port, stopped when the context ends. No mocks."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AZURITE = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} in {timeout:g}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@dataclass
class AzuriteServer:
    port: int
    account: str
    key: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};"
                f"AccountKey={self.key};BlobEndpoint={self.endpoint};")

    def fs(self) -> object:
        from adlfs import AzureBlobFileSystem

        return AzureBlobFileSystem(connection_string=self.connection_string,
                                   skip_instance_cache=True)


@dataclass
class MotoServer:
    port: int
    key_id: str = "testing-key-id"
    secret: str = "testing-secret-key"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fs(self) -> object:
        from s3fs import S3FileSystem

        return S3FileSystem(key=self.key_id, secret=self.secret, endpoint_url=self.endpoint,
                            skip_instance_cache=True, use_listings_cache=False)


def azurite_available() -> bool:
    return AZURITE.exists() and shutil.which("node") is not None


@contextlib.contextmanager
def azurite(location: Path, account: str = "yardacct") -> Iterator[AzuriteServer]:
    """Azurite's blob service with one account whose key is random (so tests can grep it)."""
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    port = free_port()
    env = dict(os.environ, AZURITE_ACCOUNTS=f"{account}:{key}")
    proc = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
         str(location), "--skipApiVersionCheck", "--loose", "--silent"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "azurite")
        yield AzuriteServer(port, account, key)
    finally:
        _stop(proc)


@contextlib.contextmanager
def moto_s3() -> Iterator[MotoServer]:
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "moto_server")
        yield MotoServer(port)
    finally:
        _stop(proc)
