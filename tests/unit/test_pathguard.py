"""The one path check (batchyard/pathguard.py): a path is refused when it resolves into a
hidden folder, or contains one; links count for where they lead; allowed areas inside a
hidden folder (a job's own folders, its workspace's datastores) stay usable."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard import pathguard


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    (home / "datastores" / "ws").mkdir(parents=True)
    (home / "token").write_text("secret")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("1,2")
    (data / "to-token").symlink_to(home / "token")
    (data / "to-home").symlink_to(home)
    return {"home": home, "data": data, "root": tmp_path}


@pytest.mark.parametrize("given", [
    "{home}/token", "{home}", "{home}/../home/token", "file://{home}/token",
    "{data}/to-token", "{data}/to-home/token", "{root}", "/",
])
def test_paths_into_or_around_a_hidden_folder_are_refused(tree: dict[str, Path],
                                                          given: str) -> None:
    path = given.format(**tree)
    with pytest.raises(pathguard.PathRefused) as caught:
        pathguard.check(path, "inputs.T1.path", [str(tree["home"])])
    assert caught.value.field == "inputs.T1.path"
    assert caught.value.message.startswith("inputs.T1.path: ")


def test_other_paths_pass_resolved(tree: dict[str, Path]) -> None:
    found = pathguard.check(str(tree["data"] / "train.csv"), "f", [str(tree["home"])])
    assert found == str((tree["data"] / "train.csv").resolve())
    assert pathguard.check("train.csv", "f", [str(tree["home"])], base=str(tree["data"])) \
        == found


def test_an_allowed_area_inside_a_hidden_folder_passes(tree: dict[str, Path]) -> None:
    home = str(tree["home"])
    area = str(tree["home"] / "datastores" / "ws")
    assert pathguard.check(f"{area}/x", "f", [home], allowed=[area]) == f"{area}/x"
    with pytest.raises(pathguard.PathRefused):
        pathguard.check(f"{home}/datastores/other/x", "f", [home], allowed=[area])
    with pytest.raises(pathguard.PathRefused):  # its parent still holds the token
        pathguard.check(f"{home}/datastores", "f", [home], allowed=[area])


def test_a_hidden_file_is_refused_and_its_folder_too(tree: dict[str, Path]) -> None:
    key = tree["data"] / "server.key"
    key.write_text("k")
    for path in (key, tree["data"]):
        with pytest.raises(pathguard.PathRefused):
            pathguard.check(str(path), "code", [str(key)])


def test_climbing_relative_paths() -> None:
    assert pathguard.climbs("../x") and pathguard.climbs("a/../../x") and pathguard.climbs("..")
    assert not pathguard.climbs("a/../b") and not pathguard.climbs("/abs/../x")
    assert not pathguard.climbs("data/train")
