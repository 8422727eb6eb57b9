"""The sender: a durable outbox and upstream backup (retry until a positive ack).

Protocol:

1. :meth:`Sender.send` stamps each event with the sender's system time
   (:class:`onceflow.ingest.clock.SenderClock`, strictly increasing, also across restarts) and
   stores it in the outbox (SQLite, ``synchronous=FULL``) before returning. From here on a
   crash of the sender loses nothing: the outbox is re-read on restart.
2. :meth:`Sender.flush` posts the outbox's events in batches, oldest first, with the stamp
   they got in step 1 (a retry is the same event: same id, same system time).
3. A 200 answer is the ack: events answered ``new`` or ``duplicate`` leave the outbox;
   ``too_old`` ones (behind the receiver's GC watermark: "too old to deduplicate") are
   moved to ``outbox_rejected`` with that reason, never retried, and counted.
4. A timeout, a dropped connection or a 5xx is ambiguous (the batch may have been
   appended): the same batch is retried after an exponential backoff; the receiver's
   catalog makes the retry harmless.
   So are 408 (the body was too slow), 429, 503 (busy, or the receiver's storage is
   recovering) and 507 (its disk is full): nothing was accepted, the batch is retried.
5. A 401 or 403 (the token is refused, or the events name another sender than the token's)
   stops the sender with an error; the events stay in the outbox for a restart with the
   right token. Any other 4xx is a permanent refusal of the batch: its events move to
   ``outbox_rejected`` with the receiver's reasons (an oversized batch is split instead).

Generated event ids (:func:`generated_id`) are unguessable by other parties but the same
after a restart: an HMAC of the event's number under a random key kept beside the outbox.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError, SenderRefusedError
from onceflow.ingest.clock import SenderClock
from onceflow.ingest.events import SENDER_RE

RETRY_STATUSES = {0, 408, 429, 500, 502, 503, 504, 507}
"""Answers after which a batch is retried as it is (0: no answer at all)."""


def id_key(outbox: str | Path) -> bytes:
    """The secret key of generated ids, created beside the outbox on first use."""
    path = Path(outbox)
    path = path.with_name(path.name + ".idkey")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return bytes.fromhex(path.read_text().strip())


def generated_id(key: bytes, sender_id: str, n: int) -> str:
    """The id of a sender's ``n``-th generated event: ``ev-<sender>-<n>-<20 hex digits of HMAC>``."""
    mac = hmac.new(key, f"{sender_id}/{n}".encode(), hashlib.sha256).hexdigest()[:20]
    return f"ev-{sender_id}-{n}-{mac}"


@dataclass
class SenderStats:
    """Counters of one sender process.

    Attributes:
        posts: HTTP requests made.
        retries: Requests repeated after an ambiguous outcome.
        acked: Events acknowledged (new or duplicate).
        duplicates: Events the receiver already had (a retry whose first try got through).
        rejected: Events moved to ``outbox_rejected``.
    """

    posts: int = 0
    retries: int = 0
    acked: int = 0
    duplicates: int = 0
    rejected: int = 0


