"""Fold a user pipeline's per-batch outputs into the expected tables; judge the sink's tables.

The fold is the oracle's own reading of the documented table modes (:class:`onceflow.Table`),
never the sinks' code:

* ``append``: every row of every batch once (a multiset);
* ``upsert``: by key, the row of the latest batch;
* ``merge``: by key, ``add`` columns summed, ``max``/``min`` columns the greater/smaller value
  (a null is ignored, as SQL's aggregates ignore it), the other columns replaced.

Values are compared in one canonical form (:func:`canon`): timestamps as UTC text with
microseconds, dates as ISO text, decimals and floats as floats to 12 significant digits,
booleans as integers (SQLite keeps them so). A Kafka sink's tables are topics of JSON records
(:func:`kafka_reader`): there the expected values are first put in the form JSON gives them
(:func:`json_form`: timestamps and dates as their ``str()``, bytes as UTF-8 text), as the Kafka
sink's documentation says a record holds them. A table is judged by key (``upsert``/``merge``:
missing keys are lost, unexpected keys extra, a differing row is lost when an ``add`` column is
lower, duplicated when higher, else wrong) or as a multiset of rows (``append``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from onceflow.sinks._core.tables import Table
from onceflow.verify.contract_oracle import local_record
from onceflow.verify.pipeline_oracle import Captured, PipelineOracle, late_ids
from onceflow.verify.recompute import CountDiff
from onceflow.verify.verdict import Verdict

Rows = list[dict[str, Any]]
Reader = Callable[[str, "Folded | None"], "Rows | None"]
"""Reads a sink's table by name (None: the table does not exist), given what the oracle expects
of it (its spec and columns; None for the ``late=`` table). Only the Kafka reader needs the
latter: a topic is a log of records, folded into a table by the spec."""


def canon(value: Any) -> Any:
    """A value in the form both sides are compared in (see the module)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, decimal.Decimal)):
        return float(f"{float(value):.12g}")
    return value


