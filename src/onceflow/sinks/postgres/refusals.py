"""What PostgreSQL cannot hold, named: a NUL in text, an ``add`` sum leaving bigint.

A batch the server would refuse is refused whole, before or instead of its commit, with the
table, the column, the row's key and the value — whichever path wrote it: rows collected to the
driver (checked before the write: :func:`check_text`), rows staged by Spark's tasks (a task's
COPY refused: :func:`refuse_nul`; the batch's move refused: :func:`staged_overflow`), or rows
written by the tasks straight into the tables (:func:`refuse_overflow`). Each diagnosis runs only
on the error path; the refusal stands without it when it finds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core.checks import row_name
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres import stage
from onceflow.sinks.postgres.writer import TargetSpec

INTEGER_TYPES = ("smallint", "integer", "bigint")
"""PostgreSQL's integer column types: an ``add`` sum of them can leave bigint."""


def integer_adds(spec: Table, types: Mapping[str, str]) -> list[str]:
    """The table's ``add`` columns stored as integers (``types``: column -> PostgreSQL type); none unkeyed.

    The one rule of every overflow diagnosis: only a keyed merge adds to a stored value.
    """
    if not spec.key:
        return []
    return [c for c in spec.add if types.get(c, "").lower() in INTEGER_TYPES]


def arrow_types(schema: pa.Schema, columns: Sequence[str]) -> dict[str, str]:
    """``columns`` of an Arrow schema (those it has) as the PostgreSQL types the sink stores them as."""
    return {c: pg.pg_type(schema.field(c).type) for c in columns if c in schema.names}


def check_text(name: str, spec: Table, rows: pa.Table) -> None:
    """Refuse a string with a NUL character (step 1): PostgreSQL's text cannot hold one.

    Raises:
        BatchRejectedError: Naming the table, the column, the row's key and the value.
    """
    import pyarrow.compute as pc

    for col in rows.column_names:
        values = rows.column(col)
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
        if not text or not rows.num_rows:
            continue
        hits = pc.indices_nonzero(pc.match_substring(values, "\x00").fill_null(False))
        if len(hits):
            i = int(hits[0].as_py())
            row = rows.slice(i, 1).to_pylist()[0]
            where = row_name(rows, spec, i)
            raise BatchRejectedError(
                f"table {name!r}: column {col!r} of {where} holds {row[col]!r}, with a NUL character "
                "(0x00), which PostgreSQL's text cannot hold; nothing of the batch was written. Remove it in "
                "the query (F.regexp_replace(col, '\\x00', '')) or write the column as binary", row=row)


