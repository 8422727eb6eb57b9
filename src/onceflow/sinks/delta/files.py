"""A batch's Delta rows written by Spark's tasks, committed by the driver with the batch's marker.

The executor side of :class:`onceflow.sinks.delta.sink.DeltaTablesSink` and the ``onceflow_delta``
format (a PySpark Python data source, so ``writeStream.format("onceflow_delta")`` works on its
own): no row of the batch passes through the driver's Python. For table T and batch N, each
commit attempt of N draws a token (``token``), and:

1. **Task** (partition p, attempt a), any number of times (Spark's retries, speculation, a
   re-run after a crash): writes its rows as one Parquet file, each Arrow batch cast safely to
   the table's schema (a value that does not fit fails the task, naming the column) —
   ``append``: into the table's directory, ``part-<N>-<token>-<p>-<a>-<uuid>.parquet``, which
   no reader sees until a commit adds it; ``upsert``/merge: into the staging directory
   ``<root>/_onceflow/stage/<T>/<N>-<token>/``. It returns the file's path, size, rows and
   statistics (``numRecords``, ``nullCount``, and ``minValues``/``maxValues`` of integer and
   date columns) — a few hundred bytes, whatever the rows.
2. **Decide** (the driver, :func:`commit`): load T's snapshot; if its app transaction
   ``onceflow:<sink_id>`` has reached N, an earlier attempt committed N: this attempt's files
   are deleted and nothing is committed (a replay).
3. **Write and mark** in one Delta commit on that snapshot, with ``Transaction(app_id, N)`` and
   the batch's metrics (commit metadata ``onceflow``): ``append`` adds the winning tasks' files
   (delta-rs's transaction API: the rows are never read again); a merge runs delta-rs's MERGE
   with the staged files as a stream of Arrow batches as its source (no rows: an empty commit
   all the same — a MERGE of nothing commits nothing, and the marker would be lost); a missing
   table is created by that commit. A concurrent commit makes delta-rs refuse this one: reload,
   decide again.
4. **Clean up**: the files of losing task attempts of this token (retried or speculative
   tasks, whose messages Spark dropped) and the staging directories of batches up to N
   (:func:`clear_stage`: also what an attempt killed before its commit left).

The files of an attempt that died before its commit are in no commit: readers never see them,
and Delta's ``VACUUM`` removes them after its retention (as it does for any failed writer).

The sink runs step 1 through :func:`onceflow.sinks._core.tasks.run_tasks` (no data source) and steps
2-4 itself — for a frame that is not cached, with the batch's numbers, which it knows only once
the tasks have run the batch's plan (:data:`onceflow.sinks._core.base.Settle`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import ConfigError, OnceflowError
from onceflow.sinks._core.tasks import kept_messages, running_task

_log = logging.getLogger("onceflow.retry")
RETRIES = 5
"""Commits tried per table when a concurrent writer wins (step 3)."""
STAGE = Path("_onceflow") / "stage"
"""The staging directories of merge tables, under the root."""


@dataclass(frozen=True)
class FilesSpec:
    """One table's write of one batch (the data source's options).

    Attributes:
        root: The directory of the sink's tables.
        table: The table (a directory under ``root``).
        sink_id: The marker namespace (app id ``onceflow:<sink_id>``).
        batch_id: The micro-batch (-1: a streaming write, where Spark gives it).
        token: This commit attempt's token (names its files).
        key: Key columns (merge tables).
        merged: Column -> ``add``/``max``/``min`` (merge tables).
        mode: ``append`` or ``merge`` (``upsert`` is a merge without merged columns).
        metadata: The batch's metrics, the commit's ``onceflow`` metadata (JSON).
        schema: The table's Arrow schema (IPC, base64), when it exists: every batch is cast to it.
    """

    root: str
    table: str
    sink_id: str = "default"
    batch_id: int = -1
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    key: tuple[str, ...] = ()
    merged: dict[str, str] = field(default_factory=dict)
    mode: str = "append"
    metadata: str = "{}"
    schema: str = ""

    @property
    def app_id(self) -> str:
        """The Delta app transaction id of the sink."""
        return f"onceflow:{self.sink_id}"

    @property
    def path(self) -> Path:
        """The table's directory."""
        return Path(self.root) / self.table

    def stage(self, batch_id: int) -> Path:
        """The staging directory of this attempt of ``batch_id`` (merge tables)."""
        return Path(self.root) / STAGE / self.table / f"{batch_id}-{self.token}"

    def options(self) -> dict[str, str]:
        """As data source options."""
        raw = asdict(self)
        return {k: json.dumps(v) if not isinstance(v, str) else v for k, v in raw.items()}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FilesSpec:
        """From data source options (keys case-insensitive).

        Raises:
            ConfigError: ``root`` or ``table`` missing, or a mode it does not know.
        """
        opts = {k.lower(): v for k, v in options.items()}
        for need in ("root", "table"):
            if not opts.get(need):
                raise ConfigError(f"onceflow_delta needs option {need!r} (the tables' directory, the table)")
        mode = opts.get("mode", "append")
        if mode not in ("append", "merge", "upsert"):
            raise ConfigError(f"onceflow_delta: mode {mode!r} is not append, upsert or merge")
        key = tuple(json.loads(opts["key"])) if opts.get("key", "").startswith("[") else \
            tuple(k.strip() for k in opts.get("key", "").split(",") if k.strip())
        merged = json.loads(opts["merged"]) if opts.get("merged") else {}
        if mode != "append" and not key:
            raise ConfigError(f"onceflow_delta: table {opts['table']!r} in mode {mode} needs option 'key'")
        return cls(root=opts["root"], table=opts["table"], sink_id=opts.get("sink_id", "default"),
                   batch_id=int(opts.get("batch_id", "-1")), token=opts.get("token") or uuid.uuid4().hex[:12],
                   key=key, merged=dict(merged), mode="append" if mode == "append" else "merge",
                   metadata=opts.get("metadata", "{}"), schema=opts.get("schema", ""))

    def arrow_schema(self) -> pa.Schema | None:
        """The table's schema, when the spec carries it."""
        if not self.schema:
            return None
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema)))


