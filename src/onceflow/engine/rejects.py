"""Bad records of a batch, read back from its offsets: the rows of a ``rejects=`` table (and of ``late=``).

A stream with a contract (:mod:`onceflow.engine.contract`) filters bad records out and counts them.
For batch N whose count is not zero (or not known), this module reads N's input again —
exactly the records Spark fed into N, from the offsets in Spark's checkpoint — applies the same
contract, and returns the bad records with their source coordinates:

* a file source: N's files from the checkpoint's source log, read with the stream's format,
  schema and options; ``row`` is the record's position in its file, from 1 (Parquet's row
  index + 1; a text file's line number; for other formats the n-th record Spark's reader gives,
  read in file order);
* ``onceflow_kafka``: N's offset ranges ``[end of N-1, end of N)`` from the offset log, read
  with the stream's options (:class:`onceflow.sources.kafka.source.KafkaRangeReader`).

The rejects table's columns, the same for every source (null where a source has none):

=============  ===================================================================
``record``     the record's coordinates as one string (the table's key):
               ``topic/partition/offset`` or ``file#row``
``batch_id``   the micro-batch that read it
``topic``, ``partition``, ``offset``   Kafka coordinates
``file``, ``row``                      file coordinates
``key``        Kafka's key (as text)
``value``      the raw record: Kafka's value as text, a text file's line, or another
               file format's row as JSON
``headers``    Kafka's headers as JSON (values base64)
``rule``       ``parse``, ``required``, ``check``, ``id`` or ``event_time``
``column``     the column (or check name) the rule is about
``reason``     what was wrong, in words
=============  ===================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow.checkpoint import logs as ckpt
from onceflow.engine.contract import RAW, REASON, Contract
from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks._core.tables import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ARROW_SCHEMA = pa.schema([
    ("record", pa.string()), ("batch_id", pa.int64()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("file", pa.string()), ("row", pa.int64()), ("key", pa.string()),
    ("value", pa.string()), ("headers", pa.string()), ("rule", pa.string()), ("column", pa.string()),
    ("reason", pa.string())])
"""The rejects table's columns as Arrow types."""

COLUMNS = tuple(ARROW_SCHEMA.names)
"""The rejects table's columns (module docstring)."""

SPEC = Table(key=["record"])
"""How the rejects table is written: one row per bad record, keyed by its coordinates."""

_C = "__onceflow_c_"


def check_sources(checkpoint: Path, batch_id: int) -> None:
    """Refuse a query of several sources (a contract's records are read back from source 0).

    Raises:
        ConfigError: The batch's offset log names more than one source.
    """
    entries = ckpt._read_log_file(checkpoint / "offsets" / str(batch_id))[1:]
    if len(entries) > 1:
        raise ConfigError(f"rejects and input contracts work on a query of one source; this one has "
                          f"{len(entries)} (a join or union of streams)")


