"""azureml.core.container_registry.ContainerRegistry: the login for a private image registry
(``Environment.docker.base_image_registry``, ``Estimator(image_registry_details=...)``).

The password becomes the job's ``environment.registry.password``, which batchyard seals at
rest and never shows back."""

from __future__ import annotations


class ContainerRegistry:
    """``address`` (``myregistry.azurecr.io``), ``username`` and ``password``, set after
    construction as in Azure ML. ``registry_identity`` (a managed identity) has no meaning
    here and is refused at submit when set."""

    def __init__(self) -> None:
        self.address: str | None = None
        self.username: str | None = None
        self.password: str | None = None
        self.registry_identity: object | None = None

    def __repr__(self) -> str:  # never the password
        return f"ContainerRegistry(address={self.address!r}, username={self.username!r})"


__all__ = ["ContainerRegistry"]
