"""The SQLite sink's tasks path (a large batch converted and written by Spark's tasks), ``onceflow_sqlite``.

Batches given as DataFrames go through :meth:`SQLiteTablesSink.commit_frames` with
``collect_below=0`` (every batch through the tasks): an append, an upsert and a merge table
(``add``/``max``/``min``) over several batches with keys repeated across batches, nulls in merged
columns, a replay and an empty batch, every column type the sink stores. The oracle is this
test's own fold of the rows it generated (Python, not onceflow), compared with what
Python's ``sqlite3`` reads from the database.
"""

from __future__ import annotations

import datetime as dt
import math
import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite import tasks
from onceflow.sinks.sqlite.sink import SQLiteTablesSink
from onceflow.sinks.sqlite.tasks import stage_root
from tests.helpers import table_frames

pytestmark = [pytest.mark.spark]

SPECS = {"events": Table(), "latest": Table(key="k", mode="upsert"),
         "totals": Table(key=["k", "day"], add="n", max="hi", min="lo")}
SCHEMA = ("id LONG, k STRING, day DATE, n LONG, hi DOUBLE, lo DOUBLE, at TIMESTAMP, note STRING, "
          "paid BOOLEAN, raw BINARY, price DECIMAL(10,2)")


def _rows(b: int, n: int) -> list[tuple[Any, ...]]:
    utc = dt.timezone.utc
    return [(b * 1000 + i, f"k{i % 5}", dt.date(2026, 1, 1 + i % 3), i if i % 4 else None,
             float(i * b) if i % 3 else None, float(-i),
             dt.datetime(2026, 1, 1, 0, 0, i % 60, 1000 * i, tzinfo=utc),
             "é\u00e8 " * (i % 3), i % 2 == 0, bytes([i % 256, 0, 7]), Decimal(f"{i}.{i % 100:02d}"))
            for i in range(n)]


def _ts(v: dt.datetime) -> str:
    return v.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


class Oracle:
    """The tables as this test folds its own rows (nulls ignored by the merges, as SQL's aggregates)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.latest: dict[str, int] = {}
        self.totals: dict[tuple[str, str], list[Any]] = {}

    def add(self, rows: list[tuple[Any, ...]]) -> None:
        batch_latest: dict[str, int] = {}
        batch_totals: dict[tuple[str, str], list[Any]] = {}
        for (i, k, day, n, hi, lo, at, note, paid, raw, price) in rows:
            stored = (i, k, day.isoformat(), n, hi, lo, _ts(at), note, int(paid), raw, float(price))
            self.events.append(stored)
            batch_latest[k] = max(batch_latest.get(k, i), i)
            t = batch_totals.setdefault((k, day.isoformat()), [None, None, None])
            t[0] = n if t[0] is None else (t[0] + n if n is not None else t[0])
            t[1] = hi if t[1] is None else (max(t[1], hi) if hi is not None else t[1])
            t[2] = lo if t[2] is None else min(t[2], lo)
        self.latest.update(batch_latest)
        for key, (n, hi, lo) in batch_totals.items():
            old = self.totals.get(key)
            if old is None:
                self.totals[key] = [n, hi, lo]
                continue
            self.totals[key] = [n if old[0] is None else (old[0] if n is None else old[0] + n),
                                hi if old[1] is None else (old[1] if hi is None else max(old[1], hi)),
                                lo if old[2] is None else (old[2] if lo is None else min(old[2], lo))]


def _read(db: Path) -> tuple[list[tuple[Any, ...]], dict[str, int], dict[tuple[str, str], list[Any]]]:
    with sqlite3.connect(db) as c:
        events = sorted(c.execute("SELECT id, k, day, n, hi, lo, at, note, paid, raw, price FROM events"))
        latest = dict(c.execute("SELECT k, id FROM latest"))
        read = c.execute("SELECT k, day, n, hi, lo FROM totals")
        totals = {(k, d): [n, hi, lo] for k, d, n, hi, lo in read}
    return events, latest, totals


@pytest.fixture(params=["memory", "attached"])
def opened(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the driver opens scratch files: read into memory (3.11+), or attached (3.10)."""
    if request.param == "attached":
        monkeypatch.setattr(tasks, "reads_into_memory", lambda: False)
    return str(request.param)


