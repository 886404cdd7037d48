"""Datastores of a workspace: register, list, show, delete, and the file transfers the CLI's
``datastore upload|download`` make through the server (so credentials never leave it).
Credentials are sealed at rest and never part of a response."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import Conflict, NotFound, SpecError
from batchyard.server.services import common
from batchyard.storage.crypto import seal, unseal
from batchyard.storage.stores import SECRET_FIELDS, make_store
from batchyard.store.models import Datastore
from batchyard.suggest import did_you_mean


class DatastoreIn(BaseModel):
    """A datastore registration. Credential fields are write-only."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: Literal["local", "azure_blob", "s3"]
    path: str | None = Field(None, description="local: the directory.")
    account_name: str | None = Field(None, description="azure_blob: the storage account.")
    container: str | None = Field(None, description="azure_blob: the container.")
    bucket: str | None = Field(None, description="s3: the bucket.")
    prefix: str | None = Field(None, description="Path inside the container or bucket.")
    endpoint: str | None = Field(None, description="Account URL (Azure) or endpoint URL (S3).")
    region: str | None = None
    maps_url: list[str] = Field(default_factory=list, description="Azure file share URLs "
                                "(Batch AI azureFileShares) this datastore stands for.")
    account_key: str | None = None
    sas_token: str | None = None
    connection_string: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    verify: bool = Field(True, description="Check now that the container or bucket exists "
                         "and the credentials open it (false: register it as given).")

    @model_validator(mode="after")
    def _complete(self) -> DatastoreIn:
        needed = {"local": ("path",), "azure_blob": ("account_name", "container"),
                  "s3": ("bucket",)}[self.kind]
        for key in needed:
            if not getattr(self, key):
                raise ValueError(f"a {self.kind} datastore needs {key}")
        if self.kind == "local" and not (self.path or "").startswith("/"):
            raise ValueError("path must be an absolute directory")
        return self


def _row(session: Session, ws_name: str, name: str) -> Datastore:
    ws = common.workspace(session, ws_name)
    row = session.scalar(select(Datastore).where(Datastore.workspace_id == ws.id,
                                                 Datastore.name == name))
    if row is None:
        names = common.known(session, select(Datastore.name)
                             .where(Datastore.workspace_id == ws.id))
        raise NotFound(f"datastore {name!r} not found in workspace {ws_name!r}"
                       + did_you_mean(name, names))
    return row


def view(row: Datastore) -> dict[str, Any]:
    creds = unseal(row.sealed)
    return {"name": row.name, "kind": row.kind, **row.config,
            "credentials": sorted(creds), "created_at": row.created_at}


def register(session: Session, ws_name: str, body: DatastoreIn) -> dict[str, Any]:
    ws = common.workspace(session, ws_name)
    if session.scalar(select(Datastore.id).where(Datastore.workspace_id == ws.id,
                                                 Datastore.name == body.name)):
        raise Conflict(f"datastore {body.name!r} already exists in workspace {ws_name!r}")
    data = body.model_dump(exclude_none=True)
    verify = data.pop("verify", True)
    creds = {k: data.pop(k) for k in SECRET_FIELDS if k in data}
    data.pop("name")
    kind = data.pop("kind")
    data["maps_url"] = [u.rstrip("/") for u in data.get("maps_url", [])]
    if kind == "local" and data.get("path"):  # never a folder of the server's own
        from batchyard.server.services.pathcheck import roots

        roots(session, ws_name).check(str(data["path"]), "path")
    row = Datastore(workspace_id=ws.id, name=body.name, kind=kind, config=data,
                    sealed=seal(creds) or None)
    if verify and kind != "local":
        _verify(row, creds)
    session.add(row)
    session.flush()
    return view(row)


def _verify(row: Datastore, creds: dict[str, str]) -> None:
    """The container or bucket must be there and open with these credentials: a typo found
    now, not when a job's stage-in fails an hour later."""
    from batchyard.storage.stores import check_reachable, open_fs

    cfg = row.config
    what = (f"container {cfg.get('container')!r}" if row.kind == "azure_blob"
            else f"bucket {cfg.get('bucket')!r}")
    store = make_store(row.kind, str(cfg.get("container") or cfg.get("bucket") or ""),
                       label=f"datastore {row.name}", account_name=cfg.get("account_name"),
                       endpoint=cfg.get("endpoint"), region=cfg.get("region"),
                       credentials=creds)
    hint = " (--no-verify to register it anyway)"
    try:
        check_reachable(store)
        fs = open_fs(store)
        # a listing, not exists(): that answers from a listing of all containers, which
        # some accounts allow without the key being right
        fs.ls(str(cfg.get("container") or cfg.get("bucket")), detail=False)
    except ConnectionError as exc:
        raise SpecError(f"datastore {row.name!r}: {exc}{hint}") from None
    except FileNotFoundError:
        raise NotFound(f"datastore {row.name!r}: {what} not found{hint}") from None
    except Exception as exc:  # the SDKs' own errors: refused credentials, bad account
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise SpecError(f"datastore {row.name!r}: cannot open {what}: "
                        f"{type(exc).__name__}: {first}{hint}") from None


