"""Pure parts of identities and authorisation: role names and order, the per-address limit
on failed sign-ins, what the audit trail keeps of a message, ``--since``, the per-process
cache's generations (a value read before a change is not kept after it)."""

from __future__ import annotations

import time

import pytest

from batchyard.errors import SpecError
from batchyard.server.security import cache, ratelimit
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import audit


def test_roles_are_ordered_and_named_as_azure_names_them() -> None:
    assert Role.reader < Role.contributor < Role.owner
    assert Role.parse(" Owner ") is Role.owner
    with pytest.raises(SpecError, match="role: 'superuser' is not a role; one of reader, "
                       "contributor, owner"):
        Role.parse("superuser")


def test_an_admin_is_above_every_role_and_a_job_has_none() -> None:
    admin = Principal(admin=True, name="root")
    assert admin.role_in("anything") is Role.owner and admin.visible("x")
    alice = Principal(name="alice", roles={"a": Role.reader})
    assert alice.role_in("a") is Role.reader and alice.role_in("b") is None
    job = Principal(kind="job", job_id=3, roles={"a": Role.owner})
    assert job.role_in("a") is None and not job.visible("a")


def test_failed_sign_ins_block_an_address_for_a_window(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    ratelimit.reset()
    monkeypatch.setattr(ratelimit, "LIMIT", 3)
    monkeypatch.setattr(ratelimit, "WINDOW", 60.0)
    assert not ratelimit.failed("10.0.0.1") and not ratelimit.failed("10.0.0.1")
    assert ratelimit.retry_after("10.0.0.1") is None
    assert ratelimit.failed("10.0.0.1")  # the third
    assert 59 < (ratelimit.retry_after("10.0.0.1") or 0) <= 60
    assert ratelimit.retry_after("10.0.0.2") is None  # per address
    # what other processes saw counts too
    assert ratelimit.failed("10.0.0.3", elsewhere=2)
    ratelimit.reset()


def test_old_failures_leave_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    ratelimit.reset()
    monkeypatch.setattr(ratelimit, "LIMIT", 2)
    monkeypatch.setattr(ratelimit, "WINDOW", 0.2)
    assert not ratelimit.failed("h")
    time.sleep(0.3)
    assert not ratelimit.failed("h")  # the first one is out of the window
    ratelimit.reset()


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "ok"), (201, "ok"), (303, "ok"), (101, "ok"), (401, "failed"), (429, "failed"),
    (403, "denied"), (404, "refused"), (409, "refused"), (422, "refused"), (500, "error"),
    (503, "error")])
def test_outcomes(status: int, outcome: str) -> None:
    assert audit.outcome_of(status) == outcome


def test_the_audit_trail_never_keeps_a_credential() -> None:
    text = "user named pat.AbCdEf123456xyz or job.0123456789abcdef or node.QWERTYUIOPas"
    kept = audit.scrub(text)
    assert kept is not None
    assert "AbCdEf" not in kept and "0123456789" not in kept and "QWERTY" not in kept
    assert kept.count(".***") == 3
    assert len(audit.scrub("x" * 5000) or "") == 500
    note = audit.Note(action="job.submit", actor="alice", detail="pat.secretsecretsecret")
    assert "secret" not in str(note.row(201))


def test_since_reads_durations_dates_and_epochs() -> None:
    now = time.time()
    assert abs((audit.parse_since("1d") or 0) - (now - 86400)) < 5
    assert abs((audit.parse_since("90m") or 0) - (now - 5400)) < 5
    assert audit.parse_since("1700000000") == 1700000000.0
    assert audit.parse_since("2025-01-31") is not None
    assert audit.parse_since(None) is None and audit.parse_since(" ") is None
    with pytest.raises(SpecError, match="since: cannot read 'yesterday-ish'"):
        audit.parse_since("yesterday-ish")


def test_a_value_read_before_a_change_is_not_kept() -> None:
    table: cache._Table[str, int] = cache._Table()
    seen = table.generation
    table.clear()  # a change committed while the value was read
    table.put("k", 1, seen)
    assert table.get("k") is None
    assert cache.cached(table, "k", lambda: 2) == 2
    assert table.get("k") == 2
    table.clear()
    assert table.get("k") is None


def test_cached_values_age_out(monkeypatch: pytest.MonkeyPatch) -> None:
    table: cache._Table[str, int] = cache._Table()
    table.put("k", 1, table.generation)
    monkeypatch.setattr(cache, "TTL", 0.0)
    time.sleep(0.01)
    assert table.get("k") is None
