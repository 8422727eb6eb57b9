"""The README's pipeline, killed once and restarted, checked against the input (the version smoke suite).

``python scripts/smoke_pipeline.py DIR`` writes payments as Parquet files into DIR/payments (5%
of them resent with the same id, a few an hour late), runs the README's query (deduplicate,
revenue per account and 5-minute window added into SQLite, payments appended, late payments
kept) with the crash point ``after_sink_commit@1`` armed — the child process SIGKILLs itself and
its JVM after batch 1's commit — then runs it again on the same checkpoint and database, and
checks every table against a Python recomputation of the files. Exit 0 and ``smoke: EXACT`` when
every payment is once in ``payments`` or ``late_payments`` and every sum is right.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

QUERY = '''
import sys
from pathlib import Path
import onceflow
from onceflow import Table
from pyspark.sql import functions as F
from onceflow.runtime.session import session

work = Path(sys.argv[1])
spark = session(shuffle_partitions=2)
payments = spark.readStream.schema(
    "payment_id STRING, account STRING, amount_cents BIGINT, ts TIMESTAMP"
).option("maxFilesPerTrigger", 1).parquet(str(work / "payments"))
clean = onceflow.deduplicate(payments, id="payment_id", event_time="ts", within="10 minutes")

def per_batch(batch):
    revenue = (batch.groupBy("account", F.window("ts", "5 minutes").start.alias("window_start"))
               .agg(F.sum("amount_cents").alias("amount_cents"), F.count("*").alias("payments")))
    return {"revenue": revenue, "payments": batch}

query = onceflow.write_stream(
    clean, sink=onceflow.sqlite(str(work / "app.db")), checkpoint=str(work / "ck"),
    tables={"revenue": Table(key=["account", "window_start"], add=["amount_cents", "payments"]),
            "payments": Table()},
    per_batch=per_batch, late="late_payments", once=True)
query.awaitTermination()
print("done")
'''


def write_payments(folder: Path) -> list[tuple[str, str, int, dt.datetime]]:
    """Four files of payments; the distinct payments (id, account, cents, time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    start = dt.datetime(2026, 1, 1, 12, 0)
    distinct: list[tuple[str, str, int, dt.datetime]] = []
    for f in range(4):
        rows = []
        for i in range(500):
            n = f * 500 + i
            late = f == 3 and i % 50 == 0  # an hour behind the stream: dropped by the watermark
            ts = start + dt.timedelta(seconds=n * 3) - (dt.timedelta(hours=1) if late else dt.timedelta())
            rows.append((f"p{n}", f"acct{n % 17}", 100 + n % 900, ts))
        distinct += rows
        resent = rows[::20]  # the same payment sent again, in the same file
        table = rows + resent
        pq.write_table(pa.table({"payment_id": [r[0] for r in table], "account": [r[1] for r in table],
                                 "amount_cents": [r[2] for r in table], "ts": [r[3] for r in table]}),
                       folder / f"part-{f}.parquet")
    return distinct


def main() -> int:
    work = Path(sys.argv[1]).absolute()
    work.mkdir(parents=True, exist_ok=True)
    distinct = write_payments(work / "payments")
    script = work / "query.py"
    script.write_text(QUERY)
    from onceflow.verify.crashes import child_env  # the verifier's crash hook in the query's processes

    armed = child_env({**os.environ, "ONCEFLOW_CRASH_AT": "after_sink_commit@1"})
    killed = subprocess.run([sys.executable, str(script), str(work)], capture_output=True, text=True,
                            env=armed, timeout=600)
    if killed.returncode != -9:
        print(f"smoke: the first run did not die at after_sink_commit@1 (exit {killed.returncode})\n"
              f"{killed.stderr[-3000:]}")
        return 1
    env = {k: v for k, v in os.environ.items() if k != "ONCEFLOW_CRASH_AT"}
    again = subprocess.run([sys.executable, str(script), str(work)], capture_output=True, text=True, env=env,
                           timeout=600)
    if again.returncode != 0:
        print(f"smoke: the restart failed (exit {again.returncode})\n{again.stderr[-3000:]}")
        return 1
    conn = sqlite3.connect(work / "app.db")
    kept = [r[0] for r in conn.execute("SELECT payment_id FROM payments")]
    late = [r[0] for r in conn.execute("SELECT payment_id FROM late_payments")]
    revenue = {(a, w): (c, n) for a, w, c, n in
               conn.execute("SELECT account, window_start, amount_cents, payments FROM revenue")}
    want_ids = {p[0] for p in distinct}
    problems = []
    if len(kept) != len(set(kept)) or len(late) != len(set(late)) or set(kept) & set(late):
        problems.append("a payment stored twice")
    if set(kept) | set(late) != want_ids:
        problems.append(f"{len(want_ids - set(kept) - set(late))} payments missing")
    by_id = {p[0]: p for p in distinct}
    sums: dict[tuple[str, str], list[int]] = {}
    for pid in kept:
        _, account, cents, ts = by_id[pid]
        window = ts.replace(minute=ts.minute - ts.minute % 5, second=0, microsecond=0)
        s = sums.setdefault((account, str(window)), [0, 0])
        s[0] += cents
        s[1] += 1
    got = {(a, str(w).replace("T", " ")[:19]): v for (a, w), v in revenue.items()}
    want = {(a, w[:19]): tuple(v) for (a, w), v in sums.items()}
    if got != want:
        problems.append(f"revenue differs in {len(set(got.items()) ^ set(want.items()))} rows")
    if problems:
        print("smoke: WRONG — " + "; ".join(problems))
        return 1
    print(f"smoke: EXACT — {len(kept)} payments once, {len(late)} late ones kept, {len(got)} revenue rows, "
          "after a SIGKILL after batch 1's commit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
