"""Side-effect throughput: the HTTP sink (ledger, keys, retries) vs plain loops of the same calls.

One demo service process (``onceflow.verify.service``, honouring idempotency keys, no injected
failures) on loopback; each round POSTs the same ``--effects`` rows (fresh keys per variant and
round) three ways, in alternating order:

* ``onceflow`` — ``HttpEffectsSink.commit_tables`` of one batch: keys recorded as started in the
  ledger before any call, calls with bounded concurrency and tenacity retries, confirmations
  written to the ledger as they come, metrics and marker in one transaction;
* ``plain-async`` — the same calls with aiohttp and the same concurrency, no ledger, no retries;
* ``plain-serial`` — one call after the other (urllib), what a ``foreachBatch`` loop does.

Usage: python benchmarks/bench_effects.py [--effects 5000] [--rounds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.service import ServiceProcess, read_effects


def rows(n: int) -> pa.Table:
    return pa.table({"account": [f"acct-{i % 500:03d}" for i in range(n)], "item": list(range(n)),
                     "amount_cents": [100 + i % 977 for i in range(n)]})


def run_onceflow(url: str, work: Path, tag: str, batch: pa.Table, concurrency: int) -> float:
    sink = HttpEffectsSink(url, work / f"ledger-{tag}.db", sink_id=tag, concurrency=concurrency)
    sink.bind("bench")
    t0 = time.perf_counter()
    sink.commit_tables(0, {"charges": batch}, {"charges": Table(key=["account", "item"])},
                       BatchStats(batch.num_rows, 0, 0), batch.num_rows)
    took = time.perf_counter() - t0
    sink.close()
    return took


def _payloads(tag: str, batch: pa.Table) -> list[tuple[str, str]]:
    return [(f"{tag}/charges/{r['account']}/{r['item']}", json.dumps(r, sort_keys=True))
            for r in batch.to_pylist()]


def run_plain_async(url: str, tag: str, batch: pa.Table, concurrency: int) -> float:
    import aiohttp

    calls = _payloads(tag, batch)

    async def main() -> None:
        sem = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as session:
            async def one(key: str, body: str) -> None:
                headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
                async with sem, session.post(url, data=body, headers=headers) as r:
                    await r.read()
            await asyncio.gather(*(one(k, b) for k, b in calls))

    t0 = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - t0


def run_plain_serial(url: str, tag: str, batch: pa.Table) -> float:
    calls = _payloads(tag, batch)
    t0 = time.perf_counter()
    for key, body in calls:
        req = urllib.request.Request(url, data=body.encode(), headers={"Idempotency-Key": key,
                                                                        "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--effects", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--serial-effects", type=int, default=1000, help="calls of the serial loop (it is slow)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-effects-"))
    batch = rows(args.effects)
    rates: dict[str, list[float]] = {"onceflow": [], "plain-async": [], "plain-serial": []}
    with ServiceProcess(work / "service.db") as svc:
        url = svc.effects_url
        for r in range(args.rounds):
            order = ["onceflow", "plain-async", "plain-serial"]
            for name in order if r % 2 == 0 else order[::-1]:
                tag = f"{name}-{r}"
                if name == "onceflow":
                    secs, n = run_onceflow(url, work, tag, batch, args.concurrency), args.effects
                elif name == "plain-async":
                    secs, n = run_plain_async(url, tag, batch, args.concurrency), args.effects
                else:
                    n = args.serial_effects
                    secs = run_plain_serial(url, tag, batch.slice(0, n))
                rates[name].append(n / secs)
                print(f"round {r + 1} {name:12s} {n:6d} calls in {secs:6.2f} s = {n / secs:8,.0f} calls/s",
                      flush=True)
        applied = read_effects(svc.db)
    keys = [e["key"] for e in applied]
    assert len(keys) == len(set(keys)), "an effect was applied twice"
    med = {k: statistics.median(v) for k, v in rates.items()}
    paired = statistics.median(o / p for o, p in zip(rates["onceflow"], rates["plain-async"], strict=True))
    print()
    for k, v in med.items():
        print(f"{k:12s} median {v:8,.0f} calls/s")
    print(f"paired ratio onceflow / plain-async (same concurrency, no ledger) = {paired:.3f}  "
          "(target >= 0.8)")
    print(f"median ratio onceflow / plain-serial = {med['onceflow'] / med['plain-serial']:.2f}")


if __name__ == "__main__":
    main()
