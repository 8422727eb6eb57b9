"""Keyed Iceberg tables (upsert, add/max/min) on a real pyiceberg SQL catalog, merged by Spark's tasks.

The oracle folds the test's own rows in Python (a dict per key, nulls ignored as SQL's aggregates
do); the tables are read back by pyiceberg and DuckDB's Iceberg extension — neither is onceflow's
write path.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.errors import OnceflowError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.iceberg.sink import IcebergTablesSink
from tests.helpers import ICEBERG_CHILD, duckdb_iceberg_rows, killed_then_restarted

pytestmark = pytest.mark.spark

SCHEMA = "k LONG, name STRING, n LONG, hi DOUBLE, lo DOUBLE"
MERGE = Table(key=["k"], add=["n"], max=["hi"], min=["lo"])
PARTITIONS, COALESCE = "spark.sql.shuffle.partitions", "spark.sql.adaptive.coalescePartitions.enabled"


def _sink(tmp_path: Path) -> IcebergTablesSink:
    return IcebergTablesSink(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "warehouse")


def _batch(rng: random.Random, keys: range, count: int) -> list[tuple[Any, ...]]:
    """``count`` rows of distinct keys from ``keys``, some values null."""
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    return [(k, f"v{rng.randrange(1000)}", maybe(rng.randrange(-50, 50)), maybe(rng.uniform(-9, 9)),
             maybe(rng.uniform(-9, 9))) for k in rng.sample(keys, count)]


def _fold(state: dict[int, dict[str, Any]], rows: list[tuple[Any, ...]], merged: bool) -> None:
    """The oracle: each key's row after a batch (upsert: the batch's; merge: nulls ignored)."""
    def combine(old: Any, new: Any, how: Any) -> Any:
        if new is None or old is None:
            return old if new is None else new
        return how(old, new)

    for k, name, n, hi, lo in rows:
        old = state.get(k)
        if old is None or not merged:
            state[k] = {"k": k, "name": name, "n": n, "hi": hi, "lo": lo}
        else:
            state[k] = {"k": k, "name": name, "n": combine(old["n"], n, lambda a, b: a + b),
                        "hi": combine(old["hi"], hi, max), "lo": combine(old["lo"], lo, min)}


def _rows(table: Any) -> dict[int, dict[str, Any]]:
    got = table.scan().to_arrow().to_pylist()
    assert len(got) == len({r["k"] for r in got}), "a key twice in the table"
    return {r["k"]: r for r in got}


@pytest.fixture
def four_files(spark: Any) -> Iterator[Any]:
    """Four output partitions a batch, not coalesced: files with narrow key ranges, whatever the size."""
    before = {k: spark.conf.get(k) for k in (PARTITIONS, COALESCE)}
    spark.conf.set(PARTITIONS, "4")
    spark.conf.set(COALESCE, "false")
    yield spark
    for k, v in before.items():
        spark.conf.set(k, v)


def test_keyed_tables_hold_each_keys_value_after_every_batch_in_two_readers(four_files: Any,
                                                                           tmp_path: Path) -> None:
    """Four batches over overlapping keys; the last one's keys in a narrow range touch only some files."""
    spark = four_files
    rng = random.Random(7)
    sink = _sink(tmp_path)
    upserts: dict[int, dict[str, Any]] = {}
    merges: dict[int, dict[str, Any]] = {}
    batches = [_batch(rng, range(0, 400), 300), _batch(rng, range(200, 600), 250),
               _batch(rng, range(0, 600), 200), _batch(rng, range(590, 640), 30)]
    for batch_id, rows in enumerate(batches):
        frame = spark.createDataFrame(rows, SCHEMA)
        specs = {"latest": Table(key=["k"]), "totals": MERGE}
        assert sink.commit_frames(batch_id, {"latest": frame, "totals": frame}, specs,
                                  BatchStats(len(rows), 0, 0), len(rows))
        _fold(upserts, rows, merged=False)
        _fold(merges, rows, merged=True)
        latest = sink.catalog.load_table(("onceflow", "latest"))
        totals = sink.catalog.load_table(("onceflow", "totals"))
        assert _rows(latest) == upserts, f"batch {batch_id}"
        assert _rows(totals) == merges, f"batch {batch_id}"
    want = [tuple(merges[k].values()) for k in sorted(merges)]
    assert duckdb_iceberg_rows(totals, "k, name, n, hi, lo", "k") == want
    summary = totals.current_snapshot().summary
    assert summary.operation.value == "overwrite"
    kept = int(summary["total-data-files"]) - int(summary.get("added-data-files", 0))
    assert kept >= 2, "the last batch's narrow keys should leave the files of other keys untouched"
    assert int(summary["deleted-data-files"]) >= 1
    assert len(totals.snapshots()) == 4


