"""``onceflow rejects``: the bad records a query routed to its ``rejects=`` table, per batch or one by one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from onceflow.engine.rejects import COLUMNS
from onceflow.errors import ConfigError


def _read(db: Path | None, dsn: str | None, delta: Path | None, table: str,
          iceberg: tuple[str, Path, str] | None = None) -> list[dict[str, Any]]:
    """Every row of the rejects table ``table`` in one backend (ordered by batch and coordinates)."""
    if not table.replace("_", "a").isalnum():
        raise ConfigError(f"--table {table!r}: a table name is letters, digits and _")
    order = "ORDER BY batch_id, topic, partition, \"offset\", file, row"
    select = f"SELECT {', '.join(_quoted(c) for c in COLUMNS)} FROM {table} {order}"
    if db is not None:
        import sqlite3

        if not db.exists():
            raise ConfigError(f"no database at {db}")
        conn = sqlite3.connect(db)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(select)]
        except sqlite3.OperationalError as exc:
            raise ConfigError(f"{db}: cannot read table {table!r} ({exc}); is it the rejects= table?") \
                from None
        finally:
            conn.close()
    if dsn is not None:
        from psycopg.rows import dict_row

        from onceflow.sinks.postgres.conn import connect, resolve_dsn

        with connect(resolve_dsn(dsn or None)) as conn:
            try:
                return [dict(r) for r in conn.cursor(row_factory=dict_row).execute(select).fetchall()]
            except Exception as exc:  # psycopg.Error: no such table
                raise ConfigError(f"cannot read table {table!r}: {str(exc).splitlines()[0]}") from None
    if iceberg is not None:
        rows = _iceberg_rows(*iceberg, table)
    else:
        assert delta is not None
        from deltalake import DeltaTable

        try:
            rows = DeltaTable(str(delta / table)).to_pyarrow_table().to_pylist()
        except Exception as exc:  # deltalake.TableNotFoundError
            raise ConfigError(f"no Delta table {table!r} under {delta}: {exc}") from None
    return sorted(rows, key=lambda r: (r["batch_id"], r["topic"] or "", r["partition"] or 0, r["offset"] or 0,
                                       r["file"] or "", r["row"] or 0))


def _iceberg_rows(uri: str, warehouse: Path, namespace: str, table: str) -> list[dict[str, Any]]:
    """The rows of Iceberg table ``namespace.table`` in the catalog at ``uri`` (read, nothing created)."""
    from onceflow.sinks.iceberg.sink import IcebergTablesSink

    file = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    if file is not None and not Path(file).exists():
        raise ConfigError(f"--iceberg {uri}: there is no catalog database {file}")
    try:
        catalog = IcebergTablesSink(uri, warehouse, namespace=namespace).open_catalog()
        found = catalog.load_table((namespace, table))
    except Exception as exc:  # pyiceberg's NoSuchTableError / NoSuchNamespaceError
        raise ConfigError(f"no Iceberg table {namespace}.{table} in the catalog {uri}: {exc}") from None
    return found.scan().to_arrow().to_pylist()  # type: ignore[no-any-return]


def readable(row: dict[str, Any]) -> dict[str, Any]:
    """A rejects row as ``--records`` prints it: Kafka headers' values as text where they are UTF-8.

    The table keeps each header value as JSON keeps bytes (base64, the bytes as given); a value
    that is UTF-8 text is printed as ``value``, any other as ``value_base64``.
    """
    import base64
    import binascii

    if not row.get("headers"):
        return row
    try:
        headers = json.loads(row["headers"])
    except (TypeError, ValueError):
        return row
    shown = []
    for header in headers if isinstance(headers, list) else []:
        raw = header.get("value") if isinstance(header, dict) else None
        if raw is None:
            shown.append(header)
            continue
        try:
            text = base64.b64decode(raw, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, TypeError):
            shown.append({"key": header.get("key"), "value_base64": raw})
            continue
        shown.append({"key": header.get("key"), "value": text})
    return {**row, "headers": shown}


def _quoted(column: str) -> str:
    return f'"{column}"' if column in ("column", "offset", "partition", "row") else column


@click.command()
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), help="A SQLite sink's database.")
@click.option("--dsn", help="A PostgreSQL sink's connection string ('' for $ONCEFLOW_PG_DSN).")
@click.option("--delta", type=click.Path(file_okay=False, path_type=Path), help="A Delta sink's root.")
@click.option("--iceberg", metavar="CATALOG_URI",
              help="An Iceberg sink's catalog (a SQLAlchemy URI, as onceflow.iceberg takes it), "
                   "with --warehouse.")
@click.option("--warehouse", type=click.Path(file_okay=False, path_type=Path),
              help="The Iceberg catalog's warehouse directory (with --iceberg).")
@click.option("--namespace", default="onceflow", show_default=True, help="The Iceberg tables' namespace.")
@click.option("--table", default="rejected", show_default=True, help="The rejects= table's name.")
@click.option("--batch", "batch_id", type=int, help="Only this micro-batch.")
@click.option("--rule", help="Only records that broke this rule (parse, required, check, id, event_time).")
@click.option("--records", is_flag=True,
              help="Print the records themselves, one JSON object per line (to fix and send again), "
                   "instead of the counts per batch.")
def rejects(db: Path | None, dsn: str | None, delta: Path | None, iceberg: str | None, warehouse: Path | None,
            namespace: str, table: str, batch_id: int | None, rule: str | None, records: bool) -> None:
    """List the bad records a query routed to its rejects table: per batch and rule, or one by one.

    Each row names the record's coordinates (Kafka topic/partition/offset, or file and row), the
    rule it broke and why; --records prints them with their raw value, to fix and send again
    (docs: Bad records). Kafka headers print as text where they are UTF-8.
    """
    if sum(x is not None for x in (db, dsn, delta, iceberg)) != 1:
        raise ConfigError("onceflow rejects needs exactly one of --db FILE, --dsn DSN, --delta DIR or "
                          "--iceberg URI --warehouse DIR")
    if (iceberg is None) != (warehouse is None):
        raise ConfigError("--iceberg CATALOG_URI and --warehouse DIR go together (an Iceberg sink's catalog)")
    where = (iceberg, warehouse, namespace) if iceberg is not None and warehouse is not None else None
    rows = [r for r in _read(db, dsn, delta, table, where)
            if (batch_id is None or r["batch_id"] == batch_id) and (rule is None or r["rule"] == rule)]
    if records:
        for r in rows:
            click.echo(json.dumps(readable(r), sort_keys=True, default=str))
        return
    from rich.console import Console
    from rich.table import Table as RichTable

    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((int(r["batch_id"]), str(r["rule"]), str(r["column"])), []).append(r)
    out = RichTable(title=f"rejected records in {table!r}")
    for col in ("batch", "rule", "column", "records", "first record", "reason"):
        out.add_column(col, justify="right" if col in ("batch", "records") else "left")
    for (batch, why, column), found in groups.items():
        first = found[0]
        out.add_row(str(batch), why, column, str(len(found)), str(first["record"]), str(first["reason"]))
    Console().print(out)
    batches = len({b for b, _, _ in groups})
    click.echo(f"{len(rows)} rejected records in {batches} batches" +
               (" — print them with --records" if rows and not records else ""))
