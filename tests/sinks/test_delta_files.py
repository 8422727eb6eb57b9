"""The Delta sink's task-written path against its collected path, and ``onceflow_delta`` on its own.

Every table mode through both paths of :class:`onceflow.sinks.delta.sink.DeltaTablesSink` — the
batch collected and committed from Arrow (``collect_below`` above its rows), and written as
Parquet files by Spark's tasks, committed by the driver (``collect_below=0``) — over batches
with repeated keys across batches, nulls in merged columns, a replay and an empty batch. The
two roots must hold the same rows, read back by delta-rs and by pyarrow's Parquet reader of
the files the Delta log names (readers onceflow's code does not touch), and the same markers.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks._core.base import BatchStats, Settle
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta.sink import DeltaTablesSink
from tests.helpers import table_frames

pytestmark = [pytest.mark.spark]

SPECS = {"events": Table(), "latest": Table(key="k"),
         "totals": Table(key=["k", "day"], add="n", max="hi", min="lo")}
SCHEMA = "id LONG, k STRING, day DATE, n LONG, hi DOUBLE, lo DOUBLE, at TIMESTAMP, note STRING"


def _batch(spark: Any, b: int, n: int) -> dict[str, Any]:
    rows = [(b * 1000 + i, f"k{i % 5}", dt.date(2026, 1, 1 + i % 3), i if i % 4 else None,
             float(i * b) if i % 3 else None, float(-i), dt.datetime(2026, 1, 1, 0, 0, i % 60),
             "é\u00e8 " * (i % 3)) for i in range(n)]
    return table_frames(spark, rows, SCHEMA)


def _read(root: Path, name: str) -> list[dict[str, Any]]:
    table = DeltaTable(str(root / name))
    by_rs = table.to_pyarrow_table()
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    by_files = pa.concat_tables([pq.read_table(root / name / p) for p in paths]) if paths else by_rs
    assert by_files.num_rows == by_rs.num_rows
    return sorted(by_rs.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_the_task_written_path_equals_the_collected_one(spark: Any, tmp_path: Path) -> None:
    collected = DeltaTablesSink(tmp_path / "a", sink_id="s")
    tasks = DeltaTablesSink(tmp_path / "b", sink_id="s", collect_below=0)
    for sink in (collected, tasks):
        sink.bind("q")
    for b, n in [(0, 40), (1, 25), (1, 25), (2, 0), (3, 30)]:  # batch 1 twice (a replay); 2 is empty
        frames = _batch(spark, b, n)
        wrote = [sink.commit_frames(b, frames, SPECS, BatchStats(n, 0, 0), n) for sink in (collected, tasks)]
        assert wrote[0] == wrote[1], b
        for root in ("a", "b"):  # every table has the batch's marker, an empty batch's too
            assert [DeltaTable(str(tmp_path / root / t)).transaction_version("onceflow:s") for t in SPECS] \
                == [b] * 3, (root, b)
    for name in SPECS:
        assert _read(tmp_path / "a", name) == _read(tmp_path / "b", name), name
        for root in ("a", "b"):
            assert DeltaTable(str(tmp_path / root / name)).transaction_version("onceflow:s") == 3
    assert [m["batch_id"] for m in tasks.batches()] == [0, 1, 2, 3]
    assert [m["tables"] for m in tasks.batches()] == [m["tables"] for m in collected.batches()]
    events = DeltaTable(str(tmp_path / "b" / "events"))
    stats = pa.table(events.get_add_actions(flatten=True)).to_pylist()
    assert sum(s["num_records"] for s in stats) == 95
    assert all(s["min.id"] <= s["max.id"] for s in stats)
    on_disk = {p.name for p in (tmp_path / "b" / "events").glob("*.parquet")}
    assert on_disk == {s["path"] for s in stats}  # a replay's files deleted, none left over
    assert not list((tmp_path / "b" / "_onceflow" / "stage" / "totals").glob("*"))


def test_values_that_do_not_fit_an_existing_table_are_refused(spark: Any, tmp_path: Path) -> None:
    sink = DeltaTablesSink(tmp_path / "d", collect_below=0)
    sink.bind("q")
    spec = {"t": Table(key="k", add="n")}
    frame = spark.createDataFrame([("a", 1), ("b", 2)], "k STRING, n INT")
    assert sink.commit_frames(0, {"t": frame}, spec, BatchStats(2, 0, 0), 2)
    too_big = spark.createDataFrame([("a", 2**40)], "k STRING, n LONG")
    with pytest.raises(ConfigError, match=r"column 'n' of the batch \(int64\) does not fit the table's type "
                                          "int32"):
        sink.commit_frames(1, {"t": too_big}, spec, BatchStats(1, 0, 0), 1)
    twice = spark.createDataFrame([("a", 1), ("a", 2)], "k STRING, n INT")
    with pytest.raises(BatchRejectedError, match=r"key \{'k': 'a', 'count': 2\} appears more than once"):
        sink.commit_frames(1, {"t": twice}, spec, BatchStats(2, 0, 0), 2)
    assert sorted(DeltaTable(str(tmp_path / "d" / "t")).to_pyarrow_table().to_pylist(),
                  key=lambda r: r["k"]) == [{"k": "a", "n": 1}, {"k": "b", "n": 2}]


def test_the_format_on_its_own_in_a_streaming_query(spark: Any, tmp_path: Path) -> None:
    """``writeStream.format("onceflow_delta")``: Spark's batch ids, one commit per batch."""
    from onceflow.sinks.delta.datasource import register

    register(spark)
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        pq.write_table(pa.table({"id": list(range(f * 10, f * 10 + 10))}), src / f"f{f}.parquet")
    query = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).parquet(str(src))
             .writeStream.format("onceflow_delta").option("root", str(tmp_path / "lake"))
             .option("table", "ids").option("sink_id", "ids")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    table = DeltaTable(str(tmp_path / "lake" / "ids"))
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == list(range(30))
    assert table.transaction_version("onceflow:ids") == 2


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_write_stream_picks_the_path_by_the_batch_input_rows(spark: Any, tmp_path: Path, fmt: str) -> None:
    """Counted before the batch runs (Parquet: the files' rows; JSON: their bytes / BYTES_PER_ROW)."""
    import re

    import onceflow
    from onceflow.engine.batch import BYTES_PER_ROW

    src = tmp_path / "in"
    src.mkdir()
    rows = pa.table({"id": list(range(300)), "v": [f"v{i}" for i in range(300)]})
    if fmt == "parquet":
        pq.write_table(rows, src / "a.parquet")
        counted = 300
    else:
        (src / "a.json").write_text("".join(json.dumps(r) + "\n" for r in rows.to_pylist()))
        counted = (src / "a.json").stat().st_size // BYTES_PER_ROW
    tasks_file = re.compile(r"^part-00000-[0-9a-f]{12}-\d{5}-(\d+|spark)-[0-9a-f]{8}\.snappy\.parquet$")
    for collect_below, by_tasks in [(counted, True), (counted + 1, False)]:
        root = tmp_path / f"lake{collect_below}"
        stream = getattr(spark.readStream.schema("id LONG, v STRING"), fmt)(str(src))
        onceflow.write_stream(stream, onceflow.delta(root, collect_below=collect_below),
                              tmp_path / f"ck{collect_below}", {"t": Table()}, once=True).awaitTermination()
        table = DeltaTable(str(root / "t"))
        assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == list(range(300))
        names = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        assert names and all(bool(tasks_file.match(n)) == by_tasks for n in names), (collect_below, names)


