"""Table specifications of the generic sinks: write modes, keys, and batch validation.

A :class:`Table` says how each micro-batch's rows reach one table:

* ``append`` — every row of every batch, exactly once (the batch marker makes a replay a no-op);
* ``upsert`` — by ``key``: a row replaces the stored row with the same key;
* ``add`` — by ``key``: the ``add`` columns are added to the stored values (per-batch deltas,
  e.g. counts or sums per window), the other columns replaced.

A batch is checked against its specs *before* anything is written (:func:`check_batch`): key
columns and ``add`` columns without nulls, ``add`` columns numeric, no key twice within one
batch for ``upsert``/``add`` (which row would win is undefined). A batch that fails is refused
with a :class:`onceflow.errors.BatchRejectedError` naming the table, the column and the first bad
row, so the query stops before Spark's commit log and nothing of the batch is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import BatchRejectedError, ConfigError

MODES = ("append", "upsert", "add")


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Table:
    """How a batch's rows are written to one table.

    Args:
        key: Key column(s) (the table's primary key when onceflow creates it); needed by
            ``upsert`` and ``add``.
        add: Column(s) added to the stored value instead of replaced (mode ``add``).
        mode: ``append``, ``upsert`` or ``add``; inferred when omitted (``add`` given:
            ``add``; ``key`` given: ``upsert``; else ``append``).

    Raises:
        ConfigError: An unknown mode, or a mode without the columns it needs.
    """

    key: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    mode: str = ""

    def __init__(self, key: str | Sequence[str] | None = None, add: str | Sequence[str] | None = None,
                 mode: str | None = None) -> None:
        keys, adds = _names(key), _names(add)
        chosen = mode or ("add" if adds else "upsert" if keys else "append")
        if chosen not in MODES:
            raise ConfigError(f"unknown table mode {chosen!r}; use one of {MODES}")
        if chosen in ("upsert", "add") and not keys:
            raise ConfigError(f"mode {chosen!r} needs key=[...] (the columns that identify a row)")
        if chosen == "add" and not adds:
            raise ConfigError("mode 'add' needs add=[...] (the numeric columns to add up)")
        if chosen != "add" and adds:
            raise ConfigError(f"add=[...] is for mode 'add', not {chosen!r}")
        overlap = set(keys) & set(adds)
        if overlap:
            raise ConfigError(f"columns {sorted(overlap)} cannot be both key and add")
        object.__setattr__(self, "key", keys)
        object.__setattr__(self, "add", adds)
        object.__setattr__(self, "mode", chosen)


def check_specs(tables: Mapping[str, Table]) -> dict[str, Table]:
    """Validate a ``tables=`` argument: names and specs.

    Raises:
        ConfigError: Not a mapping of plain table names to :class:`Table`.
    """
    if not isinstance(tables, Mapping) or not tables:
        raise ConfigError("tables must be a non-empty dict {name: onceflow.Table(...)}")
    out = {}
    for name, spec in tables.items():
        if not isinstance(name, str) or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ConfigError(f"table name {name!r}: use letters, digits and _ (not starting with a digit)")
        if name.lower().startswith("onceflow_"):
            raise ConfigError(f"table name {name!r}: the onceflow_ prefix is reserved for onceflow's tables")
        if not isinstance(spec, Table):
            raise ConfigError(f"tables[{name!r}] must be an onceflow.Table, got {type(spec).__name__}")
        out[name] = spec
    return out


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    idx = pc.indices_nonzero(mask.fill_null(False))
    return int(idx[0].as_py()) if len(idx) else None


def _row(table: pa.Table, i: int) -> dict[str, Any]:
    return table.slice(i, 1).to_pylist()[0]  # type: ignore[no-any-return]


def check_batch(name: str, spec: Table, rows: pa.Table) -> None:
    """Refuse a batch that could not be written (before anything is written).

    Args:
        name: The table's name (for the message).
        spec: Its specification.
        rows: The batch's rows for it.

    Raises:
        BatchRejectedError: A missing column, a null key or add value, a non-numeric add
            column, or a key twice in the batch; naming table, column and first bad row.
    """
    missing = [c for c in (*spec.key, *spec.add) if c not in rows.column_names]
    if missing:
        raise BatchRejectedError(f"table {name!r}: the batch has no column(s) {missing} (its columns: "
                                 f"{rows.column_names})")
    for col in (*spec.key, *spec.add):
        bad = _first(rows.column(col).is_null())
        if bad is not None:
            what = "key" if col in spec.key else "add"
            raise BatchRejectedError(f"table {name!r}: {what} column {col!r} is null in row {bad} of batch "
                                     f"({_row(rows, bad)}); nothing of the batch was written — fix the input "
                                     "or the transformation, then restart the query")
    for col in spec.add:
        typ = rows.schema.field(col).type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)):
            raise BatchRejectedError(f"table {name!r}: add column {col!r} must be numeric, got {typ}")
    if spec.key and rows.num_rows:
        keys = rows.select(list(spec.key))
        counts = keys.group_by(list(spec.key)).aggregate([([], "count_all")])
        dup = _first(pc.greater(counts.column("count_all"), 1))
        if dup is not None:
            key = _row(counts.select(list(spec.key)), dup)
            raise BatchRejectedError(f"table {name!r}: key {key} appears more than once in one batch; "
                                     f"aggregate per key before writing (mode {spec.mode!r})")


def check_outputs(outputs: Mapping[str, Any], specs: Mapping[str, Table], rows: bool = True) -> None:
    """Step 1 of every generic sink: each output is for a table of ``tables=`` and fits its spec.

    With ``rows`` (the outputs are Arrow tables) each is checked by :func:`check_batch`.

    Raises:
        ConfigError: An output for a table ``tables=`` does not name.
        BatchRejectedError: See :func:`check_batch`.
    """
    for name, out in outputs.items():
        if name not in specs:
            raise ConfigError(f"the batch has rows for table {name!r}, which tables= does not name "
                              f"(it names {sorted(specs)})")
        if rows:
            check_batch(name, specs[name], out)
