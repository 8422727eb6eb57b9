"""Effects called by Spark's tasks: a large batch's calls never pass through the driver.

:meth:`onceflow.sinks.http.sink.HttpEffectsSink.commit_frames` turns each table's rows into effects
with Spark (:func:`effects_frame`: the key and the JSON payload of every row, exactly as the
driver-side path computes them) and writes them through the ``onceflow_http`` format: each task
takes its share of the batch's effects through steps 2-5 of the sink (:func:`send_task`) against
the same ledger — recorded ``started`` before any call, called with their idempotency keys,
confirmed after a 2xx answer — and the data source's commit (the driver) writes the batch's
metrics and its marker in one ledger transaction (:func:`finish`). Every task must reach the
ledger: a SQLite file (one machine, ``local[*]`` or a standalone cluster on it, or a shared file
system whose locks SQLite can trust) or a PostgreSQL database (a ``postgresql://`` URL: any
cluster, over the network).

The per-key guarantees are the driver-side path's: a key is recorded before its call, so a task
killed at any moment leaves its keys ``started`` — the next attempt (Spark's retry of the task,
or the re-run of the batch) sends them again with the same key when the service honours
idempotency keys, else holds them for reconciliation; a key confirmed by any attempt is never
sent again; a payload that differs from the one an earlier attempt recorded is refused. Which
task calls which key does not matter (the ledger is per key), so the tasks need no fixed
partitioning.

The ``onceflow_http`` format's rows are ``key`` and ``payload`` (strings); options: ``url`` and
``ledger`` (required), ``sink_id``, ``batch_id`` (batch writes), ``idempotent``, ``concurrency``,
``retries``, ``timeout_s``, ``backoff_s``, ``confirm_every_s``, ``headers`` (JSON), ``stats``
(JSON: the marker's input counts) and ``rows_out``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from onceflow import faults
from onceflow.errors import ConfigError, EffectsFailedError, OnceflowError
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks._core.tasks import BatchCommits, FormatWriter, StreamCommits, WriteFormat, running_task
from onceflow.sinks.http.calls import Caller, effects_of, unstable
from onceflow.sinks.http.ledger import METRICS, Effect

NAME = "onceflow_http"


@dataclass(frozen=True)
class HttpTaskSpec:
    """What a task needs to call its effects (every field picklable: the ledger opens in the task).

    Attributes:
        sink: The sink's settings (``url``, ``ledger``, ``sink_id``, ``idempotent``, ...).
        batch_id: The micro-batch (-1: Spark's, in a streaming write).
        stats: The batch's input counts for its marker (``BatchStats`` fields).
        rows_out: Rows of the batch's DataFrame (for its marker).
        started: When the batch's calls started (``time.time()``), for its metrics.
    """

    sink: dict[str, Any]
    batch_id: int = -1
    stats: dict[str, Any] = field(default_factory=dict)
    rows_out: int = 0
    started: float = 0.0

    @staticmethod
    def from_options(options: Mapping[str, str]) -> HttpTaskSpec:
        """The spec the format's options describe.

        Raises:
            ConfigError: No ``url`` or ``ledger``, or an option is not what it should be.
        """
        if not options.get("url") or not options.get("ledger"):
            raise ConfigError(f"{NAME} needs options 'url' (where effects are POSTed) and 'ledger' (its "
                              "ledger: a SQLite path or a postgresql:// URL every task reaches)")
        try:
            sink: dict[str, Any] = {"url": options["url"], "ledger": options["ledger"],
                                    "sink_id": options.get("sink_id") or "default",
                                    "idempotent": (options.get("idempotent") or "true").lower() == "true",
                                    "headers": json.loads(options.get("headers") or "{}")}
            for name, kind in (("concurrency", int), ("retries", int), ("timeout_s", float),
                               ("backoff_s", float), ("confirm_every_s", float)):
                if options.get(name):
                    sink[name] = kind(options[name])
            stats = json.loads(options.get("stats") or "{}")
            return HttpTaskSpec(sink, int(options.get("batch_id", -1)), stats,
                                int(options.get("rows_out") or 0), float(options.get("started") or 0.0))
        except (ValueError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{NAME}: an option is not what it should be: {exc}") from None

    def options(self) -> dict[str, str]:
        """The format's options for this spec (the inverse of :meth:`from_options`)."""
        out = {k: json.dumps(v) if k == "headers" else str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in self.sink.items()}
        return {**out, "batch_id": str(self.batch_id), "stats": json.dumps(self.stats),
                "rows_out": str(self.rows_out), "started": repr(self.started)}

    def open(self) -> Caller:
        """The caller these settings describe (its ledger opens on first use, where this runs)."""
        s = self.sink
        tuning = {k: s[k] for k in ("concurrency", "retries", "timeout_s", "backoff_s", "confirm_every_s")
                  if k in s}
        return Caller(s["url"], s["ledger"], sink_id=s["sink_id"], idempotent=s["idempotent"],
                      headers=s["headers"], **tuning)


def encoder(sink_id: str, name: str, spec: Table,
            batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: a table's rows as effects (:func:`onceflow.sinks.http.calls.effects_of`)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                found = effects_of(sink_id, name, spec, pa.Table.from_batches([batch]), batch_id)
                yield pa.RecordBatch.from_arrays([pa.array([e.key for e in found], pa.string()),
                                                  pa.array([e.payload for e in found], pa.string())],
                                                 names=["key", "payload"])
    return run


def effects_frame(frames: Mapping[str, Any], specs: Mapping[str, Table], sink_id: str, batch_id: int) -> Any:
    """Every table's rows as effects ``key, payload`` (one frame: one Spark job, one commit)."""
    encoded = [frame.mapInArrow(encoder(sink_id, name, specs[name], batch_id), "key string, payload string")
               for name, frame in frames.items()]
    union = encoded[0]
    for more in encoded[1:]:
        union = union.unionByName(more)
    return union


def send_task(spec: HttpTaskSpec, batches: Iterable[pa.RecordBatch]) -> dict[str, int]:
    """One task's effects through steps 2-5 of the sink; its counts (:data:`ledger.METRICS`).

    2. Record the task's new keys ``started`` in the ledger, durably, before any call (keys
       confirmed earlier are not sent; keys an earlier attempt left ``started`` are sent again
       or held, as the sink's ``idempotent`` says; another payload for a key this batch
       recorded is refused). The batch's marker there (a zombie attempt): nothing to do.
    3. Call them (bounded, retried); confirmations reach the ledger while the calls run.
    4. Record the remaining confirmations; forget keys provably not applied.
    5. A key refused or not delivered fails the task (Spark tries it again; the batch fails
       when Spark gives up): :class:`onceflow.errors.EffectsFailedError`. Crash point
       ``task_after_write``: the task dies after its confirmations, before its message.

    Raises:
        EffectsFailedError: Effects refused or not delivered.
        UnstableOutputError: This attempt computed other payloads than an earlier one.
    """
    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    effects = [Effect(k, p) for b in batches for k, p in zip(b.column("key").to_pylist(),
                                                             b.column("payload").to_pylist(), strict=True)]
    caller = spec.open()
    try:
        plan = caller.ledger.start(batch_id, effects, resend_started=caller.idempotent)  # 2
        if plan is None:
            return dict.fromkeys(METRICS, 0)
        if plan.changed:
            raise unstable(batch_id, plan.changed)
        pending: list[tuple[str, int, int]] = []
        answers = asyncio.run(caller.send_all(plan.send, pending.append))  # 3
        faults.task_reached(faults.CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # unconfirmed
        caller.ledger.confirm(pending)  # 4
        counts, failure, left = caller.tally(batch_id, plan, answers)  # 5
        if failure:
            raise EffectsFailedError(failure)
        caller.ledger.note(left)
    finally:
        caller.close()
    faults.task_reached(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
    return counts


def finish(spec: HttpTaskSpec, batch_id: int, messages: Iterable[Any]) -> None:
    """The data source's commit: the tasks' counts summed, the batch's metrics and marker (one transaction).

    Raises:
        OnceflowError: A task sent no message (Spark passes None for a task that failed).
    """
    counts = dict.fromkeys(METRICS, 0)
    for m in messages:
        if m is None:
            raise OnceflowError(f"batch {batch_id}: a task calling {spec.sink['url']} sent no message; the "
                                "batch runs again")
        for k in METRICS:
            counts[k] += int(m[k])
    caller = spec.open()
    try:
        stats = BatchStats.from_dict(spec.stats) if spec.stats else BatchStats(None, None, 0)
        caller.ledger.finish(batch_id, counts, time.time() - spec.started if spec.started else 0.0, [], stats,
                           spec.rows_out or counts["effects"])
    finally:
        caller.close()


class HttpWriter(FormatWriter):
    """The format's write of a batch (:mod:`onceflow.sinks._core.tasks`): calls in tasks, then the marker."""

    def __init__(self, spec: HttpTaskSpec) -> None:
        self.spec = spec

    def task(self, iterator: Iterator[pa.RecordBatch]) -> dict[str, int]:
        """Executor side: one task's effects (:func:`send_task`)."""
        return send_task(self.spec, iterator)

    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: the batch's metrics and marker (:func:`finish`).

        Nothing to undo on abort: the ledger keeps every key's state; the re-run goes on from it.
        """
        finish(self.spec, batch_id, bodies)


class HttpStreamWriter(StreamCommits, HttpWriter, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""


class HttpBatchWriter(BatchCommits, HttpWriter, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""


class HttpDataSource(WriteFormat):
    """The ``onceflow_http`` format (write only)."""

    NAME = NAME

    def spec(self, schema: Any) -> HttpTaskSpec:
        """The options parsed."""
        return HttpTaskSpec.from_options(self.options)

    def batch_writer(self, spec: HttpTaskSpec, schema: Any) -> HttpBatchWriter:
        """A batch writer."""
        return HttpBatchWriter(spec)

    def stream_writer(self, spec: HttpTaskSpec, schema: Any) -> HttpStreamWriter:
        """A streaming writer."""
        return HttpStreamWriter(spec)


def run(frame: Any, spec: HttpTaskSpec) -> None:
    """The effects called by Spark's tasks for the sink, then :func:`finish` on the driver.

    What the format's write and commit do, without the data source
    (:meth:`onceflow.sinks._core.tasks.FormatWriter.run`).
    """
    HttpWriter(spec).run(frame, spec.batch_id)
