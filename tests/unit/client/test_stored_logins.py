"""Stored logins (client.credentials): one per server, the file its owner's only, the last
login chosen, a logout forgetting only its own."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from batchyard.client import credentials
from batchyard.errors import SpecError


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_login_per_server_in_a_private_file(home: Path) -> None:
    credentials.store("HTTPS://Box.example:8742/", "pat.one", "alice")
    credentials.store("http://127.0.0.1:9000", "pat.two", "bob")
    assert stat.S_IMODE((home / "credentials").stat().st_mode) == 0o600
    assert credentials.current() == ("http://127.0.0.1:9000", "pat.two")
    assert credentials.token_for("https://box.example:8742") == "pat.one"
    assert credentials.forget() == "http://127.0.0.1:9000"
    assert credentials.current() is None
    assert credentials.token_for("https://box.example:8742") == "pat.one"
    assert credentials.forget("https://box.example:8742") == "https://box.example:8742"
    assert credentials.forget() is None
    assert credentials.load()["servers"] == {}


def test_a_damaged_file_is_no_login(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "credentials").write_text("{not json")
    assert credentials.current() is None and credentials.token_for("http://x:1") is None


def test_a_server_must_be_a_url() -> None:
    with pytest.raises(SpecError, match="--server 'box:8742'"):
        credentials.normal("box:8742")
