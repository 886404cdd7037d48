"""What ``GET /metrics`` serves (Prometheus exposition through prometheus-client): counters
and histograms each server process keeps (``instruments``), shared by every worker of a
``--workers`` server through prometheus-client's multi-process files, and the state of the
cluster read from the database at each scrape (``collector``)."""
