"""Example pipelines written on onceflow's public API: short, copyable, tested."""
