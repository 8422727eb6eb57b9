"""The ingest receiver: ``POST /v1/events`` -> dedup catalog -> event log, acked when durable.

Requests are validated as a whole (all valid events of a batch are accepted, or none:
one invalid event rejects the batch with a reason per rejected event, 4xx). Valid
requests are **group-committed**: one writer takes every request queued while the
previous group was committing and writes them as one segment and one catalog
transaction, so throughput does not cost tiny files.

Group commit protocol (a crash at any step neither loses an acked event nor publishes
an event twice):

1. Classify the group's events with the catalog (NEW / DUPLICATE / TOO_OLD); write nothing.
2. Stage the NEW events as a hidden file ``.ingest-<token>.parquet.tmp`` in the log
   directory (written and fsynced; Spark and the log ignore hidden files). Crash point
   ``ingest_after_stage``: recovery deletes a staged file without a pending row; its ids
   were not recorded and no sender got an ack, so the senders retry and the events are new.
3. One catalog transaction: insert the NEW ids and the row ``ingest_pending(token, file)``.
   Crash point ``ingest_after_record``: the ids are recorded, so the events must appear:
   recovery publishes every pending file.
4. Publish the staged file as the next segment (rename, fsync of the directory).
   Crash point ``ingest_after_publish``.
5. Delete the pending row (a crash before this: recovery finds the file gone — published —
   and deletes the row).
6. Answer every request of the group with a status per event: ``new`` and ``duplicate``
   are acks; ``too_old`` means "too old to deduplicate": behind the GC watermark, not
   appended, counted — the sender must not retry it.

Recovery (:meth:`Receiver.recover`, at start-up, before serving): steps 3-5 for every
pending row, and deletion of staged files that have none.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from aiohttp import web

from onceflow.dedup import CatalogConfig, DedupCatalog, Status
from onceflow.dedup.catalog import DUPLICATE, NEW, TOO_OLD
from onceflow.dedup.store import CatalogStore
from onceflow.faults import CrashPoint, maybe_crash
from onceflow.ingest.events import EventBatchError, parse_batch
from onceflow.records import EVENT_SCHEMA
from onceflow.sources.log import EventLog

_NAMES = np.array([Status.NEW.value, Status.DUPLICATE.value, Status.TOO_OLD.value])

DROP_ACKS_ENV = "ONCEFLOW_INGEST_DROP_ACKS"
"""Fault switch: the probability of dropping a group's acks after it committed."""


@dataclass
class _Pending:
    events: pa.Table
    done: asyncio.Future[np.ndarray]


@dataclass
class ReceiverStats:
    """What the receiver did since it started.

    Attributes:
        requests: Requests answered 200.
        rejected: Requests answered 4xx.
        groups: Group commits.
        events_new: Events appended to the log.
        events_duplicate: Events answered duplicate.
        events_too_old: Events answered too old.
        segments: Segments published.
        recovered: Pending segments published by recovery.
    """

    requests: int = 0
    rejected: int = 0
    groups: int = 0
    events_new: int = 0
    events_duplicate: int = 0
    events_too_old: int = 0
    segments: int = 0
    recovered: int = 0
    group_sizes: list[int] = field(default_factory=list)


