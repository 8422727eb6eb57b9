"""A stable copy is checked whole before it is reused: a lost or changed file is never read as the batch.

Spark writes the DataFrame copies (several part files), the driver the Arrow ones; then a file
goes missing or changes, as a damaged disk or a hand would do it. A sink that commits a batch
all or nothing gets the batch computed again; any other sink is refused naming the batch. The
end-to-end case kills the charges driver (HTTP effects, stable=True) right after its copy was
saved, deletes the copy's file, and restarts it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.engine.stable import DIR, StableCopyError, StableOutputs
from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.service import ServiceProcess, read_effects

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_part_file_of_a_spark_copy_is_refused_or_recomputed(spark: Any, tmp_path: Path) -> None:
    df = spark.range(1000).repartition(4)
    store = StableOutputs(tmp_path)
    store.save(3, "q", {"t": df}, rows_out=1000)
    parts = sorted((tmp_path / DIR / "3" / "t").glob("part-*.parquet"))
    assert len(parts) == 4
    kept = store.load(3, "q", spark)
    assert kept is not None and kept.tables["t"].count() == 1000  # whole: read back
    parts[1].unlink()
    with pytest.raises(StableCopyError, match=rf"the stable copy of batch 3 in .*: table 't': 1 file\(s\) "
                                              rf"missing \(e.g. t/{parts[1].name}\).*delete .* and restart"):
        store.load(3, "q", spark)
    assert store.load(3, "q", spark, recompute=lambda: True) is None  # set aside: the batch is computed again
    assert store.batches() == []
    store.cleanup([])
    assert [p.name for p in (tmp_path / DIR).iterdir()] == []


def test_a_changed_arrow_copy_is_refused(tmp_path: Path) -> None:
    store = StableOutputs(tmp_path)
    store.save(0, "q", {"t": pa.table({"k": list(range(100)), "v": [1.5] * 100})}, rows_out=100)
    path = tmp_path / DIR / "0" / "t.parquet"
    before = store.load(0, "q")
    assert before is not None and before.tables["t"].num_rows == 100
    data = bytearray(path.read_bytes())
    data[8] ^= 0xFF  # a flipped byte in a page: same size, same footer
    path.write_bytes(bytes(data))
    with pytest.raises(StableCopyError, match=r"table 't': t.parquet changed \(saved .*sha256"):
        store.load(0, "q")


def test_a_crash_after_the_copy_then_a_lost_file_refuses_the_restart(tmp_path: Path) -> None:
    for t in generate_segments(GeneratorConfig(events=1_000, users=6, minutes=20, seed=7, segment_size=500)):
        EventLog(tmp_path / "log").append(t)
    with ServiceProcess(tmp_path / "service.db") as svc:
        def driver(crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
            if crash_at:
                env[CRASH_ENV] = crash_at
            return subprocess.run([sys.executable, "-m", "tests.core.charges_driver", str(tmp_path / "log"),
                                   str(tmp_path / "ck"), str(tmp_path / "ledger.db"), svc.effects_url,
                                   "--price-url", f"{svc.url}/price", "--once"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=300, start_new_session=True)

        crashed = driver("after_stable_save@0")
        assert crashed.returncode == -9, crashed.stderr[-3000:]
        copy = tmp_path / "ck" / DIR / "0"
        files = sorted(p.name for p in copy.iterdir())
        assert "charges.parquet" in files and "_meta.json" in files
        (copy / "charges.parquet").unlink()
        again = driver()
        assert again.returncode != 0
        assert "StableCopyError" in again.stderr and "the stable copy of batch 0" in again.stderr, \
            again.stderr[-3000:]
        assert "charges.parquet is missing" in again.stderr
        assert read_effects(svc.db) == []  # nothing was charged from a recomputation
