"""Every value a SQLite table stores is the value the batch gave, or the batch is refused.

Types: integers and booleans ``INTEGER``, floats and decimals ``REAL``, strings ``TEXT``, binary
``BLOB``, timestamps ``TEXT`` in UTC (``YYYY-MM-DD HH:MM:SS.ffffff``: sorts, compares, and SQLite's
date functions read it), dates ``TEXT``; ``STRICT`` tables; nested types are refused.

SQLite converts some values quietly: a NaN is bound as NULL, ``-0.0`` comes back as ``0.0``
(a REAL with an integral value is stored as an integer), an integer sum past ``2**63-1``
becomes a REAL, a column's type affinity turns the text ``'123'`` into the integer ``123``
(and keeps ``'abc'`` as text in an INTEGER column), a decimal goes through a double. These
checks run in step 1 of the sink's protocol (:mod:`onceflow.sinks.sqlite.sink`), before
anything of the batch is written and before Spark's commit log, and name the table, the
column, the row's key and the value:

* :func:`check_values` — the batch alone: NaN, ``-0.0``, unsigned integers above
  ``2**63-1``, decimals a double does not hold exactly;
* :func:`check_types` — the batch against an existing table's declared column types
  (SQLite's affinity rules); tables onceflow creates are ``STRICT``, so SQLite itself refuses
  a value of another type too;
* :class:`AddBounds` — integer ``add`` columns: a bound on the stored values decides whether
  a batch can overflow; where it can, :meth:`AddBounds.check` reads the stored values of the
  batch's keys (inside the batch's transaction) and refuses a sum outside 64 bits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks._core.checks import first_true, row_name
from onceflow.sinks._core.tables import Table

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

_NOTHING = "; nothing of the batch was written"


def quote(name: str) -> str:
    """A SQLite identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def sql_type(typ: pa.DataType) -> str:
    """The SQLite column type an Arrow type is stored as.

    Raises:
        ConfigError: A nested or otherwise unsupported type.
    """
    if pa.types.is_dictionary(typ):
        return sql_type(typ.value_type)
    if pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        return "INTEGER"
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return "REAL"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_timestamp(typ) \
            or pa.types.is_date(typ):
        return "TEXT"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return "BLOB"
    raise ConfigError(f"type {typ} cannot be stored in a SQLite column; select or flatten it first")


