"""``onceflow generate``: write a deterministic synthetic stream into an event log."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.progress import Progress

from onceflow.cli.options import Duration, fraction
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments


@click.command()
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory (created if missing; new segments are appended).")
@click.option("--events", required=True, type=click.IntRange(min=0), help="Distinct events.")
@click.option("--users", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--minutes", default=10.0, show_default=True, type=click.FloatRange(min=0.001),
              help="Event-time span of the stream.")
@click.option("--duplicates", default=0.0, show_default=True, callback=fraction,
              help="Fraction of events re-appended as producer retries.")
@click.option("--late", default=0.0, show_default=True, callback=fraction,
              help="Fraction of events far behind the stream (late).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--segment-size", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="Rows per segment file.")
@click.option("--max-disorder", default="20s", show_default=True, type=Duration(),
              help="Out-of-orderness of on-time events; keep it below the allowed lateness.")
@click.option("--pace", default="0s", show_default=True, type=Duration(),
              help="Pause between segments, to feed a running pipeline live.")
def generate(out: Path, events: int, users: int, minutes: float, duplicates: float, late: float,
             seed: int, segment_size: int, max_disorder: float, pace: float) -> None:
    """Generate events for Example 5-1 into the log at --out (deterministic per seed)."""
    cfg = GeneratorConfig(events=events, users=users, minutes=minutes, duplicates=duplicates,
                          late=late, seed=seed, segment_size=segment_size,
                          max_disorder_s=max_disorder)
    log = EventLog(out)
    rows = segments = 0
    total = events + int(round(events * duplicates))
    with Progress(transient=True, disable=total < 500_000) as progress:
        task = progress.add_task("writing segments", total=total)
        for table in generate_segments(cfg):
            if segments and pace:
                time.sleep(pace)
            log.append(table)
            rows += table.num_rows
            segments += 1
            progress.update(task, advance=table.num_rows)
    click.echo(f"wrote {rows} rows ({events} distinct events) in {segments} segments to {log.directory}")
