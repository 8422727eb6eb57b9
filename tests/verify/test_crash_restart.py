"""Crash-restart with real SIGKILLs while the log grows; the final tables must be exact.

The driver runs as a subprocess in its own process group. It is killed (driver and JVM) at
random moments, and once exactly between the SQLite commit and Spark's commit-log write
(the ``after_sink_commit`` crash point: the batch is committed — staged — in SQLite, Spark has
no commit-log entry), and once right after Spark's commit log (``after_commit_log``). That the
same crash against the naive sink (no batch marker) double-counts, so the check can fail, is
``tests/verify/test_verify.py::test_negative_control_sink_is_caught[naive-...]``.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from onceflow.runtime import idstore
from onceflow.sinks.sqlite.db import read_batches
from onceflow.sources.log import EventLog
from onceflow.verify.driver import Driver, committed_batches, wait_until
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.recompute import diff_counts
from onceflow.verify.verdict import read_counts
from tests.helpers import distinct_counts, held_batches

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _feeder(log_dir: Path, cfg: GeneratorConfig, pace_s: float) -> threading.Thread:
    """Append the first segment now and the rest from a thread, one every ``pace_s``."""
    log = EventLog(log_dir)
    tables = list(generate_segments(cfg))
    log.append(tables.pop(0))

    def feed() -> None:
        for t in tables:
            log.append(t)
            time.sleep(pace_s)

    th = threading.Thread(target=feed, daemon=True)
    th.start()
    return th


@pytest.mark.slow
# ids (the default store since 2026-11-26) in make test; Spark's own store in make test-long
@pytest.mark.long  # make test's 30 minutes (2026-11-28): other crash tests use the id store
@pytest.mark.parametrize("store", ["ids", pytest.param("spark", marks=pytest.mark.long)])
def test_sigkill_three_times_and_at_the_commit_gap_gives_exact_tables(
        tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ids``: the drivers keep the dedup state in onceflow's id store (onceflow.runtime.idstore)."""
    monkeypatch.setenv(idstore.ENV, "1" if store == "ids" else "0")  # the drivers inherit it
    seed = int(time.time()) % 10_000
    rng = random.Random(seed)
    log, ck, db = tmp_path / "log", tmp_path / "ck", tmp_path / "db.sqlite"
    # on-time by construction: a retry lands at most 1,600 events (48 s of event time) after its
    # original, plus 5 s of disorder, inside the 1 minute of allowed lateness (with the default
    # 20 s of disorder a retry could be 68 s behind: late, as a rare seed showed)
    cfg = GeneratorConfig(events=80_000, users=50, minutes=40, duplicates=0.1, seed=seed,
                          segment_size=2_000, max_disorder_s=5)
    feeder = _feeder(log, cfg, pace_s=1.0)
    kills = 0
    for round_no in range(3):  # kill at a random moment after some progress
        before = committed_batches(db)
        d = Driver(log, ck, db, tmp_path / f"run{round_no}.out")
        wait_until(lambda b=before: committed_batches(db) > b, 180, f"a commit in round {round_no}")
        time.sleep(rng.uniform(0.0, 2.5))
        d.kill()
        kills += 1
    # exactly between the sink's commit and Spark's commit log
    target = committed_batches(db) + 1
    d = Driver(log, ck, db, tmp_path / "gap.out", crash_at=f"after_sink_commit@{target}")
    rc = d.wait(timeout=300)
    assert rc == -9, d.output()
    assert f"crash point after_sink_commit at batch {target}" in d.output()
    gap_batch = max(held_batches(db))  # in the sink (applied or staged), not in Spark's log
    assert gap_batch >= target and not (ck / "commits" / str(gap_batch)).exists()
    # Spark re-runs the batch the sink committed: the marker makes it a no-op; then a kill
    # right after Spark's commit log of the next batch
    target = gap_batch + 1
    d = Driver(log, ck, db, tmp_path / "after-log.out", crash_at=f"after_commit_log@{target}")
    assert d.wait(timeout=300) == -9, d.output()
    assert f"batch {gap_batch}: already committed earlier, skipped (replay)" in d.output()
    assert (ck / "commits" / str(target)).exists()
    assert target in held_batches(db)
    feeder.join(timeout=300)
    final = Driver(log, ck, db, tmp_path / "final.out", once=True)
    assert final.wait(timeout=300) == 0, final.output()
    assert ", 0 replayed," in final.output()  # Spark had committed the batch it died after
    users, glob = read_counts(db)
    exp_users, exp_glob = distinct_counts(log)
    diff = diff_counts(exp_users, users)  # type: ignore[arg-type]
    assert diff.exact, f"seed={seed} {diff}"
    assert glob == exp_glob
    assert sum(glob.values()) == 80_000
    batches = read_batches(db, "user_counts")
    assert [b["batch_id"] for b in batches] == list(range(len(batches)))  # no gap, no repeat
    assert sum(b["input_rows"] for b in batches) == 88_000
    assert sum(b["late_dropped"] for b in batches) == 0
    assert kills == 3
    ids_files = list((ck / "state").rglob("*.iddelta"))
    assert bool(ids_files) == (store == "ids"), "the state store the drivers ran with"
