"""Batch AI's auto storage (``cluster create --use-auto-storage``): every job of such a
cluster gets the workspace's default datastore at ``$AZ_BATCHAI_MOUNT_ROOT/autobfs`` (its
blob container) and ``$AZ_BATCHAI_MOUNT_ROOT/autoafs`` (its file share), as Batch AI mounted
``batchaicontainer`` and ``batchaishare`` there.

The default datastore is the one registered as ``workspaceblobstore`` (``workspacefilestore``
for the share), else the workspace's default directory on the server's machine
(``$BATCHYARD_DATA_ROOT/datastores/<workspace>/<name>``, the one the AML compat's
``ws.get_default_datastore()`` writes to). The mounts are the same entries a Batch AI
``azureBlobFileSystems`` mount or a local datastore becomes (services/storage.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from batchyard.config import data_root
from batchyard.launchplan import node_mount_relative
from batchyard.server.services.datastores import all_rows, store_of
from batchyard.server.services.storage import sync_interval
from batchyard.store.models import Cluster, Job, Workspace

# (mount point under $AZ_BATCHAI_MOUNT_ROOT, the default datastore it shows)
AUTO_MOUNTS = (("autobfs", "workspaceblobstore"), ("autoafs", "workspacefilestore"))


def add_auto_storage(session: Session, job: Job, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (a resolved launch spec) with the auto-storage mounts of the job's cluster."""
    cluster = session.get(Cluster, job.cluster_id) if job.cluster_id else None
    if cluster is None or not (cluster.spec or {}).get("auto_storage"):
        return spec
    ws = session.get(Workspace, job.workspace_id)
    assert ws is not None
    rows = {row.name: row for row in all_rows(session, ws.id)}
    mounts = list(spec.get("mounts") or [])
    for point, name in AUTO_MOUNTS:
        rel = node_mount_relative(point)
        row = rows.get(name)
        origin = f"auto storage {point} (datastore {name})"
        if row is None:
            folder = data_root() / "datastores" / ws.name / name
            folder.mkdir(parents=True, exist_ok=True)
            # the workspace's share: every job of it writes there, whoever submitted it
            # (jobs run as their submitters' uids), as on Batch AI's share; sticky, so that
            # none removes another's files
            folder.chmod(0o1777)
            mounts.append({"kind": "local", "relative_path": rel, "source": str(folder),
                           "origin": origin})
        elif row.kind == "local":
            mounts.append({"kind": "local", "relative_path": rel,
                           "source": store_of(row)["root"], "origin": origin})
        else:
            store = store_of(row, label=f"mount {point}")
            mounts.append({"kind": row.kind, "relative_path": rel, "origin": origin,
                           "source": str(store["root"]), "store": store})
            spec.setdefault("storage_sync", sync_interval())
    return {**spec, "mounts": mounts}
