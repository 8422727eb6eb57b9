"""Checking results against the source: recomputation and comparison."""
