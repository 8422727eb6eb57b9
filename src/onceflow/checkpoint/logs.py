"""Read Spark's own streaming checkpoint: which input and watermark each batch had.

Spark writes, before it runs micro-batch ``N``:

* ``offsets/N`` — line 1 ``v1``, line 2 JSON metadata with ``batchWatermarkMs``
  (the watermark used to *evict* state in batch N), then one offset per source;
* ``sources/<i>/N`` — for a file source, one JSON line per file of batch N.
  Every ``compactInterval`` batches Spark writes ``N.compact`` instead, holding the
  entries of all batches so far (each entry names its ``batchId``), and later
  deletes the plain files it replaces;

and after the sink returned, ``commits/N``.

Spark's late-record rule, measured on Spark 4.3 with several stateful operators:
a row of batch N is dropped as late iff its event time is ``<=`` the watermark of
batch ``N-1`` (``offsets/N-1``); batch 0 drops nothing. :func:`late_watermark_ms`
gives that watermark and :func:`count_late` applies the rule.

These readers never write to the checkpoint. For a source without files to re-count,
:func:`plan_counts` reads a running batch's input rows and late drops from Spark's metrics of
the plan it executed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.errors import CheckpointReadError, UncountableInputError


def read_log_lines(path: Path) -> list[str]:
    """The lines of one Spark log file (``offsets/N``, ``commits/N``, ``sources/i/N``), version line first.

    Raises:
        CheckpointReadError: The file cannot be read or has no version line.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CheckpointReadError(f"cannot read checkpoint file {path}: {exc}") from exc
    if not lines or not lines[0].startswith("v"):
        raise CheckpointReadError(f"checkpoint file {path} has no version header")
    return lines


def _read_log_file(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in read_log_lines(path)[1:] if line.strip()]


def query_id(checkpoint: str | os.PathLike[str]) -> str | None:
    """The stable query id Spark stored in ``metadata``; None before the first start.

    Args:
        checkpoint: The checkpoint directory.

    Returns:
        The id, or None when the checkpoint has not been started yet.
    """
    meta = Path(checkpoint) / "metadata"
    if not meta.exists():
        return None
    return str(json.loads(meta.read_text().splitlines()[0])["id"])


def _batch_ids(directory: Path) -> list[int]:
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def offset_batches(checkpoint: str | os.PathLike[str]) -> list[int]:
    """Batch ids with an entry in the offset log (planned batches).

    Args:
        checkpoint: The checkpoint directory.

    Returns:
        Sorted batch ids.
    """
    return _batch_ids(Path(checkpoint) / "offsets")


def committed_batches(checkpoint: str | os.PathLike[str]) -> list[int]:
    """Batch ids with an entry in the commit log (finished batches).

    Args:
        checkpoint: The checkpoint directory.

    Returns:
        Sorted batch ids.
    """
    return _batch_ids(Path(checkpoint) / "commits")


def batch_watermark_ms(checkpoint: str | os.PathLike[str], batch_id: int) -> int:
    """``batchWatermarkMs`` of batch ``batch_id`` (its eviction watermark).

    Args:
        checkpoint: The checkpoint directory.
        batch_id: The batch.

    Returns:
        The watermark in epoch milliseconds.

    Raises:
        CheckpointReadError: The offset log has no such batch.
    """
    entries = _read_log_file(Path(checkpoint) / "offsets" / str(batch_id))
    return int(str(entries[0]["batchWatermarkMs"]))


def late_watermark_ms(checkpoint: str | os.PathLike[str], batch_id: int) -> int:
    """The watermark Spark drops late rows of batch ``batch_id`` against.

    Args:
        checkpoint: The checkpoint directory.
        batch_id: The batch.

    Returns:
        Epoch milliseconds; 0 for batch 0.
    """
    return 0 if batch_id == 0 else batch_watermark_ms(checkpoint, batch_id - 1)


def _uri_to_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise CheckpointReadError(f"only local files are supported, got {uri}")
    return Path(unquote(parsed.path))


def _log_offset(checkpoint: Path, batch_id: int, source: int) -> int:
    entries = _read_log_file(checkpoint / "offsets" / str(batch_id))
    offsets = entries[1:]
    if len(offsets) <= source or not isinstance(offsets[source], dict):
        raise CheckpointReadError(
            f"offsets/{batch_id} in {checkpoint} has no file-source offset for source {source}"
        )
    return int(str(offsets[source]["logOffset"]))