def _settle(counts: Any) -> tuple[BatchStats, int]:
    n = sum(counts.values())
    return BatchStats(n, 0, 0), n


SETTLE = Settle(_settle)


def test_an_uncached_append_is_written_by_spark_when_its_types_fit(spark: Any, tmp_path: Path) -> None:
    """Spark's own Parquet writer for flat columns of the table's types; the data source otherwise."""
    from decimal import Decimal

    sink = DeltaTablesSink(tmp_path / "lake", sink_id="s", collect_below=0)
    sink.bind("q")
    spec = {"t": Table()}
    kinds = "id LONG, s SHORT, d DECIMAL(12,3), day DATE, at TIMESTAMP, note STRING, ok BOOLEAN"
    rows = [(i, i % 300 - 150, Decimal(f"{i}.125"), dt.date(1500 + i % 600, 1 + i % 12, 1),
             dt.datetime(1600 + i % 500, 3, 1, 12, 0, i % 60, 7), "é\u00e8" * (i % 3) or None, i % 2 == 0)
            for i in range(500)]
    frame = spark.createDataFrame(rows, kinds).repartition(3)
    assert sink.commit_frames(0, {"t": frame}, spec, BatchStats(0, 0, 0), 0, settle=SETTLE)
    assert not sink.commit_frames(0, {"t": frame}, spec, BatchStats(0, 0, 0), 0, settle=SETTLE)  # a replay
    table = DeltaTable(str(tmp_path / "lake" / "t"))
    got = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    back = [(r["id"], r["s"], r["d"], r["day"], r["at"].replace(tzinfo=None), r["note"], r["ok"])
            for r in got]
    assert back == rows  # every stored value is the value given (old dates and times too: no rebasing)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 500 and len(adds) == 3
    assert {p.name for p in (tmp_path / "lake" / "t").glob("*.parquet")} == {a["path"] for a in adds}
    assert all(b"org.apache.spark.version" in pq.read_metadata(tmp_path / "lake" / "t" / a["path"]).metadata
               for a in adds)  # Spark's writer wrote them
    assert all(a["min.id"] <= a["max.id"] and a["null_count.note"] >= 0 for a in adds)
    assert json.loads(table.schema().to_json())["fields"][4]["type"] == "timestamp"
    assert [m["rows_written"] for m in sink.batches()] == [500]
    assert not list((tmp_path / "lake" / "_onceflow" / "stage").rglob("*.parquet"))

    day, at, ints = dt.date(2026, 1, 1), dt.datetime(2026, 1, 1), kinds.replace("s SHORT", "s INT")
    wider = spark.createDataFrame([(1, 1, Decimal("1.000"), day, at, "x", True)], ints)
    assert sink.commit_frames(1, {"t": wider}, spec, BatchStats(0, 0, 0), 0, settle=SETTLE)  # data source
    too_big = spark.createDataFrame([(2, 2**20, Decimal("1.000"), day, at, "y", True)], ints)
    with pytest.raises(ConfigError, match=r"column 's' of the batch \(int32\) does not fit the table's "
                                          "type int16"):
        sink.commit_frames(2, {"t": too_big}, spec, BatchStats(0, 0, 0), 0, settle=SETTLE)
    table = DeltaTable(str(tmp_path / "lake" / "t"))
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 501
    newest = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    assert sum(b"org.apache.spark.version" not in
               (pq.read_metadata(tmp_path / "lake" / "t" / p).metadata or {}) for p in newest) == 1
    old = [(1000, 3, Decimal("3.000"), dt.date(1500, 1, 1), dt.datetime(1500, 1, 1, 1), "z", False)]
    spark.conf.set("spark.sql.parquet.datetimeRebaseModeInWrite", "LEGACY")  # Spark would shift 1500-01-01
    try:
        assert sink.commit_frames(2, {"t": spark.createDataFrame(old, kinds)}, spec, BatchStats(0, 0, 0), 0,
                                  settle=SETTLE)
    finally:
        spark.conf.unset("spark.sql.parquet.datetimeRebaseModeInWrite")
    got = DeltaTable(str(tmp_path / "lake" / "t")).to_pyarrow_table().to_pylist()
    got = [r for r in got if r["id"] == 1000]
    assert [(r["day"], r["at"].replace(tzinfo=None)) for r in got] == [(old[0][3], old[0][4])]
