"""A batch's input range: what Spark's checkpoint planned for micro-batch N, kept in N's marker.

Spark plans batch N by writing ``offsets/N`` (its watermark and timestamp, then one end offset
per source); N's input is everything from the previous batch's end offsets (``offsets/N-1``) to
these. For a file source the offset is a position in the source's own log (``sources/<i>/``),
whose entries name the files; two checkpoints can give the same position to different files
(one restored from a backup, then fed other files), so the range of a file source is its files.

:func:`read` builds an :class:`InputRange` from the checkpoint; the sink keeps it as JSON in the
batch's marker (column ``input_range``). It serves two purposes:

* **A replay is the same batch.** When the sink finds N's marker, onceflow compares the marker's
  range with the one Spark planned now; another input (a checkpoint restored from an older copy
  re-planned N over other data) is refused, never skipped as a replay.
* **Restoring a checkpoint's batches.** ``onceflow repair`` writes ``offsets/N`` and a file
  source's log entries back from the marker (:func:`write`), so that Spark re-plans N exactly.

Spark's checkpoint files are read and written as Spark does on a local file system: the
version line ``v1``, one JSON value per line; a file's Hadoop checksum ``.<name>.crc`` is
removed whenever onceflow replaces or deletes the file (Hadoop skips the check without one).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.checkpoint.logs import read_log_lines, source_log_entries
from onceflow.errors import CheckpointReadError

COMPACT_INTERVAL = 10
"""Spark's default ``spark.sql.streaming.fileSource.log.compactInterval``."""


