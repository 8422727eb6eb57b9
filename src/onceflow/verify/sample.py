"""The input of ``onceflow verify --pipeline``: the user's sample files, fed in rounds.

The sample directory holds the files the user's pipeline reads (JSON lines, CSV, Parquet, text or
ORC, as its ``readStream`` says). :func:`pieces` cuts it into per-round pieces — one file of the
sample may become several — so that every round feeds new input while its driver runs (a fault
must meet a batch with data): Parquet by rows (schema kept), line-based formats by lines (a CSV
header line repeated in every piece), other files whole. :class:`SampleInput` writes a piece into
the directory the pipeline reads the way a producer should: to a hidden name (Spark's file source
skips names starting with ``.``), then renamed, so a batch never reads half a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.errors import ConfigError
from onceflow.verify.inputs import rounds_of

LINES = (".json", ".jsonl", ".ndjson", ".csv", ".txt", ".tsv")
"""Suffixes cut by lines."""


@dataclass(frozen=True)
class Piece:
    """One file to write into the pipeline's input directory.

    Attributes:
        name: Its file name there.
        data: Its bytes, or the Arrow rows of a Parquet piece.
        num_rows: Records in it (lines, or Parquet rows; 0 when unknown: a whole binary file).
    """

    name: str
    data: bytes | pa.Table
    num_rows: int


def _cut(path: Path, parts: int) -> list[Piece]:
    stem, suffix = path.stem, path.suffix
    if suffix == ".parquet":
        table = pq.read_table(path)
        step = max(-(-table.num_rows // parts), 1)
        return [Piece(f"{stem}-{i:03d}{suffix}", table.slice(o, step), min(step, table.num_rows - o))
                for i, o in enumerate(range(0, table.num_rows, step))]
    if suffix.lower() not in LINES:
        return [Piece(path.name, path.read_bytes(), 0)]
    lines = path.read_bytes().splitlines(keepends=True)
    header = [lines.pop(0)] if suffix.lower() in (".csv", ".tsv") and lines else []
    lines = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in lines if ln.strip()]
    step = max(-(-len(lines) // parts), 1)
    return [Piece(f"{stem}-{i:03d}{suffix}", b"".join(header + lines[o:o + step]), len(lines[o:o + step]))
            for i, o in enumerate(range(0, len(lines), step))]


def pieces(sample: Path, rounds: int, per_round: int = 3) -> list[list[Piece]]:
    """The sample cut into ``rounds`` lists of about ``per_round`` pieces each, in file order.

    Raises:
        ConfigError: The sample directory is missing or has no files.
    """
    if not sample.is_dir():
        raise ConfigError(f"--input {sample}: not a directory (give the directory of sample files your "
                          "pipeline reads)")
    files = sorted(p for p in sample.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise ConfigError(f"--input {sample} has no files to feed")
    wanted = rounds * per_round
    each = max(-(-wanted // len(files)), 1)
    cut = [p for f in files for p in _cut(f, each)]
    return rounds_of(cut, rounds)


class SampleInput:
    """The directory the user's pipeline reads; :meth:`append` adds a piece atomically.

    Args:
        directory: The pipeline's ``input`` directory.
        pipeline: ``PATH.py:FUNCTION`` (for the drivers).
    """

    def __init__(self, directory: Path, pipeline: str) -> None:
        self.directory, self.pipeline = directory, pipeline
        directory.mkdir(parents=True, exist_ok=True)

    def append(self, piece: Any) -> None:
        """Write one piece (hidden name, then rename)."""
        tmp = self.directory / f".{piece.name}.tmp"
        if isinstance(piece.data, pa.Table):
            pq.write_table(piece.data, tmp)
        else:
            tmp.write_bytes(piece.data)
        os.replace(tmp, self.directory / piece.name)

    def in_place(self) -> int:
        """Pieces already in the directory (a resumed run)."""
        return sum(1 for p in self.directory.iterdir() if not p.name.startswith("."))

    def driver_kw(self) -> dict[str, Any]:
        """``--pipeline``/``--input`` instead of the event log."""
        return {"pipeline": (self.pipeline, self.directory)}

    def oracle_inputs(self, checkpoint: Path) -> None:
        """Not used: the pipeline oracle reads the batches' files itself."""
        return None

    def close(self) -> None:
        """Nothing to release."""
