"""Billing charged to an external service, exactly once, with a price that changes on every lookup.

Each micro-batch's bytes per (account, hour) — billed as :mod:`onceflow.examples.billing` bills
them — are priced with a lookup from a pricing service whose answer changes from call to call
(a non-deterministic enrichment), and each priced total is *charged*: one ``POST`` to a billing
service, with the idempotency key ``<sink_id>/charges/<account>/<window_start_ms>/<batch>``::

    onceflow.write_stream(events, sink=onceflow.http(charge_url, ledger="ledger.db"),
                          checkpoint="ck/", tables=TABLES, per_batch=priced_per_batch(price_url),
                          stable=True)

``stable=True`` persists each batch's priced charges the first time they are computed, so a
retry of the batch after a crash charges exactly those (the prices it would look up again have
changed). Without it, the sink refuses such a retry (``UnstableOutputError``) rather than
sending a second version of a charge.

``python -m onceflow.examples.charges --log LOG --checkpoint CK --ledger LEDGER.db --charge-url
URL [--price-url URL] [--once]`` runs it (the demo service, ``python -m
onceflow.verify.service``, serves both ``/effects`` and ``/price``).
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

import onceflow
from onceflow import Table
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

HOUR_MS = 3_600_000
TABLES = {"charges": Table(key=["account", "window_start_ms", "batch"], mode="append")}  # one charge per key
FIXED_PRICE = 100
"""Price per kB without a pricing service."""


def hourly_bytes(events: DataFrame) -> pa.Table:
    """Bytes and events per (account, hour) of a batch (``account, window_start_ms, bytes, events``)."""
    from pyspark.sql import functions as F

    start_ms = (F.floor(F.unix_millis("event_time") / HOUR_MS) * HOUR_MS).cast("long")
    return (events.groupBy(F.col("user").alias("account"), start_ms.alias("window_start_ms"))
            .agg(F.sum("bytes").alias("bytes"), F.count(F.lit(1)).alias("events"))).toArrow()


def lookup_prices(price_url: str | None, accounts: list[str]) -> dict[str, int]:
    """Each account's current price per kB (asks the pricing service; a fixed price without one)."""
    if price_url is None:
        return dict.fromkeys(accounts, FIXED_PRICE)
    prices = {}
    for account in accounts:
        query = urllib.parse.urlencode({"account": account})
        with urllib.request.urlopen(f"{price_url}?{query}", timeout=10) as resp:
            prices[account] = int(json.loads(resp.read())["price"])
    return prices


def priced(totals: pa.Table, prices: dict[str, int], batch_id: int) -> pa.Table:
    """The charges of one batch: its hourly totals with price and amount (cents, rounded down)."""
    price = pa.array([prices[a] for a in totals.column("account").to_pylist()], pa.int64())
    amount = pc.divide(pc.multiply(totals.column("bytes"), price), 1000)
    return (totals.append_column("batch", pa.array([batch_id] * totals.num_rows, pa.int64()))
            .append_column("price", price).append_column("amount_cents", amount))


def priced_per_batch(price_url: str | None, extra: Callable[[int], pa.Table] | None = None,
                     ) -> Callable[[DataFrame, int], dict[str, pa.Table]]:
    """The ``per_batch`` function: hourly totals, priced now.

    Args:
        price_url: The pricing service's ``/price`` URL (None: a fixed price).
        extra: Rows added to a batch's totals by a source outside Spark's replay (tests use it
            to make a retry see an element the first attempt did not).
    """
    def per_batch(batch: DataFrame, batch_id: int) -> dict[str, pa.Table]:
        totals = hourly_bytes(batch)
        if extra is not None:
            more = extra(batch_id)
            if more.num_rows:
                merged = pa.concat_tables([totals, more.cast(totals.schema)])
                totals = merged.group_by(["account", "window_start_ms"]).aggregate(
                    [("bytes", "sum"), ("events", "sum")]).rename_columns(
                    ["account", "window_start_ms", "bytes", "events"])
        prices = lookup_prices(price_url, sorted(set(totals.column("account").to_pylist())))
        return {"charges": priced(totals, prices, batch_id)}
    return per_batch


def start(spark: SparkSession, log_dir: str | Path, sink: Any, checkpoint: str | Path, *,
          price_url: str | None = None, stable: bool = True, within: str | float = "1 minute",
          max_files_per_trigger: int | None = None, once: bool = False, trigger: str = "1 second",
          on_batch: Callable[[dict[str, Any]], None] | None = None,
          extra: Callable[[int], pa.Table] | None = None) -> onceflow.OnceQuery:
    """Start the charges pipeline over an event log.

    Args:
        spark: The session.
        log_dir: The event log directory.
        sink: Where charges go: ``onceflow.http(charge_url, ledger=...)``.
        checkpoint: Spark checkpoint directory.
        price_url: The pricing service (None: a fixed price).
        stable: Stable input (see the module); False only to show what goes wrong without it.
        within: Dedup horizon and allowed lateness.
        max_files_per_trigger: Segments per micro-batch.
        once: Process what is there, then stop.
        trigger: Processing-time trigger otherwise.
        on_batch: Called after every batch with its numbers.
        extra: See :func:`priced_per_batch`.
    """
    reader = spark.readStream.schema(EVENT_DDL)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    log = reader.parquet(str(log_dir)).select("event_id", "user", "event_time", "bytes")
    events = onceflow.deduplicate(log, id="event_id", event_time="event_time", within=within)
    return onceflow.write_stream(events, sink=sink, checkpoint=checkpoint, tables=TABLES,
                                 per_batch=priced_per_batch(price_url, extra), stable=stable, once=once,
                                 trigger=trigger, on_batch=on_batch, check_files=EventLog(log_dir).validate)


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module)."""
    from onceflow.runtime.session import session

    ap = argparse.ArgumentParser(prog="python -m onceflow.examples.charges",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--ledger", required=True, type=Path)
    ap.add_argument("--charge-url", required=True)
    ap.add_argument("--price-url", default=None)
    ap.add_argument("--ignore-keys", action="store_true", help="the billing service ignores idempotency keys")
    ap.add_argument("--no-stable", action="store_true", help="turn stable input off (to see the refusal)")
    ap.add_argument("--max-files-per-trigger", type=int, default=None)
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args(argv)
    spark = session(app_name="onceflow-charges")
    sink = onceflow.http(args.charge_url, ledger=args.ledger, sink_id="charges",
                         idempotent=not args.ignore_keys)
    query = start(spark, args.log, sink, args.checkpoint, price_url=args.price_url, stable=not args.no_stable,
                  max_files_per_trigger=args.max_files_per_trigger, once=args.once,
                  on_batch=lambda b: print(f"batch {b['batch_id']}: {b['rows_out']} events, "
                                           f"{b['rows_written'].get('charges')} charges", flush=True))
    try:
        query.awaitTermination()
    finally:
        sink.close()


if __name__ == "__main__":
    main()
