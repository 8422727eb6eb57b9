"""The pipeline oracle's own input contract: which records of a batch are bad, from the documented rules.

:func:`onceflow.expect` and ``write_stream(rejects=...)`` send every bad record, exactly once, to
the rejects table with its source coordinates and the rule it broke. The oracle judges that
table without onceflow's contract code (:mod:`onceflow.engine.contract`, :mod:`onceflow.engine.rejects`): it
reads the batch's records itself, with their coordinates, and applies the rules as
``docs/rejects.md`` states them, in their order (the first that applies is the record's rule):

1. ``parse`` (with ``json=``): the column is null, is not a JSON object, or a field present in
   it does not fit the declared schema — what Spark's JSON reader (``from_json``) cannot read as
   that type; the column is the field (or the JSON column);
2. ``required``: a ``required=`` column is null (in their order);
3. ``check``: a ``checks=`` expression is false (null passes), in their order;
4. ``id`` and 5. ``event_time``: added when the good records reach ``deduplicate`` — an id
   column null or blank (spaces only), the event time null.

Records, with the coordinates the rejects table keys them by (``record``):

* a text file source (``spark.readStream.text``): each line of the batch's files — lines end at
  LF, CR LF or CR, the empty piece after a final line end is no line — ``<file>#<line from 1>``;
* Kafka records (``--source kafka``): ``<topic>/<partition>/<offset>``; the JSON column is read
  as UTF-8 text.

Other sources are refused (a ``ConfigError`` that the dry run reports before any round).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.errors import ConfigError

Rejected = dict[str, Any]
"""One expected row of the rejects table: ``record``, ``batch_id``, ``rule``, ``column``."""


def _lines(path: Path) -> list[str]:
    pieces = re.split(r"\r\n|\n|\r", path.read_bytes().decode("utf-8", "replace"))
    return pieces[:-1] if pieces and pieces[-1] == "" else pieces


def source_records(df: Any, files: Sequence[Path]) -> list[tuple[str, dict[str, Any]]]:
    """The batch's records as ``(record key, source columns)``, in source order.

    Raises:
        ConfigError: A source the oracle cannot give coordinates for.
    """
    if {"topic", "partition", "offset"} <= set(df.columns):  # Kafka records (either connector)
        rows = df.toArrow().to_pylist()
        return [(f"{r['topic']}/{r['partition']}/{r['offset']}", r) for r in rows]
    if list(df.columns) == ["value"] and files:  # a text file source
        return [(f"{f}#{n}", {"value": line}) for f in files for n, line in enumerate(_lines(f), start=1)]
    raise ConfigError("verify --pipeline judges onceflow.expect on a text file source "
                      "(spark.readStream.text) or on Kafka records; this contract's source has columns "
                      f"{list(df.columns)}")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


class ContractOracle:
    """One run's contract decisions: each batch's good records and the rejects expected of it."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.rejected: list[Rejected] = []
        """This batch's expected rejects (taken by :meth:`take`)."""
        self.good: list[tuple[str, dict[str, Any]]] = []
        """This batch's good records (for the ``id``/``event_time`` rules of :meth:`dedup_rules`)."""
        self.active = False

    def _bad(self, key: str, batch_id: int, rule: str, column: str) -> None:
        self.rejected.append({"record": key, "batch_id": batch_id, "rule": rule, "column": column})

    def _parsed(self, records: list[tuple[str, dict[str, Any]]], column: str, schema: Any,
                batch_id: int) -> list[tuple[str, dict[str, Any]]]:
        """Rule 1: the records whose JSON column reads as the schema, with the fields read."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        objects: list[tuple[int, str, dict[str, Any]]] = []
        for i, (key, row) in enumerate(records):
            text = _text(row.get(column))
            try:
                raw = json.loads(text) if text is not None and text.strip()[:1] == "{" else None
            except ValueError:
                raw = None
            if not isinstance(raw, dict):
                self._bad(key, batch_id, "parse", column)
                continue
            objects.append((i, str(text), raw))
        if not objects:
            return []
        corrupt = "__oracle_corrupt"
        struct = T.StructType([*schema.fields, T.StructField(corrupt, T.StringType())])
        texts = self.spark.createDataFrame([(i, t) for i, t, _ in objects], "i long, t string")
        read = texts.select("i", F.from_json("t", struct, {"columnNameOfCorruptRecord": corrupt,
                                                          "mode": "PERMISSIVE"}).alias("p")).collect()
        parsed = {int(r["i"]): (r["p"].asDict() if r["p"] is not None else None) for r in read}
        out = []
        for i, _, raw in objects:
            key, row = records[i]
            fields = parsed.get(i)
            bad = next((f.name for f in schema.fields if raw.get(f.name) is not None
                        and (fields is None or fields.get(f.name) is None)), None)
            if fields is None or bad is not None or fields.get(corrupt) is not None:
                self._bad(key, batch_id, "parse", bad or column)
                continue
            out.append((key, {**row, **{f.name: fields[f.name] for f in schema.fields}}))
        return out

    def expect(self, df: Any, files: Sequence[Path], batch_id: int, json_column: str | None, schema: Any,
               required: Sequence[str], checks: Mapping[str, Any], keep: Sequence[str]) -> Any:
        """Rules 1-3 on the batch's records; the good ones as a static DataFrame (what ``expect`` returns)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        self.active, self.rejected, self.good = True, [], []
        records = source_records(df, files)
        if json_column is not None:
            struct = T._parse_datatype_string(schema) if isinstance(schema, str) else schema
            if not isinstance(struct, T.StructType):
                raise ConfigError(f"expect: schema {schema!r} is not a struct")
            records = self._parsed(records, json_column, struct, batch_id)
            fields = [*struct.fields, *(df.schema[k] for k in keep)]
        else:
            fields = list(df.schema.fields)
        out_schema = T.StructType(fields)
        names = [f.name for f in fields]
        kept = []
        for key, row in records:
            miss = next((c for c in required if row.get(c) is None), None)
            if miss is not None:
                self._bad(key, batch_id, "required", miss)
            else:
                kept.append((key, {n: row.get(n) for n in names}))
        if checks and kept:
            frame = self.spark.createDataFrame([(i, *r.values()) for i, (_, r) in enumerate(kept)],
                                               T.StructType([T.StructField("__i", T.LongType()), *fields]))
            failed: dict[int, str] = {}
            for name, check in checks.items():
                expr = F.expr(check) if isinstance(check, str) else check
                for r in frame.where(F.coalesce(~expr, F.lit(False))).select("__i").collect():
                    failed.setdefault(int(r["__i"]), name)
            for i, (key, _) in enumerate(kept):
                if i in failed:
                    self._bad(key, batch_id, "check", failed[i])
            kept = [k for i, k in enumerate(kept) if i not in failed]
        self.good = kept
        return self.spark.createDataFrame([tuple(r.values()) for _, r in kept], out_schema)

    def dedup_rules(self, ids: Sequence[str], event_time: str, batch_id: int) -> None:
        """Rules 4-5 on this batch's good records (when ``deduplicate`` is called on them)."""
        if not self.active:
            return
        for key, row in self.good:
            blank = next((c for c in ids if row.get(c) is None or str(row.get(c)).strip(" ") == ""), None)
            if blank is not None:
                self._bad(key, batch_id, "id", blank)
            elif row.get(event_time) is None:
                self._bad(key, batch_id, "event_time", event_time)

    def take(self) -> pa.Table:
        """This batch's expected rejects as the rejects table's key columns (and then none pending)."""
        rows, self.rejected, self.good, self.active = self.rejected, [], [], False
        return pa.Table.from_pylist(rows, schema=pa.schema([("record", pa.string()), ("batch_id", pa.int64()),
                                                            ("rule", pa.string()), ("column", pa.string())]))


def local_record(record: Any) -> Any:
    """A rejects row's ``record`` with a file URI as a local path (``file:/x/y#3`` -> ``/x/y#3``)."""
    from urllib.parse import unquote, urlparse

    text = str(record)
    if not text.startswith("file:") or "#" not in text:
        return record
    path, row = text.rsplit("#", 1)
    return f"{unquote(urlparse(path).path)}#{row}"
