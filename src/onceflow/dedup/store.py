"""Key/value stores of the dedup catalog: where seen ids live, one table per bucket.

:class:`CatalogStore` is what :class:`onceflow.dedup.DedupCatalog` needs from a store;
:class:`SqliteStore` is the embedded default and :class:`onceflow.dedup.pgstore.PostgresStore`
keeps the same tables in a PostgreSQL server. Besides the ids, a store keeps the persisted GC
watermark and the ingest receiver's pending segments (``(token, file)`` rows), so that ids and
a pending segment are committed in one transaction.

Every write method commits durably before it returns (SQLite ``synchronous=FULL``; PostgreSQL
with ``synchronous_commit`` on) and may be called twice with the same arguments: inserts
ignore ids already present, deletes and drops of what is gone are no-ops.
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

CHUNK = 500
"""Ids per lookup statement."""


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
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=60,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS dedup_meta(key TEXT PRIMARY KEY, value INTEGER)")
        self.conn.execute("CREATE TABLE IF NOT EXISTS ingest_pending(token TEXT PRIMARY KEY, file TEXT)")
        self._tables = {int(name[len("dedup_b"):]) for (name,) in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'dedup_b[0-9]*'")}
        try:  # ids travel as one JSON array per statement: 1.5-1.8x faster than executemany (measured)
            self.conn.execute("SELECT value FROM json_each('[1]')").fetchall()
            self._json = True
        except sqlite3.OperationalError:  # an SQLite built without JSON
            self._json = False

    def __repr__(self) -> str:
        return f"sqlite:{self.path}"

    def watermark(self) -> int:
        """See :class:`CatalogStore`."""
        row = self.conn.execute("SELECT value FROM dedup_meta WHERE key = 'gc_watermark_us'").fetchone()
        return int(row[0]) if row else 0

    def stored(self, bucket: int, ids: Sequence[str]) -> set[str]:
        """See :class:`CatalogStore`."""
        if bucket not in self._tables or not ids:
            return set()
        if self._json:
            return {r[0] for r in self.conn.execute(
                f"SELECT event_id FROM {_table(bucket)} WHERE event_id IN "
                "(SELECT value FROM json_each(?))", (json.dumps(list(ids)),))}
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
        conn.execute("BEGIN IMMEDIATE")
        try:
            if pending is not None:
                conn.execute("INSERT OR REPLACE INTO ingest_pending VALUES (?, ?)", pending)
            for bucket, ids in by_bucket.items():
                if bucket not in self._tables:
                    conn.execute(f"CREATE TABLE IF NOT EXISTS {_table(bucket)}"
                                 "(event_id TEXT PRIMARY KEY) WITHOUT ROWID")
                if self._json:
                    conn.execute(f"INSERT OR IGNORE INTO {_table(bucket)} SELECT value FROM json_each(?)",
                                 (json.dumps(ids),))
                else:
                    conn.executemany(f"INSERT OR IGNORE INTO {_table(bucket)} VALUES (?)",
                                     [(i,) for i in ids])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._tables.update(by_bucket)

    def advance(self, mark: int, gone: Sequence[int]) -> int:
        """See :class:`CatalogStore`."""
        deleted = 0
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT OR REPLACE INTO dedup_meta VALUES ('gc_watermark_us', ?)", (mark,))
            for b in gone:
                if b in self._tables:
                    deleted += int(conn.execute(f"SELECT count(*) FROM {_table(b)}").fetchone()[0])
                    conn.execute(f"DROP TABLE {_table(b)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._tables.difference_update(gone)
        return deleted

    def pending(self) -> list[tuple[str, str]]:
        """See :class:`CatalogStore`."""
        return [(str(t), str(f)) for t, f in self.conn.execute("SELECT token, file FROM ingest_pending")]

    def pending_done(self, token: str) -> None:
        """See :class:`CatalogStore`."""
        self.conn.execute("DELETE FROM ingest_pending WHERE token = ?", (token,))

    def close(self) -> None:
        """See :class:`CatalogStore`."""
        self.conn.close()