def test_a_replayed_keyed_batch_adds_nothing_twice(spark: Any, tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    rows = [(k, "a", 1, 1.0, 1.0) for k in range(20)]
    frame = spark.createDataFrame(rows, SCHEMA)
    for _ in range(2):
        assert sink.commit_frames(0, {"t": frame}, {"t": MERGE}, BatchStats(20, 0, 0), 20) is (_ == 0)
    assert sink.commit_frames(1, {"t": frame}, {"t": MERGE}, BatchStats(20, 0, 0), 20)
    assert not sink.commit_frames(1, {"t": frame}, {"t": MERGE}, BatchStats(20, 0, 0), 20)
    got = _rows(sink.catalog.load_table(("onceflow", "t")))
    assert {r["n"] for r in got.values()} == {2} and len(got) == 20
    empty = spark.createDataFrame([], SCHEMA)
    assert sink.commit_frames(2, {"t": empty}, {"t": MERGE}, BatchStats(0, 0, 0), 0)  # a marker all the same
    assert [m["batch_id"] for m in sink.batches()] == [0, 1, 2]


def test_a_concurrent_writer_between_the_pick_and_the_commit_makes_the_merge_run_again(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Another writer appends key 1000 after the sink picked its files: the refused commit is merged again
    with that file, so key 1000 ends once with both values added (kept files would leave it twice)."""
    sink = _sink(tmp_path)
    first = spark.createDataFrame([(k, "a", 1, 0.0, 0.0) for k in range(10)], SCHEMA)
    sink.commit_frames(0, {"t": first}, {"t": MERGE}, BatchStats(10, 0, 0), 10)
    other = _sink(tmp_path).catalog
    write = IcebergTablesSink._write
    calls: list[int] = []

    def write_then_another_writer_commits(self: IcebergTablesSink, table: Any, folder: str,
                                          df: Any) -> list[str]:
        paths = write(self, table, folder, df)
        calls.append(1)
        if len(calls) == 1:
            other.load_table(("onceflow", "t")).append(pa.table({
                "k": pa.array([1000], pa.int64()), "name": ["other"], "n": pa.array([7], pa.int64()),
                "hi": [5.0], "lo": [5.0]}))
        return paths

    monkeypatch.setattr(IcebergTablesSink, "_write", write_then_another_writer_commits)
    batch = spark.createDataFrame([(1000, "b", 3, 1.0, 1.0), (3, "b", 2, 2.0, -2.0)], SCHEMA)
    assert sink.commit_frames(1, {"t": batch}, {"t": MERGE}, BatchStats(2, 0, 0), 2)
    monkeypatch.undo()
    assert calls == [1, 1] and "a concurrent commit won" in caplog.text
    table = sink.catalog.load_table(("onceflow", "t"))
    got = _rows(table)
    assert got[1000] == {"k": 1000, "name": "b", "n": 10, "hi": 5.0, "lo": 1.0}
    assert got[3] == {"k": 3, "name": "b", "n": 3, "hi": 2.0, "lo": -2.0}
    assert len(got) == 11
    ones = [p.name for p in sink._folder(table).glob("1-*")]
    assert ones == [table.properties["onceflow.default.files"]]  # the refused attempt's folder deleted


def test_an_add_that_overflows_fails_naming_the_table_and_column(spark: Any, tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    big = spark.createDataFrame([(1, "a", 2**63 - 10, 0.0, 0.0)], SCHEMA)
    sink.commit_frames(0, {"t": big}, {"t": MERGE}, BatchStats(1, 0, 0), 1)
    with pytest.raises(Exception, match=r"onceflow\.t: column 'n'.*overflows bigint"):
        sink.commit_frames(1, {"t": big}, {"t": MERGE}, BatchStats(1, 0, 0), 1)
    table = sink.catalog.load_table(("onceflow", "t"))
    assert _rows(table)[1]["n"] == 2**63 - 10 and sink.committed(table) == 0


def test_keys_of_strings_and_a_column_only_the_table_has(spark: Any, tmp_path: Path) -> None:
    """A two-column key (one a string, pruned by its bounds); a column the batch lacks keeps its value."""
    sink = _sink(tmp_path)
    spec = Table(key=["region", "day"])
    wide = spark.createDataFrame([("eu", 1, 10, "x"), ("us", 1, 20, "y")],
                                 "region STRING, day INT, v INT, note STRING")
    sink.commit_frames(0, {"t": wide}, {"t": spec}, BatchStats(2, 0, 0), 2)
    narrow = spark.createDataFrame([("eu", 1, 11), ("eu", 2, 12)], "region STRING, day INT, v INT")
    sink.commit_frames(1, {"t": narrow}, {"t": spec}, BatchStats(2, 0, 0), 2)
    rows = sink.catalog.load_table(("onceflow", "t")).scan().to_arrow().to_pylist()
    got = sorted(tuple(r.values()) for r in rows)
    assert got == [("eu", 1, 11, "x"), ("eu", 2, 12, None), ("us", 1, 20, "y")]


def test_compaction_and_snapshot_expiry_between_batches_keep_every_value(spark: Any, tmp_path: Path) -> None:
    """Another writer compacts the keyed table (pyiceberg rewrites all its rows into new files, one
    commit) and expires every older snapshot between batches: the replay of the last batch is still
    skipped (the marker is a table property) and the next batch merges into the compacted files."""
    rng = random.Random(11)
    sink = _sink(tmp_path)
    want: dict[int, dict[str, Any]] = {}
    for batch_id in range(2):
        rows = _batch(rng, range(0, 300), 120)
        sink.commit_frames(batch_id, {"t": spark.createDataFrame(rows, SCHEMA)}, {"t": MERGE},
                           BatchStats(len(rows), 0, 0), len(rows))
        _fold(want, rows, merged=True)
    other = _sink(tmp_path).catalog.load_table(("onceflow", "t"))
    before = {f.file.file_path for f in other.scan().plan_files()}
    other.overwrite(other.scan().to_arrow())  # compaction: the same rows in pyiceberg's own new files
    other = _sink(tmp_path).catalog.load_table(("onceflow", "t"))
    current = other.current_snapshot().snapshot_id
    other.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in other.snapshots()
                                                 if s.snapshot_id != current]).commit()
    table = sink.catalog.load_table(("onceflow", "t"))
    assert not before & {f.file.file_path for f in table.scan().plan_files()} and len(table.snapshots()) == 1
    assert not sink.commit_frames(1, {"t": spark.createDataFrame(rows, SCHEMA)}, {"t": MERGE},
                                  BatchStats(len(rows), 0, 0), len(rows))  # the replay: skipped
    rows = _batch(rng, range(0, 300), 120)
    assert sink.commit_frames(2, {"t": spark.createDataFrame(rows, SCHEMA)}, {"t": MERGE},
                              BatchStats(len(rows), 0, 0), len(rows))
    _fold(want, rows, merged=True)
    assert _rows(sink.catalog.load_table(("onceflow", "t"))) == want


CHILD = ICEBERG_CHILD + """
stream = spark.readStream.schema("id LONG, account STRING, cents LONG").option("maxFilesPerTrigger", 1) \\
    .parquet(str(tmp / "in"))

def per_batch(df):
    sums = df.groupBy("account").agg({"cents": "sum", "*": "count", "id": "max"})
    return {"accounts": sums.toDF("account", "total", "n", "last_id"),
            "latest": df.groupBy("account").agg({"id": "max"}).toDF("account", "id")}

specs = {"accounts": Table(key=["account"], add=["total", "n"], max=["last_id"]),
         "latest": Table(key=["account"])}
onceflow.write_stream(stream, sink, tmp / "ck", specs, per_batch, once=True).awaitTermination()
print("done")
"""


@pytest.mark.parametrize("point", ["inside_sink_txn@1",
                                   pytest.param("after_sink_commit@1", marks=pytest.mark.long)])
def test_a_driver_killed_mid_batch_leaves_every_sum_exact(tmp_path: Path, point: str) -> None:
    """SIGKILL of the driver (and its JVM) at a crash point of batch 1 (which has rows), then a restart:
    the sums are the input's, each batch added once (the oracle folds the input files in Python)."""
    src = tmp_path / "in"
    src.mkdir()
    want: dict[str, list[int]] = {}
    for part, first in enumerate((0, 400, 700)):
        ids = list(range(first, first + (400 if part == 0 else 300)))
        accounts, cents = [f"a{i % 9}" for i in ids], [i * 7 % 1000 for i in ids]
        table = pa.table({"id": ids, "account": accounts, "cents": cents})
        pq.write_table(table, src / f"part-{part}.parquet")
        os.utime(src / f"part-{part}.parquet", (1_700_000_000 + part, 1_700_000_000 + part))  # Spark's order
        for i, a, c in zip(ids, accounts, cents, strict=True):
            total, n, last = want.get(a, [0, 0, -1])
            want[a] = [total + c, n + 1, max(last, i)]
    killed_then_restarted(CHILD, tmp_path, point)
    sink = _sink(tmp_path)
    accounts = sink.catalog.load_table(("onceflow", "accounts")).scan().to_arrow().to_pylist()
    assert {r["account"]: [r["total"], r["n"], r["last_id"]] for r in accounts} == want
    assert len(accounts) == len(want)
    latest = sink.catalog.load_table(("onceflow", "latest")).scan().to_arrow().to_pylist()
    assert Counter(r["account"] for r in latest) == Counter(list(want))
    assert {r["account"]: r["id"] for r in latest} == {a: v[2] for a, v in want.items()}
    assert [m["batch_id"] for m in sink.batches()] == [0, 1, 2]


def test_a_table_that_keeps_failing_to_commit_says_so(spark: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pyiceberg.exceptions import CommitFailedException

    from onceflow.sinks.iceberg import sink as module

    sink = _sink(tmp_path)
    frame = spark.createDataFrame([(1, "a", 1, 1.0, 1.0)], SCHEMA)
    tried: list[int] = []

    def refused(*args: Any) -> None:
        tried.append(1)
        raise CommitFailedException("the table moved")

    monkeypatch.setattr(IcebergTablesSink, "_commit", refused)
    monkeypatch.setattr(module, "time", SimpleNamespace(sleep=lambda s: None))  # no back-off here
    with pytest.raises(OnceflowError, match=r"batch 0 could not be committed to Iceberg table onceflow\.t"):
        sink.commit_frames(0, {"t": frame}, {"t": Table()}, BatchStats(1, 0, 0), 1)
    assert len(tried) == module.RETRIES