def json_form(value: Any) -> Any:
    """``value`` as a JSON record of the Kafka sink holds it, read back (see the module)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): json_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_form(v) for v in value]
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)  # timestamps, dates, decimals


def _merge(how: str, stored: Any, new: Any) -> Any:
    if stored is None:
        return new
    if new is None:
        return stored
    if how == "add":
        return stored + new
    return max(stored, new) if how == "max" else min(stored, new)


class Folded:
    """One table's expected contents, built batch by batch.

    Args:
        spec: The table's spec.
        form: Applied to every value before :func:`canon` (:func:`json_form` for Kafka).
    """

    def __init__(self, spec: Table, form: Callable[[Any], Any] | None = None) -> None:
        self.spec = spec
        self.form = form
        self.columns: list[str] = []
        """The columns of the rows folded in (the first batch's order)."""
        self.appended: Counter[tuple[tuple[str, Any], ...]] = Counter()
        self.keyed: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(self, rows: Rows, columns: list[str] | None = None) -> None:
        """Fold one batch's rows for this table."""
        spec, form = self.spec, self.form
        self.columns = self.columns or list(columns or [])
        for raw in rows:
            row = {k: canon(form(v) if form else v) for k, v in raw.items()}
            if spec.mode == "append":
                self.appended[tuple(sorted(row.items()))] += 1
                continue
            key = tuple(row[c] for c in spec.key)
            stored = self.keyed.get(key)
            if spec.mode == "upsert" or stored is None:
                self.keyed[key] = row
                continue
            merged = spec.merged
            self.keyed[key] = {c: _merge(merged[c], stored.get(c), v) if c in merged else v
                               for c, v in row.items()}

    def rows(self) -> int:
        """Rows the table must hold."""
        return sum(self.appended.values()) if self.spec.mode == "append" else len(self.keyed)

    def found(self) -> Rows:
        """What a reader folded: the rows a table of this spec holds (keyed: one per key)."""
        if self.spec.mode == "append":
            return [dict(row) for row, n in self.appended.items() for _ in range(n)]
        return list(self.keyed.values())


def fold(captured: list[tuple[int, Captured]], form: Callable[[Any], Any] | None = None) -> dict[str, Folded]:
    """The expected tables from every batch's outputs, in batch order (``form``: see :class:`Folded`)."""
    out: dict[str, Folded] = {}
    for _, batch in captured:
        for name, table in batch.outputs.items():
            spec = batch.tables.get(name)
            if spec is None:
                continue  # per_batch returned a table write_stream has no spec for: the query fails too
            out.setdefault(name, Folded(spec, form)).add(table.to_pylist(), table.column_names)
        for name, spec in batch.tables.items():
            if name != batch.late:
                out.setdefault(name, Folded(spec, form))
    return out


def compare_table(name: str, want: Folded, got: Rows, violations: list[str]) -> CountDiff:
    """The sink's table ``got`` against ``want`` (see the module); each difference added to ``violations``."""
    spec = want.spec
    found = [{k: canon(v) for k, v in r.items()} for r in got]
    if spec.mode == "append":
        cols = {k for row in want.appended for k, _ in row} or {k for r in found for k in r}
        have = Counter(tuple(sorted((k, v) for k, v in r.items() if k in cols)) for r in found)
        missing = want.appended - have
        extra = have - want.appended
        lost, dup = sum(missing.values()), sum(extra.values())
        if lost:
            violations.append(f"{name}: {lost} rows lost, e.g. {dict(next(iter(missing)))}")
        if dup:
            violations.append(f"{name}: {dup} rows too many (duplicated or invented), e.g. "
                              f"{dict(next(iter(extra)))}")
        return CountDiff(want.rows(), len(found), lost, 0, 0, 0, lost, dup)
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in found:
        by_key.setdefault(tuple(r.get(c) for c in spec.key), []).append(r)
    missing_keys = [k for k in want.keyed if k not in by_key]
    extra_keys = [k for k in by_key if k not in want.keyed]
    twice = [k for k, rs in by_key.items() if len(rs) > 1]
    low = high = wrong = 0
    example = ""
    for key, folded in want.keyed.items():
        rs = by_key.get(key)
        if not rs:
            continue
        row = {c: canon(v) for c, v in folded.items()}  # sums folded from canonical parts: again
        diff = {c: (v, rs[0].get(c)) for c, v in row.items() if rs[0].get(c) != v}
        if not diff:
            continue
        adds = [c for c in diff if spec.merged.get(c) == "add" and None not in diff[c]]
        if adds and all(diff[c][1] > diff[c][0] for c in adds):
            high += 1
        elif adds and all(diff[c][1] < diff[c][0] for c in adds):
            low += 1
        else:
            wrong += 1
        example = example or f"key {key}: expected {row}, found {rs[0]}"
    lost = len(missing_keys) + low + wrong
    dup = high + len(twice)  # unexpected keys are extra rows (reported beside)
    if missing_keys and extra_keys and len(missing_keys) == len(want.keyed):
        violations.append(f"{name}: none of the {len(want.keyed)} keys the oracle computed is in the table, "
                          f"which has {len(by_key)} others: does per_batch mint its key "
                          f"({', '.join(spec.key)}) with uuid4(), the clock or random numbers? A replayed "
                          "batch then writes new rows; derive the key from the input (e.g. the "
                          "producer's id)")
    if missing_keys:
        violations.append(f"{name}: {len(missing_keys)} keys lost, e.g. {missing_keys[0]}")
    if extra_keys:
        violations.append(f"{name}: {len(extra_keys)} unexpected keys, e.g. {extra_keys[0]}")
    if twice:
        violations.append(f"{name}: {len(twice)} keys stored more than once, e.g. {twice[0]}")
    if low or high or wrong:
        violations.append(f"{name}: {low} rows too low (lost), {high} too high (duplicated), {wrong} "
                          f"different; {example}")
    return CountDiff(want.rows(), len(found), len(missing_keys), low + wrong, high, len(extra_keys), lost,
                     dup)


def unmarked(committed: list[int], markers: list[dict[str, Any]]) -> list[int]:
    """The batches in Spark's commit log without a marker in the sink (each one needs its marker)."""
    marked = {int(m["batch_id"]) for m in markers}
    return [b for b in committed if b not in marked]


def judge(sink: str, oracle: PipelineOracle, read: Reader,
          json_values: bool | Collection[str] = False) -> Verdict:
    """The verdict on the sink's tables against the oracle's (late rows: by id).

    Args:
        sink: The sink's name in the verdict.
        oracle: The oracle, run.
        read: Reads the sink's tables.
        json_values: The sink keeps values as JSON (Kafka): compare the expected values in
            :func:`json_form`; or the names of the tables kept so (a Kafka sink beside others).
    """
    violations: list[str] = []
    tables: dict[str, CountDiff] = {}
    rejects = next((c.rejects for _, c in oracle.captured if c.rejects), None)
    folded = fold(oracle.captured, json_form if json_values is True else None)
    if not isinstance(json_values, bool) and json_values:
        as_json = fold(oracle.captured, json_form)
        folded = {name: as_json[name] if name in json_values else want for name, want in folded.items()}
    for name, want in sorted(folded.items()):
        got = read(name, want)
        if got is not None and name == rejects:  # a file's URI as a local path, as the oracle keys it
            got = [{**r, "record": local_record(r.get("record"))} for r in got]
        if got is None:
            got = []
            if want.rows():
                violations.append(f"{name}: the table does not exist; {want.rows()} rows expected")
        tables[name] = compare_table(name, want, got, violations)
    late_expected = late_recorded = 0
    late = next((c.late for _, c in oracle.captured if c.late), None)
    if late is not None:
        ids = late_ids(oracle)
        rows = read(late, None) or []
        cols = oracle.dedup.ids
        found = {tuple(canon(r.get(c)) for c in cols) for r in rows}
        late_want = {tuple(canon(v) for v in k) for k in ids}
        late_expected, late_recorded = len(late_want), len(found)
        if found != late_want:
            violations.append(f"{late} (late rows): {len(late_want - found)} ids missing, "
                              f"{len(found - late_want)} unexpected (e.g. "
                              f"{sorted(late_want ^ found, key=repr)[:3]})")
    return Verdict(sink, tables, late_expected, late_recorded, violations=violations)


def sqlite_reader(db: Path) -> Reader:
    """A SQLite database's tables as rows."""
    def read(name: str, _want: Folded | None = None) -> Rows | None:
        if not db.exists():
            return None
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
            if conn.execute(exists, (name,)).fetchone() is None:
                return None
            cur = conn.execute(f'SELECT * FROM "{name}"')
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur]
        finally:
            conn.close()
    return read


