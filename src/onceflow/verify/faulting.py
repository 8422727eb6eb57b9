"""One round's fault, injected into a running driver, and what it put at risk.

:func:`inject` runs the round's driver (:func:`spec` says which: a crash point armed, a batch
size, a log level) and injects the fault: it waits for a crash point's SIGKILL (crash points
fire on batches with input only, :mod:`onceflow.faults`), kills the driver at a random moment,
or kills a busy executor or worker. It records the batches the fault hit (the crash point's
line in the driver's output, or the batches Spark had planned and not committed when a
process was killed); :func:`at_risk` turns them into input rows from the final markers. A
round whose fault hit no input rows proves nothing: it is reported and not counted.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.verify import spark_log
from onceflow.verify.driver import Driver, busy_executor, wait_until
from onceflow.verify.fault_kinds import CLUSTER_FAULTS, CRASH_FAULTS, TASK_FAULTS, VERIFY_KILL
from onceflow.verify.standalone import StandaloneCluster
from onceflow.verify.targets import Target


@dataclass
class RoundRecord:
    """What happened in one round (for the report)."""

    round: int
    fault: str
    started_s: float
    ended_s: float = 0.0
    fault_s: float | None = None
    exit_code: int | None = None
    markers_before: int = 0
    markers_after: int = 0
    segments_appended: int = 0
    outcome: str = ""
    fault_batches: list[int] = field(default_factory=list)
    """The batches the fault hit: a crash point's batch, or those planned and not committed
    when a process was killed."""
    rows_at_risk: int | None = None
    """Input rows of :attr:`fault_batches` (their final markers); None: not a fault on batches
    (a restart with another trigger, an ingest fault). 0: the fault hit no data and proves
    nothing (it does not count as a tested fault)."""

    @property
    def tested(self) -> bool:
        """Whether the round's fault put data at risk (or is not a fault on batches)."""
        return self.rows_at_risk is None or self.rows_at_risk > 0

    @property
    def counted(self) -> bool:
        """Whether the round proves something.

        Its fault put input rows at risk, or — a fault not on batches (a restart with another
        trigger, a kill of verify itself) — batches were committed across it. A round whose fault
        hit before any batch with data, or that committed nothing, does not count.
        """
        if self.rows_at_risk is not None:
            return self.rows_at_risk > 0
        return self.markers_after > self.markers_before


def drain(d: Driver, rec: RoundRecord, timeout: float, done: str) -> None:
    """Wait for a ``--once`` driver; record ``done``, or how it failed (killed after ``timeout``)."""
    try:
        rec.exit_code = d.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        d.kill()
        rec.exit_code = d.proc.returncode
        rec.outcome = f"timed out after {timeout} s draining; killed"
        return
    rec.outcome = done if rec.exit_code == 0 else f"unexpected exit code {rec.exit_code}"


Spec = tuple[str, dict[str, Any]]
"""A round's driver: its tag (output file name) and :class:`Driver` keywords."""

FINAL: Spec = ("final", {"once": True, "max_files": 3})
"""The final drain's driver."""

STANDBYS = 2
"""Drivers pre-started ahead (``fast_start``): a standby needs ~2 rounds to be ready."""


def _crash_point(fault: str) -> str:
    """The crash point a crash fault (or ``ambiguous_commit``) arms."""
    return CRASH_FAULTS.get(fault, "ambiguous_commit")


def spec(fault: str, round_no: int, seed: int) -> Spec:
    """The driver a round with ``fault`` runs (known ahead, so a standby can be pre-started).

    The batch size of a ``trigger_change`` round comes from an RNG of its own (seed, round),
    so it is the same whether or not the round was resumed.
    """
    tag = f"round{round_no:04d}-{fault}"
    if fault == "crash_apply_pending":  # dies at the next flush: the next batch, or the end of --once
        return tag, {"crash_at": f"{_crash_point(fault)}@0", "once": True}
    if fault in CRASH_FAULTS or fault == "ambiguous_commit":
        return tag, {"crash_at": f"{_crash_point(fault)}@0"}
    if fault == "executor_kill_mid_write":  # the tasks' executors see the point (spark.executorEnv)
        return tag, {"crash_at": "task_mid_write@0", "env": {"ONCEFLOW_SPARK_LOG_LEVEL": "WARN"}}
    if fault == "trigger_change":
        return tag, {"once": True, "max_files": random.Random(seed * 1_000_003 + round_no).choice([1, 3, 5])}
    if fault == VERIFY_KILL:
        return tag, {"once": True}
    if fault in CLUSTER_FAULTS:  # WARN level shows Spark's "Lost task" / "Lost executor" lines
        return tag, {"env": {"ONCEFLOW_SPARK_LOG_LEVEL": "WARN"}}
    return tag, {}


_HIT = re.compile(r"crash point \S+ at batch (\d+)|injected fault: batch (\d+) committed")


def crash_batches(output: str) -> list[int]:
    """The batch a crash point fired at, from the driver's output."""
    return sorted({int(a or b) for a, b in _HIT.findall(output)})


