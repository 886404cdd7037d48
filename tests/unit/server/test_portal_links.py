"""One-time portal sign-in links (issue 33 #19), against a real SQLite store (migrated):
a link leads once to its page, then never again; an expired one never; the database holds
only the token's sha256; an outside page is never where a link leads."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sqlalchemy import select

from batchyard.server.portal import links
from batchyard.store.db import Database
from batchyard.store.models import PortalLink


def _db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    return db


def test_a_link_works_once(tmp_path: Path) -> None:
    db = _db(tmp_path)
    token = links.make(db, "/ws/default/exp/e/jobs/j")
    with db.session() as s:
        stored = list(s.scalars(select(PortalLink.token_hash)))
    assert stored == [hashlib.sha256(token.encode()).hexdigest()] and token not in stored
    assert links.consume(db, token) == ("/ws/default/exp/e/jobs/j", None, False)
    assert links.consume(db, token) is None  # consumed
    assert links.consume(db, "not-a-token") is None and links.consume(db, "") is None


def test_an_expired_link_is_refused_and_swept(tmp_path: Path) -> None:
    db = _db(tmp_path)
    old = links.make(db, "/", lifetime=-1.0)
    assert links.consume(db, old) is None
    links.make(db, "/", lifetime=-1.0)
    links.make(db, "/")  # making one sweeps the expired ones
    with db.session() as s:
        assert len(list(s.scalars(select(PortalLink.token_hash)))) == 1


def test_a_link_leads_only_to_a_page_of_this_portal(tmp_path: Path) -> None:
    db = _db(tmp_path)
    for outside in ("https://evil.example/", "//evil.example/x", "javascript:alert(1)"):
        assert links.consume(db, links.make(db, outside)) == ("/", None, False)


def test_a_link_signs_in_whoever_asked_for_it(tmp_path: Path) -> None:
    db = _db(tmp_path)
    assert links.consume(db, links.make(db, "/", user_id=7)) == ("/", 7, False)
    assert links.consume(db, links.make(db, "/", home_token=True)) == ("/", None, True)
