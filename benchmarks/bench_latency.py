"""End-to-end latency of Example 5-1: from a segment appended to the log to its batch committed.

One Spark session, Example 5-1 (``onceflow.examples.user_counts``: dedup, per-batch window
deltas, exactly once) running continuously with ``--trigger`` (default ``0 seconds``: the next
batch starts as soon as the last one ended). A writer appends one ``--segment``-event segment
(new ids, event times moving forward, no duplicates, none late) to the event log — or with
``--source kafka`` produces it to a topic of a local broker (``--partitions``, read by Spark's
connector, from one connected producer; the sample starts before the first record is sent and
includes the wait for the broker's acknowledgements) — then polls
the sink's markers from a **second sink object** (a reader of its own: a new SQLite connection,
a new PostgreSQL connection, the Delta table read again) every 2 ms until the batches' summed
``input_rows`` reach everything appended so far; that wait is the sample. Then it sleeps
``--gap`` seconds and appends the next segment. The first ``--warmup`` samples are not counted.

Per batch with input of the counted samples it also reports Spark's own progress durations (``latestOffset``,
``queryPlanning``, ``getBatch``, ``addBatch`` = onceflow's whole batch, ``walCommit``,
``commitOffsets``) and onceflow's ``seconds`` (``on_batch``); medians are printed.

Sinks: ``sqlite`` (a temporary file), ``postgres`` (driver side; ``$ONCEFLOW_PG_DSN`` or a
temporary server as the tests start one), ``delta`` (a temporary table directory), and
``spark``: **Spark's own floor** — the same plan in plain PySpark (``withWatermark`` +
``dropDuplicatesWithinWatermark``, the per-batch window counts collected in ``foreachBatch``),
no onceflow and no sink: a batch is "visible" when its ``foreachBatch`` has its counts.

**Over Spark Connect** (``--remote local``: a Connect server of its own with onceflow's jars, as
``onceflow connect-server`` starts one; or ``--remote sc://HOST:PORT``): the same query as a
client of the server, the writer and the marker poll in this process as before (``on_batch``
runs on the server there: its column is left out). ``--variants classic,connect`` runs this
script once per variant and ``--repeat`` round, in turn, each in a child process (a classic
session and a Connect client do not share a Python process), and prints each variant's p50 and
p99 over its runs and the ratio of Connect's p50 to classic's.

Usage: python benchmarks/bench_latency.py [--sinks sqlite,postgres,delta,spark] [--samples 20]
       [--segment 1000] [--gap 0.3] [--warmup 30] [--trigger "0 seconds"] [--source log|kafka]
       [--partitions 2] [--conf KEY=VALUE ...] [--remote local|sc://HOST:PORT]
       [--variants classic,connect --repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

import onceflow
from onceflow.examples.user_counts import (
    KafkaTopic,
    encode_event,
    start,
    window_deltas,
    window_totals,
    with_window_end,
)
from onceflow.runtime.session import session
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_table
from onceflow.verify.kafka_server import KafkaServer

PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets",
          "triggerExecution")


def segments(count: int, size: int) -> list[pa.Table]:
    """``count`` segments of ``size`` events each, event time moving forward, no duplicate."""
    table = generate_table(GeneratorConfig(events=count * size, users=200, minutes=count * size / 20_000,
                                           duplicates=0.0, late=0.0, seed=11, max_disorder_s=0.0))
    return [table.slice(i * size, size) for i in range(count)]


class SparkOnly:
    """Spark's floor: Example 5-1's plan in a plain ``foreachBatch`` that keeps its counts only."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        users = with_window_end(window_deltas(df).toArrow())
        window_totals(users)
        rows = int(pc.sum(users.column("count")).as_py() or 0)
        self.done.append({"batch_id": batch_id, "input_rows": rows, "seconds": time.perf_counter() - started})

    def batches(self) -> list[dict[str, Any]]:
        return list(self.done)

    def close(self) -> None:
        pass

    def start(self, spark: Any, log_dir: Path, checkpoint: Path, trigger: str) -> Any:
        log = spark.readStream.schema(EVENT_DDL).parquet(str(log_dir))
        events = (log.select("event_id", "user", "event_time").withWatermark("event_time", "1 minute")
                  .dropDuplicatesWithinWatermark(["event_id"]))
        return (events.writeStream.foreachBatch(self).option("checkpointLocation", str(checkpoint))
                .trigger(processingTime=trigger).start())


