"""Stable input on real Spark: DataFrames persisted and read back, executor-side sinks included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.engine.stable import DIR, StableOutputs
from onceflow.examples import payments
from tests.core.payments_oracle import actual, expected

pytestmark = pytest.mark.spark


def test_a_dataframe_is_persisted_once_and_read_back_with_its_schema(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    df = spark.range(1000).select("id", F.unix_micros(F.current_timestamp()).alias("r"))  # changes per run
    store = StableOutputs(tmp_path)
    first = store.save(0, "q", {"t": df}, rows_out=1000).tables["t"]
    kept = sorted(first.collect())
    again = store.load(0, "q", spark)
    assert again is not None
    assert sorted(again.tables["t"].collect()) == kept  # the persisted rows, not a recomputation
    types = [(f.name, f.dataType) for f in df.schema]
    assert [(f.name, f.dataType) for f in again.tables["t"].schema] == types
    assert sorted(df.collect()) != kept  # (the DataFrame itself would give other numbers)


def test_stable_input_with_an_executor_side_postgres_sink(spark: Any, tmp_path: Path, pg_dsn: str) -> None:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    payments.generate(tmp_path / "in", 3_000, per_file=500, duplicates=0.1, seed=5)
    stream = (spark.readStream.schema(payments.SCHEMA).option("maxFilesPerTrigger", 2)
              .parquet(str(tmp_path / "in")))
    clean = onceflow.deduplicate(stream, id="payment_id", event_time="ts", within="10 minutes")
    q = onceflow.write_stream(clean, sink=onceflow.postgres(pg_dsn, protocol="staged"),
                              checkpoint=tmp_path / "ck", tables=payments.TABLES,
                              per_batch=payments.per_batch, stable=True, once=True)
    q.awaitTermination()
    rev, pays = expected(spark, tmp_path / "in")
    got_rev, got_pays, rows = actual(tmp_path / "app.db", pg_dsn)
    assert got_rev == rev and got_pays == pays and rows == len(pays)
    assert list((tmp_path / "ck" / DIR).iterdir()) == []  # every batch's copy deleted once committed
