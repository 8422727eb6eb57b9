"""An order-event pipeline with bad records, written for the rejects tests (not one of onceflow's examples).

Order events arrive as JSON lines (text files) or Kafka values. Each generated record is good or
bad *by construction* (:data:`KINDS`): the generator writes, beside the input, a manifest of
what each record is, and :func:`expected` turns the manifest into the answer (no Spark, no
onceflow). The pipeline: ``expect`` (JSON against :data:`SCHEMA`, ``sku`` required, ``qty >=
0``), ``deduplicate`` by ``order_id``, then per batch the orders (upsert) and the quantity per
sku (merged by ``add``), bad records to ``rejected``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import onceflow
from onceflow import Table

START = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
SCHEMA = "order_id STRING, sku STRING, qty INT, event_ts TIMESTAMP"
TABLES = {"orders": Table(key=["order_id"]), "sku_qty": Table(key=["sku"], add=["qty"])}

KINDS = {  # kind -> (rule, column) the record breaks; None: a good record
    "good": None, "resend": None, "not_json": ("parse", "value"), "array": ("parse", "value"),
    "empty": ("parse", "value"), "qty_text": ("parse", "qty"), "ts_text": ("parse", "event_ts"),
    "no_sku": ("required", "sku"), "negative": ("check", "qty_not_negative"),
    "no_id": ("id", "order_id"), "blank_id": ("id", "order_id"), "no_ts": ("event_time", "event_ts"),
}
BAD = [k for k, v in KINDS.items() if v is not None]


def record(i: int, kind: str, rng: random.Random) -> tuple[str, dict[str, Any] | None]:
    """Record ``i`` of ``kind`` as a JSON line, and the order it carries when good."""
    at = START + dt.timedelta(seconds=i * 0.5 + rng.uniform(0, 3))
    order: dict[str, Any] = {"order_id": f"o{i}", "sku": f"s{rng.randrange(5)}", "qty": rng.randrange(1, 9),
                             "event_ts": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    if kind in ("good", "resend"):
        return json.dumps(order), order
    if kind == "not_json":
        return f"order {i} lost its braces", None
    if kind == "array":
        return json.dumps([order]), None
    if kind == "empty":
        return "", None
    changes: dict[str, Any] = {"qty_text": {"qty": "three"}, "ts_text": {"event_ts": "yesterday"},
                               "no_sku": {"sku": None}, "negative": {"qty": -order["qty"]},
                               "blank_id": {"order_id": " "}}.get(kind, {})
    bad = {**order, **changes}
    if kind == "no_id":
        del bad["order_id"]
    if kind == "no_ts":
        del bad["event_ts"]
    return json.dumps(bad), None


def generate(directory: Path, manifest: Path, first: int, n: int, bad_rate: float, seed: int,
             name: str | None = None) -> Path:
    """Write records ``first`` .. ``first + n - 1`` as one JSON-lines file; append to ``manifest``.

    A good record is sent again (a ``resend``: same line, later in the file) with probability
    0.1. Returns the file.
    """
    rng = random.Random(seed * 1_000_003 + first)
    lines: list[tuple[str, str, dict[str, Any] | None]] = []
    for i in range(first, first + n):
        kind = rng.choice(BAD) if rng.random() < bad_rate else "good"
        text, order = record(i, kind, rng)
        lines.append((kind, text, order))
        if kind == "good" and rng.random() < 0.1:
            lines.append(("resend", text, order))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"orders-{first:08d}.json")
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text("".join(t + "\n" for _, t, _ in lines))
    with manifest.open("a") as m:
        for row, (kind, _, order) in enumerate(lines, start=1):
            m.write(json.dumps({"file": path.name, "row": row, "kind": kind, "order": order}) + "\n")
    os.replace(tmp, path)
    return path


def produce(bootstrap: str, topic: str, manifest: Path, first: int, n: int, bad_rate: float, seed: int,
            partitions: int = 2) -> None:
    """Produce records ``first`` .. ``first + n - 1`` to ``topic`` (as :func:`generate` makes them).

    The manifest's ``file`` is ``topic/partition`` and ``row`` the offset, from the delivery reports.
    """
    from confluent_kafka import Producer

    rng = random.Random(seed * 1_000_003 + first)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    delivered: list[dict[str, Any]] = []

    def report(kind: str, order: dict[str, Any] | None) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            delivered.append({"file": f"{msg.topic()}/{msg.partition()}", "row": msg.offset(), "kind": kind,
                              "order": order})
        return done

    for i in range(first, first + n):
        kind = rng.choice(BAD) if rng.random() < bad_rate else "good"
        text, order = record(i, kind, rng)
        sends = 2 if kind == "good" and rng.random() < 0.1 else 1
        for k in range(sends):
            producer.produce(topic, value=text.encode(), key=f"k{i}".encode(), partition=i % partitions,
                             headers=[("order_seq", str(i).encode())],
                             on_delivery=report(kind if k == 0 else "resend", order))
    assert producer.flush(60) == 0
    with manifest.open("a") as m:
        m.write("".join(json.dumps(d) + "\n" for d in delivered))


def expected(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The answer from a manifest: orders, quantity per sku, and the bad records' coordinates and rules."""
    orders: dict[str, dict[str, Any]] = {}
    rejected: dict[tuple[str, int], tuple[str, str]] = {}
    for e in entries:
        rule = KINDS[e["kind"]]
        if rule is not None:
            rejected[(e["file"], e["row"])] = rule
        else:
            orders.setdefault(e["order"]["order_id"], e["order"])
    sku_qty: dict[str, int] = {}
    for o in orders.values():
        sku_qty[o["sku"]] = sku_qty.get(o["sku"], 0) + o["qty"]
    return {"orders": {k: (o["sku"], o["qty"]) for k, o in orders.items()}, "sku_qty": sku_qty,
            "rejected": rejected}


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """The manifest's entries."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def per_batch(batch: Any) -> dict[str, Any]:
    """The orders as they are, and the batch's quantity per sku (merged by the sink)."""
    from pyspark.sql import functions as F

    return {"orders": batch.select("order_id", "sku", "qty", "event_ts"),
            "sku_qty": batch.groupBy("sku").agg(F.sum("qty").cast("long").alias("qty"))}


