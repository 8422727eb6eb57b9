"""``onceflow effects``: what a side-effect sink's ledger says — per batch, and what to reconcile."""

from __future__ import annotations

import json
from pathlib import Path

import click

from onceflow.errors import ConfigError


@click.command()
@click.option("--ledger", required=True, metavar="PATH|URL",
              help="The ledger of an onceflow.http sink (its ledger= argument): a SQLite file, or a "
                   "PostgreSQL database's postgresql:// URL.")
@click.option("--sink-id", default="default", show_default=True,
              help="The sink's id (onceflow run --sink http uses the pipeline's name).")
@click.option("--unconfirmed", is_flag=True,
              help="Print the keys started and never confirmed, one JSON object per line, instead.")
def effects(ledger: str, sink_id: str, unconfirmed: bool) -> None:
    """Show a side-effect sink's ledger: per batch, what was processed and what was committed.

    Keys left 'started' (a service without idempotency answered ambiguously, or a driver died
    between a call and the ledger's record of its answer) may or may not have been applied:
    reconcile them with the service's own records (--unconfirmed lists them).
    """
    from rich.console import Console
    from rich.table import Table as RichTable

    from onceflow.sinks.http.ledger import METRICS, is_dsn, open_ledger

    if not is_dsn(ledger) and not Path(ledger).exists():
        raise ConfigError(f"no ledger at {ledger}: pass the ledger= path (or postgresql:// URL) of the "
                          "onceflow.http sink")
    book = open_ledger(ledger, sink_id)
    try:
        left = book.unconfirmed()
        if unconfirmed:
            for row in left:
                click.echo(json.dumps(row, sort_keys=True))
            return
        batches = book.batches()
        table = RichTable(title=f"effects of sink {sink_id!r} in {book.where}")
        for col in ("batch", *METRICS, "seconds"):
            table.add_column(col, justify="right")
        for b in batches:
            table.add_row(str(b["batch_id"]), *(str(b[m]) for m in METRICS), f"{b['seconds']:.2f}")
        Console().print(table)
        total = {m: sum(int(b[m]) for b in batches) for m in ("effects", "calls", "confirmed")}
        click.echo(f"{len(batches)} batches: {total['effects']} effects, {total['calls']} calls attempted, "
                   f"{total['confirmed']} confirmed in the ledger; {len(left)} keys started and never "
                   "confirmed" + (" — list them with --unconfirmed and reconcile" if left else ""))
    finally:
        book.close()
