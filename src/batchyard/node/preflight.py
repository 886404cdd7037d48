"""Pre-flight checks of a gang (job or cluster ``preflight: network|gpu|all``; a lone GPU node
gets the GPU check), run by every node's launcher after the gang has met and before
preparation and ranks.

Network: each node listens on a port it publishes with the gang's rendezvous ports (nodes know
only the server, not each other); every node connects to every peer (reachability both ways,
each direction seen by the node that dials), then leads a short ping-pong with each higher
ranked peer using ``cluster diagnose``'s own measurement (``diagnose.probe.pingpong``: 8 B
latency, 4 MiB bandwidth) over that TCP connection. GPU: ``node/gpuhealth.py``.

A node only measures and reports (``preflight`` in its status); the server sees every node's
figures, decides who is to blame (``server/services/preflight.py``) and answers through the
attempt's control: go on, or stop (the gang is placed again without the blamed nodes). The
listener stays open until that answer, so a slower peer can still reach this node.
Standard library only (the launcher runs under ``python -S``)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from batchyard.diagnose.probe import LARGE, SMALL, Transport, pingpong
from batchyard.launchplan import NodePlan

BUDGET = 30.0  # seconds, the whole pre-flight: measuring and waiting for the server's verdict
MEASURE_SHARE = 0.75  # of the budget for this node's own measurements
CONNECT_TIMEOUT = 2.0
IO_TIMEOUT = 5.0
VERDICT_GRACE = 10.0  # past the budget: the other nodes' reports, the server's pass
LAT_REPS = 20
BW_REPS = 2  # round trips of 4 MiB each way (after diagnose's 2 warm-ups)
KINDS = {"network": ("network",), "gpu": ("gpu",), "all": ("network", "gpu")}


class OutOfTime(Exception):
    """The pre-flight's measuring time ran out in the middle of a ping-pong."""


class PairLink:
    """The part of diagnose's Transport that ``pingpong`` uses, over one TCP connection
    (rank 0 leads, rank 1 follows)."""

    name = "tcp"
    size = 2

    def __init__(self, sock: socket.socket, rank: int, deadline: float | None = None) -> None:
        self.sock, self.rank, self.deadline = sock, rank, deadline

    def buffer(self, nbytes: int) -> bytearray:
        return bytearray(nbytes)

    def send(self, buf: Any, dest: int) -> None:
        self.sock.sendall(buf)

    def recv(self, buf: Any, src: int) -> None:
        view, got = memoryview(buf), 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if not n:
                raise ConnectionError("the peer closed the connection")
            got += n
            if self.deadline is not None and time.time() > self.deadline:
                raise OutOfTime


def measure(sock: socket.socket, rank: int, deadline: float | None = None
            ) -> tuple[float, float]:
    """(one-way latency in us, bandwidth in MB/s), as ``cluster diagnose`` measures them;
    both sides call it, rank 0 leading (and keeping to ``deadline``)."""
    link = cast(Transport, PairLink(sock, rank, deadline))
    peer = 1 - rank
    lat = pingpong(link, peer, SMALL, LAT_REPS)
    bw_time = pingpong(link, peer, LARGE, BW_REPS)
    return lat * 1e6, LARGE / bw_time / 1e6


