"""The ingest leg's check of ``onceflow verify --ingest`` can fail: lost, duplicated, unexpected."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from onceflow.sources.events import EVENT_SCHEMA
from onceflow.sources.log import EventLog
from onceflow.verify.ingest_rig import check_log


def _events(ids: list[str]) -> pa.Table:
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return pa.Table.from_pydict({"event_id": ids, "user": ["u"] * len(ids), "event_time": [t] * len(ids),
                                 "system_time": [t] * len(ids), "bytes": [1] * len(ids)}, schema=EVENT_SCHEMA)


def test_exact_log_passes(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append(_events(["a", "b"]))
    log.append(_events(["c"]))
    chk = check_log(tmp_path, {"a", "b", "c"})
    assert chk.ok and chk.rows_in_log == 3 and chk.ids_sent == 3


def test_lost_duplicated_and_unexpected_are_violations(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append(_events(["a", "b"]))
    log.append(_events(["b", "x"]))  # b twice, x never sent, c missing
    chk = check_log(tmp_path, {"a", "b", "c"})
    assert (chk.lost, chk.duplicated, chk.unexpected) == (1, 1, 1)
    assert not chk.ok and len(chk.violations) == 3
    assert any("missing from the log" in v for v in chk.violations)


def test_empty_log_loses_everything(tmp_path: Path) -> None:
    chk = check_log(tmp_path / "nolog", {"a"})
    assert chk.lost == 1 and not chk.ok