def source_offset(checkpoint: str | os.PathLike[str], batch_id: int,
                  source: int = 0) -> dict[str, object] | None:
    """The end offset Spark logged for one source of batch ``batch_id`` (``offsets/N``).

    Args:
        checkpoint: The checkpoint directory.
        batch_id: The batch.
        source: Index of the source in the query.

    Returns:
        The source's offset as it serialized it (a JSON object), or None when absent.
    """
    entries = _read_log_file(Path(checkpoint) / "offsets" / str(batch_id))[1:]
    found = entries[source] if len(entries) > source else None
    return found if isinstance(found, dict) else None


def source_log_entries(directory: Path, log_id: int) -> list[dict[str, object]]:
    """The entries of one id of a file source's log (a plain file, or within a later compact file)."""
    plain = directory / str(log_id)
    if plain.exists():
        return _read_log_file(plain)
    compacts = sorted(
        (int(p.name.split(".")[0]), p)
        for p in directory.glob("*.compact")
        if int(p.name.split(".")[0]) >= log_id
    )
    if not compacts:
        raise CheckpointReadError(f"no source-log entry {log_id} in {directory}")
    return [e for e in _read_log_file(compacts[0][1]) if e.get("batchId") == log_id]


def batch_files(
    checkpoint: str | os.PathLike[str], batch_id: int, source: int = 0
) -> list[Path]:
    """Files Spark's file source assigned to batch ``batch_id``.

    Streaming batch ids and file-source log ids differ (a batch that only
    advances the watermark reads no files), so the batch's files are the
    source-log entries with ids in ``(logOffset(N-1), logOffset(N)]``.

    Args:
        checkpoint: The checkpoint directory.
        batch_id: The batch.
        source: Index of the source in the query (0 for a single source).

    Returns:
        The batch's files in Spark's order (empty for a no-data batch).

    Raises:
        CheckpointReadError: The offset log or source log lacks an entry.
    """
    root = Path(checkpoint)
    current = _log_offset(root, batch_id, source)
    previous = _log_offset(root, batch_id - 1, source) if batch_id > 0 else -1
    directory = root / "sources" / str(source)
    files: list[Path] = []
    for log_id in range(previous + 1, current + 1):
        files.extend(_uri_to_path(str(e["path"])) for e in source_log_entries(directory, log_id))
    return files


@dataclass(frozen=True)
class BatchInput:
    """What Spark fed into one micro-batch, read back from the checkpoint.

    Attributes:
        batch_id: The batch.
        files: Its input files.
        late_watermark_ms: Rows with event time ``<=`` this are dropped as late.
    """

    batch_id: int
    files: list[Path]
    late_watermark_ms: int


def batch_input(checkpoint: str | os.PathLike[str], batch_id: int) -> BatchInput:
    """Read the input of one batch from the checkpoint.

    Args:
        checkpoint: The checkpoint directory.
        batch_id: The batch.

    Returns:
        Its files and late watermark.
    """
    return BatchInput(
        batch_id, batch_files(checkpoint, batch_id), late_watermark_ms(checkpoint, batch_id)
    )


def late_mask(event_time: pa.Array | pa.ChunkedArray, watermark_ms: int) -> np.ndarray:
    """Which rows Spark's rule drops as late against ``watermark_ms``.

    Args:
        event_time: Event times (Arrow timestamps in microseconds).
        watermark_ms: The late watermark of the batch.

    Returns:
        A boolean array, True for late rows.
    """
    micros = np.asarray(event_time.cast(pa.int64()).to_numpy(zero_copy_only=False))
    if watermark_ms <= 0:
        return np.zeros(len(micros), dtype=bool)
    return micros <= watermark_ms * 1000


def count_late(event_time: pa.Array | pa.ChunkedArray, watermark_ms: int) -> int:
    """Count the rows Spark's rule drops as late.

    Args:
        event_time: Event times (Arrow timestamps in microseconds).
        watermark_ms: The late watermark of the batch.

    Returns:
        The number of late rows.
    """
    return int(late_mask(event_time, watermark_ms).sum())


