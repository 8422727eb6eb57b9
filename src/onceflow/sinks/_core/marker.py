"""The batch marker: one row per committed batch and sink id, written in the batch's own commit.

Every sink records, in the same transaction (or commit) that makes a batch's rows visible, a
marker row ``(sink_id, batch_id)`` with the batch's metrics. The marker is what makes a
replay a no-op (step 2 of :mod:`onceflow.sinks._core.base`), and what ``SELECT * FROM
onceflow_batches`` shows a user. Its columns, the same in every backend (SQLite and
PostgreSQL tables, the ledger of the HTTP sink, the commit metadata of a Delta table):

========================  ==================================================================
``sink_id``               the marker namespace (the sink's ``sink_id``)
``batch_id``              Spark's micro-batch id
``committed_ms``          when the commit happened (epoch ms)
``input_rows``            rows the batch read from its source (the Parquet files' row counts;
                          for other sources Spark's scan metrics of the batch's plan)
``late_dropped``          input rows the watermark dropped (Spark's late rule over the files'
                          event times; else Spark's ``numRowsDroppedByWatermark``)
``duplicates_dropped``    rows a deduplication dropped (Spark's ``numDroppedDuplicateRows``);
                          NULL when the query has no deduplication
``events_counted``        rows of the query's DataFrame in the batch (what ``per_batch`` got:
                          after deduplication and late drops, after a streaming aggregation)
``rows_written``          rows written to the tables, over all of them
``late_watermark_ms``     the watermark the late rows were behind
``tables``                rows written per table (JSON ``{table: rows}``)
``rejected_rows``         input records the query's contract rejected (:mod:`onceflow.engine.contract`):
                          written to the ``rejects=`` table; NULL when the query has no contract
``input_range``           the batch's input as Spark's checkpoint planned it (JSON,
                          :mod:`onceflow.checkpoint.ranges`): each source's start and end offsets, a file
                          source's files. A replay of N over another input is refused, and
                          ``onceflow repair`` restores a checkpoint's batches from it
========================  ==================================================================

With a contract and no aggregation, per batch: ``input_rows = events_counted +
duplicates_dropped + late_dropped + rejected_rows``.

A value onceflow cannot know for a batch is NULL, never 0 or a difference: the input of a
batch whose outputs came from a stable copy (its plan did not run), of a plan Spark ran more
than once, or of a source without scan metrics. On Spark Connect a batch's plan metrics are
known only from the query's progress, after the batch: batch N+1's commit writes them into N's
marker where it holds NULL (:class:`Amend`, :mod:`onceflow.engine.progress`) — an ``UPDATE`` in SQL
backends; where a marker cannot be rewritten (a Delta commit's metadata, a record of Kafka's
marker topic) N+1's marker carries them under ``amends`` and :func:`with_amendments` applies
them when the markers are read.

The executor-side PostgreSQL sinks commit each table under its own marker
``<sink_id>.<table>`` (``tables`` NULL) and then add the batch's row under ``sink_id``, so
``SELECT * FROM onceflow_batches WHERE sink_id = 'default'`` reads the history of every sink and
protocol alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

TABLE = "onceflow_batches"
"""The marker table's name in SQL backends."""

COLUMNS = ("sink_id", "batch_id", "committed_ms", "input_rows", "late_dropped", "duplicates_dropped",
           "events_counted", "rows_written", "late_watermark_ms", "tables", "rejected_rows", "input_range")
"""The marker's columns, in the order :func:`marker_row` gives their values."""

METRICS = ("input_rows", "late_dropped", "duplicates_dropped", "events_counted", "rows_written",
           "late_watermark_ms", "rejected_rows")
"""The marker's integer metric columns."""


ADDED = (("tables", "text"), ("rejected_rows", "integer"), ("input_range", "text"))
"""Columns later onceflow versions added to the marker table, with their kind (added by ``ALTER``)."""


