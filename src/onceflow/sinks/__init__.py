"""Sinks that commit every micro-batch exactly once."""

from onceflow.sinks.base import BatchStats, ExactlyOnceSink
from onceflow.sinks.sqlite import SQLiteSink

__all__ = ["BatchStats", "ExactlyOnceSink", "SQLiteSink"]
