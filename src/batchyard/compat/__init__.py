"""Compatibility layers: code written for other platforms' SDKs runs on batchyard with only
its imports changed (``batchyard.compat.azureml`` for the ``azureml`` SDK v1)."""
