"""An input contract: which records are bad, decided before the user's transform, the same in every batch.

::

    raw = onceflow.read_kafka(spark, "broker:9092", subscribe="orders")
    orders = onceflow.expect(raw, json="value",
                             schema="order_id STRING, sku STRING, qty INT, event_ts TIMESTAMP",
                             required=["sku"], checks={"qty_not_negative": "qty >= 0"})
    clean = onceflow.deduplicate(orders, id="order_id", event_time="event_ts", within="10 minutes")
    onceflow.write_stream(clean, ..., rejects="rejected_orders")

A record is bad when (rules in this order; the first that applies is its reason):

1. ``parse``: with ``json=``, the column is null, is not a JSON object, or a field does not fit
   the declared schema (``"qty": "three"`` for ``qty INT``, ``"yesterday"`` for a timestamp);
   the reason names the field;
2. ``required``: a ``required=`` column is null;
3. ``check``: a ``checks=`` expression is false (SQL ``CHECK`` semantics: null passes; add the
   column to ``required=`` to refuse nulls);
4. ``id``: (added by :func:`onceflow.deduplicate`) an id column is null or empty — ids are never
   merged as one id;
5. ``event_time``: (added by :func:`onceflow.deduplicate`) the event time is null.

How it stays exactly once: the contract is a function of the source's own rows, applied to the
bare source DataFrame. In the stream, bad records are counted (a named ``observe`` metric,
``onceflow_contract_<token>``, also in the query's progress) and filtered out before anything
else. For a batch whose count is not zero, :mod:`onceflow.engine.rejects` reads the batch's input again
from the offsets in Spark's checkpoint, applies the same contract, and hands the bad records,
with their source coordinates, to the sink in the batch's own commit.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError, refuse_unknown
from onceflow.runtime import plans

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

CONTRACT = "contract"
"""The key under which :mod:`onceflow.runtime.plans` keeps the contract of the stream a rule returned."""
REASON = "__onceflow_reason"
"""The struct ``(rule, column, reason)`` of a bad record; null for a good one."""
RAW = "__onceflow_raw"
"""The source's own columns of a record, as a struct (re-reads only)."""
_PARSED = "__onceflow_parsed"
_CORRUPT = "__onceflow_corrupt"
_TEXT = "__onceflow_text"
METRIC_PREFIX = "onceflow_contract_"
_TOKEN_RE = re.compile(METRIC_PREFIX + r"([0-9a-f]{12})")

_CONTRACTS: dict[str, Contract] = {}


def source_of(df: DataFrame) -> plans.Leaf | None:
    """The source of a DataFrame that is a bare streaming source (``spark.readStream...load()``).

    Returns:
        The source, or None when ``df`` is not one source read as it is (a transformed, joined
        or unioned stream). Its ``kind`` is ``file`` (Spark's file sources) or ``kafka`` (what
        :func:`onceflow.read_kafka` returned, read with either connector; its format is
        ``onceflow_kafka``, whose range reader reads a batch again).
    """
    given = plans.recall(df, plans.KAFKA_OPTIONS)
    if given is not None:  # what onceflow.read_kafka returned (either connector)
        return plans.Leaf("kafka", "onceflow_kafka", dict(given), None)
    leaf = plans.bare_source(df)
    if leaf is None:
        return None
    if leaf.kind == "file":
        return leaf
    if leaf.kind == "onceflow_kafka":
        return plans.Leaf("kafka", "onceflow_kafka", leaf.options, None)
    return None


@dataclass(frozen=True)
class Rule:
    """One rule: its kind, the column it is about, and what it checks (a SQL expression or Column)."""

    kind: str
    column: str
    check: Any = None