def affinity(declared: str) -> str:
    """A declared column type's affinity, by SQLite's rules (section 3.1 of its datatype page).

    A ``STRICT`` table's ``ANY`` and an undeclared type store every value as given (``BLOB``).
    """
    upper = declared.upper()
    if "INT" in upper:
        return "INTEGER"
    if any(s in upper for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in upper or not upper or upper == "ANY":
        return "BLOB"
    if any(s in upper for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def _fits(stored_as: str, column_affinity: str) -> bool:
    """Whether a value stored as ``stored_as`` keeps its value and type in a column of this affinity."""
    return column_affinity in (stored_as, "BLOB") or (column_affinity == "NUMERIC" and stored_as == "INTEGER")


def check_types(where: str, name: str, schema: pa.Schema, declared: dict[str, str]) -> None:
    """Refuse a batch whose columns an existing table would store as another type.

    Args:
        where: The database (for the message).
        name: The table.
        schema: The batch's columns.
        declared: Column -> its declared type (``PRAGMA table_info``), for the table's columns.

    Raises:
        ConfigError: A column of the batch whose values the table's column would convert.
    """
    for field in schema:
        if field.name not in declared or pa.types.is_null(field.type):
            continue
        typ = declared[field.name]
        stored = sql_type(field.type)
        if not _fits(stored, affinity(typ)):
            raise ConfigError(
                f"table {name!r} in {where}: column {field.name!r} is declared {typ or 'without a type'} "
                f"(SQLite affinity {affinity(typ)}), but the batch's {field.name!r} is {field.type}, stored "
                f"as {stored}; SQLite would convert or mix the values{_NOTHING}. Cast the column in the "
                "query to the table's type, or write to a new table")


def _exists(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() \
        is not None


def check_values(name: str, spec: Table, rows: pa.Table) -> None:
    """Refuse values SQLite would not store as given (step 1).

    Raises:
        BatchRejectedError: Naming the table, the column, the row's key and the value.
    """
    if not rows.num_rows:
        return
    for col in rows.column_names:
        values = rows.column(col)
        typ = values.type
        if pa.types.is_dictionary(typ):
            values, typ = values.cast(typ.value_type), typ.value_type
        bad, why = None, ""
        if typ == pa.uint64():
            too_big = pc.greater(values, pa.scalar(I64_MAX, pa.uint64()))
            bad, why = first_true(too_big), "is above SQLite's largest integer 2**63-1"
        elif pa.types.is_floating(typ):
            bad, why = first_true(pc.is_nan(values)), "is NaN, which SQLite stores as NULL"
            if bad is None:
                inverse = pc.divide(1.0, values.cast(pa.float64()))  # -inf only for -0.0
                negative_zero = pc.and_(pc.equal(values, 0.0), pc.less(inverse, 0))
                bad, why = first_true(negative_zero), ("is -0.0, which SQLite stores as 0.0 (F.col(c) + 0.0 "
                                                    "turns -0.0 into 0.0 in the query)")
        elif pa.types.is_decimal(typ):
            back = as_double(values).cast(typ, safe=False)
            bad, why = first_true(pc.not_equal(values, back)), (
                "has more digits than a SQLite REAL (a double) holds; cast it to double in the query "
                "to store the rounded value, or to string to keep every digit")
        if bad is not None:
            where = row_name(rows, spec, bad)
            raise BatchRejectedError(
                f"table {name!r}: column {col!r} of {where} holds {values[bad].as_py()!r}, "
                f"which {why}{_NOTHING}", row=rows.slice(bad, 1).to_pylist()[0])


class AddBounds:
    """Whether an integer ``add`` column can overflow, and the exact check where it can.

    For each ``(table, column)`` a lower and an upper bound on every stored value: read once
    per process from the table (``min``/``max``), then widened by each accepted batch's
    smallest negative and largest positive value (a key gets at most one row per batch, so
    a stored sum moves by at most that much). While ``low + batch min >= -2**63`` and
    ``high + batch max <= 2**63-1`` no sum can leave 64 bits and the batch may take the
    staged path; else :meth:`check` compares each row with its stored value.
    """

    def __init__(self) -> None:
        self._bounds: dict[tuple[str, str], tuple[int, int]] = {}

    @staticmethod
    def columns(spec: Table, rows: pa.Table) -> list[str]:
        """The integer ``add`` columns of a batch."""
        names = rows.column_names
        return [c for c in spec.add if c in names and pa.types.is_integer(rows.schema.field(c).type)]

    def _bounds_of(self, conn: sqlite3.Connection, name: str, col: str) -> tuple[int, int]:
        if (name, col) not in self._bounds:
            row = conn.execute(f"SELECT min({quote(col)}), max({quote(col)}) FROM {quote(name)}").fetchone() \
                if _exists(conn, name) else None
            low, high = (row or (None, None))
            self._bounds[(name, col)] = (min(int(low or 0), 0), max(int(high or 0), 0))
        return self._bounds[(name, col)]

    @staticmethod
    def _extent(rows: pa.Table, col: str) -> tuple[int, int]:
        lo, hi = pc.min_max(rows.column(col)).values()
        return min(int(lo.as_py() or 0), 0), max(int(hi.as_py() or 0), 0)

    @classmethod
    def extents(cls, spec: Table, rows: pa.Table) -> dict[str, tuple[int, int]]:
        """Each integer ``add`` column's lowest and highest value in ``rows`` (widened to take 0)."""
        return {c: cls._extent(rows, c) for c in cls.columns(spec, rows)}

    def safe(self, conn: sqlite3.Connection, name: str, spec: Table, rows: pa.Table) -> bool:
        """Whether no stored sum of this batch's integer ``add`` columns can leave 64 bits."""
        return self.safe_extents(conn, name, self.extents(spec, rows))

    def safe_extents(self, conn: sqlite3.Connection, name: str,
                     extents: Mapping[str, tuple[int, int]]) -> bool:
        """:meth:`safe` for a batch known by each integer ``add`` column's (lowest, highest) value."""
        for col, (lo, hi) in extents.items():
            low, high = self._bounds_of(conn, name, col)
            if low + min(lo, 0) < I64_MIN or high + max(hi, 0) > I64_MAX:
                return False
        return True

    def accepted(self, name: str, spec: Table, rows: pa.Table) -> None:
        """Widen the bounds by a batch that was committed or staged."""
        self.widen(name, self.extents(spec, rows))

    def widen(self, name: str, extents: Mapping[str, tuple[int, int]]) -> None:
        """:meth:`accepted` for a batch known by its columns' (lowest, highest) values."""
        for col, (lo, hi) in extents.items():
            if (name, col) in self._bounds:
                low, high = self._bounds[(name, col)]
                self._bounds[(name, col)] = (low + min(lo, 0), high + max(hi, 0))

    def check_attached(self, conn: sqlite3.Connection, where: str, name: str, spec: Table,
                       extents: Mapping[str, tuple[int, int]], source: str) -> None:
        """:meth:`check` for rows in an attached scratch file (``<source>.rows``), by one join in SQLite.

        Raises:
            BatchRejectedError: Naming the table, the column, the key, the stored and the batch's value.
        """
        if not extents or self.safe_extents(conn, name, extents):
            return
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in spec.key)
        keys = ", ".join("s." + quote(k) for k in spec.key)
        for col in extents:
            c = quote(col)
            over = f"(s.{c} > 0 AND t.{c} > {I64_MAX} - s.{c})"
            under = f"(s.{c} < 0 AND t.{c} < ({I64_MIN + 1} - 1) - s.{c})"  # I64_MIN as a literal is a REAL
            found = conn.execute(
                f"SELECT t.{c}, s.{c}, {keys} FROM {source}.rows AS s JOIN main.{quote(name)} AS t ON {on} "
                f"WHERE typeof(t.{c}) = 'integer' AND ({over} OR {under}) LIMIT 1").fetchone()
            if found:
                old, new, *key = found
                raise BatchRejectedError(
                    f"table {name!r} in {where}: add column {col!r} of the row with key "
                    f"{dict(zip(spec.key, key, strict=True))} would become {old} + {new} = {old + new}, "
                    f"outside SQLite's 64-bit integers{_NOTHING}. Store the column as a double (cast it in "
                    "the query) or split the sum")

    def check(self, conn: sqlite3.Connection, where: str, name: str, spec: Table, rows: pa.Table) -> None:
        """Refuse a batch whose ``add`` would take a stored integer outside 64 bits (inside its transaction).

        Raises:
            BatchRejectedError: Naming the table, the column, the key, the stored and the batch's value.
        """
        cols = self.columns(spec, rows)
        if not cols or self.safe(conn, name, spec, rows):  # (a table onceflow just created: safe)
            return
        match = " AND ".join(f"{quote(k)} IS ?" for k in spec.key)
        select = f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(name)} WHERE {match}"
        keys = [stored(rows.column(k)) for k in spec.key]
        news = [rows.column(c).to_pylist() for c in cols]
        for i in range(rows.num_rows):
            found = conn.execute(select, [k[i] for k in keys]).fetchone()
            for j, col in enumerate(cols):
                old, new = (found[j] if found else None), news[j][i]
                if isinstance(old, int) and new is not None and not I64_MIN <= old + new <= I64_MAX:
                    raise BatchRejectedError(
                        f"table {name!r} in {where}: add column {col!r} of {row_name(rows, spec, i)} would "
                        f"become {old} + {new} = {old + new}, outside SQLite's 64-bit integers{_NOTHING}. "
                        "Store the column as a double (cast it in the query) or split the sum",
                        row=rows.slice(i, 1).to_pylist()[0])


def as_double(col: Any) -> Any:
    """Decimals as the nearest doubles (through their text: Arrow's direct cast can miss by an ulp)."""
    return col.cast(pa.string()).cast(pa.float64())


def stored_array(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A column as the Arrow values SQLite stores (see :mod:`onceflow.sinks.sqlite.sink`'s types).

    Timestamps and dates as their text, decimals as doubles; every other type as it is (a
    bound integer, double, text or blob is stored as given).
    """
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = typ.value_type
    if pa.types.is_timestamp(typ):  # Arrow's text of a timestamp without zone is the UTC wall time
        if typ.tz is not None:
            col = col.cast(pa.timestamp(typ.unit))  # the same instants, UTC, without the zone
        return col.cast(pa.string())
    if pa.types.is_date(typ):
        return col.cast(pa.string())
    if pa.types.is_decimal(typ):
        return as_double(col)
    return col


def stored(col: pa.ChunkedArray) -> list[Any]:
    """Python values of a column as SQLite stores them (:func:`stored_array`, as Python objects)."""
    return stored_array(col).to_pylist()  # type: ignore[no-any-return]


def declared_types(info: Sequence[Any]) -> dict[str, str]:
    """Column -> declared type, from ``PRAGMA table_info`` rows."""
    return {r[1]: r[2] for r in info}


def ddl(name: str, spec: Table, schema: pa.Schema, strict: bool = True) -> str:
    """The ``CREATE TABLE`` text onceflow creates a table with (as SQLite stores it).

    ``STRICT`` (onceflow since value checks; without it: the text of an older onceflow's
    tables, which :func:`onceflow.sinks.sqlite.values.check_types` guards instead).
    """
    body = ", ".join(f"{quote(c)} {sql_type(schema.field(c).type)}" for c in schema.names)
    key = f", PRIMARY KEY({', '.join(quote(k) for k in spec.key)})" if spec.key else ""
    options = [" WITHOUT ROWID"] if spec.key else []  # one B-tree keyed by the key: faster upserts
    options += [" STRICT"] if strict else []  # SQLite refuses a value of another type
    return f"CREATE TABLE {quote(name)}({body}{key}){','.join(options)}"


def merge_value(column: str, how: str) -> str:
    """The stored value of a merged column after a batch (nulls ignored, as SQL's aggregates do)."""
    old, new = quote(column), f"excluded.{quote(column)}"
    both = f"{old} + {new}" if how == "add" else f"{how}({old}, {new})"  # scalar max()/min() in SQLite
    return f"coalesce({both}, {old}, {new})"


def conflict_clause(spec: Table, columns: list[str]) -> str:
    """The ``ON CONFLICT`` clause of a table's writes (none for ``append``)."""
    if spec.mode == "append":
        return ""
    rest = [c for c in columns if c not in spec.key]
    merged = spec.merged
    sets = [f"{quote(c)} = {merge_value(c, merged[c]) if c in merged else 'excluded.' + quote(c)}"
            for c in rest]
    conflict = f" ON CONFLICT({', '.join(quote(k) for k in spec.key)})"
    return conflict + " DO UPDATE SET " + ", ".join(sets) if sets else conflict + " DO NOTHING"


def insert_sql(name: str, spec: Table, columns: list[str]) -> str:
    """The statement that writes one row of a table by its mode."""
    cols, marks = ", ".join(quote(c) for c in columns), ", ".join("?" * len(columns))
    return f"INSERT INTO {quote(name)}({cols}) VALUES ({marks})" + conflict_clause(spec, columns)
