"""Batch N's plan metrics on Spark Connect, from the query's progress, written into N's marker by N+1.

On a classic driver, step 4 of :mod:`onceflow.engine.batch` reads a batch's input rows, late drops and
duplicates from the plan Spark executed for it (py4j, :func:`onceflow.checkpoint.logs.plan_counts`).
Spark Connect's ``foreachBatch`` worker has no py4j; what Connect offers is the query's progress,
which Spark reports once the batch's ``foreachBatch`` returned — after the batch's marker was
committed. So batch N's numbers reach N's marker one batch late:

1. ``write_stream`` gives the batch writer the client session's id: the worker runs each batch in
   a clone of that session, which does not see the query.
2. In batch N+1 the worker attaches to the client's session (once per worker) and reads the
   query's last progress.
3. That progress is N's only if its ``batchId`` is N and it ran a batch (an ``addBatch`` phase;
   Spark's idle reports have none). Its sources' ``numInputRows``, its stateful operators'
   ``numRowsDroppedByWatermark`` and its deduplications' ``numDroppedDuplicateRows`` are then the
   metrics of N's plan.
4. N+1's commit writes them into N's marker where it holds NULL, and only where the input rows
   agree with a count made without the plan (:class:`onceflow.sinks._core.marker.Amend`): N's files'
   rows (the marker's ``input_rows``, Parquet), the records of N's JSON-lines files
   (:func:`file_records`: the non-blank lines of ``.json``/``.jsonl``/``.ndjson`` files) or the
   rows between a Kafka source's offsets. A plan that ran twice counted twice, and its metrics
   are left out.

The last batch of a run keeps NULL (no batch after it read its progress), as does a batch whose
progress was lost with a crash of the server.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onceflow.sinks._core.marker import Amend

log = logging.getLogger(__name__)


class ProgressReader:
    """The query's last progress, read in the ``foreachBatch`` worker (step 2 of the module).

    Pickled with the batch writer as the client session's id alone; the worker opens its own
    Spark Connect session on it (never stopped: stopping would end the client's session).

    Args:
        session_id: The id of the Spark Connect session that started the query.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._session: Any = None
        self._failed = False

    def __getstate__(self) -> dict[str, Any]:
        return {"session_id": self.session_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["session_id"])  # type: ignore[misc]

    def previous(self, query_id: str, batch_id: int) -> Amend | None:
        """Batch ``batch_id - 1``'s metrics from the query's last progress; None if it is not that batch's.

        A progress that cannot be read leaves the markers as they are (one warning per worker):
        the metrics are a report, never a reason to fail a batch.

        Args:
            query_id: The query's id (the checkpoint's).
            batch_id: The batch being written.
        """
        if batch_id == 0 or self._failed:
            return None
        try:
            progress = self._last(query_id)
        except Exception as exc:  # noqa: BLE001 - a server without the API, a session gone
            self._failed = True
            log.warning("onceflow: the query's progress cannot be read on this Spark Connect server (%s); "
                        "the markers' plan metrics stay NULL", str(exc).splitlines()[0][:200])
            return None
        return amend_from(progress, batch_id - 1)

    def _last(self, query_id: str) -> dict[str, Any] | None:
        if self._session is None:
            from pyspark.sql.connect.session import SparkSession

            url = os.environ.get("SPARK_CONNECT_LOCAL_URL")  # the server's own address, given its workers
            if url is None:
                return None
            self._session = SparkSession.builder.remote(f"{url};session_id={self.session_id}").create()
        query = self._session.streams.get(query_id)
        progress = None if query is None else query.lastProgress
        if progress is None:
            return None
        return json.loads(progress.json) if hasattr(progress, "json") else dict(progress)


def amend_from(progress: Mapping[str, Any] | None, batch_id: int) -> Amend | None:
    """Step 3: batch ``batch_id``'s metrics from a progress report (a dict of Spark's progress JSON).

    Returns:
        The metrics, or None when the report is not of a batch ``batch_id`` that ran.
    """
    if (progress is None or progress.get("batchId") != batch_id
            or "addBatch" not in (progress.get("durationMs") or {})):
        return None
    sources = progress.get("sources") or []
    rows = sum(int(s.get("numInputRows") or 0) for s in sources)
    late = dups = 0
    deduplicated = False
    for op in progress.get("stateOperators") or []:
        late += int(op.get("numRowsDroppedByWatermark") or 0)
        dropped = (op.get("customMetrics") or {}).get("numDroppedDuplicateRows")
        if dropped is not None:
            deduplicated = True
            dups += int(dropped)
    return Amend(batch_id, rows, late, dups if deduplicated else None, _span(sources))


JSON_LINES = (".json", ".jsonl", ".ndjson")
"""File names whose records :func:`file_records` counts (one per non-blank line, uncompressed)."""


def file_records(checkpoint: str | os.PathLike[str], batch_id: int) -> int | None:
    """The records of batch ``batch_id``'s input files when they are JSON lines (step 4); else None.

    A file source's batch read the files its offset log names; Spark's JSON reader (without
    ``multiLine``) makes one record of each non-blank line, so their count is the batch's input
    rows, counted without the plan. Files of another kind, compressed, or not on this machine's
    file system give None (the marker keeps NULL). Runs in the ``foreachBatch`` worker's stats
    thread while batch ``batch_id`` + 1 runs, once per batch on Spark Connect; reads the files
    line by line.
    """
    from onceflow.checkpoint import logs as ckpt

    if batch_id < 0:
        return None
    end = ckpt.source_offset(checkpoint, batch_id)
    if end is None or "logOffset" not in end:  # not a file source
        return None
    try:
        files = ckpt.batch_input(checkpoint, batch_id).files
        if not files or not all(Path(f).suffix.lower() in JSON_LINES and Path(f).is_file() for f in files):
            return None
        records = 0
        for f in files:
            with open(f, "rb") as fh:
                records += sum(1 for line in fh if line.strip())
    except (OSError, ValueError):  # a file gone, a log that does not parse: no count, NULL stays
        return None
    return records


def with_span(amend: Amend | None, records: int | None) -> Amend | None:
    """``amend`` with ``records`` (:func:`file_records` of its batch) as its span, where it has none."""
    if amend is None or amend.span is not None or records is None:
        return amend
    return dataclasses.replace(amend, span=records)


def _span(sources: list[Mapping[str, Any]]) -> int | None:
    """The rows between every source's start and end offsets: Kafka's ``{topic: {partition: offset}}``.

    Spark's connector logs that form; onceflow's Kafka source nests it under ``offsets``
    (:func:`onceflow.sources.kafka.source.logged_offsets`), with ``from`` where it resumed past offsets
    deleted unread (then the span is not what was read: None). None too when a source has other
    offsets (files, ...) or a partition has no start (a first batch).
    """
    total = 0
    for s in sources:
        try:
            start, end = json.loads(s.get("startOffset") or "null"), json.loads(s.get("endOffset") or "null")
        except ValueError:
            return None
        if not isinstance(start, dict) or not isinstance(end, dict):
            return None
        if isinstance(end.get("offsets"), dict):  # onceflow's source
            if end.get("from") or not isinstance(start.get("offsets"), dict):
                return None
            start, end = start["offsets"], end["offsets"]
        for topic, parts in end.items():
            began = start.get(topic)
            if not isinstance(parts, dict) or not isinstance(began, dict):
                return None
            for part, offset in parts.items():
                if not isinstance(offset, int) or not isinstance(began.get(part), int):
                    return None
                total += offset - began[part]
    return total if sources else None
