"""``onceflow verify`` end to end, run as the command a user runs: it must be able to fail."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from onceflow.verify.resume import kill_stale
from tests.verify.verify_cli import run_verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _verify(report: Path, *args: str, timeout: float = 900,
            dsn: str | None = None) -> tuple[int, str, dict[str, Any]]:
    return run_verify(report, *args, env={"ONCEFLOW_PG_DSN": dsn} if dsn else None, timeout=timeout)


def _dsn_for(sink: str, request: pytest.FixtureRequest) -> str | None:
    """The test server's DSN, with a password (ignored by its trust authentication) that must
    never show up in anything verify writes."""
    if not sink.startswith("postgres") and not sink.endswith("-pg"):  # -pg: a ledger in PostgreSQL
        return None
    return f"{request.getfixturevalue('pg_dsn')} password=s3cr3t"


SPARK_FAULTS = ("kill_random", "crash_before_sink_write", "crash_inside_sink_txn", "crash_after_sink_commit",
                "crash_after_commit_log", "crash_apply_pending", "ambiguous_commit", "trigger_change")


def _markers(db: Path) -> int:
    if not db.exists():
        return 0
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM onceflow_batches").fetchone()[0])
        except sqlite3.OperationalError:  # not created yet
            return 0


def _kill_verify_when(report: Path, args: list[str], ready: Callable[[int, int], bool],
                      resume: bool) -> None:
    """Run verify until ``ready(rounds saved, log segments)`` holds, then SIGKILL it (its
    round's driver runs on, in its own session, until the resume kills it)."""
    flags = ["--resume"] if resume else []
    proc = subprocess.Popen([sys.executable, "-m", "onceflow.cli.main", "verify", "--report", str(report),
                             *flags, *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    state, log = report / "work" / "state.json", report / "work" / "log"
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None and time.monotonic() < deadline
        rounds = len(json.loads(state.read_text())["rounds"]) if state.exists() else 0
        if ready(rounds, len(list(log.glob("*.parquet"))) if log.exists() else 0):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def stale_killed(tmp_path: Path) -> Iterator[Path]:
    """The report directory; whatever the verify runs in it left running is killed at the end."""
    yield tmp_path
    if (tmp_path / "work").exists():
        kill_stale(tmp_path / "work")


@pytest.mark.long  # make test-long (each fault kind on a pipeline: test_pipeline_verify.py in make test)
def test_every_fault_kind_once_also_across_a_killed_and_resumed_verify(tmp_path: Path,
                                                                       stale_killed: Path) -> None:
    """Every fault kind once (sqlite); verify itself is SIGKILLed twice and resumed: after all of
    round 1's input was fed and its driver had processed it (nothing left to feed: the round is
    recorded as verify_kill and drained, the schedule moves on), and while round 3's input is
    being fed (the rest of it is fed, none twice)."""
    args = ["--rounds", "9", "--seed", "3", "--events-per-round", "3000"]
    per = 3  # segments a round (3000 events, 1000 a segment)
    _kill_verify_when(tmp_path, args, lambda rounds, segs: segs >= per, resume=False)
    # round 1's driver runs on: let it commit all of its input (markers unchanged for 6 s), so
    # that the resumed round 1 has nothing left to process (a fault waiting for a batch would hang)
    deadline, seen, since = time.monotonic() + 180, -1, time.monotonic()
    while (n := _markers(tmp_path / "work" / "sink.db")) < 2 or time.monotonic() - since < 6:
        assert time.monotonic() < deadline
        if n != seen:
            seen, since = n, time.monotonic()
        time.sleep(0.2)
    _kill_verify_when(tmp_path, args, lambda rounds, segs: rounds >= 2 and segs > 2 * per, resume=True)
    rc, out, _ = _verify(tmp_path, "--resume", *args[:-1], "4000", timeout=120)
    assert rc == 2 and "these differ: events_per_round" in out  # another configuration is refused
    rc, out, rep = _verify(tmp_path, "--resume", *args)
    assert rc == 0, out
    assert "resuming after round 2" in out
    assert rep["ok"] is True
    kinds = rep["faults_by_kind"]
    assert isinstance(kinds, dict)
    for kind in (*SPARK_FAULTS, "producer_duplicates", "late_events"):
        assert kinds.get(kind, 0) >= 1, kind
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    assert [r["round"] for r in rounds] == list(range(1, 10))
    assert [r["fault"] for r in rounds][:3] == ["verify_kill", "kill_random", "crash_before_sink_write"]
    for r in rounds:  # each fault really happened as intended
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
        if r["fault"].startswith("crash_") or r["fault"] == "ambiguous_commit":  # on a batch with data
            assert r["fault_batches"] and r["rows_at_risk"] > 0, r
    assert all("timed out" not in r["outcome"] for r in rounds)
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0
    assert verdict["late_expected"] == verdict["late_recorded"] > 0
    assert rep["input_rows"] == 28_350  # 27,000 events + 5% producer retries: the resumes fed none twice
    html = (tmp_path / "report.html").read_text()
    assert "onceflow verify: OK" in html and "<svg" in html
    assert f"report written to {tmp_path / 'report.html'}" in out


@pytest.mark.slow
@pytest.mark.long  # make test-long; make test has 2pc's crash points in test_contract_example51 and
# test_postgres_two_phase
def test_postgres_two_phase_sink_under_the_crash_points(tmp_path: Path,
                                                         request: pytest.FixtureRequest) -> None:
    # the full seven-kind run against each Postgres sink is a documented command (RELIABILITY.md)
    faults = "crash_inside_sink_txn,crash_after_sink_commit,ambiguous_commit,kill_random,late_events"
    rc, out, rep = _verify(tmp_path, "--rounds", "4", "--seed", "3", "--events-per-round", "3000",
                           "--faults", faults, "--sink", "postgres-2pc",
                           dsn=_dsn_for("postgres-2pc", request))
    assert rc == 0, out
    written = [out, (tmp_path / "report.json").read_text(), (tmp_path / "report.html").read_text()]
    written += [f.read_text() for f in (tmp_path / "work" / "out").iterdir()]
    assert not any("s3cr3t" in text for text in written)
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    for r in rounds:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]


@pytest.mark.long  # make test-long (make test's 30 minutes; test_stable_effects.py covers the crash points)
def test_side_effect_sink_under_its_crash_points_with_a_failing_service(tmp_path: Path) -> None:
    """Example 5-1's deltas as HTTP calls to the demo service, which fails 3% of calls and
    times out 1% *after* applying them; the verdict is read from the service's own records."""
    faults = "crash_effects_started,crash_effects_sent,crash_after_sink_commit,kill_random,late_events"
    rc, out, rep = _verify(tmp_path, "--rounds", "4", "--seed", "2", "--events-per-round", "2000",
                           "--faults", faults, "--sink", "http")
    assert rc == 0, out
    for r in rep["rounds"]:  # type: ignore[union-attr]
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]
    with closing(sqlite3.connect(tmp_path / "work" / "service.db")) as conn:
        outcomes = dict(conn.execute("SELECT outcome, count(*) FROM calls GROUP BY 1").fetchall())
        answers = dict(conn.execute("SELECT answer, count(*) FROM calls GROUP BY 1").fetchall())
    assert outcomes.get("replayed", 0) > 0  # keys were sent again and recognised, never applied twice
    assert answers.get("500", 0) > 0 and answers.get("late", 0) > 0  # applied, then failed / timed out


@pytest.mark.long  # make test-long (make test's 30 minutes; test_api_crash.py[delta] has the crash points)
def test_delta_sink_under_the_crash_points_and_a_tampered_table_is_caught(tmp_path: Path) -> None:
    """Delta tables (the marker an app transaction per table, no transaction across tables):
    crash_inside_sink_txn dies between the two tables' commits."""
    from deltalake import DeltaTable, write_deltalake

    from onceflow.verify.oracle import expect
    from onceflow.verify.verdict import judge_delta

    faults = "crash_inside_sink_txn,crash_after_sink_commit,ambiguous_commit,kill_random,late_events"
    rc, out, rep = _verify(tmp_path, "--rounds", "4", "--seed", "3", "--events-per-round", "3000",
                           "--faults", faults, "--sink", "delta")
    assert rc == 0, out[-3000:]
    for r in rep["rounds"]:  # type: ignore[union-attr]
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]
    assert verdict["late_expected"] == verdict["late_recorded"] > 0  # metrics in the commit metadata
    # the auditor can fail here: rows written again without the version check (delta-rs alone)
    root, expectation = tmp_path / "work" / "delta", expect(tmp_path / "work" / "checkpoint")
    assert judge_delta(root, expectation).ok
    users = str(root / "user_counts")
    write_deltalake(users, DeltaTable(users).to_pyarrow_table().slice(0, 5), mode="append")
    assert "5 rows repeat a key of their table" in judge_delta(root, expectation).violations


