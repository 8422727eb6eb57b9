"""The fault injector behind ``onceflow verify``: rounds of real faults over a growing log.

Protocol of one verify run:

1. Generate the whole input deterministically from the seed (producer retries and late
   events included when those input faults are selected) and cut it into per-round chunks.
2. For each round: append the chunk's first segment, start a feeder thread that appends
   the rest while the round runs, start ``onceflow run`` as a subprocess in its own
   process group, inject the round's fault, and make sure the process group is gone
   before the next round (a kill) or that it exited as the fault says it should.
3. After the last round, drain the log with ``onceflow run --once`` (exit 0 required).
4. Judge the sink with the oracle (:mod:`onceflow.verify.oracle`), which reads only the log
   and Spark's checkpoint.

With ``ingest`` the chunks of step 2 go through real senders and a real receiver instead
(:mod:`onceflow.verify.ingest_rig`): a round ends when its sender has every event acked, the
receiver is stopped before the final drain, and the log is checked against the input
(each event exactly once) besides the oracle's check of the sink.

Round kinds cycle through the selected faults in order, so every kind runs at least once
when ``rounds >= len(faults)``; timings within a round come from the seeded RNG.
"""

from __future__ import annotations

import functools
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.errors import ConfigError, PostgresError
from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, use_options
from onceflow.sinks.postgres import sql as pg
from onceflow.sources.log import EventLog
from onceflow.verify import inputs, pipeline_kafka, sample, spark_log
from onceflow.verify.driver import (
    Driver,
    ProcessGroup,
    Standby,
    fast_start_archive,
    wait_until,
)
from onceflow.verify.fault_kinds import (
    ALL_FAULTS,
    CLUSTER_FAULTS,
    CLUSTER_MASTER,
    CLUSTERS,
    INGEST_FAULTS,
    INPUT_FAULTS,
    ROUND_FAULTS,
    VERIFY_KILL,
    cluster_kind,
    default_faults,
    reaches,
)
from onceflow.verify.faulting import (
    FINAL,
    STANDBYS,
    RoundRecord,
    Spec,
    at_risk,
    drain,
    error_line,
    inject,
    spec,
)
from onceflow.verify.ingest_rig import DROP_ACKS, INGEST_ROUND_FAULTS, RECEIVER_CRASHES, IngestRig
from onceflow.verify.inputs import TOPIC, Feeder, KafkaInput, LogInput
from onceflow.verify.oracle import expect
from onceflow.verify.pipeline_kafka import KafkaRecordsInput
from onceflow.verify.resume import kill_stale, load_state, rng_state, save_state
from onceflow.verify.sample import SampleInput
from onceflow.verify.several_targets import SeveralTargets, families
from onceflow.verify.sinks import PG_LEDGER_SINKS, USER_SINK_ID, USER_SINKS
from onceflow.verify.standalone import StandaloneCluster
from onceflow.verify.targets import KINDS, SINK_ID, SinkTarget, Target
from onceflow.verify.verdict import Verdict

KEEP_MARKERS = ("sqlite", "sqlite-tasks", "postgres", "postgres-tasks", "delta", "delta-tasks", "lossy",
                "kafka", "kafka-tasks", "iceberg")
"""Sinks whose markers verify checks against Spark's commit log (the naive ones never read theirs)."""


