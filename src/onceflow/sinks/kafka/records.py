"""Kafka records from Arrow tables, encoded a column at a time.

The rules are the Kafka sink's (:mod:`onceflow.sinks.kafka.sink`): a table's key columns are the
record's key (one string or binary column as its bytes, else a JSON object of the key columns);
its value is the column ``value`` as its bytes when the rows have only that and the key columns,
else a JSON object of every column.

A JSON object per row is built column by column with Arrow compute kernels instead of one
``json.dumps`` per row (BENCHMARKS.md): each column becomes the JSON text of its values
(:func:`fragments`), and the texts are joined row-wise with the names between them. The text is
byte for byte what :func:`row_json` — ``json.dumps`` of the row's Python values, UTF-8 kept,
no spaces, timestamps and dates as ``str()`` of them, anything else JSON does not know as its
``str()`` — gives for the same row; the tests hold the two together. Strings, integers,
booleans, dates and zone-less or UTC timestamps take the kernels; a string column with a
control character, floats, decimals, binary, nested and other types take ``json.dumps`` of
each value (floats: Python's shortest repr, which Arrow's cast does not give).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import OnceflowError
from onceflow.sinks._core.checks import check_json
from onceflow.sinks._core.tables import Table

PRODUCER = {"partitioner": "murmur2_random", "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576}
"""Producer settings of the Kafka sink's driver and tasks (the sink's ``options=`` override them):
key hashing as the Java client does it, and a local queue that holds a large batch (a full queue
is waited out, see :func:`produce`)."""

_CONTROL = r"[\x00-\x1f]"
_SPECIAL = r'[\x00-\x1f"\\]'
_UTC = ("UTC", "Etc/UTC")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)  # timestamps, dates, decimals: their ISO / plain text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default, separators=(",", ":"))


def row_json(row: dict[str, Any]) -> bytes:
    """One row (its Python values) as the JSON object a record's value holds."""
    return _dumps(row).encode()


def _escaped(text: Any) -> Any:
    """A string column without control characters, backslashes and quotes escaped for JSON."""
    for char, escape in (("\\", "\\\\"), ('"', '\\"')):
        if pc.any(pc.match_substring(text, char)).as_py():
            text = pc.replace_substring(text, char, escape)
    return text


def _pieces(col: pa.Array | pa.ChunkedArray) -> tuple[str, Any, str]:
    """``col``'s JSON text as ``(before, values, after)``.

    Each value's text is ``before + value + after``; when ``col`` has a null, ``values`` alone
    holds the text (``before`` and ``after`` empty).
    """
    t = col.type
    found: tuple[str, Any, str] | None = None
    if pa.types.is_large_string(t):  # one offset width for the join (a slice is far below 2 GB)
        col, t = pc.cast(col, pa.string()), pa.string()
    if pa.types.is_string(t):
        if not pc.any(pc.match_substring_regex(col, _SPECIAL)).as_py():
            found = ('"', col, '"')  # the common case: nothing to escape
        elif not pc.any(pc.match_substring_regex(col, _CONTROL)).as_py():
            found = ('"', _escaped(col), '"')
    elif pa.types.is_integer(t) or pa.types.is_boolean(t):
        found = ("", pc.cast(col, pa.string()), "")
    elif pa.types.is_date32(t):
        found = ('"', pc.cast(col, pa.string()), '"')
    elif pa.types.is_timestamp(t) and t.unit != "ns" and (t.tz is None or t.tz in _UTC):
        text = pc.cast(pc.cast(col, pa.timestamp("us")), pa.string())  # UTC wall time, 6 digits
        text = pc.if_else(pc.ends_with(text, ".000000"), pc.utf8_slice_codeunits(text, 0, 19), text)
        found = ('"', text, '+00:00"' if t.tz else '"')
    elif pa.types.is_floating(t) and len(col):  # no "," in a float's text: one dumps, one split
        return "", pa.array(_dumps(col.to_pylist())[1:-1].split(","), pa.string()), ""
    if found is None:
        return "", pa.array([_dumps(v) for v in col.to_pylist()], pa.string()), ""
    before, values, after = found
    if col.null_count == 0:
        return found
    return "", pc.fill_null(pc.binary_join_element_wise(before, values, after, ""), "null"), ""


