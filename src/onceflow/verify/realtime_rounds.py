"""``onceflow verify --sink realtime``: a user's Real-Time Mode pipeline under real faults.

A pipeline that writes with :func:`onceflow.write_realtime` has no micro-batches, no batch
markers and no ``--once``: its records are upserted one by one while Spark logs the offsets it
read every real-time batch. So its rounds are their own (:class:`RealtimeRun`):

1. Start a Kafka broker with a topic of :data:`PARTITIONS` partitions, cut ``--input``'s records
   into rounds (:func:`onceflow.verify.pipeline_kafka.pieces`), create a new PostgreSQL schema.
2. Each round: start the pipeline (``onceflow run --pipeline ... --sink realtime``: the user's
   function gets the schema's connection string as ``sink``) as a process group of its own,
   wait until its query runs, produce the round's first piece and wait until rows of it reach
   the table; then produce the rest 0.5 s apart from a thread while the round's fault hits:

   * ``kill_random``: SIGKILL of the group 0-1.5 s later; right after, the table's rows and the
     offsets of Spark's last committed real-time batch are kept (the rows at risk, step 4);
   * ``sink_outage``: the driver's database connections are terminated for 4-8 s (the writer
     retries, reconnecting); the rows written since it began are the round's rows at risk (none:
     the round proves nothing).

   The round's driver is then killed: no process outlives its round.
3. Drain: a last driver runs until Spark has committed a real-time batch at the topic's end
   (read by verify's own consumer; or the timeout passes), then it is killed.
4. Judge (:mod:`onceflow.verify.realtime_oracle`): every table against the user's transform run
   over the whole topic, key by key (and a ``rejects=`` table against the rows PostgreSQL
   refuses in a trial); each kill's rows at risk — rows written from records
   Spark had not logged, which the restart wrote again. A round with none proves nothing and is
   reported so.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.verify import pipeline_kafka, spark_log
from onceflow.verify.driver import Driver, ProcessGroup, wait_until
from onceflow.verify.faulting import RoundRecord
from onceflow.verify.inputs import TOPIC, Feeder
from onceflow.verify.kafka_rig import offset_ranges
from onceflow.verify.pipeline_kafka import KafkaRecordsInput
from onceflow.verify.pipeline_oracle import oracle_session
from onceflow.verify.pipeline_verdict import postgres_reader
from onceflow.verify.realtime_oracle import RealtimeOracle, expected, judge, refused_by_postgres, rows_beyond
from onceflow.verify.sinks import REALTIME, REALTIME_STARTED
from onceflow.verify.targets import SinkTarget
from onceflow.verify.verdict import Verdict

if TYPE_CHECKING:
    from onceflow.verify.chaos import VerifyResult

FAULTS = ("kill_random", "sink_outage")
"""The faults a Real-Time Mode pipeline meets here (it has no crash points of onceflow's)."""
PARTITIONS = 2
"""The topic's partitions: Real-Time Mode needs a task slot for each (``local[2]`` drivers)."""
SINK = REALTIME


def check(pipeline: str | None, source: str, faults: list[str], cluster: str | bool) -> list[str]:
    """The faults of a ``--sink realtime`` run; refuses what it cannot run.

    Raises:
        ConfigError: No ``--pipeline``, not ``--source kafka``, a cluster, or a fault it has no
            use for.
    """
    if pipeline is None or source != "kafka":
        raise ConfigError("--sink realtime verifies your Real-Time Mode pipeline: give --pipeline "
                          "PATH.py:FUNCTION (it calls onceflow.write_realtime) and --source kafka "
                          "--input RECORDS")
    if cluster:
        raise ConfigError("--sink realtime runs its drivers on local[2]; it does not combine with --cluster")
    other = [f for f in faults if f not in FAULTS]
    if other:
        raise ConfigError(f"--sink realtime injects {', '.join(FAULTS)} (its writer has no crash points "
                          f"of onceflow's, and no batches to crash in); drop {other}")
    return list(faults)


class RealtimeRun:
    """Steps 1-4 of the module for one ``onceflow verify --sink realtime`` run.

    Args:
        workdir: Checkpoint, driver outputs.
        pipeline: ``PATH.py:FUNCTION``.
        records: ``--input``: the JSON-lines records produced in rounds.
        rounds: Rounds.
        faults: Cycled over the rounds, in order.
        seed: Seed of the timings.
        pg_dsn: The PostgreSQL server (else ``$ONCEFLOW_PG_DSN``).
        round_timeout_s: Longest wait for one round's rows.
        say: Progress output.
    """

    def __init__(self, workdir: Path, pipeline: str, records: Path, rounds: int, faults: list[str],
                 seed: int, pg_dsn: str | None, round_timeout_s: float,
                 say: Callable[[str], None] = print, keep_sink: bool = False) -> None:
        self.workdir, self.pipeline, self.faults, self.say = workdir, pipeline, faults, say
        self.keep_sink = keep_sink
        self.timeout = round_timeout_s
        self.rng = random.Random(seed)
        self.chunks = pipeline_kafka.pieces(records, rounds)
        self.ck, self.outs = workdir / "checkpoint", workdir / "out"
        self.outs.mkdir(parents=True, exist_ok=True)
        ProcessGroup.registry = workdir
        self.target = SinkTarget("postgres", workdir, pg_dsn)
        self.src = KafkaRecordsInput(pipeline, TOPIC, PARTITIONS)
        self.records: list[RoundRecord] = []
        self.kills: list[tuple[RoundRecord, dict[int, int], int]] = []
        self.tables: list[str] = []
        self.t0 = time.monotonic()
        self.input_rows = 0

    @property
    def name(self) -> str:
        """The sink as reports name it (no password)."""
        return f"{SINK}:{self.target.name.split(':', 1)[1]}"

    def driver(self, tag: str) -> Driver:
        """A fresh ``onceflow run --sink realtime`` driver of the pipeline."""
        return Driver(self.workdir / "unused-log", self.ck, None, self.outs / f"{tag}.out", sink=SINK,
                      master=f"local[{PARTITIONS}]", env=self.target.env(), **self.src.driver_kw())

    def rows(self) -> int:
        """Rows in the tables the pipeline writes (every table of the schema before the first read)."""
        import psycopg

        with psycopg.connect(self.target.dsn, autocommit=True) as conn:
            names = self.tables or [r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
            total = 0
            for name in names:
                row = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()  # noqa: S608 - a table name we listed
                total += int(row[0]) if row else 0
            return total

    def logged(self) -> dict[int, int]:
        """Per partition, the next offset after Spark's last committed real-time batch."""
        done = spark_log.committed(self.ck)
        if not done:
            return dict.fromkeys(range(PARTITIONS), 0)
        end = spark_log.read_offsets(self.ck, done[-1]).offsets[0]
        return {p: hi for p, (_lo, hi) in offset_ranges(TOPIC, None, end).items()}

    def run(self) -> tuple[list[RoundRecord], Verdict, int, tuple[float, float]]:
        """Steps 1-4; the rounds, the verdict, the drain's exit code (0) and its span."""
        self.target.prepare()
        self.say(f"sink: {self.name}; source: Kafka topic {TOPIC} ({PARTITIONS} partitions) at "
                 f"{self.src.broker.bootstrap}")
        try:
            for i, chunk in enumerate(self.chunks):
                self.round(i, chunk)
            span_start = time.monotonic() - self.t0
            verdict, rc = self.finish()
            return self.records, verdict, rc, (span_start, time.monotonic() - self.t0)
        finally:
            self.src.close()

    def round(self, i: int, chunk: list[list[dict[str, Any]]]) -> None:
        """Step 2 for round ``i + 1``."""
        fault = self.faults[i % len(self.faults)]
        rec = RoundRecord(i + 1, fault, time.monotonic() - self.t0)
        self.input_rows += sum(len(piece) for piece in chunk)
        before = self.rows()
        d = self.driver(f"round-{i + 1}")
        try:
            wait_until(lambda: REALTIME_STARTED in d.output() or not d.group_alive(), self.timeout,
                       "the pipeline's query to start")
            if not d.group_alive():
                raise AssertionError(f"the driver exited: {d.output()[-600:]}")
            if chunk:
                self.src.append(chunk[0])
            wait_until(lambda: self.rows() > before or not d.group_alive(), self.timeout,
                       "rows of this round in the table")
            if not d.group_alive():
                raise AssertionError(f"the driver exited: {d.output()[-600:]}")
            rec.fault_batches = [len(spark_log.committed(self.ck))]
            at_fault = settled(self.rows, quiet_s=0.5)  # the first piece written
            feeder = Feeder(self.src.append, chunk[1:], pace_s=0.5)  # the rest arrives during the fault
            try:
                rec.fault_s = time.monotonic() - self.t0
                if fault == "kill_random":
                    time.sleep(self.rng.uniform(0.0, 1.5))
                    rec.fault_s = time.monotonic() - self.t0
                    d.kill()
                    self.kills.append((rec, self.logged(), self.rows()))
                    rec.outcome = "driver SIGKILLed while records arrived"
                else:
                    rec.outcome = self.target.outage(self.rng.uniform(4.0, 8.0), lambda: None)
                    feeder.join()
                    wait_until(lambda: self.rows() > at_fault or not d.group_alive(), self.timeout,
                               "rows written after the outage began")
                    rec.rows_at_risk = settled(self.rows) - at_fault
                    if not d.group_alive():
                        rec.outcome += f"; the driver died: {d.output()[-300:]}"
            finally:
                feeder.join()
        except AssertionError as exc:
            rec.outcome = f"{rec.outcome}; {exc}".lstrip("; ")
        finally:
            d.kill()
            rec.exit_code = d.proc.returncode
        rec.ended_s = time.monotonic() - self.t0
        self.records.append(rec)
        self.say(f"round {rec.round}/{len(self.chunks)} {fault}: {rec.outcome}")

    def finish(self) -> tuple[Verdict, int]:
        """Steps 3-4: drain, then judge against the oracle."""
        oracle = RealtimeOracle(self.pipeline, self.src.broker.bootstrap, TOPIC)
        oracle.read()  # verify's own consumer: every record produced (all acknowledged)
        rc = self.drain(oracle.ends())
        with oracle_session() as spark:
            want = expected(oracle.written(spark))
            self.tables = sorted(want)
            verdict = judge(self.name, want, postgres_reader(self.target.dsn),
                            functools.partial(refused_by_postgres, self.target.dsn))
            for rec, logged, rows in self.kills:
                rec.rows_at_risk = rows_beyond(oracle, spark, logged, rows)
        if not self.keep_sink:
            self.say(self.target.drop())
        return verdict, rc

    def drain(self, ends: dict[int, int]) -> int:
        """Step 3: a driver until Spark committed a real-time batch past ``ends``; 0, or 1 if not.

        A committed real-time batch's rows are all written: the writer upserts each row before
        its task moves on, and Spark commits the batch when its tasks ended.
        """
        d = self.driver("final")
        done = False

        def drained() -> bool:
            logged = self.logged()
            return all(logged.get(p, 0) >= end for p, end in ends.items())

        try:
            wait_until(lambda: drained() or not d.group_alive(), self.timeout * 2, "the drain")
            done = drained()
        except AssertionError as exc:
            self.say(f"final drain: {exc}")
        finally:
            d.kill()
        self.say("final drain: " + ("every record read and logged" if done else
                                    f"incomplete (the driver's last words: {d.output()[-400:]!r})"))
        return 0 if done else 1


def run_realtime(workdir: Path, pipeline: str, records: Path, rounds: int, faults: list[str], seed: int,
                 pg_dsn: str | None, round_timeout_s: float = 120.0,
                 say: Callable[[str], None] = print, keep_sink: bool = False) -> VerifyResult:
    """One ``onceflow verify --sink realtime`` run (the module's steps), as a verify result.

    Args:
        workdir: Where the checkpoint and the drivers' outputs go.
        pipeline: ``PATH.py:FUNCTION``; it calls :func:`onceflow.write_realtime` with ``dsn=sink``.
        records: The JSON-lines records (a file or a directory of files).
        rounds: Rounds.
        faults: Of :data:`FAULTS` (``["all"]``: all of them), cycled over the rounds.
        seed: Seed of the timings.
        pg_dsn: The PostgreSQL server (else ``$ONCEFLOW_PG_DSN``); a new schema there.
        round_timeout_s: Longest wait for one round's rows (twice that for the drain).
        say: Progress output.
        keep_sink: Keep the run's PostgreSQL schema (else dropped after the verdict).

    Raises:
        ConfigError: A fault it cannot inject, a pipeline that does not load, no PostgreSQL
            connection string.
    """
    from onceflow.api import pipelines
    from onceflow.sinks.postgres import sql as pg
    from onceflow.verify.chaos import VerifyResult

    faults = check(pipeline, "kafka", list(FAULTS) if faults == ["all"] else faults, "")
    pipelines.load(pipeline)  # a bad module or function fails here, before any broker or round
    pg.resolve_dsn(pg_dsn)
    started = int(time.time() * 1000)
    run = RealtimeRun(workdir, pipeline, records, rounds, faults, seed, pg_dsn, round_timeout_s, say,
                      keep_sink)
    recs, verdict, rc, span = run.run()
    config = {"workdir": str(workdir), "rounds": rounds, "faults": faults, "seed": seed, "sink": SINK,
              "source": "kafka", "pipeline": pipeline, "input_dir": str(records), "pg_dsn": None,
              "sink_location": run.name}
    return VerifyResult(config, recs, verdict, run.input_rows, time.monotonic() - run.t0, rc, [], started,
                        span)


def settled(count: Callable[[], int], quiet_s: float = 1.5, timeout_s: float = 30.0) -> int:
    """``count()`` once it stayed the same for ``quiet_s`` (or ``timeout_s`` passed)."""
    last, since, deadline = count(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.25)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return last
