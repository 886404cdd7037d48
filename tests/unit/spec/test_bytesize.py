"""Sizes as users write them (limits.max_output, cluster --max-output)."""

from __future__ import annotations

import pytest

from batchyard.spec.bytesize import human, parse_size
from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.job import JobSpec


@pytest.mark.parametrize(("text", "size"), [
    ("10G", 10 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("10GiB", 10 << 30),
    ("10 GB", 10 << 30), ("4096", 4096), (4096, 4096), ("1k", 1024), ("2T", 2 << 40)])
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "ten", "-1", "0", "1X", True, "1e3"])
def test_not_sizes(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)  # type: ignore[arg-type]


def test_human() -> None:
    assert [human(n) for n in (10 << 30, 3 << 29, 512 << 20, 100)] == [
        "10G", "1.5G", "512M", "100B"]


def test_job_and_cluster_fields_name_what_is_wrong() -> None:
    spec = JobSpec.model_validate({"command": "x", "limits": {"max_output": "1M",
                                                             "max_pids": 64}})
    assert (spec.limits.max_output, spec.limits.max_pids) == (1 << 20, 64)
    with pytest.raises(ValueError, match="max_output"):
        JobSpec.model_validate({"command": "x", "limits": {"max_output": "lots"}})
    with pytest.raises(ValueError, match="max_pids"):
        JobSpec.model_validate({"command": "x", "limits": {"max_pids": 3}})
    cluster = ClusterSpec(name="c", allow_root_jobs=True, max_output="2G", max_pids=128)
    assert (cluster.allow_root_jobs, cluster.max_output, cluster.max_pids) == (
        True, 2 << 30, 128)
    assert ClusterSpec(name="c").allow_root_jobs is False
    assert ClusterSpec(name="c").max_pids == 4096
