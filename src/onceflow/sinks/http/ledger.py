"""The side-effect sink's ledger: which effect keys were started, which the service confirmed.

A SQLite database (WAL, ``synchronous=FULL``) with onceflow's usual tables (the batch marker
``onceflow_batches``, the checkpoint binding ``onceflow_sinks``) and two of its own:

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

import hashlib
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.sinks import marker
from onceflow.sinks.marker import BatchStats
from onceflow.sinks.sqlite.db import HAS_MARKER, META_SCHEMA, bind_query, connect

SCHEMA = META_SCHEMA + """
CREATE TABLE IF NOT EXISTS onceflow_effects(
    sink_id TEXT NOT NULL, key TEXT NOT NULL, batch_id INTEGER NOT NULL, payload_sha TEXT NOT NULL,
    state TEXT NOT NULL, calls INTEGER NOT NULL DEFAULT 0, status INTEGER,
    started_ms INTEGER NOT NULL, confirmed_ms INTEGER, PRIMARY KEY(sink_id, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS onceflow_effect_batches(
    sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, effects INTEGER NOT NULL,
    new_keys INTEGER NOT NULL, known_keys INTEGER NOT NULL, resent INTEGER NOT NULL,
    held INTEGER NOT NULL, calls INTEGER NOT NULL, applied INTEGER NOT NULL,
    replayed INTEGER NOT NULL, confirmed INTEGER NOT NULL, unconfirmed INTEGER NOT NULL,
    seconds REAL NOT NULL, PRIMARY KEY(sink_id, batch_id));
"""

_MARKER = marker.insert_sql("?")
METRICS = ("effects", "new_keys", "known_keys", "resent", "held", "calls", "applied", "replayed",
           "confirmed", "unconfirmed")


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


class Ledger:
    """One ledger database (see the module).

    Args:
        path: SQLite file (created with its directory if missing).
        sink_id: The sink's namespace in it.
    """

    def __init__(self, path: str | Path, sink_id: str) -> None:
        self.path = Path(path)
        self.sink_id = sink_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn: sqlite3.Connection = connect(self.path, SCHEMA)

    def bind(self, query_id: str) -> None:
        """Tie the sink id to a checkpoint (see :func:`onceflow.sinks.sqlite.db.bind_query`)."""
        bind_query(self.conn, self.path, self.sink_id, query_id)

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
        conn = self.conn
        now = int(time.time() * 1000)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(HAS_MARKER, (self.sink_id, batch_id)).fetchone():
                conn.execute("ROLLBACK")
                return None
            known: dict[str, tuple[str, str, int]] = {}
            keys = [e.key for e in effects]
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                rows = conn.execute(f"SELECT key, state, payload_sha, batch_id FROM onceflow_effects "
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
            conn.executemany("INSERT INTO onceflow_effects(sink_id, key, batch_id, payload_sha, state, "
                             "started_ms) VALUES (?,?,?,?,?,?)", fresh)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
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
        """``executemany`` in one transaction."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(sql, rows)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

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
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(HAS_MARKER, (self.sink_id, batch_id)).fetchone():  # committed already
                conn.execute("ROLLBACK")
                return
            conn.executemany("UPDATE onceflow_effects SET status = ?, calls = calls + ? WHERE sink_id = ? "
                             "AND key = ?", [(s or None, c, self.sink_id, k) for k, s, c in unanswered])
            conn.execute("INSERT INTO onceflow_effect_batches VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         (self.sink_id, batch_id, *(counts[m] for m in METRICS), seconds))
            conn.execute(_MARKER, marker.marker_row(self.sink_id, batch_id, stats, rows_out,
                                                    {"effects": counts["confirmed"]}))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def note(self, unanswered: Iterable[tuple[str, int, int]]) -> None:
        """Record the calls and last status of keys left ``started`` (``(key, status, calls)``)."""
        rows = [(s or None, c, self.sink_id, k) for k, s, c in unanswered]
        if rows:
            self._write("UPDATE onceflow_effects SET status = ?, calls = calls + ? WHERE sink_id = ? "
                        "AND key = ?", rows)

    def unconfirmed(self) -> list[dict[str, Any]]:
        """Keys started and never confirmed: applied by the service or not — reconcile them."""
        cur = self.conn.execute("SELECT key, batch_id, payload_sha, calls, status, started_ms FROM "
                                "onceflow_effects WHERE sink_id = ? AND state = 'started' "
                                "ORDER BY batch_id, key",
                                (self.sink_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]

    def batches(self) -> list[dict[str, Any]]:
        """Per-batch effect metrics, by batch id."""
        cur = self.conn.execute("SELECT * FROM onceflow_effect_batches WHERE sink_id = ? ORDER BY batch_id",
                                (self.sink_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
