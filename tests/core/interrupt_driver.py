"""A driver that runs a slow continuous query until Ctrl-C (SIGINT), for the interrupt test.

``python -m tests.core.interrupt_driver INPUT DB CHECKPOINT``: one 100-row file per batch,
each batch ~3 s (its ``per_batch`` sleeps), prints ``BATCH <id>`` when one starts.
"""

from __future__ import annotations

import sys
import time

import onceflow
from onceflow.runtime.session import session

if __name__ == "__main__":
    source, db, checkpoint = sys.argv[1:4]
    spark = session(app_name="interrupt-test")
    df = spark.readStream.schema("id STRING, n BIGINT").option("maxFilesPerTrigger", 1).parquet(source)

    def per_batch(batch: object, batch_id: int) -> object:
        if batch_id >= 0:  # -1: the start-up call on an empty frame
            print(f"BATCH {batch_id}", flush=True)
            time.sleep(3)
        return batch

    onceflow.write_stream(df, onceflow.sqlite(db), checkpoint, {"t": onceflow.Table(key="id")},
                          per_batch=per_batch, trigger="100 milliseconds").awaitTermination()
    print("EXITED", flush=True)
