"""Marker metrics against inputs whose counts are known by construction (real Spark, every protocol).

Four files, one per batch: on-time clicks with producer retries; more on-time clicks (Spark
drops rows as late against the watermark of the batch before, so the third batch is the first
that can have late rows); clicks of which some are an hour behind the watermark and some are
retries; a file with no deduplication left to do. The markers must say exactly how many rows each batch read,
dropped as late and as duplicates, and wrote — for SQLite, Delta and each PostgreSQL protocol
(the executor-side ones included: their batch row under ``sink_id``) — and NULL for what a
query without deduplication cannot know.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow import Table
from tests.core import clicks

pytestmark = pytest.mark.spark

T0 = clicks.START


def _file(directory: Path, name: str, rows: list[tuple[str, str, int]]) -> None:
    """``rows``: (click id, page, seconds after T0)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    pq.write_table(pa.table({"click_id": [r[0] for r in rows], "page": [r[1] for r in rows],
                             "latency_ms": pa.array([7] * len(rows), pa.int64()),
                             "ts": pa.array([T0 + dt.timedelta(seconds=r[2]) for r in rows],
                                            pa.timestamp("us", tz="UTC"))}), path)
    clicks._stamp(path)


def _inputs(directory: Path) -> list[dict[str, int]]:
    """Write the three files; what each batch must record (by construction)."""
    first = [(f"a{i}", f"p{i % 3}", 600 + i) for i in range(30)] + [("a1", "p1", 601), ("a2", "p2", 602)]
    second = ([(f"b{i}", f"p{i % 2}", 700 + i) for i in range(20)]  # on time, pages p0 p1
              + [(f"old{i}", "p5", -3600 + i) for i in range(4)]    # an hour behind: late
              + [("b3", "p1", 703), ("b4", "p0", 704), ("b4", "p0", 704)])  # three retries
    third = [(f"c{i}", "p9", 800 + i) for i in range(5)]
    filler = [(f"f{i}", "p7", 650 + i) for i in range(10)]
    for k, rows in enumerate((first, filler, second, third)):
        _file(directory, f"f{k}.parquet", rows)
    return [{"input_rows": 32, "late_dropped": 0, "duplicates_dropped": 2, "events_counted": 30,
             "rows_written": 3},
            {"input_rows": 10, "late_dropped": 0, "duplicates_dropped": 0, "events_counted": 10,
             "rows_written": 1},
            {"input_rows": 27, "late_dropped": 4, "duplicates_dropped": 3, "events_counted": 20,
             "rows_written": 2},
            {"input_rows": 5, "late_dropped": 0, "duplicates_dropped": 0, "events_counted": 5,
             "rows_written": 1}]


def _per_page(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy("page").agg(F.count(F.lit(1)).alias("clicks"), F.max("latency_ms").alias("worst_ms"))


def _run(spark: Any, directory: Path, sink: Any, checkpoint: Path, dedup: bool = True, **kw: Any) -> None:
    raw = spark.readStream.schema(clicks.SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(directory))
    df = (onceflow.deduplicate(raw, id="click_id", event_time="ts", within="1 minute") if dedup
          else raw.withWatermark("ts", "1 minute"))
    onceflow.write_stream(df, sink, checkpoint, {"pages": Table(key="page", add="clicks", max="worst_ms")},
                          per_batch=_per_page, once=True, **kw).awaitTermination()


def _data_batches(markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("input_rows", "late_dropped", "duplicates_dropped", "events_counted", "rows_written")
    return [{k: m[k] for k in keys} for m in markers if m["input_rows"]]


@pytest.mark.parametrize("kind", ["sqlite", "delta", "driver", "staged", "2pc"])
def test_markers_count_exactly_what_each_batch_read_and_dropped(utc_spark: Any, tmp_path: Path, kind: str,
                                                               request: pytest.FixtureRequest) -> None:
    expected = _inputs(tmp_path / "in")
    if kind == "sqlite":
        sink: Any = onceflow.sqlite(tmp_path / "app.db")
    elif kind == "delta":
        sink = onceflow.delta(tmp_path / "delta")
    else:
        sink = onceflow.postgres(request.getfixturevalue("pg_dsn"), sink_id=f"m_{kind}", protocol=kind)
    _run(utc_spark, tmp_path / "in", sink, tmp_path / "ck")
    markers = sink.batches()
    assert _data_batches(markers) == expected
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))
    if kind in ("driver", "staged", "2pc"):
        assert all(m["tables"] is not None for m in markers)  # one history for every protocol


def test_a_query_without_deduplication_records_null_duplicates(utc_spark: Any, tmp_path: Path) -> None:
    _inputs(tmp_path / "in")
    sink = onceflow.sqlite(tmp_path / "app.db")
    _run(utc_spark, tmp_path / "in", sink, tmp_path / "ck", dedup=False)
    markers = sink.batches()
    assert [m["input_rows"] for m in markers if m["input_rows"]] == [32, 10, 27, 5]
    assert all(m["duplicates_dropped"] is None for m in markers)
    # no stateful operator: Spark drops nothing as late, and the marker says so
    assert [m["events_counted"] for m in markers if m["input_rows"]] == [32, 10, 27, 5]
    assert all(m["late_dropped"] == 0 for m in markers)


@pytest.mark.parametrize("kind", ["sqlite", "staged"])
def test_a_replayed_batch_reports_nothing_written(utc_spark: Any, tmp_path: Path, kind: str,
                                                  request: pytest.FixtureRequest) -> None:
    _inputs(tmp_path / "in")
    sink: Any = (onceflow.sqlite(tmp_path / "app.db") if kind == "sqlite"
                 else onceflow.postgres(request.getfixturevalue("pg_dsn"), protocol=kind))
    _run(utc_spark, tmp_path / "in", sink, tmp_path / "ck")
    last = max(m["batch_id"] for m in sink.batches() if m["input_rows"])
    # as if the driver died after the sink's commit of `last`, before Spark's commit log (and before
    # the no-data batch after it was planned): Spark runs `last` again at the next start
    for log in ("commits", "offsets"):
        for f in (tmp_path / "ck" / log).iterdir():
            batch = f.name.lstrip(".").split(".")[0]
            if batch.isdigit() and (int(batch) > last or log == "commits" and int(batch) == last):
                f.unlink()
    # and the markers of the no-data batches after it (they wrote no rows), else the sink is ahead
    delete = f"DELETE FROM onceflow_batches WHERE batch_id > {last}"
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "app.db") as conn:
            conn.execute(delete)
    else:
        import psycopg

        with psycopg.connect(request.getfixturevalue("pg_dsn")) as conn:
            conn.execute(delete)
    seen: list[dict[str, Any]] = []
    _run(utc_spark, tmp_path / "in", sink, tmp_path / "ck", on_batch=seen.append)
    replay = next(s for s in seen if s["batch_id"] == last)
    assert replay["committed"] is False and replay["rows_written"] == {"pages": 0}
    assert _data_batches(sink.batches())[-1]["rows_written"] == 1  # the marker keeps what the commit wrote
