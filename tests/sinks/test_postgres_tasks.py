"""The driver-side PostgreSQL sink's large batches: staged by Spark's tasks, moved in one transaction.

:class:`PostgresTablesSink` with ``collect_below=0`` takes every batch given as DataFrames
through its tasks path (T1-T5): an append, an upsert and a merge table over several batches
with keys repeated across batches, nulls in merged columns, a replay and an empty batch. The
oracle is this test's own fold of the rows it generated, compared with what psycopg reads.
Then the refusals: a NUL in a string (named from the task's failed COPY), an ``add`` past bigint
(named by key), a key twice (before any task), and a batch whose staged rows vanished.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from onceflow.errors import BatchRejectedError, PostgresError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres import stage
from onceflow.sinks.postgres.sink import PostgresTablesSink
from tests.helpers import table_frames

pytestmark = [pytest.mark.spark]

SPECS = {"events": Table(), "latest": Table(key="k", mode="upsert"),
         "totals": Table(key=["k", "day"], add="n", max="hi", min="lo")}
SCHEMA = "id LONG, k STRING, day DATE, n LONG, hi DOUBLE, lo DOUBLE, at TIMESTAMP, note STRING"


def _rows(b: int, n: int) -> list[tuple[Any, ...]]:
    utc = dt.timezone.utc
    return [(b * 1000 + i, f"k{i % 5}", dt.date(2026, 1, 1 + i % 3), i if i % 4 else None,
             float(i * b) if i % 3 else None, float(-i), dt.datetime(2026, 1, 1, 0, 0, i % 60, tzinfo=utc),
             "é\u00e8 " * (i % 3)) for i in range(n)]


def _fold(old: Any, new: Any, how: Any) -> Any:
    return new if old is None else old if new is None else how(old, new)


def _plus(a: Any, b: Any) -> Any:
    return a + b


def test_the_tasks_path_writes_what_the_rows_say(spark: Any, pg_dsn: str) -> None:
    import psycopg

    sink = PostgresTablesSink(pg_dsn, sink_id="s", collect_below=0)
    sink.bind("q")
    events: list[tuple[Any, ...]] = []
    latest: dict[str, int] = {}
    totals: dict[tuple[str, dt.date], list[Any]] = {}
    done: set[int] = set()
    for b, n in [(0, 40), (1, 25), (1, 25), (2, 0), (3, 30)]:  # batch 1 twice (a replay); 2 is empty
        rows = _rows(b, n)
        wrote = sink.commit_frames(b, table_frames(spark, rows, SCHEMA), SPECS, BatchStats(n, 0, 0), n)
        assert wrote == (b not in done), b
        if b in done:
            continue
        done.add(b)
        events.extend(rows)
        batch: dict[tuple[str, dt.date], list[Any]] = {}
        for (_, k, day, v, hi, lo, _, _) in rows:
            t = batch.setdefault((k, day), [None, None, None])
            t[:] = [_fold(t[0], v, _plus), _fold(t[1], hi, max), _fold(t[2], lo, min)]
        for k in {r[1] for r in rows}:
            latest[k] = max(r[0] for r in rows if r[1] == k)
        for key, (v, hi, lo) in batch.items():
            old = totals.get(key, [None, None, None])
            totals[key] = [_fold(old[0], v, _plus), _fold(old[1], hi, max), _fold(old[2], lo, min)]
    with psycopg.connect(pg_dsn) as c:
        got = sorted(c.execute("SELECT id, k, day, n, hi, lo, at, note FROM events").fetchall())
        assert got == sorted(events)
        assert dict(c.execute("SELECT k, id FROM latest").fetchall()) == latest
        read = c.execute("SELECT k, day, n, hi, lo FROM totals").fetchall()
        assert {(k, d): [v, hi, lo] for k, d, v, hi, lo in read} == totals
        assert c.execute("SELECT count(*) FROM onceflow_stage_winners").fetchone()[0] == 0
        for t in SPECS:  # the staged rows are gone with the batch's commit
            assert c.execute(f"SELECT count(*) FROM {t}_onceflow_stage").fetchone()[0] == 0
    marks = sink.batches()
    assert [m["batch_id"] for m in marks] == [0, 1, 2, 3]
    assert marks[0]["rows_written"] == 40 + 5 + len({(r[1], r[2]) for r in _rows(0, 40)})
    sink.close()


def test_refusals_name_the_row_and_write_nothing(spark: Any, pg_dsn: str) -> None:
    import psycopg

    sink = PostgresTablesSink(pg_dsn, sink_id="s", collect_below=0)
    sink.bind("q")
    nul = spark.createDataFrame([("a", 1), ("b\u0000c", 2)], "k STRING, n LONG").repartition(2)
    with pytest.raises(BatchRejectedError, match=r"table 'words': column 'k' .*NUL"):
        sink.commit_frames(0, {"words": nul}, {"words": Table()}, BatchStats(2, 0, 0), 2)
    twice = spark.createDataFrame([("a", 1), ("a", 2)], "k STRING, n LONG")
    with pytest.raises(BatchRejectedError, match="appears more than once"):
        sink.commit_frames(0, {"sums": twice}, {"sums": Table(key="k", add="n")}, BatchStats(2, 0, 0), 2)
    spec = {"sums": Table(key="k", add="n")}
    first = spark.createDataFrame([("a", 2**63 - 10), ("b", 1)], "k STRING, n LONG")
    assert sink.commit_frames(0, {"sums": first}, spec, BatchStats(2, 0, 0), 2)
    over = spark.createDataFrame([("a", 11), ("b", 5)], "k STRING, n LONG")
    with pytest.raises(BatchRejectedError, match=r"'n' of the row with key \{'k': 'a'\} would become"):
        sink.commit_frames(1, {"sums": over}, spec, BatchStats(2, 0, 0), 2)
    with psycopg.connect(pg_dsn) as c:
        assert dict(c.execute("SELECT k, n FROM sums").fetchall()) == {"a": 2**63 - 10, "b": 1}
        assert c.execute("SELECT count(*) FROM words").fetchone()[0] == 0
    assert [m["batch_id"] for m in sink.batches()] == [0]
    sink.close()


def test_staged_rows_that_vanished_fail_the_batch_then_it_commits(spark: Any, pg_dsn: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    sink = PostgresTablesSink(pg_dsn, sink_id="s", collect_below=0)
    sink.bind("q")
    frame = spark.range(50).selectExpr("id", "id % 3 AS g").repartition(2).persist()
    real = stage.move

    def emptied(conn: Any, spec: Any, batch_id: int) -> int:  # what a server crash does to an unlogged table
        conn.execute(f"DELETE FROM {spec.table}_onceflow_stage")
        return real(conn, spec, batch_id)

    monkeypatch.setattr(stage, "move", emptied)
    with pytest.raises(PostgresError, match=r"0 staged rows of table 'ids' found, its tasks wrote 50"):
        sink.commit_frames(0, {"ids": frame}, {"ids": Table()}, BatchStats(50, 0, 0), 50)
    monkeypatch.setattr(stage, "move", real)
    assert sink.commit_frames(0, {"ids": frame}, {"ids": Table()}, BatchStats(50, 0, 0), 50)
    with psycopg.connect(pg_dsn) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM ids")) == list(range(50))
    sink.close()
