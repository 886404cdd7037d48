"""Server process entry point: ``python -m batchyard.server``. Binds (127.0.0.1 by default),
migrates the database, starts the reconciler thread and serves the API.

Bearer tokens must not cross a network in clear, so a server that leaves loopback serves HTTPS
(its own CA under ``$BATCHYARD_HOME/tls``, or a given certificate) unless told
``--insecure-http``; on loopback it stays plain HTTP unless ``--tls``/``--tls-cert``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import uvicorn

from batchyard.config import (
    database_url,
    ensure_token,
    home,
    make_state_private,
    write_server_info,
)
from batchyard.errors import SpecError
from batchyard.server import notify, queue_mirror
from batchyard.server import workers as worker_pool
from batchyard.server.app import create_app
from batchyard.server.balance import Balance, ShedConnections, make_shared
from batchyard.server.bus import Bus
from batchyard.server.context import ServerContext
from batchyard.server.reconciler import Reconciler
from batchyard.server.sso import install as install_sso
from batchyard.server.sso.settings import OidcSettings
from batchyard.server.sso.settings import parse as parse_sso
from batchyard.store.db import Database

DEFAULT_PORT = 8742
WILDCARD = ("0.0.0.0", "::", "")
log = logging.getLogger("batchyard.server")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: addresses no other machine can reach."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere, so it is not loopback


def decide_tls(host: str, tls_cert: str | None, tls_key: str | None, force_tls: bool,
               insecure_http: bool) -> str:
    """How to serve: "http", "self-signed" (the home's own CA) or "given" (--tls-cert/key).
    Pure, so the rule is testable; inconsistent flags raise SpecError naming the flag."""
    if bool(tls_cert) != bool(tls_key):
        given, missing = ("--tls-cert", "--tls-key") if tls_cert else ("--tls-key",
                                                                          "--tls-cert")
        raise SpecError(f"{given} needs {missing} too (the certificate and its private key)")
    if insecure_http and tls_cert:
        raise SpecError("--insecure-http contradicts --tls-cert/--tls-key: choose one")
    if insecure_http and force_tls:
        raise SpecError("--insecure-http contradicts --tls: choose one")
    if tls_cert:
        return "given"
    if force_tls:
        return "self-signed"
    if is_loopback(host) or insecure_http:
        return "http"
    return "self-signed"


def _local_addresses() -> list[str]:
    """This machine's addresses, for a leaf served on 0.0.0.0 (best effort, no network
    traffic: a UDP connect only picks a route)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.append(str(info[4][0]))
    for family, probe in ((socket.AF_INET, "10.255.255.255"), (socket.AF_INET6, "fd00::1")):
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.connect((probe, 9))
            found.append(str(udp.getsockname()[0]))
    return [a for a in dict.fromkeys(found) if a not in WILDCARD and "%" not in a]


def _url_host(bound_host: str) -> str:
    """A concrete address for the URL: local clients reach a wildcard bind on loopback."""
    if bound_host == "0.0.0.0":
        return "127.0.0.1"
    if bound_host == "::":
        return "[::1]"
    return f"[{bound_host}]" if ":" in bound_host else bound_host


def _tls_setup(mode: str, host: str, bound_host: str, tls_cert: str | None,
               tls_key: str | None) -> tuple[str | None, str | None, str | None]:
    """(certificate chain, key, CA to publish at /api/v1/ca.pem); all None for plain HTTP."""
    if mode == "http":
        return None, None, None
    if mode == "given":
        return tls_cert, tls_key, None
    from batchyard.server.tls import ca_fingerprint, ensure_server_tls

    hosts = [host, bound_host]
    if host.strip("[]") in WILDCARD or bound_host in WILDCARD:
        hosts += _local_addresses()
    files = ensure_server_tls(home(), hosts)
    log.info("TLS with the home's CA %s (sha256 %s): clients on other machines set "
             "BATCHYARD_CA to a copy of it, or BATCHYARD_CA_SHA256 to that sha256",
             files.ca, ca_fingerprint(files.ca))
    return str(files.cert), str(files.key), str(files.ca)


