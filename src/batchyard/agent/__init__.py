"""`batchyard agent`: the daemon that joins a machine you own to a cluster."""
