"""The Iceberg sink on a real pyiceberg SQL catalog (SQLite), written by Spark's tasks, read by two readers.

The oracle is the test's own input rows (and Spark's own plan of the user's transform); the tables
are read back by pyiceberg and by DuckDB's Iceberg extension (its wheel from PyPI: no network at
run time), neither of which onceflow's write path uses.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow.errors import CheckpointMismatchError, ConfigError, OnceflowError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.iceberg.sink import IcebergTablesSink
from tests.helpers import ICEBERG_CHILD, duckdb_iceberg_rows, killed_then_restarted

pytestmark = pytest.mark.spark


def _sink(tmp_path: Path, sink_id: str = "default") -> IcebergTablesSink:
    return IcebergTablesSink(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "warehouse", sink_id=sink_id)


def _input(folder: Path, first: int, count: int) -> None:
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": list(range(first, first + count)),
                             "account": [f"a{i % 7}" for i in range(first, first + count)],
                             "amount": [i * 0.25 for i in range(first, first + count)]}),
                   folder / f"part-{first}.parquet")


def test_a_stream_writes_each_batch_once_in_each_table_and_two_readers_agree(spark: Any,
                                                                            tmp_path: Path) -> None:
    src = tmp_path / "in"
    _input(src, 0, 500)
    _input(src, 500, 300)
    sink = _sink(tmp_path)

    def per_batch(df: Any) -> dict[str, Any]:
        return {"payments": df, "big": df.where("amount >= 100").select("id", "account")}

    stream = spark.readStream.schema("id LONG, account STRING, amount DOUBLE") \
        .option("maxFilesPerTrigger", 1).parquet(str(src))
    onceflow.write_stream(stream, sink, tmp_path / "ck", {"payments": Table(), "big": Table()}, per_batch,
                          once=True).awaitTermination()
    payments = sink.catalog.load_table(("onceflow", "payments"))
    got = payments.scan().to_arrow().sort_by("id")
    assert got.column("id").to_pylist() == list(range(800))
    assert got.column("amount").to_pylist() == [i * 0.25 for i in range(800)]
    assert duckdb_iceberg_rows(payments) == [(i, f"a{i % 7}", i * 0.25) for i in range(800)]
    big = sink.catalog.load_table(("onceflow", "big"))
    want_big = [i for i in range(800) if i * 0.25 >= 100]
    assert sorted(big.scan().to_arrow().column("id").to_pylist()) == want_big
    assert [len(t.snapshots()) for t in (payments, big)] == [2, 2]  # one commit per table and batch
    markers = sink.batches()
    assert [m["batch_id"] for m in markers] == [0, 1]
    assert [json.loads(m["tables"]) for m in markers] == [{"payments": 500, "big": 100},
                                                          {"payments": 300, "big": 300}]
    assert [m["input_rows"] for m in markers] == [500, 300]
    assert payments.properties["onceflow.default.batch"] == "1"


def test_a_replayed_batch_is_skipped_and_its_orphan_files_deleted(spark: Any, tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    frame = spark.range(40).selectExpr("id", "cast(id as string) AS s", "timestamp_seconds(id) AS at")
    stats = BatchStats(40, 0, 0)
    assert sink.commit_frames(0, {"t": frame}, {"t": Table()}, stats, 40)
    table = sink.catalog.load_table(("onceflow", "t"))
    orphan = sink._folder(table) / "0-crashedattempt"  # an attempt that wrote and died before its commit
    orphan.mkdir()
    (orphan / "part-0.parquet").write_bytes(b"x")
    assert not sink.commit_frames(0, {"t": frame}, {"t": Table()}, stats, 40)  # the replay: step 2 skips
    assert not orphan.exists()
    assert sink.commit_frames(1, {"t": frame.where("id < 0")}, {"t": Table()}, BatchStats(0, 0, 0), 0)
    table = sink.catalog.load_table(("onceflow", "t"))
    rows = table.scan().to_arrow()
    assert Counter(rows.column("id").to_pylist()) == Counter(range(40))  # once each
    assert str(rows.schema.field("at").type) == "timestamp[us, tz=UTC]"
    assert [m["batch_id"] for m in sink.batches()] == [0, 1]  # the empty batch has its marker too
    assert len(table.snapshots()) == 2


def test_the_marker_survives_snapshot_expiry(spark: Any, tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    frame = spark.range(10).selectExpr("id")
    for batch in range(3):
        sink.commit_frames(batch, {"t": frame}, {"t": Table()}, BatchStats(10, 0, 0), 10)
    table = sink.catalog.load_table(("onceflow", "t"))
    current = table.current_snapshot().snapshot_id
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    table = sink.catalog.load_table(("onceflow", "t"))
    assert len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == 30
    assert not sink.commit_frames(2, {"t": frame}, {"t": Table()}, BatchStats(10, 0, 0), 10)  # still known
    assert [m["batch_id"] for m in sink.batches()] == [2]


def test_what_it_does_not_take_is_refused_with_the_table_and_the_fix(spark: Any, tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    frame = spark.range(3).selectExpr("id", "array(id) AS xs")
    with pytest.raises(ConfigError, match="column 'xs' is array<bigint>.*cast it to string"):
        sink.commit_frames(0, {"t": frame}, {"t": Table()}, BatchStats(3, 0, 0), 3)
    sink.commit_frames(0, {"t": spark.range(3).selectExpr("id")}, {"t": Table()}, BatchStats(3, 0, 0), 3)
    with pytest.raises(ConfigError, match=r"column 'id' is int64 in the table and int32 in the batch; cast"):
        sink.commit_frames(1, {"t": spark.range(3).selectExpr("cast(id as int) AS id")}, {"t": Table()},
                           BatchStats(3, 0, 0), 3)
    with pytest.raises(ConfigError, match="object stores are not supported"):
        IcebergTablesSink("sqlite:///x.db", "s3://bucket/wh")
    sink.bind("query-1")
    sink.bind("query-1")
    with pytest.raises(CheckpointMismatchError, match="query id query-1"):
        sink.bind("query-2")


CHILD = ICEBERG_CHILD + """
stream = spark.readStream.schema("id LONG, account STRING, amount DOUBLE").option("maxFilesPerTrigger", 1) \\
    .parquet(str(tmp / "in"))
