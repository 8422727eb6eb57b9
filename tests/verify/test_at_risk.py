"""Faults that put data at risk (no JVM): crash points skip batches without input, rounds count rows.

Spark runs no-data batches to advance the watermark; a crash there replays nothing. The batch
writer notes each batch's planned input before its crash points; a point armed at ``@0`` fires at
the first batch with input. Verify records which batches a fault hit and how many input rows
they held; a round that hit none does not count as a tested fault.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from onceflow import faults
from onceflow.checkpoint.ranges import InputRange
from onceflow.faults import CrashPoint
from onceflow.verify import crashes
from onceflow.verify.chaos import VerifyResult
from onceflow.verify.crashes import CRASH_ENV, DRIVER_PID_ENV, WORKER_ENV
from onceflow.verify.faulting import RoundRecord, at_risk, crash_batches
from onceflow.verify.verdict import Verdict


def _file_range(batch: int, files: list[str]) -> InputRange:
    return InputRange(batch, 0, 0, (f'{{"logOffset":{batch}}}',), None if batch == 0 else
                      (f'{{"logOffset":{batch - 1}}}',),
                      {0: [{"path": f, "timestamp": 1, "batchId": batch} for f in files]})


def test_a_range_has_input_when_it_has_files_or_its_offsets_moved() -> None:
    assert _file_range(3, ["file:///in/a.parquet"]).has_input()
    assert not _file_range(4, []).has_input()  # a no-data batch: the log position of N-1
    kafka = '{"t":{"0":17,"1":5}}'
    assert not InputRange(5, 0, 0, (kafka,), (kafka,)).has_input()
    assert InputRange(5, 0, 0, ('{"t":{"0":18,"1":5}}',), (kafka,)).has_input()
    assert not InputRange(0, 0, 0, ('{"t":{"0":0,"1":0}}',), None).has_input()  # batch 0, empty topic
    assert InputRange(0, 0, 0, ('{"t":{"0":0,"1":3}}',), None).has_input()
    assert not InputRange(0, 0, 0, ("-",), None).has_input()
    # two sources: one moved is enough
    assert InputRange(2, 0, 0, (kafka, '{"logOffset":2}'), (kafka, '{"logOffset":1}'),
                      {1: [{"path": "x", "timestamp": 1, "batchId": 2}]}).has_input()


@pytest.fixture()
def armed(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    driver = f"test{uuid.uuid4().hex[:12]}"  # notes of this test only
    monkeypatch.setenv(DRIVER_PID_ENV, driver)
    monkeypatch.setenv(CRASH_ENV, "after_sink_commit@0")
    yield driver
    notes = crashes._notes_dir()
    for p in notes.glob("*"):
        p.unlink()
    notes.rmdir()


def test_a_crash_point_skips_batches_noted_without_input(armed: str) -> None:
    point = CrashPoint.AFTER_SINK_COMMIT
    faults.planned(0, True)
    faults.planned(1, False)
    faults.planned(2, True)
    assert faults.armed_for(point, 0)
    assert not faults.armed_for(point, 1)  # the no-data batch: the point waits
    assert faults.armed_for(point, 2)
    assert faults.armed_for(point, 3)  # not noted (a process that runs no batches): as armed
    assert not faults.armed_for(CrashPoint.INSIDE_SINK_TXN, 2)  # another point
    faults.planned(2, False)  # a note is replaced, not added to
    assert not faults.armed_for(point, 2)


def test_a_python_worker_of_the_driver_sees_the_notes(armed: str) -> None:
    """An executor-side writer's commit runs in a Python worker: it reads the driver's notes.

    The worker is a Python started as Spark starts one (its secret in the environment), with the
    tests' ``PYTHONPATH``: the crash hook comes from the verifier's ``sitecustomize``."""
    faults.planned(7, False)
    faults.planned(8, True)
    code = ("from onceflow import faults; from onceflow.faults import CrashPoint as C; "
            "print(faults.armed_for(C.AFTER_SINK_COMMIT, 7), faults.armed_for(C.AFTER_SINK_COMMIT, 8))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, DRIVER_PID_ENV: armed, WORKER_ENV: "s"})
    assert out.stdout.split() == ["False", "True"]


def test_nothing_is_noted_without_an_armed_point(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = f"test{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(DRIVER_PID_ENV, driver)
    monkeypatch.delenv(CRASH_ENV, raising=False)
    faults.planned(0, False)
    assert not crashes._notes_dir().exists()


def test_ingest_points_are_not_gated(armed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CRASH_ENV, "ingest_after_record@2")
    faults.planned(2, False)  # a group number of the receiver is no batch
    assert faults.armed_for(CrashPoint.INGEST_AFTER_RECORD, 2)


def test_the_batches_a_crash_hit_come_from_the_driver_output() -> None:
    out = ("starting\nonceflow: crash point inside_sink_txn at batch 4\n"
           "onceflow: crash point inside_sink_txn at batch 4\n")
    assert crash_batches(out) == [4]
    assert crash_batches("AmbiguousCommitError: injected fault: batch 9 committed, reporting failure") == [9]
    assert crash_batches("nothing") == []


def _result(records: list[RoundRecord], faults_: list[str]) -> VerifyResult:
    return VerifyResult({"faults": faults_, "seed": 0}, records, Verdict("x", {}, 0, 0), 0, 1.0, 0)


def test_a_round_that_hit_no_rows_does_not_count() -> None:
    hit = RoundRecord(1, "crash_after_sink_commit", 0.0, fault_batches=[2])
    empty = RoundRecord(2, "crash_after_sink_commit", 0.0, fault_batches=[3])
    killed_between = RoundRecord(3, "kill_random", 0.0, fault_batches=[])
    restart = RoundRecord(4, "trigger_change", 0.0)
    markers = [{"batch_id": 2, "input_rows": 1000}, {"batch_id": 3, "input_rows": 0}]
    at_risk([hit, empty, killed_between, restart], markers)
    assert (hit.rows_at_risk, empty.rows_at_risk, killed_between.rows_at_risk) == (1000, 0, 0)
    assert restart.rows_at_risk is None and restart.tested
    assert hit.tested and not empty.tested and not killed_between.tested
    assert "does not count" in empty.outcome
    result = _result([hit, empty, killed_between, restart],
                     ["crash_after_sink_commit", "kill_random", "trigger_change", "late_events"])
    assert result.tested_by_kind() == {"crash_after_sink_commit": 1, "kill_random": 0, "trigger_change": 1,
                                       "late_events": 1}
    assert result.untested() == ["kill_random"]



def test_without_a_hook_the_librarys_steps_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library reads no setting: an armed environment without the verifier's hook changes nothing."""
    monkeypatch.setenv(CRASH_ENV, "after_sink_commit@0")
    hook = faults.installed()
    assert hook is not None and faults.armed_for(CrashPoint.AFTER_SINK_COMMIT, 0)  # the control
    faults.install(None)
    try:
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, 0)  # with the hook: this process SIGKILLed
        assert not faults.armed_for(CrashPoint.AFTER_SINK_COMMIT, 0)
        assert faults.query_listener() is None and not faults.reply_lost()
    finally:
        faults.install(hook)
