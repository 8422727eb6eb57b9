"""Ready-made exactly-once pipelines."""