def refuse_nul(name: str, spec: Table, frame: Any) -> None:
    """After a task's COPY refused a NUL (0x00): the first row with one, as :func:`check_text` names it.

    Raises:
        BatchRejectedError: When such a row is found (else the caller raises the task's error).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    texts = [f.name for f in frame.schema.fields if isinstance(f.dataType, T.StringType)]
    if not texts:
        return
    hit = F.lit(False)
    for c in texts:
        hit = hit | F.coalesce(F.col(f"`{c}`").contains("\u0000"), F.lit(False))
    found = frame.where(hit).limit(1).collect()
    if found:
        check_text(name, spec, pa.Table.from_pylist([found[0].asDict()]))


def refuse_overflow(dsn: str, name: str, spec: Table, frame: Any) -> None:
    """After the server refused a merge (bigint out of range): the first key whose ``add`` sum overflows.

    Only the batch's rows that could overflow against the table's largest (smallest) stored
    value are read to the driver (at most 1,000 per column), each then compared with its stored
    row.

    Raises:
        BatchRejectedError: Naming the table, the column, the key, the stored and the batch's value.
    """
    from psycopg import sql
    from pyspark.sql import functions as F

    from onceflow.sinks._core.checks import arrow_schema

    cols = integer_adds(spec, arrow_types(arrow_schema(frame.schema), spec.add))
    if not cols:
        return
    low, high = -(2**63), 2**63 - 1
    match = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in spec.key)
    with pg.session(dsn) as conn:
        for c in cols:
            lo, hi = conn.execute(sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(
                sql.Identifier(c), sql.Identifier(name))).fetchone()
            if lo is None:
                continue
            col = F.col(f"`{c}`")
            near = frame.where((col > high - max(int(hi), 0)) | (col < low - min(int(lo), 0)))
            for r in near.select(*[F.col(f"`{k}`") for k in spec.key], col).limit(1000).collect():
                key = {k: r[k] for k in spec.key}
                found = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {}").format(
                    sql.Identifier(c), sql.Identifier(name), match), list(key.values())).fetchone()
                if found and found[0] is not None and r[c] is not None and not low <= found[0] + r[c] <= high:
                    raise BatchRejectedError(
                        f"table {name!r}: add column {c!r} of the row with key {key} would become "
                        f"{found[0]} + {r[c]} = {found[0] + r[c]}, outside PostgreSQL's bigint; nothing of "
                        "the batch was written", row=r.asDict())


def overflowing(conn: Any, name: str, spec: Table, cols: Sequence[str], source: Any,
                 params: Sequence[Any]) -> str | None:
    """The end of a bigint refusal: the first row of ``source`` whose sum with the stored row leaves bigint.

    ``source`` is a relation with the key and the ``add`` columns ``cols``; None: no such row.
    Runs inside the batch's transaction, in the server: nothing of the batch is read again.
    """
    from psycopg import sql

    on = sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in spec.key)
    keys = sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(k)) for k in spec.key)
    for c in cols:
        found = conn.execute(sql.SQL(
            "SELECT {keys}, t.{c}, s.{c} FROM {target} t JOIN {source} s ON {on} WHERE "
            "t.{c}::numeric + s.{c}::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 "
            "LIMIT 1").format(keys=keys, c=sql.Identifier(c), target=sql.Identifier(name), source=source,
                              on=on), list(params)).fetchone()
        if found:
            key = dict(zip(spec.key, found[:len(spec.key)], strict=True))
            old, new = found[-2], found[-1]
            return (f": add column {c!r} of the row with key {key} would become {old} + {new} = "
                    f"{old + new}, outside PostgreSQL's bigint")
    return None


def collected_overflow(conn: Any, name: str, spec: Table, rows: pa.Table) -> str | None:
    """Which key's integer ``add`` column left 64 bits (after the server refused the merge), or None.

    Runs in the batch's transaction after the failed savepoint (the caller then refuses the
    batch, so the transaction rolls back): the batch's keys and ``add`` values go into a
    temporary table, joined with the stored rows (:func:`overflowing`).
    """
    from psycopg import sql

    cols = integer_adds(spec, arrow_types(rows.schema, spec.add))
    if not cols:
        return None
    names = [*spec.key, *cols]
    tmp = sql.Identifier(pg.derived_name(name, prefix="onceflow_chk_"))
    made = sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
    try:
        with conn.transaction():
            listed = sql.SQL(", ").join(map(sql.Identifier, names))
            conn.execute(made.format(tmp, listed, sql.Identifier(name)))
            pg.copy_arrow(conn, tmp, names, rows.select(names))
            return overflowing(conn, name, spec, cols, tmp, ())
    except Exception:  # noqa: BLE001 - the diagnosis is a courtesy; the refusal stands without it
        return None



def staged_overflow(conn: Any, name: str, spec: Table, target: TargetSpec, batch_id: int) -> str | None:
    """:func:`collected_overflow` for a staged batch, after its failed move: its winners' staged rows."""
    cols = integer_adds(spec, dict(zip(target.columns, target.types, strict=True)))
    if not cols:
        return None
    try:
        with conn.transaction():
            staged = stage.winners(conn, target, batch_id)
            return None if staged is None else overflowing(conn, name, spec, cols, *staged)
    except Exception:  # noqa: BLE001 - the diagnosis is a courtesy; the refusal stands without it
        return None
