"""Batch metrics from a query's progress report (Spark Connect): which reports count, and the Kafka span.

The reports are Spark's progress JSON as a Spark Connect server gave them for the pipelines of
``test_connect.py`` and ``test_connect_kafka_postgres.py`` (trimmed to the fields read); the end
to end checks — the metrics in the markers, adding up — are those tests.
"""

from __future__ import annotations

import json
from typing import Any

from onceflow.engine.progress import amend_from
from onceflow.sinks._core.marker import Amend


def _report(batch: int, sources: list[dict[str, Any]], ops: list[dict[str, Any]],
            phases: tuple[str, ...] = ("addBatch", "triggerExecution")) -> dict[str, Any]:
    return {"batchId": batch, "durationMs": dict.fromkeys(phases, 5), "sources": sources,
            "stateOperators": ops}


def _kafka(start: Any, end: Any, rows: int) -> dict[str, Any]:
    return {"startOffset": None if start is None else json.dumps(start), "endOffset": json.dumps(end),
            "numInputRows": rows}


DEDUP = {"operatorName": "dedupe", "numRowsDroppedByWatermark": 3,
         "customMetrics": {"numDroppedDuplicateRows": 50}}


def test_a_file_batch_gives_its_rows_late_and_duplicates_and_no_span() -> None:
    files = {"startOffset": '{"logOffset":2}', "endOffset": '{"logOffset":3}', "numInputRows": 252}
    assert amend_from(_report(2, [files], [DEDUP]), 2) == Amend(2, 252, 3, 50, None)


def test_a_report_of_another_batch_or_of_an_idle_trigger_gives_nothing() -> None:
    files = {"startOffset": '{"logOffset":2}', "endOffset": '{"logOffset":3}', "numInputRows": 252}
    assert amend_from(_report(2, [files], [DEDUP]), 1) is None
    assert amend_from(_report(2, [files], [], phases=("triggerExecution", "latestOffset")), 2) is None
    assert amend_from(None, 2) is None


def test_without_a_deduplication_duplicates_are_unknown_not_zero() -> None:
    files = {"startOffset": '{"logOffset":0}', "endOffset": '{"logOffset":1}', "numInputRows": 10}
    agg = {"operatorName": "stateStoreSave", "numRowsDroppedByWatermark": 0, "customMetrics": {}}
    assert amend_from(_report(1, [files], [agg]), 1) == Amend(1, 10, 0, None, None)


def test_the_kafka_span_in_sparks_and_onceflows_offset_forms() -> None:
    spark_form = _kafka({"payments": {"0": 437, "1": 363}}, {"payments": {"0": 600, "1": 500}}, 300)
    assert amend_from(_report(3, [spark_form], [DEDUP]), 3) == Amend(3, 300, 3, 50, 300)
    ours = _kafka({"offsets": {"payments": {"0": 437, "1": 363}}},
                  {"offsets": {"payments": {"0": 600, "1": 500}}}, 300)
    assert amend_from(_report(3, [ours], [DEDUP]), 3) == Amend(3, 300, 3, 50, 300)


def test_no_span_where_the_offsets_do_not_enclose_what_was_read() -> None:
    first = _kafka(None, {"payments": {"0": 219, "1": 181}}, 400)  # a first batch: no start
    new_partition = _kafka({"t": {"0": 5}}, {"t": {"0": 9, "1": 4}}, 8)
    resumed = _kafka({"offsets": {"t": {"0": 5}}}, {"offsets": {"t": {"0": 90}}, "from": {"t": {"0": 50}}},
                     40)
    topic_named_offsets = _kafka({"offsets": {"0": 1}}, {"offsets": {"0": 9}}, 8)
    for source in (first, new_partition, resumed, topic_named_offsets):
        amend = amend_from(_report(4, [source], [DEDUP]), 4)
        assert amend is not None and amend.span is None, source
