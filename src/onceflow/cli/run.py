"""``onceflow run``: Example 5-1 (or billing) from an event log into SQLite or PostgreSQL, exactly once."""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from onceflow.cli.options import Duration, SinkKind, secret_dsn
from onceflow.errors import BadSegmentError, ConfigError, OnceflowError, from_spark
from onceflow.examples.user_counts import KafkaTopic
from onceflow.runtime import idstore
from onceflow.sources.log import EventLog
from onceflow.verify.sinks import (
    REALTIME,
    REALTIME_STARTED,
    SINKS,
    USER_SINK_ID,
    USER_SINKS,
    SinkOptions,
    make_sink,
    make_sinks,
)


@dataclass(frozen=True)
class PipelineConfig:
    """How to run a pipeline over the event log.

    Attributes:
        log_dir: The event log directory, or a Kafka topic (Example 5-1 only).
        checkpoint: Spark checkpoint directory (one per query, reused on restart).
        allowed_lateness_s: Watermark delay: events more than this behind the
            maximum event time seen are late and dropped (and counted).
        max_files_per_trigger: Segments per micro-batch; all available when None.
        trigger_interval: Processing-time trigger for continuous runs.
    """

    log_dir: Path | KafkaTopic
    checkpoint: Path
    allowed_lateness_s: float = 60.0
    max_files_per_trigger: int | None = None
    trigger_interval: str = "1 second"

    def __post_init__(self) -> None:
        if self.allowed_lateness_s <= 0:
            raise ConfigError(
                "allowed lateness must be > 0: it bounds the dedup state (a zero or "
                f"missing delay would keep every event id forever), got {self.allowed_lateness_s}"
            )
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ConfigError(f"max_files_per_trigger must be >= 1, got {self.max_files_per_trigger}")


def explain_failure(exc: BaseException, log: EventLog) -> BaseException:
    """Turn a Spark failure caused by a log file into a BadSegmentError naming it."""
    text = str(exc)
    for seg in log.segments():
        if seg.path.name in text:
            return BadSegmentError(str(seg.path), f"Spark could not read it: {text[:300]}")
    return exc


def print_batch(info: dict[str, Any]) -> None:
    """Print one line per batch; only a committed batch says "committed"."""
    if not info["committed"]:
        click.echo(f"batch {info['batch_id']}: already committed earlier, skipped (replay)")
        return
    rate = (info["input_rows"] or 0) / info["seconds"] if info["seconds"] > 0 else 0.0
    written = ", ".join(f"{n} {r}" for n, r in info["rows_written"].items())

    def known(key: str) -> str:
        return "?" if info[key] is None else str(info[key])

    click.echo(
        f"batch {info['batch_id']} committed: {known('input_rows')} rows, "
        f"{known('duplicates_dropped')} duplicates, {known('late_dropped')} late, "
        f"rows written: {written or 'none'} ({rate:,.0f} rows/s)"
    )


@dataclass
class Totals:
    """What one ``onceflow run`` of an example pipeline did (this process only)."""

    batches_committed: int = 0
    batches_replayed: int = 0
    input_rows: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    events_counted: int = 0
    seconds: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list)
    """Spark's recent progress reports of the query."""

    def add(self, info: dict[str, Any]) -> None:
        """Count one batch (an ``on_batch`` callback) and print its line."""
        print_batch(info)
        if not info["committed"]:
            self.batches_replayed += 1
            return
        self.batches_committed += 1
        self.input_rows += info["input_rows"] or 0  # None: not known for this batch
        self.late_dropped += info["late_dropped"] or 0
        self.duplicates_dropped += info["duplicates_dropped"] or 0
        self.events_counted += info["rows_out"]

    @property
    def events_per_second(self) -> float:
        """Input rows per wall-clock second."""
        return self.input_rows / self.seconds if self.seconds > 0 else 0.0


