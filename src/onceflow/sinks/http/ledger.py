"""The side-effect sink's ledger: which effect keys were started, which the service confirmed.

A database every process of the query reaches — the driver, and Spark's tasks when they call a
large batch's effects: a SQLite file (WAL, ``synchronous=FULL``; on a cluster, a path every
executor reaches) or a PostgreSQL database (``ledger="postgresql://..."``: reached over the
network, no shared file system). Either holds onceflow's usual tables (the batch marker
``onceflow_batches``, the checkpoint binding ``onceflow_sinks``, the table registry) and two of
its own:

* ``onceflow_effects`` — one row per effect key ever started by a sink id: the batch that
  started it, the SHA-256 of its payload, ``state`` (``started``: recorded before its call,
  no success answer recorded yet; ``confirmed``: the service answered 2xx and the ledger
  recorded it), the calls made, the last HTTP status and the times;
* ``onceflow_effect_batches`` — per batch, what processing did and what was committed, kept
  apart: ``effects`` (rows of the batch), ``new_keys``, ``known_keys`` (confirmed by an earlier
  batch or attempt: not sent), ``resent`` (started by a crashed attempt and sent again —
  idempotent services only), ``held`` (started by a crashed attempt, not sent again: a service
  without idempotency), ``calls`` (HTTP calls attempted, retries included), ``applied`` and
  ``replayed`` (2xx answers: applied now, or recognised as applied before), ``confirmed``
  (recorded in the ledger), ``unconfirmed`` (left ``started``) and ``seconds``.

``SELECT * FROM onceflow_effects WHERE state = 'started'`` lists the keys to reconcile with the
service after a crash (see :mod:`onceflow.sinks.http.sink` for when there are any).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.sinks._core import marker
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite import db as sqlite_db

_EFFECTS = """
CREATE TABLE IF NOT EXISTS onceflow_effects(
    sink_id TEXT NOT NULL, key TEXT NOT NULL, batch_id {int} NOT NULL, payload_sha TEXT NOT NULL,
    state TEXT NOT NULL, calls {int} NOT NULL DEFAULT 0, status {int},
    started_ms {int} NOT NULL, confirmed_ms {int}, PRIMARY KEY(sink_id, key)){rowid};
CREATE TABLE IF NOT EXISTS onceflow_effect_batches(
    sink_id TEXT NOT NULL, batch_id {int} NOT NULL, effects {int} NOT NULL,
    new_keys {int} NOT NULL, known_keys {int} NOT NULL, resent {int} NOT NULL,
    held {int} NOT NULL, calls {int} NOT NULL, applied {int} NOT NULL,
    replayed {int} NOT NULL, confirmed {int} NOT NULL, unconfirmed {int} NOT NULL,
    seconds {real} NOT NULL, PRIMARY KEY(sink_id, batch_id));
"""
SCHEMA = sqlite_db.META_SCHEMA + _EFFECTS.format(int="INTEGER", real="REAL", rowid=" WITHOUT ROWID")
"""The SQLite ledger's tables."""
PG_SCHEMA = _EFFECTS.format(int="bigint", real="double precision", rowid="")
"""The PostgreSQL ledger's own tables (onceflow's metadata tables are the PostgreSQL sink's)."""

METRICS = ("effects", "new_keys", "known_keys", "resent", "held", "calls", "applied", "replayed",
           "confirmed", "unconfirmed")


_KEY_VALUES = re.compile(r"\s*(\w+\s*=\s*('[^']*'|\S*)\s*)+")


def is_dsn(ledger: str | Path) -> bool:
    """Whether ``ledger`` names a PostgreSQL database, not a SQLite file.

    A ``postgresql://`` or ``postgres://`` URL, or libpq's ``key=value`` form naming a
    ``host`` or a ``dbname`` (``host=db1 dbname=app``).
    """
    if not isinstance(ledger, str):
        return False
    if ledger.startswith(("postgresql://", "postgres://")):
        return True
    return bool(_KEY_VALUES.fullmatch(ledger)) and bool(re.search(r"\b(host|dbname)\s*=", ledger))


def where(ledger: str | Path) -> str:
    """How to name a ledger in messages (a DSN without its password)."""
    if is_dsn(ledger):
        from onceflow.sinks.postgres.conn import redact

        return redact(str(ledger))
    return str(ledger)


def open_ledger(ledger: str | Path, sink_id: str) -> Ledger:
    """The ledger ``ledger`` names: a PostgreSQL URL or a SQLite file."""
    return PgLedger(str(ledger), sink_id) if is_dsn(ledger) else SQLiteLedger(Path(ledger), sink_id)


def read_batches(ledger: str | Path, sink_id: str) -> list[dict[str, Any]]:
    """The sink's marker rows in a ledger, by batch id (without opening the ledger's own tables)."""
    if is_dsn(ledger):
        from onceflow.sinks.postgres import sql as pg

        return pg.read_batches(str(ledger), sink_id)
    return sqlite_db.read_batches(ledger, sink_id)


