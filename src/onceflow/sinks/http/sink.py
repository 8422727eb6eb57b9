"""The side-effect sink: one HTTP call per output row, to a service that is not a database.

Each row of each table becomes one ``POST`` of the row as JSON, with an ``Idempotency-Key``
derived from the row's key columns (never random: the same logical effect always has the same
key — ``<sink_id>/<table>/<key values, URL-quoted>``, see :func:`effect_key`). The table's mode
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
of :mod:`onceflow.sinks.base`: 1 is *check*; 2 is *decide*, and records the keys before any call
(a service cannot join the ledger's transaction); 3-5 are *write* (the calls) and their
confirmations; 6 is *mark* and *commit*; 7 is *return*.

1. Crash point ``before_sink_write``. Every table needs a key; keys must be non-null and unique
   within the batch (:func:`onceflow.tables.check_batch`). Nothing is sent.
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
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from onceflow.errors import ConfigError, EffectsFailedError, OnceflowError, UnstableOutputError
from onceflow.faults import CrashPoint, maybe_crash
from onceflow.sinks.base import BatchStats, SinkBase
from onceflow.sinks.http.ledger import Effect, Ledger, Plan, is_dsn, open_ledger, read_batches, where
from onceflow.tables import Table, check_frame, check_json, check_json_frame, check_outputs

_log = logging.getLogger(__name__)


def effect_key(sink_id: str, table: str, values: list[Any]) -> str:
    """The idempotency key of the effect of a row: ``<sink_id>/<table>/<key values>``.

    Args:
        sink_id: The sink's id.
        table: The table (as named in ``tables=``).
        values: The row's key column values, in the spec's key order.
    """
    return "/".join([quote(sink_id, safe=""), quote(table, safe=""),
                     *(quote(str(v), safe="") for v in values)])


def _json(value: Any) -> str:
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    if isinstance(value, bytes):  # UTF-8 text (step 1 refused other bytes)
        return value.decode("utf-8")
    return str(value)


def effects_of(sink_id: str, table: str, spec: Table, rows: pa.Table, batch_id: int) -> list[Effect]:
    """One table's effects: key from the key columns (and batch, for ``merge``); payload = the row."""
    out = []
    tail = [batch_id] if spec.mode in ("merge", "upsert") else []
    for row in rows.to_pylist():
        key = effect_key(sink_id, table, [*(row[k] for k in spec.key), *tail])
        out.append(Effect(key, json.dumps(row, sort_keys=True, separators=(",", ":"), default=_json)))
    return out


@dataclass
class _Answer:
    key: str
    outcome: str  # ok | refused | undelivered | ambiguous
    status: int
    calls: int
    replayed: bool = False
    detail: str = ""
    maybe_applied: bool = False  # a call of the key may have reached the service and been applied