def list_all(session: Session, ws_name: str) -> list[dict[str, Any]]:
    ws = common.workspace(session, ws_name)
    rows = session.scalars(select(Datastore).where(Datastore.workspace_id == ws.id)
                           .order_by(Datastore.name))
    return [view(r) for r in rows]


def show(session: Session, ws_name: str, name: str) -> dict[str, Any]:
    return view(_row(session, ws_name, name))


def delete(session: Session, ws_name: str, name: str) -> None:
    session.delete(_row(session, ws_name, name))


def all_rows(session: Session, workspace_id: int) -> list[Datastore]:
    return list(session.scalars(select(Datastore).where(Datastore.workspace_id == workspace_id)))


def store_of(row: Datastore, sub: str = "", *, label: str | None = None,
             credentials: dict[str, str] | None = None) -> dict[str, Any]:
    """The store (with credentials) for ``sub`` inside the datastore."""
    cfg = row.config
    sub = sub.strip("/")
    if row.kind == "local":
        root = f"{cfg['path'].rstrip('/')}/{sub}" if sub else cfg["path"]
    else:
        parts = [cfg.get("container") or cfg.get("bucket") or "",
                 (cfg.get("prefix") or "").strip("/"), sub]
        root = "/".join(p for p in parts if p)
    return make_store(row.kind, root, label=label or f"datastore {row.name}",
                      account_name=cfg.get("account_name"), endpoint=cfg.get("endpoint"),
                      region=cfg.get("region"),
                      credentials=credentials if credentials else unseal(row.sealed))


def _fs(session: Session, ws_name: str, name: str, path: str) -> tuple[Any, str]:
    from batchyard.storage.stores import open_fs, remote_path

    if ".." in path.split("/"):
        raise SpecError("path: '..' is not allowed")
    row = _row(session, ws_name, name)
    store = store_of(row, path)
    if row.kind == "local":  # a link inside the folder never leads out of it
        import os

        from batchyard.pathguard import within

        top = os.path.realpath(str(row.config["path"]))
        if not within(os.path.realpath(store["root"]), top):
            raise NotFound(f"{path!r} not found in datastore {name!r}")
    return open_fs(store), remote_path(store)


def files(session: Session, ws_name: str, name: str, prefix: str = "") -> list[dict[str, Any]]:
    from batchyard.storage.transfer import listing

    fs, root = _fs(session, ws_name, name, prefix)
    try:
        found = listing(fs, root)
    except FileNotFoundError:
        return []
    return [{"path": f"{prefix.strip('/')}/{rel}".lstrip("/"), "size": int(i.get("size") or 0)}
            for rel, i in sorted(found.items())]


def write_file(session: Session, ws_name: str, name: str, path: str,
               local: str) -> dict[str, Any]:
    """Put the file at ``local`` (the request body, spooled) to ``path``; verified by size."""
    import os

    fs, target = _fs(session, ws_name, name, path)
    size = os.path.getsize(local)
    try:
        fs.put_file(local, target)
    except FileNotFoundError:
        row = _row(session, ws_name, name)
        where = row.config.get("container") or row.config.get("bucket") or row.config.get("path")
        raise NotFound(f"datastore {name!r}: {where!r} not found (create the container or "
                       "bucket first)") from None
    stored = int(fs.info(target).get("size") or 0)
    if stored != size:
        raise SpecError(f"{path}: wrote {size} bytes but the store has {stored}")
    return {"path": path, "size": size}


def read_file(session: Session, ws_name: str, name: str, path: str) -> Iterator[bytes]:
    fs, target = _fs(session, ws_name, name, path)
    if not fs.isfile(target):
        raise NotFound(f"{path!r} not found in datastore {name!r}")
    fh = fs.open(target, "rb")

    def chunks() -> Iterator[bytes]:
        with fh:
            while chunk := fh.read(4 << 20):
                yield chunk

    return chunks()
