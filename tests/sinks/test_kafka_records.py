"""The Kafka sink's records, encoded a column at a time, equal the row-by-row JSON of each row.

``kafka_records.objects`` builds the JSON with Arrow kernels; ``row_json`` is ``json.dumps`` of
the row's Python values. Random tables of every type the kernels take (and some they hand to
``json.dumps``), with nulls, quotes, backslashes, control characters, non-ASCII text, NaN,
edge timestamps, must come out byte for byte the same.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pyarrow as pa
import pytest

from onceflow import Table
from onceflow.sinks.kafka.records import encode, fragments, objects, row_json

PLAIN = ['a', 'Z', '0', ' ', 'é', '€', '😀', '/', '{', ',', ':']
EXTRA = [[], ['\\'], ['"'], ['\\', '"'], ['\n', '\t', '\x00', '\x1f'], ['"', '\\', '\n', '\x00']]
"""A column's letters: plain ones plus one of these (each path of the escaping taken)."""


def _text(rng: random.Random, extra: list[str]) -> str:
    letters = PLAIN + extra * 3
    return "".join(rng.choice(letters) for _ in range(rng.randrange(0, 8)))


def _column(rng: random.Random, kind: str, n: int, nulls: bool) -> pa.Array:
    def maybe(v: object) -> object:
        return None if nulls and rng.random() < 0.2 else v

    special = rng.choice(EXTRA)
    base = dt.datetime(2026, 6, 1, 12, 0, 0)
    if kind == "string":
        return pa.array([maybe(_text(rng, special)) for _ in range(n)], pa.string())
    if kind == "large_string":
        return pa.array([maybe(_text(rng, special)) for _ in range(n)], pa.large_string())
    if kind in ("int8", "int32", "int64", "uint64"):
        t = getattr(pa, kind)()
        lo, hi = {"int8": (-128, 127), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
                  "uint64": (0, 2**64 - 1)}[kind]
        return pa.array([maybe(rng.choice([lo, hi, 0, rng.randint(lo, hi)])) for _ in range(n)], t)
    if kind == "bool":
        return pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_())
    if kind in ("float64", "float32"):
        pool = [0.0, -0.0, 1.0, 0.1, 1e16, 1e-7, 1.2345678901234567e300, float("nan"), float("inf"), -2.5]
        return pa.array([maybe(rng.choice(pool) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6))
                         for _ in range(n)], getattr(pa, kind)())
    if kind == "date32":
        return pa.array([maybe(dt.date(rng.choice([1, 999, 1970, 2026, 9999]), 1 + rng.randrange(12), 1))
                         for _ in range(n)], pa.date32())
    if kind.startswith("ts"):
        unit, tz = {"ts_us": ("us", None), "ts_us_utc": ("us", "UTC"), "ts_ms": ("ms", None),
                    "ts_s_utc": ("s", "UTC"), "ts_paris": ("us", "Europe/Paris")}[kind]
        values = []
        for _ in range(n):
            edges = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)]
            edges = edges if tz != "Europe/Paris" else []  # Python's datetime overflows there
            v = rng.choice([*edges, base, base + dt.timedelta(microseconds=rng.randrange(10**12))])
            if unit == "ms":
                v = v.replace(microsecond=v.microsecond // 1000 * 1000)
            if unit == "s":
                v = v.replace(microsecond=0)
            values.append(maybe(v))
        return pa.array(values, pa.timestamp(unit)).cast(pa.timestamp(unit, tz)) if tz else \
            pa.array(values, pa.timestamp(unit))
    if kind == "decimal":
        return pa.array([maybe(decimal.Decimal(rng.randrange(-10**6, 10**6)) / 100) for _ in range(n)],
                        pa.decimal128(10, 2))
    if kind == "binary":
        return pa.array([maybe(bytes(rng.randrange(256) for _ in range(3))) for _ in range(n)], pa.binary())
    if kind == "list":
        return pa.array([maybe([rng.randrange(5) for _ in range(rng.randrange(3))]) for _ in range(n)],
                        pa.list_(pa.int64()))
    if kind == "struct":
        return pa.array([maybe({"x": _text(rng, special), "y": rng.randrange(9)}) for _ in range(n)],
                        pa.struct([("x", pa.string()), ("y", pa.int64())]))
    raise AssertionError(kind)


KINDS = ["string", "large_string", "int8", "int32", "int64", "uint64", "bool", "float64", "float32",
         "date32", "ts_us", "ts_us_utc", "ts_ms", "ts_s_utc", "ts_paris", "decimal", "binary", "list",
         "struct"]


@pytest.mark.parametrize("seed", range(40))
def test_objects_equal_row_json(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 7, 200])
    kinds = rng.sample(KINDS, rng.randrange(1, 7))
    names = [rng.choice(["id", "a b", 'q"uote', "é", "x\\y", "n"]) + str(i) for i in range(len(kinds))]
    table = pa.table({name: _column(rng, kind, n, nulls=rng.random() < 0.6)
                      for name, kind in zip(names, kinds, strict=True)})
    got = objects(table, names).to_pylist()
    want = [row_json(row).decode() for row in table.to_pylist()]
    assert got == want, (kinds, [(g, w) for g, w in zip(got, want, strict=True) if g != w][:3])
    for name in names:  # one column alone: the value's text inside an object, a null as null
        want_col = [row_json({"c": v}).decode()[len('{"c":'):-1] for v in table.column(name).to_pylist()]
        assert fragments(table.column(name)).to_pylist() == want_col


def test_keys_and_values_follow_the_rules() -> None:
    table = pa.table({"id": ["k1", 'k"2'], "n": pa.array([1, 2], pa.int64()), "value": ["v1", None]})
    keys, values = encode(table, Table(key="id"))
    assert keys == [b"k1", b'k"2']  # one string key column: its bytes
    assert values == [row_json(r) for r in table.to_pylist()]  # more than key + value: the row
    keys, values = encode(table.select(["id", "value"]), Table(key="id"))
    assert values == [b"v1", None]  # only key + value: the value's bytes
    keys, values = encode(table, Table(key=["id", "n"]))
    assert keys == [b'{"id":"k1","n":1}', b'{"id":"k\\"2","n":2}']  # several: a JSON object
    keys, _ = encode(table, Table(key="n"))
    assert keys == [b'{"n":1}', b'{"n":2}']  # one non-text key: a JSON object
    keys, values = encode(table.select(["value"]), Table())
    assert keys == [None, None] and values == [b"v1", None]
    binary = pa.table({"id": pa.array([b"\x00\xff"], pa.binary()), "value": pa.array([b"\x01"], pa.binary())})
    assert encode(binary, Table(key="id")) == ([b"\x00\xff"], [b"\x01"])
    numbers = pa.table({"id": ["a"], "value": pa.array([5], pa.int64())})
    assert encode(numbers, Table(key="id")) == ([b"a"], [b"5"])
