"""What every service needs, created once per server process."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from batchyard.config import home
from batchyard.server import notify
from batchyard.store.db import Database

if TYPE_CHECKING:
    from batchyard.server.batching import WriteBatcher


@dataclass
class ServerContext:
    db: Database
    admin_token: str
    api_url: str = ""
    bind_host: str = "127.0.0.1"  # the address the server listens on (/metrics: loopback)
    tls_ca: str | None = None  # the CA published at /api/v1/ca.pem (None: plain HTTP)
    node_url: str = ""
    # the server's TLS key file: a credential no job may name (services/pathcheck.py)
    tls_files: tuple[str, ...] = ()
    wake: threading.Event = field(default_factory=threading.Event)  # the reconciler's loop
    # a scheduling pass is wanted (a submit, a resize): set with ``wake`` by ``kick``; an
    # attempt to look at wakes the loop alone (server/followups.py)
    kicked: threading.Event = field(default_factory=threading.Event)
    # server.leader.Leadership: whether this process runs the reconciler (None: always)
    leader: Any = None
    registry: Any = None  # server.registry.Registry: this server's row in ``servers``
    # security.principal.Principal of the home's token (its OS user), once made a user
    owner: Any = None
    # How clients may sign in (`batchyard login`, GET /api/v1/auth/methods): a personal
    # token always; single sign-on adds its own ({"kind": ..., and what a client needs})
    login_methods: list[dict[str, Any]] = field(default_factory=lambda: [{"kind": "token"}])
    # server.sso.provider.Provider when single sign-on is on (server.sso.install)
    oidc: Any = None
    _batcher: WriteBatcher | None = field(default=None, repr=False)

    @property
    def writes(self) -> WriteBatcher:
        """Submits written together (server.batching.WriteBatcher); one per process, made on
        first use, from the event loop."""
        if self._batcher is None:
            from batchyard.server.batching import WriteBatcher

            self._batcher = WriteBatcher(self.db, self.kick)
        return self._batcher

    @property
    def snapshots(self) -> Path:
        path = home() / "snapshots"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def kick(self) -> None:
        """Wake the reconciler now rather than at its next tick: here, or in the server
        process on this database that runs it."""
        self.kick_here()
        if self.leader is not None and not self.leader.leads_now():
            notify.relay("kick")

    def kick_here(self) -> None:
        """Wake this process's reconciler for a scheduling pass (another's kick, relayed)."""
        self.kicked.set()
        self.wake.set()


def kick_after_commit(session: Session) -> None:
    """Ask for a reconciler pass once this transaction has committed (waking it earlier
    would let it look before the change is visible, then sleep a whole tick)."""
    session.info["kick"] = True
