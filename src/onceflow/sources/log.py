"""The embedded event log: a directory of immutable Parquet segment files.

Layout: ``LOG_DIR/seg-<12-digit sequence>.parquet``. Lexical order of names is
append order, and the writer also makes modification times strictly increasing
in the same order, because Spark's file stream source orders new files by
modification time (measured on Spark 4.3) — with both orders equal, batches see
segments in append order.

Append protocol (one segment), safe against a crash at any step:

1. Write the table to a hidden ``LOG_DIR/.<name>.tmp``. Hidden names are
   ignored by Spark's file source and by :meth:`EventLog.segments`, so a partial
   file is never read.
2. ``fsync`` the temporary file.
3. Set its modification time above the previous segment's.
4. ``rename`` it to its final name (atomic on POSIX).
5. ``fsync`` the directory so the rename survives a power loss.

A crash before step 4 leaves only a hidden ``.tmp`` file, removed by the next
:meth:`EventLog.append` (``.seg-*``) or resolved by the ingest receiver's recovery
(``.ingest-*``, which stages and publishes in separate steps: :meth:`EventLog.stage` also
``fsync``s the directory after step 2, so a staged file whose name was recorded elsewhere
survives a power loss, and it can carry a token in its Parquet metadata that
:meth:`EventLog.find_token` finds again once the file is published). A crash after
step 4 leaves a complete segment. Segments are never modified after step 4;
the sequence number of a new segment is one more than the highest existing
one, so a restarted writer continues the order.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.errors import BadSegmentError
from onceflow.runtime.files import fsync_path
from onceflow.sources.events import EVENT_SCHEMA, schema_problems

SEGMENT_RE = re.compile(r"^seg-(\d{12})\.parquet$")
TOKEN_KEY = b"onceflow.ingest_token"
"""Parquet metadata key of the token a staged segment carries."""
_MS = 1_000_000  # nanoseconds per millisecond


@dataclass(frozen=True)
class Segment:
    """One published segment file.

    Attributes:
        seq: Its sequence number (append order).
        path: Absolute path of the file.
    """

    seq: int
    path: Path


_VALIDATED: dict[str, tuple[int, int, int]] = {}
"""Segments checked in this process, by path: (size, mtime_ns, the schema checked against)."""


class EventLog:
    """An append-only log of segments of one Arrow schema in one directory.

    Args:
        directory: The log directory; created on the first append.
        schema: The schema every segment must have: :data:`onceflow.sources.events.EVENT_SCHEMA`
            (Example 5-1's events) by default, any Arrow schema declared here, or None to take
            it from the first segment (a log of your own records). A segment or a table to
            append with another schema is refused (:class:`BadSegmentError`).
    """

    def __init__(self, directory: str | os.PathLike[str], schema: pa.Schema | None = EVENT_SCHEMA) -> None:
        self.directory = Path(directory).absolute()
        self._schema = schema

    @property
    def schema(self) -> pa.Schema | None:
        """The log's schema (None: not declared and no segment yet)."""
        if self._schema is None:
            first = self.segments()[:1]
            if first:
                self._schema = pq.read_schema(first[0].path).remove_metadata()
        return self._schema

    # ----------------------------------------------------------------- reading
    def segments(self) -> list[Segment]:
        """List published segments in append order.

        Returns:
            The segments; hidden and temporary files are not listed.

        Raises:
            BadSegmentError: A visible file that is not a segment lies in the
                directory (Spark would try to read it as Parquet).
        """
        if not self.directory.exists():
            return []
        out: list[Segment] = []
        for entry in os.scandir(self.directory):
            if entry.name.startswith((".", "_")):
                continue
            m = SEGMENT_RE.match(entry.name)
            if m is None:
                raise BadSegmentError(
                    str(Path(entry.path)),
                    "not a segment file name (expected seg-<12 digits>.parquet); "
                    "Spark would read it as part of the log",
                )
            out.append(Segment(int(m.group(1)), Path(entry.path)))
        out.sort(key=lambda s: s.seq)
        return out

    def validate(self, paths: Iterable[Path] | None = None) -> int:
        """Check that segments are readable Parquet with the event schema.

        Each file is checked once per process, whichever ``EventLog`` object asks
        (segments are immutable; a changed size or mtime is checked again). Only the
        footer is read.

        Args:
            paths: Files to check; all published segments when omitted.

        Returns:
            The number of files newly checked.

        Raises:
            BadSegmentError: Naming the first bad file and what is wrong.
        """
        if paths is None:
            paths = [s.path for s in self.segments()]
        checked = 0
        for path in paths:
            st = path.stat()
            key = (st.st_size, st.st_mtime_ns, id(self.schema))
            if _VALIDATED.get(str(path)) == key:
                continue
            try:
                schema = pq.read_schema(path)
            except Exception as exc:  # pyarrow raises several types for bad files
                raise BadSegmentError(str(path), f"unreadable Parquet ({exc})") from exc
            problems = schema_problems(schema, self.schema)
            if problems:
                raise BadSegmentError(str(path), "wrong schema: " + "; ".join(problems))
            _VALIDATED[str(path)] = key
            checked += 1
        return checked

    def read(self, paths: Iterable[Path] | None = None, columns: list[str] | None = None) -> pa.Table:
        """Read segments into one Arrow table (for tests, the demo check and audits).

        Args:
            paths: Files to read; all published segments when omitted.
            columns: Columns to read; all when omitted.

        Returns:
            The concatenated rows, in the order of ``paths``.
        """
        if paths is None:
            paths = [s.path for s in self.segments()]
        tables = [pq.read_table(p, columns=columns) for p in paths]
        if not tables:
            base = self.schema if self.schema is not None else EVENT_SCHEMA
            schema = base if columns is None else pa.schema([base.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)

    # ----------------------------------------------------------------- writing
    def append(self, table: pa.Table) -> Segment:
        """Publish ``table`` as the next segment (see the module's protocol).

        Args:
            table: Events with exactly the event schema.

        Returns:
            The published segment.

        Raises:
            BadSegmentError: ``table`` does not have the event schema (nothing is
                written).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".seg-*.tmp"):
            leftover.unlink(missing_ok=True)
        return self.publish(self.stage(table, ".seg-next.parquet.tmp"))

    def stage(self, table: pa.Table, name: str, token: str | None = None) -> Path:
        """Steps 1-2: write ``table`` durably under a hidden name, not yet in the log.

        The file and its directory entry are both fsynced before this returns.

        Args:
            table: Events with exactly the event schema.
            name: The hidden file name (must start with ``.`` and end with ``.tmp``).
            token: Kept in the file's Parquet metadata (see :meth:`find_token`).

        Returns:
            The staged file, for :meth:`publish`.

        Raises:
            BadSegmentError: ``table`` does not have the event schema (nothing is written).
        """
        if not (name.startswith(".") and name.endswith(".tmp")):
            raise ValueError(f"staged names are hidden .tmp files, got {name!r}")
        expected = self.schema if self.schema is not None else table.schema.remove_metadata()
        problems = schema_problems(table.schema, expected)
        if problems:
            raise BadSegmentError("<table to append>", "wrong schema: " + "; ".join(problems))
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / name
        out = table.select(expected.names)
        if token is not None:
            out = out.replace_schema_metadata({TOKEN_KEY: token.encode()})
        pq.write_table(out, tmp)  # 1
        fsync_path(tmp)  # 2
        fsync_path(self.directory)  # the staged name is durable too
        return tmp

    def find_token(self, token: str, last: int) -> Segment | None:
        """The published segment staged with ``token``, among the ``last`` newest ones.

        Args:
            token: As given to :meth:`stage`.
            last: How many of the newest segments to look at (footers only).

        Returns:
            The segment, or None if none of them carries the token.
        """
        for seg in reversed(self.segments()[-last:] if last > 0 else []):
            meta = pq.read_schema(seg.path).metadata or {}
            if meta.get(TOKEN_KEY) == token.encode():
                return seg
        return None

    def publish(self, staged: Path) -> Segment:
        """Steps 3-5: make a staged file the next segment.

        Args:
            staged: A file from :meth:`stage`.

        Returns:
            The published segment.
        """
        existing = self.segments()
        seq = existing[-1].seq + 1 if existing else 1
        floor_ns = existing[-1].path.stat().st_mtime_ns if existing else 0
        final = self.directory / f"seg-{seq:012d}.parquet"
        # 3. Spark compares modification times in milliseconds.
        mtime = max(time.time_ns() // _MS, floor_ns // _MS + 1) * _MS
        os.utime(staged, ns=(mtime, mtime))
        os.rename(staged, final)  # 4
        fsync_path(self.directory)  # 5
        return Segment(seq, final)

    def extend(self, tables: Iterable[pa.Table]) -> Iterator[Segment]:
        """Append several tables, one segment each, yielding each as published.

        Args:
            tables: Tables with the event schema.

        Yields:
            The published segments.
        """
        for t in tables:
            yield self.append(t)
