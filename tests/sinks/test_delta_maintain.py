"""Delta maintenance (compaction + vacuum) beside onceflow's commits: markers, replays and rows stay exact.

The tables are real Delta tables written by the sink (delta-rs), maintained by
:func:`onceflow.sinks.delta.maintain.maintain` — between batches, from a thread racing the
sink's commits, and inside a streaming query (``maintain_every``) whose driver is SIGKILLed after
a batch's commit. Expected values come from the input, in Python.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from onceflow import Table
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks.delta.maintain import maintain
from onceflow.sinks.delta.sink import DeltaTablesSink
from tests.helpers import killed_then_restarted

SPECS = {"events": Table(), "totals": Table(key="k", add=["n"])}


def _batch(b: int, rows: int = 20) -> dict[str, pa.Table]:
    ids = [f"{b}-{i}" for i in range(rows)]
    ks = [(b + i) % 7 for i in range(rows)]
    per_k: dict[int, int] = {}
    for k in ks:
        per_k[k] = per_k.get(k, 0) + 1
    return {"events": pa.table({"id": ids, "k": ks}),
            "totals": pa.table({"k": list(per_k), "n": list(per_k.values())})}


def _commit(sink: DeltaTablesSink, b: int) -> bool:
    return sink.commit_tables(b, _batch(b), SPECS, BatchStats(20, 0, 0), 20)


def _want(batches: range) -> tuple[list[str], dict[int, int]]:
    ids, totals = [], {}
    for b in batches:
        out = _batch(b)
        ids += out["events"]["id"].to_pylist()
        for k, n in zip(out["totals"]["k"].to_pylist(), out["totals"]["n"].to_pylist(), strict=True):
            totals[k] = totals.get(k, 0) + n
    return ids, totals


def _stored(root: Path) -> tuple[list[str], dict[int, int]]:
    ids = DeltaTable(str(root / "events")).to_pyarrow_table()["id"].to_pylist()
    totals = {r["k"]: r["n"] for r in DeltaTable(str(root / "totals")).to_pyarrow_table().to_pylist()}
    return ids, totals


def test_maintenance_between_batches_keeps_markers_replays_and_files_in_flight(tmp_path: Path) -> None:
    sink = DeltaTablesSink(tmp_path / "root", sink_id="orders")
    for b in range(20):
        assert _commit(sink, b)
    in_flight = tmp_path / "root" / "events" / "part-00020-running-task.parquet"  # a task's, not committed
    pq.write_table(pa.table({"id": ["x"], "k": [0]}), in_flight)
    done = {t.table: t for t in maintain(tmp_path / "root", retention_hours=0, orphans=True)}
    assert done["events"].files_before == 20 and done["events"].files_after == 1
    assert done["events"].vacuumed >= 20 and done["totals"].vacuumed >= 19  # merges' replaced files too
    assert done["events"].markers == {"onceflow:orders": 19} == done["totals"].markers
    assert in_flight.exists()  # named by no commit, younger than a day: kept even with orphans=True
    in_flight.unlink()
    assert not _commit(sink, 19)  # the replay of the last batch before maintenance: skipped
    for b in range(20, 30):
        assert _commit(sink, b)
    assert not _commit(DeltaTablesSink(tmp_path / "root", sink_id="orders"), 29)  # a new process too
    ids, totals = _stored(tmp_path / "root")
    want_ids, want_totals = _want(range(30))
    assert sorted(ids) == sorted(want_ids) and totals == want_totals
    assert [m["batch_id"] for m in sink.batches()] == list(range(30))  # every marker, with its metrics
    assert all(m["input_rows"] == 20 for m in sink.batches())


def test_maintenance_racing_the_sinks_commits_loses_nothing(tmp_path: Path) -> None:
    """A thread compacts and vacuums (retention 0) without pause while the sink commits 60 batches; a batch
    that fails (a merge whose snapshot's file the vacuum deleted) runs again, as Spark re-runs it."""
    root = tmp_path / "root"
    sink = DeltaTablesSink(root, sink_id="orders")
    assert _commit(sink, 0)
    stop, rounds, errors = threading.Event(), [0], []

    def maintainer() -> None:
        while not stop.is_set():
            try:
                maintain(root, retention_hours=0)
                rounds[0] += 1
            except Exception as exc:  # noqa: BLE001 - lost to the sink's commits too often: next round
                errors.append(exc)

    thread = threading.Thread(target=maintainer)
    thread.start()
    retried = 0
    try:
        for b in range(1, 60):
            for _ in range(20):
                try:
                    _commit(sink, b)
                    break
                except Exception:  # noqa: BLE001 - Spark would run the batch again
                    retried += 1
            else:
                pytest.fail(f"batch {b} never committed beside the maintenance")
    finally:
        stop.set()
        thread.join()
    assert rounds[0] >= 5, (rounds, errors)  # the maintenance really ran beside the commits
    ids, totals = _stored(root)
    want_ids, want_totals = _want(range(60))
    assert sorted(ids) == sorted(want_ids) and totals == want_totals  # every row once, every sum exact
    assert [m["batch_id"] for m in sink.batches()] == list(range(60))
    assert len(DeltaTable(str(root / "events")).file_uris()) < 60


CHILD = """
import sys
from pathlib import Path
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

tmp = Path(sys.argv[1])
spark = session(app_name="delta-maintain", shuffle_partitions=2)
stream = spark.readStream.schema("id STRING, k INT").option("maxFilesPerTrigger", 1).parquet(str(tmp / "in"))
sink = onceflow.delta(tmp / "root", sink_id="orders", maintain_every=2, retention_hours=0)
tables = {"events": Table(), "totals": Table(key="k", add=["n"])}

def per_batch(df):
    return {"events": df, "totals": df.groupBy("k").agg(F.count(F.lit(1)).alias("n"))}

onceflow.write_stream(stream, sink, tmp / "ck", tables, per_batch, once=True).awaitTermination()
print("done")
"""


@pytest.mark.spark
@pytest.mark.faults
def test_a_query_that_compacts_every_two_batches_killed_after_a_commit_is_exact(tmp_path: Path) -> None:
    """``maintain_every=2``: compaction and vacuum after batches 1, 3, 5 in the driver; SIGKILL after batch
    3's commit (its input has 300 rows), before its maintenance; the restart skips batch 3, maintains, goes
    on."""
    (tmp_path / "in").mkdir()
    want_ids: list[str] = []
    for f in range(6):
        ids = [f"{f}-{i}" for i in range(300)]
        want_ids += ids
        pq.write_table(pa.table({"id": ids, "k": pa.array([i % 5 for i in range(300)], pa.int32())}),
                       tmp_path / "in" / f"part-{f}.parquet")
    seen: list[Any] = []

    def between(_: Any) -> None:
        table = DeltaTable(str(tmp_path / "root" / "events"))
        seen.append((table.transaction_version("onceflow:orders"), len(table.file_uris())))

    killed_then_restarted(CHILD, tmp_path, "after_sink_commit@3", between=between)
    assert seen == [(3, 3)]  # batch 3 committed; compacted after batch 1: one file for 0-1, then 2 and 3
    ids, totals = _stored(tmp_path / "root")
    assert sorted(ids) == sorted(want_ids)
    assert totals == {k: 360 for k in range(5)}
    sink = DeltaTablesSink(tmp_path / "root", sink_id="orders")
    assert [m["batch_id"] for m in sink.batches()] == list(range(6))
    assert len(DeltaTable(str(tmp_path / "root" / "events")).file_uris()) == 1  # compacted after batch 5


def test_the_command_maintains_every_table_and_names_a_wrong_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from onceflow.cli.main import cli

    sink = DeltaTablesSink(tmp_path / "root", sink_id="orders")
    for b in range(5):
        assert _commit(sink, b)
    done = CliRunner().invoke(cli, ["maintain", "--delta", str(tmp_path / "root"), "--retention", "0"])
    assert done.exit_code == 0, done.output
    assert "events: 5 -> 1 files (5 compacted, 5 deleted); onceflow:orders at batch 4" in done.output
    assert "totals: 1 -> 1 files" in done.output
    wrong = CliRunner().invoke(cli, ["maintain", "--delta", str(tmp_path / "root"), "--table", "event"])
    assert wrong.exit_code != 0 and "no Delta table 'event'" in str(wrong.exception or wrong.output)
    assert not _commit(sink, 4)  # still a replay