@pytest.mark.long  # make test-long; the task points of SQLite and PostgreSQL: test_api_crash.py
@pytest.mark.parametrize("sink", ["delta-tasks", "sqlite-tasks", "postgres-tasks", "kafka-tasks",
                                  "http-tasks", "http-tasks-pg"])
def test_tasks_paths_under_task_deaths_and_the_crash_points(tmp_path: Path, sink: str,
                                                            request: pytest.FixtureRequest) -> None:
    """Every batch written by Spark's tasks: tasks killed after writing their files (or staging their
    rows), before their messages reached the driver, and the driver killed inside and after the commit."""
    inside = "ambiguous_commit" if sink.startswith("http") else "crash_inside_sink_txn"  # no transaction
    faults = f"crash_task_after_write,{inside},crash_after_sink_commit,kill_random"
    rc, out, rep = _verify(tmp_path, "--rounds", "4", "--seed", "5", "--events-per-round", "3000",
                           "--faults", faults, "--sink", sink, dsn=_dsn_for(sink, request))
    assert rc == 0, out[-3000:]
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    assert [r["fault"] for r in rounds if r["fault"] == "crash_task_after_write"], rounds
    for r in rounds:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
        if r["fault"] == "crash_task_after_write":
            assert r["outcome"].startswith("tasks died at task_after_write") and r["rows_at_risk"] > 0, r
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]