def error_line(d: Driver) -> str:
    """The driver's last ``onceflow: error`` line (or its last line)."""
    lines = [ln for ln in d.output().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("onceflow: error")]
    return (errors or lines or ["no output"])[-1][:400]


def at_risk(records: list[RoundRecord], markers: list[dict[str, Any]]) -> None:
    """Each round's rows at risk: the input rows of the batches its fault hit (final markers)."""
    # input rows, else (a count the sink could not know: NULL, e.g. on Spark Connect) the rows the
    # batch counted after deduplication: either way rows that were in flight
    rows = {int(m["batch_id"]): int(m["input_rows"] if m.get("input_rows") is not None
                                    else m.get("events_counted") or 0) for m in markers}
    for r in records:
        if r.fault in CRASH_FAULTS or r.fault in ("ambiguous_commit", "kill_random", "sink_outage",
                                                   *CLUSTER_FAULTS):
            r.rows_at_risk = sum(rows.get(b, 0) for b in r.fault_batches)
            if not r.rows_at_risk:
                r.outcome += "; no input rows were in flight: the round does not count as a tested fault"


def inject(fault: str, start: Callable[[], Driver], rec: RoundRecord, target: Target,
            rng: random.Random, timeout: float, t0: float, cluster: StandaloneCluster | None = None,
            ck: Path | None = None) -> None:
    """Run one round's driver (``start()``, see :func:`spec`) and inject ``fault`` into it.

    Records the batches the fault hit in ``rec.fault_batches`` (from the crash point's line in
    the driver's output, or Spark's batches in flight when a process was killed: ``ck``).
    """
    before = rec.markers_before

    def in_flight() -> list[int]:
        return spark_log.in_flight(ck) if ck is not None else []

    def progressed() -> bool:
        return target.committed_batches() > before

    if fault == "executor_kill_mid_write":
        _kill_mid_write(start(), rec, target, timeout, t0)
        return
    if fault in CRASH_FAULTS or fault == "ambiguous_commit":
        point = _crash_point(fault)
        d = start()
        try:
            rec.exit_code = d.wait(timeout=timeout)
        except Exception:
            d.kill()
            rec.outcome = "fault not reached in time; killed"
            return
        rec.fault_s = time.monotonic() - t0
        rec.fault_batches = crash_batches(d.output())
        if fault in TASK_FAULTS:  # the tasks died, not the driver: the batch failed, the query stopped
            rec.outcome = (f"tasks died at {point}; the query failed" if rec.exit_code == 1
                           else f"unexpected exit code {rec.exit_code}")
            return
        expected = 1 if fault == "ambiguous_commit" else -9
        rec.outcome = (f"driver died at {point}" if rec.exit_code == expected
                       else f"unexpected exit code {rec.exit_code}")
        return
    if fault == "sink_outage":
        before_plans = max(spark_log.planned(ck), default=-1) if ck is not None else -1
        _outage(start(), rec, target, rng, timeout, t0, in_flight,
                lambda: ck is not None and max(spark_log.planned(ck), default=-1) > before_plans)
        return
    if fault == "trigger_change":
        drain(start(), rec, timeout,
               "restarted with another batch size, drained")
        return
    if fault == "kill_random":
        _kill_random(start(), rec, rng, timeout, t0, ck, in_flight)
        return
    d = start()
    try:
        wait_until(lambda: progressed() or d.proc.poll() is not None, timeout, "a committed batch")
        if not progressed() and d.proc.poll() is not None:
            rec.outcome = (f"the driver exited with {d.proc.returncode} before a batch committed: "
                           f"{error_line(d)}")
            return
        if fault == "executor_kill":
            pid = busy_executor(d.proc.pid, timeout=60)  # mid-batch: an executor running tasks
            if pid is None:
                rec.outcome = "no busy executor found"
            else:
                os.kill(pid, 9)
                rec.fault_s = time.monotonic() - t0
                rec.fault_batches = in_flight()
                after = target.committed_batches()
                wait_until(lambda: target.committed_batches() > after, timeout, "a batch after the kill")
                lost = d.output().count("Lost task")
                rec.outcome = (f"executor SIGKILLed while busy ({lost} task attempts lost and "
                               "retried by Spark), query went on")
        elif fault == "worker_kill" and cluster is not None:
            _kill_worker(cluster, d, rec, target, timeout, t0, in_flight)
    except AssertionError as exc:
        rec.outcome = f"timed out: {exc}"
    finally:
        d.kill()
        rec.exit_code = d.proc.returncode


