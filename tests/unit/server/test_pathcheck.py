"""Which paths of a job spec the server checks at submit (services/pathcheck.py): every
local one, in any field that names one, and none that is a datastore, a URL or a variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.errors import SpecError
from batchyard.server.services.pathcheck import Roots, local_paths


def test_every_local_path_of_a_spec_is_found() -> None:
    spec = {"code": "/srv/code", "stdouterr_path_prefix": "/logs",
            "inputs": {"A": {"path": "/data/a"}, "B": {"path": "datastore://s/x"},
                       "C": {"path": "az://c/x"}, "D": {"path": "file:///data/d"},
                       "E": {"path": "azureml:ds:1"}},
            "mounts": [{"kind": "local", "relative_path": "m", "source": "/share"},
                       {"kind": "azure_blob", "relative_path": "b", "source": "acct/c"}],
            "outputs": {"O": {"path_prefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/x"},
                        "P": {"path_prefix": "/out"}}}
    assert local_paths(spec) == [
        ("inputs.A.path", "/data/a"), ("inputs.D.path", "file:///data/d"),
        ("mounts[0].source", "/share"), ("outputs.P.path_prefix", "/out"),
        ("stdouterr_path_prefix", "/logs"), ("code", "/srv/code")]
    assert local_paths({"code": "snapshot:abc", "command": "x"}) == []


def test_roots_refuse_with_a_spec_error_naming_the_field(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "datastores" / "ws").mkdir(parents=True)
    roots = Roots((str(home),), (str(home / "datastores" / "ws"),))
    with pytest.raises(SpecError) as caught:
        roots.check(str(home / "token"), "inputs.T1.path")
    assert caught.value.message.startswith("inputs.T1.path: ")
    assert caught.value.details == [{"field": "inputs.T1.path",
                                     "message": "reaches a hidden folder"}]
    with pytest.raises(SpecError, match="climbs out"):
        roots.check("../../token", "inputs.T1.path")
    assert roots.check(str(home / "datastores" / "ws" / "f"), "x").endswith("/ws/f")
