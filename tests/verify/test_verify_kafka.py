"""``onceflow verify --source kafka`` (and on a standalone cluster with a worker kill), as a user runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.verify.verify_cli import run_verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _verify(report: Path, *args: str, timeout: float = 900) -> tuple[int, str, dict[str, Any]]:
    return run_verify(report, "--source", "kafka", *args, timeout=timeout)


def _rounds_ok(rep: dict[str, object]) -> list[dict[str, object]]:
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    for r in rounds:
        bad = ("timed out", "unexpected", "fault not reached", "no busy")
        assert not str(r["outcome"]).startswith(bad), r
    return rounds


@pytest.mark.slow
@pytest.mark.long  # make test-long (tests/sources/test_kafka_crash.py covers the crash points in make test)
def test_kafka_source_under_crash_points_and_kills(tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--rounds", "5", "--seed", "18", "--events-per-round", "2000",
                           "--faults", "kill_random,crash_inside_sink_txn,crash_after_sink_commit,"
                           "crash_after_commit_log,trigger_change,producer_duplicates,late_events")
    assert rc == 0, out[-3000:]
    assert "source: Kafka topic" in out
    _rounds_ok(rep)
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]
    assert verdict["late_expected"] == verdict["late_recorded"] > 0  # late drops counted per batch
    assert rep["input_rows"] == 10_500  # 10,000 events + 5% producer retries, each produced once


@pytest.mark.slow
@pytest.mark.long  # make test-long: 100 s of make test's 30 minutes
def test_standalone_cluster_with_a_worker_kill(tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--rounds", "3", "--seed", "5", "--events-per-round", "4000",
                           "--cluster", "standalone", "--faults", "worker_kill,kill_random", timeout=1200)
    assert rc == 0, out[-3000:]
    assert "cluster: standalone master spark://127.0.0.1:" in out
    rounds = _rounds_ok(rep)
    kills = [str(r["outcome"]) for r in rounds if r["fault"] == "worker_kill"]
    assert len(kills) == 2
    for killed in kills:
        assert "SIGKILLed while busy" in killed and "worker restarted" in killed
        assert "Spark: 0 executor lost" not in killed  # the driver saw the executor go
    assert any(" 0 tasks cut off" not in k for k in kills), kills  # a kill hit a running task
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]


@pytest.mark.long  # ~65 s: make test-long (make test restarts the broker in tests/sinks/test_kafka_sink.py)
def test_kafka_in_kafka_out_under_crashes_and_a_broker_outage(tmp_path: Path) -> None:
    """``--source kafka --sink kafka``: the oracle reads the output topics with ``read_committed``."""
    rc, out, rep = _verify(tmp_path, "--rounds", "3", "--seed", "21", "--events-per-round", "2000",
                           "--sink", "kafka", "--faults",
                           "crash_inside_sink_txn,ambiguous_commit,sink_outage")
    assert rc == 0, out[-3000:]
    rounds = _rounds_ok(rep)
    assert {r["fault"] for r in rounds} == {"crash_inside_sink_txn", "ambiguous_commit", "sink_outage"}
    assert all(int(r["rows_at_risk"]) > 0 for r in rounds if r["fault"] != "sink_outage"), rounds
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"], verdict
    assert str(verdict["sink"]).startswith("kafka:127.0.0.1:")


@pytest.mark.parametrize("sink", [
    pytest.param("naive", marks=pytest.mark.long),  # make test-long: the Kafka sink's control reads Kafka too
    pytest.param("kafka-naive", marks=pytest.mark.long),  # make test's 30 minutes (2026-11-28)
])
def test_a_negative_control_sink_is_caught(tmp_path: Path, sink: str) -> None:
    rc, out, rep = _verify(tmp_path, "--rounds", "1", "--seed", "4", "--events-per-round", "3000",
                           "--sink", sink, "--faults", "crash_after_sink_commit")
    assert rc == 1, out[-3000:]
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["duplicated"] > 0


@pytest.mark.slow
@pytest.mark.long  # make test-long: ~2 minutes per sink on a standalone cluster
@pytest.mark.parametrize("sink", ["kafka-tasks", "sqlite-tasks", "delta-tasks", "http-tasks"])
def test_executors_killed_mid_write_on_a_standalone_cluster(tmp_path: Path, sink: str) -> None:
    """Each writing task's first attempt SIGKILLs its executor after part of its rows: Spark reruns it."""
    rc, out, rep = run_verify(tmp_path, "--rounds", "2", "--seed", "7", "--events-per-round", "4000",
                              "--cluster", "standalone", "--sink", sink,
                              "--faults", "executor_kill_mid_write,kill_random", timeout=1200)
    assert rc == 0, out[-3000:]
    rounds = _rounds_ok(rep)
    kills = [r for r in rounds if r["fault"] == "executor_kill_mid_write"]
    assert kills and all(str(r["outcome"]).startswith("executor SIGKILLed mid-write") for r in kills), kills
    assert all(int(r["rows_at_risk"]) > 0 for r in kills), kills
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]


def test_the_mid_write_kill_is_a_fault_of_the_tasks_sinks_on_a_cluster() -> None:
    from onceflow.verify.fault_kinds import default_faults, reaches

    assert "executor_kill_mid_write" in default_faults("kafka-tasks", "standalone")
    assert "executor_kill_mid_write" in default_faults("http-tasks", "local")
    assert "executor_kill_mid_write" not in default_faults("kafka-tasks", "")  # local[*]: no executor JVM
    assert "executor_kill_mid_write" not in default_faults("kafka", "standalone")  # the driver writes
    assert not reaches("sqlite", "executor_kill_mid_write")
    assert reaches("delta-tasks", "executor_kill_mid_write")
