"""The `batchyard` command line (Typer + Rich), shaped after `az batchai`."""
