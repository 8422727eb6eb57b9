"""A verify whose faults proved little says so: INCONCLUSIVE (exit 3); a passing negative control: weak.

The issue's case: a 3-round run whose faults all hit before the first commit (markers 0 -> 0)
printed OK. Here the rounds are what verify records (:class:`RoundRecord`), the result and its
reports are verify's own, and the exit code is the command's (``onceflow.cli.verify._report``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onceflow.cli.verify import _report
from onceflow.verify.chaos import VerifyResult
from onceflow.verify.faulting import RoundRecord
from onceflow.verify.verdict import Verdict


def _result(rounds: list[RoundRecord], sink: str = "sqlite", asked: int | None = None,
            violations: list[str] | None = None) -> VerifyResult:
    config = {"rounds": asked or len(rounds), "faults": sorted({r.fault for r in rounds}), "sink": sink,
              "seed": 0}
    return VerifyResult(config, rounds, Verdict(sink, {}, 0, 0, violations=violations or []), 100, 1.0, 0)


def _round(i: int, fault: str, at_risk: int | None, before: int = 0, after: int = 0) -> RoundRecord:
    return RoundRecord(i, fault, 0.0, markers_before=before, markers_after=after, rows_at_risk=at_risk)


def _exit(result: VerifyResult, tmp_path: Path) -> int:
    with pytest.raises(SystemExit) as done:
        _report(lambda: result, tmp_path)
    return int(done.value.code or 0)


def test_rounds_that_hit_no_data_make_the_run_inconclusive(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    before_first_commit = [_round(1, "kill_random", 0), _round(2, "crash_inside_sink_txn", 0),
                           _round(3, "trigger_change", None, 0, 0)]
    result = _result(before_first_commit)
    assert result.ok and result.inconclusive and not result.proven and result.status == "INCONCLUSIVE"
    assert result.counted() == 0
    assert _exit(result, tmp_path) == 3
    out = capsys.readouterr().out
    assert "INCONCLUSIVE 0 of 3 rounds counted; rounds 1 (kill_random), 2 (crash_inside_sink_txn), 3 " \
           "(trigger_change) hit no batch with input rows" in " ".join(out.split())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "INCONCLUSIVE" and report["counted_rounds"] == 0 and report["inconclusive"]
    assert "onceflow verify: INCONCLUSIVE" in (tmp_path / "report.html").read_text()


def test_every_round_counted_is_ok_and_a_violation_still_fails(tmp_path: Path) -> None:
    good = [_round(1, "kill_random", 120), _round(2, "trigger_change", None, 3, 5)]
    assert _exit(_result(good), tmp_path / "a") == 0
    assert _result(good).status == "OK" and _result(good).proven
    assert _exit(_result(good, asked=3), tmp_path / "b") == 3  # fewer rounds ran than asked
    failed = _result([_round(1, "kill_random", 0)], violations=["user_counts: 3 events lost"])
    assert failed.status == "FAILED" and not failed.inconclusive
    assert _exit(failed, tmp_path / "c") == 1


def test_a_negative_control_that_passes_is_reported_as_a_weak_proof(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _result([_round(1, "crash_after_sink_commit", 40)], sink="naive")
    assert result.weak() is not None and "idempotent by itself" in str(result.weak())
    assert _exit(result, tmp_path) == 0
    assert "WEAK PROOF the negative control 'naive' passed too" in " ".join(capsys.readouterr().out.split())
    assert "idempotent by itself" in json.loads((tmp_path / "report.json").read_text())["weak_proof"]
    assert _result([_round(1, "kill_random", 5)], sink="sqlite").weak() is None