def batch_records(spark: Any, checkpoint: Path, batch_id: int, contract: Contract) -> DataFrame | None:
    """Batch ``batch_id``'s input records as its source gave them, plus coordinate columns.

    Returns:
        The records (source columns and ``__onceflow_c_*`` coordinates), or None for a batch
        that read nothing.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    src = contract.source
    if src.kind == "kafka":
        end = ckpt.source_offset(checkpoint, batch_id)
        if end is None:
            return None
        if batch_id > 0:
            start = ckpt.source_offset(checkpoint, batch_id - 1) or {}
        else:  # Spark's connector logged where batch 0 started; onceflow's source starts at 0
            from onceflow.sources.kafka.native import initial_offsets

            start = initial_offsets(checkpoint) or {}
        options = {k: v for k, v in src.options.items() if k.lower() != "includeheaders"}
        raw = (spark.read.format(src.format).options(**options)
               .option("includeHeaders", "true")  # a bad record's headers are kept (the producer's id)
               .option("onceflow.range.start", json.dumps(start))
               .option("onceflow.range.end", json.dumps(end)).load())
        out: DataFrame = raw.select("*", *[F.col(c).alias(_C + c) for c in ("topic", "partition", "offset")])
        return out
    files = ckpt.batch_files(checkpoint, batch_id)
    if not files:
        return None
    options = {k: v for k, v in src.options.items() if k != "path"}
    if src.format == "text" and options.get("wholetext", "false").lower() != "true":
        return _text_lines(spark, files, options.get("lineSep"))
    reader = spark.read.format(src.format).options(**options)
    if src.schema_json is not None:
        from pyspark.sql import types as T

        reader = reader.schema(T.StructType.fromJson(json.loads(src.schema_json)))
    raw = reader.load([str(f) for f in files])
    if src.format == "parquet":
        out = raw.select("*", F.col("_metadata.file_path").alias(_C + "file"),
                         (F.col("_metadata.row_index") + 1).alias(_C + "row"))
        return out
    numbered = raw.select("*", F.col("_metadata.file_path").alias(_C + "file"),
                          F.monotonically_increasing_id().alias(_C + "seq"))
    order = Window.partitionBy(_C + "file").orderBy(_C + "seq")
    out = numbered.withColumn(_C + "row", F.row_number().over(order).cast("long")).drop(_C + "seq")
    return out


def _text_lines(spark: Any, files: list[Path], line_sep: str | None) -> DataFrame:
    """A text source's lines with their line numbers: each file read whole and split (no shuffle).

    Lines end as Spark's text reader ends them (LF, CR LF, CR, or ``lineSep``);
    the empty piece after a final line end is not a line.
    """
    import re

    from pyspark.sql import functions as F

    pattern = re.escape(line_sep) if line_sep else "\r\n|\n|\r"
    lines = F.split(F.col("value"), pattern)
    lines = F.when(F.element_at(lines, -1) == "",
                   F.slice(lines, F.lit(1), F.size(lines) - 1)).otherwise(lines)
    whole = spark.read.text([str(f) for f in files], wholetext=True)
    out: DataFrame = whole.select(F.col("_metadata.file_path").alias(_C + "file"),
                                  F.posexplode(lines).alias(_C + "row", "value"))
    return out.select("value", _C + "file", (F.col(_C + "row") + 1).cast("long").alias(_C + "row"))


def rejected_rows(spark: Any, checkpoint: Path, batch_id: int, contract: Contract) -> DataFrame | None:
    """The rejects table's rows of batch ``batch_id`` (None: it read nothing)."""
    from pyspark.sql import functions as F

    raw = batch_records(spark, checkpoint, batch_id, contract)
    if raw is None:
        return None
    coords = [c for c in raw.columns if c.startswith(_C)]
    framed = contract.frame(raw, coords, with_raw=True).where(F.col(REASON).isNotNull())

    def c(name: str) -> Any:
        return F.col(_C + name)

    text = "string"
    if contract.source.kind == "kafka":
        record = F.concat_ws("/", c("topic"), c("partition").cast(text), c("offset").cast(text))
        topic, partition, offset = c("topic"), c("partition").cast("int"), c("offset").cast("long")
        file, row = F.lit(None).cast(text), F.lit(None).cast("long")
        key, value = F.col(f"{RAW}.key").cast(text), F.col(f"{RAW}.value").cast(text)
        headers = F.to_json(F.col(f"{RAW}.headers"))
    else:
        record = F.concat(c("file"), F.lit("#"), c("row").cast(text))
        topic, partition, offset = F.lit(None).cast(text), F.lit(None).cast("int"), F.lit(None).cast("long")
        file, row = c("file"), c("row").cast("long")
        own = [f.name for f in raw.schema.fields if not f.name.startswith(_C)]
        key, headers = F.lit(None).cast(text), F.lit(None).cast(text)
        value = F.col(f"{RAW}.value").cast(text) if contract.source.format == "text" and own == ["value"] \
            else F.to_json(F.col(RAW))
    return framed.select(
        record.alias("record"), F.lit(batch_id).cast("long").alias("batch_id"), topic.alias("topic"),
        partition.alias("partition"), offset.alias("offset"), file.alias("file"), row.alias("row"),
        key.alias("key"), value.alias("value"), headers.alias("headers"),
        F.col(f"{REASON}.rule").alias("rule"), F.col(f"{REASON}.column").alias("column"),
        F.col(f"{REASON}.reason").alias("reason"))


def good_rows(spark: Any, checkpoint: Path, batch_id: int, contract: Contract) -> DataFrame | None:
    """Batch ``batch_id``'s good records as the contract's stream had them (None: it read nothing)."""
    from pyspark.sql import functions as F

    raw = batch_records(spark, checkpoint, batch_id, contract)
    if raw is None:
        return None
    coords = [c for c in raw.columns if c.startswith(_C)]
    return (contract.frame(raw, coords).where(F.col(REASON).isNull())
            .select(*contract.output_columns()))