@dataclass
class Contract:
    """The rules of one bare source DataFrame (see the module docstring).

    Attributes:
        raw: The bare streaming source DataFrame.
        source: Where its records come from.
        json: The column parsed as JSON (None: the source's columns are the records).
        schema: The declared schema of ``json``.
        keep: Source columns kept beside the parsed fields.
        rules: The rules, in the order they are tried.
        token: The contract's id (names its metric).
    """

    raw: DataFrame
    source: plans.Leaf
    json: str | None = None
    schema: Any = None
    keep: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(6))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the stream (Spark Connect ships the contract to the server's batch worker)."""
        state = dict(self.__dict__)
        state["raw_columns"] = self.output_columns() if self.json is None else None
        state["raw"] = None
        return state

    @property
    def metric(self) -> str:
        """The name of the stream's ``observe`` metric counting bad records."""
        return METRIC_PREFIX + self.token

    def output_columns(self) -> list[str]:
        """The columns the contract's output has (what ``expect`` returns)."""
        if self.json is None:
            shipped = self.__dict__.get("raw_columns")
            return list(shipped) if self.raw is None and shipped is not None else list(self.raw.columns)
        return [*(f.name for f in self.schema.fields), *self.keep]

    def with_rules(self, more: Sequence[Rule]) -> Contract:
        """The same contract with more rules (a new token: a new stream)."""
        return Contract(self.raw, self.source, self.json, self.schema, self.keep, (*self.rules, *more))

    def frame(self, raw: DataFrame, passthrough: Sequence[str] = (), with_raw: bool = False) -> DataFrame:
        """``raw`` with the output columns and :data:`REASON` (plus ``passthrough`` and :data:`RAW`).

        Args:
            raw: The source's rows (the stream, or one batch read again).
            passthrough: Extra columns of ``raw`` carried as they are (source coordinates).
            with_raw: Add the source's own columns as the struct :data:`RAW`.
        """
        from pyspark.sql import functions as F

        own = [c for c in raw.columns if c not in passthrough]
        extra = [F.col(c) for c in passthrough]
        if with_raw:
            extra.append(F.struct(*[F.col(f"`{c}`") for c in own]).alias(RAW))
        if self.json is None:
            df = raw.select(*[F.col(f"`{c}`") for c in own], *extra)
            parse: Column | None = None
        else:
            from pyspark.sql import types as T

            text = F.col(f"`{self.json}`").cast("string")
            schema = T.StructType([*self.schema.fields, T.StructField(_CORRUPT, T.StringType())])
            parsed = F.from_json(text, schema, {"columnNameOfCorruptRecord": _CORRUPT, "mode": "PERMISSIVE"})
            df = raw.select(*[F.col(f"`{k}`") for k in self.keep], text.alias(_TEXT),
                            parsed.alias(_PARSED), *extra)
            df = df.select("*", *[F.col(_PARSED)[f.name].alias(f.name) for f in self.schema.fields])
            parse = self._parse_reason(F.col(_TEXT), F.col(_PARSED))
        reasons = ([parse] if parse is not None else []) + [self._reason(r) for r in self.rules]
        reason = F.coalesce(*reasons) if reasons else F.lit(None).cast(_REASON_TYPE)
        return df.select(*self.output_columns(), *passthrough, *([RAW] if with_raw else []),
                         reason.alias(REASON))

    def _parse_reason(self, text: Column, parsed: Column) -> Column:
        from pyspark.sql import functions as F

        def why(column: Column, message: Column) -> Column:
            return F.struct(F.lit("parse").alias("rule"), column.alias("column"), message.alias("reason"))

        fields = [f for f in self.schema.fields]
        bad_field = F.coalesce(*[
            F.when(F.get_json_object(text, _json_path(f.name)).isNotNull() & parsed[f.name].isNull(),
                   F.lit(f.name)) for f in fields]) if fields else F.lit(None).cast("string")
        raw_value = F.coalesce(*[F.when(F.lit(f.name) == bad_field,
                                        F.get_json_object(text, _json_path(f.name))) for f in fields]) \
            if fields else F.lit(None).cast("string")
        types = {f.name: f.dataType.simpleString().upper() for f in fields}
        type_of = F.coalesce(*[F.when(F.lit(n) == bad_field, F.lit(t)) for n, t in types.items()]) \
            if types else F.lit(None).cast("string")
        src = F.lit(self.json)
        return (F.when(text.isNull(), why(src, F.lit(f"{self.json} is null")))
                .when(parsed.isNull() | (F.trim(text).substr(1, 1) != "{"),
                      why(src, F.lit(f"{self.json} is not a JSON object")))
                .when(parsed[_CORRUPT].isNotNull(),
                      why(F.coalesce(bad_field, src),
                          F.coalesce(F.concat(F.lit("field "), bad_field, F.lit(": "), raw_value,
                                              F.lit(" does not fit "), type_of),
                                     F.lit(f"{self.json} does not fit the declared schema")))))

    def _reason(self, rule: Rule) -> Column:
        from pyspark.sql import functions as F

        col = F.col(f"`{rule.column}`")
        if rule.kind == "required":
            bad, text = col.isNull(), f"column {rule.column!r} is null"
        elif rule.kind == "id":
            bad = col.isNull() | (F.trim(col.cast("string")) == "")
            text = f"id column {rule.column!r} is null or empty"
        elif rule.kind == "event_time":
            bad, text = col.isNull(), f"event time {rule.column!r} is null"
        else:
            expr = F.expr(rule.check) if isinstance(rule.check, str) else rule.check
            bad = F.coalesce(~expr, F.lit(False))
            shown = f": {rule.check}" if isinstance(rule.check, str) else ""
            text = f"check {rule.column!r} failed{shown}"
        return F.when(bad, F.struct(F.lit(rule.kind).alias("rule"), F.lit(rule.column).alias("column"),
                                    F.lit(text).alias("reason")))

    def apply(self) -> DataFrame:
        """The stream of good records: bad ones counted (the metric) and filtered out."""
        from pyspark.sql import functions as F

        df = self.frame(self.raw)
        df = df.observe(self.metric, F.count(F.col(REASON)).alias("rejected"))
        out = df.where(F.col(REASON).isNull()).select(*self.output_columns())
        _CONTRACTS[self.token] = self
        return out


_REASON_TYPE = "struct<rule:string,column:string,reason:string>"


def _json_path(name: str) -> str:
    return f"$.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"$['{name}']"


def contracts_in(df: DataFrame) -> list[Contract]:
    """The contracts whose streams feed ``df`` (found by their metric names in its plan)."""
    text = plans.analyzed_text(df)
    return [_CONTRACTS[t] for t in dict.fromkeys(_TOKEN_RE.findall(text)) if t in _CONTRACTS]


def rejected_count(spark: Any, query_id: str, contract: Contract) -> int | None:
    """Bad records the running batch's plan counted (summed over its runs); None if unreachable.

    Read inside ``foreachBatch`` after the batch's plan ran, from the plan Spark executed
    (:func:`onceflow.checkpoint.logs.plan_counts` reads its other metrics the same way).
    """
    try:
        query = spark.streams.get(query_id)
        plan = query._jsq.streamingQuery().lastExecution().executedPlan()
    except Exception:  # py4j: another Spark build, a query stopping
        return None
    todo = [plan]
    while todo:
        node = todo.pop()
        if node.getClass().getSimpleName() == "CollectMetricsExec" and str(node.name()) == contract.metric:
            row = node.collectedMetrics()
            return None if row.isNullAt(0) else int(row.getLong(0))
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))
    return None


