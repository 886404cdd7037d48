"""Short image names under Podman, offline: registries.conf read as Podman reads it (the main
file, the drop-ins, the alias cache; v2 and v1 formats), Docker's reading of a short name, and
when the node's configuration says otherwise. Real runs: tests/e2e/test_container_short_names.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import strictkit
from batchyard.node import shortnames
from batchyard.node.shortnames import docker_qualified, podman_rules, read_conf, repository

DEBIAN_SHORTNAMES = Path("/etc/containers/registries.conf.d/shortnames.conf")


def test_docker_reads_a_short_name_as_docker_hub() -> None:
    assert docker_qualified("busybox") == "docker.io/library/busybox"
    assert docker_qualified("busybox:1.36") == "docker.io/library/busybox:1.36"
    assert docker_qualified("user/app:1") == "docker.io/user/app:1"
    assert docker_qualified("busybox@sha256:ab") == "docker.io/library/busybox@sha256:ab"
    assert repository("user/app:1@sha256:ab") == "user/app"
    assert repository("busybox:1.36") == "busybox"


def test_the_toml_these_files_use() -> None:
    text = """\
# comment
unqualified-search-registries = ["registry.example:5000", # a comment in the array
  'quay.io']  # and after it
short-name-mode = "enforcing"
[aliases]
"busybox" = "docker.io/library/busybox"  # the usual
"my/app" = 'registry.example:5000/my/app'
[[registry]]
location = "registry.example:5000"
insecure = true
[registries.search]
registries = ["old.example"]
"""
    conf = read_conf(text)
    assert conf[""]["unqualified-search-registries"] == ["registry.example:5000", "quay.io"]
    assert conf["aliases"] == {"busybox": "docker.io/library/busybox",
                               "my/app": "registry.example:5000/my/app"}
    assert conf["registries.search"]["registries"] == ["old.example"]


@strictkit.requires(not DEBIAN_SHORTNAMES.is_file(), "no containers-common here")
def test_debians_alias_file_reads() -> None:
    aliases = read_conf(DEBIAN_SHORTNAMES.read_text())["aliases"]
    assert aliases["busybox"] == "docker.io/library/busybox" and len(aliases) > 20


def test_the_nodes_configuration_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    drop_ins = tmp_path / "registries.conf.d"
    drop_ins.mkdir()
    monkeypatch.setattr(shortnames, "SYSTEM_DROP_INS", drop_ins)
    monkeypatch.setattr(shortnames, "ROOT_ALIAS_CACHE", tmp_path / "cache.conf")
    main = tmp_path / "registries.conf"
    env = {"CONTAINERS_REGISTRIES_CONF": str(main), "HOME": str(tmp_path)}
    main.write_text('unqualified-search-registries = []\nshort-name-mode = "enforcing"\n')
    rules = podman_rules(env)
    assert not rules.resolves("tool") and not rules.resolves("busybox")
    (drop_ins / "000-shortnames.conf").write_text('[aliases]\n"busybox" = "x.io/busybox"\n')
    assert podman_rules(env).resolves("busybox:1.36") and not podman_rules(env).resolves("tool")
    (tmp_path / "cache.conf").write_text('[aliases]\n"tool" = "y.io/tool"\n')
    assert podman_rules(env).resolves("tool:2")
    main.write_text('unqualified-search-registries = ["quay.io"]\n')
    assert podman_rules(env).resolves("anything")
    # a drop-in's own list replaces the main file's
    (drop_ins / "010-none.conf").write_text("unqualified-search-registries = []\n")
    assert not podman_rules(env).resolves("anything")
    main.write_text('[registries.search]\nregistries = ["old.example"]\n')  # version 1
    (drop_ins / "010-none.conf").unlink()
    assert podman_rules(env).search == ["old.example"]