@dataclass
class VerifyConfig:
    """What ``onceflow verify`` runs.

    Attributes:
        workdir: Where the log, checkpoint, database and process outputs go.
        rounds: Number of fault rounds.
        faults: Fault names (see :data:`ALL_FAULTS`).
        seed: Seed of the input and of the timings.
        sink: A ``onceflow run --sink`` choice: ``sqlite``, ``postgres``, ``postgres-staged``,
            ``postgres-2pc``, or the negative controls ``naive`` / ``lossy`` / ``postgres-naive``.
        pg_dsn: PostgreSQL server for postgres sinks (else ``$ONCEFLOW_PG_DSN``); the run
            writes into a new schema there.
        cluster: One of :data:`CLUSTERS` (True: ``local``): drivers on ``local-cluster[2,1,1024]``
            (``executor_kill``), on a standalone master with two workers (``worker_kill``), or
            Spark Connect clients of a server each (``connect``).
        ingest: Feed the log through senders and a receiver (needed by the ingest faults).
        source: ``log`` (the event log) or ``kafka`` (a topic on a Kafka broker verify starts).
        events_per_round: Distinct events generated per round.
        segment_size: Rows per segment.
        round_timeout_s: Longest a round may wait for its fault to happen.
        fast_start: Start drivers from a class-data archive with the quick JIT
            (:mod:`onceflow.runtime.jvmstart`): ~3x faster restarts, the same commits.
        pipeline: The user's pipeline, ``PATH.py:FUNCTION`` (:mod:`onceflow.api.pipelines`), instead
            of Example 5-1; judged by :mod:`onceflow.verify.pipeline_oracle`.
        input_dir: With ``pipeline``: the directory of sample files fed in rounds
            (:mod:`onceflow.verify.sample`).
        keep_sink: Keep the PostgreSQL schema the run wrote (else dropped after the verdict).
    """

    workdir: Path
    rounds: int = 10
    faults: list[str] = field(default_factory=default_faults)
    seed: int = 0
    sink: str = "sqlite"
    pg_dsn: str | None = None
    cluster: bool | str = ""
    ingest: bool = False
    source: str = "log"
    events_per_round: int = 4_000
    segment_size: int = 1_000
    round_timeout_s: float = 240.0
    fast_start: bool = True
    pipeline: str | None = None
    input_dir: Path | None = None
    keep_sink: bool = False

    def __post_init__(self) -> None:
        unknown = [f for f in self.faults if f not in ALL_FAULTS]
        if unknown:
            raise ConfigError(f"unknown faults {unknown}; choose from {', '.join(ALL_FAULTS)}")
        if not any(f in ROUND_FAULTS for f in self.faults):
            raise ConfigError(f"--faults needs at least one of {', '.join(ROUND_FAULTS)}")
        self.cluster = cluster_kind(self.cluster)
        if self.cluster not in CLUSTERS:
            raise ConfigError(f"cluster must be local, standalone or connect, got {self.cluster!r}")
        for fault, kinds in CLUSTER_FAULTS.items():
            if fault in self.faults and self.cluster not in kinds:
                raise ConfigError(f"the {fault} fault needs --cluster {' or '.join(kinds)}")
        if self.source not in ("log", "kafka"):
            raise ConfigError(f"source must be log or kafka, got {self.source!r}")
        if self.source == "kafka" and self.ingest:
            raise ConfigError("--ingest feeds the event log; it does not combine with --source kafka")
        ingest_faults = [f for f in self.faults if f in INGEST_FAULTS]
        if ingest_faults and not self.ingest:
            raise ConfigError(f"the faults {ingest_faults} need --ingest (senders -> receiver -> log)")
        unreachable = [f for f in self.faults if not reaches(self.sink, f)]
        if unreachable:
            raise ConfigError(f"--sink {self.sink} never reaches the faults {unreachable} "
                              "(crash_apply_pending needs --sink sqlite, crash_effects_* an http sink, "
                              "which has no inside_sink_txn point)")
        if self.pipeline is not None:
            self._check_pipeline()
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if self.sink not in KINDS and not (self.pipeline and "+" in self.sink):
            several = " (several sinks joined by '+' are for a --pipeline)" if "+" in self.sink else ""
            raise ConfigError(f"sink must be one of {', '.join(KINDS)}, got {self.sink!r}{several}")
        if any(one.startswith("postgres") or one in PG_LEDGER_SINKS for one in self.sink.split("+")):
            pg.resolve_dsn(self.pg_dsn)  # fails early, with what to set
        if self.sink == "postgres-2pc":
            try:  # else every driver fails at its first batch, and the run says little else
                with pg.connect(pg.resolve_dsn(self.pg_dsn)) as conn:
                    pg.require_prepared(conn)
            except PostgresError as exc:
                raise ConfigError(f"--sink postgres-2pc: {exc}") from None

    def _check_pipeline(self) -> None:
        """``--pipeline``: its own input, a sink with one marker per batch, no generated input faults."""
        from onceflow.api import pipelines

        pipelines.load(str(self.pipeline))  # a bad spec or module fails here, before any round
        if self.input_dir is None:
            raise ConfigError("--pipeline needs --input: the sample files verify feeds your pipeline (with "
                              "--source kafka: a JSON-lines file of records)")
        if self.ingest:
            raise ConfigError("--pipeline reads --input (files, or records verify produces to Kafka with "
                              "--source kafka): it does not combine with --ingest")
        if "+" in self.sink:
            SeveralTargets.check(self.sink)
        elif self.sink not in USER_SINKS:
            raise ConfigError(f"--pipeline runs with --sink {', '.join(USER_SINKS)}, or several joined "
                              "by '+'")
        generated = [f for f in self.faults if f in INPUT_FAULTS]
        if generated:
            raise ConfigError(f"the faults {generated} change verify's generated events; with --pipeline the "
                              "sample is the input (put resends and late records in it)")


