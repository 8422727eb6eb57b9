"""A large batch's scratch files copied into their tables while Spark's tasks still write the others.

Part of the SQLite sink's tasks path (:class:`onceflow.sinks.sqlite.sink.SQLiteTablesSink`, steps
T3-T4). SQLite has one writer: the driver copies every scratch file of a batch into its table in
one transaction with the batch's marker. Copied only after the last task returned, that copy is
on the batch's critical path after the tasks; copied while the later tasks still run, only the
last files' copy is. What :class:`EarlyCopy` does, for batch N, beside Spark's job:

1. A task renames its scratch file to its final name only once the file is complete
   (:func:`onceflow.sinks.sqlite.tasks.write_task`); a thread of the driver looks for such files
   of the table whose tasks run, every :data:`POLL_S` seconds.
2. At the first one it opens the batch's transaction (``BEGIN IMMEDIATE``: SQLite's write lock,
   held until T5; readers keep reading the last committed state), creates or checks the table
   (the sink's step 3), opens the file and copies it (the sink's copy: ``INSERT ... SELECT``),
   noting its path and the rows copied. A file read into memory is then removed: the kernel
   need not write back what only the transaction needed (a large batch's scratch files are as
   large as its rows). Nothing of it is visible: the marker and the commit come only in T4-T5,
   on the driver's thread, after Spark's job.
3. At T4 (:meth:`EarlyCopy.hand_over`) the thread stops. The early copies are kept only if every
   file copied is the file of an attempt Spark kept (its task's message names it) with the rows
   that message counts, and the thread met no error; else the transaction is rolled back and T4
   copies every kept file as it would have without this (a task attempt that completed its file
   and was then killed or outrun by another attempt — Spark's retries and speculation — is the
   usual cause). Where step 2 removed a kept file, T4 has nothing to copy it from:
   :class:`FilesGone`, and the sink runs the batch's tasks once more, without an early copy.

Only tables that need no look at the whole batch before their first row is written are copied
early: ``append`` and ``upsert`` tables (the batch's keys were proved unique in T1). An ``add``
table's 64-bit check folds every file's extents first, so its files wait for T4. Files are
opened as T4 opens them (:class:`onceflow.sinks.sqlite.tasks.Scratches`, shared with T4): read
into memory one by one, or attached while there is room.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.tasks import Scratches, is_scratch_of

_log = logging.getLogger("onceflow.sqlite")

POLL_S = 0.05
"""How often the thread looks for complete scratch files."""


class FilesGone(Exception):
    """Step 3 rolled back a copy whose files it had removed: the batch's tasks must write them again."""


class _Copier(Protocol):
    """What :class:`EarlyCopy` uses of the sink."""

    @property
    def conn(self) -> sqlite3.Connection: ...

    def _fit(self, name: str, spec: Table, schema: pa.Schema) -> None: ...

    def _copy(self, batch_id: int, name: str, spec: Table, columns: list[str], f: Mapping[str, Any],
              extents: Mapping[str, tuple[int, int]], alias: str) -> int: ...


class EarlyCopy:
    """Copies batch ``batch_id``'s complete scratch files while Spark's tasks write the rest (steps 1-3).

    Args:
        sink: The sink whose connection, table check and copy it uses.
        batch_id: The micro-batch.
        folder: The attempt's directory of scratch files.
    """

    def __init__(self, sink: _Copier, batch_id: int, folder: Path) -> None:
        self.sink = sink
        self.batch_id = batch_id
        self.folder = folder
        self.scratches = Scratches(sink.conn)
        """How files are opened in the transaction (T4 goes on with it)."""
        self.copied: dict[str, tuple[str, int]] = {}
        """Path -> (table, rows copied), in this transaction."""
        self.removed: set[str] = set()
        """The files copied and then removed (step 2)."""
        self.error: BaseException | None = None
        self._owns = False  # this object began the open transaction (until hand_over keeps it)
        self._table: tuple[str, Table, pa.Schema] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def takes(spec: Table) -> bool:
        """Whether a table of ``spec`` is copied early (``append`` and ``upsert``; not ``add``)."""
        return spec.mode in ("append", "upsert")

    @contextmanager
    def watching(self, name: str, spec: Table, schema: pa.Schema) -> Iterator[None]:
        """While Spark's tasks write table ``name``: copy its complete files (step 1)."""
        if not self.takes(spec):
            yield
            return
        with self._lock:
            self._table = (name, spec, schema)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="onceflow-early-copy", daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._table = None

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._scan()
            except BaseException as exc:  # noqa: BLE001 - T4 rolls back and copies without it
                self.error = exc
                return

    def _scan(self) -> None:
        """Steps 1-2 for the files complete now."""
        with self._lock:
            table = self._table
        if table is None or not self.scratches.room():
            return
        name, spec, schema = table
        try:
            found = sorted(e.name for e in os.scandir(self.folder) if is_scratch_of(name, e.name))
        except FileNotFoundError:  # no task has written yet
            return
        conn = self.sink.conn
        for file in found:
            path = str(self.folder / file)
            if path in self.copied or not self.scratches.room() or self._stop.is_set():
                continue  # (a file whose copy failed stops the thread: never tried twice)
            if not conn.in_transaction:
                conn.execute("BEGIN IMMEDIATE")
                self._owns = True
            self.sink._fit(name, spec, schema)  # the first file creates or checks; later ones find it
            alias = self.scratches.open(path)
            rows = self.sink._copy(self.batch_id, name, spec, list(schema.names),
                                   {"path": path, "rows": None}, {}, alias)
            self.copied[path] = (name, rows)
            if self.scratches.memory:  # its rows are in the transaction now: no need to keep the file
                os.unlink(path)
                self.removed.add(path)

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def hand_over(self, found: Mapping[str, tuple[pa.Schema, list[dict[str, Any]]]]) -> set[str]:
        """Step 3: the files already copied, for T4 to go on from (with :attr:`scratches`).

        Args:
            found: Table name -> (its columns, the files of the attempts Spark kept).

        Returns:
            The paths copied in the open transaction; with the transaction rolled back and
            nothing open: none.

        Raises:
            FilesGone: Rolled back, and a file of ``found`` was removed after its copy.
        """
        self._halt()
        kept = {str(f["path"]): (name, int(f["rows"])) for name, (_, files) in found.items() for f in files}
        conn = self.sink.conn
        if conn.in_transaction and self.error is None and all(
                kept.get(path) == done for path, done in self.copied.items()):
            self._owns = False
            return set(self.copied)
        self.close()
        gone = sorted(path for path in kept if path in self.removed)
        if gone:
            said = (f"batch {self.batch_id}: the early copy was rolled back (a file of an attempt Spark "
                    f"did not keep, or an error) and had removed {len(gone)} kept scratch file(s), e.g. "
                    f"{gone[0]}")
            _log.warning("%s; the batch's tasks run again", said)
            raise FilesGone(said)
        return set()

    def close(self) -> None:
        """Stop; roll back what was copied and close the files unless T4 took them over."""
        self._halt()
        conn = self.sink.conn
        if self._owns:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self.scratches.close()
        self.copied, self._owns = {}, False
