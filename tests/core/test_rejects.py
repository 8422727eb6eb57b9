"""Bad records: routed exactly once to ``rejects=`` with their coordinates, or the query stops naming them.

The answers come from the generator's manifest (:mod:`tests.core.orders`: each record good or bad
by construction), never from onceflow's contract.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onceflow
from onceflow import Table
from onceflow.errors import BatchRejectedError, ConfigError
from tests.core import orders

pytestmark = pytest.mark.spark


def _markers(db: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM onceflow_batches ORDER BY batch_id")]
    finally:
        conn.close()


def _check_markers(db: Path, entries: list[dict[str, Any]]) -> None:
    """Per batch: input = counted + duplicates + late + rejected; over all: the manifest's numbers."""
    markers = _markers(db)
    for m in markers:
        assert m["input_rows"] == (m["events_counted"] + m["duplicates_dropped"] + m["late_dropped"]
                                   + m["rejected_rows"]), m
    assert sum(m["input_rows"] for m in markers) == len(entries)
    bad = sum(orders.KINDS[e["kind"]] is not None for e in entries)
    assert sum(m["rejected_rows"] for m in markers) == bad
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))


def test_bad_records_go_to_rejects_once_with_coordinates(spark: Any, tmp_path: Path) -> None:
    inputs, manifest, db = tmp_path / "in", tmp_path / "manifest.jsonl", tmp_path / "app.db"
    for k in range(3):
        orders.generate(inputs, manifest, k * 300, 300, bad_rate=0.2, seed=7)
    orders.start(spark, inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    orders.generate(inputs, manifest, 900, 300, bad_rate=0.2, seed=7)  # a second run on the checkpoint
    orders.start(spark, inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    entries = orders.read_manifest(manifest)
    want = orders.expected(entries)
    assert orders.read_result(db) == want
    assert len(want["rejected"]) > 100 and {r for r, _ in want["rejected"].values()} == \
        {"parse", "required", "check", "id", "event_time"}
    _check_markers(db, entries)
    conn = sqlite3.connect(db)
    row = conn.execute("SELECT record, batch_id, value, reason FROM rejected WHERE rule = 'parse' AND "
                       "\"column\" = 'qty' LIMIT 1").fetchone()
    assert row[0].endswith(f"#{row[0].split('#')[1]}") and row[1] >= 0
    assert '"qty": "three"' in row[2] and "three" in row[3] and "INT" in row[3]
    assert conn.execute("SELECT count(*) FROM rejected WHERE topic IS NOT NULL").fetchone()[0] == 0
    from click.testing import CliRunner

    from onceflow.cli.main import cli

    listed = CliRunner().invoke(cli, ["rejects", "--db", str(db), "--records"])
    assert listed.exit_code == 0, listed.output
    records = [json.loads(line) for line in listed.output.splitlines()]
    assert {(Path(r["file"]).name, r["row"]) for r in records} == set(want["rejected"])
    summary = CliRunner().invoke(cli, ["rejects", "--db", str(db), "--rule", "id"])
    ids = sum(1 for r, _ in want["rejected"].values() if r == "id")
    assert summary.exit_code == 0 and f"{ids} rejected records in" in summary.output, summary.output


def test_without_rejects_the_first_bad_record_is_named_and_a_restart_with_rejects_loses_nothing(
        spark: Any, tmp_path: Path) -> None:
    inputs, manifest, db = tmp_path / "in", tmp_path / "manifest.jsonl", tmp_path / "app.db"
    orders.generate(inputs, manifest, 0, 200, bad_rate=0.0, seed=3)
    orders.generate(inputs, manifest, 200, 200, bad_rate=0.1, seed=3)
    query = orders.start(spark, inputs, onceflow.sqlite(db), tmp_path / "ck", rejects=None)
    with pytest.raises(BatchRejectedError) as info:
        query.awaitTermination()
    entries = orders.read_manifest(manifest)
    first = next(e for e in entries if orders.KINDS[e["kind"]] is not None)
    message = str(info.value)
    assert f"{first['file']} row {first['row']}" in message, message
    assert f"rule {orders.KINDS[first['kind']][0]!r}" in message and "rejects=" in message
    assert [m["batch_id"] for m in _markers(db)] == [0]  # the good batch; the bad one wrote nothing
    orders.start(spark, inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    assert orders.read_result(db) == orders.expected(entries)
    _check_markers(db, entries)


def test_parquet_source_rules_and_null_ids_are_never_one_id(spark: Any, tmp_path: Path) -> None:
    """A typed source: deduplicate alone rejects null ids and event times; coordinates are row indexes."""
    import datetime as dt

    inputs, db = tmp_path / "in", tmp_path / "app.db"
    inputs.mkdir()
    t = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    ids = ["a", None, "b", None, "", "a", "c", "d"]
    times = [t, t, t, t, t, t, None, t]
    pq.write_table(pa.table({"id": ids, "n": pa.array([1, 2, 3, 4, 5, 6, 7, -8], pa.int32()),
                             "ts": pa.array(times, pa.timestamp("us", tz="UTC"))}), inputs / "p.parquet")
    raw = spark.readStream.schema("id STRING, n INT, ts TIMESTAMP").parquet(str(inputs))
    checked = onceflow.expect(raw, checks={"n_positive": "n > 0"})
    clean = onceflow.deduplicate(checked, id="id", event_time="ts", within="1 minute")
    onceflow.write_stream(clean, onceflow.sqlite(db), tmp_path / "ck", {"rows": Table()}, once=True,
                          rejects="bad").awaitTermination()
    conn = sqlite3.connect(db)
    assert sorted(conn.execute("SELECT id, n FROM rows").fetchall()) == [("a", 1), ("b", 3)]
    bad = conn.execute("SELECT row, rule, \"column\", value FROM bad ORDER BY row").fetchall()
    assert [(r, rule, c) for r, rule, c, _ in bad] == [
        (2, "id", "id"), (4, "id", "id"), (5, "id", "id"), (7, "event_time", "ts"),
        (8, "check", "n_positive")]
    assert '"n":2' in bad[0][3]
    (m,) = _markers(db)[:1]
    assert (m["input_rows"], m["duplicates_dropped"], m["rejected_rows"], m["events_counted"]) == (8, 1, 5, 2)


def test_a_stream_transformed_before_deduplicate_stops_at_a_null_id(spark: Any, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"id": "x", "ts": "2026-03-01T00:00:00Z"}\n'
                                   '{"ts": "2026-03-01T00:00:00Z"}\n')
    from pyspark.sql import functions as F

    raw = spark.readStream.text(str(inputs))
    parsed = raw.select(F.from_json("value", "id STRING, ts TIMESTAMP").alias("o")).select("o.*")
    clean = onceflow.deduplicate(parsed, id="id", event_time="ts", within="1 minute")
    with pytest.raises(ConfigError, match="rejects= needs rules"):
        onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "a.db"), tmp_path / "ck", {"t": Table()},
                              rejects="bad")
    query = onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "a.db"), tmp_path / "ck", {"t": Table()},
                                  once=True)
    with pytest.raises(BatchRejectedError, match="null or empty id") as info:
        query.awaitTermination()
    assert '"ts":"2026-03-01' in str(info.value)