@dataclass
class VerifyResult:
    """Everything ``onceflow verify`` found."""

    config: dict[str, Any]
    rounds: list[RoundRecord]
    verdict: Verdict
    input_rows: int
    wall_s: float
    final_exit_code: int
    batches: list[dict[str, Any]] = field(default_factory=list)
    started_epoch_ms: int = 0
    final_drain_s: tuple[float, float] = (0.0, 0.0)
    ingest: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """No violation (the ingest check's are in the verdict too) and a clean final drain."""
        return self.verdict.ok and self.final_exit_code == 0

    def counted(self) -> int:
        """Rounds that prove something (:attr:`onceflow.verify.faulting.RoundRecord.counted`)."""
        return sum(r.counted for r in self.rounds)

    @property
    def inconclusive(self) -> bool:
        """No violation, but fewer counted rounds than asked: the run proved less than it says."""
        return self.ok and self.counted() < int(self.config.get("rounds") or len(self.rounds))

    @property
    def proven(self) -> bool:
        """No violation, and every round asked for counted."""
        return self.ok and not self.inconclusive

    @property
    def status(self) -> str:
        """``OK``, ``INCONCLUSIVE`` or ``FAILED``."""
        return "FAILED" if not self.ok else "INCONCLUSIVE" if self.inconclusive else "OK"

    def weak(self) -> str | None:
        """Why an OK result proves little about onceflow (a negative control that passed), or None."""
        sink = str(self.config.get("sink") or "")
        if self.ok and any(one.endswith("naive") or one == "lossy" for one in sink.split("+")):
            return (f"the negative control {sink!r} passed too: this pipeline's tables come out right even "
                    "through a sink that writes a replayed batch again (or loses one) — it is idempotent by "
                    "itself for this sink (e.g. upserts of each aggregate's current value), so a passing run "
                    "of the real sink proves little about onceflow's exactly-once here; append or merge "
                    "tables make a stronger test")
        return None

    def uncounted(self) -> str:
        """What to change so that every round counts (for the INCONCLUSIVE line)."""
        missed = [r for r in self.rounds if not r.counted]
        shown = ", ".join(f"{r.round} ({r.fault})" for r in missed[:6]) + (" ..." if len(missed) > 6 else "")
        asked = self.config.get("rounds")
        return (f"{self.counted()} of {asked} rounds counted; rounds {shown or 'none'} hit "
                "no batch with input rows or committed no batch. Give each round more input (a larger "
                "sample, --events-per-round) or run more rounds (--rounds)")

    def tested_by_kind(self) -> dict[str, int]:
        """How many rounds of each fault put data at risk (see :attr:`RoundRecord.tested`)."""
        out = {kind: 0 for kind in self.faults_by_kind()}
        for r in self.rounds:
            out[r.fault] += int(r.tested)
        for f in self.config["faults"]:
            if f in INPUT_FAULTS:
                out[f] = 1
        return out

    def untested(self) -> list[str]:
        """Faults of the run that never put data at risk."""
        return sorted(k for k, n in self.tested_by_kind().items() if n == 0)

    def faults_by_kind(self) -> dict[str, int]:
        """How many rounds injected each fault (input faults count once per run)."""
        out: dict[str, int] = {}
        for r in self.rounds:
            out[r.fault] = out.get(r.fault, 0) + 1
        for f in self.config["faults"]:
            if f in INPUT_FAULTS:
                out[f] = 1
        return out