class Sender:
    """One producer's outbox and its delivery loop.

    Args:
        url: The receiver's base URL, e.g. ``http://127.0.0.1:8787``.
        outbox: SQLite file of the outbox (the clock's state file sits beside it).
        sender_id: This producer's name (stored in every event), ``[A-Za-z0-9._-]{1,64}``.
        batch_size: Events per request.
        token: Bearer token for the receiver (``onceflow ingest serve --tokens``).
        ssl_context: TLS settings for an ``https://`` receiver (``onceflow.ingest.auth.client_tls``).
        timeout_s: Request timeout; a timeout is an ambiguous outcome (retried).
        max_backoff_s: Cap of the exponential backoff between retries.
        now_us: Wall clock for the sender clock (tests).
    """

    def __init__(self, url: str, outbox: str | Path, sender_id: str, batch_size: int = 1_000,
                 timeout_s: float = 30.0, max_backoff_s: float = 5.0,
                 now_us: Callable[[], int] | None = None, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if not SENDER_RE.match(sender_id):
            raise ConfigError(f"sender_id must match [A-Za-z0-9._-]{{1,64}}, got {sender_id[:80]!r}")
        self.url = url.rstrip("/") + "/v1/events"
        self.headers = {"Content-Type": "application/json",
                        **({"Authorization": f"Bearer {token}"} if token else {})}
        self.ssl_context = ssl_context
        self.sender_id = sender_id
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.stats = SenderStats()
        path = Path(outbox)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.clock = SenderClock(path.with_name(path.name + ".clock.json"), now_us=now_us)
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS outbox(seq INTEGER PRIMARY KEY, "
                          "event_id TEXT UNIQUE NOT NULL, body TEXT NOT NULL)")
        self.conn.execute("CREATE TABLE IF NOT EXISTS outbox_rejected(event_id TEXT PRIMARY KEY, "
                          "body TEXT NOT NULL, reason TEXT NOT NULL)")

    def send(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Step 1: stamp and store events durably (delivery happens in :meth:`flush`).

        Args:
            events: Dicts with ``event_id, user, event_time, bytes`` (times in microseconds).

        Returns:
            Events newly stored (an ``event_id`` already in the outbox is not stored twice).
        """
        rows = []
        for e in events:
            body = {"event_id": str(e["event_id"]), "sender": self.sender_id,
                    "system_time": self.clock.next(), "user": str(e["user"]),
                    "event_time": int(e["event_time"]), "bytes": int(e["bytes"])}
            rows.append((body["event_id"], json.dumps(body)))
        self.conn.execute("BEGIN IMMEDIATE")
        before = self.conn.total_changes
        self.conn.executemany("INSERT OR IGNORE INTO outbox(event_id, body) VALUES (?, ?)", rows)
        stored = self.conn.total_changes - before
        self.conn.execute("COMMIT")
        return stored

    def pending(self) -> int:
        """Events waiting for an ack."""
        return int(self.conn.execute("SELECT count(*) FROM outbox").fetchone()[0])

    def _post(self, bodies: list[str]) -> tuple[int, dict[str, Any]]:
        data = ('{"events": [' + ",".join(bodies) + "]}").encode()
        req = urllib.request.Request(self.url, data=data, method="POST", headers=self.headers)
        self.stats.posts += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.ssl_context) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                return exc.code, {}

    def flush(self, deadline_s: float | None = None) -> int:
        """Steps 2-5: deliver the outbox until it is empty.

        Args:
            deadline_s: Give up (returning what is left) after this many seconds.

        Returns:
            Events still in the outbox (0 when everything was acked or rejected).
        """
        started = time.monotonic()
        backoff = 0.05
        size = self.batch_size
        while True:
            rows = self.conn.execute("SELECT seq, event_id, body FROM outbox ORDER BY seq LIMIT ?",
                                     (size,)).fetchall()
            if not rows:
                return 0
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                return self.pending()
            try:
                status, answer = self._post([r[2] for r in rows])  # 2
            except (OSError, urllib.error.URLError, ValueError):
                status, answer = 0, {}  # 4: timeout or dropped connection: ambiguous
            if status == 200 and len(answer.get("statuses", [])) == len(rows):
                self._settle(rows, answer["statuses"])  # 3
                backoff, size = 0.05, self.batch_size
            elif status == 413 and size > 1:
                size = max(size // 2, 1)  # 5: split an oversized batch
            elif status in (401, 403):  # 5: this sender is refused: stop, keep the events
                raise SenderRefusedError(f"the receiver refused sender {self.sender_id!r} (HTTP {status}): "
                                         f"{str(answer.get('error', ''))[:300]}; the {self.pending()} events "
                                         "stay in the outbox: fix the token or sender name and run again")
            elif status not in RETRY_STATUSES and 400 <= status < 500:
                reasons = {r.get("index"): r.get("reason") for r in answer.get("rejected", [])}
                self._reject(rows, [reasons.get(i) or answer.get("error", f"HTTP {status}")
                                    for i in range(len(rows))])
            else:  # 4: retry the same batch
                self.stats.retries += 1
                time.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)

    def _settle(self, rows: list[Any], statuses: list[str]) -> None:
        done = [(r[0],) for r, s in zip(rows, statuses, strict=True) if s in ("new", "duplicate")]
        old = [r for r, s in zip(rows, statuses, strict=True) if s == "too_old"]
        self.stats.acked += len(done)
        self.stats.duplicates += statuses.count("duplicate")
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("DELETE FROM outbox WHERE seq = ?", done)
        self.conn.execute("COMMIT")
        if old:
            self._reject(old, ["too old to deduplicate: behind the receiver's GC watermark"] * len(old))

    def _reject(self, rows: list[Any], reasons: list[str]) -> None:
        self.stats.rejected += len(rows)
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("INSERT OR REPLACE INTO outbox_rejected VALUES (?, ?, ?)",
                              [(r[1], r[2], reason) for r, reason in zip(rows, reasons, strict=True)])
        self.conn.executemany("DELETE FROM outbox WHERE seq = ?", [(r[0],) for r in rows])
        self.conn.execute("COMMIT")

    def close(self) -> None:
        """Close the outbox."""
        self.conn.close()
