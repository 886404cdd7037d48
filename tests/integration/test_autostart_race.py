"""CLI calls made together on a home with no server (a script's `&`, make -j) all succeed,
and exactly one server is started for them (issue 16, item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from yardkit import Yard, pids_where


def test_concurrent_cli_calls_start_one_server(tmp_path: Path) -> None:
    fresh = Yard(tmp_path / "home", tmp_path)
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "batchyard.cli.main", "workspace",
                                   "list", "-o", "json"], env=fresh.env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(6)]
        results = [(p.wait(120), *p.communicate()) for p in procs]
        for rc, out, err in results:
            assert rc == 0, (rc, out, err)
        home = str(fresh.home).encode()
        servers = pids_where(lambda blob: home in blob and b"batchyard.server" in blob)
        assert len(servers) == 1, servers
        assert fresh.server_pid in servers
    finally:
        fresh.stop()
