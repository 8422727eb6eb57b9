"""A backlog after downtime: one micro-batch of N rows into Delta or SQLite, beside Spark's own writer.

Input: ``--rows`` rows of ~108 bytes (an id, an account, an amount, a timestamp, a note) as
Parquet files, made once per size. Each variant reads all of them as one batch, in its own
child process (so each process's peak memory is its own), with onceflow's session defaults:

* ``spark``: Spark's own Parquet writer of the same stream (``foreachBatch`` writing
  ``batch.write.parquet``), then one Delta commit of those files with delta-rs — the floor of
  a Delta append;
* ``onceflow``: ``onceflow.write_stream(..., onceflow.delta(root), once=True)``, an append
  table: the batch is over ``collect_below``, so Spark's tasks write the files and the driver
  commits them with the marker;
* ``onceflow-collect``: the same with ``collect_below`` above N (the batch collected to the
  driver as Arrow and committed by delta-rs: the path every batch took before);
* ``sqlite``: ``onceflow.write_stream`` into ``onceflow.sqlite(db)``, an append table: the tasks
  convert and write scratch SQLite files, the driver copies them in with the marker;
* ``sqlite-collect``: the same with ``collect_below`` above N (the batch collected as Arrow and
  inserted by the driver);
* ``spark-jdbc``: Spark's own JDBC writer of the same stream into a PostgreSQL table
  (``foreachBatch`` + ``batch.write.jdbc``, at least once) — the reference of the PostgreSQL rows;
* ``postgres``: ``onceflow.postgres(dsn)`` (driver protocol): the tasks stage the rows, the driver
  moves them with the marker in one transaction;
* ``postgres-collect``: the same with ``collect_below`` above N (collected and ``COPY``'d from the
  driver);
* ``postgres-staged``: ``onceflow.postgres(dsn, protocol="staged")`` — the executor-side protocol
  (each task stages its rows, the table's marker decides the move);
* ``spark-kafka``: Spark's own Kafka writer of the same stream (``to_json(struct(*))`` as each
  record's value, no key; at least once) into a topic of 3 partitions;
* ``kafka``: ``onceflow.kafka(bootstrap, partitions=3)``, an append table: Spark's tasks encode and
  produce the records, a Kafka transaction per task, the driver marks the batch;
* ``kafka-collect``: the same with ``collect_below`` above N (collected, produced by the driver in
  one transaction).

The PostgreSQL variants need ``$ONCEFLOW_PG_DSN`` (a database the run may write tables into) and
``onceflow jars fetch postgres-jdbc``. The Kafka variants start one broker for the run
(:class:`onceflow.verify.kafka_server.KafkaServer`; ``onceflow jars fetch kafka-broker
kafka-connector``); a topic's records are counted back with a ``read_committed`` consumer.

Prints per variant: seconds (query start to end), the driver Python's peak RSS (``ru_maxrss``
of the child), the rows in the table (checked = N); then the ratios spark / onceflow (Delta,
target >= 0.9), sqlite / spark (target <= 1.5), spark-jdbc / postgres (Spark's JDBC writer's
time over onceflow's: >= 1 is faster than Spark's) and spark-kafka / kafka (the same for Kafka).
Spark's default ``spark.driver.maxResultSize`` (1g) is kept: the collect variant fails above
it, as it did for users.

``--steps`` also times the steps of the onceflow variants (the batch's cache and count, the tasks'
write, the driver's commit) and prints them beside the total.

``--table upsert`` (key ``id``) or ``--table add`` (key ``id``, ``amount_cents`` added) writes
the onceflow variants into a keyed table (Spark checks the keys first, so the batch is cached);
the ``spark`` variants append as before.

``--cluster standalone`` runs every variant on a standalone master and 2 workers of 1 core each
(:class:`onceflow.verify.standalone.StandaloneCluster`; executors of 1 GiB) with a 1 GiB driver
(``ONCEFLOW_DRIVER_MEMORY=1g``); ``--kill-mid-write`` arms the crash point ``task_mid_write`` for
batch 0 in the onceflow variants: the first task that writes SIGKILLs its own executor JVM after
part of its rows, Spark runs its tasks again on a new executor, and the table must still hold N
rows (the row count is checked against N, as in every run).

Usage: python benchmarks/bench_backlog.py [--rows 5000000] [--steps] [--table append|upsert|add]
       [--cluster standalone] [--kill-mid-write]
       [--variants spark,onceflow,onceflow-collect,sqlite,sqlite-collect,spark-jdbc,postgres,postgres-collect,
                   postgres-staged,
                   spark-kafka,kafka,kafka-collect]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = "id LONG, account STRING, amount_cents LONG, at TIMESTAMP, note STRING"


def make_input(folder: Path, rows: int) -> None:
    """``rows`` rows as Parquet under ``folder`` (kept between runs of one size)."""
    if (folder / "_SUCCESS").exists():
        return
    from onceflow.runtime.session import session

    spark = session(app_name="backlog-input")
    (spark.range(rows, numPartitions=max(2, rows // 1_000_000))
     .selectExpr("id", "concat('acct-', lpad(cast(id % 10007 as string), 6, '0')) AS account",
                 "(id * 7919) % 100000 AS amount_cents",
                 "timestamp_seconds(1780000000 + id % 86400) AS at",
                 "concat('payment note ', cast(id as string), ' for the backlog of the day') AS note")
     .write.mode("overwrite").parquet(str(folder)))
    spark.stop()


STEPS = {"cache and count": ("onceflow.engine.batch", "BatchWriter", "_materialize"),
         "tasks write (sqlite)": ("onceflow.sinks.sqlite.tasks", None, "run"),
         "copy (sqlite)": ("onceflow.sinks.sqlite.sink", "SQLiteTablesSink", "apply_files"),
         "WAL into the database (sqlite)": ("onceflow.sinks.sqlite.sink", "SQLiteTablesSink", "_checkpoint"),
         "start (write_stream)": ("onceflow.api.stream", None, "write_stream"),
         "tasks stage (postgres)": ("onceflow.sinks.postgres.datasource", None, "stage_frame"),
         "move (postgres)": ("onceflow.sinks.postgres.sink", "PostgresTablesSink", "_move"),
         "tasks write (delta)": ("onceflow.sinks.delta.sink", "DeltaTablesSink", "_task_files"),
         "commit (delta)": ("onceflow.sinks.delta.files", None, "commit"),
         "tasks produce (kafka)": ("onceflow.sinks.kafka.tasks", None, "run_rows"),
         "bind (kafka)": ("onceflow.sinks.kafka.sink", "KafkaTopicsSink", "bind"),
         "checks, decide, topics (kafka)": ("onceflow.sinks.kafka.sink", "KafkaTopicsSink", "_ready"),
         "mark (kafka)": ("onceflow.sinks.kafka.sink", "KafkaTopicsSink", "_transaction")}
"""What ``--steps`` times: label -> (module, class or None, function)."""


def time_steps(spent: dict[str, float]) -> None:
    """Wrap each of :data:`STEPS` so that its seconds add up in ``spent``."""
    import functools
    import importlib

    for label, (module, cls, name) in STEPS.items():
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args: object, _fn: object = fn, _label: str = label, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return _fn(*args, **kwargs)  # type: ignore[operator]
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)


TABLES = {"append": {}, "upsert": {"key": "id"}, "add": {"key": "id", "add": "amount_cents"}}
"""``--table``: the onceflow variants' table (Spark's own writers append)."""


def run(variant: str, source: Path, work: Path, steps: bool = False,
        master: str | None = None, table_mode: str = "append") -> dict[str, object]:
    """One variant in this process (the child): seconds, peak RSS, rows written (and step times)."""
    import onceflow

    table_spec = onceflow.Table(**TABLES[table_mode])  # type: ignore[arg-type]
    from onceflow.runtime.session import session

    spent: dict[str, float] = {}
    if steps:
        time_steps(spent)

    conf = {}
    if variant == "spark-jdbc":
        from onceflow.runtime.jars import require, with_jars

        conf = with_jars(conf, require("postgres-jdbc"))
    spark = session(master=master, app_name=f"backlog-{variant}", conf=conf, kafka=variant == "spark-kafka")
    bootstrap = os.environ.get("ONCEFLOW_BENCH_KAFKA", "")
    stream = spark.readStream.schema(SCHEMA).parquet(str(source))
    started = time.perf_counter()
    if variant == "spark":
        def write(batch: object, batch_id: int) -> None:
            batch.write.mode("append").parquet(str(work / "plain"))  # type: ignore[attr-defined]

        stream.writeStream.foreachBatch(write).option("checkpointLocation", str(work / "ck")) \
            .trigger(availableNow=True).start().awaitTermination()
        import pyarrow.parquet as pq
        from deltalake import Schema
        from deltalake.transaction import AddAction, create_table_with_add_actions

        files = sorted((work / "plain").glob("*.parquet"))
        adds = [AddAction(f.name, f.stat().st_size, {}, int(f.stat().st_mtime * 1000), True,
                          json.dumps({"numRecords": pq.ParquetFile(f).metadata.num_rows})) for f in files]
        schema = Schema.from_arrow(pq.read_schema(files[0]))
        create_table_with_add_actions(str(work / "plain"), schema, adds, mode="append")
        table = work / "plain"
    elif variant == "spark-jdbc":
        from onceflow.api.realtime import jdbc_target

        url, user, password = jdbc_target(os.environ["ONCEFLOW_PG_DSN"])
        props = {"user": user or "", "password": password or "", "driver": "org.postgresql.Driver"}

        def jdbc(batch: object, batch_id: int) -> None:
            batch.write.jdbc(url, "backlog_jdbc", mode="append", properties=props)  # type: ignore[attr-defined]

        stream.writeStream.foreachBatch(jdbc).option("checkpointLocation", str(work / "ck")) \
            .trigger(availableNow=True).start().awaitTermination()
        table = work / "backlog_jdbc"
    elif variant == "spark-kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for made in admin.create_topics([NewTopic("backlog_spark", 3, 1)]).values():
            made.result(60)
        (stream.selectExpr("to_json(struct(*)) AS value").writeStream.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", "backlog_spark")
         .option("checkpointLocation", str(work / "ck")).trigger(availableNow=True).start()
         .awaitTermination())
        table = work / "backlog_spark"
    elif variant.startswith("kafka"):
        collect = 10**12 if variant == "kafka-collect" else 100_000
        topic = f"backlog_{variant.replace('-', '_')}"
        onceflow.write_stream(stream, onceflow.kafka(bootstrap, sink_id=topic, partitions=3,
                                                     collect_below=collect),
                              work / "ck", {topic: table_spec}, once=True).awaitTermination()
        table = work / topic
    elif variant == "postgres-staged":
        onceflow.write_stream(stream, onceflow.postgres(sink_id=work.name.replace("-", "_")[-40:],
                                                        protocol="staged"),
                              work / "ck", {"backlog_postgres_staged": table_spec},
                              once=True).awaitTermination()
        table = work / "backlog_postgres_staged"
    elif variant.startswith("postgres"):
        collect = 10**12 if variant == "postgres-collect" else 100_000
        onceflow.write_stream(stream, onceflow.postgres(sink_id=work.name.replace("-", "_")[-40:],
                                                        collect_below=collect),
                              work / "ck", {f"backlog_{variant.replace('-', '_')}": table_spec},
                              once=True).awaitTermination()
        table = work / f"backlog_{variant.replace('-', '_')}"
    elif variant.startswith("sqlite"):
        collect = 10**12 if variant == "sqlite-collect" else 100_000
        onceflow.write_stream(stream, onceflow.sqlite(work / "app.db", collect_below=collect), work / "ck",
                              {"payments": table_spec}, once=True).awaitTermination()
        table = work / "app.db"
    else:
        collect = 10**12 if variant == "onceflow-collect" else 100_000
        onceflow.write_stream(stream, onceflow.delta(work / "lake", collect_below=collect), work / "ck",
                              {"payments": table_spec}, once=True).awaitTermination()
        table = work / "lake" / "payments"
    seconds = time.perf_counter() - started
    if variant.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(table) as conn:
            rows = conn.execute("SELECT count(*) FROM payments").fetchone()[0]
    elif "kafka" in variant:
        rows = _count_topic(bootstrap, table.name)
    elif variant.startswith(("postgres", "spark-jdbc")):
        import psycopg

        with psycopg.connect(os.environ["ONCEFLOW_PG_DSN"], autocommit=True) as conn:
            rows = conn.execute(f"SELECT count(*) FROM {table.name}").fetchone()[0]  # type: ignore[index]
            conn.execute(f"DROP TABLE {table.name}")  # the next run starts from nothing (no owner either)
            conn.execute(f"DROP TABLE IF EXISTS {table.name}_onceflow_stage")
            if variant != "spark-jdbc":
                from onceflow.sinks._core.owners import TABLE

                conn.execute(f"DELETE FROM {TABLE} WHERE table_name = %s", (table.name,))
    else:
        from deltalake import DeltaTable

        rows = DeltaTable(str(table)).count()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    spark.stop()
    return {"seconds": round(seconds, 2), "driver_rss_mb": peak, "rows": rows,
            "steps": {k: round(v, 2) for k, v in spent.items()}}


def _count_topic(bootstrap: str, topic: str) -> int:
    """The records a ``read_committed`` consumer reads from ``topic`` (to its last stable offsets)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{topic}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        parts = c.list_topics(topic, timeout=60).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        limit = max(600.0, sum(ends.values()) / 20_000)  # a 60M-row topic takes minutes to read back
        n, deadline = 0, time.monotonic() + limit
        while time.monotonic() < deadline:
            n += sum(1 for m in c.consume(50_000, timeout=1.0) if m.error() is None)
            at = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])}
            if all(at[p] >= ends[p] for p in parts):
                return n
        raise RuntimeError(f"counting {topic} did not reach its end in {limit:.0f} s")
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--variants", default="spark,onceflow,onceflow-collect")
    ap.add_argument("--steps", action="store_true", help="also time the onceflow variants' steps")
    ap.add_argument("--cluster", choices=["local", "standalone"], default="local",
                    help="standalone: a master and 2 one-core workers, a 1 GiB driver")
    ap.add_argument("--kill-mid-write", action="store_true",
                    help="the onceflow variants' first writing task SIGKILLs its executor (batch 0)")
    ap.add_argument("--table", choices=sorted(TABLES), default="append", help="the onceflow variants' table")
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run(args.child, Path(args.source), Path(args.work), args.steps, args.master,
                             args.table)), flush=True)
        os._exit(0)  # delta-rs may abort the interpreter at shutdown (delta-io/delta-rs#2184)
    source = Path(tempfile.gettempdir()) / f"onceflow-backlog-{args.rows}"
    make_input(source, args.rows)
    results = {}
    broker = None
    if "kafka" in args.variants:
        from onceflow.verify.kafka_server import KafkaServer

        broker = KafkaServer().__enter__()
        os.environ["ONCEFLOW_BENCH_KAFKA"] = broker.bootstrap
    cluster, env = None, dict(os.environ)
    if args.cluster == "standalone":
        from onceflow.verify.standalone import StandaloneCluster

        cluster = StandaloneCluster(Path(tempfile.mkdtemp(prefix="onceflow-backlog-cluster-")), workers=2,
                                    cores=1, memory="2g").start()
        env["ONCEFLOW_DRIVER_MEMORY"] = "1g"
    for variant in args.variants.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"onceflow-backlog-{variant}-"))
        child_env = dict(env)
        if args.kill_mid_write and not variant.startswith("spark"):
            from onceflow.verify.crashes import child_env as armed  # the verifier's crash hook

            child_env = armed({**child_env, "ONCEFLOW_CRASH_AT": "task_mid_write@0"})
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--source", str(source),
                               "--work", str(work), *(["--steps"] if args.steps else []),
                               "--table", args.table,
                               *(["--master", cluster.master_url] if cluster is not None else [])],
                              capture_output=True, text=True, env=child_env)
        if args.kill_mid_write and not variant.startswith("spark"):
            said = "crash point task_mid_write at batch 0" in done.stdout + done.stderr
            what = "an executor was SIGKILLed mid-write" if said else "NO KILL (not reached)"
            print(f"{variant:18s} {what}", flush=True)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            lines = done.stderr.strip().splitlines() or ["?"]
            why = next((x for x in lines if "maxResultSize" in x), lines[-1]).strip()[:300]
            print(f"{variant:18s} FAILED (exit {done.returncode}): {why}", flush=True)
            shutil.rmtree(work, ignore_errors=True)
            continue
        results[variant] = json.loads(lines[-1])
        r = results[variant]
        ok = "" if r["rows"] == args.rows else f"  WRONG: {r['rows']} rows"
        print(f"{variant:18s} {r['seconds']:8.2f} s   driver Python peak RSS {r['driver_rss_mb']:6d} MB   "
              f"{r['rows']:,} rows{ok}" + (f"   steps {r['steps']}" if r.get("steps") else ""), flush=True)
        shutil.rmtree(work, ignore_errors=True)
    if "spark" in results and "onceflow" in results:
        print(f"ratio spark / onceflow: {results['spark']['seconds'] / results['onceflow']['seconds']:.2f} "
              "(target >= 0.9)")
    if "spark-jdbc" in results and "postgres" in results:
        print(f"ratio spark-jdbc / postgres: "
              f"{results['spark-jdbc']['seconds'] / results['postgres']['seconds']:.2f}")
    if "spark-kafka" in results and "kafka" in results:
        print(f"ratio spark-kafka / kafka: "
              f"{results['spark-kafka']['seconds'] / results['kafka']['seconds']:.2f}")
    if broker is not None:
        broker.__exit__(None, None, None)
    if cluster is not None:
        cluster.stop()
    if "spark" in results and "sqlite" in results:
        print(f"ratio sqlite / spark: {results['sqlite']['seconds'] / results['spark']['seconds']:.2f} "
              "(target <= 1.5)")


if __name__ == "__main__":
    main()