query = onceflow.write_stream(stream, sink, tmp / "ck", {"payments": Table(), "big": Table()},
                              lambda df: {"payments": df, "big": df.where("amount >= 100")}, once=True)
query.awaitTermination()
print("done")
"""


@pytest.mark.parametrize("point", ["inside_sink_txn@1",
                                   pytest.param("after_sink_commit@1", marks=pytest.mark.long)])
def test_a_driver_killed_between_or_after_the_tables_commits_leaves_each_row_once(tmp_path: Path,
                                                                                  point: str) -> None:
    """SIGKILL of the driver (and its JVM) at a crash point of batch 1, which has rows; then a restart."""
    src = tmp_path / "in"
    for first in (0, 400, 700):
        _input(src, first, 300 if first else 400)
    killed_then_restarted(CHILD, tmp_path, point)
    sink = _sink(tmp_path)
    payments = sink.catalog.load_table(("onceflow", "payments")).scan().to_arrow()
    assert Counter(payments.column("id").to_pylist()) == Counter(range(1000))
    big = sink.catalog.load_table(("onceflow", "big")).scan().to_arrow()
    assert Counter(big.column("id").to_pylist()) == Counter(i for i in range(1000) if i * 0.25 >= 100)
    assert [m["batch_id"] for m in sink.batches()] == [0, 1, 2]
    kept = json.loads(sink.catalog.load_table(("onceflow", "payments")).properties["onceflow.default.marker"])
    assert kept["batch_id"] == 2


def test_a_concurrent_commit_is_retried_and_an_unknown_outcome_read_before_any_retry(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    sink = _sink(tmp_path)
    frame = spark.range(20).selectExpr("id")
    sink.commit_frames(0, {"t": frame}, {"t": Table()}, BatchStats(20, 0, 0), 20)
    other = _sink(tmp_path).catalog  # another writer of the same table, its own catalog connection
    write = IcebergTablesSink._write

    def write_then_another_writer_commits(self: IcebergTablesSink, table: Any, folder: str,
                                          df: Any) -> list[str]:
        paths = write(self, table, folder, df)  # the table the sink decided on is now stale
        other.load_table(("onceflow", "t")).append(pa.table({"id": pa.array([1000, 1001], pa.int64())}))
        return paths

    monkeypatch.setattr(IcebergTablesSink, "_write", write_then_another_writer_commits)
    assert sink.commit_frames(1, {"t": frame}, {"t": Table()}, BatchStats(20, 0, 0), 20)
    monkeypatch.undo()
    ids = Counter(sink.catalog.load_table(("onceflow", "t")).scan().to_arrow().column("id").to_pylist())
    assert ids == Counter([*range(20), *range(20), 1000, 1001])  # batch 1 once, the other writer's rows kept
    assert "a concurrent commit won" in caplog.text  # refused, and decided again by the sink
    assert "retrying" not in caplog.text  # never re-applied by pyiceberg's own retry, undecided

    commit = IcebergTablesSink._commit
    calls: list[int] = []

    def commit_then_lose_the_answer(self: IcebergTablesSink, *args: Any) -> None:
        calls.append(1)
        commit(self, *args)
        raise OSError("connection to the catalog's database lost")  # committed, the reply lost

    monkeypatch.setattr(IcebergTablesSink, "_commit", commit_then_lose_the_answer)
    assert sink.commit_frames(2, {"t": frame}, {"t": Table()}, BatchStats(20, 0, 0), 20)
    assert calls == [1]  # read back, found committed: never committed again
    monkeypatch.undo()
    table = sink.catalog.load_table(("onceflow", "t"))
    assert table.scan().to_arrow().num_rows == 62 and sink.committed(table) == 2


def test_two_attempts_of_one_batch_racing_commit_it_once(spark: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A second driver of the query (a zombie) commits batch 1 while this one writes it, and dies before its
    clean-up: this commit is refused, decided again (never re-applied by pyiceberg's own retry), skipped."""
    sink, zombie = _sink(tmp_path), _sink(tmp_path)
    monkeypatch.setattr(zombie, "_clean", lambda *args, **kwargs: None)  # died right after its commit
    frame = spark.range(25).selectExpr("id")
    zombie.commit_frames(0, {"t": spark.range(0).selectExpr("id")}, {"t": Table()}, BatchStats(0, 0, 0), 0)
    write = IcebergTablesSink._write
    raced: list[int] = []

    def write_while_the_zombie_commits(self: IcebergTablesSink, table: Any, folder: str,
                                       df: Any) -> list[str]:
        paths = write(self, table, folder, df)
        if self is sink:
            raced.append(1)
            monkeypatch.setattr(IcebergTablesSink, "_write", write)
            assert zombie.commit_frames(1, {"t": frame}, {"t": Table()}, BatchStats(25, 0, 0), 25)
        return paths

    monkeypatch.setattr(IcebergTablesSink, "_write", write_while_the_zombie_commits)
    assert not sink.commit_frames(1, {"t": frame}, {"t": Table()}, BatchStats(25, 0, 0), 25)
    assert raced, "the zombie never committed between this sink's write and its commit"
    table = sink.catalog.load_table(("onceflow", "t"))
    assert Counter(table.scan().to_arrow().column("id").to_pylist()) == Counter(range(25))
    folders = sorted(p.name for p in sink._folder(table).iterdir())
    assert folders == [table.properties["onceflow.default.files"]]  # the loser's files deleted