def find_record(spark: Any, checkpoint: Path, batch_id: int, contract: Contract,
                values: dict[str, Any]) -> dict[str, Any] | None:
    """The first input record of batch ``batch_id`` whose contract output has ``values`` (coordinates, value).

    Returns:
        ``{"topic", "partition", "offset"}`` or ``{"file", "row"}`` plus ``value``, or None.
    """
    from pyspark.sql import functions as F

    raw = batch_records(spark, checkpoint, batch_id, contract)
    if raw is None:
        return None
    coords = [c for c in raw.columns if c.startswith(_C)]
    found = contract.frame(raw, coords, with_raw=True)
    for col, value in values.items():
        found = found.where(F.col(f"`{col}`") == F.lit(value))
    first = found.select(*coords, F.to_json(F.col(RAW)).alias("value")).orderBy(*coords).limit(1).collect()
    if not first:
        return None
    return {**{c[len(_C):]: first[0][c] for c in coords}, "value": first[0]["value"]}


def where(found: dict[str, Any]) -> str:
    """A record's coordinates in words."""
    if found.get("topic") is not None:
        return f"topic {found['topic']!r} partition {found['partition']} offset {found['offset']}"
    return f"file {found['file']} row {found['row']}"


def stop_message(batch_id: int, count: int, first: dict[str, Any]) -> str:
    """The error of a batch with bad records and no ``rejects=`` table: the first one, and the fix."""
    at = where(first)
    value = str(first.get("value"))
    value = value if len(value) <= 200 else value[:200] + "..."
    return (f"batch {batch_id} has {count} bad record(s); the first, at {at}, breaks rule "
            f"{first['rule']!r} ({first['reason']}): {value!r}. Nothing of the batch was written. Route bad "
            "records to a table with write_stream(..., rejects='table_name') and restart the query with the "
            "same checkpoint (nothing is lost: the batch runs again)")


def refuse(batch_id: int, rows: Any) -> None:
    """Raise :class:`BatchRejectedError` for a batch's bad records (a ``pyarrow.Table`` of them)."""
    ordered = rows.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending"),
                            ("file", "ascending"), ("row", "ascending")])
    raise BatchRejectedError(stop_message(batch_id, rows.num_rows, ordered.slice(0, 1).to_pylist()[0]))


def traced(spark: Any, checkpoint: Path, batch_id: int, contract: Contract | None, ids: list[str] | None,
           exc: BatchRejectedError) -> BatchRejectedError:
    """``exc`` (an output row refused) with the source coordinates of the input record behind it.

    Traced by the deduplication's id: when the refused row carries the id column(s) and the
    query has an input contract, the batch's input is read back and the record with that id
    named. Otherwise the message says that it cannot be traced, and how to reject such
    records before ``per_batch``.
    """
    row = exc.row
    found = None
    if contract is not None and ids and row is not None and all(row.get(i) is not None for i in ids):
        found = find_record(spark, checkpoint, batch_id, contract, {i: row[i] for i in ids})
    if found is not None:
        note = f"; the input record behind it: {where(found)}: {found['value']}"
    else:
        note = ("; the input record behind it cannot be traced (onceflow follows a row back to its input "
                "only by the deduplication's id, which this row does not carry, or the query has no "
                "input contract): reject such records before per_batch with onceflow.expect(source, "
                "required=[...], checks={...}) and write_stream(..., rejects=...)")
    return BatchRejectedError(str(exc) + note, row=row)


def late_rows(spark: Any, checkpoint: Path, batch_id: int, batch: ckpt.BatchInput | None,
              contract: Contract | None, event_time: str, ids: list[str] | None) -> DataFrame | None:
    """The input rows of batch N that the watermark dropped, as they are in N's input (``late=``).

    Plus ``missed_watermark`` (the watermark they were behind); one row per id when the ids are
    known (a late record sent twice is one late record). With a contract: its good records of N,
    read back from N's offsets (a bad record is rejected, never late); None for a batch that
    read nothing. Without one, N's files (``batch``).
    """
    from pyspark.sql import functions as F

    wm = batch.late_watermark_ms if batch is not None else ckpt.late_watermark_ms(checkpoint, batch_id)
    if contract is not None:
        rows = good_rows(spark, checkpoint, batch_id, contract)
        if rows is None:
            return None
    else:
        assert batch is not None
        rows = spark.read.parquet(*[str(f) for f in batch.files])
    rows = (rows.where(F.unix_micros(F.col(event_time)) <= F.lit(wm * 1000))
            .withColumn("missed_watermark", F.timestamp_millis(F.lit(wm))))
    return rows.dropDuplicates(ids) if ids else rows
