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


ORDERS = str(Path(__file__).parent / "pipelines" / "orders.py")


@pytest.mark.long  # ~40-60 s each: make test's 30 minutes
@pytest.mark.parametrize(("build", "faults", "table"), [
    ("build", "crash_inside_sink_txn,sink_outage,crash_task_after_write", "customers"),  # late= keyed by id
    ("build_rejects", "kill_random,crash_after_sink_commit", "rejected_orders"),  # rejects= keyed by record
])
def test_keyed_tables_late_and_rejected_rows_into_iceberg(tmp_path: Path, build: str, faults: str,
                                                         table: str) -> None:
    """The merge pipeline of ``orders.py`` (add/max/min tables) into Iceberg, its late orders (``late=``,
    keyed by the order id) or its bad lines (``rejects=``, keyed by the record), under faults."""
    from tests.verify.pipelines import sample

    sample.write(tmp_path / "in", files=4, per_file=600, seed=7)
    bad = sample.add_bad_lines(tmp_path / "in", seed=7) if build == "build_rejects" else []
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{ORDERS}:{build}", "--input",
                           str(tmp_path / "in"), "--sink", "iceberg", "--rounds", str(len(faults.split(","))),
                           "--seed", "3", "--faults", faults)
    assert rc == 0, out
    assert all(r["rows_at_risk"] for r in rep["rounds"]), rep["rounds"]
    tables = rep["verdict"]["tables"]
    assert tables[table]["expected_rows"] == tables[table]["actual_rows"] > 0
    if bad:
        assert tables["rejected_orders"]["actual_rows"] == len(bad)
    else:
        assert rep["verdict"]["late_expected"] == rep["verdict"]["late_recorded"] > 0