def expect(df: DataFrame, *, json: str | None = None, schema: Any = None,
           required: str | Sequence[str] = (), checks: Mapping[str, Any] | None = None,
           keep: str | Sequence[str] = (), **unknown: Any) -> DataFrame:
    """Declare which records of a streaming source are bad; the result holds the good ones.

    Bad records are not dropped: :func:`onceflow.write_stream` sends them, exactly once and in
    their batch's commit, to its ``rejects=`` table with their source coordinates and the
    rule they broke — or, without ``rejects=``, stops the query naming the first one.

    Args:
        df: The streaming source as ``spark.readStream...load()`` or
            :func:`onceflow.read_kafka` returned it (untransformed: the contract is applied
            again to a batch's input read back from its offsets).
        json: A string or binary column holding a JSON object per record (e.g. Kafka's
            ``value``, a text file's ``value``); parsed with ``schema``.
        schema: The JSON's schema (DDL string or ``StructType``); required with ``json``.
        required: Columns that must not be null.
        checks: ``{name: SQL expression or Column}`` each good record satisfies, e.g.
            ``{"qty_not_negative": "qty >= 0"}`` (false breaks it; null passes, as in SQL).
        keep: With ``json``: source columns kept beside the parsed fields (e.g. ``timestamp``).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The streaming DataFrame of good records: the parsed fields (and ``keep``), or the
        source's columns.

    Raises:
        ConfigError: ``df`` is not a bare streaming source of files or ``onceflow_kafka``, an
            unknown column, a schema without ``json`` or the other way round, a bad check.
    """
    refuse_unknown(set(unknown), {"df", "json", "schema", "required", "checks", "keep"}, "onceflow.expect")
    source = _bare_source(df, "onceflow.expect")
    contract = Contract(df, source)
    if (json is None) != (schema is None):
        raise ConfigError("expect: json= and schema= go together (the column holding JSON, and its schema)")
    keeps = (keep,) if isinstance(keep, str) else tuple(keep)
    if json is not None:
        from pyspark.sql import types as T

        if json not in df.columns:
            raise ConfigError(f"expect: no column {json!r} to parse (the source has {df.columns})")
        try:
            parsed = T._parse_datatype_string(schema) if isinstance(schema, str) else schema
        except Exception as exc:
            raise ConfigError(f"expect: cannot read schema {schema!r}: {str(exc).splitlines()[0]}") from None
        if not isinstance(parsed, T.StructType):
            raise ConfigError(f"expect: schema must be a struct of fields, got {schema!r}")
        missing_keep = [k for k in keeps if k not in df.columns]
        if missing_keep:
            raise ConfigError(f"expect: keep= names {missing_keep}, not columns of the source ({df.columns})")
        clash = sorted(set(keeps) & set(parsed.fieldNames()))
        if clash:
            raise ConfigError(f"expect: keep= columns {clash} are also fields of the schema")
        contract = Contract(df, source, json, parsed, keeps)
    elif keeps:
        raise ConfigError("expect: keep= is for json= (the source's columns are kept as they are without it)")
    columns = contract.output_columns()
    names = (required,) if isinstance(required, str) else tuple(required)
    unknown_cols = [c for c in names if c not in columns]
    if unknown_cols:
        raise ConfigError(f"expect: required= names {unknown_cols}, not columns of the records ({columns})")
    rules = [Rule("required", c) for c in names]
    for name, check in (checks or {}).items():
        if not isinstance(check, str) and type(check).__name__ != "Column":
            raise ConfigError(f"expect: checks[{name!r}] must be a SQL expression string or a Column")
        rules.append(Rule("check", str(name), check))
    contract = contract.with_rules(rules)
    try:  # a check naming an unknown column fails here, not in the first batch
        out = contract.apply()
    except Exception as exc:
        if not checks:
            raise
        raise ConfigError(f"expect: a check cannot be evaluated: {str(exc).splitlines()[0][:300]}") from None
    plans.remember(out, CONTRACT, contract)
    return out


