"""``onceflow tables``: which sink ids write each table of a sink's database, and handing one over."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import click

from onceflow.errors import ConfigError


def _delta_rows(root: Path, hand_over: str | None,
                to: str | None) -> tuple[list[tuple[str, str, bool, int]], list[str] | None]:
    """:func:`_rows` for the Delta tables under ``root`` (their registry file)."""
    from onceflow.sinks._core import owners
    from onceflow.sinks.delta.sink import DeltaTablesSink

    if not root.is_dir():
        raise ConfigError(f"no Delta tables at {root}: give the root the query writes to")
    with DeltaTablesSink(root).registry() as rows:
        before = None
        if hand_over:
            before = sorted(rows.get(hand_over, {}))
            rows[hand_over] = {str(to): {"shared": False, "claimed_ms": owners.now_ms()}}
        listed = [(t, s, bool(v["shared"]), int(v["claimed_ms"])) for t in sorted(rows)
                  for s, v in sorted(rows[t].items())]
    return listed, before


def _kafka_rows(bootstrap: str, hand_over: str | None,
                to: str | None) -> tuple[list[tuple[str, str, bool, int]], list[str] | None]:
    """:func:`_rows` for the topics of a Kafka cluster (its registry topic)."""
    from onceflow.sinks.kafka.owners import Registry
    from onceflow.sinks.kafka.sink import KafkaTopicsSink

    KafkaTopicsSink(bootstrap).has_marker_topic()  # an unreachable cluster is named, not waited on
    registry = Registry({"bootstrap.servers": bootstrap})
    before = registry.hand_over(hand_over, str(to)) if hand_over else None
    return registry.listed(), before


def _rows(db: Path | None, dsn: str | None, ledger: str | None, hand_over: str | None,
          to: str | None) -> tuple[list[tuple[str, str, bool, int]], list[str] | None]:
    """The registry's rows (after a hand-over, if asked) and the sink ids that held the table before."""
    from onceflow.sinks.http.ledger import is_dsn
    from onceflow.sinks.sqlite import db as sqlite_db

    if ledger is not None and is_dsn(ledger):  # a PostgreSQL ledger: the registry of that database
        dsn, ledger = ledger, None
    path = db or (Path(ledger) if ledger is not None else None)
    if path is not None:
        if not path.exists():
            raise ConfigError(f"no database at {path}: give the file the query writes to")
        conn = sqlite3.connect(str(path), isolation_level=None)
        try:
            before = sqlite_db.hand_over_table(conn, hand_over, str(to)) if hand_over else None
            return sqlite_db.table_owners(conn), before
        finally:
            conn.close()
    from onceflow.sinks.postgres import sql as pg

    with pg.session(pg.resolve_dsn(dsn)) as conn:
        before = pg.hand_over(conn, hand_over, str(to)) if hand_over else None
        return pg.list_owners(conn), before


@click.command()
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="A SQLite sink's database.")
@click.option("--dsn", help="A PostgreSQL sink's connection string ('' for $ONCEFLOW_PG_DSN).")
@click.option("--ledger", metavar="PATH|URL",
              help="An HTTP sink's ledger: a SQLite file or a PostgreSQL postgresql:// URL.")
@click.option("--delta", type=click.Path(file_okay=False, path_type=Path), help="A Delta sink's root.")
@click.option("--kafka", metavar="HOST:PORT", help="A Kafka sink's brokers (the registry topic "
              "onceflow_tables).")
@click.option("--hand-over", "hand_over", metavar="TABLE", help="Give TABLE to the sink id --to (stop the "
              "queries that write it first).")
@click.option("--to", metavar="SINK_ID", help="The sink id that writes the table from now on.")
def tables(db: Path | None, dsn: str | None, ledger: str | None, delta: Path | None, kafka: str | None,
           hand_over: str | None, to: str | None) -> None:
    """List which sink ids write each table of a sink's database, or hand a table over.

    A second sink id on a table is refused when its query starts, unless every writer declares
    the table shared (Table(..., shared=True)): two sink ids would each write every batch of
    their own into it. When a job is renamed, or the table moves to a new query, hand it over:
    the old sink ids' claims go, the new one's is written (markers are not moved).
    """
    if sum(x is not None for x in (db, dsn, ledger, delta, kafka)) != 1:
        raise ConfigError("onceflow tables needs exactly one of --db FILE, --dsn DSN, --ledger FILE, "
                          "--delta DIR or --kafka HOST:PORT")
    if (hand_over is None) != (to is None):
        raise ConfigError("--hand-over TABLE and --to SINK_ID go together")
    if delta is not None:
        rows, before = _delta_rows(delta, hand_over, to)
    elif kafka is not None:
        rows, before = _kafka_rows(kafka, hand_over, to)
    else:
        rows, before = _rows(db, dsn, ledger, hand_over, to)
    if before is not None:
        held = ", ".join(repr(s) for s in before) or "no sink id"
        click.echo(f"table {hand_over!r}: handed over from {held} to {to!r}")
    if not rows:
        click.echo("no table is claimed yet (a query claims its tables when it starts)")
    for table, sink_id, shared, since in rows:
        when = dt.datetime.fromtimestamp(since / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        click.echo(f"{table}\t{sink_id}\t{'shared' if shared else 'own'}\tsince {when}")


@click.command("maintain")
@click.option("--delta", "root", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The Delta sink's root directory (onceflow.delta(ROOT)).")
@click.option("--table", "names", multiple=True, help="A table to maintain (repeat; default: every table).")
@click.option("--retention", "retention_h", type=click.FloatRange(min=0), default=7 * 24.0, show_default=True,
              help="Hours a file that an older version removed is kept before the vacuum deletes it "
                   "(keep it above your longest batch: a reader of an older snapshot needs its files).")
@click.option("--no-compact", is_flag=True, help="Only vacuum.")
@click.option("--no-vacuum", is_flag=True, help="Only compact.")
@click.option("--orphans", is_flag=True,
              help="Also delete files no commit names (a killed writer's), older than max(--retention, 24) "
                   "hours.")
@click.option("--target-size", type=click.IntRange(min=1), default=None,
              help="Compacted files' size in bytes (default: the table's delta.targetFileSize, else "
                   "100 MiB).")
def maintain(root: Path, names: tuple[str, ...], retention_h: float, no_compact: bool, no_vacuum: bool,
             orphans: bool, target_size: int | None) -> None:
    """Compact and vacuum a Delta sink's tables, while its query runs.

    Small files are rewritten into large ones in commits that change no row; files older
    versions removed are deleted after --retention; the tables' app transactions (the markers
    that decide a replay) are checked unchanged. Docs: Sinks, Delta maintenance.
    """
    from onceflow.sinks.delta.maintain import maintain as run

    done = run(root, list(names) or None, compact=not no_compact, vacuum=not no_vacuum,
               retention_hours=retention_h, target_size=target_size, orphans=orphans)
    if not done:
        click.echo(f"no Delta tables under {root}")
    for t in done:
        marks = ", ".join(f"{app} at batch {v}" for app, v in t.markers.items()) or "no onceflow marker"
        click.echo(f"{t.table}: {t.files_before} -> {t.files_after} files ({t.compacted} compacted, "
                   f"{t.vacuumed} deleted); {marks}")
