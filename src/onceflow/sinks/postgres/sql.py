"""PostgreSQL plumbing shared by onceflow's Postgres sinks.

Connections (DSN from an option or ``ONCEFLOW_PG_DSN``; passwords never reach a
message), the sink metadata tables, and the two operations every sink's commit
protocol is built from: binding a sink to a checkpoint and the per-batch marker.

Metadata tables (created on first use, in the connection's current schema):

* ``onceflow_sinks(sink_id, query_id, bound_ms)`` — which checkpoint a sink belongs to;
* ``onceflow_batches(sink_id, batch_id, …metrics)`` — one marker per committed batch,
  the same columns as the SQLite sink's table;
* ``onceflow_decisions(sink_id, batch_id, gids)`` — the two-phase-commit coordinator's
  decisions (which prepared transactions make up a committed batch).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from onceflow.errors import CheckpointMismatchError, ConfigError, PostgresError
from onceflow.sinks._core import marker, owners
from onceflow.sinks._core.checks import check_existing, expected_columns
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres.conn import DSN_ENV, connect, redact, resolve_dsn, scrub

__all__ = ["DSN_ENV", "PostgresError", "connect", "redact", "resolve_dsn", "scrub"]

SINK_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

META_DDL = f"""
CREATE TABLE IF NOT EXISTS onceflow_sinks(
    sink_id text PRIMARY KEY, query_id text NOT NULL, bound_ms bigint NOT NULL);
{marker.create_table_sql("bigint", "text")}
ALTER TABLE onceflow_batches ADD COLUMN IF NOT EXISTS tables text;
ALTER TABLE onceflow_batches ADD COLUMN IF NOT EXISTS rejected_rows bigint;
ALTER TABLE onceflow_batches ADD COLUMN IF NOT EXISTS input_range text;
{owners.create_sql("bigint", "text")};
CREATE TABLE IF NOT EXISTS onceflow_decisions(
    sink_id text NOT NULL, batch_id bigint NOT NULL, gids text[] NOT NULL,
    decided_ms bigint NOT NULL, PRIMARY KEY(sink_id, batch_id));
CREATE TABLE IF NOT EXISTS onceflow_stage_winners(
    sink_id text NOT NULL, batch_id bigint NOT NULL, tbl text NOT NULL, tokens text[] NOT NULL,
    rows bigint NOT NULL, skipped boolean NOT NULL, PRIMARY KEY(sink_id, batch_id, tbl));
"""



def pg_type(typ: pa.DataType) -> str:
    """The PostgreSQL column type an Arrow type is stored as.

    Raises:
        ConfigError: A type the sink cannot write.
    """
    if pa.types.is_dictionary(typ):
        return pg_type(typ.value_type)
    simple = {pa.int8(): "smallint", pa.int16(): "smallint", pa.int32(): "integer", pa.int64(): "bigint",
              pa.uint8(): "smallint", pa.uint16(): "integer", pa.uint32(): "bigint", pa.float32(): "real",
              pa.float64(): "double precision", pa.bool_(): "boolean", pa.string(): "text",
              pa.large_string(): "text", pa.date32(): "date"}
    if typ in simple:
        return simple[typ]
    if pa.types.is_timestamp(typ):
        return "timestamptz" if typ.tz else "timestamp"
    if pa.types.is_decimal(typ):
        return f"numeric({typ.precision}, {typ.scale})"
    raise ConfigError(f"type {typ} cannot be written to a PostgreSQL column by onceflow; cast or select it")


def check_sink_id(sink_id: str) -> str:
    """Validate a sink id (it is stored, and embedded in transaction ids).

    Args:
        sink_id: The id.

    Returns:
        The id.

    Raises:
        ConfigError: Empty, too long or with characters outside ``[A-Za-z0-9_.-]``.
    """
    if not SINK_ID_RE.match(sink_id or ""):
        raise ConfigError(
            f"sink id {sink_id!r} is invalid: use 1-64 characters from A-Z a-z 0-9 _ . -"
        )
    return sink_id


NAME_BYTES = 63
"""PostgreSQL's identifier limit (``NAMEDATALEN - 1``): a longer name is cut to it silently."""