def postgres_reader(dsn: str) -> Reader:
    """A PostgreSQL schema's tables as rows (the DSN's ``search_path``)."""
    def read(name: str, _want: Folded | None = None) -> Rows | None:
        import psycopg
        from psycopg import sql
        from psycopg.rows import dict_row

        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            if conn.execute("SELECT to_regclass(%s) IS NOT NULL AS e", (name,)).fetchone()["e"] is False:  # type: ignore[index]
                return None
            return list(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(name))))
    return read


def delta_reader(root: Path) -> Reader:
    """Delta tables under ``root`` (one directory per table) as rows."""
    def read(name: str, _want: Folded | None = None) -> Rows | None:
        from deltalake import DeltaTable

        path = root / name
        if not (path / "_delta_log").is_dir():
            return None
        return DeltaTable(str(path)).to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]
    return read


def _iceberg_table(folder: Path, namespace: str, name: str) -> Any | None:
    """Table ``namespace.name`` of ``--iceberg DIR``'s SQLite catalog, by pyiceberg (None: none yet)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    if not (folder / "catalog.db").exists():
        return None
    catalog = SqlCatalog("onceflow", uri=f"sqlite:///{folder.absolute() / 'catalog.db'}",  # the sink's name
                         warehouse=(folder.absolute() / "warehouse").as_uri())
    try:
        return catalog.load_table((namespace, name))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def iceberg_reader(folder: Path, namespace: str = "onceflow") -> Reader:
    """The Iceberg tables of ``--iceberg DIR`` (a SQLite catalog ``DIR/catalog.db``) as rows (pyiceberg)."""
    def read(name: str, _want: Folded | None = None) -> Rows | None:
        table = _iceberg_table(folder, namespace, name)
        return None if table is None else table.scan().to_arrow().to_pylist()
    return read


def iceberg_last_batch(folder: Path, sink_id: str,
                       namespace: str = "onceflow") -> Callable[[str], int | None]:
    """A table's last batch as its properties mark it (``onceflow.<sink_id>.batch``; None: none)."""
    def last(name: str) -> int | None:
        table = _iceberg_table(folder, namespace, name)
        found = None if table is None else table.properties.get(f"onceflow.{sink_id}.batch")
        return None if found is None else int(found)
    return last


def _record_row(key: bytes | None, value: bytes | None, want: Folded | None) -> dict[str, Any]:
    """One record as a row, by the Kafka sink's documented record form.

    The value is a JSON object of every column, except when the table's rows have only a
    ``value`` column beside their key columns: then it is that column's bytes, and the key
    columns come from the record's key (one column: its text; more: a JSON object).
    """
    text = (value or b"").decode("utf-8", "replace")
    keys = list(want.spec.key) if want is not None else []
    raw = want is not None and bool(want.columns) and set(want.columns) == {"value", *keys}
    if not raw:
        row = json.loads(text) if text else {}
        return row if isinstance(row, dict) else {"value": text}
    out: dict[str, Any] = {"value": text if value is not None else None}
    if len(keys) == 1:
        out[keys[0]] = key.decode("utf-8", "replace") if key is not None else None
    elif keys:
        out.update(json.loads(key or b"{}"))
    return out


def kafka_reader(bootstrap: str) -> Reader:
    """A Kafka sink's tables: each topic read with ``read_committed``, folded by its spec.

    The verifier's own consumer reads the records in offset order (a key's records are in one
    partition, so in order); an ``append`` table is its records, an ``upsert`` table the last
    record of each key (as a compacted topic keeps it), a ``merge`` table the per-batch partial
    rows folded per key (``add`` summed, ``max``/``min`` kept).
    """
    def read(name: str, want: Folded | None) -> Rows | None:
        from onceflow.verify.kafka_rig import read_messages

        messages = read_messages(bootstrap, name)
        if not messages:
            return None
        rows = [_record_row(m.key(), m.value(), want) for m in messages]
        if want is None or want.spec.mode == "append":
            return rows
        folded = Folded(want.spec)
        folded.add(rows)
        return folded.found()
    return read