def test_the_tasks_path_writes_what_the_rows_say(spark: Any, tmp_path: Path, opened: str) -> None:
    db = tmp_path / "app.db"
    sink = SQLiteTablesSink(db, sink_id="s", collect_below=0)
    sink.bind("q")
    oracle, done = Oracle(), set()
    for b, n in [(0, 40), (1, 25), (1, 25), (2, 0), (3, 30)]:  # batch 1 twice (a replay); 2 is empty
        rows = _rows(b, n)
        wrote = sink.commit_frames(b, table_frames(spark, rows, SCHEMA), SPECS, BatchStats(n, 0, 0), n)
        assert wrote == (b not in done), b
        if wrote:
            oracle.add(rows)
            done.add(b)
        assert not list(stage_root(db, "s").glob("*")), "the attempt's scratch files are gone"
    events, latest, totals = _read(db)
    assert events == sorted(oracle.events)
    assert latest == oracle.latest
    assert totals.keys() == oracle.totals.keys()
    for key, want in oracle.totals.items():
        got = totals[key]
        assert got[0] == want[0] and got[2] == want[2], key
        assert got[1] == want[1] or (got[1] is None and want[1] is None) or math.isclose(got[1], want[1]), key
    marks = sink.batches()
    assert [m["batch_id"] for m in marks] == [0, 1, 2, 3]
    assert marks[0]["rows_written"] == 40 + 5 + len({(r[1], r[2]) for r in _rows(0, 40)})
    with sqlite3.connect(db) as c:  # onceflow's own tables: STRICT, as on the collected path
        assert all("STRICT" in sql for (sql,) in c.execute(
            "SELECT sql FROM sqlite_master WHERE name IN ('events', 'latest', 'totals')"))
    sink.close()


