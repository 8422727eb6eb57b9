"""The dedup catalog's store in PostgreSQL (``onceflow ingest serve --catalog-dsn``).

Tables (created on first use, in the connection's current schema; ``<name>`` is the
catalog's name, so several catalogs can share a database):

* ``onceflow_dedup_<name>_b<bucket>(event_id text PRIMARY KEY)`` — one per system-time
  bucket; GC drops whole tables;
* ``onceflow_dedup_meta(catalog, gc_watermark_us)`` — the persisted GC watermark;
* ``onceflow_dedup_settings(catalog, key, value)`` — settings fixed at first use (the id scope);
* ``onceflow_dedup_pending(catalog, token, file, ids)`` — the ingest receiver's pending segments
  (``ids``: what their transaction recorded, see :mod:`onceflow.ingest.catalog.store`).

One process at a time may use a catalog: the store holds a session advisory lock on its
name and refuses to open while another process holds it (two receivers deduplicating
against one catalog but appending to different logs would both accept an id).
PostgreSQL's ``text`` cannot hold a NUL character: ids with one are refused with a
:class:`onceflow.errors.ConfigError` before anything is written (the ingest receiver rejects
them in its validation already). Identifiers are composed with ``psycopg.sql``; every
write is its own transaction, durable when it returns (the server's ``synchronous_commit`` must stay on).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from onceflow.errors import ConfigError, PostgresError
from onceflow.ingest.catalog.store import CHUNK, CatalogStore, parse_pending_ids, pending_ids
from onceflow.sinks.postgres.conn import connect, redact, require_psycopg, resolve_dsn

NAME_RE = re.compile(r"^[a-z0-9_]{1,32}$")

_DDL = """
CREATE TABLE IF NOT EXISTS onceflow_dedup_meta(
    catalog text PRIMARY KEY, gc_watermark_us bigint NOT NULL);
CREATE TABLE IF NOT EXISTS onceflow_dedup_pending(
    catalog text NOT NULL, token text NOT NULL, file text NOT NULL, PRIMARY KEY(catalog, token));
ALTER TABLE onceflow_dedup_pending ADD COLUMN IF NOT EXISTS ids text;
CREATE TABLE IF NOT EXISTS onceflow_dedup_settings(
    catalog text NOT NULL, key text NOT NULL, value text NOT NULL, PRIMARY KEY(catalog, key));