def derived_name(name: str, prefix: str = "", suffix: str = "") -> str:
    """A name onceflow derives from a table's (a staging or temporary table), within 63 bytes.

    When ``prefix + name + suffix`` is longer, the table's name is cut (at a character
    boundary) and a digest of the whole name goes before the suffix, so two long names that
    share their first bytes never derive the same name.
    """
    full = prefix + name + suffix
    if len(full.encode()) <= NAME_BYTES:
        return full
    digest = "_" + hashlib.sha256(full.encode()).hexdigest()[:12]
    room = NAME_BYTES - len((prefix + digest + suffix).encode())
    cut = name.encode()[:room].decode(errors="ignore")
    return prefix + cut + digest + suffix


def check_names(specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema],
                sink_id: str | None = None) -> None:
    """Refuse table and column names PostgreSQL would cut to 63 bytes (before the query starts).

    Two tables whose names share their first 63 bytes would be one table, and a long column
    name would be stored cut and not be found by the next run's check.

    Args:
        specs: Table name -> spec.
        schemas: Table name -> its output's columns, where known.
        sink_id: The executor sink's id: each table's marker ``<sink_id>.<table>`` must be a
            valid sink id too.

    Raises:
        ConfigError: Naming the table or column, its length in bytes and the limit.
    """
    for name in specs:
        schema = schemas.get(name)
        names = [("table", name, name), *(("column", c, name) for c in (schema.names if schema else ()))]
        for what, value, table in names:
            size = len(value.encode())
            if size > NAME_BYTES:
                where = "" if what == "table" else f" of table {table!r}"
                raise ConfigError(
                    f"{what} name {value!r}{where} is {size} bytes; PostgreSQL keeps only the first "
                    f"{NAME_BYTES} bytes of a name (NAMEDATALEN - 1), so it would become another name. "
                    f"Use a name of at most {NAME_BYTES} bytes (alias the column in the query)")
        if sink_id is not None and not SINK_ID_RE.match(f"{sink_id}.{name}"):
            raise ConfigError(f"table {name!r} with sink id {sink_id!r}: the table's marker "
                              f"{sink_id + '.' + name!r} must be 1-64 characters from A-Z a-z 0-9 _ . -; "
                              "use a shorter sink id or table name")


def claim_tables(conn: Any, where: str, sink_id: str, specs: Mapping[str, Table], tool: str) -> None:
    """:func:`onceflow.sinks._core.owners.claim` in PostgreSQL: one transaction, under an advisory lock.

    Raises:
        ConfigError: Another sink id writes a table (:func:`onceflow.sinks._core.owners.refusal`).
    """
    ensure_meta(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow_tables'))")
        owners.claim(
            lambda t: [(s, bool(f)) for s, f in conn.execute(
                f"SELECT sink_id, shared FROM {owners.TABLE} WHERE table_name = %s", (t,))],
            lambda t, s: conn.execute(f"INSERT INTO {owners.TABLE} VALUES (%s, %s, %s, %s) ON CONFLICT "
                                      "(table_name, sink_id) DO UPDATE SET shared = EXCLUDED.shared",
                                      (t, sink_id, int(s), owners.now_ms())),
            where, sink_id, specs, tool)


def list_owners(conn: Any) -> list[tuple[str, str, bool, int]]:
    """Every row of the registry: ``(table, sink_id, shared, claimed_ms)``."""
    ensure_meta(conn)
    return [(t, s, bool(f), int(m)) for t, s, f, m in conn.execute(
        f"SELECT table_name, sink_id, shared, claimed_ms FROM {owners.TABLE} ORDER BY 1, 2")]


def hand_over(conn: Any, table: str, to: str) -> list[str]:
    """Give ``table`` to sink id ``to`` (:mod:`onceflow.sinks._core.owners`); the sink ids that held it."""
    ensure_meta(conn)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow_tables'))")
        before = [r[0] for r in conn.execute(f"SELECT sink_id FROM {owners.TABLE} WHERE table_name = %s",
                                             (table,))]
        conn.execute(f"DELETE FROM {owners.TABLE} WHERE table_name = %s", (table,))
        conn.execute(f"INSERT INTO {owners.TABLE} VALUES (%s, %s, 0, %s)", (table, to, owners.now_ms()))
    return before


def ensure_meta(conn: Any) -> None:
    """Create the metadata tables if missing (idempotent, concurrency-safe).

    Args:
        conn: An autocommit connection.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow:ddl'))")
        conn.execute(META_DDL)
        strict = conn.execute(  # an older onceflow made the metrics NOT NULL: now NULL is "unknown"
            "SELECT attname FROM pg_attribute WHERE attrelid = 'onceflow_batches'::regclass "
            "AND attnotnull AND attname = ANY(%s)", (list(marker.METRICS),)).fetchall()
        for (col,) in strict:
            conn.execute(f"ALTER TABLE onceflow_batches ALTER COLUMN {col} DROP NOT NULL")  # a METRICS name


def lock_sink(conn: Any, sink_id: str) -> None:
    """Serialize writers of one sink until the current transaction ends.

    Args:
        conn: A connection inside a transaction.
        sink_id: The sink.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow:sink:' || %s))", (sink_id,))


def bind_sink(conn: Any, sink_id: str, query_id: str, where: str) -> None:
    """Tie ``sink_id`` to the checkpoint ``query_id`` (idempotent).

    Args:
        conn: An autocommit connection.
        sink_id: The sink.
        query_id: The checkpoint's query id.
        where: How to name the database in an error (no password).

    Raises:
        CheckpointMismatchError: The sink belongs to another checkpoint.
    """
    with conn.transaction():
        lock_sink(conn, sink_id)
        row = conn.execute(
            "SELECT query_id FROM onceflow_sinks WHERE sink_id = %s", (sink_id,)
        ).fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO onceflow_sinks VALUES (%s, %s, %s)",
                (sink_id, query_id, int(time.time() * 1000)),
            )
        elif row[0] != query_id:
            raise CheckpointMismatchError(
                f"PostgreSQL ({where}) holds sink {sink_id!r} of the checkpoint with query id "
                f"{row[0]}, but this run's checkpoint has query id {query_id}. A new checkpoint "
                "restarts batch ids at 0, so continuing would skip or double-count data. Run "
                "with the original checkpoint, or use a different sink id for the new one."
            )


