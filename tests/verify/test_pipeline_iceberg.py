"""``onceflow verify --pipeline ... --sink iceberg``: a user's lake pipeline into Iceberg, proven or caught.

The pipeline (``tests/verify/pipelines/orders_lake.py``, written for these tests) appends each
deduplicated order to ``orders`` and each batch's per-customer sums to ``customer_batches``; the
oracle reruns that transform over each batch's input; the verdict reads the tables back with
pyiceberg from the run's SQLite catalog. The negative control ``iceberg-naive`` never reads its
marker, so a batch replayed after a crash past its commit is appended twice — and caught.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onceflow.verify.fault_kinds import default_faults
from onceflow.verify.pipeline_verdict import iceberg_reader
from tests.verify.verify_cli import run_verify as _verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]

LAKE = str(Path(__file__).parent / "pipelines" / "orders_lake.py")


@pytest.mark.long  # ~50 s, make test's 30 minutes; the sink's own crash tests: tests/sinks/test_iceberg.py
def test_crashes_between_and_after_the_tables_commits_leave_exact_iceberg_tables(orders_sample: Path,
                                                                                   tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{LAKE}:build", "--input", str(orders_sample),
                           "--sink", "iceberg", "--rounds", "3", "--seed", "5",
                           "--faults", "crash_inside_sink_txn,crash_after_sink_commit,kill_random")
    assert rc == 0, out
    assert sorted(r["fault"] for r in rep["rounds"]) == ["crash_after_sink_commit", "crash_inside_sink_txn",
                                                         "kill_random"]
    for r in rep["rounds"]:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
        assert r["rows_at_risk"] > 0, r  # each fault met a batch with orders in it
    assert set(rep["verdict"]["tables"]) == {"orders", "customer_batches"}
    assert rep["verdict"]["late_expected"] == rep["verdict"]["late_recorded"]  # late= (an append table)
    # one total by hand: each order id once in the lake (late ones dropped by the watermark)
    stored = iceberg_reader(tmp_path / "work" / "iceberg")("orders", None)
    assert stored is not None
    ids = [r["order_id"] for r in stored]
    sent = {json.loads(ln)["order_id"] for f in orders_sample.iterdir() for ln in f.read_text().splitlines()}
    assert len(ids) == len(set(ids)) and set(ids) <= sent and len(ids) > 0.9 * len(sent)


def test_its_faults_and_its_pipeline_are_said() -> None:
    faults = default_faults("iceberg", pipeline=True)
    assert "crash_inside_sink_txn" in faults and "sink_outage" in faults  # another writer's commits
    assert "crash_task_after_write" in faults  # an identity mapInArrow before Spark's writer, when armed


@pytest.mark.long  # make test's 30 minutes
def test_the_naive_iceberg_sink_is_caught_duplicating(orders_sample: Path, tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{LAKE}:build", "--input", str(orders_sample),
                           "--sink", "iceberg-naive", "--rounds", "1", "--seed", "5",
                           "--faults", "crash_after_sink_commit")
    assert rc == 1, out
    assert rep["rounds"][0]["rows_at_risk"] > 0
    assert rep["verdict"]["tables"]["orders"]["duplicated_events"] > 0
