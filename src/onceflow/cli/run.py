"""``onceflow run``: run Example 5-1 from an event log into SQLite or PostgreSQL, exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceflow.cli.options import Duration
from onceflow.sinks import SINKS, make_sink


def print_batch(info: dict[str, Any]) -> None:
    """Print one line per batch; only a committed batch says "committed"."""
    if not info["committed"]:
        click.echo(f"batch {info['batch_id']}: already committed earlier, skipped (replay)")
        return
    rate = info["input_rows"] / info["seconds"] if info["seconds"] > 0 else 0.0
    click.echo(
        f"batch {info['batch_id']} committed: {info['input_rows']} rows, "
        f"{info['duplicates_dropped']} duplicates, {info['late_dropped']} late, "
        f"{info['rows_written']} window rows ({rate:,.0f} rows/s in sink step)"
    )


@click.command()
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory (segment files).")
@click.option("--checkpoint", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Spark checkpoint directory; reuse it to resume exactly.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite database for user_counts and global_counts (SQLite sinks).")
@click.option("--pg-dsn", envvar="ONCEFLOW_PG_DSN", default=None, show_envvar=True,
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
@click.option("--sink", "sink_kind", type=click.Choice(SINKS), default="sqlite", show_default=True,
              help="sqlite; postgres (driver-side transaction), postgres-staged / postgres-2pc "
                   "(written by the executors). Negative controls, never for real data: 'naive' "
                   "and 'postgres-naive' have no batch marker (duplicates), 'lossy' commits the "
                   "marker before the rows (loss).")
def run(log_dir: Path, checkpoint: Path, db: Path | None, pg_dsn: str | None, once: bool,
        allowed_lateness: float, max_files_per_trigger: int | None, trigger_interval: str,
        master: str | None, retain_batches: int | None, sink_kind: str) -> None:
    """Run the per-user/global per-minute counts pipeline (Streaming Systems Example 5-1)."""
    from onceflow.pipelines.user_counts import UserCountsConfig
    from onceflow.pipelines.user_counts import run as run_pipeline
    from onceflow.sources.log import EventLog
    from onceflow.spark import session

    cfg = UserCountsConfig(log_dir=log_dir.absolute(), checkpoint=checkpoint.absolute(),
                           allowed_lateness_s=allowed_lateness,
                           max_files_per_trigger=max_files_per_trigger,
                           trigger_interval=trigger_interval)
    sink = make_sink(sink_kind, db, pg_dsn)
    EventLog(log_dir).validate()  # fail fast, before Spark starts
    conf = {}
    if retain_batches is not None:
        conf["spark.sql.streaming.minBatchesToRetain"] = str(retain_batches)
    spark = session(master=master, conf=conf)
    try:
        result = run_pipeline(spark, cfg, sink, once=once, on_commit=print_batch)
    finally:
        sink.close()
    click.echo(
        f"done: {result.batches_committed} batches committed, {result.batches_replayed} replayed, "
        f"{result.input_rows} rows read, {result.duplicates_dropped} duplicates removed, "
        f"{result.late_dropped} late dropped, {result.events_per_second:,.0f} events/s"
    )
