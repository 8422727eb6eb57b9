"""Steps run where Spark plans a Python data source's read (:mod:`onceflow.engine.serverside`).

On a classic session that is a Python worker the driver starts — another process, as on a
Spark Connect server's driver host (the Connect route: ``tests/core/test_connect.py``'s client
that cannot see the checkpoint). What the steps return, raise and log comes back to the caller.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.api.query import restore_point
from onceflow.engine.serverside import StepsSource
from onceflow.errors import BadSegmentError, CheckpointMismatchError, OnceflowError

pytestmark = pytest.mark.spark


def _where(path: str) -> tuple[int, list[str]]:
    return os.getpid(), sorted(os.listdir(path))


def _pyspark_file() -> str:
    import pyspark

    return str(pyspark.__file__)


def _refuse() -> None:
    logging.getLogger("onceflow.startup").warning("removed %s", "offsets/.0.tmp")
    raise CheckpointMismatchError("the sink's batches are another checkpoint's")


def _refuse_odd() -> None:
    raise BadSegmentError("/data/seg-7", "a torn record")


def test_the_steps_run_in_another_process_and_return_what_they_return(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1")
    pid, names = StepsSource.run(spark, partial(_where, str(tmp_path)), "listing")
    assert pid != os.getpid()
    assert names == ["a"]


def test_what_the_steps_raise_and_log_comes_back_as_it_was(spark: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="onceflow"), \
            pytest.raises(CheckpointMismatchError, match="another checkpoint's"):
        StepsSource.run(spark, _refuse, "checking")
    assert any("removed offsets/.0.tmp (on the server)" in r.getMessage() and r.name == "onceflow.startup"
               for r in caplog.records)
    # an exception that does not unpickle as itself comes back by its class name and message
    with pytest.raises(OnceflowError, match="BadSegmentError: .*seg-7.*a torn record"):
        StepsSource.run(spark, _refuse_odd, "checking")


def test_a_restore_under_way_is_read_where_the_steps_run(spark: Any, tmp_path: Path) -> None:
    from onceflow.checkpoint import guard

    for log, ids in (("offsets", [0, 1, 2]), ("commits", [0, 1])):
        (tmp_path / log).mkdir()
        for n in ids:
            (tmp_path / log / str(n)).write_text("v1\n{}\n")
    assert StepsSource.run(spark, partial(restore_point, tmp_path), "reading") is None
    repair_file = tmp_path / guard.RESTORE_FILE
    repair_file.write_text('{"until": 4}')
    assert StepsSource.run(spark, partial(restore_point, tmp_path), "reading") == (2, 1)


def test_a_checkpoint_directory_both_sides_see_is_probed_and_left_clean(spark: Any, tmp_path: Path) -> None:
    from onceflow.runtime.connect import sees_checkpoint

    new = tmp_path / "new" / "ck"
    assert sees_checkpoint(spark, new)  # the driver lists the client's probe file
    assert new.is_dir() and list(new.iterdir()) == []
    (tmp_path / "a-file").write_text("")
    assert not sees_checkpoint(spark, tmp_path / "a-file" / "ck")  # the client cannot write there


def test_sparks_python_workers_import_pyspark_from_its_package(spark: Any) -> None:
    # Spark puts its pyspark.zip first on its workers' path (no bytecode: every module compiled
    # at each start); the install's start-up line moves it (tests/core/test_jvmstart.py)
    where = StepsSource.run(spark, _pyspark_file, "asking")  # a Python worker the driver starts
    tasks = spark.range(1, numPartitions=1).mapInArrow(  # an executor's
        lambda batches: (pa.record_batch({"f": [_pyspark_file()]}) for _ in batches), "f STRING").collect()
    for f in (where, tasks[0].f):
        assert ".zip" not in f and f.endswith(os.path.join("pyspark", "__init__.py")), f