def test_a_value_sqlite_would_change_is_refused_in_the_task_and_nothing_is_written(spark: Any,
                                                                                  tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    sink = SQLiteTablesSink(db, sink_id="s", collect_below=0)
    sink.bind("q")
    frame = spark.createDataFrame([(1, 1.0), (2, float("nan"))], "id LONG, x DOUBLE").repartition(2)
    with pytest.raises(BatchRejectedError, match=r"table 'nums': column 'x' of .*NaN"):
        sink.commit_frames(0, {"nums": frame}, {"nums": Table()}, BatchStats(2, 0, 0), 2)
    assert sink.batches() == []
    with sqlite3.connect(db) as c:
        assert not c.execute("SELECT 1 FROM sqlite_master WHERE name = 'nums'").fetchone()
    sink.close()


def test_an_add_that_leaves_64_bits_is_refused_naming_the_key(spark: Any, tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    sink = SQLiteTablesSink(db, sink_id="s", collect_below=0)
    sink.bind("q")
    spec = {"sums": Table(key="k", add="n")}
    first = spark.createDataFrame([("a", 2**63 - 10), ("b", 1)], "k STRING, n LONG")
    assert sink.commit_frames(0, {"sums": first}, spec, BatchStats(2, 0, 0), 2)
    second = spark.createDataFrame([("a", 11), ("b", 5)], "k STRING, n LONG")
    with pytest.raises(BatchRejectedError, match=r"'n' of the row with key \{'k': 'a'\} would become "):
        sink.commit_frames(1, {"sums": second}, spec, BatchStats(2, 0, 0), 2)
    with sqlite3.connect(db) as c:
        assert dict(c.execute("SELECT k, n FROM sums")) == {"a": 2**63 - 10, "b": 1}
    third = spark.createDataFrame([("a", 9), ("b", 5)], "k STRING, n LONG")
    assert sink.commit_frames(1, {"sums": third}, spec, BatchStats(2, 0, 0), 2)
    with sqlite3.connect(db) as c:
        assert dict(c.execute("SELECT k, n FROM sums")) == {"a": 2**63 - 1, "b": 6}
    sink.close()


def test_a_key_twice_is_refused_before_any_task_runs(spark: Any, tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    sink = SQLiteTablesSink(db, sink_id="s", collect_below=0)
    sink.bind("q")
    frame = spark.createDataFrame([("a", 1), ("a", 2)], "k STRING, n LONG")
    with pytest.raises(BatchRejectedError, match="key .* appears more than once"):
        sink.commit_frames(0, {"t": frame}, {"t": Table(key="k", mode="upsert")}, BatchStats(2, 0, 0), 2)
    assert not stage_root(db, "s").exists() or not list(stage_root(db, "s").glob("*"))
    sink.close()


def test_the_format_on_its_own_writes_each_batch_once(spark: Any, tmp_path: Path) -> None:
    from onceflow.sinks.sqlite.datasource import register

    register(spark)
    src = tmp_path / "in"
    db = tmp_path / "app.db"
    spark.range(200).selectExpr("id", "id % 7 AS g").repartition(2).write.parquet(str(src))
    stream = spark.readStream.schema("id LONG, g LONG").parquet(str(src))
    q = (stream.writeStream.format("onceflow_sqlite").option("db", str(db)).option("table", "ids")
         .option("sink_id", "fmt").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    with sqlite3.connect(db) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM ids")) == list(range(200))
        assert [r[0] for r in c.execute("SELECT batch_id FROM onceflow_batches WHERE sink_id = 'fmt'")] == [0]
    batch = spark.range(5).selectExpr("id", "id AS g")
    for _ in range(2):  # the same batch id twice: once
        (batch.write.format("onceflow_sqlite").mode("append").option("db", str(db)).option("table", "ids")
         .option("sink_id", "fb").option("batch_id", 7).save())
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM ids").fetchone()[0] == 205


def test_the_format_on_its_own_refuses_a_key_twice(spark: Any, tmp_path: Path) -> None:
    from onceflow.errors import from_spark
    from onceflow.sinks.sqlite.datasource import register

    register(spark)
    db = tmp_path / "app.db"
    batch = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "k STRING, n LONG").repartition(2)
    with pytest.raises(Exception) as caught:
        (batch.write.format("onceflow_sqlite").mode("append").option("db", str(db)).option("table", "t")
         .option("spec", '{"mode": "upsert", "key": ["k"]}').option("batch_id", 0).save())
    assert isinstance(from_spark(caught.value), BatchRejectedError), caught.value
    assert "key {'k': 'a'} appears 2 times" in str(from_spark(caught.value))
    with sqlite3.connect(db) as c:
        assert not c.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone()


class Watched(SQLiteTablesSink):
    """The sink, noting which thread copied each file, and when (``copied``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.copied: list[tuple[str, float]] = []

    def _copy(self, *args: Any, **kwargs: Any) -> int:
        import threading

        rows = super()._copy(*args, **kwargs)
        self.copied.append((threading.current_thread().name, time.monotonic()))
        return rows


def test_a_large_batch_is_copied_while_its_slower_task_still_writes(spark: Any, tmp_path: Path) -> None:
    """A real job of two tasks, one slowed by its input: the fast one's file is in before the job ends."""
    from onceflow.sinks._core.base import Settle


    def slow(batches: Any) -> Any:
        import time as t

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            t.sleep(4)
        yield from batches

    db = tmp_path / "app.db"
    sink = Watched(db, sink_id="s", collect_below=0)
    sink.bind("q")
    frame = spark.range(0, 20_000, numPartitions=2).selectExpr("id", "concat('n', id) AS note") \
        .mapInArrow(slow, "id LONG, note STRING")
    settle = Settle(lambda written: (BatchStats(written["events"], 0, 0), written["events"]))
    started = time.monotonic()
    assert sink.commit_frames(0, {"events": frame}, {"events": Table()}, BatchStats(0, 0, 0), 0,
                              settle=settle)
    ended = time.monotonic()
    copied = sink.copied
    early = [at for name, at in copied if name == "onceflow-early-copy"]
    assert early and early[0] < ended - 2, (copied, started, ended)  # seconds before the slow task's end
    with sqlite3.connect(db) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM events")) == list(range(20_000))
    assert [(m["batch_id"], m["rows_written"]) for m in sink.batches()] == [(0, 20_000)]
    sink.close()


def _slow_batches(pause: float) -> Any:
    """A ``mapInArrow`` function that waits ``pause`` seconds before each Arrow batch after the first."""

    def slow(batches: Any) -> Any:
        import time as t

        for i, batch in enumerate(batches):
            if i:
                t.sleep(pause)
            yield batch

    return slow


def test_a_long_task_completes_files_the_driver_copies_while_it_runs(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One task of three Arrow batches, a file bound below one batch: three files, the first copied early."""
    from onceflow.sinks._core.base import Settle

    monkeypatch.setattr(tasks, "CHUNK_BYTES", 1024)  # read by the driver as it makes the task's spec

    db = tmp_path / "app.db"
    sink = Watched(db, sink_id="s", collect_below=0)
    sink.bind("q")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        # rows of ~1 KB: a batch fills the Python worker's output buffer, so it leaves when made
        frame = spark.range(0, 3000, numPartitions=1) \
            .selectExpr("id", "concat(repeat('n', 1000), id) AS note") \
            .mapInArrow(_slow_batches(3.0), "id LONG, note STRING")
        settle = Settle(lambda written: (BatchStats(written["events"], 0, 0), written["events"]))
        assert sink.commit_frames(0, {"events": frame}, {"events": Table()}, BatchStats(0, 0, 0), 0,
                                  settle=settle)
        ended = time.monotonic()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    copied = sink.copied
    early = [at for name, at in copied if name == "onceflow-early-copy"]
    assert len(copied) == 3, copied
    assert early and early[0] < ended - 1.5, (copied, ended)  # the first file, seconds before the end
    with sqlite3.connect(db) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM events")) == list(range(3000))
    assert [(m["batch_id"], m["rows_written"]) for m in sink.batches()] == [(0, 3000)]
    sink.close()


class Haunted(Watched):
    """The sink, with a dead task attempt's complete file put beside the first file the early copy takes.

    As a task attempt that completed its file and was then killed leaves it (Spark kept another
    attempt of that partition): its rows (ids from 10**6) are in no task's message.
    """

    haunted = False

    def _copy(self, batch_id: int, name: str, spec: Table, columns: list[str], f: Any, extents: Any,
              alias: str) -> int:
        import threading

        rows = super()._copy(batch_id, name, spec, columns, f, extents, alias)
        if threading.current_thread().name == "onceflow-early-copy" and not self.haunted:
            self.haunted = True
            dead = Path(f["path"]).parent / tasks.scratch_name(name, 0, 9)
            scratch = tasks._Scratch(dead.with_name(dead.name + ".part"), pa.schema(
                [("id", pa.int64()), ("note", pa.string())]))
            scratch.add(pa.table({"id": pa.array(range(10**6, 10**6 + 50), pa.int64()),
                                  "note": [f"dead {i}" for i in range(50)]}))
            scratch.commit()
            scratch.close()
            dead.with_name(dead.name + ".part").replace(dead)
        return rows


def test_a_dead_attempts_file_copied_early_is_rolled_back_and_removed_files_written_again(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: str) -> None:
    """The early copy takes a dead attempt's file and a kept one: rolled back, each kept row once.

    Read into memory, a kept file the early copy took is removed once copied, so T4 cannot copy
    it after the rollback: the batch's tasks run once more (a second Spark job), without the
    early copy. Attached (Python 3.10) files stay: T4 copies them, one job.
    """
    from onceflow.sinks._core.base import Settle

    monkeypatch.setattr(tasks, "CHUNK_BYTES", 1024)
    jobs: list[str] = []
    real_run = tasks.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        jobs.append(args[1].token)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(tasks, "run", counted)
    db = tmp_path / "app.db"
    sink = Haunted(db, sink_id="s", collect_below=0)
    sink.bind("q")
    def second_late(batches: Any) -> Any:  # partition 1 starts after 3 s: partition 0's file is done
        import time as t

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            t.sleep(3)
        yield from batches

    frame = spark.range(0, 3000, numPartitions=2).selectExpr("id", "concat(repeat('n', 1000), id) AS note") \
        .mapInArrow(second_late, "id LONG, note STRING")
    settle = Settle(lambda written: (BatchStats(written["events"], 0, 0), written["events"]))
    assert sink.commit_frames(0, {"events": frame}, {"events": Table()}, BatchStats(0, 0, 0), 0,
                              settle=settle)
    assert sink.haunted
    assert len(set(jobs)) == (2 if opened == "memory" else 1), jobs
    with sqlite3.connect(db) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM events")) == list(range(3000))
    assert [(m["batch_id"], m["rows_written"]) for m in sink.batches()] == [(0, 3000)]
    assert not list(stage_root(db, "s").glob("*/*")), "T6 left scratch files"
    sink.close()


def test_more_tasks_than_sqlite_attaches_keep_their_partitions(spark: Any, tmp_path: Path,
                                                                opened: str) -> None:
    """Fourteen partitions into an append and an upsert table: files read into memory are not coalesced."""
    from pyspark import TaskContext

    db = tmp_path / "app.db"
    sink = SQLiteTablesSink(db, sink_id="s", collect_below=0)
    sink.bind("q")
    seen: list[int] = []

    def mark(batches: Any) -> Any:
        for batch in batches:
            yield batch.append_column("part", pa.array([TaskContext.get().partitionId()] * batch.num_rows,
                                                        pa.int64()))

    frame = spark.range(0, 1400, numPartitions=14).selectExpr("id", "id % 100 AS k") \
        .mapInArrow(mark, "id LONG, k LONG, part LONG")
    frames = {"events": frame, "latest": frame.groupBy("k").max("id").withColumnRenamed("max(id)", "id")}
    specs = {"events": Table(), "latest": Table(key="k", mode="upsert")}
    assert sink.commit_frames(0, frames, specs, BatchStats(1400, 0, 0), 1400)
    with sqlite3.connect(db) as c:
        assert sorted(r[0] for r in c.execute("SELECT id FROM events")) == list(range(1400))
        seen = sorted({r[0] for r in c.execute("SELECT part FROM events")})
        assert dict(c.execute("SELECT k, id FROM latest")) == {k: 1300 + k for k in range(100)}
    assert len(seen) == (14 if opened == "memory" else tasks.MAX_FILES // 2), seen
    sink.close()


def test_the_format_refuses_a_key_in_two_of_many_tasks(spark: Any, tmp_path: Path) -> None:
    """Twelve tasks (more than SQLite attaches), one key in two of them: refused naming it; else all rows."""
    from onceflow.errors import from_spark
    from onceflow.sinks.sqlite.datasource import register

    register(spark)
    db = tmp_path / "app.db"
    rows = [(f"k{i}", i) for i in range(120)]

    def write(batch: Any, batch_id: int) -> None:
        (batch.write.format("onceflow_sqlite").mode("append").option("db", str(db)).option("table", "t")
         .option("spec", '{"mode": "upsert", "key": ["k"]}').option("batch_id", batch_id).save())

    twice = spark.createDataFrame(rows + [("k7", 999)], "k STRING, n LONG").repartition(12, "n")
    with pytest.raises(Exception) as caught:
        write(twice, 0)
    assert isinstance(from_spark(caught.value), BatchRejectedError), caught.value
    assert "key {'k': 'k7'} appears 2 times" in str(from_spark(caught.value))
    write(spark.createDataFrame(rows, "k STRING, n LONG").repartition(12, "n"), 0)
    with sqlite3.connect(db) as c:
        assert dict(c.execute("SELECT k, n FROM t")) == dict(rows)


def test_the_tasks_get_batches_bounded_by_rows_and_a_bound_the_user_set(spark: Any) -> None:
    """7,000 rows of 10 KB (70 MB, over Spark's 64 MiB default): one Arrow batch but for a bound set."""
    from onceflow.sinks._core.tasks import ARROW_MAX_BYTES, run_tasks

    def sizes(batches: Any) -> list[int]:
        return [b.num_rows for b in batches]

    frame = spark.range(0, 7000, numPartitions=1).selectExpr("id", "repeat('x', 10000) AS blob")
    assert run_tasks(frame, sizes) == [[7000]]
    assert spark.conf.get(ARROW_MAX_BYTES) == "67108864b"  # the session's own setting is back
    spark.conf.set(ARROW_MAX_BYTES, "20MB")
    try:
        got = run_tasks(frame, sizes)[0]
    finally:
        spark.conf.unset(ARROW_MAX_BYTES)
    assert sum(got) == 7000 and len(got) >= 4 and max(got) <= 2100, got
