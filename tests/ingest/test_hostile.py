"""The ingest receiver against hostile and buggy clients: each finding of the audit, as a test.

Every test runs a real ``onceflow ingest serve`` process on loopback and talks raw HTTP to
it. Afterwards the receiver must still be up, and the log and the catalog must agree: every
id the catalog holds is in the log exactly once, and nothing of a refused request is in either.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.verify.crashes import CRASH_ENV
from tests.ingest.receiver_proc import Receiver, body, catalog_ids, event, log_ids, write_tokens

pytestmark = pytest.mark.faults


def _agree(rx: Receiver) -> list[str]:
    ids = log_ids(rx.log)
    assert len(ids) == len(set(ids)), "an event is in the log twice"
    assert sorted(catalog_ids(rx.catalog)) == sorted(ids), "catalog and log disagree"
    assert not list(rx.log.glob(".ingest-*"))
    return ids


@pytest.fixture
def rx(tmp_path: Path) -> Iterator[tuple[Receiver, dict[str, str]]]:
    tokens = write_tokens(tmp_path, "alice", "mallory")
    r = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx.out",
                 "--tokens", str(tmp_path / "tokens"), "--body-timeout", "2s", "--max-events", "1000")
    yield r, tokens
    r.kill()


def test_nul_and_control_characters_in_ids_are_refused(rx: tuple[Receiver, dict[str, str]]) -> None:
    r, tok = rx
    for eid in ["a\x00b", "a\x00", "a\nb", "a\u200bb"]:
        for _ in range(2):
            status, answer = r.post(body(event(eid, "alice")), tok["alice"])
            assert status == 400 and "control or invisible" in answer["rejected"][0]["reason"]
    status, answer = r.post(body(event("a", "alice")), tok["alice"])
    assert status == 200 and answer["statuses"] == ["new"]  # was answered duplicate before the fix
    assert _agree(r) == ["alice/a"]


@pytest.mark.parametrize("field", ["event_id", "sender", "user"])
def test_bytes_that_are_not_utf8_are_refused_in_every_field(rx: tuple[Receiver, dict[str, str]],
                                                            field: str) -> None:
    r, tok = rx
    good = event("ok-1", "alice")
    raw = body(good, {**good, "event_id": "ok-2", field: "PLACEHOLDER"})
    raw = raw.replace(b"PLACEHOLDER", b"x\xff\xfey")
    status, answer = r.post(raw, tok["alice"])
    assert status == 400 and "not valid UTF-8" in answer["error"]
    assert r.health() is not None  # the receiver did not exit
    assert r.post(body(good), tok["alice"])[0] == 200
    assert _agree(r) == ["alice/ok-1"]  # every segment reads as valid UTF-8


def test_no_token_no_entry_and_no_sender_can_spoof_or_squat(rx: tuple[Receiver, dict[str, str]]) -> None:
    r, tok = rx
    victims = [event(f"ev-alice-{i}", "alice") for i in range(5)]
    assert r.post(body(*victims))[0] == 401
    assert r.post(body(*victims), "not-a-token-at-all")[0] == 401
    status, answer = r.post(body(*victims), tok["mallory"])  # mallory claims to be alice
    assert status == 403 and "authenticated 'mallory'" in answer["error"]
    squat = [event(f"ev-alice-{i}", "mallory", bytes=999999) for i in range(5)]
    assert r.post(body(*squat), tok["mallory"])[1]["statuses"] == ["new"] * 5  # in mallory's namespace
    status, answer = r.post(body(*victims), tok["alice"])
    assert status == 200 and answer["statuses"] == ["new"] * 5  # alice's events are not "duplicates"
    ids = _agree(r)
    assert sorted(ids) == sorted([f"alice/ev-alice-{i}" for i in range(5)] + [f"mallory/ev-alice-{i}"
                                                                            for i in range(5)])


def test_system_times_outside_the_window_are_never_new(rx: tuple[Receiver, dict[str, str]]) -> None:
    r, tok = rx
    now = time.time_ns() // 1000
    status, answer = r.post(body(event("past", "alice", system_time=1)), tok["alice"])
    assert status == 200 and answer["statuses"] == ["too_old"]  # a fresh catalog, GC never ran
    for kw in ({"system_time": 2**63 - 1}, {"system_time": now + 3_600_000_000}, {"event_time": 2**62}):
        status, answer = r.post(body(event("future", "alice", **kw)), tok["alice"])
        assert status == 400 and "ahead of the receiver's clock" in answer["rejected"][0]["reason"]
    assert r.post(body(event("now", "alice")), tok["alice"])[1]["statuses"] == ["new"]
    assert _agree(r) == ["alice/now"]
    health = r.health()
    assert health is not None and health["catalog"]["too_old"] == 1


def test_oversized_flooded_and_nested_bodies_are_refused_cheaply(rx: tuple[Receiver, dict[str, str]]) -> None:
    r, tok = rx
    with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:  # claims 60 MB, sends none
        s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + tok["alice"].encode() + b"\r\nContent-Length: 62914560\r\n\r\n")
        assert b" 413 " in s.recv(4096).split(b"\r\n")[0] + b" "
    cap = 1000 * 2048 + 1024
    hostile = [
        b'{"events":[' + b"{}," * (cap // 3 - 10) + b"{}]}",  # ~680k empty objects
        b'{"events":' + b"[" * (cap // 2 - 20) + b"]" * (cap // 2 - 20) + b"}",
        b'{"events":[' + b'{"a":' * 200 + b"1" + b"}" * 200 + b"]}",
        b"[" * 5000,
        b'{"events": [1, 2, 3]}',
        b"\x00" * 1000,
        b"",
    ]
    for raw in hostile:
        status, _ = r.post(raw, tok["alice"])
        assert status in (400, 413), raw[:40]
    status, answer = r.post(body(event("x" * 1_000_000, "alice")), tok["alice"])
    assert status == 400 and len(json.dumps(answer)) < 2_000  # the id is not echoed whole
    assert r.health() is not None and r.proc.rss_mb() < 512
    assert _agree(r) == []


def test_slow_uploads_time_out_and_health_stays_responsive(rx: tuple[Receiver, dict[str, str]]) -> None:
    r, tok = rx
    socks = []
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", r.port), timeout=30)
        s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + tok["alice"].encode() + b"\r\nContent-Length: 1000000\r\n\r\n"
                  b'{"events": [')
        socks.append(s)
    t0 = time.monotonic()
    for _ in range(5):
        started = time.monotonic()
        assert r.health() is not None and time.monotonic() - started < 1.0
        time.sleep(0.2)
    answers = []
    for s in socks:
        answers.append(s.recv(4096).split(b"\r\n")[0])
        s.close()
    assert all(b" 408 " in a + b" " for a in answers), answers
    assert time.monotonic() - t0 < 15  # closed at the 2 s body timeout, not left open
    assert r.post(body(event("after", "alice")), tok["alice"])[0] == 200


def test_a_staged_segment_lost_to_a_power_failure_gives_its_ids_back(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, "alice")
    args = ("--tokens", str(tmp_path / "tokens"))
    first = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx1.out", *args,
                     env={CRASH_ENV: "ingest_after_record@1"})
    batch = body(*[event(f"e{i}", "alice") for i in range(50)])
    with pytest.raises(OSError):  # the receiver dies after recording the ids, before publishing
        first.post(batch, tokens["alice"])
    assert first.proc.wait(timeout=30) == -9
    staged = list((tmp_path / "log").glob(".ingest-*.tmp"))
    assert len(staged) == 1 and len(catalog_ids(tmp_path / "cat.db")) == 50
    staged[0].unlink()  # what a power loss does to a file whose directory entry never reached the disk
    second = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx2.out", *args)
    try:
        out = (tmp_path / "rx2.out").read_text()
        assert "took back its 50 ids" in out
        status, answer = second.post(batch, tokens["alice"])  # the sender's retry
        assert status == 200 and answer["statuses"] == ["new"] * 50  # not "duplicate": never in the log
        assert sorted(_agree(second)) == sorted(f"alice/e{i}" for i in range(50))
    finally:
        second.kill()


def test_a_lost_catalog_connection_is_a_503_then_the_receiver_reconnects(tmp_path: Path,
                                                                        pg_dsn: str) -> None:
    import psycopg

    tokens = write_tokens(tmp_path, "alice")
    r = Receiver(tmp_path / "log", None, tmp_path / "rx.out", "--tokens", str(tmp_path / "tokens"),
                 env={"ONCEFLOW_CATALOG_DSN": pg_dsn})
    try:
        first = body(*[event(f"a{i}", "alice") for i in range(100)])
        second = body(*[event(f"b{i}", "alice") for i in range(100)])
        assert r.post(first, tokens["alice"])[0] == 200
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the server drops the receiver's session
            killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                                  "datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]
        assert killed >= 1
        status, answer = r.post(second, tokens["alice"])
        assert status == 503 and "not committed, retry" in answer["error"]
        health = r.health()
        assert health is not None and health["state"] == "ok"  # recovered on a new session
        assert r.post(second, tokens["alice"])[1]["statuses"] == ["new"] * 100  # the sender's retry
        assert r.post(first, tokens["alice"])[1]["statuses"] == ["duplicate"] * 100
        ids = log_ids(r.log)
        assert sorted(ids) == sorted(f"alice/{x}{i}" for x in "ab" for i in range(100))
    finally:
        r.kill()


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "6m")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("full", ["log and catalog", "log only"])
def test_a_full_disk_is_a_507_and_nothing_is_lost_once_space_is_back(small_disk: Path, tmp_path: Path,
                                                                     full: str) -> None:
    tokens = write_tokens(tmp_path, "alice")
    catalog = small_disk / "cat.db" if full == "log and catalog" else tmp_path / "cat.db"
    r = Receiver(small_disk / "log", catalog, tmp_path / "rx.out", "--tokens", str(tmp_path / "tokens"))
    try:
        filler = small_disk / "filler"
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        filler.write_bytes(b"\0" * (free - 400_000))
        batches = [body(*[event(f"b{b}-{i}-" + "x" * 60, "alice") for i in range(500)]) for b in range(40)]
        acked, errors = set(), []
        for i, raw in enumerate(batches):
            status, answer = r.post(raw, tokens["alice"])
            if status == 200:
                acked.add(i)
            else:
                assert status in (503, 507), answer
                errors.append(answer["error"])
        assert errors and all("full" in e for e in errors), errors
        assert all(("disk holding" in e) == (full == "log and catalog") for e in errors), errors
        assert r.health() is not None  # the receiver did not exit
        filler.unlink()
        for i, raw in enumerate(batches):  # the senders retry what was not acked
            if i not in acked:
                status, answer = r.post(raw, tokens["alice"])
                assert status == 200, answer
        ids = _agree(r)
        assert len(ids) == 40 * 500
    finally:
        r.kill()


def test_a_read_only_log_or_catalog_is_refused_at_start(small_disk: Path, tmp_path: Path) -> None:
    (small_disk / "log").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for log, catalog in ((small_disk / "log", tmp_path / "cat.db"),
                         (tmp_path / "log", small_disk / "cat.db")):
        res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log", str(log),
                              "--catalog", str(catalog), "--port", "0"], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode != 0
        assert "Read-only file system" in res.stderr or "read-only" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
