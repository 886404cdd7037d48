"""Short image names (``busybox``, ``user/app:1``) under Podman. Docker reads a name without
a registry as Docker Hub's (``docker.io/library/busybox``); Podman asks its registries
configuration, and with neither an alias for the name nor an unqualified-search registry it
refuses the name ("did not resolve to an alias and no unqualified-search registries are
defined"). A job written for Docker (Batch AI's and Azure ML's images were Docker Hub's)
then fails on a Podman node. So a short name is qualified as Docker does, unless the node's
configuration says what it means: an alias for it, or search registries (Podman then
resolves it itself, as its admin set it up).

The configuration is read as containers-registries.conf(5) says: ``$CONTAINERS_REGISTRIES_CONF``,
else the user's own file (rootless), else /etc/containers/registries.conf; then the drop-in
directories (later files override earlier ones); aliases also come from the short-name
alias cache Podman records. Standard library only, like the launcher (and Python 3.10 has no
tomllib): ``read_conf`` reads the part of TOML these files use for short names.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

SYSTEM_CONF = Path("/etc/containers/registries.conf")
SYSTEM_DROP_INS = Path("/etc/containers/registries.conf.d")
ROOT_ALIAS_CACHE = Path("/var/cache/containers/short-name-aliases.conf")


@dataclass
class ShortNameRules:
    """What a node's registries configuration says about short names."""

    search: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)

    def resolves(self, image: str) -> bool:
        """Whether Podman resolves this short name by the node's own configuration."""
        return bool(self.search) or repository(image) in self.aliases


def repository(image: str) -> str:
    """The name without its tag or digest (what an alias is keyed by)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: len(name) - len(last[-1])] + last[-1].split(":", 1)[0]
    return name


def docker_qualified(image: str) -> str:
    """Docker's reading of a short name: Docker Hub, ``library/`` for official images."""
    return f"docker.io/{'' if '/' in repository(image) else 'library/'}{image}"


def _files(environ: dict[str, str]) -> list[Path]:
    rootless = os.geteuid() != 0
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    user_conf = config_home / "containers" / "registries.conf"
    if environ.get("CONTAINERS_REGISTRIES_CONF"):
        main = Path(environ["CONTAINERS_REGISTRIES_CONF"])
    elif rootless and user_conf.is_file():
        main = user_conf
    else:
        main = SYSTEM_CONF
    drop_ins = [SYSTEM_DROP_INS] + ([config_home / "containers" / "registries.conf.d"]
                                    if rootless else [])
    files = [main]
    for folder in drop_ins:
        try:
            files += sorted(p for p in folder.iterdir() if p.suffix == ".conf")
        except OSError:
            continue
    cache_home = Path(environ.get("XDG_CACHE_HOME") or home / ".cache")
    files.append(cache_home / "containers" / "short-name-aliases.conf" if rootless
                 else ROOT_ALIAS_CACHE)
    return files


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|' + r"'([^']*)'")
_TABLE = re.compile(r"^\[\[?\s*([^\]]+?)\s*\]\]?$")


def _strings(text: str) -> list[str]:
    """The TOML strings in ``text``, in order (basic strings' escapes are JSON's)."""
    out = []
    for found in _STRING.finditer(text):
        if found[2] is not None:
            out.append(found[2])
            continue
        try:
            out.append(str(json.loads(f'"{found[1]}"')))
        except ValueError:
            continue
    return out


def _code(line: str) -> str:
    """The line without its comment (a # outside strings)."""
    end, at = len(line), 0
    while at < len(line):
        if line[at] in "\"'":
            found = _STRING.match(line, at)
            at = found.end() if found else len(line)
            continue
        if line[at] == "#":
            end = at
            break
        at += 1
    return line[:end].strip()


def _open_brackets(text: str) -> int:
    bare = _STRING.sub("", text)
    return bare.count("[") - bare.count("]")


def read_conf(text: str) -> dict[str, dict[str, str | list[str]]]:
    """``{table: {key: value}}`` (top-level keys under ""): string and string-array values
    only, an array possibly over several lines; anything else is skipped."""
    out: dict[str, dict[str, str | list[str]]] = {"": {}}
    table = ""
    lines = iter(text.splitlines())
    for raw in lines:
        line = _code(raw)
        header = _TABLE.match(line)
        if header:
            table = header[1].strip()
            out.setdefault(table, {})
            continue
        key, equals, value = line.partition("=")
        if not equals:
            continue
        while value.lstrip().startswith("[") and _open_brackets(value) > 0:
            more = next(lines, None)
            if more is None:
                break
            value += " " + _code(more)
        key = key.strip()
        names = _strings(key) if key[:1] in "\"'" else [key]
        if not names:
            continue
        value = value.strip()
        if value.startswith("["):
            out[table][names[0]] = _strings(value)
        elif value[:1] in "\"'" and _strings(value):
            out[table][names[0]] = _strings(value)[0]
    return out


def _read(path: Path) -> dict[str, dict[str, str | list[str]]]:
    try:
        return read_conf(path.read_text(errors="replace"))
    except OSError:
        return {}


def podman_rules(environ: dict[str, str]) -> ShortNameRules:
    rules = ShortNameRules()
    for path in _files(environ):
        data = _read(path)
        search = data.get("", {}).get("unqualified-search-registries")
        if search is None:  # the version 1 format
            search = data.get("registries.search", {}).get("registries")
        if isinstance(search, list):
            rules.search = list(search)
        rules.aliases.update({k: v for k, v in data.get("aliases", {}).items()
                              if isinstance(v, str)})
    return rules