@pytest.mark.parametrize(("sink", "fault", "violation"), [
    # no batch marker: a replay adds twice (the SQLite naive sink is caught the same way by verify
    # in tests/verify/test_verify_kafka.py, and under the payments example in tests/core/test_api_crash.py)
    ("postgres-naive", "crash_after_sink_commit", "duplicated"),
    ("lossy", "crash_inside_sink_txn", "lost"),  # marker committed before the rows
    # no ledger, a service without idempotency; make test-long: make test has the same sink and
    # crash duplicating every effect (tests/sinks/test_http.py) and verify catching other naive sinks
    pytest.param("http-naive", "crash_effects_sent", "duplicated", marks=pytest.mark.long),
    ("delta-naive", "crash_after_sink_commit", "duplicated"),  # the app transaction never checked
    ("iceberg-naive", "crash_after_sink_commit", "duplicated"),  # the tables' marker never read
])
def test_negative_control_sink_is_caught(tmp_path: Path, sink: str, fault: str, violation: str,
                                         request: pytest.FixtureRequest) -> None:
    rc, out, rep = _verify(tmp_path, "--rounds", "1", "--faults", fault,
                           "--sink", sink, "--events-per-round", "2000", dsn=_dsn_for(sink, request))
    assert rc == 1, out
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    other = "lost" if violation == "duplicated" else "duplicated"
    assert verdict[violation] > 0 and verdict[other] == 0
    assert "VIOLATION" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--faults", "meteor_strike"], "unknown faults ['meteor_strike']"),
    (["--faults", "executor_kill"], "needs --cluster"),
    (["--faults", "late_events"], "needs at least one of"),
    (["--faults", "receiver_kill"], "need --ingest"),
    (["--faults", "crash_apply_pending", "--sink", "naive"], "needs --sink sqlite"),
    (["--faults", "crash_inside_sink_txn", "--sink", "http"], "never reaches the faults"),
])
def test_bad_usage_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    rc, out, _ = _verify(tmp_path, *args, timeout=60)
    assert rc == 2, out
    assert message in out


