"""The HTTP client shared by the CLI, the SDK and the azureml compatibility layer."""

from batchyard.client.http import Client

__all__ = ["Client"]