class _Retry(Exception):
    """A call to try again (tenacity's retry predicate)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class HttpEffectsSink(SinkBase):
    """Effects on an HTTP service, each exactly once (or at most once), by idempotency key and ledger.

    Args:
        url: Where each effect is POSTed.
        ledger: The ledger (see :mod:`onceflow.sinks.http.ledger`): a SQLite file, or a PostgreSQL
            database's ``postgresql://`` URL (what Spark's tasks on a cluster reach without a
            shared file system).
        sink_id: Namespace of keys and markers.
        idempotent: The service honours ``Idempotency-Key`` (see the module's guarantees).
        concurrency: Calls in flight at once.
        retries: Calls per key at most (the first included).
        timeout_s: Seconds a call may take.
        backoff_s: First retry delay (doubles, capped at 2 s).
        confirm_every_s: How often confirmations are written to the ledger while calls run.
        headers: Extra headers of every call (e.g. ``Authorization``).
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
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {url!r}")
        if concurrency < 1 or retries < 1 or timeout_s <= 0:
            raise ConfigError("concurrency and retries must be >= 1 and timeout_s > 0")
        self.url, self.sink_id, self.idempotent = url, sink_id, idempotent
        self.concurrency, self.retries, self.timeout_s = concurrency, retries, timeout_s
        self.backoff_s, self.confirm_every_s = backoff_s, confirm_every_s
        self.collect_below = collect_below
        self.headers = dict(headers or {})
        self.ledger_ref: str | Path = str(ledger) if is_dsn(ledger) else Path(ledger)
        """The ledger as given: a SQLite file's path or a PostgreSQL URL."""
        self.ledger_where = where(ledger)
        """The ledger as messages name it (no password)."""
        self._ledger: Ledger | None = None

    def __repr__(self) -> str:
        return f"onceflow.http({self.url!r}, ledger={self.ledger_where!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--ledger PATH --sink-id ID`` (a PostgreSQL ledger's URL without its password)."""
        return f"--ledger {self.ledger_where} --sink-id {self.sink_id}"

    @property
    def ledger(self) -> Ledger:
        """The ledger (opened on first use)."""
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_ref, self.sink_id)
        return self._ledger

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
        maybe_crash(CrashPoint.EFFECTS_STARTED, batch_id)
        pending: list[tuple[str, int, int]] = []
        answers = asyncio.run(self.send_all(plan.send, pending.append))  # 3
        maybe_crash(CrashPoint.EFFECTS_SENT, batch_id)  # 4
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
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True  # 7

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None) -> bool:
        """Batch ``batch_id``'s DataFrames: a small batch collected, a large one called by Spark's tasks.

        Under ``collect_below`` rows: collected, steps 1-7 of the module. Otherwise steps T1-T4:

        1. **Check** (T1). Crash point ``before_sink_write``. Every table has a key; Spark checks
           the frames for a null or repeated key (:func:`onceflow.tables.check_frame`) and a
           value JSON cannot hold (:func:`onceflow.tables.check_json_frame`). Nothing is sent.
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
        from onceflow.sinks.base import collected
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
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # T4
        maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True

    def tally(self, batch_id: int, plan: Plan,
              answers: list[_Answer]) -> tuple[dict[str, int], str, list[tuple[str, int, int]]]:
        """Step 5's accounting: the counts, the failure (empty: none), the keys left ``started``.

        Keys refused, or that provably never reached the service, are forgotten (sent as new
        keys next time). Unconfirmed keys are reported on stderr: reconcile them.
        """
        counts = plan.counts
        counts["calls"] = sum(a.calls for a in answers)
        counts["applied"] = sum(a.outcome == "ok" and not a.replayed for a in answers)
        counts["replayed"] = sum(a.outcome == "ok" and a.replayed for a in answers)
        counts["confirmed"] = sum(a.outcome == "ok" for a in answers)
        failed = [a for a in answers if a.outcome in ("refused", "undelivered")]
        self.ledger.forget(a.key for a in failed  # provably not applied: sent as new keys next time
                           if a.outcome == "refused" or not a.maybe_applied)
        if failed:
            return counts, _failure(batch_id, failed, len(answers), counts["confirmed"]), []
        left = [(a.key, a.status, a.calls) for a in answers if a.outcome == "ambiguous"]
        counts["unconfirmed"] = len(left) + counts["held"]
        if counts["unconfirmed"]:
            print(f"onceflow: warning: batch {batch_id}: {counts['unconfirmed']} effects may or may not have "
                  "been applied (the service does not honour idempotency keys and answered ambiguously, "
                  "or an earlier attempt crashed after calling); they are never called again — reconcile "
                  f"them: SELECT * FROM onceflow_effects WHERE state = 'started' in {self.ledger_where}",
                  file=sys.stderr)
        return counts, "", left

    def _effects(self, batch_id: int, outputs: Mapping[str, pa.Table],
                 specs: Mapping[str, Table]) -> list[Effect]:
        """Step 1: the batch's rows checked, as effects (crash point ``before_sink_write`` first).

        Raises:
            ConfigError: A table without ``key``.
            BatchRejectedError: The rows do not fit the specs.
        """
        maybe_crash(CrashPoint.BEFORE_SINK_WRITE, batch_id)
        self._keys({n: specs[n] for n in outputs if n in specs})
        check_outputs(outputs, specs)
        for name, rows in outputs.items():  # a payload is the row as JSON
            check_json(f"table {name!r}", specs[name], rows, rows.column_names)
        return [e for name, rows in outputs.items()
                for e in effects_of(self.sink_id, name, specs[name], rows, batch_id)]

    async def send_all(self, effects: list[Effect], confirmed: Any, record: bool = True) -> list[_Answer]:
        """Step 3: every call, bounded; ``confirmed((key, status, calls))`` for each 2xx answer.

        With ``record``, confirmations are also written to the ledger while the calls run.
        """
        import aiohttp

        if not effects:
            return []
        sem = asyncio.Semaphore(self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        batch: list[tuple[str, int, int]] = []
        stop = asyncio.Event()

        async def flusher() -> None:  # confirmations reach the ledger while calls run
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.confirm_every_s)
                except asyncio.TimeoutError:
                    pass
                if stop.is_set():  # the rest is recorded by step 5, after the effects_sent point
                    break
                if batch and record:
                    done = batch[:]
                    del batch[:len(done)]
                    await asyncio.to_thread(self.ledger.confirm, done)  # the calls go on meanwhile

        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session:
            task = asyncio.create_task(flusher())

            async def one(e: Effect) -> _Answer:
                async with sem:
                    answer = await self._call(session, e)
                if answer.outcome == "ok":
                    batch.append((answer.key, answer.status, answer.calls))
                return answer

            try:
                answers = await asyncio.gather(*(one(e) for e in effects))
            finally:
                stop.set()
                await task
        for item in batch:  # not flushed yet: step 5 records them
            confirmed(item)
        return list(answers)

    async def _call(self, session: Any, e: Effect) -> _Answer:
        """One key: call until a 2xx answer, a refusal, or the retry policy gives up.

        The first call runs without the retry machinery (most calls succeed at once); a
        retryable failure continues under tenacity with exponential backoff.
        """
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

        headers = {"Idempotency-Key": e.key, "Content-Type": "application/json"}
        state = {"calls": 0, "ambiguous": False}
        try:
            return await self._attempt(session, e, headers, state)
        except _Retry as first:
            last = first
        if self.retries > 1:
            try:
                async for attempt in AsyncRetrying(stop=stop_after_attempt(self.retries - 1), reraise=True,
                                                   wait=wait_exponential(multiplier=self.backoff_s, max=2.0),
                                                   retry=retry_if_exception_type(_Retry)):
                    with attempt:
                        return await self._attempt(session, e, headers, state)
            except _Retry as exc:
                last = exc
        calls = state["calls"]
        detail = last.detail
        if state["ambiguous"] and not detail.startswith("ambiguous"):
            detail = f"ambiguous: {detail}"
        return _Answer(e.key, "undelivered", last.status, int(calls), detail=f"{detail} after {calls} calls",
                       maybe_applied=bool(state["ambiguous"]))

    async def _attempt(self, session: Any, e: Effect, headers: dict[str, str],
                       state: dict[str, Any]) -> _Answer:
        """One call of a key; raises :class:`_Retry` when the policy allows another."""
        import aiohttp

        state["calls"] += 1
        calls = int(state["calls"])
        try:
            async with session.post(self.url, data=e.payload, headers=headers, allow_redirects=False) as resp:
                status = resp.status
                body = await resp.read()
                location = resp.headers.get("Location", "")
        except aiohttp.ClientConnectorError as exc:  # never reached the service
            raise _Retry(0, f"no connection: {exc}") from None
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            state["ambiguous"] = True
            if not self.idempotent:
                return _Answer(e.key, "ambiguous", 0, calls, detail=f"ambiguous: {exc!r}")
            raise _Retry(0, f"ambiguous: {exc!r}") from None
        if 200 <= status < 300:
            return _Answer(e.key, "ok", status, calls, _replayed(body))
        if 300 <= status < 400:  # a client would repeat a POST as a GET: never followed
            return _Answer(e.key, "refused", status, calls,
                           detail=f"refused: HTTP {status} redirect to {location or '(no Location)'} — "
                                  "onceflow never follows a redirect of an effect; set url= to where the "
                                  "service takes the POST")
        if status in (429, 503):
            raise _Retry(status, f"HTTP {status} (not applied)")
        if status >= 500:
            state["ambiguous"] = True
            if not self.idempotent:
                return _Answer(e.key, "ambiguous", status, calls, detail=f"ambiguous: HTTP {status}")
            raise _Retry(status, f"ambiguous: HTTP {status}")
        return _Answer(e.key, "refused", status, calls,
                       detail=f"refused: HTTP {status} {body[:200].decode(errors='replace')}")

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

        (See :meth:`onceflow.sinks.base.Sink.check` and :mod:`onceflow.sinks.owners`: two sink ids
        on one table would each send every effect under their own keys.)
        """
        self._keys(specs)
        self.ledger.claim(specs, f"--ledger {self.ledger_where}")

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows, by batch id."""
        return read_batches(self.ledger_ref, self.sink_id)

    def flush(self) -> None:
        """Nothing to wait for: a batch's effects are done when ``commit_tables`` returns."""

    def close(self) -> None:
        """Close the ledger (idempotent)."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None


def unstable(batch_id: int, changed: list[str]) -> UnstableOutputError:
    """The error of keys an earlier attempt of the batch recorded with another payload."""
    return UnstableOutputError(
        f"batch {batch_id}: effect {changed[0]} (and {len(changed) - 1} more) has another payload than when "
        "an earlier attempt of the batch recorded it — per_batch is not deterministic; use "
        "onceflow.write_stream(..., stable=True) so every attempt writes the first attempt's rows. Nothing "
        "of this attempt was sent.")


def _failure(batch_id: int, failed: list[_Answer], answered: int, confirmed: int) -> str:
    """Step 5's message: refused, never delivered, and unknown outcomes told apart, each with an example."""
    kinds = {"refused by the service": [a for a in failed if a.outcome == "refused"],
             "never reached the service (not applied)": [a for a in failed if a.outcome != "refused"
                                                          and not a.maybe_applied],
             "have an unknown outcome (timeouts or 5xx answers: the service may have applied them)":
                 [a for a in failed if a.outcome != "refused" and a.maybe_applied]}
    told = "; ".join(f"{len(group)} {kind} (e.g. {group[0].key}: {group[0].detail})"
                     for kind, group in kinds.items() if group)
    return (f"batch {batch_id}: {len(failed)} of {answered} effects were not confirmed: {told}. The batch is "
            f"not committed — the {confirmed} confirmed effects will not be sent again when the query "
            "restarts; the others will, each with its same Idempotency-Key")


def _replayed(body: bytes) -> bool:
    """Whether a 2xx answer says the key was applied before (``{"replayed": true}``)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return bool(isinstance(parsed, dict) and parsed.get("replayed"))
