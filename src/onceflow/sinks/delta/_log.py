"""A Delta table's log as onceflow reads it: the deltalake import, onceflow's commits, their writers.

Shared by the sink (:mod:`onceflow.sinks.delta.sink`) and maintenance
(:mod:`onceflow.sinks.delta.maintain`); runs on the driver, once per table read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from onceflow.errors import ConfigError


def require() -> Any:
    """deltalake, or a ConfigError naming the extra to install."""
    try:
        import deltalake
    except ImportError:
        raise ConfigError("the Delta Lake sink needs deltalake, which is not installed: "
                          "pip install 'onceflow[delta]'") from None
    return deltalake


def onceflow_commits(table: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """A Delta table's commits that carry onceflow's metadata: ``(metadata, history entry)``, newest first."""
    for entry in table.history():
        raw = entry.get("onceflow")
        if raw:
            yield json.loads(raw), entry


def writers(table: Any) -> list[str]:
    """The sink ids whose commits are in a Delta table's history (newest first)."""
    return list(dict.fromkeys(str(m["sink_id"]) for m, _ in onceflow_commits(table) if m.get("sink_id")))