def count_input(batch: BatchInput, event_time: str | None) -> tuple[int, int]:
    """Rows in a batch's Parquet files, and how many of them Spark's late rule drops.

    Row groups whose Parquet statistics prove that no event time is ``<=`` the watermark
    are counted from metadata alone; only the others have their event-time column read.

    Args:
        batch: The batch's files and late watermark.
        event_time: The event-time column (a timestamp); None: nothing is late.

    Returns:
        ``(input rows, late rows)``.

    Raises:
        UncountableInputError: A file is not Parquet or lacks the event-time column.
    """
    rows = late = 0
    bound_us = batch.late_watermark_ms * 1000
    for path in batch.files:
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise UncountableInputError(f"cannot count the rows of {path} (only Parquet files are "
                                        f"counted): {exc}") from None
        col = pf.schema_arrow.get_field_index(event_time) if event_time else -1
        if event_time and col < 0:
            raise UncountableInputError(f"{path} has no event-time column {event_time!r} (the query "
                                        "derives it)")
        for rg in range(pf.metadata.num_row_groups):
            meta = pf.metadata.row_group(rg)
            rows += meta.num_rows
            if col < 0 or batch.late_watermark_ms <= 0:
                continue
            stats = meta.column(col).statistics
            if stats is not None and stats.has_min_max and isinstance(stats.min_raw, int) \
                    and int(stats.min_raw) > bound_us:
                continue
            times = pf.read_row_group(rg, columns=[event_time]).column(0)
            late += count_late(times, batch.late_watermark_ms)
    return rows, late


def _metric(metrics: Any, name: str) -> int | None:
    found = metrics.get(name)
    return int(found.get().value()) if found.isDefined() else None


@dataclass(frozen=True)
class PlanCounts:
    """What the plan Spark executed for a batch counted (summed over every run of the plan).

    Attributes:
        input_rows: Rows its scans read.
        late_dropped: Rows its stateful operators dropped as late.
        duplicates: Rows its deduplications dropped (None: the plan has no deduplication).
        root_rows: Rows its topmost counting operator produced (None: none counts).
    """

    input_rows: int
    late_dropped: int
    duplicates: int | None
    root_rows: int | None


def plan_counts(spark: Any, query_id: str) -> PlanCounts | None:
    """What the current batch of the query ``query_id`` read, dropped as late and as duplicates.

    Read inside ``foreachBatch`` from the plan Spark executed for the batch — the metrics
    Spark's progress reports are built from:

    1. ``foreachBatch`` hands over a DataFrame over the RDD of the batch's physical plan (the
       query's ``lastExecution``); whatever ``per_batch`` computes from it runs that plan.
    2. After it ran, every leaf of that plan (a source's scan) holds ``numOutputRows``: the
       rows the batch read; every stateful operator holds ``numRowsDroppedByWatermark``: the
       rows it dropped as late; a deduplication holds ``numDroppedDuplicateRows``.
    3. The metrics add up over executions: a plan computed twice counts twice, so the caller
       uses them only when it can tell the plan ran once (the scans read what the batch's
       files hold, or the top of the plan produced the batch's rows), never for a batch whose
       outputs came from a persisted stable copy (the plan did not run).

    Args:
        spark: The session running the query.
        query_id: The query's id (stable across restarts; the checkpoint's ``metadata``).

    Returns:
        The counts, or None when the query or its plan is not reachable.
    """
    try:
        query = spark.streams.get(query_id)
        if query is None:
            return None
        plan = query._jsq.streamingQuery().lastExecution().executedPlan()
    except Exception:  # py4j: another Spark build, a query stopping
        return None
    rows = late = 0
    dups: int | None = None
    root: int | None = None
    todo = [plan]
    while todo:
        node = todo.pop()
        metrics, children = node.metrics(), node.children()
        out = _metric(metrics, "numOutputRows")
        if root is None:
            root = out
        n = children.size()
        if n == 0:
            rows += out or 0
        late += _metric(metrics, "numRowsDroppedByWatermark") or 0
        dropped = _metric(metrics, "numDroppedDuplicateRows")
        if dropped is not None:
            dups = (dups or 0) + dropped
        todo.extend(children.apply(i) for i in reversed(range(n)))
    return PlanCounts(rows, late, dups, root)
