"""Ingest end to end with real processes on loopback: senders -> receiver -> log.

Acks are dropped (a receiver fault switch), the receiver dies at two named crash points and
by SIGKILL mid-stream, a sender is SIGKILLed and restarted. Afterwards the log holds every
sent event_id exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from onceflow.ingest.sender import generated_id, id_key
from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV, DROP_ACKS_ENV
from tests.ingest.receiver_proc import Proc, free_port, write_tokens
from tests.ingest.receiver_proc import health as _health

pytestmark = pytest.mark.faults


def _receiver(tmp: Path, port: int, life: int, env: dict[str, str], catalog: list[str]) -> Proc:
    proc = Proc(["ingest", "serve", "--log", str(tmp / "log"), *catalog, "--tokens", str(tmp / "tokens"),
                 "--port", str(port)], tmp / f"receiver{life}.out", env)
    deadline = time.monotonic() + 60
    while _health(port) is None:
        assert proc.p.poll() is None or proc.p.returncode == -9, (tmp / f"receiver{life}.out").read_text()
        if proc.p.poll() is not None:
            break  # died at its crash point before we saw it
        assert time.monotonic() < deadline, "receiver did not start"
        time.sleep(0.1)
    return proc


def _new_events(port: int) -> int:
    h = _health(port)
    return int(h["receiver"]["events_new"]) if h else 0  # type: ignore[index]


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_every_event_exactly_once_through_receiver_and_sender_crashes(
        tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    catalog = (["--catalog", str(tmp_path / "catalog.db")] if store == "sqlite"
               else ["--catalog-dsn", request.getfixturevalue("pg_dsn")])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    per_sender = 6_000

    for name, token in write_tokens(tmp_path, "s1", "s2").items():
        (tmp_path / f"{name}.token").write_text(token)

    def sender(name: str, life: int) -> Proc:
        return Proc(["send", "--url", url, "--outbox", str(tmp_path / f"{name}.db"), "--sender-id", name,
                     "--token-file", str(tmp_path / f"{name}.token"),
                     "--events", str(per_sender), "--batch-size", "250", "--rate", "3000"],
                    tmp_path / f"{name}-{life}.out")

    drop = {DROP_ACKS_ENV: "0.3"}
    # life 1 dies by itself after recording group 5's ids, before publishing its segment
    recv = _receiver(tmp_path, port, 1, {**drop, CRASH_ENV: "ingest_after_record@5"}, catalog)
    senders = {"s1": sender("s1", 1), "s2": sender("s2", 1)}
    assert recv.wait(timeout=120) == -9
    # life 2 dies after staging group 3's segment, before recording its ids
    recv = _receiver(tmp_path, port, 2, {**drop, CRASH_ENV: "ingest_after_stage@3"}, catalog)
    assert recv.wait(timeout=120) == -9
    recv = _receiver(tmp_path, port, 3, drop, catalog)
    deadline = time.monotonic() + 120
    while _new_events(port) < 1_500:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    senders["s1"].kill()  # a sender dies mid-stream; its outbox survives
    recv.kill()  # and the receiver, mid-batch
    recv = _receiver(tmp_path, port, 4, drop, catalog)
    senders["s1"] = sender("s1", 2)
    try:
        for name, proc in senders.items():
            assert proc.wait(timeout=300) == 0, (tmp_path / f"{name}-2.out").read_text()
    finally:
        for proc in senders.values():
            proc.kill()
        health = _health(port)
        recv.kill()
    assert health is not None
    ids = []
    for seg in EventLog(tmp_path / "log").segments():
        ids += pq.read_table(seg.path, columns=["event_id"]).column(0).to_pylist()
    expected = {f"{s}/{generated_id(id_key(tmp_path / f'{s}.db'), s, i)}"
                for s in ("s1", "s2") for i in range(per_sender)}
    assert len(ids) == len(set(ids)), "an event was published twice"
    assert set(ids) == expected
    outs = "".join(p.read_text() for p in tmp_path.glob("receiver*.out"))
    assert "crash point ingest_after_record" in outs and "crash point ingest_after_stage" in outs
    assert '"recovered_segments": 1' in (tmp_path / "receiver2.out").read_text()
    assert health["receiver"]["events_duplicate"] > 0  # type: ignore[index]  # dropped acks were retried
    assert int(health["system_lag_us"]) >= 3_600_000_000  # type: ignore[call-overload]  # GC delay 1h
    assert not list((tmp_path / "log").glob(".ingest-*"))
