"""Sealing job secrets and storage keys at rest; scrubbing messages; the key file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchyard.storage import crypto
from batchyard.storage.secrets import seal_spec, unseal_spec


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path))


def test_seal_roundtrip_masks_everything(tmp_path: Path) -> None:
    spec = {"command": "x", "secrets": {"TOKEN": "s3cr3t-value"},
            "mounts": [{"kind": "azure_blob", "relative_path": "b", "source": "a/c",
                        "account_key": "K3Y/with+chars=="}, {"kind": "local",
                                                             "relative_path": "l"}]}
    masked, sealed = seal_spec(spec)
    assert masked["secrets"] == {"TOKEN": "***"}
    assert masked["mounts"][0]["account_key"] == "***"
    assert "s3cr3t" not in sealed and "K3Y" not in sealed and sealed
    assert unseal_spec(masked, sealed) == spec
    key = tmp_path / "secret.key"
    assert key.stat().st_mode & 0o777 == 0o600


def test_nothing_to_seal() -> None:
    masked, sealed = seal_spec({"command": "x"})
    assert sealed == "" and masked == {"command": "x"}
    assert unseal_spec(masked, None) == masked


def test_resealing_a_masked_spec_keeps_no_mask_as_value() -> None:
    masked, _sealed = seal_spec({"command": "x", "secrets": {"A": "value-1"}})
    again, sealed2 = seal_spec(masked)
    assert sealed2 == "" and again == masked


def test_scrub() -> None:
    assert crypto.scrub("key=abcd1234 and abcd1234", ["abcd1234", ""]) == "key=*** and ***"


def _container_spec(**registry: str) -> dict[str, Any]:
    return {"command": "x", "secrets": {"ACR": "from-secret"},
            "environment": {"image": "r.azurecr.io/train:1",
                            "registry": {"server": "r.azurecr.io", "username": "me",
                                         **registry}}}


def test_registry_password_sealed_and_put_back() -> None:
    spec = _container_spec(password="acr-Pa55/word")
    masked, sealed = seal_spec(spec)
    assert masked["environment"]["registry"] == {"server": "r.azurecr.io", "username": "me",
                                                 "password": "***"}
    assert "acr-Pa55" not in sealed and "acr-Pa55" not in str(masked)
    assert unseal_spec(masked, sealed) == spec
    again, sealed2 = seal_spec(masked)  # a stored spec sealed again keeps no mask as value
    assert sealed2 == "" and again == masked


def test_password_secret_stays_a_name() -> None:
    """Only the secret's value is sealed; the plan builder looks the name up at launch."""
    spec = _container_spec(password_secret="ACR")
    masked, sealed = seal_spec(spec)
    assert masked["environment"]["registry"]["password_secret"] == "ACR"
    assert masked["secrets"] == {"ACR": "***"} and "from-secret" not in str(masked)
    assert unseal_spec(masked, sealed) == spec


def test_specs_without_a_registry_are_untouched() -> None:
    spec = {"command": "x", "environment": {"image": "ubuntu", "pull_policy": "never"}}
    assert seal_spec(spec) == (spec, "")
    assert unseal_spec(spec, None) == spec