PIPELINES = {"user_counts": "onceflow.examples.user_counts", "billing": "onceflow.examples.billing"}
"""``--pipeline`` choice -> the example module that runs it (its ``start``)."""
DEFAULT_SINK = {"user_counts": "sqlite", "billing": "postgres-staged"}


def run_pipeline(spark: Any, cfg: PipelineConfig, sink: Any, once: bool,
                 pipeline: str = "user_counts") -> Totals:
    """Run an example pipeline (:data:`PIPELINES`) until drained (``once``) or stopped.

    Raises:
        BadSegmentError: A segment of the log is unreadable or has the wrong schema.
        OnceflowError: What failed inside a batch.
    """
    module = importlib.import_module(PIPELINES[pipeline])
    totals = Totals()
    started = time.perf_counter()
    query = module.start(spark, cfg.log_dir, sink, cfg.checkpoint, within=cfg.allowed_lateness_s,
                         max_files_per_trigger=cfg.max_files_per_trigger, once=once,
                         trigger=cfg.trigger_interval, on_batch=totals.add)
    try:
        query.awaitTermination()
    except OnceflowError:
        raise
    except Exception as exc:
        if isinstance(cfg.log_dir, KafkaTopic):
            raise from_spark(exc) from exc
        raise explain_failure(exc, EventLog(cfg.log_dir)) from exc
    totals.seconds = time.perf_counter() - started
    totals.progress = [dict(p) for p in query.query.recentProgress]
    return totals


@click.command()
@click.option("--log", "log_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Event log directory (segment files).")
@click.option("--kafka", "kafka", default=None, metavar="HOST:PORT",
              help="Read Example 5-1's events from Kafka brokers instead of --log (with --topic; "
                   "value JSON {user, event_time_us}, header event_id).")
@click.option("--topic", default=None, help="The Kafka topic of --kafka.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=None,
              help="Kafka offsets per micro-batch (default: all available).")
@click.option("--kafka-connector", type=click.Choice(["auto", "spark", "onceflow"]), default="auto",
              show_default=True,
              help="Who reads Kafka: Spark's own connector (its jars: 'onceflow jars fetch "
                   "kafka-connector'), onceflow's Python source, or auto: Spark's when its jars were "
                   "fetched. Applies to --kafka and to a --pipeline's onceflow.read_kafka.")
