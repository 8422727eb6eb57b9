"""``onceflow repair``: bring a query's checkpoint back into agreement with its sink after a restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceflow.errors import ConfigError


def _sink(db: Path | None, dsn: str | None, delta: Path | None, ledger: str | None, kafka: str | None,
          sink_id: str, iceberg: dict[str, Any] | None = None) -> Any:
    """The sink whose markers the checkpoint is compared with (reads only); several: the query's sinks.

    A query that writes to several sinks (``write_stream(df, {table: sink})``) is repaired with each
    of its sinks given (one of each kind): the batches every sink has are the query's.
    """
    given = {k: v for k, v in {"db": db, "dsn": dsn, "delta": delta, "ledger": ledger, "kafka": kafka,
                               "iceberg": iceberg}.items() if v is not None}
    if not given:
        raise ConfigError("onceflow repair needs the query's sink: --db FILE, --dsn DSN, --delta DIR, "
                          "--ledger FILE|URL, --kafka HOST:PORT or --iceberg CATALOG_URI (several for a "
                          "query that writes to several sinks)")
    parts = [_one(kind, value, sink_id) for kind, value in given.items()]
    if len(parts) == 1:
        return parts[0]
    from onceflow.sinks._core.several import SeveralSinks

    return SeveralSinks({f"sink{i}": p for i, p in enumerate(parts)})


def _one(kind: str, value: Any, sink_id: str) -> Any:
    """The sink one option names (``kind``: the option, ``value``: its value)."""
    db, dsn, delta, ledger, kafka, iceberg = (value if kind == k else None
                                              for k in ("db", "dsn", "delta", "ledger", "kafka", "iceberg"))
    if iceberg is not None:
        return _iceberg(iceberg, sink_id)
    if kafka is not None:
        from onceflow.sinks.kafka.sink import KafkaTopicsSink

        sink = KafkaTopicsSink(kafka, sink_id=sink_id)  # reads its marker topic; produces nothing
        if not sink.has_marker_topic():  # else a wrong address or id would look like an empty sink
            raise ConfigError(f"no marker topic {sink.marker_topic} on the brokers {kafka}: give the brokers "
                              "and --sink-id the query writes with")
        still = sink.wait_settled()  # a commit whose markers the broker is writing: its batch counts
        if still:
            click.echo(f"onceflow repair: a transaction is open on {sink.marker_topic} (partitions {still}): "
                       "a driver that is still running or was killed inside a commit; its batch is not "
                       "committed and is read as missing (stop the query first)", err=True)
        return sink
    from onceflow.sinks.http.ledger import is_dsn

    for path in (db, delta, None if ledger is None or is_dsn(ledger) else Path(ledger)):
        if path is not None and not path.exists():
            raise ConfigError(f"no sink at {path}: give the path the query writes to (a database restored "
                              "from a backup goes back in its place first)")
    if db is not None:
        from onceflow.sinks.sqlite.sink import SQLiteTablesSink

        return SQLiteTablesSink(db, sink_id=sink_id, staged=False)
    if delta is not None:
        from onceflow.sinks.delta.sink import DeltaTablesSink

        return DeltaTablesSink(delta, sink_id=sink_id)
    if ledger is not None:
        return _LedgerMarkers(ledger, sink_id)
    from onceflow.sinks.postgres.sink import PostgresTablesSink

    return PostgresTablesSink(dsn or None, sink_id=sink_id)


def _iceberg(options: dict[str, Any], sink_id: str) -> Any:
    """The Iceberg sink of ``--iceberg``, ``--warehouse``, ``--namespace``, ``--catalog-name``.

    Raises:
        ConfigError: No ``--warehouse``, or the namespace was never bound to this sink id (a wrong
            catalog, namespace or sink id would look like an empty sink).
    """
    from onceflow.sinks.iceberg.sink import IcebergTablesSink

    if options["warehouse"] is None:
        raise ConfigError("--iceberg needs --warehouse DIR (the sink's warehouse, as in onceflow.iceberg)")
    sink = IcebergTablesSink(options["uri"], options["warehouse"], namespace=options["namespace"],
                             sink_id=sink_id, catalog_name=options["catalog_name"])
    if sink.bound_query() is None:
        raise ConfigError(f"the namespace {sink.namespace!r} of the Iceberg catalog {sink.where} (catalog "
                          f"name {sink.catalog_name!r}) holds no sink {sink_id!r}: give the catalog, "
                          "--namespace, --catalog-name and --sink-id the query writes with")
    return sink


class _LedgerMarkers:
    """An HTTP sink's markers in its ledger (a SQLite file or a PostgreSQL URL), as a sink's ``batches()``."""

    def __init__(self, ledger: str, sink_id: str) -> None:
        self.ledger, self.sink_id = ledger, sink_id

    def repair_options(self) -> str:
        """``--ledger LEDGER --sink-id ID``."""
        return f"--ledger {self.ledger} --sink-id {self.sink_id}"

    def batches(self) -> list[dict[str, Any]]:
        from onceflow.sinks.http.ledger import read_batches

        return read_batches(self.ledger, self.sink_id)


@click.command()
@click.option("--checkpoint", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The query's Spark checkpoint directory.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="A SQLite sink's database.")
@click.option("--dsn", help="A PostgreSQL sink's connection string ('' for $ONCEFLOW_PG_DSN).")
@click.option("--delta", type=click.Path(file_okay=False, path_type=Path), help="A Delta sink's root.")
@click.option("--ledger", metavar="PATH|URL",
              help="An HTTP sink's ledger: a SQLite file or a PostgreSQL postgresql:// URL.")
@click.option("--kafka", metavar="HOST:PORT", help="A Kafka sink's brokers (its markers: the topic "
              "onceflow_batches.<sink id>).")
@click.option("--iceberg", "iceberg_uri", metavar="CATALOG_URI",
              help="An Iceberg sink's SQL catalog database (sqlite:////path/catalog.db or "
                   "postgresql+psycopg://user@host/db; its markers: the tables' properties and snapshots).")
@click.option("--warehouse", type=click.Path(file_okay=False, path_type=Path),
              help="With --iceberg: the sink's warehouse directory.")
@click.option("--namespace", default="onceflow", show_default=True,
              help="With --iceberg: the tables' namespace.")
@click.option("--catalog-name", default="onceflow", show_default=True,
              help="With --iceberg: the catalog's name (onceflow.iceberg's catalog_name).")
@click.option("--sink-id", default="default", show_default=True,
              help="The sink's id (write_stream's sink_id; onceflow run writes under 'user_counts').")
@click.option("--dry-run", is_flag=True, help="Print what would change, change nothing.")
def repair(checkpoint: Path, db: Path | None, dsn: str | None, delta: Path | None, ledger: str | None,
           kafka: str | None, iceberg_uri: str | None, warehouse: Path | None, namespace: str,
           catalog_name: str, sink_id: str, dry_run: bool) -> None:
    """Bring a query's checkpoint back into agreement with its sink after either was restored.

    The sink behind (its database restored from an older backup): the checkpoint is rewound to
    the sink's last batch, and the next start writes the batches the sink lacks, once. The sink
    ahead (the checkpoint restored from an older copy): the plans of the sink's batches are
    written back into the checkpoint from the sink's markers, so that Spark runs them over the
    same input and the sink skips them. Where it cannot (a source's data gone, state Spark no
    longer keeps), it says why and changes nothing. Stop the query first (docs: Recovery).
    """
    from onceflow.checkpoint.repair import Repair

    if not (checkpoint / "metadata").exists():
        raise ConfigError(f"{checkpoint} is not a Spark checkpoint of a started query (no metadata file)")
    iceberg = None if iceberg_uri is None else {"uri": iceberg_uri, "warehouse": warehouse,
                                                 "namespace": namespace, "catalog_name": catalog_name}
    sink = _sink(db, dsn, delta, ledger, kafka, sink_id, iceberg)
    fixer = Repair(checkpoint, sink)
    plan = fixer.plan()
    click.echo(f"onceflow repair: {plan.summary}" if plan.summary else "onceflow repair:")
    if plan.refused:
        fixer.apply(plan)  # raises: says why, changes nothing
    for note in plan.notes:
        click.echo(f"  note: {note}")
    if not plan.changes:
        return
    if dry_run:
        for p in plan.remove:
            click.echo(f"  would remove {p.relative_to(checkpoint)}")
        for r in plan.restore:
            click.echo(f"  would restore offsets/{r.batch_id} from the sink's marker ({r.describe()})")
        for directory, log_id, entries in plan.mend:
            click.echo(f"  would restore {directory.relative_to(checkpoint)}/{log_id} from the sink's "
                       f"markers ({len(entries)} file(s))")
        click.echo("dry run: nothing changed")
        return
    for line in fixer.apply(plan):
        click.echo(f"  {line}")
    click.echo("done: start the query again on the same checkpoint")
