"""The charges example as a test driver process.

``python -m tests.core.charges_driver LOG CK LEDGER CHARGE_URL [--price-url URL] [--no-stable]
[--naive] [--extra DIR] [--once]``; ``--extra DIR`` adds the rows of ``DIR/<batch>-*.parquet``
to batch ``<batch>``'s totals (an element that a retry of the batch may see and its first
attempt did not); ``ONCEFLOW_CRASH_AT`` kills it at a crash point.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.examples import charges
from onceflow.runtime.session import session
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.sinks import NaiveHttpSink


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def main(argv: list[str]) -> None:
    log, ck, ledger, url = argv[:4]
    extra_dir = _value(argv, "--extra")

    def extra(batch_id: int) -> pa.Table:
        files = sorted(Path(extra_dir).glob(f"{batch_id}-*.parquet")) if extra_dir else []
        schema = pa.schema([("account", pa.string()), ("window_start_ms", pa.int64()),
                            ("bytes", pa.int64()), ("events", pa.int64())])
        return pa.concat_tables([pq.read_table(f) for f in files]) if files else schema.empty_table()

    spark = session(app_name="charges-test", conf={"spark.sql.session.timeZone": "UTC"})
    cls = NaiveHttpSink if "--naive" in argv else HttpEffectsSink
    sink = cls(url, ledger, sink_id="charges", timeout_s=3.0)
    query = charges.start(spark, log, sink, ck, price_url=_value(argv, "--price-url"),
                          stable="--no-stable" not in argv, max_files_per_trigger=1, once="--once" in argv,
                          extra=extra)
    query.awaitTermination()
    sink.close()
    print("drained", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