@pytest.mark.long  # make test-long (make test's 30 minutes)
@pytest.mark.parametrize("sink", ["postgres-2pc"])  # executor-side writes: the interesting case
def test_executor_kill_on_a_multi_process_cluster(tmp_path: Path, sink: str,
                                                   request: pytest.FixtureRequest) -> None:
    rc, out, rep = _verify(tmp_path, "--rounds", "1", "--faults", "executor_kill", "--cluster",
                           "--events-per-round", "3000", "--sink", sink, dsn=_dsn_for(sink, request))
    assert rc == 0, out
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    assert rounds[0]["outcome"].startswith("executor SIGKILLed while busy"), rounds[0]
    driver_log = (tmp_path / "work" / "out" / "round0001-executor_kill.out").read_text()
    assert "Lost executor" in driver_log  # Spark saw the executor die and went on


INGEST_FAULTS = ["receiver_kill", "receiver_crash_after_stage", "receiver_crash_after_record",
                 "receiver_crash_after_publish", "sender_kill", "dropped_acks"]


@pytest.mark.slow
@pytest.mark.long  # make test-long (make test's 30 minutes; tests/ingest covers the service)
def test_end_to_end_through_senders_and_the_receiver(tmp_path: Path) -> None:
    faults = ["crash_after_sink_commit", *INGEST_FAULTS, "producer_duplicates", "late_events"]
    rc, out, rep = _verify(tmp_path, "--ingest", "--rounds", "6", "--seed", "5", "--events-per-round",
                           "2000", "--faults", ",".join(faults))
    assert rc == 0, out
    kinds = rep["faults_by_kind"]
    assert isinstance(kinds, dict)
    assert all(kinds.get(f, 0) >= 1 for f in faults), kinds
    rounds = rep["rounds"]
    assert isinstance(rounds, list)
    outcomes = {r["fault"]: r["outcome"] for r in rounds}
    assert outcomes["crash_after_sink_commit"] == "driver died at after_sink_commit"
    for point in ("stage", "record", "publish"):
        assert outcomes[f"receiver_crash_after_{point}"].startswith(f"receiver died at ingest_after_{point}")
    assert outcomes["receiver_kill"].startswith("receiver SIGKILLed mid-stream")
    assert outcomes["sender_kill"].startswith("sender SIGKILLed mid-stream")
    ingest = rep["ingest"]
    assert isinstance(ingest, dict)
    assert ingest["ids_sent"] == 12_000 and ingest["rows_in_log"] == 12_000
    assert ingest["lost"] == ingest["duplicated"] == ingest["unexpected"] == 0
    assert ingest["receiver_lives"] >= 6 and ingest["sender_lives"] >= 7
    receivers = "".join(p.read_text() for p in (tmp_path / "work" / "out").glob("receiver*.out"))
    assert "no authentication" not in receivers  # senders authenticated with a token
    assert (tmp_path / "work" / "tokens").read_text().startswith("verify sha256:")
    senders = (tmp_path / "work" / "out" / "sender.out").read_text()
    assert " retries" in senders and any(  # dropped acks made senders repeat delivered batches
        int(line.split(" retries")[0].rsplit(" ", 1)[1]) > 0 for line in senders.splitlines()
        if line.startswith("sent:"))
    verdict = rep["verdict"]
    assert isinstance(verdict, dict)
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]

