"""A private PostgreSQL server for the tests (Debian's postgresql package): its own data dir
under a tmp dir, bound to 127.0.0.1 on a free port, password auth, started once per test
session and stopped by pid. Each batchyard home gets a database of its own.

The tests run on it when ``BATCHYARD_TEST_DB=postgresql`` (scripts/test.sh runs the store,
API and reconciler tests a second time that way)."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bin() -> Path | None:
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "postgres").exists()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    def __init__(self, root: Path | None = None) -> None:
        """``root``: where its files go; by default a fresh dir in /tmp that the postgres
        user can reach (pytest's own tmp dirs are private to root)."""
        found = pg_bin()
        if found is None:
            raise RuntimeError("PostgreSQL is not installed (apt install postgresql)")
        self.bin = found
        self.root = root or Path(tempfile.mkdtemp(prefix="batchyard-pg-"))
        self.root.chmod(0o700)
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.port = _free_port()
        self.password = secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self._count = 0
        # initdb and postgres refuse to run as root: as root, run them as 'postgres'
        self.user = "postgres" if os.geteuid() == 0 else None

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.user:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, self.sock, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        made = subprocess.run(self._as_owner([str(self.bin / "initdb"), "-D", str(self.data),
                                              "-U", "batchyard", "-A", "scram-sha-256",
                                              f"--pwfile={pwfile}", "--no-sync", "-E",
                                              "UTF8"]),
                              capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stdout[-1000:]}{made.stderr[-2000:]}")
        pwfile.unlink()
        self.launch()

    def launch(self) -> None:
        """Start the server on its data dir (made by ``start``) and wait until it answers."""
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 (lives with the server)
        self.proc = subprocess.Popen(
            self._as_owner([str(self.bin / "postgres"), "-D", str(self.data),
                            "-p", str(self.port), "-k", str(self.sock),
                            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                            "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                            "-c", "max_connections=400", "-c", "shared_buffers=64MB"]),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1",
                                    "-p", str(self.port)], capture_output=True)
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not start: "
                           + (self.root / "postgres.log").read_text()[-2000:])

    def shutdown(self, mode: str) -> None:
        """Ask the server to stop (pg_ctl's smart, fast or immediate) without waiting: a
        smart shutdown waits for every session to end, refusing new ones meanwhile."""
        subprocess.run(self._as_owner([str(self.bin / "pg_ctl"), "stop", "-D", str(self.data),
                                       "-m", mode, "--no-wait"]),
                       capture_output=True, timeout=60, check=True)

    def wait_stopped(self, timeout: float = 60) -> None:
        assert self.proc is not None
        self.proc.wait(timeout)
        self.proc = None

    def url(self, database: str = "postgres") -> str:
        return (f"postgresql+psycopg://batchyard:{self.password}@127.0.0.1:{self.port}/"
                f"{database}")

    def create_database(self) -> str:
        import psycopg

        self._count += 1
        name = f"by_{os.getpid()}_{self._count}_{secrets.token_hex(3)}"
        with psycopg.connect(self.url().replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)  # fast shutdown
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


ACTIVE: Postgres | None = None  # the session's server, when the tests run on PostgreSQL


def wanted() -> bool:
    return os.environ.get("BATCHYARD_TEST_DB", "").lower() in ("postgresql", "postgres", "pg")