def _config(cfg: VerifyConfig) -> dict[str, Any]:
    conf = asdict(cfg)
    conf["workdir"] = str(cfg.workdir)
    conf["input_dir"] = str(cfg.input_dir) if cfg.input_dir else None
    conf["pg_dsn"] = None  # reports never hold connection strings
    return conf


def run_verify(cfg: VerifyConfig, say: Callable[[str], None] = print, resume: bool = False) -> VerifyResult:
    """Run the rounds, drain, and judge (see the module protocol).

    Args:
        cfg: What to run.
        say: Progress output (one line per round).
        resume: Continue the run whose state is in ``cfg.workdir`` (see
            :mod:`onceflow.verify.resume`).

    Returns:
        The rounds and the verdict.

    Raises:
        ConfigError: ``resume`` without a state, or with another configuration, or of a
            Kafka-fed run (the broker verify started ended with the interrupted run).
    """
    if resume and cfg.source == "kafka":
        raise ConfigError("--resume is not possible with --source kafka: the broker that held the "
                          "topic ended with the interrupted run; start a new run")
    src: Any
    if cfg.pipeline and cfg.source == "kafka":
        src = KafkaRecordsInput(cfg.pipeline, TOPIC)
    elif cfg.source == "kafka":
        src = KafkaInput(rows_per_file=cfg.segment_size)
    elif cfg.pipeline:
        src = SampleInput(cfg.workdir / "input", cfg.pipeline)
    else:
        src = LogInput(cfg.workdir / "log")
    cluster = None
    try:
        if cfg.pipeline and cfg.input_dir is not None and not resume:
            _dry_run(cfg, src)
        if cfg.cluster == "standalone":
            cluster = StandaloneCluster(cfg.workdir / "cluster").start()
            say(f"cluster: standalone master {cluster.master_url}, {len(cluster.workers)} workers")
        if cfg.source == "kafka":
            say(f"source: Kafka topic {TOPIC} on a Kafka broker at {src.broker.bootstrap}")
        return _run(cfg, say, resume, src, cluster)
    finally:
        src.close()
        if cluster is not None:
            cluster.stop()


def _dry_run(cfg: VerifyConfig, src: Any) -> None:
    """The oracle reruns the user's pipeline on the whole sample once, before any round.

    With ``--source kafka`` the sample's records are one batch of the topic's first partition
    (the broker of ``src`` is up; nothing is produced yet).

    Raises:
        ConfigError: The oracle cannot rerun it
            (:meth:`onceflow.verify.pipeline_oracle.PipelineOracle.dry_run`).
    """
    from onceflow.verify.pipeline_oracle import PipelineOracle, oracle_session

    assert cfg.input_dir is not None and cfg.pipeline is not None
    kafka, batch = None, None
    files: list[Path] = []
    if cfg.source == "kafka":
        kafka = (src.broker.bootstrap, TOPIC)
        batch = functools.partial(pipeline_kafka.batch_table, pipeline_kafka.dry_records(Path(cfg.input_dir)),
                                  TOPIC)
    else:
        files = sorted(p for p in Path(cfg.input_dir).rglob("*")
                       if p.is_file() and not p.name.startswith((".", "_")))
    with oracle_session() as spark:
        PipelineOracle(spark, str(cfg.pipeline), cfg.workdir / "dry-run", kafka,
                       families(cfg.sink)).dry_run(files, batch)


def _run(cfg: VerifyConfig, say: Callable[[str], None], resume: bool, src: Any,
         cluster: StandaloneCluster | None) -> VerifyResult:
    """:func:`run_verify` once its input (and cluster) are up."""
    run = _Run(cfg, say, resume, src, cluster)
    run.persist()  # resume step 1: a run cut off in its first round can resume too
    for i, chunk in enumerate(run.chunks):
        if i >= len(run.records):
            run.round(i, chunk)
    return run.finish()


