"""The calls of effects: idempotency keys, the client with retries, the accounting of the answers.

:class:`Caller` is what both sides of the HTTP sink call with: the driver-side sink
(:class:`onceflow.sinks.http.sink.HttpEffectsSink`, a ``Caller``) for a small batch, and each of
Spark's tasks (:func:`onceflow.sinks.http.tasks.send_task`) for its share of a large one. It holds
only settings and the ledger, opened where it runs; the steps it serves are numbered in the sink's
module docstring (3: send, 5: tally).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from onceflow.errors import ConfigError, UnstableOutputError
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.ledger import Effect, Ledger, Plan, is_dsn, open_ledger, where


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
class Answer:
    """How one key's calls ended: its outcome, last status and number of calls."""

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


def require_aiohttp() -> Any:
    """The HTTP client (aiohttp), or a ConfigError naming the extra to install."""
    try:
        import aiohttp
    except ImportError:
        raise ConfigError("the HTTP sink needs aiohttp, which is not installed: "
                          "pip install 'onceflow[http]'") from None
    return aiohttp


class Caller:
    """Calls effects on one URL, each key until an answer settles it, and records them in the ledger.

    Runs where it is made: on the driver (the sink) or in one of Spark's tasks (once per task).

    Args:
        url: Where each effect is POSTed.
        ledger: The ledger: a SQLite file, or a PostgreSQL database's ``postgresql://`` URL.
        sink_id: Namespace of keys and markers.
        idempotent: The service honours ``Idempotency-Key``.
        concurrency: Calls in flight at once.
        retries: Calls per key at most (the first included).
        timeout_s: Seconds a call may take.
        backoff_s: First retry delay (doubles, capped at 2 s).
        confirm_every_s: How often confirmations are written to the ledger while calls run.
        headers: Extra headers of every call (e.g. ``Authorization``).

    Raises:
        ConfigError: A bad option, or aiohttp is not installed.
    """

    def __init__(self, url: str, ledger: str | Path, sink_id: str = "default", idempotent: bool = True,
                 concurrency: int = 16, retries: int = 5, timeout_s: float = 10.0, backoff_s: float = 0.05,
                 confirm_every_s: float = 0.2, headers: Mapping[str, str] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {url!r}")
        if concurrency < 1 or retries < 1 or timeout_s <= 0:
            raise ConfigError("concurrency and retries must be >= 1 and timeout_s > 0")
        require_aiohttp()
        self.url, self.sink_id, self.idempotent = url, sink_id, idempotent
        self.concurrency, self.retries, self.timeout_s = concurrency, retries, timeout_s
        self.backoff_s, self.confirm_every_s = backoff_s, confirm_every_s
        self.headers = dict(headers or {})
        self.ledger_ref: str | Path = str(ledger) if is_dsn(ledger) else Path(ledger)
        """The ledger as given: a SQLite file's path or a PostgreSQL URL."""
        self.ledger_where = where(ledger)
        """The ledger as messages name it (no password)."""
        self._ledger: Ledger | None = None

    @property
    def ledger(self) -> Ledger:
        """The ledger (opened on first use)."""
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_ref, self.sink_id)
        return self._ledger

    def tally(self, batch_id: int, plan: Plan,
              answers: list[Answer]) -> tuple[dict[str, int], str, list[tuple[str, int, int]]]:
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

    async def send_all(self, effects: list[Effect], confirmed: Any, record: bool = True) -> list[Answer]:
        """Step 3: every call, bounded; ``confirmed((key, status, calls))`` for each 2xx answer.

        With ``record``, confirmations are also written to the ledger while the calls run.
        """
        aiohttp = require_aiohttp()
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

            async def one(e: Effect) -> Answer:
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

    async def _call(self, session: Any, e: Effect) -> Answer:
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
        return Answer(e.key, "undelivered", last.status, int(calls), detail=f"{detail} after {calls} calls",
                       maybe_applied=bool(state["ambiguous"]))

    async def _attempt(self, session: Any, e: Effect, headers: dict[str, str],
                       state: dict[str, Any]) -> Answer:
        """One call of a key; raises :class:`_Retry` when the policy allows another."""
        aiohttp = require_aiohttp()
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
                return Answer(e.key, "ambiguous", 0, calls, detail=f"ambiguous: {exc!r}")
            raise _Retry(0, f"ambiguous: {exc!r}") from None
        if 200 <= status < 300:
            return Answer(e.key, "ok", status, calls, _replayed(body))
        if 300 <= status < 400:  # a client would repeat a POST as a GET: never followed
            return Answer(e.key, "refused", status, calls,
                           detail=f"refused: HTTP {status} redirect to {location or '(no Location)'} — "
                                  "onceflow never follows a redirect of an effect; set url= to where the "
                                  "service takes the POST")
        if status in (429, 503):
            raise _Retry(status, f"HTTP {status} (not applied)")
        if status >= 500:
            state["ambiguous"] = True
            if not self.idempotent:
                return Answer(e.key, "ambiguous", status, calls, detail=f"ambiguous: HTTP {status}")
            raise _Retry(status, f"ambiguous: HTTP {status}")
        return Answer(e.key, "refused", status, calls,
                       detail=f"refused: HTTP {status} {body[:200].decode(errors='replace')}")

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


def _failure(batch_id: int, failed: list[Answer], answered: int, confirmed: int) -> str:
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