def test_an_output_row_refused_names_the_input_record_behind_it(spark: Any, tmp_path: Path) -> None:
    """Traced by the dedup id when the refused row carries it; else the error says it cannot be traced."""
    from pyspark.sql import functions as F

    inputs, manifest = tmp_path / "in", tmp_path / "manifest.jsonl"
    orders.generate(inputs, manifest, 0, 200, bad_rate=0.0, seed=9)
    region = F.when(F.col("qty") == 8, F.lit(None)).otherwise(F.col("sku"))

    def with_id(b: Any) -> Any:
        return b.select("order_id", region.alias("region"))

    def without_id(b: Any) -> Any:
        return b.groupBy(region.alias("region")).agg(F.sum("qty").cast("long").alias("qty"))

    entries = {e["order"]["order_id"]: e for e in orders.read_manifest(manifest) if e["kind"] == "good"}
    clean = orders.clean(spark.readStream.text(str(inputs)))
    query = onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "a.db"), tmp_path / "ck1",
                                  {"routes": Table(key=["region", "order_id"])}, per_batch=with_id, once=True)
    with pytest.raises(BatchRejectedError) as info:
        query.awaitTermination()
    behind = entries[info.value.row["order_id"]]  # type: ignore[index]
    assert behind["order"]["qty"] == 8
    assert f"the input record behind it: file file:{inputs}/{behind['file']} row {behind['row']}" \
        in str(info.value), str(info.value)
    query = onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "b.db"), tmp_path / "ck2",
                                  {"regions": Table(key=["region"], add=["qty"])}, per_batch=without_id,
                                  once=True)
    with pytest.raises(BatchRejectedError, match="cannot be traced"):
        query.awaitTermination()


