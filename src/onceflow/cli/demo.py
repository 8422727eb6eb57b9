"""``onceflow demo``: generate, run exactly once, summarise and self-check."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table


@click.command()
@click.option("--workdir", default="onceflow-demo", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the log, checkpoint and database go (emptied first).")
@click.option("--events", default=300_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--minutes", default=30.0, show_default=True, type=float)
@click.option("--duplicates", default=0.05, show_default=True, type=float)
@click.option("--late", default=0.01, show_default=True, type=float)
@click.option("--seed", default=42, show_default=True, type=int)
def demo(workdir: Path, events: int, users: int, minutes: float, duplicates: float, late: float,
         seed: int) -> None:
    """Generate a stream with retries and late data, count it exactly once, and check it."""
    from onceflow.cli.run import PipelineConfig, run_pipeline
    from onceflow.runtime.session import session
    from onceflow.sources.log import EventLog
    from onceflow.verify.generator import GeneratorConfig, generate_segments
    from onceflow.verify.recompute import diff_counts, expected_counts
    from onceflow.verify.sinks import SinkOptions, make_sink
    from onceflow.verify.verdict import read_counts

    console = Console()
    workdir = workdir.absolute()
    if workdir.exists():
        shutil.rmtree(workdir)
    log_dir, ck, db = workdir / "log", workdir / "checkpoint", workdir / "counts.db"
    cfg = GeneratorConfig(events=events, users=users, minutes=minutes, duplicates=duplicates,
                          late=late, seed=seed, segment_size=max(events // 10, 1))
    log = EventLog(log_dir)
    rows = 0
    for segment in generate_segments(cfg):
        log.append(segment)
        rows += segment.num_rows
    console.print(f"[bold]1. generated[/bold] {rows:,} rows ({events:,} distinct events, "
                  f"{duplicates:.0%} producer retries, {late:.0%} late) in {log_dir}")
    console.print("[bold]2. starting Spark[/bold] (a few seconds) ...")
    spark = session()
    pcfg = PipelineConfig(log_dir=log_dir, checkpoint=ck, max_files_per_trigger=2)
    sink = make_sink("sqlite", SinkOptions(db=db))
    try:
        result = run_pipeline(spark, pcfg, sink, once=True)
    finally:
        sink.close()
    users_got, global_got = read_counts(db)
    table = Table(title=f"Example 5-1, exactly once into {db}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in [
        ("events read", f"{result.input_rows:,}"),
        ("duplicates removed", f"{result.duplicates_dropped:,}"),
        ("late dropped (counted)", f"{result.late_dropped:,}"),
        ("events counted", f"{result.events_counted:,}"),
        ("micro-batches committed", f"{result.batches_committed}"),
        ("user/minute windows written", f"{len(users_got):,}"),
        ("global minute windows", f"{len(global_got):,}"),
        ("events/s (cold JVM; steady state: BENCHMARKS.md)", f"{result.events_per_second:,.0f}"),
    ]:
        table.add_row(name, value)
    console.print(table)
    console.print("[bold]3. self-check[/bold]: recomputing with a plain Spark batch job ...")
    exp_users, exp_global = expected_counts(spark, log_dir, ck)
    ok = True
    for name, exp, got in [("user_counts", exp_users, users_got),
                           ("global_counts", exp_global, global_got)]:
        d = diff_counts(exp, got)  # type: ignore[arg-type]
        ok &= d.exact
        status = "[green]EXACT[/green]" if d.exact else "[red]MISMATCH[/red]"
        console.print(f"   {name}: {status} — {d.actual_rows:,} rows found, "
                      f"{d.expected_rows:,} expected, lost {d.lost_events}, "
                      f"duplicated {d.duplicated_events}")
    with sqlite3.connect(db) as conn:
        late_rec = conn.execute(
            "SELECT COALESCE(SUM(late_dropped), 0) FROM onceflow_batches"
        ).fetchone()[0]
    console.print(f"   late drops recorded in onceflow_batches: {late_rec:,}")
    console.print(f"Query it yourself: sqlite3 {db} 'SELECT * FROM global_counts LIMIT 5'")
    console.print("The pipeline is onceflow/examples/user_counts.py: copy it to make your own.")
    if not ok:
        sys.exit(1)