def encode_schema(schema: pa.Schema) -> str:
    """An Arrow schema for :attr:`FilesSpec.schema`."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def table_schema(path: Path) -> pa.Schema | None:
    """The Arrow schema of the Delta table at ``path`` (None: there is none)."""
    from deltalake import DeltaTable

    return arrow_schema(DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None)


def arrow_schema(table: Any | None) -> pa.Schema | None:
    """The Arrow schema of a loaded ``DeltaTable`` (None: no table)."""
    return None if table is None else pa.schema(table.schema().to_arrow())


def _fit(batch: pa.RecordBatch, target: pa.Schema | None, table: str) -> pa.RecordBatch:
    """``batch`` cast safely to the table's schema (its columns, its order, its types).

    Raises:
        ConfigError: The batch lacks a column of the table, or a value does not fit its type.
    """
    if target is None:
        return batch
    missing = [n for n in target.names if n not in batch.schema.names]
    if missing:
        raise ConfigError(f"Delta table {table!r} has column(s) {missing} that the batch lacks; select them "
                          "(as nulls if need be) or write to another table")
    out = []
    for f in target:
        col = batch.column(batch.schema.get_field_index(f.name))
        try:
            out.append(col.cast(f.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(f"Delta table {table!r}: column {f.name!r} of the batch ({col.type}) does not "
                              f"fit the table's type {f.type}: {exc}") from None
    return pa.RecordBatch.from_arrays(out, schema=target)


class _Stats:
    """A file's Delta statistics, folded batch by batch (see the module, step 1)."""

    def __init__(self) -> None:
        self.rows = 0
        self.nulls: dict[str, int] = {}
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        for f, col in zip(batch.schema, batch.columns, strict=True):
            self.nulls[f.name] = self.nulls.get(f.name, 0) + col.null_count
            if not (pa.types.is_integer(f.type) or pa.types.is_date32(f.type)):
                continue
            both = pc.min_max(col).as_py()
            if both["min"] is None:
                continue
            low, high = both["min"], both["max"]
            self.low[f.name] = min(low, self.low.get(f.name, low))
            self.high[f.name] = max(high, self.high.get(f.name, high))

    def to_json(self) -> str:
        def form(v: Any) -> Any:
            return v if isinstance(v, int) else v.isoformat()
        return json.dumps({"numRecords": self.rows, "nullCount": self.nulls,
                           "minValues": {k: form(v) for k, v in self.low.items()},
                           "maxValues": {k: form(v) for k, v in self.high.items()}})