def test_a_bad_late_record_is_rejected_and_a_good_late_one_is_late(spark: Any, tmp_path: Path) -> None:
    inputs, db = tmp_path / "in", tmp_path / "app.db"
    inputs.mkdir()

    def line(oid: str | None, ts: str, sku: str | None = "s1") -> str:
        return json.dumps({"order_id": oid, "sku": sku, "qty": 1, "event_ts": ts})

    on_time = [line(f"o{i}", f"2026-03-01T10:{i:02d}:00Z") for i in range(10)]
    (inputs / "a.json").write_text("\n".join(on_time) + "\n")
    os.utime(inputs / "a.json", (1_000_000, 1_000_000))
    (inputs / "b.json").write_text(line("o20", "2026-03-01T10:30:00Z") + "\n")
    os.utime(inputs / "b.json", (2_000_000, 2_000_000))
    # batch 2 drops what is behind batch 1's watermark (10:09 - 10 minutes)
    (inputs / "c.json").write_text("\n".join([line("o21", "2026-03-01T10:31:00Z"),
                                              line("old", "2026-03-01T08:00:00Z"),
                                              line("old-bad", "2026-03-01T08:00:00Z", sku=None),
                                              line("old", "2026-03-01T08:00:00Z")]) + "\n")
    os.utime(inputs / "c.json", (3_000_000, 3_000_000))
    raw = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inputs))
    onceflow.write_stream(orders.clean(raw), onceflow.sqlite(db), tmp_path / "ck", orders.TABLES,
                          per_batch=orders.per_batch, once=True, rejects="rejected", late="late_orders") \
        .awaitTermination()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT order_id, missed_watermark FROM late_orders").fetchall() == \
        [("old", "2026-03-01 09:59:00.000000")]
    assert conn.execute("SELECT rule, \"column\", row FROM rejected").fetchall() == [("required", "sku", 3)]
    assert sorted(r[0] for r in conn.execute("SELECT order_id FROM orders")) == \
        sorted([f"o{i}" for i in range(10)] + ["o20", "o21"])
    m = _markers(db)[2]
    assert (m["input_rows"], m["late_dropped"], m["rejected_rows"], m["events_counted"]) == (4, 2, 1, 1), m


def test_contract_mistakes_are_refused_where_they_are_made(spark: Any, tmp_path: Path) -> None:
    raw = spark.readStream.text(str(tmp_path))
    with pytest.raises(ConfigError, match="before any transformation"):
        onceflow.expect(raw.select("value"), json="value", schema=orders.SCHEMA)
    with pytest.raises(ConfigError, match="go together"):
        onceflow.expect(raw, json="value")
    with pytest.raises(ConfigError, match="required= names"):
        onceflow.expect(raw, json="value", schema=orders.SCHEMA, required=["skew"])
    with pytest.raises(ConfigError, match="cannot be evaluated"):
        onceflow.expect(raw, json="value", schema=orders.SCHEMA, checks={"c": "quantity > 0"})
    with pytest.raises(ConfigError, match="did you mean 'required'"):
        onceflow.expect(raw, json="value", schema=orders.SCHEMA, requried=["sku"])
    with pytest.raises(ConfigError, match="cannot read schema"):
        onceflow.expect(raw, json="value", schema="order_id STRNG,")
    clean = orders.clean(raw)
    with pytest.raises(ConfigError, match="rejects= and late= name the same table"):
        onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "a.db"), tmp_path / "ck", orders.TABLES,
                              per_batch=orders.per_batch, rejects="x", late="x")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4), bad_rate=st.sampled_from([0.0, 0.3, 0.9]),
       files_per_batch=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_any_mix_and_any_batch_boundaries_give_the_same_answer(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, sizes: list[int], bad_rate: float,
        files_per_batch: int, seed: int) -> None:
    tmp = tmp_path_factory.mktemp("mix")
    inputs, manifest, db = tmp / "in", tmp / "manifest.jsonl", tmp / "app.db"
    first = 0
    for n in sizes:
        orders.generate(inputs, manifest, first, n, bad_rate=bad_rate, seed=seed)
        first += n
    orders.start(spark, inputs, onceflow.sqlite(db), tmp / "ck", max_files=files_per_batch).awaitTermination()
    entries = orders.read_manifest(manifest)
    assert orders.read_result(db) == orders.expected(entries)
    _check_markers(db, entries)


def test_records_print_kafka_headers_as_text_where_they_are_text(spark: Any) -> None:
    """The rejects table keeps headers as Spark's ``to_json`` writes them (binary values base64, the
    bytes as given); ``onceflow rejects --records`` shows UTF-8 values as text, others as base64."""
    from pyspark.sql import functions as F

    from onceflow.cli.rejects import readable

    headers = [{"key": "event_id", "value": b"order-17"}, {"key": "sig", "value": b"\xff\x00\x01"},
               {"key": "empty", "value": None}]
    df = spark.createDataFrame([(headers,)], "headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
    stored = df.select(F.to_json("headers").alias("headers")).first()["headers"]  # what rejects.py writes
    assert "order-17" not in stored  # base64 in the table
    shown = readable({"record": "t/0/5", "headers": stored})["headers"]
    assert shown[0] == {"key": "event_id", "value": "order-17"}
    assert shown[1] == {"key": "sig", "value_base64": "/wAB"}
    assert shown[2] == {"key": "empty"}
    assert readable({"record": "f#1", "headers": None}) == {"record": "f#1", "headers": None}
