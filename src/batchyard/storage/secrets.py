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
    if not _has_secret(spec):
        return spec, ""
    masked = copy.deepcopy(spec)
    found: dict[str, Any] = {}
    secrets = masked.get("secrets") or {}
    values = {k: v for k, v in secrets.items() if v != MASK}
    if values:
        found["secrets"] = values
        masked["secrets"] = {k: MASK for k in secrets}
    keys: dict[str, str] = {}
    for i, mount in enumerate(masked.get("mounts") or []):
        if mount.get("account_key") and mount["account_key"] != MASK:
            keys[str(i)] = mount["account_key"]
            mount["account_key"] = MASK
    if keys:
        found["mount_keys"] = keys
    registry = _registry(masked)
    if registry.get("password") and registry["password"] != MASK:
        found["registry_password"] = registry["password"]
        registry["password"] = MASK
    return masked, seal(found) if found else ""


def _has_secret(spec: dict[str, Any]) -> bool:
    """Whether ``seal_spec`` has anything to mask (the same tests, without a copy)."""
    if any(v != MASK for v in (spec.get("secrets") or {}).values()):
        return True
    if any(m.get("account_key") and m["account_key"] != MASK
           for m in spec.get("mounts") or []):
        return True
    password = _registry(spec).get("password")
    return bool(password) and password != MASK


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
