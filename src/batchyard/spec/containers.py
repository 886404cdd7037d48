"""Container images in job specs: what an image reference, a registry host and a ``/dev/shm``
size may look like, and Batch AI's ``containerSettings`` mapped onto the native
``environment`` block.

The checks are strict on purpose: an image reference ends up as an argument of ``docker run``
/ ``podman run`` and a size as ``--shm-size``, so a value that is not what the runtime means
(``-v /:/host``, ``8 gb``) is refused at submit naming the field, instead of failing, or worse
being read as an option, on a node. This module imports nothing from the rest of the spec
package, so that ``spec.job`` can use its checks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from batchyard.errors import SpecError

if TYPE_CHECKING:
    from batchyard.spec.batchai_schema import _ContainerSettings, _KeyVaultReference

MAX_IMAGE = 512  # characters of a whole reference (Docker allows 255 for the name alone)
MAX_SHM = 2**63 - 1  # bytes: the runtimes parse --shm-size into a signed 64-bit number

# The grammar of github.com/distribution/reference: [host[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
IMAGE_RE = re.compile(rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$")
HOST_RE = re.compile(rf"^{_HOST}$")
SHM_RE = re.compile(r"^([0-9]{1,20})([bkmg]?)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# Docker Hub's names for itself: a credential for any of them is one for the Hub.
DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io",
                        "registry.hub.docker.com"})
# https://VAULT.vault.azure.net/secrets/NAME[/VERSION] (other clouds: vault.azure.cn, ...)
_KEY_VAULT_URL = re.compile(r"^https://[^/\s]+/secrets/([0-9A-Za-z-]{1,127})(?:/[0-9A-Za-z]*)?/?$")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")


def check_image(value: str) -> str:
    if len(value) > MAX_IMAGE or not IMAGE_RE.fullmatch(value):
        too_long = f" (at most {MAX_IMAGE} characters)" if len(value) > MAX_IMAGE else ""
        raise ValueError(f"{_shown(value)} is not a container image reference{too_long}: give "
                         "[registry[:port]/]name[:tag][@digest], the name in lower case, e.g. "
                         "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime")
    return value


def check_host(value: str) -> str:
    if len(value) > 255 or not HOST_RE.fullmatch(value):
        raise ValueError(f"{_shown(value)} is not a registry host: give host[:port] without a "
                         "scheme or path, e.g. myregistry.azurecr.io or 127.0.0.1:5000")
    return value


def shm_bytes(value: str) -> int:
    """``8g`` -> 8 GiB in bytes; ValueError naming the syntax when it is not a size."""
    match = SHM_RE.fullmatch(value)
    size = int(match.group(1)) * _UNITS[match.group(2).lower()] if match else 0
    if not 0 < size <= MAX_SHM:
        raise ValueError(f"{_shown(value)} is not a size: give a number above 0 and an "
                         "optional unit b, k, m or g (docker --shm-size), e.g. 8g or 512m")
    return size


def registry_of(image: str) -> str | None:
    """The registry host an image reference names, None for Docker Hub's short names (the
    runtimes' rule: a first component with a dot or a port, or ``localhost``)."""
    first, slash, _rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        return first
    return None


def same_registry(image: str, server: str) -> bool:
    """Whether ``server`` is the registry the image is pulled from."""
    own = (registry_of(image) or "docker.io").lower()
    server = server.lower()
    return own == server or (own in DOCKER_HUB and server in DOCKER_HUB)


def registry_host(url: str) -> str | None:
    """A registry URL as Batch AI and Azure ML took it (``https://x.azurecr.io/``,
    ``https://index.docker.io/v1/``) -> its host[:port]; None for Docker Hub, which is where an
    image without a host comes from anyway."""
    host = url.strip().split("://", 1)[-1].split("/", 1)[0]
    return None if host.lower() in DOCKER_HUB else host


def qualified(image: str, server: str | None) -> str:
    """An image named without its registry, given with one (``myimage`` and serverUrl
    ``x.azurecr.io``), as the reference a runtime pulls: ``x.azurecr.io/myimage``."""
    if server and registry_of(image) is None and server.lower() not in DOCKER_HUB:
        return f"{server}/{image}"
    return image


def key_vault_secret(ref: _KeyVaultReference, secrets: Mapping[str, str], source: str,
                     path: str) -> str:
    """The job secret that stands in for a Key Vault secret (Key Vault is not reachable here):
    the vault's secret name with ``-`` as ``_`` (a secret names an environment variable)."""
    match = _KEY_VAULT_URL.fullmatch(ref.secret_url)
    if not match:
        raise _fail(source, f"{path}.secretUrl", "not a Key Vault secret URL (https://VAULT."
                    "vault.azure.net/secrets/NAME[/VERSION])")
    from batchyard.spec.job import ENV_ID_RE  # here: spec.job imports this module

    vault_name = match.group(1)
    name = vault_name.replace("-", "_")
    if name in secrets:
        return name
    if not re.fullmatch(ENV_ID_RE, name):
        raise _fail(source, path, f"Azure Key Vault is not reachable here, and its secret name "
                    f"{vault_name!r} cannot name one of the job's secrets (they are environment "
                    "variable names); give credentials.password instead")
    renamed = f" (the Key Vault name {vault_name!r} with - as _)" if name != vault_name else ""
    raise _fail(source, path, f"Azure Key Vault is not reachable here: add the registry "
                f'password to the job\'s secrets as {{"name": "{name}", "value": "..."}}'
                f"{renamed}, or give credentials.password")


def batchai_environment(settings: _ContainerSettings, secrets: Mapping[str, str],
                        source: str) -> dict[str, Any]:
    """``containerSettings`` -> the native ``environment`` fields (image, registry,
    shm_size); the native spec validates the values themselves."""
    where = "containerSettings.imageSourceRegistry"
    source_registry = settings.image_source_registry
    server = registry_host(source_registry.server_url) if source_registry.server_url else None
    if server is not None:
        try:
            check_host(server)
        except ValueError as exc:
            raise _fail(source, f"{where}.serverUrl", str(exc)) from None
    env: dict[str, Any] = {"image": qualified(source_registry.image, server)}
    if settings.shm_size is not None:
        env["shm_size"] = settings.shm_size
    registry: dict[str, Any] = {"server": server} if server else {}
    creds = source_registry.credentials
    if creds is not None:
        registry["username"] = creds.username
        if (creds.password is None) == (creds.password_secret_reference is None):
            raise _fail(source, f"{where}.credentials", "give exactly one of password and "
                        "passwordSecretReference")
        if creds.password_secret_reference is not None:
            registry["password_secret"] = key_vault_secret(
                creds.password_secret_reference, secrets, source,
                f"{where}.credentials.passwordSecretReference")
        else:
            registry["password"] = creds.password
    if registry:
        env["registry"] = registry
    return env


def _fail(source: str, path: str, message: str) -> SpecError:
    return SpecError(f"{source}: {path}: {message}", details=[{"field": path, "message": message}])