def has_marker(conn: Any, sink_id: str, batch_id: int) -> bool:
    """Whether batch ``batch_id`` of ``sink_id`` was committed.

    Args:
        conn: A connection.
        sink_id: The sink.
        batch_id: The micro-batch.

    Returns:
        True when its marker exists.
    """
    return conn.execute(
        "SELECT 1 FROM onceflow_batches WHERE sink_id = %s AND batch_id = %s", (sink_id, batch_id)
    ).fetchone() is not None


def insert_marker(conn: Any, sink_id: str, batch_id: int, metrics: dict[str, int | None]) -> None:
    """Insert the marker of a committed batch (inside the batch's transaction).

    Args:
        conn: A connection inside the batch's transaction.
        sink_id: The sink.
        batch_id: The micro-batch.
        metrics: Values for :data:`onceflow.sinks._core.marker.METRICS` (missing ones are NULL).
    """
    values = [metrics.get(c) for c in marker.METRICS]
    places = ", ".join(["%s"] * (3 + len(values)))
    conn.execute(
        f"INSERT INTO {marker.TABLE}(sink_id, batch_id, committed_ms, {', '.join(marker.METRICS)}) "
        f"VALUES ({places}) ON CONFLICT (sink_id, batch_id) DO NOTHING",
        (sink_id, batch_id, int(time.time() * 1000), *values),
    )


def existing_table(conn: Any, name: str) -> tuple[list[str], list[str]] | None:
    """A table of the current schema: its columns and primary key columns; None if it does not exist.

    Args:
        conn: A connection.
        name: The table's name (as given in ``tables=``).
    """
    have = [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = %s", (name,))]
    if not have:
        return None
    pk = [r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary", (name,))]
    return have, pk


def check_tables(conn: Any, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
    """The start-up check of a PostgreSQL sink: every table that exists fits its spec and columns.

    Raises:
        ConfigError: See :func:`onceflow.sinks._core.checks.check_existing` (names: :func:`check_names`).
    """
    for name, spec in specs.items():
        found = existing_table(conn, name)
        if found is not None:
            check_existing("PostgreSQL", name, spec, expected_columns(name, spec, schemas), *found)


def table_body(types: Mapping[str, str], key: Sequence[str]) -> Any:
    """A ``CREATE TABLE``'s body: every column with its type, then the key as primary key.

    Args:
        types: Column name to PostgreSQL type, in table order (types come from onceflow's own
            type mapping, never from user text).
        key: The primary key's columns (none: no primary key).
    """
    from psycopg import sql

    body = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in types.items()]
    if key:
        body.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))))
    return sql.SQL(", ").join(body)