def make_sink(kind: str, work: Path, dsn: str | None) -> tuple[Any, Any]:
    """The sink the query writes to, and a second one that only reads its markers."""
    if kind == "sqlite":
        return onceflow.sqlite(str(work / "lat.db")), onceflow.sqlite(str(work / "lat.db"))
    if kind == "delta":
        return onceflow.delta(work / "delta"), onceflow.delta(work / "delta")
    if kind == "postgres":
        return onceflow.postgres(dsn, sink_id="lat"), onceflow.postgres(dsn, sink_id="lat")
    if kind == "spark":
        plain = SparkOnly()
        return plain, plain
    raise SystemExit(f"unknown sink {kind!r}: sqlite, postgres, delta or spark")


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def run(spark: Any, kind: str, args: argparse.Namespace, dsn: str | None,
        broker: Any = None) -> dict[str, Any]:
    """One sink's samples (seconds) and the per-batch phase durations (ms).

    ``broker``: a running Kafka broker for ``--source kafka`` (a new topic per sink), else None.
    """
    work = Path(tempfile.mkdtemp(prefix=f"bench-latency-{kind}-"))
    parts = segments(args.warmup + args.samples + 1, args.segment)
    source: Path | KafkaTopic = work / "log"
    if broker is not None:
        topic = f"latency-{kind}-{time.monotonic_ns()}"
        broker.create_topic(topic, args.partitions)
        source = KafkaTopic(broker.bootstrap, topic, connector="spark")

        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1,
                             "enable.idempotence": True})

        def append(part: pa.Table) -> None:  # one connected producer; returns once all are acknowledged
            micros = part.column("event_time").cast(pa.int64()).to_pylist()
            for eid, user, us in zip(part.column("event_id").to_pylist(), part.column("user").to_pylist(),
                                     micros, strict=True):
                producer.produce(topic, key=user.encode(), value=encode_event(user, us),
                                 headers=[("event_id", eid.encode())])
            if producer.flush(30):
                raise SystemExit(f"{topic}: records not acknowledged in 30 s")
    else:
        log = EventLog(work / "log")

        def append(part: pa.Table) -> None:
            log.append(part)

    append(parts[0])  # the query starts with one segment to read
    batches: list[dict[str, Any]] = []
    sink, reader = make_sink(kind, work, dsn)
    if isinstance(sink, SparkOnly):
        if broker is not None:
            raise SystemExit("--sinks spark (Spark's floor) reads the log only; drop it with --source kafka")
        query = sink.start(spark, work / "log", work / "ck", args.trigger)
    else:
        query = start(spark, source, sink, work / "ck", trigger=args.trigger, on_batch=batches.append)
    samples: list[float] = []
    appended = parts[0].num_rows
    try:
        def seen() -> int:
            return sum(int(m.get("input_rows") or 0) for m in reader.batches())

        deadline = time.monotonic() + 120
        while seen() < appended:  # the first batch (JIT, binding) is not a sample
            if time.monotonic() > deadline:
                raise SystemExit("the first batch did not commit in 120 s")
            time.sleep(0.05)
        for i, part in enumerate(parts[1:]):
            time.sleep(args.gap)
            t0 = time.perf_counter()
            append(part)
            appended += part.num_rows
            while seen() < appended:
                time.sleep(0.002)
            took = time.perf_counter() - t0
            if i >= args.warmup:
                samples.append(took)
            print(f"  {kind} segment {i}: {took * 1000:.0f} ms", flush=True)
    finally:
        query.stop()
        spark_query = query if isinstance(sink, SparkOnly) else query.query
        progress = [p for p in spark_query.recentProgress if p.get("numInputRows")]
        batches = sink.batches() if isinstance(sink, SparkOnly) else batches
        for s in (sink, reader):
            s.close()
        shutil.rmtree(work, ignore_errors=True)
    counted = max(1, len(samples))  # the batches of the counted samples (one each), not the warm-up's
    progress = progress[-counted:]  # recentProgress keeps the last 100
    phases = ({name: statistics.median([p["durationMs"].get(name, 0) for p in progress]) for name in PHASES}
              if progress else {})  # a stopped Connect query may report none
    with_input = [b["seconds"] * 1000 for b in batches if b["input_rows"]][-counted:]
    if with_input:  # on Connect, on_batch runs on the server
        phases["onceflow (on_batch)"] = statistics.median(with_input)
    return {"samples": samples, "phases": phases, "batches": len(progress)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sinks", default="sqlite,postgres,delta")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--segment", type=int, default=1000)
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between a commit and the next append")
    ap.add_argument("--warmup", type=int, default=30,
                    help="samples first, not counted: the JIT keeps speeding Spark up for ~30 batches")
    ap.add_argument("--trigger", default="0 seconds")
    ap.add_argument("--source", choices=("log", "kafka"), default="log",
                    help="the event log (Parquet segments), or a Kafka topic read by Spark's connector")
    ap.add_argument("--partitions", type=int, default=2, help="the Kafka topic's partitions")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the session (repeatable), e.g. the state store provider")
    ap.add_argument("--remote", default=None,
                    help="run the query over Spark Connect: 'local' (a server of its own) or sc://HOST:PORT")
    ap.add_argument("--variants", default=None,
                    help="classic,connect: this script once per variant and round, in child processes")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of --variants")
    args = ap.parse_args()
    if args.variants:
        compare(args)
        return
    kinds = [k for k in args.sinks.split(",") if k]
    dsn, server = os.environ.get("ONCEFLOW_PG_DSN"), None
    if "postgres" in kinds and not dsn:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.pg_server import TempPostgres

        server = TempPostgres()
        dsn = server.start()
    connect_server = None
    if args.remote == "local":
        from onceflow.verify.connect_server import ConnectServer

        connect_server = ConnectServer(Path(tempfile.mkdtemp(prefix="bench-latency-server-"))).start()
        args.remote = connect_server.url
    if args.remote:
        spark = session(remote=args.remote, conf=dict(c.split("=", 1) for c in args.conf))
    else:
        spark = session(conf=dict(c.split("=", 1) for c in args.conf), kafka=args.source == "kafka")
    broker = KafkaServer({}) if args.source == "kafka" else None  # started
    try:
        for kind in kinds:
            out = run(spark, kind, args, dsn, broker)
            s = [x * 1000 for x in out["samples"]]
            print(f"{kind}: {len(s)} samples of {args.segment} events, trigger {args.trigger!r}: "
                  f"p50 {pct(s, 0.5):.0f} ms, p90 {pct(s, 0.9):.0f} ms, p99 {pct(s, 0.99):.0f} ms, "
                  f"max {max(s):.0f} ms", flush=True)
            print("  per batch with input (median ms): "
                  + ", ".join(f"{n} {v:.0f}" for n, v in out["phases"].items()), flush=True)
            result = {"sink": kind, "samples_ms": s, "phases": out["phases"]}
            print("RESULT " + json.dumps(result), flush=True)
    finally:
        spark.stop()
        if connect_server is not None:
            connect_server.kill()
        if broker is not None:
            broker.close()
        if server is not None:
            server.stop()