def _kill_mid_write(d: Driver, rec: RoundRecord, target: Target, timeout: float, t0: float) -> None:
    """``executor_kill_mid_write``: a task kills its executor mid-write; Spark must retry it, go on."""
    try:
        wait_until(lambda: "crash point task_mid_write" in d.output() or d.proc.poll() is not None, timeout,
                   "a task's executor killed mid-write")
        if d.proc.poll() is not None:
            rec.outcome = f"the driver exited with {d.proc.returncode} before the kill: {error_line(d)}"
            return
        rec.fault_s = time.monotonic() - t0
        rec.fault_batches = crash_batches(d.output())
        after = target.committed_batches()
        wait_until(lambda: target.committed_batches() > after or d.proc.poll() is not None, timeout,
                   "a batch after the executor kill")
        if d.proc.poll() is not None:
            rec.outcome = f"the driver exited with {d.proc.returncode} after the kill: {error_line(d)}"
            return
        out = d.output()
        rec.outcome = (f"executor SIGKILLed mid-write by its task at batch {rec.fault_batches}; Spark: "
                       f"{out.count('Lost executor')} executor lost, {out.count('Lost task')} task attempts "
                       "lost and retried; the query went on")
    except AssertionError as exc:
        rec.outcome = f"timed out: {exc}"
    finally:
        d.kill()
        rec.exit_code = d.proc.returncode


def _kill_random(d: Driver, rec: RoundRecord, rng: random.Random, timeout: float, t0: float,
                 ck: Path | None, in_flight: Callable[[], list[int]]) -> None:
    """``kill_random``: SIGKILL the driver and its JVM at a random moment of a batch that reads input.

    The moment is drawn (0-300 ms) after this driver planned a new batch whose source offsets
    moved (:func:`onceflow.verify.spark_log.reads_input`): a kill while no batch with data runs
    proves nothing (a batch left planned by the previous round is not waited for: it may be
    planned before this driver even started). Without a checkpoint to watch: 0-2 s after start.
    """
    try:
        if ck is None:
            time.sleep(rng.uniform(0.0, 2.0))
        else:
            before = set(spark_log.planned(ck))
            wait_until(lambda: d.proc.poll() is not None or any(
                b not in before and spark_log.reads_input(ck, b) for b in spark_log.in_flight(ck)),
                timeout, "a batch that reads input", poll_s=0.01)
            if d.proc.poll() is not None:
                rec.outcome = (f"the driver exited with {d.proc.returncode} before a batch with input: "
                               f"{error_line(d)}")
                return
            time.sleep(rng.uniform(0.0, 0.3))
        rec.fault_s = time.monotonic() - t0
        d.kill()
        rec.fault_batches = in_flight()
        rec.outcome = "driver and JVM SIGKILLed at a random moment of a batch reading input"
    except AssertionError as exc:
        rec.outcome = f"timed out: {exc}"
    finally:
        d.kill()
        rec.exit_code = d.proc.returncode


def _outage(d: Driver, rec: RoundRecord, target: Target, rng: random.Random, timeout: float, t0: float,
            in_flight: Callable[[], list[int]], planned_new: Callable[[], bool]) -> None:
    """``sink_outage``: the sink goes away as the round's first batch is planned; it must retry, go on.

    The round's input is fed as the driver starts; the outage starts the moment Spark planned
    a new batch (``planned_new``: an ``offsets/N`` after those of the round's start; its sink
    write is still ahead), so that batch meets it. The batches in flight during the outage are
    the fault's batches.
    """
    seen: set[int] = set()
    try:
        wait_until(lambda: planned_new() or d.proc.poll() is not None, timeout, "the round's first batch",
                   poll_s=0.03)  # the outage must be in place before the batch's sink write
        rec.fault_s = time.monotonic() - t0
        how = target.outage(target.outage_seconds(rng), lambda: seen.update(in_flight()))
        rec.fault_batches = sorted(seen)
        wait_until(lambda: target.committed_batches() > rec.markers_before or d.proc.poll() is not None,
                   timeout, "a batch committed after the outage")
        if d.proc.poll() is not None:
            rec.outcome = f"{how}; the driver exited with {d.proc.returncode} instead of retrying"
        else:
            out = d.output()
            n = out.count("; retry ") + out.count("a concurrent Delta commit won") + \
                out.count("a concurrent commit won")  # Iceberg's
            rec.outcome = f"{how}; {n} {'retry' if n == 1 else 'retries'} logged, the query went on"
    except AssertionError as exc:
        rec.outcome = f"timed out: {exc}"
    finally:
        d.kill()
        rec.exit_code = d.proc.returncode


def _kill_worker(cluster: StandaloneCluster, d: Driver, rec: RoundRecord, target: Target,
                 timeout: float, t0: float, in_flight: Callable[[], list[int]]) -> None:
    """``worker_kill``: SIGKILL a busy worker with its executor; restart it once the query went on."""
    i = cluster.busy_worker(timeout_s=60)
    if i is None:
        rec.outcome = "no busy worker found"
        return
    cluster.kill_worker(i)
    running = cluster.tasks_cut_off(i)
    rec.fault_s = time.monotonic() - t0
    rec.fault_batches = in_flight()
    after = target.committed_batches()
    wait_until(lambda: target.committed_batches() > after, timeout, "a batch after the worker kill")
    cluster.start_worker(i)
    rec.outcome = (f"worker {i} and its executor SIGKILLed while busy ({len(running)} tasks cut off "
                   f"mid-run: {', '.join(running[:4]) or 'none'}; Spark: "
                   f"{d.output().count('Lost executor')} executor lost), query went on; worker restarted")
