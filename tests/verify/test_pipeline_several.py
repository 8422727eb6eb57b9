"""``onceflow verify --pipeline ... --sink sqlite+iceberg``: a pipeline of two sinks, proven or caught.

The pipeline (``tests/verify/pipelines/orders_two_sinks.py``, written for these tests) adds each
batch's per-customer sums into a database sink and appends the raw orders (and the late ones) to a
lake sink, from one source and one checkpoint. ``crash_after_sink_commit`` fires after the first
sink's commit — between the two sinks: the database has the batch, the lake not yet; the replay
must skip it in the database and write it to the lake. The oracle runs the pipeline with each
sink's family name in its place, so the verdict reads each table from the sink it was routed to,
and checks each sink's markers against Spark's commit log. The negative control ``naive+iceberg``
(the database sink never reads its marker) is caught doubling sums.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.verify.fault_kinds import default_faults
from onceflow.verify.pipeline_verdict import iceberg_reader, sqlite_reader
from onceflow.verify.several_targets import SeveralTargets
from onceflow.verify.sinks import parts
from tests.verify.verify_cli import run_verify as _verify

TWO = str(Path(__file__).parent / "pipelines" / "orders_two_sinks.py")


def test_several_sinks_are_named_one_of_each_family_with_a_did_you_mean() -> None:
    assert parts("sqlite+iceberg") == ["sqlite", "iceberg"]
    with pytest.raises(ConfigError, match="one sink of each family.*sqlite and sqlite-tasks"):
        parts("sqlite+sqlite-tasks")
    with pytest.raises(ConfigError, match="'icebrg' is not a sink of a pipeline.*did you mean 'iceberg'"):
        parts("sqlite+icebrg")
    with pytest.raises(ConfigError, match="several sinks are joined by '\\+'"):
        SeveralTargets.check("sqlite")
    # a fault one of the sinks reaches is reached: the SQLite sink's staged point, Iceberg's tasks
    faults = default_faults("sqlite+iceberg", pipeline=True)
    assert {"crash_apply_pending", "crash_task_after_write", "crash_after_sink_commit"} <= set(faults)


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.long  # make test's time: tests/sinks/test_several.py kills a driver between two sinks' commits
def test_a_crash_between_the_two_sinks_commits_is_finished_in_the_lake(orders_sample: Path,
                                                                       tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{TWO}:build", "--input", str(orders_sample),
                           "--sink", "sqlite+iceberg", "--rounds", "1", "--seed", "5",
                           "--faults", "crash_after_sink_commit")  # sink_outage of either: the long runs
    assert rc == 0, out
    for r in rep["rounds"]:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
        assert r["rows_at_risk"] > 0, r  # each fault met a batch with orders in it
    tables = rep["verdict"]["tables"]
    assert set(tables) == {"customer_totals", "orders"}
    assert all(t["expected_rows"] == t["actual_rows"] > 0 for t in tables.values()), tables
    assert rep["verdict"]["late_expected"] == rep["verdict"]["late_recorded"]
    work = tmp_path / "work"
    # each table in the sink it was routed to, and only there
    assert sqlite_reader(work / "sink.db")("orders", None) is None
    assert iceberg_reader(work / "iceberg")("customer_totals", None) is None
    assert (iceberg_reader(work / "iceberg")("orders", None) or []) != []


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.long  # make test's 30 minutes; the negative controls of one sink run in make test
def test_the_naive_database_sink_beside_a_lake_is_caught(orders_sample: Path, tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{TWO}:build", "--input", str(orders_sample),
                           "--sink", "naive+iceberg", "--rounds", "1", "--seed", "5",
                           "--faults", "crash_after_sink_commit")
    assert rc == 1, out
    assert rep["rounds"][0]["rows_at_risk"] > 0
    assert rep["verdict"]["tables"]["customer_totals"]["too_high"] > 0, rep["verdict"]


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.long  # ~90 s: make test's 30 minutes
def test_sums_in_postgres_and_orders_in_delta_under_every_kind_of_fault(orders_sample: Path, tmp_path: Path,
                                                                         pg_dsn: str) -> None:
    faults = "crash_inside_sink_txn,crash_after_sink_commit,crash_task_after_write,sink_outage,kill_random"
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{TWO}:build", "--input", str(orders_sample),
                           "--sink", "postgres+delta-tasks", "--rounds", "5", "--seed", "11",
                           "--faults", faults, env={"ONCEFLOW_PG_DSN": pg_dsn})
    assert rc == 0, out
    for r in rep["rounds"]:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
    assert sum(r["rows_at_risk"] > 0 for r in rep["rounds"]) >= 4, rep["rounds"]
    tables = rep["verdict"]["tables"]
    assert all(t["expected_rows"] == t["actual_rows"] > 0 for t in tables.values()), tables
    assert "postgres" in rep["verdict"]["sink"] and "delta" in rep["verdict"]["sink"]


def test_the_command_line_says_which_sink_was_meant(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "onceflow.cli.main", "run", "--checkpoint",
                               str(tmp_path / "ck"), *args], capture_output=True, text=True, timeout=60)

    typo = run("--sink", "postgress", "--log", str(tmp_path))
    assert typo.returncode == 2 and "did you mean 'postgres'" in typo.stderr, typo.stderr
    several = run("--sink", "sqlite+iceberg", "--log", str(tmp_path))
    assert several.returncode == 2 and "routes its tables" in several.stderr, several.stderr


@pytest.mark.spark
@pytest.mark.faults
@pytest.mark.long  # a Kafka broker of its own: make test's 30 minutes
def test_sums_in_sqlite_and_orders_as_kafka_records(orders_sample: Path, tmp_path: Path) -> None:
    """The Kafka part's topics are read with ``read_committed`` and compared as JSON holds the values;
    the SQLite part's tables as they are."""
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{TWO}:build", "--input", str(orders_sample),
                           "--sink", "sqlite+kafka", "--rounds", "3", "--seed", "13",
                           "--faults", "crash_after_sink_commit,crash_inside_sink_txn,sink_outage")
    assert rc == 0, out
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"]), rep["rounds"]
    assert "kafka" in rep["rounds"][2]["outcome"] or "sqlite" in rep["rounds"][2]["outcome"]
    tables = rep["verdict"]["tables"]
    assert all(t["expected_rows"] == t["actual_rows"] > 0 for t in tables.values()), tables