def preferred_port() -> tuple[int, bool]:
    """(port, explicit). Without --port or BATCHYARD_PORT, a restarted server comes back on
    the port it had: running launchers and agents hold that URL in their tickets."""
    if os.environ.get("BATCHYARD_PORT"):
        return int(os.environ["BATCHYARD_PORT"]), True
    try:
        previous = json.loads((home() / "server.json").read_text())["url"]
        port = urlsplit(previous).port
    except (OSError, ValueError, KeyError, TypeError):
        port = None
    return (port or DEFAULT_PORT), False


BACKLOG = 2048  # a team's `job logs -f` followers and CI jobs may all connect at once


def _bind(host: str, port: int, explicit: bool = True,
          reuse_port: bool = False) -> socket.socket:
    """The listening socket, made with ``IPPROTO_TCP`` on purpose: asyncio sets TCP_NODELAY
    only on sockets whose ``proto`` says TCP, and accepted sockets inherit it. Made with
    proto 0, every response on a reused connection waited ~40 ms (Nagle's algorithm holding
    the last segment until the client's delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # the workers of one server: the kernel spreads connections over them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited where supported
    try:
        sock.bind((host, port))
    except OSError:
        if explicit and port != DEFAULT_PORT:
            raise
        sock.bind((host, 0))  # the preferred port is taken: any free one will do
    sock.listen(BACKLOG)
    sock.set_inheritable(False)
    return sock


def _raise_fd_limit() -> None:
    """One descriptor per connection: a thousand `job logs -f` followers need more than the
    usual soft limit of 1024 (the hard limit is the ceiling, unchanged)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def serve(host: str, port: int, *, tls_cert: str | None = None, tls_key: str | None = None,
          force_tls: bool = False, insecure_http: bool = False,
          port_explicit: bool = True, workers: int = 1,
          oidc: OidcSettings | None = None) -> int:
    mode = decide_tls(host, tls_cert, tls_key, force_tls, insecure_http)
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not os.path.isfile(path):
            raise SpecError(f"{flag} {path}: no such file")
    make_state_private()  # the database, log and lock: 0600 before they are opened
    lock = open(home() / "server.lock", "a+")  # noqa: SIM115 (never truncated by a loser)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"another batchyard server already runs on {home()}", file=sys.stderr)
        return 1
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))  # clients wait for a server that holds the home (starting)
    lock.flush()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_fd_limit()
    from batchyard.server.telemetry import instruments

    instruments.prepare(home() / "prometheus")  # /metrics: every process's counters
    db = Database(database_url())
    worker_pool.check_database(workers, db.engine.dialect.name)
    db.migrate()
    sock = _bind(host, port, port_explicit, reuse_port=workers > 1)
    bound_host, bound_port = sock.getsockname()[:2]
    certfile, keyfile, tls_ca = _tls_setup(mode, host, bound_host, tls_cert, tls_key)
    scheme = "http" if mode == "http" else "https"
    url = f"{scheme}://{_url_host(bound_host)}:{bound_port}"
    if mode == "http" and not is_loopback(bound_host):
        log.warning("--insecure-http: serving plain HTTP on %s:%s; bearer tokens and job "
                    "secrets cross the network IN CLEAR. Drop --insecure-http to serve HTTPS.",
                    bound_host, bound_port)
    ctx = ServerContext(db=db, admin_token=ensure_token(), api_url=url, tls_ca=tls_ca,
                        bind_host=bound_host,
                        tls_files=(keyfile,) if keyfile else ())
    install_sso(ctx, oidc)
    if oidc is not None:
        threading.Thread(target=_probe_provider, args=(ctx,), name="oidc-probe",
                         daemon=True).start()
    pool = None
    balance = None
    if workers > 1:
        worker_pool.become(0, str(os.getpid()))
        extra = [_bind(bound_host, bound_port, True, reuse_port=True)
                 for _ in range(workers - 1)]
        shared = make_shared(workers)
        balance = Balance(shared, 0, workers)
        pool = worker_pool.Pool(extra, {"url": url, "cert": certfile, "key": keyfile,
                                        "tls_ca": tls_ca, "balance_fd": shared,
                                        "processes": workers, "bind_host": bound_host,
                                        "oidc": oidc.to_spec() if oidc else None})

    def ready() -> None:
        if pool is not None:
            pool.start()
            log.info("serving with %d processes (workers' pids %s)", workers,
                     " ".join(map(str, pool.pids())))
        write_server_info(url, os.getpid())
        log.info("serving on %s (home %s)", url, home())

    try:
        _serve_here(ctx, sock, certfile, keyfile, ready, balance)
    finally:
        if pool is not None:
            pool.stop()
    return 0


