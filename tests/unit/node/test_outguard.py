"""Reading an output folder never leaves it (node/outguard.py): links to the token, the
database, /etc/shadow, a folder outside, or an output folder that is itself a link, are
skipped and named; links that stay inside are read as the file they name."""

from __future__ import annotations

import os
from pathlib import Path

from batchyard.node.outguard import Walk, size


def _read(walk: Walk) -> dict[str, bytes]:
    out = {}
    for rel, fd in walk.files():
        with os.fdopen(fd, "rb") as fh:
            out[rel] = fh.read()
    return out


def test_links_out_of_the_folder_are_skipped_and_named(tmp_path: Path) -> None:
    secret = tmp_path / "home" / "token"
    secret.parent.mkdir()
    secret.write_text("admin-token")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "model.txt").write_text("weights")
    (out / "sub" / "b.txt").write_text("deep")
    (out / "tok").symlink_to(secret)
    (out / "shadow").symlink_to("/etc/shadow")
    (out / "up").symlink_to("../home/token")
    (out / "etc").symlink_to("/etc")
    (out / "sub" / "latest").symlink_to("../model.txt")
    (out / "abs").symlink_to(out / "sub" / "b.txt")
    (out / "gone").symlink_to("nowhere")
    os.mkfifo(out / "fifo")
    walk = Walk(str(out))
    got = _read(walk)
    assert got == {"model.txt": b"weights", "sub/b.txt": b"deep", "sub/latest": b"weights",
                   "abs": b"deep"}
    text = "\n".join(walk.skipped)
    for name in ("tok", "shadow", "up", "etc", "gone"):
        assert f"{name} -> " in text, text
    assert b"admin-token" not in b"".join(got.values())


def test_an_output_folder_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    link = tmp_path / "OUT"
    link.symlink_to("/etc")
    walk = Walk(str(link))
    assert _read(walk) == {}
    assert walk.skipped == [f"{link}: the output folder is a link (to /etc): not uploaded"]
    assert _read(Walk(str(tmp_path / "missing"))) == {}


def test_a_link_swapped_in_for_a_folder_meanwhile_leads_nowhere(tmp_path: Path) -> None:
    """The walk holds each folder open: renaming it and planting a link in its place after
    the walk began does not make it read the link's target."""
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "a" / "one.txt").write_text("1")
    (out / "b").mkdir()
    (out / "b" / "two.txt").write_text("2")
    walk = Walk(str(out))
    files = walk.files()
    _first, fd = next(files)
    os.close(fd)
    (out / "b").rename(tmp_path / "b-moved")
    (out / "b").symlink_to("/etc")
    rest = []
    for rel, fd in files:
        rest.append(rel)
        os.close(fd)
    assert all(not r.startswith("b/") or r == "b/two.txt" for r in rest), rest
    assert "b/passwd" not in rest


def test_size_counts_files_not_links(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"y" * 500)
    (tmp_path / "big").symlink_to("/etc/passwd")
    assert size(str(tmp_path)) == 1500
    assert size(str(tmp_path), stop_at=100) >= 500