def write_task(spec: FilesSpec, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """Step 1: one partition's rows as one Parquet file; the file's message (no file: no rows).

    Args:
        spec: The table's write.
        batches: The partition's rows.

    Returns:
        ``{"files": [{"path", "size", "mtime_ms", "rows", "stats"}], "rows": n}``; ``path`` relative to the
        table's directory (append) or absolute (a merge's staged file).
    """
    import pyarrow.parquet as pq

    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    target = spec.arrow_schema()
    unique = f"{task.partition:05d}-{task.attempt}-{uuid.uuid4().hex[:8]}"
    name = f"part-{batch_id:05d}-{spec.token}-{unique}.snappy.parquet"
    folder = spec.path if spec.mode == "append" else spec.stage(batch_id)
    writer, stats = None, _Stats()
    try:
        for raw in batches:
            batch = _fit(raw, target, spec.table)
            if not batch.num_rows:
                continue
            if writer is None:
                folder.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(str(folder / name), batch.schema, compression="snappy")
            writer.write_batch(batch)
            stats.add(batch)
            faults.task_reached(faults.CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # a file cut
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return {"files": [], "rows": 0}
    faults.task_reached(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
    where = name if spec.mode == "append" else str(folder / name)
    st = os.stat(folder / name)
    written = {"path": where, "size": st.st_size, "mtime_ms": int(st.st_mtime * 1000), "rows": stats.rows,
               "stats": stats.to_json()}
    return {"files": [written], "rows": stats.rows}


def _no_message(spec: FilesSpec, batch_id: int) -> str:
    """What a batch whose task sent no message is refused with."""
    return f"batch {batch_id}: a task of table {spec.table!r} sent no message; Spark runs the batch again"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def merge_expression(column: str, how: str) -> str:
    """A merged column's value after the batch, in a MERGE (nulls ignored, as SQL's aggregates do)."""
    old, new = f"t.{_q(column)}", f"s.{_q(column)}"
    if how == "add":
        both = f"{old} + {new}"
    else:
        both = f"CASE WHEN {new} {'>' if how == 'max' else '<'} {old} THEN {new} ELSE {old} END"
    return f"CASE WHEN {new} IS NULL THEN {old} WHEN {old} IS NULL THEN {new} ELSE {both} END"


def merge_into(table: Any, source: Any, key: Iterable[str], merged: Mapping[str, str], columns: list[str],
               props: Any) -> None:
    """delta-rs's MERGE of ``source`` (Arrow rows) into ``table`` on ``key``, in one commit."""
    keys = list(key)
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
    updates = {_q(c): merge_expression(c, merged[c]) if c in merged else f"s.{_q(c)}"
               for c in columns if c not in keys}
    merger = table.merge(source, predicate=on, source_alias="s", target_alias="t", commit_properties=props)
    if updates:
        merger = merger.when_matched_update(updates=updates)
    merger.when_not_matched_insert_all().execute()


def commit(spec: FilesSpec, batch_id: int, schema: pa.Schema, messages: Iterable[Any]) -> bool:
    """Steps 2-4 on the driver: the winning tasks' files committed with the marker, unless N is there.

    Args:
        spec: The table's write.
        batch_id: The micro-batch.
        schema: The rows' Arrow schema (a table created by this commit gets it).
        messages: The winning task attempts' messages (:func:`write_task`; None for a failed task).

    Returns:
        True if this call committed the batch, False for a replay.

    Raises:
        OnceflowError: A message is missing, or concurrent commits won every try.
    """
    import deltalake as dl

    files = [f for m in kept_messages(messages, _no_message(spec, batch_id)) for f in m["files"]]
    props = dl.CommitProperties(app_transactions=[dl.Transaction(spec.app_id, batch_id)],
                                custom_metadata={"onceflow": spec.metadata})
    path = str(spec.path)
    try:
        for attempt in range(RETRIES):
            if dl.DeltaTable.is_deltatable(path):
                table = dl.DeltaTable(path)
                done = table.transaction_version(spec.app_id)
                if done is not None and done >= batch_id:  # 2
                    _discard(spec, files)
                    return False
            else:
                table = None
            try:
                _write(dl, spec, table, schema, files, props)  # 3
                _cleanup(spec, batch_id, files)  # 4
                return True
            except dl.exceptions.CommitFailedError as exc:
                why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                _log.warning("onceflow: batch %d: table %s: a concurrent Delta commit won (%s); deciding "
                             "again (%d of %d)", batch_id, spec.table, why, attempt + 1, RETRIES)
            except Exception as exc:
                if table is None and dl.DeltaTable.is_deltatable(path):  # created meanwhile: decide again
                    continue
                raise OnceflowError(f"batch {batch_id}: the Delta commit to {path} failed: {exc}") from None
    finally:
        if spec.mode == "merge":
            shutil.rmtree(spec.stage(batch_id), ignore_errors=True)
    raise OnceflowError(f"batch {batch_id} could not be committed to {path}: {RETRIES} concurrent "
                        "commits won")


def _write(dl: Any, spec: FilesSpec, table: Any, schema: pa.Schema, files: list[dict[str, Any]],
           props: Any) -> None:
    """Step 3: one Delta commit of the files (append) or of a MERGE from them."""
    if spec.mode == "append":
        adds = [dl.transaction.AddAction(f["path"], int(f["size"]), {}, int(f["mtime_ms"]), True, f["stats"])
                for f in files]
        if table is None:
            dl.transaction.create_table_with_add_actions(str(spec.path), dl.Schema.from_arrow(schema), adds,
                                                         mode="append", commit_properties=props)
        else:
            table.create_write_transaction(adds, mode="append", schema=table.schema(),
                                           commit_properties=props)
        return
    if table is not None and not files:  # a MERGE of nothing commits nothing: the marker would be lost
        table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)
        return
    with _staged(schema, files) as source:
        if table is None:
            dl.write_deltalake(str(spec.path), source, mode="append", commit_properties=props)
        else:
            merge_into(table, source, spec.key, spec.merged, schema.names, props)


@contextlib.contextmanager
def _staged(schema: pa.Schema, files: list[dict[str, Any]]) -> Iterator[pa.RecordBatchReader]:
    """The staged files' rows as one stream of Arrow batches (none: an empty stream of ``schema``)."""
    import pyarrow.dataset as ds

    if not files:
        yield pa.RecordBatchReader.from_batches(schema, iter([]))
        return
    data = ds.dataset([f["path"] for f in files], format="parquet")
    yield data.scanner(batch_size=64 * 1024).to_reader()


def _discard(spec: FilesSpec, files: list[dict[str, Any]]) -> None:
    """A replay's files: in no commit, deleted (the staging directory goes in :func:`commit`)."""
    if spec.mode == "append":
        for f in files:
            with contextlib.suppress(OSError):
                (spec.path / f["path"]).unlink()


def _cleanup(spec: FilesSpec, batch_id: int, files: list[dict[str, Any]]) -> None:
    """Step 4: losing task attempts' files of this token; what batches up to N left staged."""
    if spec.mode == "append":
        kept = {f["path"] for f in files}
        for p in spec.path.glob(f"part-{batch_id:05d}-{spec.token}-*"):
            if p.name not in kept:
                with contextlib.suppress(OSError):
                    p.unlink()
    clear_stage(spec, batch_id)


def clear_stage(spec: FilesSpec, batch_id: int) -> None:
    """Staging directories (and any file) of table ``spec.table`` left by batches up to ``batch_id``.

    What a merge's attempt staged, and what an attempt killed before its commit left there (its
    files in no commit).
    """
    staging = Path(spec.root) / STAGE / spec.table
    for d in staging.iterdir() if staging.is_dir() else []:
        head = d.name.split("-", 1)[0]
        if not (head.isdigit() and int(head) <= batch_id):
            continue
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                d.unlink()
