"""Datastores registered on the batchyard server, the azureml way
(``Datastore.register_azure_blob_container``, ``register_azure_file_share``): the same
server datastores ``batchyard datastore register`` makes, so the CLI, job inputs
(``datastore://NAME/path``) and outputs see them too. Credentials go to the server once and
are sealed there; transfers go through the server, as the CLI's do."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from batchyard import errors
from batchyard.compat.azureml.exceptions import UserErrorException

AZURE_SUFFIX = "core.windows.net"


def _client(workspace: Any) -> Any:
    return workspace._sdk.client


def _base(workspace: Any) -> str:
    return f"/workspaces/{workspace.name}/datastores"


def account_url(account_name: str, service: str, protocol: str | None,
                endpoint: str | None) -> str:
    """Azure ML's ``protocol`` + ``endpoint`` (the storage suffix, ``core.windows.net``) as the
    account URL; an ``endpoint`` that is already a URL (Azurite: ``http://127.0.0.1:10000/
    devstoreaccount1``) is taken as it is."""
    if endpoint and "://" in endpoint:
        return endpoint.rstrip("/")
    return f"{protocol or 'https'}://{account_name}.{service}.{endpoint or AZURE_SUFFIX}"


def view(workspace: Any, name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = _client(workspace).get(f"{_base(workspace)}/{name}")
    except errors.NotFound:
        return None
    return data


def list_views(workspace: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _client(workspace).get(_base(workspace))
    return rows


def _check_container(body: dict[str, Any], create: bool) -> None:
    """Azure ML checked the container (or share) with the credentials given, and created it
    when asked to: so does this, from where the notebook runs (as the CLI's transfers)."""
    from batchyard.storage.stores import check_reachable, make_store, open_fs

    creds = {k: body[k] for k in ("account_key", "sas_token") if body.get(k)}
    store = make_store("azure_blob", body["container"], label=f"datastore {body['name']}",
                       account_name=body["account_name"], endpoint=body["endpoint"],
                       credentials=creds)
    try:
        check_reachable(store)
        fs = open_fs(store)
        if fs.exists(body["container"]):
            return
        if create:
            fs.mkdir(body["container"])
            return
    except (OSError, ValueError) as exc:
        raise UserErrorException(f"datastore {body['name']!r}: cannot reach container "
                                 f"{body['container']!r} of account {body['account_name']!r} "
                                 f"at {body['endpoint']}: {exc}") from None
    raise UserErrorException(f"datastore {body['name']!r}: container {body['container']!r} "
                             f"does not exist in account {body['account_name']!r} (pass "
                             "create_if_not_exists=True to create it)")


def register(workspace: Any, body: dict[str, Any], *, overwrite: bool, create: bool,
             validate: bool) -> dict[str, Any]:
    """POST the registration (replacing a datastore of that name when ``overwrite``)."""
    if not body.get("account_key") and not body.get("sas_token"):
        raise UserErrorException(f"datastore {body['name']!r}: give account_key or sas_token")
    if validate or create:
        _check_container(body, create)
    client = _client(workspace)
    if overwrite and view(workspace, body["name"]) is not None:
        client.delete(f"{_base(workspace)}/{body['name']}")
    try:
        data: dict[str, Any] = client.post(_base(workspace), {
            **{k: v for k, v in body.items() if v}, "verify": bool(validate or create)})
    except errors.Conflict:
        raise UserErrorException(f"datastore {body['name']!r} already exists in workspace "
                                 f"{workspace.name!r}; pass overwrite=True to replace it"
                                 ) from None
    return data


def unregister(workspace: Any, name: str) -> None:
    _client(workspace).delete(f"{_base(workspace)}/{name}")


def upload(workspace: Any, name: str, files: list[tuple[str, Path]], target: str | None,
           overwrite: bool, show_progress: bool) -> int:
    """PUT each (relative name, file) under ``target``; existing files are kept unless
    ``overwrite``."""
    client = _client(workspace)
    base = (target or "").strip("/")
    existing: set[str] = set()
    if not overwrite:
        existing = {f["path"] for f in client.get(f"{_base(workspace)}/{name}/files",
                                                   prefix=base or None)}
    count = 0
    for rel, path in files:
        dest = f"{base}/{rel}".lstrip("/")
        if dest in existing:
            continue
        with open(path, "rb") as fh:
            client.request("PUT", f"{_base(workspace)}/{name}/files/{quote(dest)}",
                           content=fh.read())
        count += 1
        if show_progress:
            print(f"Uploading {path}")
    if show_progress:
        print(f"Uploaded {count} files")
    return count


def download(workspace: Any, name: str, target_path: str, prefix: str | None,
             overwrite: bool, show_progress: bool) -> int:
    client = _client(workspace)
    count = 0
    for item in client.get(f"{_base(workspace)}/{name}/files", prefix=prefix or None):
        dest = Path(target_path) / item["path"]
        if dest.exists() and not overwrite:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download(f"{_base(workspace)}/{name}/files/{quote(item['path'])}", str(dest))
        count += 1
    if show_progress:
        print(f"Downloaded {count} files")
    return count