def on_conflict(columns: Sequence[str], key: Sequence[str], target: Any,
                merged: Mapping[str, str] | None = None, *, update: bool = True) -> Any:
    """An ``INSERT``'s ``ON CONFLICT (key) ...`` clause (with a leading space).

    Args:
        columns: The inserted columns.
        key: The conflict target (the table's primary key).
        target: The target table's identifier.
        merged: Merged columns (``add``/``max``/``min``, see :func:`merge_expr`); every other
            non-key column takes the new row's value.
        update: ``False``: ``DO NOTHING`` (an append keyed by a primary key).
    """
    from psycopg import sql

    rest = [c for c in columns if c not in key] if update else []
    how = merged or {}
    sets = [sql.SQL("{} = ").format(sql.Identifier(c)) + merge_expr(c, how[c], target) if c in how
            else sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest]
    action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(sets)) if sets else sql.SQL("DO NOTHING")
    return sql.SQL(" ON CONFLICT ({}) {}").format(sql.SQL(", ").join(map(sql.Identifier, key)), action)


def merge_expr(column: str, how: str, target: Any) -> Any:
    """The stored value of a merged column after a batch, in an ``ON CONFLICT DO UPDATE``.

    Nulls are ignored as SQL's aggregates ignore them (``GREATEST``/``LEAST`` already do).

    Args:
        column: The column.
        how: ``add``, ``max`` or ``min``.
        target: The target table's identifier (the stored row's qualifier).
    """
    from psycopg import sql

    old = sql.SQL("{}.{}").format(target, sql.Identifier(column))
    new = sql.SQL("EXCLUDED.{}").format(sql.Identifier(column))
    if how == "add":
        return sql.SQL("coalesce({0} + {1}, {0}, {1})").format(old, new)
    return sql.SQL("GREATEST({}, {})" if how == "max" else "LEAST({}, {})").format(old, new)


@contextmanager
def session(dsn: str) -> Iterator[Any]:
    """An autocommit connection with the metadata tables in place, closed afterwards.

    Args:
        dsn: Connection string.

    Yields:
        The connection.
    """
    conn = connect(dsn)
    try:
        ensure_meta(conn)
        yield conn
    finally:
        conn.close()


def read_batches(dsn: str, sink_id: str) -> list[dict[str, int]]:
    """The markers and metrics of one sink, in batch order.

    Args:
        dsn: Connection string.
        sink_id: The sink.

    Returns:
        One dict per committed batch.
    """
    from psycopg.rows import dict_row

    with session(dsn) as conn:
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(
            "SELECT * FROM onceflow_batches WHERE sink_id = %s ORDER BY batch_id", (sink_id,)
        ).fetchall()
    return [dict(r) for r in rows]


def prepared_gids(conn: Any, prefix: str) -> list[str]:
    """Prepared (two-phase) transactions whose id starts with ``prefix``.

    Args:
        conn: A connection.
        prefix: Transaction id prefix.

    Returns:
        Their ids, sorted.
    """
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY gid", (prefix,)
    ).fetchall()
    return [r[0] for r in rows]


def max_prepared_transactions(conn: Any) -> int:
    """The server's ``max_prepared_transactions`` setting.

    Args:
        conn: A connection.

    Returns:
        The setting (0 means two-phase commit is disabled).
    """
    return int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])


def require_prepared(conn: Any) -> None:
    """Refuse protocol ``2pc`` on a server without prepared transactions.

    Raises:
        PostgresError: ``max_prepared_transactions`` is 0, with what to set.
    """
    if max_prepared_transactions(conn) == 0:
        raise PostgresError(
            "protocol '2pc' needs PREPARE TRANSACTION, but the server has max_prepared_transactions = 0. "
            "Set it (e.g. max_prepared_transactions = 64 in postgresql.conf, at least the number of Spark "
            "tasks per batch) and restart PostgreSQL, or use protocol 'staged'.")


def copy_arrow(conn: Any, table: Any, columns: list[str], data: Any) -> int:
    """COPY an Arrow table or record batch into ``table`` (CSV, written by Arrow's C++ writer).

    Args:
        conn: A connection (inside the caller's transaction, if any).
        table: A ``psycopg.sql.Composable`` naming the target table.
        columns: Target column names, in the order of ``data``'s columns.
        data: A ``pyarrow.Table`` or ``pyarrow.RecordBatch``.

    Returns:
        Rows copied.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    from psycopg import sql

    if data.num_rows == 0:
        return 0
    sink = pa.BufferOutputStream()
    # Every non-null value quoted: an unquoted empty field is NULL to PostgreSQL, "" is ''.
    pacsv.write_csv(data, sink, pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        table, sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        copy.write(memoryview(sink.getvalue()))
    return int(data.num_rows)
