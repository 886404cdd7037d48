"""`batchyard datastore ...`: named storage (local directory, Azure Blob, S3) that jobs read
inputs from and write outputs to. Credentials go to the server once, at register, and are
never shown again; transfers go through the server, with Rich progress."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer

from batchyard.cli import common, complete, groups

app = groups.datastore
CHUNK = 1 << 20
COLUMNS = [("name", "Name"), ("kind", "Kind"), ("path", "Path", "path?"),
           ("account_name", "Account", "id?"), ("container", "Container", "id?"),
           ("bucket", "Bucket", "id?"), ("prefix", "Prefix", "id?"),
           ("endpoint", "Endpoint", "id?"), ("credentials", "Credentials", "text")]


StoreArg = typer.Argument(..., metavar="NAME", help="The datastore's name.",
                          autocompletion=complete.datastores)


def _base(workspace: str | None) -> str:
    return f"/workspaces/{common.ws_name(workspace)}/datastores"


@app.command("register")
def register(
    name: str = typer.Argument(..., help="Datastore name."),
    kind: str = typer.Option(..., "--kind", "-k", help="local, azure_blob or s3."),
    path: str = typer.Option(None, "--path", help="local: the directory."),
    account_name: str = typer.Option(None, "--account-name", help="azure_blob: account."),
    container: str = typer.Option(None, "--container", help="azure_blob: container."),
    bucket: str = typer.Option(None, "--bucket", help="s3: bucket."),
    prefix: str = typer.Option(None, "--prefix", help="Path inside the container/bucket."),
    endpoint: str = typer.Option(None, "--endpoint", help="Account URL (Azure; e.g. Azurite) "
                                 "or endpoint URL (S3-compatible)."),
    region: str = typer.Option(None, "--region", help="s3: region."),
    maps_url: list[str] = typer.Option([], "--maps-url", help="An Azure file share URL "
                                       "(Batch AI azureFileShares) this datastore stands for."),
    account_key: str = typer.Option(None, "--account-key", envvar="AZURE_STORAGE_KEY",
                                    show_envvar=True, help="azure_blob key (write-only)."),
    sas_token: str = typer.Option(None, "--sas-token", envvar="AZURE_STORAGE_SAS_TOKEN",
                                  show_envvar=True),
    connection_string: str = typer.Option(None, "--connection-string",
                                          envvar="AZURE_STORAGE_CONNECTION_STRING",
                                          show_envvar=True),
    access_key_id: str = typer.Option(None, "--access-key-id", envvar="AWS_ACCESS_KEY_ID",
                                      show_envvar=True),
    secret_access_key: str = typer.Option(None, "--secret-access-key",
                                          envvar="AWS_SECRET_ACCESS_KEY", show_envvar=True),
    no_verify: bool = typer.Option(False, "--no-verify", help="Register without checking "
                                   "that the container or bucket exists and the credentials "
                                   "open it."),
    workspace: str = common.WorkspaceOpt,
    output: common.Output = common.OutputOpt,
) -> None:
    """Register a datastore; its credentials are sealed on the server and never shown. The
    container or bucket is checked first (its existence, and the credentials)."""
    body: dict[str, Any] = {
        "name": name, "kind": kind, "path": str(Path(path).resolve()) if path else None,
        "account_name": account_name, "container": container, "bucket": bucket,
        "prefix": prefix, "endpoint": endpoint, "region": region, "maps_url": maps_url,
        "account_key": account_key, "sas_token": sas_token,
        "connection_string": connection_string, "access_key_id": access_key_id,
        "secret_access_key": secret_access_key,
    }
    if kind != "azure_blob":
        body.update(account_key=None, sas_token=None, connection_string=None)
    if kind != "s3":
        body.update(access_key_id=None, secret_access_key=None)
    with common.handled():
        data = common.client().post(_base(workspace), {
            **{k: v for k, v in body.items() if v not in (None, [])},
            "verify": not no_verify})
        common.emit(data, output, lambda d: common.console.print(
            f"datastore {d['name']} registered ({d['kind']})"))


@app.command("list")
def list_all(workspace: str = common.WorkspaceOpt,
             output: common.Output = common.OutputOpt) -> None:
    """Datastores of the workspace (credential names only, never values)."""
    with common.handled():
        rows = common.client().get(_base(workspace))
        common.emit(rows, output, lambda d: common.table(
            d, COLUMNS, empty=f"no datastores in workspace {common.ws_name(workspace)}"))


@app.command("show")
def show(name: str = StoreArg, workspace: str = common.WorkspaceOpt,
         output: common.Output = common.OutputOpt) -> None:
    """One datastore."""
    with common.handled():
        data = common.client().get(f"{_base(workspace)}/{name}")
        common.emit({**data, "created": common.human_time(data.get("created_at"))}, output,
                    lambda d: common.key_values(
                        d, [*COLUMNS, ("maps_url", "Maps URLs"), ("region", "Region"),
                            ("created", "Created")]))


@app.command("delete")
def delete(name: str = StoreArg, workspace: str = common.WorkspaceOpt,
           output: common.Output = common.OutputOpt) -> None:
    """Forget a datastore (its data stays where it is)."""
    with common.handled():
        common.client().delete(f"{_base(workspace)}/{name}")
        common.emit({"deleted": name}, output,
                    lambda d: common.console.print(f"datastore {name} deleted"))


def _progress() -> Any:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=common.err_console,
                    disable=not common.err_console.is_terminal)


@app.command("upload")
def upload(name: str = StoreArg,
           src: Path = typer.Argument(..., exists=True, help="File or directory."),
           target: str = typer.Option(
               "", "--target-path", "-t",
               help="Where in the store: for a file, the blob's name (as az storage blob "
               "upload -n; ending in /, the folder it goes into, keeping its name); for a "
               "directory, the folder its tree goes under. Default: the file's name, or the "
               "store's root."),
           workspace: str = common.WorkspaceOpt,
           output: common.Output = common.OutputOpt) -> None:
    """Upload a file or a directory tree into the datastore; prints where each file went."""
    files = destinations(src, target)
    total = sum(p.stat().st_size for p, _ in files)
    done: list[dict[str, Any]] = []
    with common.handled(), _progress() as bar:
        task = bar.add_task(f"upload to {name}", total=total)
        cli = common.client()
        for path, dest in files:

            def chunks(path: Path = path) -> Iterator[bytes]:
                with open(path, "rb") as fh:
                    while chunk := fh.read(CHUNK):
                        bar.advance(task, len(chunk))
                        yield chunk

            stored = cli.request("PUT", f"{_base(workspace)}/{name}/files/{quote(dest)}",
                                 content=chunks())
            done.append({"source": str(path), "path": (stored or {}).get("path", dest),
                         "size": (stored or {}).get("size", path.stat().st_size)})
    summary = {"datastore": name, "files": len(done), "bytes": total, "uploaded": done}
    common.emit(summary, output, _render_upload)


def destinations(src: Path, target: str) -> list[tuple[Path, str]]:
    """(local file, path in the store) of each file to upload. A file goes to ``target``
    itself (the blob's name), or into it when it ends in ``/`` (or is empty); a directory's
    files go under ``target`` with their paths relative to it."""
    folder = target.strip("/")
    if src.is_file():
        if folder and not target.endswith("/"):
            return [(src, folder)]
        return [(src, f"{folder}/{src.name}".lstrip("/"))]
    return [(p, f"{folder}/{p.relative_to(src).as_posix()}".lstrip("/"))
            for p in sorted(src.rglob("*")) if p.is_file()]


def _render_upload(d: dict[str, Any]) -> None:
    for item in d["uploaded"]:
        common.console.print(f"{item['source']} -> {d['datastore']}:{item['path']}",
                             highlight=False, markup=False, soft_wrap=True)
    common.console.print(f"uploaded {d['files']} file(s), {common.human_size(d['bytes'])} to "
                         f"{d['datastore']}", highlight=False, markup=False)


@app.command("download")
def download(name: str = StoreArg, dest: Path = typer.Argument(..., help="Local directory."),
             prefix: str = typer.Option("", "--prefix", "-p", help="Path in the store."),
             workspace: str = common.WorkspaceOpt,
             output: common.Output = common.OutputOpt) -> None:
    """Download everything under a path of the datastore into a directory."""
    with common.handled():
        cli = common.client()
        files = cli.get(f"{_base(workspace)}/{name}/files", prefix=prefix or None)
        total = sum(int(f["size"]) for f in files)
        base = prefix.strip("/")
        with _progress() as bar:
            task = bar.add_task(f"download from {name}", total=total)
            for item in files:
                rel = item["path"][len(base):].lstrip("/") if base else item["path"]
                target = dest / (rel or Path(item["path"]).name)
                target.parent.mkdir(parents=True, exist_ok=True)
                size = cli.download(f"{_base(workspace)}/{name}/files/{quote(item['path'])}",
                                    str(target))
                if size != int(item["size"]):
                    common.fail(f"{item['path']}: got {size} bytes, expected {item['size']}", 1)
                bar.advance(task, size)
    summary = {"datastore": name, "files": len(files), "bytes": total, "dest": str(dest)}
    common.emit(summary, output, lambda d: common.console.print(
        f"downloaded {d['files']} file(s), {common.human_size(d['bytes'])} to {d['dest']}"))
