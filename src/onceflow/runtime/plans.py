"""What onceflow reads of a DataFrame, the same on a classic session and on Spark Connect.

A classic DataFrame reaches its JVM plan through py4j (``df._jdf``); a Spark Connect DataFrame
has no JVM on the client (``_jdf`` is refused, an unknown attribute is a Column) but carries its
unresolved plan on the client (``df._plan``) and asks the server for the analyzed one
(``explain``). Each function here answers from whichever the DataFrame has, so the library's path
(:func:`onceflow.deduplicate`, :func:`onceflow.expect`, :func:`onceflow.write_stream` and each
batch) runs without py4j on Connect.

State onceflow keeps about a DataFrame (its dedup id and event time, its input contract, the Kafka
options it was read with) is never an attribute of the DataFrame: it is held here, keyed by the
object's identity while it lives (:func:`remember`, :func:`recall`).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_STATE: dict[int, dict[str, Any]] = {}

KAFKA_OPTIONS = "kafka_options"
"""The key of the options a stream :func:`onceflow.read_kafka` returned was read with."""


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a DataFrame, a session, an Observation) is Spark Connect's."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def remember(df: DataFrame, key: str, value: Any) -> None:
    """Keep ``value`` about ``df`` under ``key`` while ``df`` lives (never on the object itself)."""
    ident = id(df)
    if ident not in _STATE:
        _STATE[ident] = {}
        weakref.finalize(df, _STATE.pop, ident, None)
    _STATE[ident][key] = value


def recall(df: DataFrame, key: str, default: Any = None) -> Any:
    """What :func:`remember` kept about ``df`` under ``key``, else ``default``."""
    return _STATE.get(id(df), {}).get(key, default)


def analyzed_text(df: DataFrame) -> str:
    """The analyzed logical plan, as Spark prints it (operators, metric names, leaves)."""
    if is_connect(df):
        text: str = df._explain_string(extended=True)  # type: ignore[operator]
        found = re.search(r"== Analyzed Logical Plan ==\n(.*?)(?:\n== |\Z)", text, re.S)
        return found.group(1) if found else text
    return str(df._jdf.queryExecution().analyzed().toString())


def observation(df: DataFrame, name: str) -> Any:
    """A new ``Observation`` for ``df.observe``: Spark Connect's for a Connect DataFrame, else PySpark's."""
    if is_connect(df):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation(name)
    from pyspark.sql import Observation

    return Observation(name)


def observed(observation: Any) -> dict[str, Any] | None:
    """An Observation's metrics once a job that ran its plan finished, else None (never waits)."""
    if is_connect(observation):  # filled from the response of an action that ran its plan
        result = observation._result
        return dict(result) if result else None
    jo = observation._jo
    if jo is not None and jo.future().isCompleted():
        return dict(observation.get)
    return None


@dataclass(frozen=True)
class Leaf:
    """One streaming source of a query, as declared.

    Attributes:
        kind: ``file`` (Spark's file sources), else the source's name (``kafka``,
            ``onceflow_kafka``, ...).
        format: The format name (``parquet``, ``kafka``, ...).
        options: Its options, ``path`` among them for a file source.
        schema_json: The schema the stream was declared with (file sources), as JSON, or None.
    """

    kind: str
    format: str
    options: dict[str, str]
    schema_json: str | None


_FILE_FORMATS = frozenset({"parquet", "json", "csv", "text", "orc", "avro", "xml", "binaryfile"})


def stream_leaves(df: DataFrame) -> list[Leaf] | None:
    """The query's streaming sources; None when the plan cannot be read (another Spark build)."""
    if is_connect(df):
        return [_connect_leaf(node, df) for node in _connect_sources(df._plan)]
    try:
        leaves = df._jdf.queryExecution().analyzed().collectLeaves()
        out = []
        for i in range(leaves.size()):
            leaf = _classic_leaf(leaves.apply(i))
            if leaf is not None:
                out.append(leaf)
        return out
    except Exception:  # noqa: BLE001 - py4j of another Spark build
        return None


def bare_source(df: DataFrame) -> Leaf | None:
    """The source of a DataFrame that is one streaming source read as it is, else None."""
    if is_connect(df):
        node = df._plan
        return _connect_leaf(node, df) if _is_stream_source(node) else None
    plan = df._jdf.queryExecution().analyzed()
    if plan.children().size() != 0:
        return None
    return _classic_leaf(plan)


def _classic_leaf(plan: Any) -> Leaf | None:
    kind = plan.getClass().getSimpleName()
    if kind == "StreamingRelation":
        ds = plan.dataSource()
        opts = _scala_map(ds.options())
        schema = ds.userSpecifiedSchema()
        return Leaf("file", str(ds.className()), {k: v for k, v in opts.items() if k != "path"}
                    | {"path": opts.get("path", "")},
                    str(schema.get().json()) if schema.isDefined() else None)
    if kind == "StreamingRelationV2":
        jmap = plan.extraOptions().asCaseSensitiveMap()
        name = str(plan.sourceName())
        return Leaf(name, name, {str(k): str(jmap.get(k)) for k in jmap.keySet()}, None)
    return None


def _scala_map(m: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    it = m.iterator()
    while it.hasNext():
        kv = it.next()
        out[str(kv._1())] = str(kv._2())
    return out


def _is_stream_source(node: Any) -> bool:
    """Whether a Connect client plan node is a streaming source (``spark.readStream...``)."""
    return type(node).__name__ == "DataSource" and bool(getattr(node, "_is_streaming", False))


def _connect_sources(node: Any) -> list[Any]:
    """The streaming ``DataSource`` nodes under a Connect client plan (any operator's children)."""
    from pyspark.sql.connect.plan import LogicalPlan

    found, todo, seen = [], [node], set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if _is_stream_source(n):
            found.append(n)
            continue
        for value in vars(n).values():
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, LogicalPlan):
                    todo.append(v)
    return found[::-1]


def _connect_leaf(node: Any, df: DataFrame) -> Leaf:
    fmt = str(node._format or "")
    options = {str(k): str(v) for k, v in (node._options or {}).items()}
    if fmt.lower() in _FILE_FORMATS:
        paths = list(node._paths or [])
        options["path"] = str(paths[0]) if paths else options.get("path", "")
        schema = None
        if node._schema:  # a DDL string or a JSON schema: the server's resolved schema as JSON
            schema = df.schema.json() if node is df._plan else None
        return Leaf("file", fmt, options, schema)
    return Leaf(fmt, fmt, options, None)
