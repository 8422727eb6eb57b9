"""``onceflow verify --pipeline ... --sink kafka``: a user's pipeline into Kafka topics, proven or caught.

The pipeline (``tests/verify/pipelines/sensors.py``, written for this test) reads a topic with
Spark's own ``format("kafka")`` and writes one topic per table mode and record form of the Kafka
sink: an ``append`` table of JSON objects, an ``upsert`` table of raw ``value`` records keyed by
one column, and a ``merge`` table keyed by two columns. verify's oracle reads the topics with
``read_committed`` and folds them by each table's spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.verify.pipelines import sensors
from tests.verify.verify_cli import run_verify as _verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]

SENSORS = str(Path(sensors.__file__))


@pytest.fixture(scope="module")
def readings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sensors") / "sample"
    sensors.write_sample(directory, files=4, per_file=1000, seed=3)
    return directory


def _distinct(readings: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(ln) for f in sorted(readings.iterdir()) for ln in f.read_text().splitlines()]
    return {r["reading_id"]: r for r in rows}


@pytest.mark.long  # make test measured 32:53 on a slow day (2026-11-27): multi-round runs go long
def test_a_pipeline_from_and_into_kafka_topics_is_exact_under_crashes(readings: Path, tmp_path: Path) -> None:
    """Kafka in (``format("kafka")``: verify produces the readings as records) and Kafka out."""
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{SENSORS}:build_kafka", "--input", str(readings),
                           "--source", "kafka", "--sink", "kafka", "--rounds", "3", "--seed", "4",
                           "--faults", "crash_inside_sink_txn,crash_after_sink_commit,kill_random")
    assert rc == 0, out
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"]), rep["rounds"]  # every fault hit data
    tables = rep["verdict"]["tables"]
    # the oracle's expectation against a count by hand from the sample: records of partitions read
    # behind the others' event time are late by the watermark (dropped: this pipeline keeps no late=)
    distinct = _distinct(readings)
    assert 100 < tables["hot"]["expected_rows"] <= sum(r["degrees"] > 30 for r in distinct.values())
    assert tables["latest"]["expected_rows"] == len({r["sensor"] for r in distinct.values()}) == 25
    assert tables["per_site"]["expected_rows"] == len({r["site"] for r in distinct.values()}) * 2  # two days
    assert all(t["lost_events"] == 0 and t["duplicated_events"] == 0 for t in tables.values()), tables


@pytest.mark.long  # ~30 s: make test is at its 30 minutes
def test_a_producer_without_transactions_is_caught(readings: Path, tmp_path: Path) -> None:
    """``kafka-naive`` produces every attempt of a batch: the replayed batch's records twice."""
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{SENSORS}:build", "--input", str(readings),
                           "--sink", "kafka-naive", "--rounds", "1", "--seed", "4",
                           "--faults", "crash_after_sink_commit")
    assert rc == 1, out
    tables = rep["verdict"]["tables"]
    assert tables["hot"]["duplicated_events"] > 0 and tables["per_site"]["duplicated_events"] > 0, tables
    assert tables["latest"]["duplicated_events"] == 0  # an upsert replayed is the same last value