def create_table_sql(integer: str, text: str) -> str:
    """The marker table's ``CREATE TABLE IF NOT EXISTS``, in a backend's column types.

    The metrics are nullable (a value onceflow cannot know is NULL).

    Args:
        integer: The 64-bit integer type (``INTEGER`` in SQLite, ``bigint`` in PostgreSQL).
        text: The text type.
    """
    metrics = ", ".join(f"{c} {integer}" for c in METRICS if c != "rejected_rows")
    return (f"CREATE TABLE IF NOT EXISTS {TABLE}(sink_id {text} NOT NULL, batch_id {integer} NOT NULL, "
            f"committed_ms {integer} NOT NULL, {metrics}, tables {text}, rejected_rows {integer}, "
            f"input_range {text}, "
            "PRIMARY KEY(sink_id, batch_id));")


@dataclass(frozen=True)
class Amend:
    """Batch ``batch_id``'s plan metrics from the query's progress, for its marker's NULL columns.

    Written only where the progress's input rows are the batch's: equal to the marker's
    ``input_rows`` (counted from N's files) or, when that is NULL, to ``span`` (the rows between
    a Kafka source's offsets); otherwise the plan ran more than once and the marker keeps NULL.

    Attributes:
        batch_id: The batch the metrics are of (the one before the batch that commits them).
        input_rows: The rows the batch's plan read (Spark's ``numInputRows``).
        late_dropped: Rows its stateful operators dropped as late.
        duplicates: Rows its deduplications dropped (None: the query has none).
        span: The rows its sources' offsets enclose (None: not a Kafka source).
    """

    batch_id: int
    input_rows: int
    late_dropped: int
    duplicates: int | None
    span: int | None


@dataclass(frozen=True)
class BatchStats:
    """What one micro-batch read and dropped; None where onceflow cannot know it.

    Attributes:
        input_rows: Rows the batch read from its source.
        late_dropped: Rows Spark's late rule dropped.
        late_watermark_ms: The watermark those rows were behind.
        duplicates: Rows a deduplication dropped (None: the query has none, or it is unknown).
        rejected: Records the query's contract rejected (None: the query has no contract).
        input_range: The batch's input range as JSON (:mod:`onceflow.checkpoint.ranges`; None: unknown).
        amend: The batch before's metrics, for its marker (Spark Connect; None: none to write).
    """

    input_rows: int | None
    late_dropped: int | None
    late_watermark_ms: int
    duplicates: int | None = None
    rejected: int | None = None
    input_range: str | None = None
    amend: Amend | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BatchStats:
        """The stats :func:`dataclasses.asdict` made a dict of (sent in a data source's options, staged).

        Keys that are not a field are left out (a staged row keeps its tables beside them); a
        field that is absent takes its default (a row staged by an older onceflow).
        """
        known = {k: v for k, v in values.items() if k in _STATS_FIELDS}
        amend = known.get("amend")
        return cls(**{**known, "amend": Amend(**amend) if isinstance(amend, Mapping) else amend})

    def metrics(self, rows_out: int) -> dict[str, int | None]:
        """The marker's metric columns for a batch that had ``rows_out`` rows (all but the writes)."""
        return {"input_rows": self.input_rows, "late_dropped": self.late_dropped,
                "duplicates_dropped": self.duplicates, "events_counted": rows_out,
                "late_watermark_ms": self.late_watermark_ms, "rejected_rows": self.rejected}


_STATS_FIELDS = frozenset(f.name for f in fields(BatchStats))


def marker_row(sink_id: str, batch_id: int, stats: BatchStats, rows_out: int,
               written: Mapping[str, int]) -> tuple[Any, ...]:
    """A marker's values in :data:`COLUMNS` order, committed now.

    Args:
        sink_id: The marker namespace.
        batch_id: Spark's micro-batch id.
        stats: The batch's input rows, late drops and duplicates.
        rows_out: Rows of the batch's DataFrame.
        written: Rows written per table.
    """
    m = stats.metrics(rows_out)
    return (sink_id, batch_id, int(time.time() * 1000), m["input_rows"], m["late_dropped"],
            m["duplicates_dropped"], m["events_counted"], sum(written.values()), m["late_watermark_ms"],
            json.dumps(dict(written)), m["rejected_rows"], stats.input_range)