"""


class PostgresStore(CatalogStore):
    """Seen ids in PostgreSQL tables (see the module).

    Args:
        dsn: Connection string (else ``$ONCEFLOW_PG_DSN``).
        name: The catalog's name, ``[a-z0-9_]{1,32}``.

    Raises:
        ConfigError: A bad name, or another process holds the catalog.
        PostgresError: The server cannot be reached.
    """

    def __init__(self, dsn: str | None, name: str = "ingest") -> None:
        require_psycopg()
        if not NAME_RE.match(name):
            raise ConfigError(f"catalog name must match [a-z0-9_]{{1,32}}, got {name!r}")
        self.dsn = resolve_dsn(dsn)
        self.name = name
        self.prefix = f"onceflow_dedup_{name}_b"
        import psycopg
        from psycopg import sql

        self._sql, self._error = sql, psycopg.Error
        self._conn: Any = self._open()
        conn = self._conn
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow_dedup_ddl'))")
            for stmt in filter(None, (s.strip() for s in _DDL.split(";"))):
                conn.execute(stmt)
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND starts_with(tablename, %s)", (self.prefix,)).fetchall()
        self._tables = {int(t[len(self.prefix):]) for (t,) in rows if t[len(self.prefix):].isdigit()}

    def _open(self) -> Any:
        """A new session holding the catalog's advisory lock (or ConfigError: another holds it)."""
        conn = connect(self.dsn)  # names the extra to install if psycopg is missing
        locked = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                              (f"onceflow_dedup:{self.name}",)).fetchone()[0]
        if not locked:
            conn.close()
            raise ConfigError(f"the dedup catalog {self.name!r} at {redact(self.dsn)} is in use by another "
                              "process (one receiver per catalog); stop it or choose another name")
        return conn

    @property
    def conn(self) -> Any:
        """The session; a new one (lock taken again) if the server or the network dropped it.

        Each method takes it once, so a transaction never spans two sessions.
        """
        if self._conn.broken:
            self._conn = self._open()
        return self._conn

    def __repr__(self) -> str:
        return f"postgres:{redact(self.dsn)} catalog {self.name}"

    @staticmethod
    def _check(ids: Sequence[str]) -> None:
        if any("\x00" in i for i in ids):
            raise ConfigError("an event id contains a NUL character, which PostgreSQL text cannot hold; "
                              "such ids are refused (nothing was written)")

    def _table(self, bucket: int) -> Any:
        return self._sql.Identifier(f"{self.prefix}{int(bucket)}")

    def watermark(self) -> int:
        """See :class:`CatalogStore`."""
        conn = self.conn
        row = conn.execute("SELECT gc_watermark_us FROM onceflow_dedup_meta WHERE catalog = %s",
                           (self.name,)).fetchone()
        return int(row[0]) if row else 0

    def setting(self, name: str, value: str) -> str:
        """See :class:`CatalogStore`."""
        conn = self.conn
        conn.execute("INSERT INTO onceflow_dedup_settings VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                     (self.name, name, value))
        return str(conn.execute("SELECT value FROM onceflow_dedup_settings WHERE catalog = %s "
                                "AND key = %s", (self.name, name)).fetchone()[0])

    def stored(self, bucket: int, ids: Sequence[str]) -> set[str]:
        """See :class:`CatalogStore`."""
        conn = self.conn
        self._check(ids)
        if bucket not in self._tables or not ids:
            return set()
        q = self._sql.SQL("SELECT event_id FROM {} WHERE event_id = ANY(%s)").format(self._table(bucket))
        found: set[str] = set()
        for i in range(0, len(ids), CHUNK * 10):
            found.update(r[0] for r in conn.execute(q, (list(ids[i:i + CHUNK * 10]),)))
        return found

    def scan(self, bucket: int) -> Iterator[str]:
        """See :class:`CatalogStore`."""
        conn = self.conn
        if bucket in self._tables:
            q = self._sql.SQL("SELECT event_id FROM {}").format(self._table(bucket))
            yield from (r[0] for r in conn.cursor().stream(q))

    def insert(self, by_bucket: dict[int, list[str]], pending: tuple[str, str] | None = None) -> None:
        """See :class:`CatalogStore`."""
        conn = self.conn
        sql = self._sql
        for ids in by_bucket.values():
            self._check(ids)
        try:
            with conn.transaction():
                if pending is not None:
                    conn.execute(
                        "INSERT INTO onceflow_dedup_pending VALUES (%s, %s, %s, %s) ON CONFLICT "
                        "(catalog, token) DO UPDATE SET file = EXCLUDED.file, ids = EXCLUDED.ids",
                        (self.name, *pending, pending_ids(by_bucket)))
                for bucket, ids in by_bucket.items():
                    if bucket not in self._tables:
                        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}(event_id text PRIMARY KEY)")
                                     .format(self._table(bucket)))
                    conn.execute(sql.SQL("INSERT INTO {} SELECT unnest(%s::text[]) "
                                         "ON CONFLICT DO NOTHING").format(self._table(bucket)), (ids,))
        except self._error as exc:
            raise PostgresError(f"recording ids in the dedup catalog {self.name!r} failed: {exc}") from None
        self._tables.update(by_bucket)

    def advance(self, mark: int, gone: Sequence[int]) -> int:
        """See :class:`CatalogStore`."""
        conn = self.conn
        sql = self._sql
        deleted = 0
        with conn.transaction():
            conn.execute(
                "INSERT INTO onceflow_dedup_meta VALUES (%s, %s) ON CONFLICT (catalog) "
                "DO UPDATE SET gc_watermark_us = greatest(onceflow_dedup_meta.gc_watermark_us, "
                "EXCLUDED.gc_watermark_us)", (self.name, mark))
            for b in gone:
                if b in self._tables:
                    deleted += int(conn.execute(sql.SQL("SELECT count(*) FROM {}")
                                                .format(self._table(b))).fetchone()[0])
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._table(b)))
        self._tables.difference_update(gone)
        return deleted

    def pending(self) -> list[tuple[str, str]]:
        """See :class:`CatalogStore`."""
        conn = self.conn
        return [(str(t), str(f)) for t, f in conn.execute(
            "SELECT token, file FROM onceflow_dedup_pending WHERE catalog = %s", (self.name,))]

    def unrecord(self, token: str) -> int:
        """See :class:`CatalogStore`."""
        conn = self.conn
        sql = self._sql
        deleted = 0
        try:
            with conn.transaction():
                row = conn.execute("SELECT ids FROM onceflow_dedup_pending WHERE catalog = %s "
                                   "AND token = %s", (self.name, token)).fetchone()
                for bucket, ids in parse_pending_ids(row[0] if row else None).items():
                    if bucket in self._tables:
                        deleted += conn.execute(sql.SQL("DELETE FROM {} WHERE event_id = ANY(%s)")
                                                .format(self._table(bucket)), (ids,)).rowcount
                conn.execute("DELETE FROM onceflow_dedup_pending WHERE catalog = %s AND token = %s",
                             (self.name, token))
        except self._error as exc:
            raise PostgresError(f"taking back ids in the dedup catalog {self.name!r} failed: {exc}") from None
        return deleted

    def pending_done(self, token: str) -> None:
        """See :class:`CatalogStore`."""
        conn = self.conn
        conn.execute("DELETE FROM onceflow_dedup_pending WHERE catalog = %s AND token = %s",
                     (self.name, token))

    def close(self) -> None:
        """See :class:`CatalogStore`; releases the catalog's lock."""
        self._conn.close()
