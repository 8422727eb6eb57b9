from __future__ import annotations

import json

import pytest

from onceflow.ingest.events import EventBatchError, parse_batch


def ev(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"event_id": "e1", "sender": "s", "system_time": 10, "user": "u",
                               "event_time": 5, "bytes": 7}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not ...}


def body(*events: object, **top: object) -> bytes:
    return json.dumps({"events": list(events), **top}).encode()


def test_valid_batch_becomes_columns() -> None:
    t = parse_batch(body(ev(), ev(event_id="e2", bytes=0)), 10)
    assert t.column("event_id").to_pylist() == ["e1", "e2"]
    assert t.column("system_time").to_pylist() == [10, 10]
    assert parse_batch(body(), 10).num_rows == 0


@pytest.mark.parametrize(("event", "reason"), [
    (ev(event_id=""), "event_id is empty"),
    (ev(event_id="   "), "event_id is empty"),
    (ev(event_id="x" * 300), "longer than 256"),
    (ev(event_id=...), "missing fields ['event_id']"),
    (ev(sender=""), "sender is empty"),
    (ev(system_time="10"), "system_time must be an integer, got str"),
    (ev(system_time=1.5), "system_time must be an integer, got float"),
    (ev(system_time=True), "system_time must be an integer, got bool"),
    (ev(system_time=0), "system_time must be > 0"),
    (ev(bytes=-1), "bytes must be >= 0"),
    (ev(user=None), "user must be a string, got NoneType"),
    (ev(colour="red"), "unknown fields ['colour']"),
    (3, "an event must be a JSON object"),
])
def test_one_bad_event_rejects_the_batch_with_its_reason(event: object, reason: str) -> None:
    with pytest.raises(EventBatchError) as info:
        parse_batch(body(ev(event_id="ok"), event), 10)
    err = info.value
    assert err.status == 400
    assert "none accepted" in err.error
    assert [r["index"] for r in err.rejected] == [1]
    assert reason in err.rejected[0]["reason"]


@pytest.mark.parametrize(("raw", "status", "message"), [
    (b"{not json", 400, "malformed JSON"),
    (b'{"event": []}', 400, 'the body must be {"events"'),
    (b'[1, 2]', 400, 'the body must be {"events"'),
    (body(ev(), extra=1), 400, "unknown top-level fields ['extra']"),
    (body(*[ev(event_id=f"e{i}") for i in range(11)]), 413, "limit is 10"),
])
def test_malformed_and_oversized_bodies(raw: bytes, status: int, message: str) -> None:
    with pytest.raises(EventBatchError) as info:
        parse_batch(raw, 10)
    assert info.value.status == status
    assert message in info.value.error