def marker_record(sink_id: str, batch_id: int, stats: BatchStats, rows_out: int,
                  written: Mapping[str, int]) -> dict[str, Any]:
    """A marker as a JSON-able dict (Delta's commit metadata, Kafka's marker record).

    With an amendment (:attr:`BatchStats.amend`), the record carries it under ``amends`` for
    :func:`with_amendments`: these markers are never rewritten.
    """
    record = dict(zip(COLUMNS, marker_row(sink_id, batch_id, stats, rows_out, written), strict=True))
    if stats.amend is not None:
        record["amends"] = asdict(stats.amend)
    return record


def with_amendments(markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Markers read back, each batch's NULL metrics filled from the ``amends`` of the batch after.

    The rule of :func:`amendments`: a column is filled only where it is NULL, and only where the
    amendment's input rows equal the marker's ``input_rows`` (or, when that is NULL, its
    ``span``). The ``amends`` entries are dropped from what is returned.

    Args:
        markers: Marker dicts, as :func:`marker_record` wrote them (any order).

    Returns:
        New dicts in the same order.
    """
    out = [{k: v for k, v in m.items() if k != "amends"} for m in markers]
    by_batch = {int(m["batch_id"]): m for m in out}
    for m in markers:
        a = m.get("amends")
        target = by_batch.get(int(a["batch_id"])) if isinstance(a, dict) else None
        if a is None or target is None:
            continue
        known = target.get("input_rows")
        if (known if known is not None else a.get("span")) != a["input_rows"]:
            continue  # the plan ran more than once (or the span is unknown): NULL stays
        for column, value in (("input_rows", a["input_rows"]), ("late_dropped", a["late_dropped"]),
                              ("duplicates_dropped", a["duplicates"])):
            if target.get(column) is None:
                target[column] = value
    return out


def insert_sql(param: str = "?", verb: str = "INSERT", suffix: str = "") -> str:
    """The statement that inserts one :func:`marker_row`.

    Args:
        param: The driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg).
        verb: ``INSERT`` or, for SQLite, ``INSERT OR REPLACE``.
        suffix: E.g. ``ON CONFLICT (sink_id, batch_id) DO NOTHING``.
    """
    values = ", ".join([param] * len(COLUMNS))
    return f"{verb} INTO {TABLE}({', '.join(COLUMNS)}) VALUES ({values}) {suffix}".rstrip()


def amendments(param: str, sink_id: str, stats: BatchStats) -> list[tuple[str, tuple[Any, ...]]]:
    """The statement that writes :attr:`BatchStats.amend` into the batch before's marker, if any.

    Run in the commit that inserts this batch's marker. It fills only NULL columns, and only
    where the progress's input rows are the batch's (:class:`Amend`): running it twice changes
    nothing.

    Args:
        param: The driver's placeholder (``?`` for sqlite3, ``%s`` for psycopg).
        sink_id: The marker namespace.
        stats: This batch's stats.

    Returns:
        ``(sql, values)`` pairs to execute (none without an amendment).
    """
    a = stats.amend
    if a is None:
        return []
    p = param
    sql = (f"UPDATE {TABLE} SET input_rows = COALESCE(input_rows, {p}), "
           f"late_dropped = COALESCE(late_dropped, {p}), "
           f"duplicates_dropped = COALESCE(duplicates_dropped, {p}) WHERE sink_id = {p} AND "
           f"batch_id = {p} AND COALESCE(input_rows, {p}) = {p}")
    return [(sql, (a.input_rows, a.late_dropped, a.duplicates, sink_id, a.batch_id, a.span, a.input_rows))]
