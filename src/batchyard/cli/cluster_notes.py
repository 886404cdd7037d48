"""`cluster create`'s Batch AI node options: auto storage and the node image go into the
spec; what cannot be honoured here (an image to install, an admin account to create) is
said, never dropped silently."""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

from batchyard.cli.common import fail
from batchyard.spec.cluster import IMAGE_ALIASES, IMAGE_URN_RE


def apply_node_options(spec: dict[str, Any], auto_storage: bool, image: str | None) -> None:
    if auto_storage:
        spec["auto_storage"] = True
    if image is None:
        return
    if image not in IMAGE_ALIASES and not IMAGE_URN_RE.match(image):
        fail(f"--image: {image!r} is not a Batch AI image; use one of "
             f"{', '.join(IMAGE_ALIASES)} or publisher:offer:sku:version")
    spec["image"] = image


def apply_job_limits(spec: dict[str, Any], allow_root: bool, max_pids: int | None,
                     max_output: str | None) -> None:
    """--allow-root-jobs, --max-pids and --max-output (checked by the server's model, which
    names the field)."""
    if allow_root:
        spec["allow_root_jobs"] = True
    if max_pids is not None:
        spec["max_pids"] = max_pids
    if max_output is not None:
        from batchyard.spec.bytesize import parse_size

        try:
            spec["max_output"] = parse_size(max_output)
        except ValueError as exc:
            fail(f"--max-output: {exc}")


def image_note(image: str | None) -> list[str]:
    if image is None:
        return []
    urn = IMAGE_ALIASES.get(image, image)
    return [f"note: --image {image} ({urn}) is recorded, not installed: batchyard nodes run "
            "their host's own OS; use a container image (containerSettings / "
            "environment.image) for the job's software"]


def _file_account(path: Path | None) -> bool:
    """Whether a Batch AI cluster.json gives userAccountSettings."""
    if path is None or path.suffix.lower() != ".json":
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    props = data.get("properties", data) if isinstance(data, dict) else {}
    return isinstance(props, dict) and props.get("userAccountSettings") is not None


def account_warning(backend: str, user_name: str | None, password: str | None,
                    ssh_key: str | None, path: Path | None) -> list[str]:
    """Batch AI created an admin account on every node, for ssh. batchyard has no ssh to its
    nodes (`cluster node exec` reaches them) and runs every job as an account of its
    submitter that the node makes up (node/jobuser.py), so the account is not used: say so,
    and as whom jobs will run."""
    given = [flag for flag, value in (("--user-name", user_name), ("--password", password),
                                      ("--ssh-key", ssh_key)) if value]
    if _file_account(path):
        given.append("userAccountSettings")
    if not given:
        return []
    runs_as = "an unprivileged uid of their submitter (by-<user>), or as the user the " \
        f"node's launcher runs as ({getpass.getuser()} here) when that is not root"
    return [f"warning: {', '.join(given)} not used: batchyard creates no login accounts on "
            f"its nodes; jobs run as {runs_as}, and nodes are reached with `batchyard cluster "
            "node exec`, not ssh (the password or key is not stored)"]