@dataclass(frozen=True)
class InputRange:
    """The input Spark planned for one micro-batch.

    Attributes:
        batch_id: The batch.
        watermark_ms: ``batchWatermarkMs`` of ``offsets/N``.
        timestamp_ms: ``batchTimestampMs`` of ``offsets/N``.
        end: Each source's end offset, as Spark serialized it (one line of ``offsets/N``).
        start: Each source's start offset (from ``offsets/N-1``; None for batch 0).
        files: Source index -> the source-log entries of the batch (file sources only), as Spark
            wrote them (``path``, ``timestamp``, ``batchId``: the log id).
    """

    batch_id: int
    watermark_ms: int
    timestamp_ms: int
    end: tuple[str, ...]
    start: tuple[str, ...] | None
    files: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> str:
        """The range as the marker keeps it."""
        return json.dumps({"v": 1, "watermark_ms": self.watermark_ms, "timestamp_ms": self.timestamp_ms,
                           "start": list(self.start) if self.start is not None else None,
                           "end": list(self.end), "files": {str(k): v for k, v in self.files.items()}},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, batch_id: int, text: str) -> InputRange:
        """The range a marker keeps (see :meth:`to_json`).

        Raises:
            CheckpointReadError: The text is not a range this onceflow wrote.
        """
        try:
            raw = json.loads(text)
            start = raw["start"]
            return cls(batch_id, int(raw["watermark_ms"]), int(raw["timestamp_ms"]), tuple(raw["end"]),
                       tuple(start) if start is not None else None,
                       {int(k): list(v) for k, v in raw["files"].items()})
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointReadError(f"the marker of batch {batch_id} has an input range onceflow cannot "
                                      f"read ({exc}): {text[:200]}") from None

    def key(self) -> str:
        """A digest of the input itself: the offsets, and a file source's files (not their log ids)."""
        files = {str(k): sorted(str(e["path"]) for e in v) for k, v in sorted(self.files.items())}
        body = json.dumps({"start": None if self.start is None else [_offset(s) for s in self.start],
                           "end": [_offset(e) for e in self.end], "files": files}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def same_input(self, other: InputRange) -> bool:
        """Whether ``other`` is the same input (offsets and files; watermark and timestamp aside)."""
        return self.key() == other.key()

    def has_input(self) -> bool:
        """Whether the range holds input: files, or an end offset past its start.

        A no-data batch (Spark's, to advance the watermark) has its predecessor's offsets. For
        batch 0 (no start) any positive number in an end offset counts as input; an offset
        onceflow cannot read counts as input too.
        """
        for i, end in enumerate(self.end):
            if i in self.files:
                if self.files[i]:
                    return True
                continue
            start = self.start[i] if self.start is not None and i < len(self.start) else None
            if start is None:
                if _positive(_offset(end)):
                    return True
            elif _offset(start) != _offset(end):
                return True
        return False

    def records(self) -> int | None:
        """The records between the start and end offsets of every non-file source (None: unknown).

        Each offset's numbers (e.g. Kafka's per partition) are summed, end minus start; without a
        start (batch 0) the end's numbers, an upper bound. None when a source is a file source or
        an offset holds no numbers onceflow can read.
        """
        total = 0
        for i, end in enumerate(self.end):
            start = self.start[i] if self.start is not None and i < len(self.start) else None
            ends = _numbers(_offset(end))
            starts = _numbers(_offset(start)) if start is not None else {}
            if i in self.files or ends is None or starts is None:
                return None
            total += sum(max(v - starts.get(k, 0), 0) for k, v in ends.items())
        return total

    def describe(self) -> str:
        """The range in a line a user can check against the source."""
        parts = []
        for i, end in enumerate(self.end):
            if i in self.files:
                names = [Path(str(e["path"])).name for e in self.files[i]]
                shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                parts.append(f"source {i}: {len(names)} file(s)" + (f" ({shown})" if names else ""))
            else:
                start = self.start[i] if self.start is not None and i < len(self.start) else None
                parts.append(f"source {i}: {start or 'the start'} -> {end}")
        return "; ".join(parts) or "no sources"


def _offset(line: str) -> Any:
    """One offset line as a value to compare (JSON normalized; Spark's ``-``: no offset)."""
    try:
        return json.loads(line)
    except ValueError:
        return line


def _numbers(value: Any, path: str = "") -> dict[str, int] | None:
    """An offset's integers by their path in it (``{"t": {"0": 5}}`` -> ``{"t/0": 5}``); None: not all."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return {path: value}
    if isinstance(value, dict):
        out: dict[str, int] = {}
        for k, v in value.items():
            inner = _numbers(v, f"{path}/{k}")
            if inner is None:
                return None
            out.update(inner)
        return out
    return None


def _positive(value: Any) -> bool:
    """Whether an offset value holds a positive number (or is not JSON onceflow can read)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value > 0
    if isinstance(value, dict):
        return any(_positive(v) for v in value.values())
    if isinstance(value, list):
        return any(_positive(v) for v in value)
    return isinstance(value, str) and value not in ("-", "")


def offsets_lines(checkpoint: Path, batch_id: int) -> tuple[dict[str, Any], list[str]]:
    """``offsets/N``: its metadata and each source's end offset line."""
    lines = read_log_lines(checkpoint / "offsets" / str(batch_id))
    if len(lines) < 2:
        raise CheckpointReadError(f"{checkpoint / 'offsets' / str(batch_id)} has no metadata line")
    return json.loads(lines[1]), lines[2:]


def checkpoint_conf(checkpoint: Path, planned: list[int]) -> dict[str, Any] | None:
    """Spark's settings fixed in the checkpoint: ``conf`` of the newest readable plan's metadata.

    Spark restarts a query with these (shuffle partitions, the state store provider, ...),
    whatever the session says.

    Args:
        checkpoint: The checkpoint directory.
        planned: Its planned batch ids (:func:`onceflow.checkpoint.logs.offset_batches`).

    Returns:
        The settings, or None when no plan can be read.
    """
    for b in reversed(planned):
        try:
            return dict(offsets_lines(checkpoint, b)[0].get("conf", {}))
        except CheckpointReadError:
            continue
    return None


def log_position(line: str) -> int | None:
    """A file source's position in its log, from its offset line (None: not a file source's offset)."""
    value = _offset(line)
    if isinstance(value, dict) and "logOffset" in value:
        return int(value["logOffset"])
    return None


def source_log(checkpoint: Path, source: int) -> Path:
    """A file source's log directory."""
    return checkpoint / "sources" / str(source)


def read(checkpoint: str | os.PathLike[str], batch_id: int) -> InputRange:
    """Batch ``batch_id``'s input range, from Spark's checkpoint.

    Raises:
        CheckpointReadError: The checkpoint lacks the batch's offsets or a file source's entries.
    """
    root = Path(checkpoint)
    meta, end = offsets_lines(root, batch_id)
    start = offsets_lines(root, batch_id - 1)[1] if batch_id > 0 else None
    files: dict[int, list[dict[str, Any]]] = {}
    for i, line in enumerate(end):
        current = log_position(line)
        if current is None or not source_log(root, i).is_dir():
            continue
        previous = log_position(start[i]) if start is not None and i < len(start) else None
        first = previous + 1 if previous is not None else 0
        files[i] = [e for log_id in range(first, current + 1)
                    for e in source_log_entries(source_log(root, i), log_id)]
    return InputRange(batch_id, int(meta.get("batchWatermarkMs", 0)), int(meta.get("batchTimestampMs", 0)),
                      tuple(end), tuple(start) if start is not None else None, files)


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (temporary file, fsync, rename), dropping its stale checksum."""
    remove(path)
    tmp = path.with_name(f".{path.name}.onceflow-tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove(path: Path) -> None:
    """Delete one checkpoint file and its Hadoop checksum file (missing ones are fine)."""
    for p in (path, path.with_name(f".{path.name}.crc")):
        p.unlink(missing_ok=True)


def _log_text(entries: list[dict[str, Any]]) -> str:
    return "v1\n" + "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries)


def write_source_log(directory: Path, log_id: int, entries: list[dict[str, Any]],
                     interval: int = COMPACT_INTERVAL) -> None:
    """Write one id of a file source's log as Spark would: plain, or (every ``interval``) compact.

    A compact file holds every entry up to its id: the earlier ones are read from the log.
    """
    if (log_id + 1) % interval:
        _write_atomic(directory / str(log_id), _log_text(entries))
        return
    earlier = [e for i in range(log_id) for e in source_log_entries(directory, i)]
    _write_atomic(directory / f"{log_id}.compact", _log_text(earlier + entries))


def write(checkpoint: str | os.PathLike[str], r: InputRange, conf: dict[str, Any]) -> None:
    """Restore batch N's plan into the checkpoint: a file source's log entries, then ``offsets/N``.

    Spark then runs N over exactly this input at the next start (``commits/N`` is the caller's).

    Args:
        checkpoint: The checkpoint directory.
        r: The range, as a marker kept it.
        conf: The ``conf`` of ``offsets/N``'s metadata (Spark's settings fixed in the checkpoint).
    """
    root = Path(checkpoint)
    for source, entries in sorted(r.files.items()):
        by_id: dict[int, list[dict[str, Any]]] = {}
        for e in entries:
            by_id.setdefault(int(e["batchId"]), []).append(e)
        for log_id in sorted(by_id):
            write_source_log(source_log(root, source), log_id, by_id[log_id])
    meta = {"batchWatermarkMs": r.watermark_ms, "batchTimestampMs": r.timestamp_ms, "conf": conf}
    _write_atomic(root / "offsets" / str(r.batch_id),
                  "v1\n" + json.dumps(meta, separators=(",", ":")) + "\n" + "\n".join(r.end))


def write_commit(checkpoint: str | os.PathLike[str], batch_id: int, next_watermark_ms: int) -> None:
    """Write ``commits/N`` as Spark does (the watermark the next batch starts with)."""
    _write_atomic(Path(checkpoint) / "commits" / str(batch_id),
                  "v1\n" + json.dumps({"nextBatchWatermarkMs": next_watermark_ms}, separators=(",", ":")))
