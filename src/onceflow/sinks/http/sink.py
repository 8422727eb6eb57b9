"""The side-effect sink: one HTTP call per output row, to a service that is not a database.

Each row of each table becomes one ``POST`` of the row as JSON, with an ``Idempotency-Key``
derived from the row's key columns (never random: the same logical effect always has the same
key — ``<sink_id>/<table>/<key values, URL-quoted>``, see
:func:`onceflow.sinks.http.calls.effect_key`). The table's mode
says what a key names:

* ``append`` (with ``key=``): one effect per key, ever — a key a later batch has again is not
  sent again (a charge per payment id);
* ``upsert``: the key's value in each batch — the key ends with the batch id,
  ``.../<key values>/<batch_id>``, so a later batch's new value for a known key is sent (and
  the service keeps the latest);
* ``merge``: per-batch deltas (e.g. Example 5-1's counts), keyed like ``upsert`` — one effect
  per key and batch, summed by the service. A durable ledger
(:mod:`onceflow.sinks.http.ledger`) records each key as ``started`` before its call and
``confirmed`` after the service's 2xx answer; calls run concurrently (bounded) with retries and
exponential backoff (tenacity).

Commit protocol of :meth:`HttpEffectsSink.commit_tables` for batch N. Against the shared steps
of :mod:`onceflow.sinks._core.base`: 1 is *check*; 2 is *decide*, and records the keys before any call
(a service cannot join the ledger's transaction); 3-5 are *write* (the calls) and their
confirmations; 6 is *mark* and *commit*; 7 is *return*.

1. Crash point ``before_sink_write``. Every table needs a key; keys must be non-null and unique
   within the batch (:func:`onceflow.sinks._core.checks.check_batch`). Nothing is sent.
2. Ledger transaction: if N's marker exists, return False (a replay: every effect of N was
   dealt with). Else record every key the ledger does not know as ``started`` with its
   payload's hash. Keys the ledger knows: ``confirmed`` ones are not sent again; ``started``
   ones (left by an attempt that crashed after its calls may have reached the service) are
   sent again if the service honours idempotency keys (``idempotent=True``), else *held*:
   never sent twice. A key started by an earlier attempt of N with another payload means the
   batch's output is not deterministic: :class:`UnstableOutputError`, nothing sent (use
   ``write_stream(stable=True)``). Commit. Crash point ``effects_started``.
3. Send (at most ``concurrency`` calls at once). A 2xx answer confirms the key (a redirect,
   ``3xx``, is never followed — a client would repeat the POST as a GET — and counts as a
   refusal naming its ``Location``); confirmations
   are written to the ledger every ``confirm_every_s`` (and at the end). Retried with backoff, up
   to ``retries`` calls per key: a connection that never reached the service, ``429`` and
   ``503`` (not applied) always; a timeout or another ``5xx`` (the service may have applied
   it) only when ``idempotent``. Another ``4xx`` is a refusal: not retried.
4. Crash point ``effects_sent``: every call answered; the confirmations of the last
   ``confirm_every_s`` are not in the ledger yet. This is the window of a service without
   idempotency: a key called and applied but not confirmed stays ``started`` and is held by
   the retry of N (step 2).
5. Record the remaining confirmations. Refused keys and keys that provably never reached the
   service are forgotten (a restart sends them as new). If any key was refused, or could not
   be delivered (idempotent service: retries exhausted), raise :class:`EffectsFailedError`
   telling the three kinds apart (refused; never reached the service; unknown outcome — a
   timeout or a 5xx after which the service may have applied it):
   N is not committed, Spark does not write ``commits/N``; the restart re-runs N — confirmed
   keys are not sent again, the others are.
6. Ledger transaction: the batch's metrics (:mod:`onceflow.sinks.http.ledger`), the calls of keys
   left ``started`` (a service without idempotency answered ambiguously: applied or not), and
   the marker. Crash point ``after_sink_commit`` (and ``ambiguous_commit``): Spark re-runs N,
   step 2 finds the marker.
7. Return True; Spark writes ``commits/N``.

Guarantees, by the kind of service:

* **It honours ``Idempotency-Key``** (applies a key at most once, and answers a repeat with the
  first answer): every effect is applied **exactly once** — a key is called until a 2xx answer
  is in the ledger, and every call of a key carries the same key.
* **It does not**: **at most one completed call per key** — a key is called again only after
  an answer that proves the call was not applied (no connection, ``429``, ``503``, another
  ``4xx``). A crash inside the window of step 4, or an ambiguous answer (timeout, ``500``,
  ``502``, ``504``), leaves the key ``started``: it may or may not have been applied, and it is
  never called again. :meth:`HttpEffectsSink.unconfirmed` (SQL: ``SELECT * FROM
  onceflow_effects WHERE state = 'started'``) lists those keys: reconcile them with the
  service's own records (the payload hash is in the ledger), and apply the missing ones by hand.

The payload of a key is the one computed by the attempt that recorded it; with a
non-deterministic ``per_batch``, turn on stable input (``write_stream(stable=True)``) so that
every attempt of a batch computes — reads back — the same rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import ConfigError, EffectsFailedError, OnceflowError
from onceflow.faults import CrashPoint
from onceflow.sinks._core.base import BatchStats, SinkBase
from onceflow.sinks._core.checks import check_frame, check_json, check_json_frame, check_outputs
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.calls import Caller, effects_of, unstable
from onceflow.sinks.http.ledger import Effect, read_batches

_log = logging.getLogger(__name__)


class HttpEffectsSink(Caller, SinkBase):
    """Effects on an HTTP service, each exactly once (or at most once), by idempotency key and ledger.

    Runs on the driver (the sink's side); what Spark's tasks run is the :class:`Caller` alone.

    Args:
        url, ledger, sink_id, idempotent, concurrency, retries, timeout_s, backoff_s,
            confirm_every_s, headers: As :class:`onceflow.sinks.http.calls.Caller` takes them.
        collect_below: A batch whose input has fewer rows is collected and called from the driver;
            a larger one is called by Spark's tasks (:meth:`commit_frames`; 0: always the tasks).

    Raises:
        ConfigError: A bad option.
    """

    all_or_nothing = False
    """Each table of a batch commits on its own."""

    def __init__(self, url: str, ledger: str | Path, sink_id: str = "default", idempotent: bool = True,
                 concurrency: int = 16, retries: int = 5, timeout_s: float = 10.0, backoff_s: float = 0.05,
                 confirm_every_s: float = 0.2, headers: Mapping[str, str] | None = None,
                 collect_below: int = 100_000) -> None:
        super().__init__(url, ledger, sink_id=sink_id, idempotent=idempotent, concurrency=concurrency,
                         retries=retries, timeout_s=timeout_s, backoff_s=backoff_s,
                         confirm_every_s=confirm_every_s, headers=headers)
        self.collect_below = collect_below

    def __repr__(self) -> str:
        return f"onceflow.http({self.url!r}, ledger={self.ledger_where!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--ledger PATH --sink-id ID`` (a PostgreSQL ledger's URL without its password)."""
        return f"--ledger {self.ledger_where} --sink-id {self.sink_id}"

    def bind(self, query_id: str) -> None:
        """Tie the ledger's sink id to the checkpoint (idempotent)."""
        self.ledger.bind(query_id)

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Apply every row of batch ``batch_id`` as one call, unless the batch was committed (steps 1-7).

        May be called again with the same arguments (after a crash); see the module for what
        is sent again.

        Returns:
            True if this call committed the batch, False for a replay.

        Raises:
            EffectsFailedError: Effects refused or not delivered (the batch is not committed).
            UnstableOutputError: This attempt computed other payloads than an earlier one.
        """
        effects = self._effects(batch_id, outputs, specs)  # 1
        started = time.perf_counter()
        plan = self.ledger.start(batch_id, effects, resend_started=self.idempotent)  # 2
        if plan is None:
            return False
        if plan.changed:
            raise unstable(batch_id, plan.changed)
        faults.reached(CrashPoint.EFFECTS_STARTED, batch_id)
        pending: list[tuple[str, int, int]] = []
        answers = asyncio.run(self.send_all(plan.send, pending.append))  # 3
        faults.reached(CrashPoint.EFFECTS_SENT, batch_id)  # 4
        self.ledger.confirm(pending)  # 5
        counts, failure, left = self.tally(batch_id, plan, answers)
        if failure:
            raise EffectsFailedError(failure)
        self.ledger.finish(batch_id, counts, time.perf_counter() - started, left,  # 6
                           stats, rows_out)
        _log.info("batch %d: %d effects; processed: %d calls attempted, %d applied and %d replayed by the "
                  "service; committed: %d confirmed in the ledger, %d unconfirmed", batch_id,
                  *(counts[m] for m in ("effects", "calls", "applied", "replayed", "confirmed",
                                        "unconfirmed")))
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True  # 7

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None) -> bool:
        """Batch ``batch_id``'s DataFrames: a small batch collected, a large one called by Spark's tasks.

        Under ``collect_below`` rows: collected, steps 1-7 of the module. Otherwise steps T1-T4:

        1. **Check** (T1). Crash point ``before_sink_write``. Every table has a key; Spark checks
           the frames for a null or repeated key (:func:`onceflow.sinks._core.checks.check_frame`) and a
           value JSON cannot hold (:func:`onceflow.sinks._core.checks.check_json_frame`). Nothing is sent.
        2. **Decide** (T2): the batch's marker in the ledger — a replay: False.
        3. **Call** (T3). Spark computes every row's effect (key and payload, as
           :func:`effects_of`) and each task takes its share through steps 2-5 against the
           ledger (:func:`onceflow.sinks.http.tasks.send_task`: keys ``started`` before any
           call, confirmed after; crash point ``task_after_write``); a task with a key refused or
           not delivered fails (Spark tries it again; then the batch fails, and its re-run sends
           only what is not confirmed). The data source's commit writes the batch's metrics and
           its marker in one ledger transaction (step 6).
        4. Crash point ``after_sink_commit`` (and ``ambiguous_commit``): the re-run finds the
           marker at T2. **Return** True.

        Raises:
            ConfigError: A table without ``key``.
            BatchRejectedError: A null or repeated key, or a value JSON cannot hold (nothing sent).
            EffectsFailedError: Effects refused or not delivered (the batch is not committed).
            UnstableOutputError: This attempt computed other payloads than an earlier one.
        """
        from onceflow.sinks._core.base import collected
        from onceflow.sinks.http import tasks

        self._keys({n: specs[n] for n in frames if n in specs})
        counts = self._counted(batch_id, frames, specs, written)  # T1
        if sum(counts.values()) < self.collect_below:
            return self.commit_tables(batch_id, collected(frames), specs, stats, rows_out)
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
            check_json_frame(f"table {name!r}", specs[name], frame, frame.columns)
        if self.ledger.has_marker(batch_id):  # T2
            return False
        live = {n: f for n, f in frames.items() if counts[n]}
        spec = tasks.HttpTaskSpec(
            {"url": self.url, "ledger": str(self.ledger_ref), "sink_id": self.sink_id,
             "idempotent": self.idempotent, "headers": self.headers, "concurrency": self.concurrency,
             "retries": self.retries, "timeout_s": self.timeout_s, "backoff_s": self.backoff_s,
             "confirm_every_s": self.confirm_every_s},
            batch_id, asdict(stats), rows_out, time.time())
        if live:  # T3
            tasks.run(tasks.effects_frame(live, specs, self.sink_id, batch_id), spec)
        else:  # no task runs, no commit: the marker from here
            tasks.finish(spec, batch_id, [])
        if not self.ledger.has_marker(batch_id):
            raise OnceflowError(f"batch {batch_id}: Spark's calls of the effects returned without the "
                                f"batch's marker in {self.ledger_where}; the batch runs again")
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # T4
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True

    def _effects(self, batch_id: int, outputs: Mapping[str, pa.Table],
                 specs: Mapping[str, Table]) -> list[Effect]:
        """Step 1: the batch's rows checked, as effects (crash point ``before_sink_write`` first).

        Raises:
            ConfigError: A table without ``key``.
            BatchRejectedError: The rows do not fit the specs.
        """
        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)
        self._keys({n: specs[n] for n in outputs if n in specs})
        check_outputs(outputs, specs)
        for name, rows in outputs.items():  # a payload is the row as JSON
            check_json(f"table {name!r}", specs[name], rows, rows.column_names)
        return [e for name, rows in outputs.items()
                for e in effects_of(self.sink_id, name, specs[name], rows, batch_id)]

    def unconfirmed(self) -> list[dict[str, Any]]:
        """Keys started and never confirmed (see the module): reconcile them with the service."""
        return self.ledger.unconfirmed()

    def effect_batches(self) -> list[dict[str, Any]]:
        """Per-batch metrics: attempted calls, applied / replayed answers, confirmed in the ledger."""
        return self.ledger.batches()

    @staticmethod
    def _keys(specs: Mapping[str, Table]) -> None:
        """Every table has a key (it names the table's effects).

        Raises:
            ConfigError: A table without ``key``.
        """
        for name, spec in specs.items():
            if not spec.key:
                raise ConfigError(f"table {name!r}: the HTTP sink needs key=[...] — the columns that name "
                                  "an effect (its idempotency key)")

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Open the ledger; every table needs a key; claim the tables for this sink id in the ledger.

        (See :meth:`onceflow.sinks._core.base.Sink.check` and :mod:`onceflow.sinks._core.owners`: two sink ids
        on one table would each send every effect under their own keys.)
        """
        self._keys(specs)
        self.ledger.claim(specs, f"--ledger {self.ledger_where}")

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows, by batch id."""
        return read_batches(self.ledger_ref, self.sink_id)

    def flush(self) -> None:
        """Nothing to wait for: a batch's effects are done when ``commit_tables`` returns."""
