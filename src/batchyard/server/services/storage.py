"""Binding a job's storage to datastores: checked at submit (every datastore a job names
exists, every Azure file share is mapped), resolved at launch into *stores* with credentials
for the node plans (storage.stores). Nothing here is ever part of a response."""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.server.services import pathcheck
from batchyard.server.services.datastores import all_rows, store_of
from batchyard.storage.crypto import MASK
from batchyard.storage.stores import make_store
from batchyard.store.models import Datastore, Workspace

_AML = re.compile(r"^azureml://datastores/([^/]+)/paths/?(.*)$")
_DS = re.compile(r"^datastore://([^/]+)/?(.*)$")
_SCHEME = re.compile(r"^(az|abfs|wasbs?|s3)://([^/]+)/?(.*)$")
DEFAULT_SYNC = 60.0


def sync_interval() -> float:
    return float(os.environ.get("BATCHYARD_STORAGE_SYNC") or DEFAULT_SYNC)


def _find(rows: list[Datastore], ref: str, where: str) -> tuple[Datastore, str] | None:
    """The datastore a URL refers to, and the path inside it; None for a local path."""
    match = _AML.match(ref) or _DS.match(ref)
    if match:
        name, sub = match.group(1), match.group(2)
        for row in rows:
            if row.name == name:
                return row, sub
        raise SpecError(f"{where}: datastore {name!r} is not registered in this workspace "
                        "(batchyard datastore register)")
    match = _SCHEME.match(ref)
    if match:
        scheme, bucket, sub = match.groups()
        kind = "s3" if scheme == "s3" else "azure_blob"
        bucket = bucket.split("@", 1)[0]
        for row in rows:
            if row.kind == kind and bucket in (row.config.get("container"),
                                               row.config.get("bucket")):
                prefix = (row.config.get("prefix") or "").strip("/")
                if prefix and sub.startswith(prefix):
                    sub = sub[len(prefix):]
                return row, sub
        raise SpecError(f"{where}: no datastore gives access to {scheme}://{bucket}; register "
                        "one for it (batchyard datastore register)")
    return None


def _blob_row(rows: list[Datastore], account: str | None, container: str) -> Datastore | None:
    matches = [r for r in rows if r.kind == "azure_blob"
               and r.config.get("account_name") == account]
    same = [r for r in matches if r.config.get("container") == container]
    best = same or matches
    return best[0] if best else None


def _share_row(rows: list[Datastore], url: str) -> Datastore | None:
    for row in rows:
        if url.rstrip("/") in (row.config.get("maps_url") or []):
            return row
    return None


def check(session: Session, workspace_id: int, spec: dict[str, Any]) -> None:
    """Submit-time: refuse what could never be resolved, naming the field. A job with no
    inputs, outputs or mounts has nothing to check (and the datastores are not read)."""
    if spec.get("inputs") or spec.get("outputs") or spec.get("mounts"):
        resolve(session, workspace_id, spec, check_only=True)


def resolve(session: Session, workspace_id: int, spec: dict[str, Any], *,
            job_path: str = "", check_only: bool = False) -> dict[str, Any]:
    """The spec with a ``store`` on every input, output and mount that storage backs."""
    rows = all_rows(session, workspace_id)
    out = copy.deepcopy(spec)
    bound = False
    ws_name = ""

    def local(row: Datastore, sub: str, field: str) -> None:
        nonlocal ws_name
        if row.kind == "local":
            ws_name = ws_name or _workspace_name(session, workspace_id)
            pathcheck.check_datastore_path(session, ws_name, str(row.config["path"]), sub,
                                           field)

    for ident, item in (out.get("inputs") or {}).items():
        found = _find(rows, str(item.get("path", "")), f"inputs.{ident}.path")
        if found is not None:
            local(*found, f"inputs.{ident}.path")
        if found is None:
            if item.get("mode") in ("download", "ro_mount") and not check_only:
                path = str(item["path"]).removeprefix("file://")
                if path.startswith("/"):
                    item["store"] = make_store("local", path, label=f"input {ident}")
            continue
        row, sub = found
        store = store_of(row, sub, label=f"input {ident}")
        if item.get("mode") == "direct":
            item["path"] = _direct_url(row, store)
        else:
            item["store"] = store
            bound = True
    for ident, item in (out.get("outputs") or {}).items():
        ref = item.get("path") or (f"datastore://{item['datastore']}/"
                                   f"{job_path}/{ident.lower()}" if item.get("datastore")
                                   else None)
        if not ref:
            continue
        found = _find(rows, ref, f"outputs.{ident}")
        if found is None:
            continue
        row, sub = found
        local(row, sub, f"outputs.{ident}.path")
        item["store"] = store_of(row, sub, label=f"output {ident}")
        bound = True
    for i, mount in enumerate(out.get("mounts") or []):
        where = f"mounts[{i}] ({mount['relative_path']})"
        key = mount.pop("account_key", None)
        if mount["kind"] == "azure_files":
            share = _share_row(rows, mount["source"])
            if share is None:
                raise SpecError(
                    f"mountVolumes: azure file share {mount['source']} "
                    f"(relativeMountPath {mount['relative_path']!r}) is not mapped to a "
                    "datastore; register one with `batchyard datastore register NAME ... "
                    f"--maps-url {mount['source']}`")
            if share.kind == "local":
                local(share, "", f"{where}.source")
                mount.update(kind="local", source=store_of(share)["root"])
                continue
            mount["store"] = store_of(share, label=f"datastore {share.name}")
            mount["origin"] = f"azureFileShare {mount['source']}"
            bound = True
        elif mount["kind"] == "azure_blob":
            account, _, container = str(mount["source"]).partition("/")
            account = mount.get("account_name") or account
            blob = _blob_row(rows, account, container)
            creds = {"account_key": key} if key and key != MASK else {}
            if not creds and blob is None:
                raise SpecError(f"{where}: no accountKey for storage account {account!r} and "
                                "no datastore registered for it")
            if check_only:
                continue
            endpoint = blob.config.get("endpoint") if blob is not None else None
            mount["store"] = make_store(
                "azure_blob", container, label=f"mount {mount['relative_path']}",
                account_name=account, endpoint=endpoint,
                credentials=creds or (store_of(blob).get("credentials") if blob else None))
            mount["origin"] = f"azureBlobFileSystem {account}/{container}"
            bound = True
    if bound and not check_only:
        out["storage_sync"] = sync_interval()
    return out


def _workspace_name(session: Session, workspace_id: int) -> str:
    ws = session.get(Workspace, workspace_id)
    return ws.name if ws is not None else ""


def _direct_url(row: Datastore, store: dict[str, Any]) -> str:
    from batchyard.storage.stores import url_of

    return url_of(store)
