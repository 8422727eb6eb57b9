from __future__ import annotations

import json

import pytest

from onceflow.ingest.events import EventBatchError, Limits, parse_batch, scoped_ids


def ev(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"event_id": "e1", "sender": "s", "system_time": 10, "user": "u",
                               "event_time": 5, "bytes": 7}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not ...}


def body(*events: object, **top: object) -> bytes:
    return json.dumps({"events": list(events), **top}).encode()


NOW = 1_800_000_000_000_000  # the receiver's clock in these tests (2027)


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
    (ev(sender=""), "sender must match"),
    (ev(sender="a/b"), "sender must match"),
    (ev(sender="s" * 65), "sender must match"),
    (ev(event_id="a\x00b"), "control or invisible"),
    (ev(event_id="a\nb"), "control or invisible"),
    (ev(event_id="a\u200bb"), "control or invisible"),
    (ev(event_id="é" * 129), "longer than 256 bytes"),
    (ev(user="a\x00b"), "user has a control character"),
    (ev(user="u" * 257), "user longer than 256 bytes"),
    (ev(event_time=-1), "event_time must be >= 0"),
    (ev(system_time=2**63 - 1), "ahead of the receiver's clock"),
    (ev(event_time=2**62), "ahead of the receiver's clock"),
    (ev(system_time=2**64), "must fit in 64 bits"),
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
        parse_batch(body(ev(event_id="ok"), event), 10, now_us=NOW)
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


def test_ids_and_names_at_their_limits_are_fine() -> None:
    t = parse_batch(body(ev(event_id="é" * 128, user="u" * 256, sender="S._-9" * 12 + "abcd"),
                         ev(event_id="x y", system_time=NOW + 300_000_000, event_time=0)), 10, now_us=NOW)
    assert t.num_rows == 2


@pytest.mark.parametrize("field", ["event_id", "sender", "user"])
def test_bytes_that_are_not_utf8_are_refused_in_every_field(field: str) -> None:
    raw = body(ev(**{field: "PLACEHOLDER"})).replace(b"PLACEHOLDER", b"a\xffb")
    with pytest.raises(EventBatchError, match="not valid UTF-8") as info:
        parse_batch(raw, 10)
    assert info.value.status == 400


def test_escaped_lone_surrogates_are_refused() -> None:
    with pytest.raises(EventBatchError) as info:
        parse_batch(body(ev()).replace(b'"e1"', b'"a\\ud800"'), 10, now_us=NOW)
    assert info.value.status == 400


@pytest.mark.parametrize(("raw", "status"), [
    (b'{"events":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 413),  # deeply nested
    (b'{"events":[' + b"{}," * 200_000 + b"{}]}", 413),  # a flood of empty objects
    (b'{"events":[' + b'{"a":' * 500 + b"1" + b"}" * 500 + b"]}", 400),  # nested, fewer values
    (b'{"events":[' + b"1," * 100 + b"1]}", 400),
])
def test_hostile_bodies_are_refused_before_parsing(raw: bytes, status: int) -> None:
    with pytest.raises(EventBatchError) as info:
        parse_batch(raw, 10_000)
    assert info.value.status == status


def test_body_size_is_tied_to_max_events() -> None:
    limits = Limits(max_events=10)
    with pytest.raises(EventBatchError, match="request body of") as info:
        parse_batch(b" " * (limits.max_body_bytes + 1), limits)
    assert info.value.status == 413


def test_rejections_cut_long_ids_and_list_at_most_100() -> None:
    events = [ev(event_id="x" * 100_000, bytes=-1)] + [ev(event_id=f"e{i}", bytes=-1) for i in range(300)]
    with pytest.raises(EventBatchError) as info:
        parse_batch(body(*events), Limits(max_events=400, max_clock_skew_s=300), now_us=NOW)
    err = info.value
    assert "301 of 301 events invalid" in err.error and "201 more not listed" in err.error
    assert len(err.rejected) == 100
    assert len(json.dumps(err.to_json())) < 20_000
    assert err.rejected[0]["event_id"] == "x" * 64 + "...(100000 chars)"


def test_strings_full_of_braces_and_commas_still_parse() -> None:
    # the cheap value count sees braces inside strings; a second count without strings decides
    events = [ev(event_id=f"{{[,{i}" * 10, user="a, b, {c}" * 20) for i in range(50)]
    assert parse_batch(body(*events), 50, now_us=NOW).num_rows == 50


def test_scoped_ids_join_sender_and_id() -> None:
    t = parse_batch(body(ev(sender="a", event_id="x/y"), ev(sender="a.x", event_id="y")), 10, now_us=NOW)
    assert scoped_ids(t).to_pylist() == ["a/x/y", "a.x/y"]