class _Run:
    """The state of one verify run: rounds so far, the sink target, the drivers it starts.

    Everything :meth:`persist` writes is what :mod:`onceflow.verify.resume` reads back.
    """

    def __init__(self, cfg: VerifyConfig, say: Callable[[str], None], resume: bool,
                 src: Any, cluster: StandaloneCluster | None) -> None:
        self.cfg, self.say, self.src, self.cluster = cfg, say, src, cluster
        work = cfg.workdir
        self.log_dir, self.ck, self.outs = work / "log", work / "checkpoint", work / "out"
        self.outs.mkdir(parents=True, exist_ok=True)
        state = load_state(work, _config(cfg)) if resume else {}
        if resume:
            say(f"resuming after round {len(state['rounds'])} ({kill_stale(work)} stale process groups "
                "killed)")
        ProcessGroup.registry = work
        self.t0 = time.monotonic() - state.get("elapsed_s", 0.0)
        self.started_epoch_ms = state.get("started_epoch_ms", int(time.time() * 1000))
        self.rng = random.Random(cfg.seed)
        if state:
            self.rng.setstate(rng_state(state["rng"]))
        sink_id = USER_SINK_ID if cfg.pipeline else SINK_ID
        self.target: SinkTarget | SeveralTargets = SeveralTargets(cfg.sink, work, cfg.pg_dsn, sink_id) \
            if "+" in cfg.sink else SinkTarget(cfg.sink, work, cfg.pg_dsn, sink_id=sink_id)
        self.target.prepare(state.get("schema"))
        say(f"sink: {self.target.name}")
        if cfg.pipeline and cfg.input_dir is not None:
            cut = pipeline_kafka.pieces if cfg.source == "kafka" else sample.pieces
            self.chunks: list[list[Any]] = cut(cfg.input_dir, cfg.rounds)
            fed = src.in_place()
            say(f"pipeline: {cfg.pipeline} over {sum(len(c) for c in self.chunks)} pieces of {cfg.input_dir}")
        else:
            self.chunks = inputs.chunks(cfg.events_per_round * cfg.rounds, cfg.rounds, cfg.segment_size,
                                        cfg.seed, "producer_duplicates" in cfg.faults,
                                        "late_events" in cfg.faults)
            fed = len(EventLog(self.log_dir).segments())
        self.kinds = [f for f in cfg.faults if f in ROUND_FAULTS]
        self.master = CLUSTER_MASTER if cfg.cluster == "local" else cluster.master_url if cluster else None
        self.records = [RoundRecord(**r) for r in state.get("rounds", [])]
        self.input_rows = state.get("input_rows", 0)
        self.rig = None
        if cfg.ingest:
            self.rig = IngestRig(work, self.log_dir, DROP_ACKS if "dropped_acks" in cfg.faults else 0.0)
            self.rig.receiver_lives = state.get("receiver_lives", 0)
            self.rig.sender_lives = state.get("sender_lives", 0)
            for chunk in self.chunks[:len(self.records)]:
                self.rig.expect(chunk)
            self.rig.start_receiver()
            say(f"ingest: receiver on {self.rig.url}")
        # segments of a cut-off round that already reached the log (resume step 3)
        self.in_log = fed - sum(len(c) for c in self.chunks[:len(self.records)]) if self.rig is None else 0
        self.jvm: dict[str, str] = {}
        if cfg.fast_start:
            archive = fast_start_archive(work / "jvm-training", say)
            self.jvm[JAVA_OPTIONS_ENV] = use_options(archive)
        self.scheduled = sum(r.fault != VERIFY_KILL for r in self.records)
        # no standbys on a standalone cluster: a waiting driver is an application holding executors
        self.standby = Standby(self.driver, self.outs) \
            if cfg.fast_start and self.rig is None and cluster is None and cfg.cluster != "connect" else None

    def driver(self, tag: str, env: dict[str, str] | None = None, **kw: Any) -> Driver:
        """A fresh ``onceflow run`` driver for this run's sink, input and cluster."""
        remote = ["--remote", "local"] if self.cfg.cluster == "connect" else []
        return Driver(self.log_dir, self.ck, self.target.db, self.outs / f"{tag}.out", sink=self.cfg.sink,
                      master=self.master, env={**self.jvm, **self.target.env(), **(env or {})},
                      extra_args=[*self.target.extra_args(), *remote], **self.src.driver_kw(), **kw)

    def persist(self) -> None:
        """Write the run's state (resume step 1 and after every round)."""
        rig = self.rig
        save_state(self.cfg.workdir, {
            "config": _config(self.cfg), "rounds": [asdict(r) for r in self.records],
            "input_rows": self.input_rows, "elapsed_s": time.monotonic() - self.t0,
            "started_epoch_ms": self.started_epoch_ms, "rng": self.rng.getstate(),
            "schema": self.target.schema or None,
            "receiver_lives": rig.receiver_lives if rig else 0,
            "sender_lives": rig.sender_lives if rig else 0,
        })

    def launch(self, spec: Spec, upcoming: list[Spec]) -> Driver:
        """The driver of ``spec``: a released standby, or a fresh one; pre-starts ``upcoming``."""
        tag, kw = spec
        return self.standby.take(tag, upcoming, **kw) if self.standby is not None else self.driver(tag, **kw)

    def round(self, i: int, chunk: list[pa.Table]) -> None:
        """Round ``i + 1``: feed ``chunk`` while a driver runs, inject the round's fault, record it."""
        cfg, kinds, target = self.cfg, self.kinds, self.target
        todo, self.in_log = chunk[max(self.in_log, 0):], 0
        if self.rig is None and not todo:  # resume step 4: nothing left to feed
            fault = VERIFY_KILL
        else:
            fault, self.scheduled = kinds[self.scheduled % len(kinds)], self.scheduled + 1
        rec = RoundRecord(i + 1, fault, time.monotonic() - self.t0, markers_before=target.committed_batches())
        self.input_rows += sum(t.num_rows if hasattr(t, "num_rows") else len(t) for t in chunk)
        ahead = min(STANDBYS, len(self.chunks) - i - 1)
        upcoming = ([spec(kinds[(self.scheduled + k) % len(kinds)], i + 2 + k, cfg.seed)
                     for k in range(ahead)] + [FINAL])[:STANDBYS]
        start = functools.partial(self.launch, spec(fault, i + 1, cfg.seed), upcoming)
        if fault == VERIFY_KILL:
            drain(start(), rec, cfg.round_timeout_s,
                   "verify and this round's driver were SIGKILLed after its input was fed; "
                   "restarted, drained with --once")
        elif self.rig is None:
            if todo:
                self.src.append(todo[0])
            feeder = Feeder(self.src.append, todo[1:], pace_s=0.5)
            try:
                inject(fault, start, rec, target, self.rng, cfg.round_timeout_s, self.t0, self.cluster,
                        self.ck)
            finally:
                feeder.join()
        else:
            _ingest_round(fault, self.rig, chunk, start, rec, target, self.rng, cfg.round_timeout_s, self.t0,
                          self.ck)
        rec.segments_appended = len(chunk)
        rec.markers_after = target.committed_batches()
        rec.ended_s = time.monotonic() - self.t0
        self.records.append(rec)
        self.persist()
        self.say(f"round {rec.round}/{cfg.rounds} {fault}: {rec.outcome} "
                 f"(markers {rec.markers_before} -> {rec.markers_after})")

    def _judge_pipeline(self) -> Verdict:
        """The user's pipeline: its oracle over the checkpoint (a Spark session of verify's own)."""
        from onceflow.verify.pipeline_oracle import PipelineOracle, oracle_session
        from onceflow.verify.pipeline_verdict import judge, unmarked

        self.say("oracle: rebuilding every committed batch from the checkpoint and the input files")
        with oracle_session() as spark:
            kafka = (self.src.broker.bootstrap, TOPIC) if self.cfg.source == "kafka" else None
            target = self.target
            oracle = PipelineOracle(spark, str(self.cfg.pipeline), self.ck, kafka, families(self.cfg.sink))
            oracle.run()
            if isinstance(target, SeveralTargets):
                routes = oracle.routes()
                verdict = judge(target.name, oracle, target.reader(routes), target.json_tables(routes))
            else:
                verdict = judge(target.name, oracle, target.reader(), json_values=target.broker is not None)
        marked = {f"the {fam} sink": got for fam, got in target.marked().items()} \
            if isinstance(target, SeveralTargets) else {"the sink": target.batches()}
        committed = spark_log.committed(self.ck)
        for (where, markers), kind in zip(marked.items(), self.cfg.sink.split("+"), strict=True):
            missing = unmarked(committed, markers) if kind in KEEP_MARKERS else []  # naive: never read
            verdict.missing_markers += [b for b in missing if b not in verdict.missing_markers]
            if missing:
                verdict.violations.append(f"{len(missing)} batches Spark committed have no marker in "
                                          f"{where}: {missing[:10]}")
        return verdict

    def finish(self) -> VerifyResult:
        """Stop the ingest rig, drain with a final ``--once`` driver, judge the sink."""
        ingest = None
        if self.rig is not None:
            chk = self.rig.stop()
            ingest = asdict(chk)
            self.say(f"ingest: {chk.ids_sent} distinct events sent, {chk.rows_in_log} rows in the log, "
                     f"{chk.lost} lost, {chk.duplicated} duplicated ({chk.receiver_lives} receiver lives, "
                     f"{chk.sender_lives} sender lives)")
        drain_start = time.monotonic() - self.t0
        final = self.launch(FINAL, [])
        final_rc = final.wait(timeout=self.cfg.round_timeout_s * 2)
        drain = (drain_start, time.monotonic() - self.t0)
        self.say(f"final drain: exit code {final_rc}" + (f" ({error_line(final)})" if final_rc else ""))
        verdict = self._judge_pipeline() if self.cfg.pipeline else \
            self.target.judge(expect(self.ck, self.src.oracle_inputs(self.ck)))
        batches = self.target.batches()
        at_risk(self.records, batches)
        self.target.close()
        if not self.cfg.keep_sink:
            self.say(self.target.drop())
        verdict.violations += ingest["violations"] if ingest else []
        conf = _config(self.cfg)
        conf["sink_location"] = self.target.name
        return VerifyResult(conf, self.records, verdict, self.input_rows, time.monotonic() - self.t0,
                            final_rc, batches, self.started_epoch_ms, drain, ingest)