def fragments(col: pa.Array | pa.ChunkedArray) -> Any:
    """Each value of ``col`` as JSON text (a null as ``null``), as :func:`row_json` writes it."""
    before, values, after = _pieces(col)
    return pc.binary_join_element_wise(before, values, after, "") if before or after else values


def objects(rows: pa.Table, names: list[str]) -> Any:
    """Each row's ``names`` columns as one JSON object (text), as :func:`row_json` writes it.

    One row-wise join: each column's quotes and suffix go into the literal text between columns.
    """
    if not names:
        return pa.array(["{}"] * rows.num_rows, pa.string())
    parts: list[Any] = []
    text = ""
    for i, name in enumerate(names):
        before, values, after = _pieces(rows.column(name))
        parts.append(text + ("{" if i == 0 else ",") + _dumps(name) + ":" + before)
        parts.append(values)
        text = after
    parts.append(text + "}")
    return pc.binary_join_element_wise(*parts, "")


def _is_text_or_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def _raw(col: pa.ChunkedArray) -> pa.Array:
    """A column's values as bytes: binary as is, text as UTF-8, anything else as ``str()``."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return pc.cast(col, pa.binary())
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return pc.cast(col, pa.binary())
    return pa.array([None if v is None else str(v).encode() for v in col.to_pylist()], pa.binary())


def json_columns(rows: pa.Table, spec: Table) -> list[str]:
    """The columns :func:`encode` writes as JSON text (a key object's, a value object's)."""
    cols, key_cols = rows.column_names, list(spec.key)
    raw_key = len(key_cols) == 1 and _is_text_or_bytes(rows.schema.field(key_cols[0]).type)
    out = [] if raw_key else list(key_cols)
    if not ("value" in cols and set(cols) <= {*key_cols, "value"} and "value" not in key_cols):
        out += [c for c in cols if c not in out]
    return out


def check_values(name: str, spec: Table, rows: pa.Table) -> None:
    """Refuse what a record's JSON would not hold as given (step 1 of the Kafka sink).

    A column written as raw bytes (a single text or binary key, the ``value`` column) holds
    anything; the others go through :func:`onceflow.sinks._core.checks.check_json`.

    Raises:
        BatchRejectedError: Naming the topic, the column, the row's key and the value.
    """
    check_json(f"topic {name!r}", spec, rows, json_columns(rows, spec))


def encode_arrays(rows: pa.Table, spec: Table) -> tuple[pa.Array, pa.Array]:
    """A table's rows as records, as two binary arrays: keys (all null without key columns), values."""
    rows = rows.combine_chunks()
    cols = rows.column_names
    key_cols = list(spec.key)
    single = rows.schema.field(key_cols[0]).type if len(key_cols) == 1 else None
    if not key_cols:
        keys: pa.Array = pa.nulls(rows.num_rows, pa.binary())
    elif single is not None and _is_text_or_bytes(single):
        keys = _raw(rows.column(key_cols[0]))  # never null: check_batch refuses a null key
    else:
        keys = pc.cast(objects(rows, key_cols), pa.binary())
    if "value" in cols and set(cols) <= {*key_cols, "value"} and "value" not in key_cols:
        values = _raw(rows.column("value"))
    else:
        values = pc.cast(objects(rows, cols), pa.binary())
    return _array(keys), _array(values)


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def encode(rows: pa.Table, spec: Table) -> tuple[list[bytes | None], list[bytes | None]]:
    """A table's rows as records: their keys (None without key columns) and their values."""
    keys, values = encode_arrays(rows, spec)
    return keys.to_pylist(), values.to_pylist()