def _probe_provider(ctx: ServerContext) -> None:
    """Say in the log, at start, whether the OpenID provider answers as configured (sign-ins
    ask it again whenever they need it: a provider down now does not stop the server)."""
    from batchyard.errors import BatchyardError

    provider = ctx.oidc
    try:
        provider.metadata()
        provider.keys()
    except BatchyardError as exc:
        log.warning("single sign-on: %s", exc.message)
        return
    log.info("single sign-on with the OpenID provider %s (client %s)",
             provider.issuer, provider.settings.client_id)


def run_worker(spec: dict[str, Any]) -> int:
    """A worker process of a ``--workers`` server (``server.workers``)."""
    worker_pool.die_with(int(spec["supervisor"]))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s "
                        f"%(name)s[w{spec['index']}]: %(message)s")
    _raise_fd_limit()
    worker_pool.become(int(spec["index"]), str(spec["supervisor"]))
    ctx = ServerContext(db=Database(database_url()), admin_token=ensure_token(),
                        api_url=spec["url"], tls_ca=spec.get("tls_ca"),
                        bind_host=str(spec.get("bind_host") or "127.0.0.1"),
                        tls_files=(spec["key"],) if spec.get("key") else ())
    if spec.get("oidc"):
        install_sso(ctx, OidcSettings.from_spec(spec["oidc"]))
    sock = socket.socket(fileno=int(spec["fd"]))
    balance = Balance(int(spec["balance_fd"]), int(spec["index"]), int(spec["processes"]))
    _serve_here(ctx, sock, spec.get("cert"), spec.get("key"), lambda: None, balance)
    return 0


def _serve_here(ctx: ServerContext, sock: socket.socket, certfile: str | None,
                keyfile: str | None, ready: Callable[[], None],
                balance: Balance | None = None) -> None:
    """What every server process runs: the reconciler and the sweep driver (acting only
    while this process holds the lease, on PostgreSQL), the wake-ups shared with the other
    processes on its database, and the API on ``sock``."""
    from batchyard.server.leader import Leadership

    ctx.leader = Leadership(ctx.db.engine)
    from batchyard.server.registry import Registry

    ctx.registry = Registry(ctx.db, ctx.node_url or ctx.api_url)
    ctx.registry.beat(leading=False)  # listed before its first launch
    app = create_app(ctx)
    bus = _start_bus(ctx)
    if worker_pool.index() is not None:
        worker_pool.serve_privately(app, worker_pool.index() or 0)
    stop = threading.Event()
    thread = threading.Thread(target=Reconciler(ctx).run, args=(stop,), name="reconciler",
                              daemon=True)
    thread.start()
    from batchyard.server.sweep_driver import SweepDriver

    sweeper = threading.Thread(target=SweepDriver(ctx).run, args=(stop,), name="sweeps",
                               daemon=True)
    sweeper.start()
    from batchyard.backends.local import prestart
    from batchyard.backends.machines import set_exec_hook
    from batchyard.server.services.agents import exec_hook

    prestart()
    set_exec_hook(exec_hook(ctx.db))
    from batchyard.server.telemetry import instruments

    instruments.get()  # prometheus-client and this process's files, before the first request
    # What start-up made (modules, the app, the models) lives as long as the server: out of
    # the collector's sight, a full collection no longer walks it (they paused every request
    # for 60-110 ms, several times a second under load: the submits' p99).
    gc.collect()
    gc.freeze()
    ready()
    # uvloop (a dependency) is uvicorn's loop when installed: ~0.7 ms less server CPU a
    # submit than asyncio's. No proxy sits in front, and nothing reads a client's address,
    # so X-Forwarded-* headers are not parsed (a middleware layer per request).
    public = app if balance is None else ShedConnections(app, balance)
    config = uvicorn.Config(public, log_level="warning", access_log=False, lifespan="off",
                            ssl_certfile=certfile, ssl_keyfile=keyfile, proxy_headers=False)
    server = uvicorn.Server(config)
    if balance is not None:
        balance.publish_from(server, stop)

    def _stop(*_: Any) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        ctx.kick()
        thread.join(timeout=5)
        sweeper.join(timeout=5)
        if bus is not None:
            notify.set_relay(None)
            bus.stop()
        ctx.leader.release()
        if not worker_pool.index():  # the server's own process (its workers share the row)
            ctx.registry.leave()


