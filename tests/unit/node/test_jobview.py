"""What the launcher decides a job sees (node/jobview.py): binds layered by mode, and the
node's own check of every path a job names once resolved there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import strictkit
from batchyard.launchplan import NodePlan, node_attempt_dir
from batchyard.node import jobview
from batchyard.node.env import node_dirs


def test_binds_are_layered_by_mode() -> None:
    got = jobview._layered(
        ["/n/job", "/n/job/wd", "/n/att", "/n/att/.batchyard/mpi", "/data"],
        ["/n/att/.batchyard", "/venv", "/venv/bin", "/n/job/inputs/T", "/data"])
    assert got == [("/data", "rw"), ("/venv", "ro"), ("/n/att", "rw"), ("/n/job", "rw"),
                   ("/n/att/.batchyard", "ro"), ("/n/att/.batchyard/mpi", "rw"),
                   ("/n/job/inputs/T", "ro")]


def _plan(node: Path, **extra: object) -> NodePlan:
    attempt = node_attempt_dir(str(node), "ws", "exp", "job", "uuid-1")
    data = dict(job_id=1, job_name="job", workspace="ws", experiment="exp", attempt=1,
                attempt_uuid="uuid-1", node_rank=0, node_names=["n0"], node_addrs=["127.0.0.1"],
                distribution={"type": "custom"}, command="true", prepare=None,
                attempt_dir=str(attempt), node_dir=str(node),
                checkpoint_dir=str(attempt.parent / "checkpoints"), master_addr="127.0.0.1",
                master_port=0)
    data.update(extra)
    return NodePlan(**data)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "node"
    (path / "tickets").mkdir(parents=True)
    (path / "tickets" / "x.json").write_text("{}")
    return path


def test_paths_into_the_node_or_the_servers_home_are_refused(tmp_path: Path,
                                                             node: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text("t")
    data = tmp_path / "data"
    data.mkdir()
    link = data / "innocent"
    link.symlink_to(home / "token")
    cases = {
        "inputs.T.path": {"inputs": {"T": {"path": str(link)}}},
        "mounts[0].source": {"mounts": [{"kind": "local", "relative_path": "m",
                                         "source": str(node / "tickets")}]},
        "outputs.O.path": {"outputs": {"O": {"store": {"kind": "local",
                                                       "root": str(home)}}}},
    }
    for field, extra in cases.items():
        plan = _plan(node, hide=[str(home)], **extra)
        why = jobview.refused(plan, node_dirs(plan))
        assert why is not None and why.startswith(field), (field, why)
    fine = _plan(node, hide=[str(home)], inputs={"T": {"path": str(data)}},
                 mounts=[{"kind": "local", "relative_path": "m", "source": str(data)}])
    assert jobview.refused(fine, node_dirs(fine)) is None


def test_folders_made_for_the_job_must_land_in_its_own(tmp_path: Path, node: Path) -> None:
    """An output under a local mount whose source holds a link a former job planted there
    (to /etc): the launcher, as root, would make folders in /etc."""
    share = tmp_path / "share"
    share.mkdir()
    (share / "ws").symlink_to("/etc")
    plan = _plan(node, mounts=[{"kind": "local", "relative_path": "share",
                                "source": str(share)}],
                 outputs={"M": {"path_prefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/share"}})
    dirs = node_dirs(plan)
    link = dirs.job_mount_root / "share"
    link.parent.mkdir(parents=True)
    link.symlink_to(share)
    why = jobview.refused(plan, dirs)
    assert why is not None and why.startswith("outputs.M:") and "/etc/" in why, why
    (share / "ws").unlink()
    assert jobview.refused(plan, dirs) is None


@strictkit.requires(os.geteuid() != 0, "root only: the view of a job's uid")
def test_a_named_path_is_reached_as_the_jobs_user_would(tmp_path: Path, node: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Folders on the way the job's uid cannot pass are passed for batchyard's own needs
    (its folders, the interpreter), never for an input or a mount the job's user named."""
    monkeypatch.setenv("BATCHYARD_JOB_UID_DIR", str(tmp_path / "uids"))
    closed = tmp_path / "closed"
    (closed / "data").mkdir(parents=True)
    os.chmod(closed, 0o700)
    open_data = tmp_path / "open-data"
    open_data.mkdir()
    plan = _plan(node, job_user="alice", inputs={"A": {"path": str(closed / "data")},
                                                 "B": {"path": str(open_data)}})
    view = jobview.JobView(plan, node_dirs(plan), [])
    view.settle()
    assert view.uid is not None and view.uid >= 1_600_000_000
    assert view.barred == [str(closed / "data")]
    binds = [p for p, _ in view.spec()["binds"]]  # type: ignore[attr-defined]
    assert str(closed / "data") not in binds
    own = node_dirs(plan).workdir
    assert own.stat().st_uid == view.uid and own.stat().st_mode & 0o777 == 0o700