def _error(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"timeout {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or type(exc).__name__


def _line(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
        if len(data) > 4096:
            raise ValueError("header too long")
    value = json.loads(data)
    return value if isinstance(value, dict) else {}


def _send(sock: socket.socket, value: dict[str, Any]) -> None:
    sock.sendall(json.dumps(value).encode() + b"\n")


class Listener:
    """Answers peers' hellos and follows their ping-pongs until closed."""

    def __init__(self, node_rank: int) -> None:
        self.node_rank = node_rank
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="preflight-listen",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(IO_TIMEOUT)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                header = _line(conn)
                _send(conn, {"node_rank": self.node_rank})
                if header.get("op") == "pingpong":
                    measure(conn, 1)
            except (OSError, ValueError):
                pass  # the dialling peer records what went wrong

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


def dial(addr: str, port: int, me: int, op: str, timeout: float = CONNECT_TIMEOUT
         ) -> socket.socket:
    """A connection to a peer's listener that has answered our hello. A refusal is retried
    within the timeout (the peer's listener is up before its port is published, but an
    address may come up late)."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(0.05, deadline - time.monotonic())
        try:
            sock = socket.create_connection((addr, port), timeout=left)
            break
        except ConnectionRefusedError:
            if time.monotonic() + 0.1 >= deadline:
                raise
            time.sleep(0.1)
    try:
        sock.settimeout(IO_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(sock, {"op": op, "from": me})
        _line(sock)
    except BaseException:
        sock.close()
        raise
    return sock


class Preflight:
    """One node's share of the pre-flight of one attempt."""

    def __init__(self, plan: NodePlan, say: Callable[[str], None]) -> None:
        self.plan, self.say = plan, say
        self.kinds = KINDS.get(str(plan.preflight), ())
        self.listener: Listener | None = None
        self.peers: list[tuple[str, int]] = []
        self.started = time.time()

    @classmethod
    def of(cls, plan: NodePlan, say: Callable[[str], None]) -> Preflight | None:
        if not plan.preflight or plan.preflight not in KINDS:
            return None
        if plan.num_nodes < 2 and "network" in KINDS[plan.preflight]:
            return None  # (the server sends a lone node its GPU check only)
        return cls(plan, say)

    # --- before and after the rendezvous --------------------------------------------------

    def ports(self) -> list[int]:
        """The port to publish with the gang's own (last in this node's list)."""
        if "network" not in self.kinds:
            return []
        self.listener = Listener(self.plan.node_rank)
        return [self.listener.port]

    def meet(self, everyone: list[list[int]]) -> None:
        if self.listener is not None:
            self.peers = [(addr, int(ports[-1])) for addr, ports in
                          zip(self.plan.node_addrs, everyone, strict=True)]

    # --- measuring ------------------------------------------------------------------------

    def measure(self) -> dict[str, Any]:
        """What this node saw, as it goes into its status (``preflight``)."""
        self.started = time.time()
        result: dict[str, Any] = {"kinds": list(self.kinds), "node": self.plan.node_name,
                                  "node_rank": self.plan.node_rank}
        if "network" in self.kinds:
            result["links"] = self._network()
        if "gpu" in self.kinds:
            from batchyard.node.gpuhealth import check

            result["gpu"] = check(self.plan, self.started + BUDGET * MEASURE_SHARE)
        result["took_s"] = round(time.time() - self.started, 3)
        self._log(result)
        return result

    def _network(self) -> list[dict[str, Any]]:
        me, names = self.plan.node_rank, self.plan.node_names
        links: dict[int, dict[str, Any]] = {}

        def hello(peer: int) -> None:
            addr, port = self.peers[peer]
            link: dict[str, Any] = {"peer": names[peer], "peer_rank": peer,
                                    "addr": f"{addr}:{port}"}
            start = time.perf_counter()
            try:
                dial(addr, port, me, "hello").close()
                link.update(ok=True, connect_ms=round((time.perf_counter() - start) * 1e3, 2))
            except (OSError, ValueError) as exc:
                link.update(ok=False, error=_error(exc, CONNECT_TIMEOUT))
            links[peer] = link

        threads = [threading.Thread(target=hello, args=(p,), daemon=True)
                   for p in range(len(self.peers)) if p != me]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CONNECT_TIMEOUT + IO_TIMEOUT + 1)
        share = BUDGET * MEASURE_SHARE / (2 if "gpu" in self.kinds else 1)
        deadline = self.started + share
        for peer in sorted(links):
            link = links[peer]
            if peer < me or not link.get("ok"):
                continue
            if time.time() > deadline:
                link["note"] = "bandwidth not measured: out of time"
                continue
            addr, port = self.peers[peer]
            try:
                with dial(addr, port, me, "pingpong") as sock:
                    lat, bw = measure(sock, 0, deadline)
                link.update(latency_us=round(lat, 1), bandwidth_MBps=round(bw, 1))
            except OutOfTime:  # reachable: a slow link, or many pairs; noted, not blamed
                link["note"] = f"bandwidth probe cut short: over {share:g} s"
            except (OSError, ValueError) as exc:
                link.update(ok=False, error=f"bandwidth probe failed: {_error(exc, IO_TIMEOUT)}")
        return [links[p] for p in sorted(links)]

    def _log(self, result: dict[str, Any]) -> None:
        for link in result.get("links", []):
            if not link.get("ok"):
                self.say(f"pre-flight: {link['peer']} at {link['addr']}: FAILED "
                         f"({link.get('error')})")
            elif "bandwidth_MBps" in link:
                self.say(f"pre-flight: {link['peer']} at {link['addr']}: ok, connect "
                         f"{link['connect_ms']:g} ms, latency {link['latency_us']:g} us (8 B), "
                         f"bandwidth {link['bandwidth_MBps']:g} MB/s (4 MiB)")
            else:
                note = f"; {link['note']}" if "note" in link else ""
                self.say(f"pre-flight: {link['peer']} at {link['addr']}: ok, connect "
                         f"{link['connect_ms']:g} ms{note}")
        gpu = result.get("gpu")
        if gpu is not None:
            self.say(f"pre-flight: gpu: {'ok' if gpu.get('ok') else 'FAILED'}: "
                     f"{gpu.get('message')}")
        self.say(f"pre-flight: measured in {result['took_s']:g} s; waiting for the gang")

    # --- waiting for the server -----------------------------------------------------------

    def await_verdict(self, verdict: Callable[[], dict[str, Any] | None],
                      stop_reason: Callable[[], dict[str, Any] | None],
                      pause: Callable[[], None]) -> tuple[str, dict[str, Any]]:
        """("ready", {}) to go on; else the state this node's share ends in. A stop the
        server sends with its verdict (the gang placed again, or failed) wins. The wait
        allows for the gang's slowest node: its own measuring ends within the budget too."""
        deadline = self.started + BUDGET + VERDICT_GRACE
        try:
            while True:
                stop = stop_reason()
                if stop:
                    self.say(f"pre-flight: stopping ({stop['state']}): {stop['message']}")
                    return stop["state"], {"message": stop["message"]}
                found = verdict()
                if found is not None and found.get("ok"):
                    self.say(str(found.get("message") or "pre-flight passed"))
                    return "ready", {}
                if found is not None:  # a failed verdict: its stop follows on the same poll
                    deadline = min(deadline, time.time() + 5.0)
                if time.time() > deadline:
                    message = (str(found.get("message")) if found is not None else
                               f"pre-flight: no verdict within {BUDGET + VERDICT_GRACE:g} s "
                               "(a node of the gang did not report its checks)")
                    self.say(message)
                    return "failed", {"message": message}
                pause()
        finally:
            self.close()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
