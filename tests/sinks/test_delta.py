"""The Delta sink's marker is Delta's app transaction, checked by onceflow (delta-rs does not)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from onceflow.errors import CheckpointMismatchError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta.sink import DeltaTablesSink

STATS = BatchStats(3, 0, 0)


def rows(batch: int, n: int = 3) -> dict[str, pa.Table]:
    return {"events": pa.table({"id": pa.array([f"b{batch}-{i}" for i in range(n)], pa.string()),
                                "v": pa.array(range(n), pa.int64())})}


def test_delta_rs_alone_writes_a_repeated_version_twice(tmp_path: Path) -> None:
    # why onceflow checks transaction_version itself (measured on deltalake 1.x)
    p = str(tmp_path / "t")
    props = CommitProperties(app_transactions=[Transaction("app", 7)])
    write_deltalake(p, pa.table({"a": [1]}), mode="append", commit_properties=props)
    write_deltalake(p, pa.table({"a": [1]}), mode="append", commit_properties=props)
    assert DeltaTable(p).to_pyarrow_table().num_rows == 2


def test_replays_are_skipped_per_table_and_the_sink_is_bound(tmp_path: Path) -> None:
    sink = DeltaTablesSink(tmp_path / "d")
    sink.bind("q1")
    spec = {"events": Table()}
    assert sink.commit_tables(0, rows(0), spec, STATS, 3)
    assert not sink.commit_tables(0, rows(0), spec, STATS, 3)
    assert not DeltaTablesSink(tmp_path / "d").commit_tables(0, rows(0), spec, STATS, 3)  # a new process
    assert sink.commit_tables(1, rows(1), spec, STATS, 3)
    assert DeltaTable(str(tmp_path / "d" / "events")).to_pyarrow_table().num_rows == 6
    assert DeltaTable(str(tmp_path / "d" / "events")).transaction_version("onceflow:default") == 1
    with pytest.raises(CheckpointMismatchError):
        DeltaTablesSink(tmp_path / "d").bind("q2")


def test_two_writers_racing_for_the_same_batches_never_duplicate(tmp_path: Path) -> None:
    spec = {"events": Table()}
    DeltaTablesSink(tmp_path / "d").commit_tables(0, rows(0), spec, STATS, 3)  # the table exists
    wins: list[bool] = []

    def writer() -> None:
        sink = DeltaTablesSink(tmp_path / "d")
        for b in range(1, 11):
            wins.append(sink.commit_tables(b, rows(b), spec, STATS, 3))

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    table = DeltaTable(str(tmp_path / "d" / "events")).to_pyarrow_table()
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 33 and sum(wins) == 10


@pytest.mark.parametrize("table", [Table(), Table(key=["id"], add=["v"]), Table(key=["id"])],
                         ids=["append", "add", "upsert"])
def test_a_batch_without_rows_keeps_its_marker_and_metrics(tmp_path: Path, table: Table) -> None:
    # a MERGE of no rows commits nothing in delta-rs: the batch's marker (and e.g. its late
    # drops, when every row was late) would be lost, and a replay would not be recognised
    sink = DeltaTablesSink(tmp_path / "d")
    spec = {"events": table}
    assert sink.commit_tables(0, rows(0), spec, STATS, 3)
    assert sink.commit_tables(1, rows(1, n=0), spec, BatchStats(4, 4, 1000), 0)
    assert not sink.commit_tables(1, rows(1, n=0), spec, BatchStats(4, 4, 1000), 0)  # a replay
    markers = sink.batches()
    assert [(m["batch_id"], m["late_dropped"], m["input_rows"]) for m in markers] == [(0, 0, 3), (1, 4, 4)]
    events = DeltaTable(str(tmp_path / "d" / "events"))
    assert events.transaction_version("onceflow:default") == 1
    assert events.to_pyarrow_table().num_rows == 3