@click.option("--checkpoint", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Spark checkpoint directory; reuse it to resume exactly.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite database for user_counts and global_counts (SQLite sinks).")
@click.option("--delta", "delta_root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Root directory of the Delta tables (--sink delta; one table per directory).")
@click.option("--iceberg", "iceberg_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of --sink iceberg's tables: a pyiceberg SQL catalog DIR/catalog.db (SQLite), "
                   "the files under DIR/warehouse (another catalog: onceflow.iceberg in your code).")
@click.option("--pg-dsn", envvar="ONCEFLOW_PG_DSN", default=None, show_envvar=True, callback=secret_dsn,
              help="PostgreSQL connection string (postgres* sinks); prefer the environment "
                   "variable, which keeps a password out of the process list.")
@click.option("--effects-url", envvar="ONCEFLOW_EFFECTS_URL", default=None, show_envvar=True,
              help="Where --sink http POSTs each output row (one effect per row; --db is its ledger).")
@click.option("--out-kafka", "out_kafka", default=None, metavar="HOST:PORT",
              help="The brokers --sink kafka produces to (each table a topic, each batch one Kafka "
                   "transaction).")
@click.option("--effects-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds one call of --sink http may take.")
@click.option("--once", is_flag=True, help="Process everything available now, then exit 0.")
@click.option("--allowed-lateness", default="1m", show_default=True, type=Duration(),
              help="Watermark delay; later events are dropped and counted.")
@click.option("--max-files-per-trigger", type=click.IntRange(min=1), default=None,
              help="Segments per micro-batch (default: all available).")
@click.option("--trigger", "trigger_interval", default="1 second", show_default=True,
              help="Processing-time trigger of a continuous run (without --once).")
@click.option("--master", default=None, help="Spark master URL (default local[<cores>]).")
@click.option("--retain-batches", type=click.IntRange(min=1), default=None,
              help="Batches of checkpoint history Spark keeps (spark.sql.streaming.minBatchesToRetain, "
                   "default 100). 'onceflow verify' audits from the first batch, so it retains all.")
@click.option("--sink", "sink_kind", type=SinkKind([*SINKS, REALTIME]), default=None,
              help="Where results go: sqlite (default of user_counts; sqlite-tasks: every batch converted "
                   "by Spark's tasks, as a large batch is); postgres (driver-side "
                   "transaction; postgres-tasks: every batch staged by Spark's tasks); "
                   "postgres-staged (default of billing) / postgres-2pc (written by "
                   "the executors); http (each row one call to --effects-url, ledger in --db; "
                   "http-tasks: every batch called by Spark's tasks; http-tasks-pg: the same, the ledger "
                   "in PostgreSQL at --pg-dsn, no file shared with the executors); "
                   "delta (Delta tables under --delta, the marker a Delta app transaction; delta-tasks: "
                   "every batch's files written by Spark's tasks); "
                   "kafka (topics on --out-kafka, each batch one Kafka transaction; kafka-tasks: every "
                   "batch produced by Spark's tasks, a transaction each); iceberg (Iceberg tables in the "
                   "SQLite catalog under --iceberg, the marker in each table's properties). "
                   "Negative controls, never "
                   "for real data: 'naive', 'postgres-naive' and 'http-naive' have no batch marker, "
                   "'delta-naive' and 'iceberg-naive' never check it, 'kafka-naive' produces without a "
                   "transaction "
                   "(duplicates), 'lossy' commits the marker before the rows (loss). "
                   "realtime: a --pipeline PATH.py:FUNCTION that writes with onceflow.write_realtime "
                   "(Spark's Real-Time Mode; its sink argument is --pg-dsn). Several joined by '+' "
                   "(e.g. postgres+iceberg, one of each family) for a --pipeline PATH.py:FUNCTION "
                   "whose function routes its tables: its sink argument is then {family: sink}, e.g. "
                   "{'postgres': ..., 'iceberg': ...}.")
@click.option("--standby", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True,
              help="Hot standby (verify --fast-start): start Spark, then wait until this file "
                   "exists before touching the log, the sink or the checkpoint.")
@click.option("--pipeline", default="user_counts", show_default=True, metavar="NAME|PATH.py:FUNCTION",
              help="user_counts: Example 5-1 per-user/global counts per minute "
                   "(onceflow/examples/user_counts.py); billing: bytes per account and hour, late "
                   "records kept in late_events (onceflow/examples/billing.py); or your own: "
                   "PATH.py:FUNCTION, a function (spark, input, sink, checkpoint, once) that builds "
                   "the query with onceflow.write_stream and returns it (reads --input).")
@click.option("--input", "input_dir", default=None, metavar="DIR|HOST:PORT/TOPIC",
              help="What a --pipeline PATH.py:FUNCTION reads (its input argument): a directory, or "
                   "a Kafka bootstrap server and topic.")
@click.option("--remote", default=None, metavar="sc://HOST:PORT|local",
              help="Run on Spark Connect: the server at sc://HOST:PORT (onceflow installed in its Python, "
                   "docs/connect.md), or 'local': a server this run starts for itself, with onceflow's "
                   "jars and settings, that lives and dies with it (as a classic driver's JVM does).")
@click.option("--id-store/--spark-store", default=None, envvar="ONCEFLOW_ID_STORE", show_envvar=True,
              help="Where the deduplication keeps its ids: onceflow's id state store (the default; "
                   "Example 5-1 ~1.5x faster; compiled once on first use) or Spark's HDFS-backed "
                   "store. A checkpoint keeps the store it started with.")
def run(log_dir: Path | None, kafka: str | None, topic: str | None, max_offsets_per_trigger: int | None,
        kafka_connector: str, checkpoint: Path, db: Path | None, delta_root: Path | None,
        iceberg_dir: Path | None, pg_dsn: str | None,
        effects_url: str | None, out_kafka: str | None, effects_timeout: float,
        once: bool, allowed_lateness: float, max_files_per_trigger: int | None, trigger_interval: str,
        master: str | None, retain_batches: int | None, sink_kind: str | None,
        standby: Path | None, pipeline: str, input_dir: str | None, remote: str | None,
        id_store: bool | None) -> None:
    """Run a pipeline over the event log, exactly once into its sink.

    The default pipeline is Streaming Systems Example 5-1 (per-user and global counts per
    minute); --pipeline billing sums bytes per account and hour (default sink postgres-staged);
    --pipeline PATH.py:FUNCTION runs your own over --input.
    """
    if pipeline not in PIPELINES and ":" not in pipeline:
        raise click.BadParameter(f"{pipeline!r}: use {', '.join(PIPELINES)} or PATH.py:FUNCTION",
                                 param_hint="--pipeline")
    conf = _connector_conf(kafka_connector)
    if id_store is not None:  # read by every session this command creates (onceflow.session)
        os.environ[idstore.ENV] = "1" if id_store else "0"
    if retain_batches is not None:
        conf["spark.sql.streaming.minBatchesToRetain"] = str(retain_batches)
    if sink_kind is not None and "+" in sink_kind and pipeline in PIPELINES:
        raise click.UsageError(f"--sink {sink_kind} names several sinks: that is for a --pipeline "
                               f"PATH.py:FUNCTION that routes its tables to them; {pipeline} writes one sink")
    if sink_kind == REALTIME and pipeline in PIPELINES:
        raise click.UsageError(f"--sink {REALTIME} is for a --pipeline PATH.py:FUNCTION that writes with "
                               f"onceflow.write_realtime; {pipeline} writes micro-batches")
    if pipeline not in PIPELINES:
        out = SinkOptions(db=db, pg_dsn=pg_dsn, delta=delta_root, kafka=out_kafka, iceberg=iceberg_dir)
        _run_user_pipeline(pipeline, input_dir, checkpoint, out, sink_kind, once, master, conf, standby,
                           remote)
        return
    spark = None
    if standby is not None:
        spark = _session(master, conf, remote, checkpoint)
        wait_for_release(standby)
    source = _source(log_dir, kafka, topic, max_offsets_per_trigger, pipeline, kafka_connector)
    cfg = PipelineConfig(log_dir=source, checkpoint=checkpoint.absolute(),
                         allowed_lateness_s=allowed_lateness,
                         max_files_per_trigger=max_files_per_trigger,
                         trigger_interval=trigger_interval)
    if isinstance(source, Path):
        EventLog(source).validate()  # fail fast, before Spark starts
    where = SinkOptions(db=db, pg_dsn=pg_dsn, delta=delta_root, effects_url=effects_url,
                        effects_timeout_s=effects_timeout, kafka=out_kafka, iceberg=iceberg_dir)
    sink = make_sink(sink_kind or DEFAULT_SINK[pipeline], where, sink_id=pipeline)
    spark = spark or _session(master, conf, remote, checkpoint)
    try:
        result = run_pipeline(spark, cfg, sink, once, pipeline)
    finally:
        sink.close()
    click.echo(
        f"done: {result.batches_committed} batches committed, {result.batches_replayed} replayed, "
        f"{result.input_rows} rows read, {result.duplicates_dropped} duplicates removed, "
        f"{result.late_dropped} late dropped, {result.events_per_second:,.0f} events/s"
    )


def _session(master: str | None, conf: dict[str, str], remote: str | None, checkpoint: Path) -> Any:
    """The run's session: classic, or Spark Connect (``--remote``; ``local``: a server of its own)."""
    from onceflow.runtime.session import session

    if remote is None:
        return session(master=master, conf=conf)
    if master:
        raise click.UsageError("--master and --remote: the Spark Connect server has its own master")
    if remote == "local":
        from onceflow.verify.connect_server import private_server

        remote = private_server(checkpoint.absolute().parent / f"connect-server-{os.getpid()}").url
    try:
        return session(remote=remote, conf={k: v for k, v in conf.items() if k.startswith("spark.sql.")})
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _run_user_pipeline(spec: str, input_dir: str | None, checkpoint: Path, where_out: SinkOptions,
                       sink_kind: str | None, once: bool, master: str | None, conf: dict[str, str],
                       standby: Path | None, remote: str | None) -> None:
    """``--pipeline PATH.py:FUNCTION``: the user's function builds the query over ``--input``."""
    from onceflow.api import pipelines

    if input_dir is None:
        raise click.UsageError(f"--pipeline {spec} needs --input DIR (the directory the pipeline reads)")
    try:
        fn = pipelines.load(spec)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    kind = sink_kind or "sqlite"
    if kind not in (*USER_SINKS, REALTIME) and "+" not in kind:
        raise click.UsageError(f"--pipeline PATH.py:FUNCTION writes with --sink {', '.join(USER_SINKS)}, "
                               f"several of them joined by '+', or {REALTIME}")
    where: str | Path = input_dir
    if not re.fullmatch(r"[^/\s]+:\d+/[^/\s]+", input_dir):  # not HOST:PORT/TOPIC: a directory
        where = Path(input_dir).absolute()
        where.mkdir(parents=True, exist_ok=True)
    if kind == REALTIME:
        if remote is not None:
            raise click.UsageError("--sink realtime runs Spark's Real-Time Mode through a JVM writer: not on "
                                   "Spark Connect (--remote)")
        _run_realtime(fn, where, checkpoint, where_out.pg_dsn, once, master, conf, standby)
        return
    spark = _session(master, conf, remote, checkpoint)
    if standby is not None:
        wait_for_release(standby)
    try:
        sink = make_sinks(kind, where_out, sink_id=USER_SINK_ID)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    every = list(sink.values()) if isinstance(sink, dict) else [sink]
    try:
        query = pipelines.start(fn, spark, where, sink, checkpoint.absolute(), once)
        query.awaitTermination()
    finally:
        for one in every:
            one.close()
    click.echo("done")


def _run_realtime(fn: Any, where: str | Path, checkpoint: Path, pg_dsn: str | None, once: bool,
                  master: str | None, conf: dict[str, str], standby: Path | None) -> None:
    """``--sink realtime``: the user's function gets the connection string and starts a real-time query."""
    from onceflow.api import pipelines
    from onceflow.runtime.session import session
    from onceflow.sinks.postgres import sql as pg

    if once:
        raise click.UsageError("--sink realtime runs until stopped: Spark's Real-Time Mode has no --once")
    try:
        dsn = pg.resolve_dsn(pg_dsn)
        spark = session(master=master, conf=conf, realtime=True)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if standby is not None:
        wait_for_release(standby)
    query = pipelines.start(fn, spark, where, dsn, checkpoint.absolute(), False, realtime=True)
    click.echo(REALTIME_STARTED, err=True)
    query.awaitTermination()


def _connector_conf(connector: str) -> dict[str, str]:
    """``spark.jars`` with Spark's Kafka connector when ``--kafka-connector`` asks (or auto finds it)."""
    from onceflow.runtime import jars

    if connector == "onceflow" or (connector == "auto" and jars.paths(jars.CONNECTOR) is None):
        return {}
    return {"spark.jars": ",".join(str(p) for p in jars.require(jars.CONNECTOR))}


def _source(log_dir: Path | None, kafka: str | None, topic: str | None, max_offsets: int | None,
            pipeline: str, connector: str = "auto") -> Path | KafkaTopic:
    """The run's input: the event log, or a Kafka topic."""
    if kafka is None:
        if log_dir is None:
            raise click.UsageError("give --log DIR (the event log) or --kafka HOST:PORT --topic NAME")
        return log_dir.absolute()
    if log_dir is not None or not topic or pipeline != "user_counts":
        raise click.UsageError("--kafka needs --topic, replaces --log, and runs --pipeline user_counts")
    return KafkaTopic(kafka, topic, max_offsets, "onceflow" if connector == "onceflow" else "auto")


def wait_for_release(go: Path, poll_s: float = 0.02) -> None:
    """A hot standby's wait: block until ``go`` exists; exit 3 if its starter went away.

    The standby has its JVM up and its SparkSession built, and has touched nothing else
    (see :class:`onceflow.verify.driver.Standby`); once released it runs as a fresh
    ``onceflow run`` would.
    """
    parent = os.getppid()
    click.echo(f"standby: Spark is up; waiting for {go}")
    while not go.exists():
        if os.getppid() != parent:
            click.echo("onceflow: standby released by nobody: its starter exited", err=True)
            sys.exit(3)
        time.sleep(poll_s)


@click.group("pipelines")
def pipelines() -> None:
    """Spark Declarative Pipelines with onceflow's sinks (PySpark 4.1 and later)."""


@pipelines.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                            "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def pipelines_run(args: tuple[str, ...]) -> None:
    """``spark-pipelines run ARGS``, exiting 0 when the run completes.

    Every argument goes to Spark's runner as it is (``onceflow pipelines run --help``: its
    options, e.g. ``--spec pipeline.yml``, ``--full-refresh-all``). The one difference: PySpark's
    runner exits 1 after a completed run whose flows use a Python data source (every onceflow
    format) or UDF, on the Python accumulator updates the server reports; this runner passes them
    over (onceflow.runtime.pipelines_runner; docs/connect.md). Runs where it is called, once.
    """
    from onceflow.runtime import pipelines_runner

    cmd = pipelines_runner.command(["run", *args])
    sys.stdout.flush()
    os.execve(cmd[0], cmd, pipelines_runner.environment())


@click.command("connect-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; the port has no authentication).")
@click.option("--port", type=int, default=15002, show_default=True, help="gRPC port.")
@click.option("--cores", type=int, default=None, help="Cores of its local master [default: this machine's].")
@click.option("--memory", default="4g", show_default=True, help="The server's heap (--driver-memory).")
@click.option("--without-onceflow-jars", is_flag=True,
              help="Leave onceflow's jars off (Spark's state store and checkpoint file manager run).")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="More Spark settings (repeatable).")
@click.option("--print", "print_only", is_flag=True, help="Print the command instead of running it.")
def connect_server(host: str, port: int, cores: int | None, memory: str, without_onceflow_jars: bool,
                   confs: tuple[str, ...], print_only: bool) -> None:
    """Run a Spark Connect server with onceflow's settings, in the foreground (Ctrl-C stops it).

    PySpark's own server (no Spark distribution needed) with this Python as the one it runs
    clients' functions with (onceflow importable there), onceflow's jars, the throughput
    collector and the heap; clients connect with onceflow.session(remote="sc://HOST:PORT").
    Runs where it is called, once.
    """
    from onceflow.runtime.session import server_command, server_environment

    conf = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
        conf[key] = value
    cmd = server_command(host, port, cores, memory, not without_onceflow_jars, conf)
    env = server_environment()
    if print_only:
        import shlex

        click.echo(f"PYSPARK_PYTHON={shlex.quote(env['PYSPARK_PYTHON'])} {shlex.join(cmd)}")
        return
    click.echo(f"onceflow: Spark Connect server for sc://{host}:{port} (Ctrl-C stops it)", err=True)
    sys.stdout.flush()
    os.execve(cmd[0], cmd, env)