def clean(raw: Any) -> Any:
    """The contract and the deduplication, on the bare source."""
    orders = onceflow.expect(raw, json="value", schema=SCHEMA, required=["sku"],
                             checks={"qty_not_negative": "qty >= 0"})
    return onceflow.deduplicate(orders, id="order_id", event_time="event_ts", within="10 minutes")


def start(spark: Any, inputs: Path | str, sink: Any, checkpoint: Path, *, rejects: str | None = "rejected",
          once: bool = True, max_files: int = 1, topic: str | None = None) -> onceflow.OnceQuery:
    """Start the pipeline over the JSON-lines files in ``inputs``, or a Kafka ``topic`` (inputs: brokers)."""
    if topic is not None:
        raw = onceflow.read_kafka(spark, str(inputs), subscribe=topic, max_offsets_per_trigger=300)
    else:
        raw = spark.readStream.option("maxFilesPerTrigger", max_files).text(str(inputs))
    return onceflow.write_stream(clean(raw), sink, checkpoint, TABLES, per_batch=per_batch, once=once,
                                 rejects=rejects)


def result_from(orders: list[dict[str, Any]], sku_qty: list[dict[str, Any]],
                rejected: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of the three tables (as dicts) in :func:`expected`'s shape."""
    return {"orders": {r["order_id"]: (r["sku"], r["qty"]) for r in orders},
            "sku_qty": {r["sku"]: r["qty"] for r in sku_qty},
            "rejected": {(Path(r["file"]).name, r["row"]) if r["file"] is not None
                         else (f"{r['topic']}/{r['partition']}", r["offset"]): (r["rule"], r["column"])
                         for r in rejected}}


def read_sink(kind: str, location: str) -> dict[str, Any]:
    """What a PostgreSQL (DSN), Delta (root) or Iceberg (catalog directory) sink holds, as expected()."""
    names = ("orders", "sku_qty", "rejected")
    if kind == "iceberg":
        from onceflow.verify.pipeline_verdict import iceberg_reader

        read = iceberg_reader(Path(location))  # DIR/catalog.db, files under DIR/warehouse
        tables = [read(n, None) or [] for n in names]
    elif kind == "delta":
        from deltalake import DeltaTable

        tables = [DeltaTable(f"{location}/{n}").to_pyarrow_table().to_pylist() for n in names]
    else:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(location) as conn:
            cur = conn.cursor(row_factory=dict_row)
            tables = [cur.execute(f"SELECT * FROM {n}").fetchall() for n in names]
    return result_from(*tables)


def read_result(db: Path) -> dict[str, Any]:
    """What a SQLite sink holds, in :func:`expected`'s shape."""
    import sqlite3

    conn = sqlite3.connect(db)

    def rows(sql: str) -> list[Any]:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError as exc:  # a table no batch wrote to
            assert "no such table" in str(exc)
            return []

    try:
        orders = {r[0]: (r[1], r[2]) for r in rows("SELECT order_id, sku, qty FROM orders")}
        sku_qty = dict(rows("SELECT sku, qty FROM sku_qty"))
        rejected = {(Path(f).name, r) if f is not None else (f"{t}/{p}", o): (rule, col)
                    for f, r, t, p, o, rule, col in rows(
                        "SELECT file, row, topic, partition, \"offset\", rule, \"column\" FROM rejected")}
        return {"orders": orders, "sku_qty": sku_qty, "rejected": rejected}
    finally:
        conn.close()
