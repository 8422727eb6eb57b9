"""Ingest throughput: events/s through the receiver with dedup (batched HTTP on loopback).

One run: a receiver process (``onceflow ingest serve``) and, in this process, ``--clients``
concurrent HTTP clients posting pre-serialized batches of ``--batch`` fresh events (ids never
seen) as fast as the receiver acks them. Then a second pass re-posts 10% of the events
(duplicates, each must be answered ``duplicate``). Prints events/s, Bloom lookups avoided for
fresh ids, the measured false-positive rate, and bytes per tracked id (catalog file on disk +
Bloom filters in memory, divided by ids).

The baseline in the same run is ``append_only``: the same events written to the event log as
segments of the same size with no HTTP, no validation and no dedup — the ratio shows what the
receiver costs on top of writing the log.

With ``--catalog-dsn DSN`` the catalog lives in PostgreSQL instead of SQLite (bytes per id
are then the catalog tables' size as the server reports it).

The events' system times are spread over the last ``--span-minutes`` (55 by default), so the
catalog holds six 10-minute buckets and every fresh id is checked against all their filters,
as in a receiver's steady state.

Usage: python benchmarks/bench_ingest.py [--events 1000000] [--batch 5000] [--clients 8]
       [--catalog-dsn DSN] [--span-minutes 55]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import pyarrow as pa

from onceflow.records import EVENT_SCHEMA
from onceflow.sources.log import EventLog


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bodies(events: int, batch: int, t0_us: int, step_us: int) -> list[bytes]:
    out = []
    for start in range(0, events, batch):
        evs = [{"event_id": f"bench-{i}", "sender": f"s{i % 8}", "system_time": t0_us + i * step_us,
                "user": f"user-{i % 1000:05d}", "event_time": t0_us + i, "bytes": i % 5000}
               for i in range(start, min(start + batch, events))]
        out.append(json.dumps({"events": evs}).encode())
    return out


async def post_all(url: str, payloads: list[bytes], clients: int) -> dict[str, int]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for p in payloads:
        queue.put_nowait(p)
    totals = {"new": 0, "duplicate": 0, "too_old": 0}

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            body = queue.get_nowait()
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise SystemExit(f"receiver answered {resp.status}: {answer}")
                for s in answer["statuses"]:
                    totals[s] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    return totals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--catalog-dsn", default=None, help="keep the catalog in PostgreSQL")
    ap.add_argument("--span-minutes", type=float, default=55.0,
                    help="sender system times spread over this many past minutes (0: one bucket)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-ingest-"))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    now_us = time.time_ns() // 1000
    # system times spread over the last --span-minutes: the steady state of a receiver whose
    # catalog holds several live buckets (10-minute buckets, 1 h GC delay: up to 7)
    span_us = int(args.span_minutes * 60e6)
    t0_us = now_us - span_us
    payloads = bodies(args.events, args.batch, t0_us, max(span_us // args.events, 1))
    name = f"bench{t0_us}"  # a fresh PostgreSQL catalog per run

    # baseline: the same rows straight into a log, segment per batch
    base_log = EventLog(work / "base-log")
    tables = []
    for body in payloads:
        evs = json.loads(body)["events"]
        tables.append(pa.Table.from_pydict({
            "event_id": [e["event_id"] for e in evs], "user": [e["user"] for e in evs],
            "event_time": pa.array([e["event_time"] for e in evs], pa.int64()).cast(
                EVENT_SCHEMA.field("event_time").type),
            "system_time": pa.array([e["system_time"] for e in evs], pa.int64()).cast(
                EVENT_SCHEMA.field("system_time").type),
            "bytes": pa.array([e["bytes"] for e in evs], pa.int64())}, schema=EVENT_SCHEMA))
    started = time.perf_counter()
    for t in tables:
        base_log.append(t)
    base_s = time.perf_counter() - started

    proc = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log", str(work / "log"),
         *(["--catalog-dsn", args.catalog_dsn, "--catalog-name", name] if args.catalog_dsn
           else ["--catalog", str(work / "catalog.db")]), "--port", str(port),
         "--expected-rate", str(max(args.events / max(span_us / 1e6, 600), 1)),  # ids/s of system time
         "--max-events", str(args.batch)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/v1/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        started = time.perf_counter()
        fresh = asyncio.run(post_all(url + "/v1/events", payloads, args.clients))
        fresh_s = time.perf_counter() - started
        with urllib.request.urlopen(url + "/v1/health") as r:
            after_fresh = json.loads(r.read())["catalog"]
        dup_payloads = payloads[:: 10]
        dups = asyncio.run(post_all(url + "/v1/events", dup_payloads, args.clients))
        with urllib.request.urlopen(url + "/v1/health") as r:
            health = json.loads(r.read())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ids = fresh["new"]
    disk = sum(f.stat().st_size for f in work.glob("catalog.db*"))
    if args.catalog_dsn:
        import psycopg

        with psycopg.connect(args.catalog_dsn) as conn:
            disk = int(conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.relkind = 'r' AND starts_with(c.relname, %s)",
                (f"onceflow_dedup_{name}_b",)).fetchone()[0])
    fresh_lookups = args.events
    avoided = after_fresh["lookups_avoided"]
    rate = args.events / fresh_s
    print(f"events: {args.events:,} fresh in batches of {args.batch:,}, {args.clients} clients; "
          f"then {sum(dups.values()):,} re-sent")
    print(f"receiver: {rate:,.0f} events/s (fresh)   append_only baseline: "
          f"{args.events / base_s:,.0f} events/s   ratio {rate / (args.events / base_s):.2f}")
    print(f"answers: fresh {fresh}, re-sent {dups} (every re-sent event must be a duplicate)")
    fresh_reads = after_fresh["store_reads"]
    fp = after_fresh["false_positives"]
    checked = fresh_reads + avoided  # fresh ids that arrived while the catalog held ids
    print(f"fresh ids answered without a store read: {fresh_lookups - fresh_reads:,} of {fresh_lookups:,} "
          f"({1 - fresh_reads / fresh_lookups:.2%}); of the {checked:,} that arrived once the catalog held "
          f"ids, the Bloom filters alone answered {avoided:,} ({avoided / max(checked, 1):.2%})")
    print(f"false positives among fresh ids the filters checked: {fp:,} of {avoided + fp:,} "
          f"-> FPR {fp / max(avoided + fp, 1):.4f}")
    print(f"bytes per tracked id: {disk / ids:.1f} on disk + {health['bloom_bytes'] / ids:.2f} "
          f"in Bloom filters = {(disk + health['bloom_bytes']) / ids:.1f}")
    if dups["duplicate"] != sum(dups.values()) or fresh["new"] != args.events:
        raise SystemExit("wrong answers: dedup failed")


if __name__ == "__main__":
    main()
