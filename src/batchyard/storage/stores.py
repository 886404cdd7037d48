"""Where bytes live: a *store* is a JSON-able description of one place in one storage system
(a local directory, an Azure Blob container or prefix, an S3 bucket or prefix) plus the
credentials to reach it. The server builds stores from datastores and Batch AI mounts; the
node's stage process opens them with fsspec. Credentials travel only inside stores (the plan
file, mode 0600) and are never part of a store's ``label`` or of any message."""

from __future__ import annotations

from typing import Any

KINDS = ("local", "azure_blob", "s3")
SECRET_FIELDS = ("account_key", "sas_token", "connection_string", "access_key_id",
                 "secret_access_key")


def azure_endpoint(account_name: str, endpoint: str | None) -> str:
    return (endpoint or f"https://{account_name}.blob.core.windows.net").rstrip("/")


def make_store(kind: str, root: str, *, label: str, account_name: str | None = None,
               endpoint: str | None = None, region: str | None = None,
               credentials: dict[str, str] | None = None) -> dict[str, Any]:
    store: dict[str, Any] = {"kind": kind, "root": root.strip("/") if kind != "local" else root,
                             "label": label}
    for key, value in (("account_name", account_name), ("endpoint", endpoint),
                       ("region", region)):
        if value:
            store[key] = value
    creds = {k: v for k, v in (credentials or {}).items() if v}
    if creds:
        store["credentials"] = creds
    return store


def secrets_of(store: dict[str, Any]) -> list[str]:
    return [str(v) for v in (store.get("credentials") or {}).values() if v]


def url_of(store: dict[str, Any], sub: str = "") -> str:
    """A URL naming the place, safe to show (no credentials)."""
    root = store["root"].rstrip("/")
    path = f"{root}/{sub.strip('/')}" if sub.strip("/") else root
    if store["kind"] == "local":
        return f"file://{path}"
    if store["kind"] == "s3":
        return f"s3://{path}"
    return f"{azure_endpoint(store.get('account_name') or '?', store.get('endpoint'))}/{path}"


def open_fs(store: dict[str, Any]) -> Any:
    """An fsspec filesystem for ``store`` (imports the backend lazily)."""
    kind = store["kind"]
    creds: dict[str, str] = dict(store.get("credentials") or {})
    if kind == "local":
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(auto_mkdir=True)
    if kind == "azure_blob":
        from batchyard.storage.blobfs import BlobFileSystem as AzureBlobFileSystem

        account = store.get("account_name") or ""
        if creds.get("connection_string"):
            return AzureBlobFileSystem(connection_string=creds["connection_string"],
                                       skip_instance_cache=True)
        endpoint = azure_endpoint(account, store.get("endpoint"))
        if creds.get("account_key"):
            proto = endpoint.split("://", 1)[0]
            conn = (f"DefaultEndpointsProtocol={proto};AccountName={account};"
                    f"AccountKey={creds['account_key']};BlobEndpoint={endpoint};")
            return AzureBlobFileSystem(connection_string=conn, skip_instance_cache=True)
        return AzureBlobFileSystem(account_name=account, sas_token=creds.get("sas_token"),
                                   account_host=endpoint.split("://", 1)[-1].split("/")[0],
                                   skip_instance_cache=True)
    if kind == "s3":
        from s3fs import S3FileSystem

        client_kwargs: dict[str, Any] = {}
        if store.get("region"):
            client_kwargs["region_name"] = store["region"]
        return S3FileSystem(key=creds.get("access_key_id"),
                            secret=creds.get("secret_access_key"),
                            anon=not creds.get("access_key_id"),
                            endpoint_url=store.get("endpoint"), client_kwargs=client_kwargs,
                            skip_instance_cache=True, use_listings_cache=False)
    raise ValueError(f"unknown store kind {kind!r}")


def remote_path(store: dict[str, Any], sub: str = "") -> str:
    root = store["root"].rstrip("/") if store["kind"] != "local" else store["root"]
    sub = sub.strip("/")
    if not sub:
        return root
    return f"{root.rstrip('/')}/{sub}" if root.rstrip("/") else sub


def check_reachable(store: dict[str, Any], timeout: float = 5.0) -> None:
    """Fail fast (OSError naming host:port) when the store's endpoint takes no connection,
    instead of waiting out the SDKs' retry schedules (a minute or more)."""
    import socket
    from urllib.parse import urlsplit

    kind = store["kind"]
    if kind == "local":
        return
    if kind == "azure_blob":
        url = azure_endpoint(store.get("account_name") or "", store.get("endpoint"))
    else:
        url = store.get("endpoint") or "https://s3.amazonaws.com"
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout):
            return
    except OSError as exc:
        raise ConnectionError(f"cannot connect to {host}:{port} ({exc.strerror or exc})") from None
