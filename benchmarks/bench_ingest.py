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

Validation (UTF-8, printable ids, sender names, caps, clock window) is always on. With
``--auth`` (the default) the receiver requires bearer tokens (eight senders, one token each;
each request carries one sender's events) and scopes ids by sender; ``--compare`` also runs
the same events against a receiver without tokens, on a fresh catalog, in the same run.

With ``--catalog-dsn DSN`` the catalog lives in PostgreSQL instead of SQLite (bytes per id
are then the catalog tables' size as the server reports it).

The events' system times are spread over the last ``--span-minutes`` (55 by default), so the
catalog holds six 10-minute buckets and every fresh id is checked against all their filters,
as in a receiver's steady state.

Usage: python benchmarks/bench_ingest.py [--events 1000000] [--batch 5000] [--clients 8]
       [--catalog-dsn DSN] [--span-minutes 55] [--no-auth | --compare]
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

from onceflow.sources.events import EVENT_SCHEMA
from onceflow.sources.log import EventLog


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SENDERS = [f"s{k}" for k in range(8)]


def bodies(events: int, batch: int, t0_us: int, step_us: int) -> list[tuple[bytes, str]]:
    """Request bodies, each of one sender's events, with that sender's name."""
    out = []
    for start in range(0, events, batch):
        sender = SENDERS[(start // batch) % len(SENDERS)]
        evs = [{"event_id": f"bench-{i}", "sender": sender, "system_time": t0_us + i * step_us,
                "user": f"user-{i % 1000:05d}", "event_time": t0_us + i, "bytes": i % 5000}
               for i in range(start, min(start + batch, events))]
        out.append((json.dumps({"events": evs}).encode(), sender))
    return out


async def post_all(url: str, payloads: list[tuple[bytes, str]], clients: int,
                   tokens: dict[str, str] | None) -> dict[str, int]:
    queue: asyncio.Queue[tuple[bytes, str]] = asyncio.Queue()
    for p in payloads:
        queue.put_nowait(p)
    totals = {"new": 0, "duplicate": 0, "too_old": 0}

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            body, sender = queue.get_nowait()
            headers = {"Content-Type": "application/json"}
            if tokens:
                headers["Authorization"] = f"Bearer {tokens[sender]}"
            async with session.post(url, data=body, headers=headers) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise SystemExit(f"receiver answered {resp.status}: {answer}")
                for s in answer["statuses"]:
                    totals[s] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    return totals


def run_receiver(args: argparse.Namespace, work: Path, payloads: list[tuple[bytes, str]], span_us: int,
                 auth: bool) -> dict[str, float]:
    """One receiver on a fresh log and catalog: fresh events, then 10% re-sent; its measures."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    name = f"bench{time.time_ns() // 1000}"  # a fresh PostgreSQL catalog per run
    extra: list[str] = []
    tokens: dict[str, str] | None = None
    if auth:
        from onceflow.ingest.auth import write_token_file

        tokens = write_token_file(work / "tokens", SENDERS)
        extra = ["--tokens", str(work / "tokens")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log", str(work / "log"),
         *(["--catalog-dsn", args.catalog_dsn, "--catalog-name", name] if args.catalog_dsn
           else ["--catalog", str(work / "catalog.db")]), "--port", str(port),
         "--expected-rate", str(max(args.events / max(span_us / 1e6, 600), 1)),  # ids/s of system time
         "--max-events", str(args.batch), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/v1/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        started = time.perf_counter()
        fresh = asyncio.run(post_all(url + "/v1/events", payloads, args.clients, tokens))
        fresh_s = time.perf_counter() - started
        with urllib.request.urlopen(url + "/v1/health") as r:
            after_fresh = json.loads(r.read())["catalog"]
        dups = asyncio.run(post_all(url + "/v1/events", payloads[:: 10], args.clients, tokens))
        with urllib.request.urlopen(url + "/v1/health") as r:
            health = json.loads(r.read())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    disk = sum(f.stat().st_size for f in work.glob("catalog.db*"))
    if args.catalog_dsn:
        import psycopg

        with psycopg.connect(args.catalog_dsn) as conn:
            disk = int(conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.relkind = 'r' AND starts_with(c.relname, %s)",
                (f"onceflow_dedup_{name}_b",)).fetchone()[0])
    if dups["duplicate"] != sum(dups.values()) or fresh["new"] != args.events:
        raise SystemExit(f"wrong answers: dedup failed (fresh {fresh}, re-sent {dups})")
    return {"rate": args.events / fresh_s, "fresh": fresh["new"], "resent": sum(dups.values()),
            "dup_answers": dups["duplicate"], "store_reads": after_fresh["store_reads"],
            "avoided": after_fresh["lookups_avoided"], "fp": after_fresh["false_positives"],
            "disk": disk, "bloom": health["bloom_bytes"]}


def report(label: str, m: dict[str, float], events: int, base_rate: float) -> None:
    print(f"{label}: {m['rate']:,.0f} events/s (fresh)   ratio to append_only {m['rate'] / base_rate:.2f}")
    print(f"  answers: {m['fresh']:,.0f} new; re-sent {m['resent']:,.0f}, answered duplicate "
          f"{m['dup_answers']:,.0f}")
    checked = m["store_reads"] + m["avoided"]  # fresh ids that arrived while the catalog held ids
    alone = m["avoided"] / max(checked, 1)
    print(f"  fresh ids answered without a store read: {events - m['store_reads']:,.0f} of {events:,} "
          f"({1 - m['store_reads'] / events:.2%}); of the {checked:,.0f} that arrived once the catalog "
          f"held ids, the Bloom filters alone answered {m['avoided']:,.0f} ({alone:.2%})")
    filtered = m["avoided"] + m["fp"]
    print(f"  false positives among fresh ids the filters checked: {m['fp']:,.0f} of {filtered:,.0f}"
          f" -> FPR {m['fp'] / max(filtered, 1):.4f}")
    print(f"  bytes per tracked id: {m['disk'] / m['fresh']:.1f} on disk + {m['bloom'] / m['fresh']:.2f} "
          f"in Bloom filters = {(m['disk'] + m['bloom']) / m['fresh']:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--catalog-dsn", default=None, help="keep the catalog in PostgreSQL")
    ap.add_argument("--span-minutes", type=float, default=55.0,
                    help="sender system times spread over this many past minutes (0: one bucket)")
    ap.add_argument("--no-auth", dest="auth", action="store_false", help="receiver without tokens")
    ap.add_argument("--compare", action="store_true",
                    help="run with tokens and without, on fresh catalogs, in this one run")
    args = ap.parse_args()
    now_us = time.time_ns() // 1000
    # system times spread over the last --span-minutes: the steady state of a receiver whose
    # catalog holds several live buckets (10-minute buckets, 1 h GC delay: up to 7)
    span_us = int(args.span_minutes * 60e6)
    t0_us = now_us - span_us
    payloads = bodies(args.events, args.batch, t0_us, max(span_us // args.events, 1))

    # baseline: the same rows straight into a log, segment per batch
    base_log = EventLog(Path(tempfile.mkdtemp(prefix="onceflow-bench-ingest-")) / "base-log")
    tables = []
    for body, _ in payloads:
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
    base_rate = args.events / (time.perf_counter() - started)

    print(f"events: {args.events:,} fresh in batches of {args.batch:,}, {args.clients} clients; "
          "then 10% re-sent")
    print(f"append_only baseline: {base_rate:,.0f} events/s")
    modes = [True, False] if args.compare else [args.auth]
    results = {}
    for auth in modes:
        work = Path(tempfile.mkdtemp(prefix="onceflow-bench-ingest-"))
        results[auth] = run_receiver(args, work, payloads, span_us, auth)
        report("receiver, tokens + validation" if auth else "receiver, no tokens, validation", results[auth],
               args.events, base_rate)
    if args.compare:
        print(f"tokens / no tokens: {results[True]['rate'] / results[False]['rate']:.3f}")


if __name__ == "__main__":
    main()
