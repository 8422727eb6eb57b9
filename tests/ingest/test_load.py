"""Load on loopback: honest senders and a hostile client at once.

Eight ``onceflow send`` processes deliver their events while a hostile client (with a valid
token of its own: a buggy or compromised sender) keeps sending oversized, flooded, nested,
malformed, non-UTF-8, spoofed and slow requests, and clients without a token knock too.
Throughout, ``/v1/health`` must answer within 1 s and the receiver's RSS stay under 512 MB;
at the end every honest event is in the log exactly once (verify's ingest check).
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from onceflow.ingest.sender import generated_id, id_key
from onceflow.verify.ingest_rig import check_log
from tests.ingest.receiver_proc import Proc, Receiver, body, event, write_tokens

pytestmark = pytest.mark.faults

SENDERS = 8
PER_SENDER = 5_000
RSS_BOUND_MB = 512


def _hostile(r: Receiver, token: str, stop: threading.Event, answers: dict[int, int]) -> None:
    rng = random.Random(7)
    cap = 2_000 * 2048 + 1024
    flood = b'{"events":[' + b"{}," * (cap // 3 - 10) + b"{}]}"
    nested = b'{"events":' + b"[" * (cap // 2 - 20) + b"]" * (cap // 2 - 20) + b"}"
    bad = [flood, nested, b"null", b"\xff" * 1000, b'{"events": [1, 2', b"{" * 10_000,
           body(event("x" * 100_000, "mallory")), body(*[event(f"v{i}", "s0") for i in range(100)]),
           body(event("a\x00b", "mallory")), body(event("late", "mallory", system_time=2**63 - 1))]
    while not stop.is_set():
        kind = rng.randrange(len(bad) + 2)
        try:
            if kind == len(bad):  # claims a body far above the limit
                with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
                    s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                              + token.encode() + b"\r\nContent-Length: 500000000\r\n\r\n")
                    status = int(s.recv(100).split(b" ")[1])
            elif kind == len(bad) + 1:  # a slow upload, abandoned
                s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
                s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                          + b"\r\nContent-Length: 3000000\r\n\r\n{\"events\": [")
                threading.Timer(5, s.close).start()
                status = 0
            else:
                status, _ = r.post(bad[kind], token if rng.random() < 0.8 else None)
        except OSError:
            status = -1
        answers[status] = answers.get(status, 0) + 1


def test_honest_senders_arrive_exactly_once_under_attack(tmp_path: Path) -> None:
    names = [f"s{i}" for i in range(SENDERS)]
    tokens = write_tokens(tmp_path, *names, "mallory")
    r = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx.out",
                 "--tokens", str(tmp_path / "tokens"), "--max-events", "2000", "--body-timeout", "3s")
    stop = threading.Event()
    answers: dict[int, int] = {}
    worst = {"health_s": 0.0, "rss_mb": 0.0}

    def watch() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{r.port}/v1/health", timeout=5) as resp:
                    json.loads(resp.read())
                took = time.monotonic() - t0
            except OSError:
                took = 99.0
            worst["health_s"] = max(worst["health_s"], took)
            worst["rss_mb"] = max(worst["rss_mb"], r.proc.rss_mb())
            time.sleep(0.2)

    for name in names:
        (tmp_path / f"{name}.token").write_text(tokens[name])
    threads = [threading.Thread(target=watch)] + [
        threading.Thread(target=_hostile, args=(r, tokens["mallory"], stop, answers)) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        time.sleep(1)
        senders = [Proc(["send", "--url", f"http://127.0.0.1:{r.port}", "--outbox", str(tmp_path / f"{n}.db"),
                         "--sender-id", n, "--token-file", str(tmp_path / f"{n}.token"),
                         "--events", str(PER_SENDER), "--batch-size", "500", "--rate", "800"],
                        tmp_path / f"{n}.out") for n in names]
        for n, p in zip(names, senders, strict=True):
            assert p.wait(timeout=300) == 0, (tmp_path / f"{n}.out").read_text()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        alive = r.proc.p.poll() is None
        r.kill()
    assert alive, (tmp_path / "rx.out").read_text()[-3000:]
    expected = {f"{n}/{generated_id(id_key(tmp_path / f'{n}.db'), n, i)}"
                for n in names for i in range(PER_SENDER)}
    chk = check_log(tmp_path / "log", expected)
    assert chk.ok, chk.violations
    assert chk.rows_in_log == SENDERS * PER_SENDER
    hostile = sum(answers.values())
    assert hostile >= 50 and not any(500 <= s < 600 and s != 503 for s in answers), answers
    assert worst["health_s"] < 1.0, worst
    assert worst["rss_mb"] < RSS_BOUND_MB, worst
    print(f"load: {hostile} hostile requests {answers}; worst health {worst['health_s']:.3f} s, "
          f"peak RSS {worst['rss_mb']:.0f} MB")
