"""Property test of the receiver's request path, against a real receiver process.

Any bytes, any JSON, any field values, with or without a valid token -> a 2xx or 4xx answer
and the receiver still up. Afterwards the log and the catalog agree: every id the catalog
holds is in the log exactly once, every acked id is in the log, and nothing of a refused
request is in either.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest.receiver_proc import Receiver, catalog_ids, log_ids, write_tokens

pytestmark = pytest.mark.faults

NOW = time.time_ns() // 1000
HOUR = 3_600_000_000

texts = st.one_of(
    st.sampled_from(["a", "b", "ev-1", "ev-2", "", " ", "x" * 300, "é" * 130, "a/b", "{[,]}", "a\x00b",
                     "a\x00", "\ud800", "a\u2028b", "a\tb", "\x7f", "ok"]),
    st.text(max_size=20),
)
ints = st.one_of(
    st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 2**63, 2**64, NOW, NOW - 2 * HOUR, NOW + HOUR]),
    st.integers(min_value=NOW - 2 * HOUR, max_value=NOW + 600_000_000),
    st.integers(),
)
anything = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                        max_leaves=12)


@st.composite
def events(draw: st.DrawFn) -> Any:
    """An event whose every field may be valid, hostile, of the wrong type, missing or extra."""
    ev: dict[str, Any] = {
        "event_id": draw(st.one_of(texts, texts, texts, anything)),
        "sender": draw(st.sampled_from(["alice", "alice", "alice", "mallory", "a/b", "", "al\x00ice"])),
        "system_time": draw(st.one_of(st.just("now"), ints, ints, anything)),
        "user": draw(st.one_of(texts, texts, anything)),
        "event_time": draw(st.one_of(st.just("now"), ints, anything)),
        "bytes": draw(st.one_of(st.integers(min_value=0, max_value=10**6), ints, anything)),
    }
    for k in ("system_time", "event_time"):
        if ev[k] == "now":
            ev[k] = time.time_ns() // 1000
    if draw(st.integers(0, 9)) == 0:
        ev.pop(draw(st.sampled_from(sorted(ev))))
    if draw(st.integers(0, 9)) == 0:
        ev[draw(texts)] = draw(anything)
    return ev if draw(st.integers(0, 19)) else draw(anything)


@st.composite
def good_events(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event of alice's, ids from a small pool (so some are duplicates)."""
    now = time.time_ns() // 1000
    return {"event_id": draw(st.sampled_from([f"g{i}" for i in range(40)] + ["é/ü", "a b", "{x}"])),
            "sender": "alice", "system_time": now - draw(st.integers(0, HOUR)),
            "user": draw(st.text(max_size=8).filter(str.isprintable)),
            "event_time": now - draw(st.integers(0, HOUR)), "bytes": draw(st.integers(0, 10**6))}


bodies = st.one_of(
    st.lists(good_events(), min_size=1, max_size=12).map(lambda evs: json.dumps({"events": evs}).encode()),
    st.lists(good_events(), min_size=1, max_size=12).map(lambda evs: json.dumps({"events": evs}).encode()),
    st.binary(max_size=300),
    anything.map(lambda v: json.dumps(v).encode()),
    st.lists(events(), max_size=12).map(lambda evs: json.dumps({"events": evs}).encode()),
    st.lists(events(), max_size=12).map(lambda evs: json.dumps({"events": evs}).encode()),
    st.lists(events(), max_size=12).map(lambda evs: json.dumps({"events": evs}).encode()),
    st.lists(events(), max_size=12).map(lambda evs: json.dumps({"events": evs}, ensure_ascii=False)
                                        .encode("utf-8", "surrogatepass")),
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Receiver, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("prop")
    tokens = write_tokens(tmp, "alice", "mallory")
    r = Receiver(tmp / "log", tmp / "cat.db", tmp / "rx.out", "--tokens", str(tmp / "tokens"),
                 "--max-events", "50")
    yield r, tokens
    r.kill()


def _ids(raw: bytes) -> list[str]:
    try:
        doc = json.loads(raw)
        return [f"{e['sender']}/{e['event_id']}" for e in doc["events"]
                if isinstance(e, dict) and isinstance(e.get("event_id"), str)
                and isinstance(e.get("sender"), str)]
    except Exception:
        return []


def test_any_request_gets_a_2xx_or_4xx_and_log_and_catalog_agree(
        live: tuple[Receiver, dict[str, str]]) -> None:
    r, tokens = live
    acked: set[str] = set()
    refused: set[str] = set()
    statuses: dict[int, int] = {}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,  # the same requests each run
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bodies, st.sampled_from(["alice"] * 6 + ["mallory", None, "bogus-token-123456789"]))
    def one_request(raw: bytes, who: str | None) -> None:
        token = tokens.get(who, who) if who else None
        status, answer = r.post(raw, token)
        statuses[status] = statuses.get(status, 0) + 1
        assert 200 <= status < 300 or 400 <= status < 500, (status, answer, raw[:200])
        if status == 200:
            sent = _ids(raw)
            assert len(answer["statuses"]) == len(sent)
            acked.update(i for i, s in zip(sent, answer["statuses"], strict=True)
                         if s in ("new", "duplicate"))
        else:
            refused.update(_ids(raw))

    one_request()
    assert r.health() is not None and r.proc.p.poll() is None
    ids = log_ids(r.log)  # every segment readable and valid UTF-8
    assert len(ids) == len(set(ids)), "an event is in the log twice"
    assert sorted(catalog_ids(r.catalog)) == sorted(ids)
    assert acked <= set(ids), "an acked event is missing from the log"
    assert not (refused - acked) & set(ids), "an event of a refused request is in the log"
    # enough of both kinds to mean something (measured on 2026-11-25: 27 and 29 accepted of 300 requests,
    # 243-272 refused; the count varies from run to run, so the floor leaves room)
    assert statuses.get(200, 0) >= 20 and sum(v for k, v in statuses.items() if k >= 400) >= 50, statuses