def _start_bus(ctx: ServerContext) -> Bus | None:
    """On PostgreSQL, other server processes may share the database: hear their wake-ups."""
    if ctx.db.engine.dialect.name != "postgresql":
        return None
    bus = Bus(ctx.db.engine, lambda message: notify.deliver(message, ctx.kick_here,
                                                            queue_mirror.mark_dirty))
    notify.set_relay(bus.publish)
    bus.start()
    return bus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="batchyard-server")
    parser.add_argument("--host", default=os.environ.get("BATCHYARD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=None,
                        help="default: the port this home's server had last, else 8742")
    parser.add_argument("--tls-cert", metavar="PATH",
                        help="serve HTTPS with this certificate (chain) instead of the "
                        "home's own CA; needs --tls-key")
    parser.add_argument("--tls-key", metavar="PATH", help="private key of --tls-cert")
    parser.add_argument("--tls", action="store_true",
                        help="serve HTTPS with the home's own CA even on loopback")
    parser.add_argument("--insecure-http", action="store_true",
                        help="plain HTTP on a non-loopback address (tokens cross in clear)")
    parser.add_argument("--workers", default=os.environ.get("BATCHYARD_WORKERS"),
                        help="server processes behind the port, or 'auto' (one per core); "
                        "more than one needs PostgreSQL (default 1)")
    sso_flags(parser)
    args = parser.parse_args(argv)
    if os.environ.get(worker_pool.ENV):
        return run_worker(json.loads(os.environ.pop(worker_pool.ENV)))
    port, explicit = (args.port, True) if args.port is not None else preferred_port()
    try:
        oidc = parse_sso(args.oidc_issuer, args.oidc_client_id, args.oidc_client_secret_file,
                     args.oidc_admin_group, args.oidc_group_role, args.oidc_login_lifetime)
        return serve(args.host, port, tls_cert=args.tls_cert, tls_key=args.tls_key,
                     force_tls=args.tls, insecure_http=args.insecure_http,
                     port_explicit=explicit, workers=worker_pool.parse_count(args.workers),
                     oidc=oidc)
    except SpecError as exc:
        print(f"batchyard-server: {exc.message}", file=sys.stderr)
        return 2


def sso_flags(parser: argparse.ArgumentParser) -> None:
    """Single sign-on's flags (`batchyard server start --help` explains them)."""
    env = os.environ.get
    parser.add_argument("--oidc-issuer", default=env("BATCHYARD_OIDC_ISSUER"))
    parser.add_argument("--oidc-client-id", default=env("BATCHYARD_OIDC_CLIENT_ID"))
    parser.add_argument("--oidc-client-secret-file",
                        default=env("BATCHYARD_OIDC_CLIENT_SECRET_FILE"))
    parser.add_argument("--oidc-admin-group", action="append")
    parser.add_argument("--oidc-group-role", action="append", metavar="GROUP=WORKSPACE:ROLE")
    parser.add_argument("--oidc-login-lifetime", metavar="DURATION")


if __name__ == "__main__":
    sys.exit(main())
