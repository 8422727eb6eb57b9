"""Table specifications of the generic sinks: write modes, keys, and batch validation.

A :class:`Table` says how each micro-batch's rows reach one table:

* ``append`` — every row of every batch, exactly once (the batch marker makes a replay a no-op);
* ``upsert`` — by ``key``: a row replaces the stored row with the same key;
* ``merge`` — by ``key``: per-batch partial aggregates merged into the stored values: the
  ``add`` columns are added (counts, sums), the ``max`` columns keep the greater and the ``min``
  columns the smaller value; the other columns are replaced. Count, sum, min, max and an
  average (a sum and a count) per key or window, exactly, without Spark's aggregation state.
  A null in a merged column is ignored, as SQL's aggregates ignore it (``add`` of a null
  leaves the stored value; a null stored value takes the batch's value). ``add`` is the old
  name of this mode and is still accepted.

Each batch is checked against these specs before anything is written
(:mod:`onceflow.sinks._core.checks`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onceflow.errors import ConfigError, refuse_unknown

MODES = ("append", "upsert", "merge")
"""The write modes (``add`` is accepted as the old name of ``merge``)."""

MERGES = ("add", "max", "min")
"""How a ``merge`` table combines a column's stored value with the batch's."""


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def merges(add: Sequence[str], maxes: Sequence[str], mins: Sequence[str]) -> dict[str, str]:
    """Merged column -> how it merges (``add``, ``max`` or ``min``)."""
    return {**dict.fromkeys(add, "add"), **dict.fromkeys(maxes, "max"), **dict.fromkeys(mins, "min")}


@dataclass(frozen=True)
class Table:
    """How a batch's rows are written to one table.

    Args:
        key: Key column(s) (the table's primary key when onceflow creates it); needed by
            ``upsert`` and ``merge``.
        add: Column(s) added to the stored value (mode ``merge``), e.g. counts and sums.
        max: Column(s) that keep the greater of the stored and the batch's value (``merge``).
        min: Column(s) that keep the smaller of the stored and the batch's value (``merge``).
        mode: ``append``, ``upsert`` or ``merge`` (``add`` is accepted for ``merge``); inferred
            when omitted (``add``/``max``/``min`` given: ``merge``; ``key`` given: ``upsert``;
            else ``append``).
        shared: Other queries (other sink ids) write this table too, each its own stream: without
            it a second sink id on the table is refused at start (:mod:`onceflow.sinks._core.owners`).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Raises:
        ConfigError: An unknown mode or keyword, a mode without the columns it needs, or a
            column named twice.
    """

    key: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    max: tuple[str, ...] = ()
    min: tuple[str, ...] = ()
    mode: str = ""
    shared: bool = False

    def __init__(self, key: str | Sequence[str] | None = None, add: str | Sequence[str] | None = None,
                 mode: str | None = None, *, max: str | Sequence[str] | None = None,  # noqa: A002
                 min: str | Sequence[str] | None = None, shared: bool = False,  # noqa: A002
                 **unknown: Any) -> None:  # (min, max: the Table's words for the merges)
        refuse_unknown(set(unknown), {"key", "add", "max", "min", "mode", "shared"}, "onceflow.Table")
        keys, adds, maxes, mins = _names(key), _names(add), _names(max), _names(min)
        merged = (*adds, *maxes, *mins)
        chosen = "merge" if mode == "add" else mode or ("merge" if merged else "upsert" if keys else "append")
        if chosen not in MODES:
            raise ConfigError(f"unknown table mode {chosen!r}; use one of {MODES}")
        if chosen in ("upsert", "merge") and not keys:
            raise ConfigError(f"mode {chosen!r} needs key=[...] (the columns that identify a row)")
        if chosen == "merge" and not merged:
            raise ConfigError("mode 'merge' needs add=[...], max=[...] or min=[...] (the columns to merge)")
        if chosen != "merge" and merged:
            raise ConfigError(f"add=/max=/min= are for mode 'merge', not {chosen!r}")
        overlap = set(keys) & set(merged)
        if overlap:
            raise ConfigError(f"columns {sorted(overlap)} cannot be both key and merged (add/max/min)")
        twice = sorted({c for c in merged if merged.count(c) > 1})
        if twice:
            raise ConfigError(f"columns {twice} are named in more than one of add=, max=, min=")
        object.__setattr__(self, "key", keys)
        object.__setattr__(self, "add", adds)
        object.__setattr__(self, "max", maxes)
        object.__setattr__(self, "min", mins)
        object.__setattr__(self, "mode", chosen)
        object.__setattr__(self, "shared", bool(shared))

    @property
    def merged(self) -> dict[str, str]:
        """Merged column -> how (``add``, ``max`` or ``min``), for a ``merge`` table."""
        return merges(self.add, self.max, self.min)

    def describe(self) -> dict[str, Any]:
        """The spec as plain JSON (``Table(**spec.describe())`` makes it again)."""
        return {"key": list(self.key), "add": list(self.add), "max": list(self.max), "min": list(self.min),
                "mode": self.mode, "shared": self.shared}


def check_specs(tables: Mapping[str, Table], topics: bool = False) -> dict[str, Table]:
    """Validate a ``tables=`` argument: names and specs.

    Args:
        tables: The argument.
        topics: The sink's tables are Kafka topics: names may also hold ``.`` and ``-``
            (Kafka's rule, at most 249 characters).

    Raises:
        ConfigError: Not a mapping of plain table names to :class:`Table`.
    """
    if not isinstance(tables, Mapping) or not tables:
        raise ConfigError("tables must be a non-empty dict {name: onceflow.Table(...)}")
    out = {}
    for name, spec in tables.items():
        if topics:
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name) \
                    or name in (".", ".."):
                raise ConfigError(f"topic name {name!r}: use letters, digits, '.', '_' and '-' (at most 249)")
        elif not isinstance(name, str) or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ConfigError(f"table name {name!r}: use letters, digits and _ (not starting with a digit)")
        if name.lower().startswith("onceflow_"):
            raise ConfigError(f"table name {name!r}: the onceflow_ prefix is reserved for onceflow's tables")
        if not isinstance(spec, Table):
            raise ConfigError(f"tables[{name!r}] must be an onceflow.Table, got {type(spec).__name__}")
        out[name] = spec
    return out
