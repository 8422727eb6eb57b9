"""The ingest receiver's HTTP side: ``POST /v1/events`` and ``GET /v1/health`` (aiohttp).

What a ``POST /v1/events`` goes through, cheapest check first, before anything is queued:

1. **Authentication** (headers only, the body is not read yet): a bearer token from the
   token file, or with mutual TLS alone the client certificate; else 401.
2. **Size**: a ``Content-Length`` is required (411) and must fit ``max_events`` events
   (413, see :class:`onceflow.ingest.events.Limits`).
3. **Admission**: at most ``max_requests`` requests and ``max_inflight_bytes`` of bodies are
   being read, parsed or committed at once; beyond that 503 with ``Retry-After`` (the
   sender retries), so memory stays bounded whatever the clients do.
4. **Body** read with a timeout (408 for a slow upload; the connection is closed).
5. **Validation** off the event loop, in a small thread pool (400/413 with reasons per
   event; :mod:`onceflow.ingest.events`).
6. **Authorization**: every event's ``sender`` must be the authenticated sender (403).
7. **Id scope**: under ``--id-scope sender`` (the default) the id the catalog and the log
   keep is ``<sender>/<event_id>``: one sender cannot squat another's ids, and the same
   ``event_id`` sent by two senders is two events. Under ``global`` ids are shared by all
   senders (a producer that fails over between senders is still deduplicated), which
   trusts every authenticated sender with every other sender's ids.
8. Queued for the group commit (:mod:`onceflow.ingest.receiver`); answered when durable.

Any exception in this path is an error answer for that request (500 at worst), never an
exit of the receiver; ``GET /v1/health`` takes no lock and stays responsive throughout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from onceflow import faults
from onceflow.errors import ConfigError, StorageError
from onceflow.ingest.auth import TokenFile, peer_common_name
from onceflow.ingest.catalog import Status
from onceflow.ingest.catalog.catalog import DUPLICATE, NEW, TOO_OLD
from onceflow.ingest.events import MAX_LISTED, EventBatchError, Limits, echo, parse_batch, scoped_ids
from onceflow.ingest.receiver import Receiver

try:
    from aiohttp import web
except ImportError:
    raise ConfigError("the ingest service needs aiohttp, which is not installed: "
                      "pip install 'onceflow[ingest]'") from None

_NAMES = np.array([Status.NEW.value, Status.DUPLICATE.value, Status.TOO_OLD.value])


ID_SCOPES = ("sender", "global")


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP side guards the receiver.

    Attributes:
        limits: What one request may carry.
        tokens: The token file (None: no bearer tokens).
        mtls: Client certificates are required (the TLS context verifies them).
        id_scope: ``sender`` (ids are ``<sender>/<event_id>``) or ``global``.
        body_timeout_s: Longest a request body may take to arrive.
        max_requests: Most POSTs in progress at once.
        max_inflight_bytes: Most body bytes in progress at once.
    """

    limits: Limits = Limits()
    tokens: TokenFile | None = None
    mtls: bool = False
    id_scope: str = "sender"
    body_timeout_s: float = 30.0
    max_requests: int = 64
    max_inflight_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.id_scope not in ID_SCOPES:
            raise ConfigError(f"id scope must be one of {ID_SCOPES}, got {self.id_scope!r}")
        if self.max_inflight_bytes < self.limits.max_body_bytes:
            raise ConfigError(f"max_inflight_bytes ({self.max_inflight_bytes}) must hold one largest body "
                              f"({self.limits.max_body_bytes} bytes for {self.limits.max_events} events)")
        if self.body_timeout_s <= 0 or self.max_requests < 1:
            raise ConfigError("body_timeout_s must be > 0 and max_requests >= 1")

    @property
    def authenticated(self) -> bool:
        """Whether senders must prove who they are."""
        return self.tokens is not None or self.mtls


@dataclass
class _Pending:
    events: pa.Table
    done: asyncio.Future[np.ndarray]


def _error(status: int, message: str, **extra: Any) -> web.Response:
    headers = {"Retry-After": "1"} if status in (503, 507) else None
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


