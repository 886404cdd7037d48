"""Storage: datastores (local directory, Azure Blob, S3) through fsspec, credentials sealed at
rest, and the node-side stage-in / stage-out of inputs, outputs and Batch AI mount volumes."""
