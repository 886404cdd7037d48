"""The batchyard server: REST API + reconciler loop in one process."""