class IngestServer:
    """The receiver behind HTTP (see the module).

    Args:
        receiver: The commit protocol.
        cfg: Limits, authentication and admission.
    """

    def __init__(self, receiver: Receiver, cfg: ServerConfig) -> None:
        self.receiver = receiver
        self.cfg = cfg
        self.stats = receiver.stats
        self._queue: asyncio.Queue[_Pending] | None = None
        self._parse_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="onceflow-parse")
        self._requests = 0
        self._bytes = 0
        self.refused_busy = 0

    # ----------------------------------------------------------------- POST
    def _sender(self, request: web.Request) -> str | None:
        """Step 1: the authenticated sender, "" without authentication, None if refused."""
        if self.cfg.tokens is not None:
            return self.cfg.tokens.sender(request.headers.get("Authorization"))
        if self.cfg.mtls:
            transport = request.transport
            return peer_common_name(transport.get_extra_info("peercert") if transport else None)
        return ""

    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/events``: the steps of the module, then the answer per event."""
        sender = self._sender(request)
        if sender is None:
            self.stats.rejected += 1
            return web.json_response({"error": "authentication required: send 'Authorization: Bearer "
                                               "<token>' with a token of the receiver's token file"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        size = request.content_length
        if size is None:
            self.stats.rejected += 1
            return _error(411, "a Content-Length header is required")
        if size > self.cfg.limits.max_body_bytes:
            self.stats.rejected += 1
            resp = _error(413, f"request body of {size} bytes; the limit is {self.cfg.limits.max_body_bytes} "
                               f"({self.cfg.limits.max_events} events)")
            resp.force_close()
            return resp
        if self._requests >= self.cfg.max_requests or self._bytes + size > self.cfg.max_inflight_bytes:
            self.stats.failed += 1
            self.refused_busy += 1
            resp = _error(503, "the receiver is busy; retry")
            resp.force_close()
            return resp
        self._requests += 1
        self._bytes += size
        try:
            return await self._admitted(request, sender)
        finally:
            self._requests -= 1
            self._bytes -= size

    async def _admitted(self, request: web.Request, sender: str) -> web.StreamResponse:
        try:
            body = await asyncio.wait_for(request.read(), self.cfg.body_timeout_s)
        except asyncio.TimeoutError:
            self.stats.rejected += 1
            resp = _error(408, f"the request body did not arrive within {self.cfg.body_timeout_s:g} s")
            resp.force_close()
            return resp
        except web.HTTPRequestEntityTooLarge:
            self.stats.rejected += 1
            return _error(413, f"request body larger than {self.cfg.limits.max_body_bytes} bytes")
        loop = asyncio.get_running_loop()
        try:
            events = await loop.run_in_executor(self._parse_pool, parse_batch, body, self.cfg.limits)
        except EventBatchError as exc:
            self.stats.rejected += 1
            return web.json_response(exc.to_json(), status=exc.status)
        del body
        if sender and events.num_rows:
            wrong = pc.not_equal(events.column("sender"), sender)
            if pc.any(wrong).as_py():
                self.stats.rejected += 1
                idx = np.flatnonzero(wrong.to_numpy(zero_copy_only=False))
                ids = events.column("event_id")
                return web.json_response({
                    "error": f"{len(idx)} events name another sender than the authenticated {sender!r}; "
                             "none accepted",
                    "rejected": [{"index": int(i), "event_id": echo(ids[int(i)].as_py()),
                                  "reason": f"sender must be {sender!r}"} for i in idx[:MAX_LISTED]]},
                    status=403)
        if not events.num_rows:
            return web.json_response({"statuses": [], "accepted": 0})
        if self.cfg.id_scope == "sender":
            events = events.set_column(events.schema.get_field_index("event_id"), "event_id",
                                       scoped_ids(events))
        return await self._commit(request, events)

    async def _commit(self, request: web.Request, events: pa.Table) -> web.StreamResponse:
        assert self._queue is not None
        pending = _Pending(events, asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        try:
            statuses = await pending.done
        except StorageError as exc:
            self.stats.failed += 1
            return _error(507 if exc.kind == "full" else 503, f"not committed, retry: {exc}")
        except Exception as exc:
            self.stats.failed += 1
            return _error(503, f"not committed, retry: {exc}")
        if faults.reply_lost() and request.transport is not None:
            request.transport.close()  # a fault hook's: committed, but the ack never arrives
            return web.Response(status=500)
        self.stats.requests += 1
        counts = np.bincount(statuses, minlength=3).tolist()
        return web.json_response({
            "statuses": _NAMES[statuses].tolist(),
            "accepted": counts[NEW],
            "duplicates": counts[DUPLICATE],
            "too_old": counts[TOO_OLD],
        })

    async def _committer(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch, size = [first], first.events.num_rows
            while not self._queue.empty() and size < self.receiver.max_group_events:
                nxt = self._queue.get_nowait()
                batch.append(nxt)
                size += nxt.events.num_rows
            try:
                results = await asyncio.to_thread(self.receiver.commit_group, [p.events for p in batch])
            except Exception as exc:  # not committed (recovery ran): every request of the group retries
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                continue
            for p, statuses in zip(batch, results, strict=True):
                if not p.done.done():
                    p.done.set_result(statuses)

    # ----------------------------------------------------------------- GET
    async def handle_health(self, request: web.Request) -> web.Response:
        """``GET /v1/health``: counters of this receiver and its catalog (takes no lock)."""
        cat = self.receiver.catalog
        auth = "tokens" if self.cfg.tokens else "mtls" if self.cfg.mtls else "none"
        return web.json_response({"receiver": {k: v for k, v in vars(self.stats).items()
                                               if k != "group_sizes"},
                                  "state": "ok" if self.receiver.broken is None else self.receiver.broken,
                                  "auth": auth,
                                  "id_scope": self.cfg.id_scope,
                                  "in_flight": {"requests": self._requests, "bytes": self._bytes,
                                                "refused_busy": self.refused_busy},
                                  "catalog": vars(cat.metrics),
                                  "bloom_bytes": cat.blooms.nbytes,
                                  "bloom_buckets": cat.blooms.buckets,
                                  "gc_watermark_us": cat.gc_watermark_us,
                                  "system_lag_us": cat.system_lag_us()})

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(5)
            try:
                await asyncio.to_thread(self.receiver.advance_gc)
            except Exception as exc:  # a full disk, a lost connection: try again next time
                print(f"onceflow ingest: GC failed, retrying in 5 s: {exc}", file=sys.stderr, flush=True)

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug, not a reason to stop serving
            self.stats.failed += 1
            print(f"onceflow ingest: error in {request.path}: {exc!r}", file=sys.stderr, flush=True)
            return _error(500, f"internal error: {type(exc).__name__}")

    def app(self) -> web.Application:
        """The aiohttp application (starts the committer and the GC loop with it)."""
        app = web.Application(client_max_size=self.cfg.limits.max_body_bytes, middlewares=[self._guard])
        app.router.add_post("/v1/events", self.handle_events)
        app.router.add_get("/v1/health", self.handle_health)

        async def start(_: web.Application) -> AsyncIterator[None]:
            self._queue = asyncio.Queue()
            tasks = [asyncio.create_task(self._committer()), asyncio.create_task(self._gc_loop())]
            yield
            for t in tasks:
                t.cancel()
            self._parse_pool.shutdown(wait=False)

        app.cleanup_ctx.append(start)
        return app


def serve(server: IngestServer, host: str, port: int, ssl_context: Any = None) -> None:
    """Recover, then serve until interrupted.

    Args:
        server: The receiver behind HTTP.
        host: Address to bind.
        port: Port to bind.
        ssl_context: TLS (``onceflow.ingest.auth.server_tls``), or None for plain HTTP.
    """
    published = server.receiver.recover()
    print(json.dumps({"recovered_segments": published}), flush=True)
    web.run_app(server.app(), host=host, port=port, ssl_context=ssl_context,
                keepalive_timeout=15,
                print=lambda *a: print(*a, flush=True))
