"""Replayable sources of events."""

from onceflow.sources.log import EventLog

__all__ = ["EventLog"]
