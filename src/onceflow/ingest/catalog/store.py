"""Key/value stores of the dedup catalog: where seen ids live, one table per bucket.

:class:`CatalogStore` is what :class:`onceflow.ingest.catalog.DedupCatalog` needs from a store;
:class:`SqliteStore` is the embedded default and :class:`onceflow.ingest.catalog.pgstore.PostgresStore`
keeps the same tables in a PostgreSQL server. Besides the ids, a store keeps the persisted GC
watermark and the ingest receiver's pending segments (``(token, file)`` rows), so that ids and
a pending segment are committed in one transaction.

Every write method commits durably before it returns (SQLite ``synchronous=FULL``; PostgreSQL
with ``synchronous_commit`` on) and may be called twice with the same arguments: inserts
ignore ids already present, deletes and drops of what is gone are no-ops.

Ids are bound as statement parameters, byte for byte (never passed through a function such
as SQLite's ``json_each``, which cuts a string at a NUL). A pending row keeps the ids its
transaction recorded (``ids``: JSON ``{bucket: [id, ...]}``), so that recovery can take them
back if the segment they belong to was never written (:meth:`CatalogStore.unrecord`).

A failed write names its cause: a full disk or a read-only file is a
:class:`onceflow.errors.StorageError` saying so, not the secondary error of a rollback.
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

from onceflow.errors import StorageError

CHUNK = 999
"""Ids per lookup statement (SQLite's historic limit of bound parameters)."""


def pending_ids(by_bucket: dict[int, list[str]]) -> str:
    """The ``ids`` of a pending row: what its transaction recorded, as JSON."""
    return json.dumps({str(b): ids for b, ids in by_bucket.items()})


def parse_pending_ids(raw: str | None) -> dict[int, list[str]]:
    """Inverse of :func:`pending_ids` (a row without ids: nothing)."""
    return {int(b): list(ids) for b, ids in json.loads(raw).items()} if raw else {}


def sqlite_failure(exc: sqlite3.Error, what: str, path: Path) -> StorageError:
    """A clear error for a failed SQLite operation: disk full and read-only named as such."""
    text = str(exc)
    if "full" in text:
        return StorageError("full", f"{what} failed: the disk holding {path} is full ({text}); free "
                                    "space and retry (nothing was recorded)")
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return StorageError("read_only", f"{what} failed: {path} cannot be written ({text}); make it "
                                         "writable (a read-only file, directory or mount?)")
    return StorageError("io", f"{what} failed on {path}: {text}")


class CatalogStore(ABC):
    """The operations the catalog runs on its store.

    Attributes:
        _tables: Buckets that have a table; kept by the subclass (read at open, updated
            by its inserts and drops).
    """

    _tables: set[int]

    @abstractmethod
    def watermark(self) -> int:
        """The persisted GC watermark (microseconds; 0 if never set)."""

    @abstractmethod
    def setting(self, name: str, value: str) -> str:
        """The catalog's persisted setting ``name``; set to ``value`` if it has none yet.

        Returns:
            The setting's value (``value`` on first use, else what was stored first).
        """

    def buckets(self) -> set[int]:
        """Buckets that have a table (may hold ids)."""
        return set(self._tables)

    @abstractmethod
    def stored(self, bucket: int, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` the bucket holds."""

    @abstractmethod
    def scan(self, bucket: int) -> Iterator[str]:
        """Every id of the bucket (to build its Bloom filter)."""

    @abstractmethod
    def insert(self, by_bucket: dict[int, list[str]], pending: tuple[str, str] | None = None) -> None:
        """Add ids to their buckets and, if given, the pending row, in one durable transaction.

        Tables are created as needed; ids already there are ignored.
        """

    @abstractmethod
    def advance(self, mark: int, gone: Sequence[int]) -> int:
        """In one durable transaction: persist the watermark and drop the ``gone`` buckets.

        Returns:
            Ids deleted.
        """

    @abstractmethod
    def pending(self) -> list[tuple[str, str]]:
        """The pending ``(token, file)`` rows."""

    @abstractmethod
    def unrecord(self, token: str) -> int:
        """In one durable transaction: delete the ids a pending row recorded, and the row.

        For a pending segment that was never written (its events are lost, and no sender
        got an ack): the ids must not stay recorded, or the senders' retries would be
        answered ``duplicate``.

        Returns:
            Ids deleted.
        """

    @abstractmethod
    def pending_done(self, token: str) -> None:
        """Delete a pending row (durably)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store."""


def _table(bucket: int) -> str:
    return f"dedup_b{int(bucket)}"  # an int: safe to compose


class SqliteStore(CatalogStore):
    """The embedded store: tables ``dedup_b<bucket>(event_id PRIMARY KEY) WITHOUT ROWID``.

    Args:
        path: The SQLite file (created with its directory if missing).

    Raises:
        StorageError: The file cannot be created or written (read-only, disk full).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=60,
                                        check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            with self._write("creating the dedup catalog's tables"):
                self.conn.execute("CREATE TABLE IF NOT EXISTS dedup_meta(key TEXT PRIMARY KEY, "
                                  "value INTEGER)")
                self.conn.execute("CREATE TABLE IF NOT EXISTS ingest_pending(token TEXT PRIMARY KEY, "
                                  "file TEXT, ids TEXT)")
                if "ids" not in {r[1] for r in self.conn.execute("PRAGMA table_info(ingest_pending)")}:
                    self.conn.execute("ALTER TABLE ingest_pending ADD COLUMN ids TEXT")
        except sqlite3.Error as exc:
            raise sqlite_failure(exc, "opening the dedup catalog", self.path) from None
        except OSError as exc:
            raise StorageError("read_only", f"cannot create the dedup catalog {self.path}: {exc}") from None
        self._tables = {int(name[len("dedup_b"):]) for (name,) in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'dedup_b[0-9]*'")}

    def __repr__(self) -> str:
        return f"sqlite:{self.path}"

    def _write(self, what: str) -> _SqliteTxn:
        return _SqliteTxn(self.conn, what, self.path)

    def watermark(self) -> int:
        """See :class:`CatalogStore`."""
        row = self.conn.execute("SELECT value FROM dedup_meta WHERE key = 'gc_watermark_us'").fetchone()
        return int(row[0]) if row else 0

    def setting(self, name: str, value: str) -> str:
        """See :class:`CatalogStore`."""
        with self._write("recording a setting of the dedup catalog"):
            self.conn.execute("INSERT OR IGNORE INTO dedup_meta VALUES (?, ?)", (f"setting:{name}", value))
        row = self.conn.execute("SELECT value FROM dedup_meta WHERE key = ?", (f"setting:{name}",)).fetchone()
        return str(row[0])

    def stored(self, bucket: int, ids: Sequence[str]) -> set[str]:
        """See :class:`CatalogStore`."""
        if bucket not in self._tables or not ids:
            return set()
        found: set[str] = set()
        for i in range(0, len(ids), CHUNK):
            part = ids[i:i + CHUNK]
            marks = ",".join("?" * len(part))
            found.update(r[0] for r in self.conn.execute(
                f"SELECT event_id FROM {_table(bucket)} WHERE event_id IN ({marks})", part))
        return found

    def scan(self, bucket: int) -> Iterator[str]:
        """See :class:`CatalogStore`."""
        if bucket in self._tables:
            yield from (r[0] for r in self.conn.execute(f"SELECT event_id FROM {_table(bucket)}"))

    def insert(self, by_bucket: dict[int, list[str]], pending: tuple[str, str] | None = None) -> None:
        """See :class:`CatalogStore`."""
        conn = self.conn
        with self._write("recording ids in the dedup catalog"):
            if pending is not None:
                conn.execute("INSERT OR REPLACE INTO ingest_pending VALUES (?, ?, ?)",
                             (*pending, pending_ids(by_bucket)))
            for bucket, ids in by_bucket.items():
                if bucket not in self._tables:
                    conn.execute(f"CREATE TABLE IF NOT EXISTS {_table(bucket)}"
                                 "(event_id TEXT PRIMARY KEY) WITHOUT ROWID")
                conn.executemany(f"INSERT OR IGNORE INTO {_table(bucket)} VALUES (?)", [(i,) for i in ids])
        self._tables.update(by_bucket)

    def unrecord(self, token: str) -> int:
        """See :class:`CatalogStore`."""
        conn = self.conn
        deleted = 0
        with self._write("taking back the ids of a lost segment"):
            row = conn.execute("SELECT ids FROM ingest_pending WHERE token = ?", (token,)).fetchone()
            for bucket, ids in parse_pending_ids(row[0] if row else None).items():
                if bucket in self._tables:
                    before = conn.total_changes
                    conn.executemany(f"DELETE FROM {_table(bucket)} WHERE event_id = ?", [(i,) for i in ids])
                    deleted += conn.total_changes - before
            conn.execute("DELETE FROM ingest_pending WHERE token = ?", (token,))
        return deleted

    def advance(self, mark: int, gone: Sequence[int]) -> int:
        """See :class:`CatalogStore`."""
        deleted = 0
        conn = self.conn
        with self._write("advancing the dedup catalog's GC watermark"):
            conn.execute("INSERT OR REPLACE INTO dedup_meta VALUES ('gc_watermark_us', ?)", (mark,))
            for b in gone:
                if b in self._tables:
                    deleted += int(conn.execute(f"SELECT count(*) FROM {_table(b)}").fetchone()[0])
                    conn.execute(f"DROP TABLE {_table(b)}")
        self._tables.difference_update(gone)
        return deleted

    def pending(self) -> list[tuple[str, str]]:
        """See :class:`CatalogStore`."""
        return [(str(t), str(f)) for t, f in self.conn.execute("SELECT token, file FROM ingest_pending")]

    def pending_done(self, token: str) -> None:
        """See :class:`CatalogStore`."""
        with self._write("deleting a pending row of the dedup catalog"):
            self.conn.execute("DELETE FROM ingest_pending WHERE token = ?", (token,))

    def close(self) -> None:
        """See :class:`CatalogStore`."""
        self.conn.close()


class _SqliteTxn:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; on failure a rollback that cannot hide the cause.

    SQLite rolls a transaction back by itself when a write hits a full disk; a second
    ``ROLLBACK`` would then fail with "no transaction is active" and mask the real error,
    so the rollback runs only while a transaction is open, and SQLite's error becomes a
    :class:`StorageError` naming the condition.
    """

    def __init__(self, conn: sqlite3.Connection, what: str, path: Path) -> None:
        self.conn, self.what, self.path = conn, what, path

    def __enter__(self) -> None:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise sqlite_failure(exc, self.what, self.path) from None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None:
            try:
                self.conn.execute("COMMIT")
                return
            except sqlite3.Error as failed:
                exc = failed
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise sqlite_failure(exc, self.what, self.path) from None
