"""Spark's own lake readers on onceflow's tables (the version smoke suite, scripts/spark_versions.sh).

``python scripts/lake_readers.py iceberg DIR``: every table of the SQLite catalog ``DIR/catalog.db``
(namespace ``onceflow``, what ``onceflow verify --sink iceberg`` leaves in its work directory) read
by Iceberg's Spark runtime (``iceberg-spark-runtime-4.1_2.13:1.12.0`` from Maven Central, the
table loaded from its current metadata file) and by pyiceberg: the same rows, or exit 1.

``python scripts/lake_readers.py delta DIR``: every Delta table under ``DIR`` read by delta-spark
(the ``delta-spark`` package's jar) and by deltalake (delta-rs): the same rows, or exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ICEBERG = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"


def _text(value: Any) -> str:
    """A value in one form for both readers (an aware time as UTC without its zone, as Spark gives it)."""
    import datetime as dt

    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return str(value)


def _same(name: str, spark_rows: Any, arrow: Any) -> bool:
    columns = list(spark_rows.columns)
    got = sorted(tuple(_text(r[c]) for c in columns) for r in spark_rows.collect())
    want = sorted(tuple(_text(r[c]) for c in columns) for r in arrow.to_pylist())
    print(f"{name}: Spark {len(got)} rows, {'the same' if got == want else 'DIFFERENT'} from the Python reader "
          f"({len(want)} rows)")
    return got == want and len(got) > 0


def main() -> int:
    kind, folder = sys.argv[1], Path(sys.argv[2]).absolute()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    ok = True
    if kind == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        spark = builder.config("spark.jars.packages", ICEBERG).getOrCreate()
        catalog = SqlCatalog("onceflow", uri=f"sqlite:///{folder / 'catalog.db'}",
                             warehouse=(folder / "warehouse").as_uri())
        for ident in catalog.list_tables("onceflow"):
            table = catalog.load_table(ident)
            ok &= _same(".".join(ident), spark.read.format("iceberg").load(table.metadata_location),
                        table.scan().to_arrow())
    else:
        from delta import configure_spark_with_delta_pip
        from deltalake import DeltaTable

        spark = configure_spark_with_delta_pip(
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        ).getOrCreate()
        for path in sorted(p for p in folder.iterdir() if (p / "_delta_log").is_dir()):
            ok &= _same(path.name, spark.read.format("delta").load(str(path)),
                        DeltaTable(str(path)).to_pyarrow_table())
    print(f"{kind} readers: pyspark {spark.version}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