def compare(args: argparse.Namespace) -> None:
    """``--variants``: each variant in a child process, ``--repeat`` rounds in turn; p50/p99 and the ratio."""
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - {"classic", "connect"}
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}: classic, connect")
    base = [sys.executable, str(Path(__file__).resolve()), "--sinks", args.sinks,
            "--samples", str(args.samples), "--segment", str(args.segment), "--gap", str(args.gap),
            "--warmup", str(args.warmup),
            "--trigger", args.trigger, "--source", args.source, "--partitions", str(args.partitions),
            *(x for c in args.conf for x in ("--conf", c))]
    got: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.repeat):
        for v in variants:
            cmd = base + (["--remote", "local"] if v == "connect" else [])
            print(f"== round {r + 1}: {v}", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = done.stdout.splitlines()
            results = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
            if done.returncode != 0 or not results:
                raise SystemExit(f"{v}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
            for res in results:
                got[v] += res["samples_ms"]
                phases[v].append(res["phases"])
                s = res["samples_ms"]
                print(f"   {v} {res['sink']}: p50 {pct(s, 0.5):.0f} ms, p99 {pct(s, 0.99):.0f} ms",
                      flush=True)
    for v in variants:
        s = got[v]
        med = {n: statistics.median(p[n] for p in phases[v] if n in p) for n in (phases[v] or [{}])[0]}
        print(f"{v}: {len(s)} samples: p50 {pct(s, 0.5):.0f} ms, p90 {pct(s, 0.9):.0f} ms, "
              f"p99 {pct(s, 0.99):.0f} ms; per batch (median ms): "
              + ", ".join(f"{n} {x:.0f}" for n, x in med.items()), flush=True)
    if {"classic", "connect"} <= set(variants):
        ratio = pct(got["connect"], 0.5) / pct(got["classic"], 0.5)
        print(f"connect p50 / classic p50 = {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
