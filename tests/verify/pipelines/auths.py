"""Card authorizations in Spark's Real-Time Mode into PostgreSQL, written for verify's tests only.

``build`` follows the contract of ``onceflow verify --pipeline PATH.py:FUNCTION --sink realtime``:
it reads the topic in ``input`` (``<bootstrap>/<topic>``) with Spark's Kafka connector, turns each
JSON record into one ``authorizations`` row (the amount in a decimal, the currency upper-cased, the
card masked to its last four digits, the time as a timestamp, records without an id dropped) and
upserts it by ``auth_id`` with :func:`onceflow.write_realtime` into the PostgreSQL of ``sink``.

``build_by_card`` is the same pipeline with a deliberate bug: its key is the card, which many
authorizations share — the row a card ends with depends on the order the writer met them in.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import onceflow

SCHEMA = "auth_id STRING, card STRING, cents LONG, currency STRING, at STRING"


def authorizations(raw: Any) -> Any:
    """The user's transform: one row per record with an id (a batch or a streaming DataFrame)."""
    a = F.from_json(F.col("value").cast("string"), SCHEMA)
    return (raw.select(a.alias("a")).where(F.col("a.auth_id").isNotNull())
            .select(F.col("a.auth_id").alias("auth_id"),
                    F.concat(F.lit("**** "), F.substring("a.card", -4, 4)).alias("card"),
                    (F.col("a.cents") / 100).cast("decimal(12,2)").alias("amount"),
                    F.upper("a.currency").alias("currency"), F.to_timestamp("a.at").alias("at")))


def _read(spark: Any, input: str) -> Any:  # noqa: A002 - the contract's name
    bootstrap, topic = input.rsplit("/", 1)
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def build(spark: Any, input: str, sink: str, checkpoint: str, once: bool) -> Any:  # noqa: A002
    """Authorizations upserted by id as they arrive."""
    return onceflow.write_realtime(authorizations(_read(spark, input)), "authorizations", key="auth_id",
                                   checkpoint=checkpoint, dsn=sink, duration="5 seconds",
                                   retry_for="1 minute")


def build_with_rejects(spark: Any, input: str, sink: str, checkpoint: str, once: bool) -> Any:  # noqa: A002
    """As :func:`build`; rows PostgreSQL refuses (a currency with a NUL) go to ``auth_rejects``."""
    return onceflow.write_realtime(authorizations(_read(spark, input)), "authorizations", key="auth_id",
                                   checkpoint=checkpoint, dsn=sink, duration="5 seconds",
                                   retry_for="1 minute", rejects="auth_rejects")


def build_by_card(spark: Any, input: str, sink: str, checkpoint: str, once: bool) -> Any:  # noqa: A002
    """The bug: keyed by the card (see the module)."""
    return onceflow.write_realtime(authorizations(_read(spark, input)).drop("auth_id"), "by_card",
                                   key="card", checkpoint=checkpoint, dsn=sink)


def write_records(path: Path, n: int, seed: int, poison: float = 0.0) -> dict[str, dict[str, Any]]:
    """``n`` authorizations as verify's JSON-lines records, ~5% sent again later, ~2% without an id.

    ``poison``: the share whose currency holds a NUL (PostgreSQL refuses it in text).

    Returns:
        The authorizations with an id, by id.
    """
    rng = random.Random(seed)
    lines, kept = [], {}
    for i in range(n):
        auth = {"auth_id": f"a{seed}-{i:05d}", "card": f"4000 1234 5678 {rng.randrange(40):04d}",
                "cents": rng.randrange(100, 250_000), "currency": rng.choice(["eur", "usd", "chf"]),
                "at": f"2026-11-26T{8 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}"}
        if poison and rng.random() < poison:
            auth["currency"] = auth["currency"][:1] + "\x00" + auth["currency"][1:]
        if rng.random() < 0.02:
            auth.pop("auth_id")
        else:
            kept[auth["auth_id"]] = auth
        lines.append(json.dumps({"key": auth.get("auth_id"), "value": auth}))
    for i in rng.sample(range(n), n // 20):  # retried sends: the same record up to 30 records later
        lines.insert(min(i + rng.randrange(1, 30), len(lines)), lines[i])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return kept
