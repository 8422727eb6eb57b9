"""Which sink ids write each table: a second writer is refused at start unless the table is shared.

A sink's markers are kept per sink id, so two queries with different sink ids writing one table
each believe they own it: a copy of a job started by mistake, or a job renamed and started on a
new checkpoint, doubles the table (every row appended twice, every sum counted twice). Each
database sink (SQLite, PostgreSQL, an HTTP sink's ledger) keeps a registry in the same database:

* ``onceflow_tables(table_name, sink_id, shared, claimed_ms)`` — one row per table and sink id
  that writes it.

:func:`claim` runs in the sink's start-up check (:meth:`onceflow.sinks._core.base.Sink.check`), in
one transaction exclusive against other claims:

1. Read the table's rows.
2. Another sink id holds the table, and either of them did not declare it shared
   (``Table(shared=True)``: several queries appending their own streams into one table):
   refuse, naming both ids and the two ways out.
3. Record this sink id's row (or its new ``shared`` flag). May run any number of times.

A hand-over (in SQLite :func:`onceflow.sinks.sqlite.db.hand_over_table`, in PostgreSQL
:func:`onceflow.sinks.postgres.sql.hand_over`) gives a table to another sink id (``onceflow tables
--hand-over``): the old rows go, the new id's row is written, in one transaction; the query
with the new id then starts. The registry does not move markers: the new sink id starts its own
history.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from onceflow.errors import ConfigError
from onceflow.sinks._core.tables import Table

TABLE = "onceflow_tables"


def create_sql(int_type: str, text_type: str) -> str:
    """The registry's ``CREATE TABLE IF NOT EXISTS`` (column types of the backend)."""
    return (f"CREATE TABLE IF NOT EXISTS {TABLE}(table_name {text_type} NOT NULL, "
            f"sink_id {text_type} NOT NULL, shared {int_type} NOT NULL, claimed_ms {int_type} NOT NULL, "
            "PRIMARY KEY(table_name, sink_id))")


def refusal(where: str, table: str, sink_id: str, others: Sequence[tuple[str, bool]], shared: bool,
            tool: str) -> str | None:
    """Step 2: why ``sink_id`` may not write ``table`` (None: it may).

    Args:
        where: The database (for the message).
        table: The table.
        sink_id: The sink that starts.
        others: ``(sink_id, shared)`` of the table's other writers.
        shared: Whether this sink declares the table shared.
        tool: The ``onceflow tables`` options that name this database.
    """
    blocking = [(o, s) for o, s in others if not (s and shared)]
    if not blocking:
        return None
    other, other_shared = blocking[0]
    why = ("it is not declared shared by this query" if other_shared else
           f"sink {other!r} did not declare it shared")
    return (f"table {table!r} in {where} is written by sink id {other!r}, and this query's sink id is "
            f"{sink_id!r} ({why}). Two sink ids on one table each write every batch of their own, so a copy "
            "of a job or a job renamed on a new checkpoint would write its rows twice; nothing was written. "
            f"If both queries really append their own streams into it, declare Table(..., shared=True) in "
            f"both; if the table now belongs to {sink_id!r}, hand it over first: `onceflow tables {tool} "
            f"--hand-over {table} --to {sink_id}`")


def claim(read: Callable[[str], list[tuple[str, bool]]], write: Callable[[str, bool], None],
          where: str, sink_id: str, specs: Mapping[str, Table], tool: str) -> None:
    """Steps 1-3 for every table of ``specs``, inside the caller's exclusive transaction.

    Args:
        read: Table -> its rows ``(sink_id, shared)``.
        write: ``(table, shared)`` -> record this sink id's row (insert or update).
        where: The database (for the message).
        sink_id: The sink that starts.
        specs: The query's tables.
        tool: The ``onceflow tables`` options that name this database.

    Raises:
        ConfigError: Another sink id writes a table (see :func:`refusal`).
    """
    for name, spec in specs.items():
        rows = read(name)
        others = [(s, bool(f)) for s, f in rows if s != sink_id]
        why = refusal(where, name, sink_id, others, spec.shared, tool)
        if why:
            raise ConfigError(why)
        if (sink_id, spec.shared) not in [(s, bool(f)) for s, f in rows]:
            write(name, spec.shared)


def now_ms() -> int:
    """The claim's time."""
    return int(time.time() * 1000)
