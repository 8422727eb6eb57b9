"""``onceflow run``: Example 5-1 (or billing) from an event log into SQLite or PostgreSQL, exactly once."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from onceflow.cli.options import Duration, secret_dsn
from onceflow.pipelines.common import PipelineConfig
from onceflow.sinks import SINKS, make_sink


def print_batch(info: dict[str, Any]) -> None:
    """Print one line per batch; only a committed batch says "committed"."""
    if not info["committed"]:
        click.echo(f"batch {info['batch_id']}: already committed earlier, skipped (replay)")
        return
    rate = info["input_rows"] / info["seconds"] if info["seconds"] > 0 else 0.0
    written = ", ".join(f"{n} {r}" for n, r in info["rows_written"].items() if r is not None)
    click.echo(
        f"batch {info['batch_id']} committed: {info['input_rows']} rows, "
        f"{info['duplicates_dropped']} duplicates, {info['late_dropped']} late, "
        f"rows written: {written or 'by the executors'} ({rate:,.0f} rows/s)"
    )


@dataclass
class Totals:
    """What one ``onceflow run`` of Example 5-1 did (this process only)."""

    batches_committed: int = 0
    batches_replayed: int = 0
    input_rows: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    events_counted: int = 0
    seconds: float = 0.0

    def add(self, info: dict[str, Any]) -> None:
        """Count one batch (an ``on_batch`` callback) and print its line."""
        print_batch(info)
        if not info["committed"]:
            self.batches_replayed += 1
            return
        self.batches_committed += 1
        self.input_rows += info["input_rows"]
        self.late_dropped += info["late_dropped"]
        self.duplicates_dropped += info["duplicates_dropped"]
        self.events_counted += info["rows_out"]

    @property
    def events_per_second(self) -> float:
        """Input rows per wall-clock second."""
        return self.input_rows / self.seconds if self.seconds > 0 else 0.0


def run_user_counts(spark: Any, cfg: PipelineConfig, sink: Any, once: bool) -> Totals:
    """Run Example 5-1 (:mod:`onceflow.examples.user_counts`) until drained (``once``) or stopped.

    Raises:
        BadSegmentError: A segment of the log is unreadable or has the wrong schema.
        OnceflowError: What failed inside a batch.
    """
    from onceflow.errors import OnceflowError
    from onceflow.examples import user_counts
    from onceflow.pipelines.common import explain_failure
    from onceflow.sources.log import EventLog

    totals = Totals()
    started = time.perf_counter()
    query = user_counts.start(spark, cfg.log_dir, sink, cfg.checkpoint, within=cfg.allowed_lateness_s,
                              max_files_per_trigger=cfg.max_files_per_trigger, once=once,
                              trigger=cfg.trigger_interval, on_batch=totals.add)
    try:
        query.awaitTermination()
    except OnceflowError:
        raise
    except Exception as exc:
        raise explain_failure(exc, EventLog(cfg.log_dir)) from exc
    totals.seconds = time.perf_counter() - started
    return totals


@click.command()
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory (segment files).")
@click.option("--checkpoint", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Spark checkpoint directory; reuse it to resume exactly.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite database for user_counts and global_counts (SQLite sinks).")
@click.option("--pg-dsn", envvar="ONCEFLOW_PG_DSN", default=None, show_envvar=True, callback=secret_dsn,
              help="PostgreSQL connection string (postgres* sinks); prefer the environment "
                   "variable, which keeps a password out of the process list.")
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
@click.option("--sink", "sink_kind", type=click.Choice(SINKS), default=None,
              help="Where results go. user_counts: sqlite (default); postgres (driver-side "
                   "transaction); postgres-staged / postgres-2pc (written by the executors). "
                   "billing: postgres-staged (default) or postgres-2pc. Negative controls, never "
                   "for real data: 'naive' and 'postgres-naive' have no batch marker "
                   "(duplicates), 'lossy' commits the marker before the rows (loss).")
@click.option("--standby", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True,
              help="Hot standby (verify --fast-start): start Spark, then wait until this file "
                   "exists before touching the log, the sink or the checkpoint.")
@click.option("--pipeline", type=click.Choice(["user_counts", "billing"]), default="user_counts",
              show_default=True,
              help="user_counts: Example 5-1 per-user/global counts per minute; billing: bytes "
                   "per account and hour into PostgreSQL, late records into late_events.")
def run(log_dir: Path, checkpoint: Path, db: Path | None, pg_dsn: str | None, once: bool,
        allowed_lateness: float, max_files_per_trigger: int | None, trigger_interval: str,
        master: str | None, retain_batches: int | None, sink_kind: str | None,
        standby: Path | None, pipeline: str) -> None:
    """Run a pipeline over the event log, exactly once into its sink.

    The default pipeline is Streaming Systems Example 5-1 (per-user and global counts per
    minute); --pipeline billing sums bytes per account and hour into PostgreSQL.
    """
    from onceflow.sources.log import EventLog
    from onceflow.spark import session

    conf = {}
    if retain_batches is not None:
        conf["spark.sql.streaming.minBatchesToRetain"] = str(retain_batches)
    spark = None
    if standby is not None:
        spark = session(master=master, conf=conf)
        wait_for_release(standby)
    cfg = PipelineConfig(log_dir=log_dir.absolute(), checkpoint=checkpoint.absolute(),
                         allowed_lateness_s=allowed_lateness,
                         max_files_per_trigger=max_files_per_trigger,
                         trigger_interval=trigger_interval)
    EventLog(log_dir).validate()  # fail fast, before Spark starts
    if pipeline == "billing":
        _run_billing(cfg, sink_kind or "postgres-staged", pg_dsn, master, conf, once)
        return
    sink = make_sink(sink_kind or "sqlite", db, pg_dsn)
    spark = spark or session(master=master, conf=conf)
    try:
        result = run_user_counts(spark, cfg, sink, once)
    finally:
        sink.close()
    click.echo(
        f"done: {result.batches_committed} batches committed, {result.batches_replayed} replayed, "
        f"{result.input_rows} rows read, {result.duplicates_dropped} duplicates removed, "
        f"{result.late_dropped} late dropped, {result.events_per_second:,.0f} events/s"
    )


def wait_for_release(go: Path, poll_s: float = 0.02) -> None:
    """A hot standby's wait: block until ``go`` exists; exit 3 if its starter went away.

    The standby has its JVM up and its SparkSession built, and has touched nothing else
    (see :class:`onceflow.audit.driver.Standby`); once released it runs as a fresh
    ``onceflow run`` would.
    """
    parent = os.getppid()
    click.echo(f"standby: Spark is up; waiting for {go}")
    while not go.exists():
        if os.getppid() != parent:
            click.echo("onceflow: standby released by nobody: its starter exited", err=True)
            sys.exit(3)
        time.sleep(poll_s)


def _run_billing(cfg: Any, sink_kind: str, pg_dsn: str | None, master: str | None,
                 conf: dict[str, str], once: bool) -> None:
    """``onceflow run --pipeline billing``."""
    from onceflow.errors import ConfigError
    from onceflow.pipelines.billing import run as run_billing
    from onceflow.sinks.pg import resolve_dsn
    from onceflow.spark import session

    if sink_kind not in ("postgres-staged", "postgres-2pc"):
        raise ConfigError(f"--pipeline billing writes to PostgreSQL from the executors: use "
                          f"--sink postgres-staged or postgres-2pc, not {sink_kind}")
    dsn = resolve_dsn(pg_dsn)
    spark = session(master=master, conf=conf)
    result = run_billing(spark, cfg, dsn, protocol=sink_kind.removeprefix("postgres-"), once=once)
    click.echo(f"done: {result.batches} batches written to billing and late_events "
               f"in {result.seconds:.1f} s")