def _ingest_round(fault: str, rig: IngestRig, chunk: list[pa.Table], start: Callable[[], Driver],
                  rec: RoundRecord, target: Target, rng: random.Random, timeout: float,
                  t0: float, ck: Path | None = None) -> None:
    """One round of a run with ``ingest``: the input goes through a sender and the receiver."""
    point = RECEIVER_CRASHES.get(fault)
    if point:  # this receiver life dies by itself at its second group commit
        rig.kill_receiver()
        rig.start_receiver(crash_at=f"{point}@2")
    base = rig.events_new()
    rig.feed(rec.round, chunk)
    if fault not in INGEST_ROUND_FAULTS:
        inject(fault, start, rec, target, rng, timeout, t0, ck=ck)
        try:
            rig.wait_sender(timeout)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            rec.outcome += f"; the sender did not finish: {exc}"
        return
    d = start()
    try:
        if point:
            assert rig.receiver is not None
            try:
                rc = rig.receiver.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
                rig.kill_receiver()
            rec.fault_s = time.monotonic() - t0
            rig.start_receiver()
            rec.outcome = (f"receiver died at {point}, restarted" if rc == -9
                           else f"receiver did not die at {point} (exit code {rc}); restarted")
        else:
            wait_until(lambda: rig.events_new() > base, timeout, "events of this round in the log")
            time.sleep(rng.uniform(0.0, 0.5))
            rec.fault_s = time.monotonic() - t0
            if fault == "receiver_kill":
                rig.kill_receiver()
                rig.start_receiver()
                rec.outcome = "receiver SIGKILLed mid-stream, restarted"
            else:
                rig.kill_sender()
                rig.start_sender()
                rec.outcome = "sender SIGKILLed mid-stream, restarted from its outbox"
        rig.wait_sender(timeout)
        wait_until(lambda: target.committed_batches() > rec.markers_before, timeout,
                   "a committed batch in this round")
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        rec.outcome = f"{rec.outcome}; timed out: {exc}"
    finally:
        d.kill()
        rec.exit_code = d.proc.returncode