@dataclass(frozen=True)
class Effect:
    """One call to make: its idempotency key and its JSON payload."""

    key: str
    payload: str

    @property
    def sha(self) -> str:
        """SHA-256 of the payload (hex)."""
        return hashlib.sha256(self.payload.encode()).hexdigest()


@dataclass
class Plan:
    """What step 2 decided for a batch: the calls to make and the counts so far."""

    send: list[Effect]
    counts: dict[str, int]
    changed: list[str]


class Ledger(abc.ABC):
    """One ledger database (see the module): the steps' reads and writes, in the database's SQL.

    Statements are written with ``?`` placeholders; a backend runs them in its driver's style.

    Attributes:
        sink_id: The sink's namespace in it.
        where: How messages name the database.
    """

    sink_id: str
    where: str

    @abc.abstractmethod
    def bind(self, query_id: str) -> None:
        """Tie the sink id to a checkpoint (the sink's ``bind``)."""

    @abc.abstractmethod
    def claim(self, specs: Mapping[str, Table], tool: str) -> None:
        """Claim the tables for this sink id (:mod:`onceflow.sinks._core.owners`)."""

    @abc.abstractmethod
    def _tx(self) -> contextlib.AbstractContextManager[None]:
        """One write transaction, exclusive against the sink's other writers; rolled back on error."""

    @abc.abstractmethod
    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A statement's rows (none for a write)."""

    @abc.abstractmethod
    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """A statement for each of ``rows``."""

    @abc.abstractmethod
    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """A query's rows as dicts by column name."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""

    def has_marker(self, batch_id: int) -> bool:
        """Whether the batch's marker is in the ledger (committed)."""
        return bool(self._rows(sqlite_db.HAS_MARKER, (self.sink_id, batch_id)))  # ``?``: both backends

    def start(self, batch_id: int, effects: Sequence[Effect], resend_started: bool) -> Plan | None:
        """Step 2: record every new key as ``started``, durably, before any call; None for a replay.

        Args:
            batch_id: The batch.
            effects: Its effects (keys unique).
            resend_started: Send keys a crashed attempt left ``started`` again (the service
                honours idempotency keys); else hold them back for reconciliation.

        Returns:
            The calls to make, or None if the batch's marker exists.
        """
        now = int(time.time() * 1000)
        with self._tx():
            if self.has_marker(batch_id):
                return None
            known: dict[str, tuple[str, str, int]] = {}
            keys = [e.key for e in effects]
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                rows = self._rows(f"SELECT key, state, payload_sha, batch_id FROM onceflow_effects "
                                  f"WHERE sink_id = ? AND key IN ({','.join('?' * len(chunk))})",
                                  (self.sink_id, *chunk))
                known.update({k: (s, h, b) for k, s, h, b in rows})
            plan = Plan([], dict.fromkeys(METRICS, 0), [])
            plan.counts["effects"] = len(effects)
            fresh = []
            for e in effects:
                state = known.get(e.key)
                if state is None:
                    fresh.append((self.sink_id, e.key, batch_id, e.sha, "started", now))
                    plan.send.append(e)
                    plan.counts["new_keys"] += 1
                    continue
                if state[1] != e.sha and state[2] == batch_id:  # this batch computed another payload
                    plan.changed.append(e.key)
                if state[0] == "confirmed":
                    plan.counts["known_keys"] += 1
                elif resend_started:
                    plan.send.append(e)
                    plan.counts["resent"] += 1
                else:
                    plan.counts["held"] += 1
            self._many("INSERT INTO onceflow_effects(sink_id, key, batch_id, payload_sha, state, "
                       "started_ms) VALUES (?,?,?,?,?,?)", fresh)
        return plan

    def forget(self, keys: Iterable[str]) -> None:
        """Delete ``started`` keys whose calls were provably not applied.

        Refused, or never reached the service: a later attempt sends them as new keys.
        """
        rows = [(self.sink_id, k) for k in keys]
        if rows:
            self._write("DELETE FROM onceflow_effects WHERE sink_id = ? AND key = ? AND state = 'started'",
                        rows)

    def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """``sql`` for each of ``rows``, in one transaction."""
        with self._tx():
            self._many(sql, rows)

    def confirm(self, answers: Iterable[tuple[str, int, int]]) -> int:
        """Record 2xx answers: ``(key, status, calls)`` -> ``confirmed``; one transaction.

        May be called again with the same keys (idempotent).

        Returns:
            How many keys it recorded.
        """
        rows = [(status, calls, int(time.time() * 1000), self.sink_id, key) for key, status, calls in answers]
        if rows:
            self._write("UPDATE onceflow_effects SET state = 'confirmed', status = ?, calls = calls + ?, "
                        "confirmed_ms = ? WHERE sink_id = ? AND key = ?", rows)
        return len(rows)

    def finish(self, batch_id: int, counts: dict[str, int], seconds: float,
               unanswered: Iterable[tuple[str, int, int]], stats: BatchStats, rows_out: int) -> None:
        """Step 6: the batch's metrics, the calls of keys left ``started``, and its marker; one transaction.

        Nothing when the batch's marker is there (a replay of the tasks path's commit).

        Args:
            batch_id: The batch.
            counts: The :data:`METRICS` of the batch.
            seconds: How long its calls took.
            unanswered: ``(key, status, calls)`` of keys left ``started`` (status 0: no answer).
            stats: The batch's input rows and late drops.
            rows_out: Rows of the batch's DataFrame.
        """
        with self._tx():
            if self.has_marker(batch_id):  # committed already
                return
            self._many("UPDATE onceflow_effects SET status = ?, calls = calls + ? WHERE sink_id = ? "
                       "AND key = ?", [(s or None, c, self.sink_id, k) for k, s, c in unanswered])
            self._rows("INSERT INTO onceflow_effect_batches VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (self.sink_id, batch_id, *(counts[m] for m in METRICS), seconds))
            self._rows(marker.insert_sql("?"), marker.marker_row(self.sink_id, batch_id, stats, rows_out,
                                                                 {"effects": counts["confirmed"]}))
            for sql, values in marker.amendments("?", self.sink_id, stats):  # the batch before's
                self._rows(sql, values)

    def note(self, unanswered: Iterable[tuple[str, int, int]]) -> None:
        """Record the calls and last status of keys left ``started`` (``(key, status, calls)``)."""
        rows = [(s or None, c, self.sink_id, k) for k, s, c in unanswered]
        if rows:
            self._write("UPDATE onceflow_effects SET status = ?, calls = calls + ? WHERE sink_id = ? "
                        "AND key = ?", rows)

    def unconfirmed(self) -> list[dict[str, Any]]:
        """Keys started and never confirmed: applied by the service or not — reconcile them."""
        return self._dicts("SELECT key, batch_id, payload_sha, calls, status, started_ms FROM "
                           "onceflow_effects WHERE sink_id = ? AND state = 'started' ORDER BY batch_id, key",
                           (self.sink_id,))

    def batches(self) -> list[dict[str, Any]]:
        """Per-batch effect metrics, by batch id."""
        return self._dicts("SELECT * FROM onceflow_effect_batches WHERE sink_id = ? ORDER BY batch_id",
                           (self.sink_id,))


class SQLiteLedger(Ledger):
    """A ledger in a SQLite file (created with its directory if missing)."""

    def __init__(self, path: Path, sink_id: str) -> None:
        self.path, self.sink_id, self.where = path, sink_id, str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite_db.connect(path, SCHEMA)

    def bind(self, query_id: str) -> None:
        """See :func:`onceflow.sinks.sqlite.db.bind_query`."""
        sqlite_db.bind_query(self.conn, self.path, self.sink_id, query_id)

    def claim(self, specs: Mapping[str, Table], tool: str) -> None:
        """See :func:`onceflow.sinks.sqlite.db.claim_tables`."""
        sqlite_db.claim_tables(self.conn, self.where, self.sink_id, specs, tool)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        with sqlite_db.immediate(self.conn):
            yield

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.conn.executemany(sql, rows)

    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cur = self.conn.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class PgLedger(Ledger):
    """A ledger in a PostgreSQL database (its tables created if missing; the sink's writers serialized).

    Args:
        dsn: A ``postgresql://`` URL.
        sink_id: The sink's namespace (the PostgreSQL sink's rules for a sink id).
    """

    def __init__(self, dsn: str, sink_id: str) -> None:
        from onceflow.sinks.postgres import sql as pg
        from onceflow.sinks.postgres.conn import connect, redact

        self.sink_id, self.where = pg.check_sink_id(sink_id), redact(dsn)
        self.conn = connect(dsn)
        try:
            pg.ensure_meta(self.conn)
            if self.conn.execute("SELECT to_regclass('onceflow_effect_batches')").fetchone()[0] is None:
                with self.conn.transaction():
                    self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow:ddl'))")
                    self.conn.execute(PG_SCHEMA)
        except BaseException:
            self.conn.close()
            raise

    def bind(self, query_id: str) -> None:
        """See :func:`onceflow.sinks.postgres.sql.bind_sink`."""
        from onceflow.sinks.postgres import sql as pg

        pg.bind_sink(self.conn, self.sink_id, query_id, self.where)

    def claim(self, specs: Mapping[str, Table], tool: str) -> None:
        """See :func:`onceflow.sinks.postgres.sql.claim_tables`."""
        from onceflow.sinks.postgres import sql as pg

        pg.claim_tables(self.conn, self.where, self.sink_id, specs, tool)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        from onceflow.sinks.postgres import sql as pg

        with self.conn.transaction():
            pg.lock_sink(self.conn, self.sink_id)
            yield

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(sql.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), rows)

    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            return [dict(r) for r in cur.execute(sql.replace("?", "%s"), params)]

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
