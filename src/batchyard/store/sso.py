"""Single sign-ons in progress (server.sso): a device authorization that a CLI polls, or a
portal sign-in waiting for the provider's redirect. In the database, so that any process
of a ``--workers`` server can go on with it; each row is used once and lives minutes.

A copy of the database signs nobody in: a row is found by the sha256 of a handle that only
the client holds (the CLI's request handle, the portal's ``state``), and the secrets that
finish the flow (the provider's device code, the PKCE verifier) are held by the client and
sent back with it, never stored here."""

from __future__ import annotations

from sqlalchemy import Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from batchyard.store.models import Base, now


class SsoRequest(Base):
    __tablename__ = "sso_requests"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # device | portal
    nonce: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, default=now)
    expires: Mapped[float] = mapped_column(Float, index=True)
    client: Mapped[str | None] = mapped_column(String(64))
    # device: how often the provider may be asked, and not before when next
    interval: Mapped[float] = mapped_column(Float, default=5.0)
    next_poll: Mapped[float] = mapped_column(Float, default=0.0)
    # portal: the browser that started it (sha256 of its cookie), where it goes back to
    binding: Mapped[str | None] = mapped_column(String(64))
    redirect_uri: Mapped[str | None] = mapped_column(Text)
    next_url: Mapped[str | None] = mapped_column(Text)