def watermarks(consumer: Any, topic: str, timeout_s: float = 60.0, partition: int = 0) -> tuple[int, int]:
    """The low and high offsets of a partition of ``topic``, waiting out a leader not elected yet.

    A topic just created has no leader for a moment (``NOT_LEADER_FOR_PARTITION``,
    ``LEADER_NOT_AVAILABLE``): those two are retried until ``timeout_s``.

    Raises:
        KafkaException: Another error (e.g. ``UNKNOWN_TOPIC_OR_PART``: no such topic), or the
            retriable one still there after ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    waiting = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            tp = TopicPartition(topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            again = err is not None and err.code() in waiting
            if not again or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def settled_ends(committed: Any, raw: Any, topic: str, partitions: list[int], wait_s: float,
                 timeout_s: float = 60.0) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """Each partition's offsets as ``committed`` sees them, once no transaction is open on it.

    A ``read_committed`` consumer's end of a partition is its last stable offset: it stays before
    an open transaction's first record, and Kafka writes a committed transaction's markers just
    after the producer's ``commit_transaction`` returns. So a reader waits until that end equals
    the partition's end as a ``read_uncommitted`` consumer (``raw``) sees it.

    Args:
        committed: A ``read_committed`` consumer.
        raw: A ``read_uncommitted`` consumer.
        topic: The topic.
        partitions: Its partitions.
        wait_s: Longest wait for open transactions (a producer that died inside one leaves it open
            until its ``transaction.timeout.ms``).
        timeout_s: Longest read of one partition's offsets (:func:`watermarks`).

    Returns:
        ``{partition: (first offset, read_committed end)}``, and the partitions still open after
        ``wait_s`` (none: every end settled).
    """
    deadline = time.monotonic() + wait_s
    while True:
        ends = {p: watermarks(committed, topic, timeout_s, p) for p in partitions}
        full = {p: watermarks(raw, topic, timeout_s, p)[1] for p in partitions}
        still = sorted(p for p in partitions if ends[p][1] < full[p])
        if not still or time.monotonic() > deadline:
            return ends, still
        time.sleep(0.2)


def read_span(consumer: Any, topic: str, start: int, high: int, what: str,
              timeout_s: float = 60.0, partition: int = 0) -> Iterator[Any]:
    """The records at offsets ``[start, high)`` of a partition of ``topic``, read by ``consumer``.

    Args:
        consumer: A confluent-kafka consumer (its isolation level is the caller's).
        topic: A marker or registry topic.
        start: The first offset.
        high: The offset after the last.
        what: What is read (for the message).
        timeout_s: How long the whole read may take.
        partition: The partition.

    Raises:
        OnceflowError: The read did not reach ``high`` in ``timeout_s``.
    """
    from confluent_kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer.unassign()  # else position() still gives where a read of a later range ended
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout_s
    while consumer.position([tp])[0].offset < high:
        if time.monotonic() > deadline:
            raise OnceflowError(f"onceflow.kafka: reading {what} did not reach offset {high} in "
                                f"{timeout_s:.0f} s")
        # a short wait: a span that ends in a transaction's commit marker has no message left to
        # return, and consume() would wait out its whole timeout before the position moves past it
        for m in consumer.consume(1000, timeout=0.02):
            offset = m.offset()
            if m.error() is None and offset is not None and offset < high:
                yield m


def produce(producer: Any, topic: str, keys: list[bytes | None], values: list[bytes | None],
            headers: list[tuple[str, bytes]] | None) -> None:
    """Queue records to ``topic`` in order (a table's slice, or a marker); they leave with the flush.

    One ``produce`` call per record: librdkafka's batch call needs a dict per record, which costs
    more than it saves (BENCHMARKS.md). A full local queue is waited out before the record is
    queued, so the order stays the given one.

    Raises:
        KafkaException: librdkafka refused a record for another reason than a full queue.
    """
    send = producer.produce
    extra = {"headers": headers} if headers else {}
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                send(topic, value, key, **extra)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
