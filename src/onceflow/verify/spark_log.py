"""The auditor's own reader of Spark's checkpoint: batch ids, watermarks, a file source's files.

The oracle must not reuse what the pipeline uses (:mod:`onceflow.checkpoint.logs`, the sinks): a
bug there would then pass unseen. This module reads the few files it needs the way Spark
documents and writes them on a local file system, and nothing else:

* ``offsets/<N>``: a version line (``v1``), a metadata line (JSON: ``batchWatermarkMs``,
  ``batchTimestampMs``, ``conf``), then one line per source with its end offset (``-``: none).
  The planned batches are the numeric file names.
* ``commits/<N>``: present once batch N's sink wrote it and Spark committed it.
* ``sources/<i>/<k>`` and ``sources/<i>/<k>.compact`` (a file source's log): a version line
  and one JSON entry per file (``path``, ``timestamp``, ``batchId``: the log id ``k`` that
  added it). A compact file holds every entry up to its id. A file source's offset line is
  ``{"logOffset": k}``: batch N's files are the entries with a log id in
  ``(logOffset of N-1, logOffset of N]``.
* A Kafka source's offset line: Spark's connector logs ``{"topic": {"partition": next offset}}``
  and writes batch 0's start once to ``sources/<i>/0`` (a NUL byte, ``v1``, the same JSON);
  onceflow's Python source nests the offsets under ``"offsets"`` (``"from"``: where it resumed
  after offsets deleted unread) and starts batch 0 at offset 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from onceflow.errors import CheckpointReadError


def _ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def planned(checkpoint: Path) -> list[int]:
    """The batch ids Spark planned (``offsets/``), ascending."""
    return _ids(checkpoint / "offsets")


def committed(checkpoint: Path) -> list[int]:
    """The batch ids Spark committed (``commits/``), ascending."""
    return _ids(checkpoint / "commits")


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckpointReadError(f"cannot read {path}: {exc}") from None
    lines = text.split("\n")
    if not lines or not lines[0].startswith("v"):
        raise CheckpointReadError(f"{path} does not start with a version line (not Spark's log file)")
    return [ln for ln in lines[1:] if ln.strip()]


@dataclass(frozen=True)
class Planned:
    """One ``offsets/N`` file.

    Attributes:
        batch_id: N.
        watermark_ms: ``batchWatermarkMs``: the watermark in force while N ran (evictions).
        offsets: Each source's end offset as JSON (None: ``-``, no offset yet).
    """

    batch_id: int
    watermark_ms: int
    offsets: tuple[Any, ...]


def read_offsets(checkpoint: Path, batch_id: int) -> Planned:
    """``offsets/<batch_id>``."""
    lines = _lines(checkpoint / "offsets" / str(batch_id))
    if not lines:
        raise CheckpointReadError(f"{checkpoint / 'offsets' / str(batch_id)} has no metadata line")
    meta = json.loads(lines[0])
    offsets = tuple(None if ln.strip() == "-" else json.loads(ln) for ln in lines[1:])
    return Planned(batch_id, int(meta.get("batchWatermarkMs", 0)), offsets)


def kafka_start(checkpoint: Path, source: int = 0) -> Any:
    """Batch 0's start offsets of a Kafka source read by Spark's connector (None: another source)."""
    path = checkpoint / "sources" / str(source) / "0"
    try:
        lines = [ln for ln in path.read_bytes().decode("utf-8", "replace").lstrip("\x00").splitlines()
                 if ln.strip()]
    except OSError:
        return None
    if len(lines) < 2 or not lines[0].startswith("v"):
        return None
    try:
        value = json.loads(lines[1])
    except ValueError:
        return None
    return value if isinstance(value, dict) and "path" not in value else None


def late_watermark_ms(checkpoint: Path, batch_id: int) -> int:
    """The watermark a row of batch N is late against: the one of batch N-1 (0 for the first).

    Spark filters late rows with the watermark of the previous batch (the one in force when N
    was planned); a row with an event time at or before it is dropped.
    """
    if batch_id == 0 or not (checkpoint / "offsets" / str(batch_id - 1)).exists():
        return 0
    return read_offsets(checkpoint, batch_id - 1).watermark_ms


def _local(path: str) -> Path:
    parsed = urlparse(path)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(path)


def source_entries(checkpoint: Path, source: int = 0) -> dict[int, list[Path]]:
    """A file source's log: log id -> the files it added."""
    directory = checkpoint / "sources" / str(source)
    if not directory.is_dir():
        raise CheckpointReadError(f"{directory} does not exist: the query has no file source {source}")
    out: dict[int, dict[str, Path]] = {}
    for p in sorted(directory.iterdir()):
        name = p.name
        if not (name.isdigit() or (name.endswith(".compact") and name[:-8].isdigit())):
            continue
        for line in _lines(p):
            entry = json.loads(line)
            out.setdefault(int(entry["batchId"]), {})[str(entry["path"])] = _local(str(entry["path"]))
    return {k: sorted(v.values()) for k, v in sorted(out.items())}


def batch_files(checkpoint: Path, batch_id: int, source: int = 0,
                entries: dict[int, list[Path]] | None = None) -> list[Path]:
    """The files batch N of a file source read (see the module)."""
    def position(b: int) -> int:
        value = read_offsets(checkpoint, b).offsets[source]
        if not isinstance(value, dict) or "logOffset" not in value:
            raise CheckpointReadError(f"offsets/{b} of {checkpoint}: source {source} is not a file source "
                                      f"(offset {value!r})")
        return int(value["logOffset"])

    end = position(batch_id)
    start = position(batch_id - 1) if batch_id > 0 and read_offsets(checkpoint, batch_id - 1).offsets[
        source] is not None else -1
    log = entries if entries is not None else source_entries(checkpoint, source)
    return [f for k, files in log.items() if start < k <= end for f in files]


def in_flight(checkpoint: Path) -> list[int]:
    """Batches planned and not committed (what a kill at this moment interrupted)."""
    done = set(committed(checkpoint))
    return [b for b in planned(checkpoint) if b not in done]


def reads_input(checkpoint: Path, batch_id: int) -> bool:
    """Whether planned batch ``batch_id`` reads input: a source's end offset moved since N-1.

    A no-data batch (Spark's, to advance the watermark) repeats N-1's offsets. An offset file
    that cannot be read (being written) counts as no input.
    """
    try:
        now = read_offsets(checkpoint, batch_id).offsets
        before = read_offsets(checkpoint, batch_id - 1).offsets if batch_id > 0 else ()
    except (CheckpointReadError, OSError, ValueError):
        return False
    return any(o is not None for o in now) and now != before
