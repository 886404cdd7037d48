"""Server process entry point: ``python -m batchyard.server``. Binds (127.0.0.1 by default),
migrates the database, starts the reconciler thread and serves the API."""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

import uvicorn

from batchyard.config import database_url, ensure_token, home, write_server_info
from batchyard.server.app import create_app
from batchyard.server.context import ServerContext
from batchyard.server.reconciler import Reconciler
from batchyard.store.db import Database

DEFAULT_PORT = 8742


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        if port != DEFAULT_PORT:
            raise
        sock.bind((host, 0))  # the default port is taken: any free one will do
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def serve(host: str, port: int) -> int:
    lock = open(home() / "server.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"another batchyard server already runs on {home()}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    db = Database(database_url())
    db.migrate()
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    url = f"http://{shown}:{bound_port}"
    ctx = ServerContext(db=db, admin_token=ensure_token(), api_url=url)
    app = create_app(ctx)
    stop = threading.Event()
    thread = threading.Thread(target=Reconciler(ctx).run, args=(stop,), name="reconciler",
                              daemon=True)
    thread.start()
    from batchyard.backends.local import prestart

    prestart()
    write_server_info(url, os.getpid())
    logging.getLogger("batchyard.server").info("serving on %s (home %s)", url, home())
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)

    def _stop(*_: Any) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        ctx.kick()
        thread.join(timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="batchyard-server")
    parser.add_argument("--host", default=os.environ.get("BATCHYARD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("BATCHYARD_PORT", DEFAULT_PORT)))
    args = parser.parse_args(argv)
    return serve(args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