class Receiver:
    """The HTTP receiver (see the module protocol).

    Args:
        log_dir: The event log it appends to (it must be the log's only writer).
        catalog: The dedup catalog's SQLite file, or its store (e.g. PostgreSQL).
        cfg: Catalog configuration (GC delay required).
        max_events: Largest batch a request may carry.
        max_group_events: Most events one group commit takes.
    """

    def __init__(self, log_dir: Path, catalog: Path | CatalogStore, cfg: CatalogConfig,
                 max_events: int = 10_000, max_group_events: int = 100_000) -> None:
        self.log = EventLog(log_dir)
        self.log.directory.mkdir(parents=True, exist_ok=True)
        self.catalog = DedupCatalog(catalog, cfg)
        self.store = self.catalog.store
        self._lock = threading.Lock()  # group commits and GC, one at a time
        self.max_events = max_events
        self.max_group_events = max_group_events
        self.stats = ReceiverStats()
        self.drop_acks = float(os.environ.get(DROP_ACKS_ENV, "0") or 0)
        self._queue: asyncio.Queue[_Pending] | None = None

    # ----------------------------------------------------------------- recovery
    def recover(self) -> int:
        """Finish the protocol of groups a crash interrupted; return segments published."""
        published = 0
        for token, name in self.store.pending():
            staged = self.log.directory / name
            if staged.exists():  # 4: recorded, not yet published
                self.log.publish(staged)
                published += 1
            self.store.pending_done(token)  # 5
        pending = {f for _, f in self.store.pending()}
        for orphan in self.log.directory.glob(".ingest-*.tmp"):
            if orphan.name not in pending:  # staged, never recorded: no ack was sent
                orphan.unlink()
        self.stats.recovered += published
        return published

    # ----------------------------------------------------------------- commit
    def commit_group(self, groups: list[pa.Table]) -> list[np.ndarray]:
        """Steps 1-5 for the events of several requests (blocking).

        Args:
            groups: Each request's validated events (columns of the wire format).

        Returns:
            Each request's statuses, as catalog codes (``NEW``, ``DUPLICATE``, ``TOO_OLD``).
        """
        with self._lock:
            return self._commit_group(groups)

    def _commit_group(self, groups: list[pa.Table]) -> list[np.ndarray]:
        flat = pa.concat_tables(groups)
        ids = flat.column("event_id").to_pylist()
        times = flat.column("system_time").to_numpy()
        codes = self.catalog.classify_codes(ids, times)  # 1
        fresh = flat.filter(pa.array(codes == NEW, pa.bool_()))
        self.stats.groups += 1
        n = self.stats.groups
        if fresh.num_rows:
            token = uuid.uuid4().hex
            staged = self.log.stage(_to_table(fresh), f".ingest-{token}.parquet.tmp")  # 2
            maybe_crash(CrashPoint.INGEST_AFTER_STAGE, n)
            self.catalog.record_codes(ids, times, codes, pending=(token, staged.name))  # 3
            maybe_crash(CrashPoint.INGEST_AFTER_RECORD, n)
            self.log.publish(staged)  # 4
            maybe_crash(CrashPoint.INGEST_AFTER_PUBLISH, n)
            self.store.pending_done(token)  # 5
            self.stats.segments += 1
        counts = np.bincount(codes, minlength=3)
        self.stats.events_new += fresh.num_rows
        self.stats.events_duplicate += int(counts[DUPLICATE])
        self.stats.events_too_old += int(counts[TOO_OLD])
        self.stats.group_sizes.append(flat.num_rows)
        out, i = [], 0
        for g in groups:
            out.append(codes[i:i + g.num_rows])
            i += g.num_rows
        return out

    async def _committer(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch, size = [first], first.events.num_rows
            while not self._queue.empty() and size < self.max_group_events:
                nxt = self._queue.get_nowait()
                batch.append(nxt)
                size += nxt.events.num_rows
            try:
                results = await asyncio.to_thread(self.commit_group, [p.events for p in batch])
            except BaseException as exc:
                # Fail-stop: after step 3 the ids are recorded, and only recovery at start-up
                # may finish the group, so the receiver exits (nobody of the group got an ack).
                print(f"onceflow ingest: group commit failed, exiting for recovery: {exc!r}",
                      file=sys.stderr, flush=True)
                os._exit(70)
            for p, statuses in zip(batch, results, strict=True):
                p.done.set_result(statuses)

    # ----------------------------------------------------------------- HTTP
    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/events``: validate, queue for the group commit, answer per event."""
        try:
            body = await request.read()
            events = parse_batch(body, self.max_events)
        except EventBatchError as exc:
            self.stats.rejected += 1
            return web.json_response(exc.to_json(), status=exc.status)
        except web.HTTPRequestEntityTooLarge as exc:
            self.stats.rejected += 1
            return web.json_response({"error": f"request body too large: {exc.text}"}, status=413)
        if not events.num_rows:
            return web.json_response({"statuses": [], "accepted": 0})
        assert self._queue is not None
        pending = _Pending(events, asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        try:
            statuses = await pending.done
        except Exception as exc:
            return web.json_response({"error": f"not committed, retry: {exc}"}, status=503)
        if self.drop_acks and random.random() < self.drop_acks and request.transport is not None:
            request.transport.close()  # fault: committed, but the ack never arrives
            return web.Response(status=500)
        self.stats.requests += 1
        counts = np.bincount(statuses, minlength=3).tolist()
        return web.json_response({
            "statuses": _NAMES[statuses].tolist(),
            "accepted": counts[NEW],
            "duplicates": counts[DUPLICATE],
            "too_old": counts[TOO_OLD],
        })

    async def handle_health(self, request: web.Request) -> web.Response:
        """``GET /v1/health``: counters of this receiver and its catalog."""
        m = self.catalog.metrics
        return web.json_response({"receiver": {k: v for k, v in vars(self.stats).items()
                                               if k != "group_sizes"},
                                  "catalog": vars(m),
                                  "bloom_bytes": self.catalog.blooms.nbytes,
                                  "bloom_buckets": self.catalog.blooms.buckets,
                                  "gc_watermark_us": self.catalog.gc_watermark_us,
                                  "system_lag_us": self.catalog.system_lag_us()})

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(5)
            await asyncio.to_thread(self.advance_gc)

    def advance_gc(self) -> int:
        """Move the catalog's GC watermark (between group commits); return ids deleted."""
        with self._lock:
            return self.catalog.advance_gc()

    def app(self) -> web.Application:
        """The aiohttp application (starts the committer and the GC loop with it)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/events", self.handle_events)
        app.router.add_get("/v1/health", self.handle_health)

        async def start(_: web.Application) -> Any:
            self._queue = asyncio.Queue()
            tasks = [asyncio.create_task(self._committer()), asyncio.create_task(self._gc_loop())]
            yield
            for t in tasks:
                t.cancel()

        app.cleanup_ctx.append(start)
        return app


def _to_table(events: pa.Table) -> pa.Table:
    """Wire-format columns -> the event schema (microsecond integers become timestamps)."""
    return pa.table([events.column(f.name).cast(f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)


def serve(receiver: Receiver, host: str, port: int) -> None:
    """Recover, then serve until interrupted.

    Args:
        receiver: The receiver.
        host: Address to bind.
        port: Port to bind.
    """
    published = receiver.recover()
    print(json.dumps({"recovered_segments": published}), flush=True)
    web.run_app(receiver.app(), host=host, port=port, print=lambda *a: print(*a, flush=True))
