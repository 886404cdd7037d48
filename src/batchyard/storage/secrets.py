"""Taking secrets out of a job spec before it is stored, and putting them back for launch.

A stored spec keeps every secret value, storage key and registry password as ``***``; the real
values are sealed (storage.crypto) into one token kept beside it. Only the reconciler, building
the node plans, puts them back."""

from __future__ import annotations

import copy
from typing import Any

from batchyard.storage.crypto import MASK, seal, unseal


def seal_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the spec with secrets masked, the sealed values; "" when there were none). A spec
    with nothing to seal (most) comes back as it is: a deep copy of every submitted spec was
    a tenth of a submit's work."""
    found = _secrets_of(spec)
    if not found:
        return spec, ""
    masked = copy.deepcopy(spec)
    if "secrets" in found:
        masked["secrets"] = {k: MASK for k in masked["secrets"]}
    for index in found.get("mount_keys", {}):
        masked["mounts"][int(index)]["account_key"] = MASK
    if "registry_password" in found:
        _registry(masked)["password"] = MASK
    return masked, seal(found)


def _secrets_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The values ``seal_spec`` seals (read, not changed): ``secrets``, mount account keys
    by mount index, the registry password; values already masked are not secrets."""
    found: dict[str, Any] = {}
    secrets = spec.get("secrets") or {}
    values = {k: v for k, v in secrets.items() if v != MASK}
    if values:
        found["secrets"] = values
    keys = {str(i): m["account_key"] for i, m in enumerate(spec.get("mounts") or [])
            if m.get("account_key") and m["account_key"] != MASK}
    if keys:
        found["mount_keys"] = keys
    password = _registry(spec).get("password")
    if password and password != MASK:
        found["registry_password"] = password
    return found


def unseal_spec(spec: dict[str, Any], sealed: str | None) -> dict[str, Any]:
    """The spec with its secret values back (a copy). A registry ``password_secret`` stays a
    name: the plan builder (backends.plans.container_of) looks it up in ``secrets``."""
    full = copy.deepcopy(spec)
    values = unseal(sealed)
    if values.get("secrets"):
        full["secrets"] = {**(full.get("secrets") or {}), **values["secrets"]}
    for index, key in (values.get("mount_keys") or {}).items():
        mounts = full.get("mounts") or []
        if int(index) < len(mounts):
            mounts[int(index)]["account_key"] = key
    registry = _registry(full)
    if values.get("registry_password") and registry:
        registry["password"] = values["registry_password"]
    return full


def _registry(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's ``environment.registry`` mapping (changed in place), or a new empty one."""
    registry = (spec.get("environment") or {}).get("registry")
    return registry if isinstance(registry, dict) else {}