def test_a_catalog_in_postgresql(spark: Any, tmp_path: Path, pg_dsn: str) -> None:
    """pyiceberg's SQL catalog in a real PostgreSQL database; decimals and dates as written."""
    from psycopg.conninfo import conninfo_to_dict

    c = conninfo_to_dict(pg_dsn)
    uri = f"postgresql+psycopg://{c['user']}@{c['host']}:{c['port']}/{c['dbname']}"
    sink = IcebergTablesSink(uri, tmp_path / "warehouse", namespace="lake")
    frame = spark.range(30).selectExpr("id", "cast(id / 4 as decimal(12, 2)) AS amount",
                                       "date_add(date'2026-01-01', cast(id as int)) AS day")
    assert sink.commit_frames(0, {"t": frame}, {"t": Table()}, BatchStats(30, 0, 0), 30)
    assert sink.commit_frames(1, {"t": frame}, {"t": Table()}, BatchStats(30, 0, 0), 30)
    assert not sink.commit_frames(1, {"t": frame}, {"t": Table()}, BatchStats(30, 0, 0), 30)
    table = IcebergTablesSink(uri, tmp_path / "warehouse", namespace="lake").catalog.load_table(("lake", "t"))
    rows = table.scan().to_arrow()
    assert Counter(rows.column("id").to_pylist()) == Counter([*range(30), *range(30)])
    assert str(rows.schema.field("amount").type) == "decimal128(12, 2)"
    want = sorted(tuple(r.values()) for r in frame.toArrow().to_pylist())
    got = duckdb_iceberg_rows(table)
    assert got[::2] == want and got[1::2] == want  # each row twice: batches 0 and 1, once each