def _bare_source(df: DataFrame, where: str) -> plans.Leaf:
    if not df.isStreaming:
        raise ConfigError(f"{where} needs a streaming DataFrame (spark.readStream...)")
    source = source_of(df)
    if source is None:
        raise ConfigError(
            f"{where} takes the source DataFrame as spark.readStream...load() (a file source) or "
            "onceflow.read_kafka returned it, before any transformation: the rules are applied again "
            "to a batch's input read back from its offsets. Transform the DataFrame it returns instead")
    return source


def id_rules(df: DataFrame, ids: Sequence[str], event_time: str) -> DataFrame | None:
    """``df`` with the ``id`` and ``event_time`` rules of :func:`onceflow.deduplicate` in its contract.

    Returns:
        The new stream when the rules can route bad records (``df`` is what :func:`expect`
        returned, or a bare source); None when ``df`` was transformed after its source.
    """
    rules = [Rule("id", c) for c in ids] + [Rule("event_time", event_time)]
    contract: Contract | None = plans.recall(df, CONTRACT)
    if contract is None and df.isStreaming:
        source = source_of(df)
        if source is not None:
            contract = Contract(df, source)
    if contract is None:
        return None
    extended = contract.with_rules(rules)
    out = extended.apply()
    plans.remember(out, CONTRACT, extended)
    return out


def guard_ids(df: DataFrame, ids: Sequence[str], event_time: str) -> DataFrame:
    """Stop the query at a record with a null or empty id or a null event time (not routable).

    For a stream transformed between its source and :func:`onceflow.deduplicate`: such a
    record is never merged as one id nor dropped; the query stops naming it (the message
    carries the record as JSON, since its source coordinates cannot be traced).
    """
    from pyspark.sql import functions as F

    bad = F.col(f"`{event_time}`").isNull()
    for c in ids:
        bad = bad | F.col(f"`{c}`").isNull() | (F.trim(F.col(f"`{c}`").cast("string")) == "")
    message = F.concat(
        F.lit(f"onceflow.errors.BatchRejectedError: a record with a null or empty id ({', '.join(ids)}) or a "
              f"null event time ({event_time}) cannot be deduplicated: "),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])),
        F.lit(". To route such records to a rejects table instead of stopping, call onceflow.deduplicate "
              "on the source DataFrame or on what onceflow.expect(...) returned, and pass "
              "write_stream(..., rejects='table')"))
    return df.where(F.when(bad, F.raise_error(message)).otherwise(F.lit(True)))
