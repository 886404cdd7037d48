"""Looking into running jobs: pure views of what nodes report (stack dumps)."""