def test_a_batch_the_table_is_past_is_skipped_and_its_files_kept(spark: Any, tmp_path: Path) -> None:
    """A checkpoint restored from an older backup runs batch 1 again while the table has 0-2."""
    sink = _sink(tmp_path)
    for batch in range(3):
        frame = spark.range(batch * 10, batch * 10 + 10).selectExpr("id")
        assert sink.commit_frames(batch, {"t": frame}, {"t": Table()}, BatchStats(10, 0, 0), 10)
    again = spark.range(10, 20).selectExpr("id")
    assert not sink.commit_frames(1, {"t": again}, {"t": Table()}, BatchStats(10, 0, 0), 10)
    table = sink.catalog.load_table(("onceflow", "t"))
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(30))  # every file there
    assert len(list(sink._folder(table).iterdir())) == 3


def test_the_catalogs_database_restarted_mid_commit(spark: Any, tmp_path: Path, pg_server: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL (the catalog's database) is stopped (``immediate``: a crash) as the catalog sends its
    COMMIT of batch 1: the commit's outcome is unknown and the catalog unreadable, so the sink fails the
    batch, naming the catalog; the server starts again and the batch's re-run commits it once."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    c = conninfo_to_dict(pg_server.new_database())
    uri = f"postgresql+psycopg://{c['user']}@{c['host']}:{c['port']}/{c['dbname']}"
    sink = IcebergTablesSink(uri, tmp_path / "warehouse", namespace="lake")
    spec = {"t": Table(key=["id"], add=["n"])}
    frame = spark.range(30).selectExpr("id", "1 AS n")
    assert sink.commit_frames(0, {"t": frame}, spec, BatchStats(30, 0, 0), 30)
    commit = IcebergTablesSink._commit
    crashed: list[int] = []

    def crash_before_the_commit(session: Any) -> None:  # the table's row is updated, its COMMIT not sent
        if not crashed:
            crashed.append(1)
            pg_server.halt("immediate")

    def commit_while_the_server_crashes(self: IcebergTablesSink, *args: Any) -> None:
        event.listen(Session, "before_commit", crash_before_the_commit)
        try:
            commit(self, *args)
        finally:
            event.remove(Session, "before_commit", crash_before_the_commit)

    monkeypatch.setattr(IcebergTablesSink, "_commit", commit_while_the_server_crashes)
    try:
        with pytest.raises(OnceflowError, match=r"catalog postgresql\+psycopg://onceflow@.* cannot be read"):
            sink.commit_frames(1, {"t": frame}, spec, BatchStats(30, 0, 0), 30)
    finally:
        if crashed:
            pg_server.resume()
    assert crashed
    monkeypatch.undo()
    assert sink.commit_frames(1, {"t": frame}, spec, BatchStats(30, 0, 0), 30)  # the batch's re-run
    assert not sink.commit_frames(1, {"t": frame}, spec, BatchStats(30, 0, 0), 30)
    table = IcebergTablesSink(uri, tmp_path / "warehouse", namespace="lake").catalog.load_table(("lake", "t"))
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(30)) and {r["n"] for r in rows} == {2}
