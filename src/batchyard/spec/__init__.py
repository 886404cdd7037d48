"""Job and cluster formats, all turned into one validated model (DESIGN §3)."""
