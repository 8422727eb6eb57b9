"""The Apache Iceberg sink (``pyiceberg``): each micro-batch exactly once per table, files by Spark's tasks.

Each table is an Iceberg table ``<namespace>.<name>`` of a catalog (pyiceberg's SQL catalog: a
SQLite file, the embedded default, or a PostgreSQL database) whose warehouse is a local or
shared file system path. Iceberg has no idempotent-write id of its own (Delta's
``txnAppId``/``txnVersion``), so the marker of batch N is onceflow's, in the same Iceberg commit
as the batch's files, twice:

* the table properties ``onceflow.<sink_id>.batch`` (N), ``onceflow.<sink_id>.files`` (the
  folder of the commit's files) and ``onceflow.<sink_id>.marker`` (the batch's metrics) — a
  table's properties are in every metadata file, so snapshot expiry never loses the last marker;
* the snapshot summary's ``onceflow`` entry (the same metrics: each batch's, while its snapshot
  is kept — what :meth:`IcebergTablesSink.batches` lists).

Commit protocol of :meth:`IcebergTablesSink.commit_frames` for batch N (every batch, whatever
its size: no row passes through the driver):

1. **Check.** Crash point ``before_sink_write``. Each frame against its spec
   (:func:`onceflow.sinks._core.checks.check_frame`: nothing written on a refusal) and its columns' types
   against the table's. May run any number of times.
2. **Decide**, per table in the order of ``tables=``: load the table (created empty, from the
   batch's columns, if missing). If its ``onceflow.<sink_id>.batch`` is N or more, it has the
   batch: skip it, and (when N is the table's last batch) delete the folders of N's attempts (3)
   that no commit names.
3. **Write**: Spark's own Parquet writer writes the table's rows into a new folder
   ``<table location>/data/onceflow-<sink_id>/<N>-<token>/``; its file commit protocol keeps one
   attempt per task (a failed, retried or speculative attempt's files stay in its temporary
   directory, deleted with the job). An append table's rows are the batch's; a keyed table's
   are the batch merged into the data files of the snapshot loaded in step 2 that its keys
   touch (:mod:`onceflow.sinks.iceberg.merge`: the files picked by the batch's key bounds, read,
   joined and rewritten by Spark's tasks). Folders of N's other attempts are deleted only once N
   is committed — by this attempt or another: no other attempt of N can commit then (its commit
   is refused, 4) — never before: one may be a live, concurrent attempt about to commit its own.
4. **Mark and commit** in one Iceberg commit on the table loaded in step 2: the folder's files
   (their footers give the statistics, no row is read; a keyed table's commit also removes the
   files step 3 merged: an ``overwrite`` snapshot), the snapshot summary and the three
   properties. A batch without rows commits an empty append (a snapshot all the same: the
   marker and its metrics). A concurrent commit that moved the table's snapshot makes the
   catalog refuse this one (``CommitFailedException``): reload and decide again (2) — an append
   table's files kept for the retry, a keyed table's merged again on the new snapshot (3) — never
   pyiceberg's own retry, which would re-apply the files without that decision
   (:meth:`IcebergTablesSink._commit`). Any other failure of the commit leaves its
   outcome unknown: the table is read again before anything else — committed with this folder:
   done; else decided again. Crash point ``inside_sink_txn`` between two tables' commits (after
   the first table's).
5. **Commit**: each table's commit is durable when the catalog returns. Crash points
   ``after_sink_commit`` and ``ambiguous_commit`` after the last table: Spark re-runs N, step 2
   skips every table.
6. **Return** True if any table was written.

Iceberg has no transaction across tables: a crash between two tables' commits leaves the first
with N and the second without; the re-run of N writes only the second (step 2), so each table
gets N exactly once — readers may see one table a batch ahead of another.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import CheckpointMismatchError, ConfigError, OnceflowError
from onceflow.faults import CrashPoint
from onceflow.sinks._core import marker
from onceflow.sinks._core.base import Settle, SinkBase
from onceflow.sinks._core.checks import check_existing, check_frame, expected_columns, spark_name
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta import spark_files
from onceflow.sinks.delta.spark_files import REBASE, WRITE_OPTIONS
from onceflow.sinks.iceberg import merge

RETRIES = 10
"""Commits tried per table when a concurrent commit wins (step 4)."""

SPARK_TYPES = {"boolean", "integer", "long", "float", "double", "string", "binary", "date", "timestamp",
               "timestamp_ntz"}
"""Spark's column types whose Parquet form is an Iceberg type as written (``decimal(p,s)`` too)."""

_log = logging.getLogger("onceflow.retry")


def _require() -> Any:
    try:
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError:
        raise ConfigError("the Iceberg sink needs pyiceberg, which is not installed: "
                          "pip install 'onceflow[iceberg]'") from None
    return SqlCatalog


def local_path(location: str) -> Path:
    """A warehouse or table location as a path of this machine's file system.

    Raises:
        ConfigError: An object store location (``s3://``, ...), which this sink does not write.
    """
    if location.startswith("file:"):  # file:///x, or Hadoop's file:/x
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    if "://" in location:
        raise ConfigError(f"Iceberg location {location!r}: the Iceberg sink writes to a file system path "
                          "(local, or mounted on every executor); object stores are not supported")
    return Path(location)


class IcebergTablesSink(SinkBase):
    """Iceberg tables of one namespace of a SQL catalog (see the module protocol).

    Args:
        catalog_uri: The SQL catalog's database, as SQLAlchemy names it: ``sqlite:////path/catalog.db``
            or ``postgresql+psycopg://user@host/db``.
        warehouse: Where new tables' files go: a directory every executor reaches.
        namespace: The tables' namespace (created if missing).
        sink_id: Marker namespace (two queries writing to one table need different ids).
        catalog_name: The catalog's name in its database (a SQL catalog's rows carry it: a reader
            opens the catalog under the same name).
    """

    all_or_nothing = False
    """Each table of a batch commits on its own."""

    def __init__(self, catalog_uri: str, warehouse: str | Path, namespace: str = "onceflow",
                 sink_id: str = "default", catalog_name: str = "onceflow") -> None:
        self._catalog_class = _require()
        if not sink_id or not sink_id.replace("_", "a").replace("-", "a").replace(".", "a").isalnum():
            raise ConfigError(f"sink id {sink_id!r} is invalid: use letters, digits, _ . -")
        self.catalog_uri = catalog_uri
        self.warehouse = local_path(str(warehouse)).absolute()
        self.namespace = namespace
        self.sink_id = sink_id
        self.catalog_name = catalog_name
        self._catalog: Any = None

    def __repr__(self) -> str:
        return f"onceflow.iceberg({self.where!r}, namespace={self.namespace!r}, sink_id={self.sink_id!r})"

    @property
    def where(self) -> str:
        """The catalog's database as messages name it (no password)."""
        head, sep, tail = self.catalog_uri.partition("@")
        if sep and ":" in head.partition("://")[2]:
            scheme, _, user = head.partition("://")
            return f"{scheme}://{user.partition(':')[0]}@{tail}"
        return self.catalog_uri

    def repair_options(self) -> str:
        """``--iceberg URI --warehouse DIR --namespace NS [--catalog-name N] --sink-id ID`` (no password)."""
        name = f" --catalog-name {self.catalog_name}" if self.catalog_name != "onceflow" else ""
        return f"--iceberg {self.where} --warehouse {self.warehouse} --namespace {self.namespace}{name} " \
               f"--sink-id {self.sink_id}"

    @property
    def catalog(self) -> Any:
        """The catalog (opened on first use, on the driver), its namespace created if missing."""
        if self._catalog is None:
            self.warehouse.mkdir(parents=True, exist_ok=True)
            self._catalog = self._catalog_class(self.catalog_name, uri=self.catalog_uri,
                                                warehouse=self.warehouse.as_uri())
            self._catalog.create_namespace_if_not_exists(self.namespace)
        return self._catalog

    def open_catalog(self) -> Any:
        """The catalog, opened without creating the namespace or the warehouse (for readers)."""
        return self._catalog or self._catalog_class(self.catalog_name, uri=self.catalog_uri,
                                                    warehouse=self.warehouse.as_uri())

    def bound_query(self) -> str | None:
        """The query id the namespace holds for this sink id (:meth:`bind`); None: none, or no namespace.

        Reads only: neither the namespace nor the warehouse is created (``onceflow repair``).
        """
        from pyiceberg.exceptions import NoSuchNamespaceError

        catalog = self.open_catalog()
        try:
            found = catalog.load_namespace_properties(self.namespace).get(self._key("query_id"))
        except NoSuchNamespaceError:
            return None
        self._catalog = catalog
        return None if found is None else str(found)

    def _key(self, what: str) -> str:
        return f"onceflow.{self.sink_id}.{what}"

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint: the namespace property ``onceflow.<sink_id>.query_id``.

        Raises:
            CheckpointMismatchError: The namespace holds this sink id for another checkpoint.
        """
        key = self._key("query_id")
        found = self.catalog.load_namespace_properties(self.namespace).get(key)
        if found is None:
            self.catalog.update_namespace_properties(self.namespace, updates={key: query_id})
        elif found != query_id:
            raise CheckpointMismatchError(
                f"the Iceberg namespace {self.namespace!r} of {self.where} holds sink {self.sink_id!r} of "
                f"the checkpoint with query id {found}, but this run's checkpoint has query id {query_id}; a "
                "new checkpoint restarts batch ids at 0. Run with the original checkpoint, or use another "
                "sink id.")

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """The tables that exist have the batch's columns (and a keyed table's key and merged ones).

        Raises:
            ConfigError: An existing table without a column of the batch.
        """
        for name, spec in specs.items():
            table = self._table(name)
            if table is not None:
                have = [f.name for f in table.schema().fields]
                check_existing(f"Iceberg ({self.namespace}.{name})", name, spec,
                               expected_columns(name, spec, schemas), have, None)

    def _table(self, name: str) -> Any | None:
        """Table ``name`` as the catalog has it now; None: none yet."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table((self.namespace, name))
        except NoSuchTableError:
            return None

    def committed(self, table: Any) -> int:
        """The last batch id the table's properties mark for this sink (-1: none)."""
        return int(table.properties.get(self._key("batch"), -1))

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Write batch ``batch_id``'s DataFrames to every table that does not have it yet (the module).

        Raises:
            BatchRejectedError: A null or repeated key (nothing written).
            ConfigError: A column Iceberg cannot take as Spark writes it, or of another type than
                the table's.
        """
        counts = self._counted(batch_id, frames, specs, written)  # 1
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
            self._check_types(name, frame)
        metadata = json.dumps({k: v for k, v in marker.marker_record(
            self.sink_id, batch_id, stats, rows_out, counts).items() if k != "committed_ms"})
        wrote = False
        for i, (name, frame) in enumerate(frames.items()):
            wrote |= self._commit_one(name, specs[name], frame, counts[name], batch_id, metadata)
            if i == 0:
                faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return wrote  # 6

    def _check_types(self, name: str, frame: Any) -> None:
        """Step 1's types: Spark's Parquet form of each column is an Iceberg type as written.

        Raises:
            ConfigError: Naming the table, the column, its type and what to cast it to.
        """
        for field in frame.schema.fields:
            typ = field.dataType.typeName()
            if typ not in SPARK_TYPES and typ != "decimal":
                cast = "int" if typ in ("byte", "short") else "string (e.g. to_json)"
                raise ConfigError(f"Iceberg table {self.namespace}.{name}: column {field.name!r} is "
                                  f"{field.dataType.simpleString()}, which the Iceberg sink does not write "
                                  f"yet; cast it to {cast} in the query")
        session = frame.sparkSession
        if any(f.dataType.typeName() in ("date", "timestamp", "timestamp_ntz") for f in frame.schema.fields) \
                and str(session.conf.get(REBASE, "CORRECTED")).upper() == "LEGACY":
            raise ConfigError(f"Iceberg table {self.namespace}.{name}: {REBASE}=LEGACY would shift dates "
                              "before 1582 in the files; set it to CORRECTED (Spark's default)")

    def _commit_one(self, name: str, spec: Table, frame: Any, rows: int, batch_id: int,
                    metadata: str) -> bool:
        """Steps 2-4 for one table; False if it already had the batch."""
        table = self._table(name) or self._create(name, frame)
        where = f"{self.namespace}.{name}"
        keyed = bool(spec.key) and rows > 0
        bounds: Any = None  # a keyed table's key bounds, computed by Spark once the table lacks N
        folder, paths, deletes = "", [], []  # type: tuple[str, list[str], list[Any]]
        for attempt in range(RETRIES):
            if self.committed(table) >= batch_id:  # 2
                self._clean(table, batch_id)
                return bool(folder) and table.properties.get(self._key("files")) == folder
            self._check_columns(name, table, frame)
            if not folder or keyed:  # 3: a keyed table's files are picked on this snapshot
                bounds = merge.key_filter(frame, list(spec.key)) if keyed and bounds is None else bounds
                folder = f"{batch_id}-{uuid.uuid4().hex[:12]}"
                paths = self._write(table, folder, self._rows(table, where, spec, frame, bounds, deletes)) \
                    if rows else []
            try:  # 4
                self._commit(table, batch_id, folder, paths, metadata, deletes)
                self._clean(table, batch_id, keep=folder)
                return True
            except Exception as exc:
                from pyiceberg.exceptions import CommitFailedException

                table = self._reread(name, batch_id, exc)
                if self.committed(table) >= batch_id:  # the unknown outcome was our commit, or another's
                    continue
                if isinstance(exc, (ValueError, TypeError)):  # pyiceberg refused the files: not transient
                    raise OnceflowError(f"batch {batch_id}: Iceberg table {where} refused the batch's files: "
                                        f"{exc}") from None
                why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                what = "a concurrent commit won" if isinstance(exc, CommitFailedException) else \
                    "the commit's outcome was unknown, and it did not commit"
                _log.warning("onceflow: batch %d: Iceberg table %s: %s (%s); deciding again (%d of %d)",
                             batch_id, where, what, why, attempt + 1, RETRIES)
                time.sleep(min(0.05 * 2 ** attempt, 2.0))
        raise OnceflowError(f"batch {batch_id} could not be committed to Iceberg table {where}: {RETRIES} "
                            "commits failed")

    def _rows(self, table: Any, where: str, spec: Table, frame: Any, bounds: Any, deletes: list[Any]) -> Any:
        """Step 3's rows: an append table's batch; a keyed table's merge with the files it touches.

        ``deletes`` is filled with the touched files (the commit replaces them).
        """
        deletes.clear()
        if bounds is None:
            return frame
        deletes.extend(merge.touched(table, where, bounds))
        return merge.merged_rows(frame, spec, merge.old_schema(frame, table), [f.file_path for f in deletes],
                                 where)

    def _check_columns(self, name: str, table: Any, frame: Any) -> None:
        """Each of the batch's columns has the table's type (Iceberg would refuse the files at step 4).

        Raises:
            ConfigError: Naming the table, the column and both types.
        """
        from onceflow.sinks._core.checks import arrow_schema

        have = merge.table_types(table)
        for field in arrow_schema(frame.schema):
            want = have.get(field.name)
            if want is not None and want != field.type:
                raise ConfigError(f"Iceberg table {self.namespace}.{name}: column {field.name!r} is {want} "
                                  f"in the table and {field.type} in the batch; cast it in the query")

    def _reread(self, name: str, batch_id: int, exc: BaseException) -> Any:
        """The table after a failed commit, read before anything else is tried.

        Raises:
            OnceflowError: The catalog cannot be read either (the batch runs again).
        """
        try:
            table = self._table(name)
        except Exception as again:  # noqa: BLE001 - said with the commit's own failure
            raise OnceflowError(f"batch {batch_id}: Iceberg table {self.namespace}.{name}: the commit failed "
                                f"({exc}) and the catalog {self.where} cannot be read ({again}); the batch "
                                "runs again") from None
        if table is None:
            raise OnceflowError(f"Iceberg table {self.namespace}.{name} was dropped while batch {batch_id} "
                                "committed to it")
        return table

    def _create(self, name: str, frame: Any) -> Any:
        """An empty table of the frame's columns, all optional (step 2, first batch)."""
        from onceflow.sinks._core.checks import arrow_schema

        schema = arrow_schema(frame.schema)
        schema = pa.schema([f.with_nullable(True) for f in schema])
        return self.catalog.create_table_if_not_exists((self.namespace, name), schema=schema)

    def _folder(self, table: Any) -> Path:
        return local_path(table.location()) / "data" / f"onceflow-{self.sink_id}"

    def _clean(self, table: Any, batch_id: int, keep: str | None = None) -> None:
        """Delete the folders of batch ``batch_id``'s attempts but the committed one (N is committed).

        ``keep``: the committed folder; else the table's ``onceflow.<sink_id>.files`` when the table's
        last batch is N. A table already past N (a checkpoint restored from an older backup runs N
        again) names a later batch's folder there: nothing is deleted then, as N's own is unknown.
        """
        if keep is None:
            if self.committed(table) != batch_id:
                return
            keep = table.properties.get(self._key("files"))
        root = self._folder(table)
        if root.is_dir():
            for old in root.glob(f"{batch_id}-*"):
                if old.name != keep:
                    shutil.rmtree(old, ignore_errors=True)

    def _write(self, table: Any, folder: str, frame: Any) -> list[str]:
        """Step 3: the table's rows as Parquet files in a new folder, by Spark's tasks; their paths.

        A task fault armed for the batch (``task_mid_write``, ``task_after_write``) puts Python in
        the tasks: an identity ``mapInArrow`` whose first attempt dies (:mod:`onceflow.sinks.delta.
        spark_files`); Spark's retry writes the task again, and only its file is committed.
        """
        target = self._folder(table) / folder
        columns = [f.name for f in table.schema().fields]
        batch_id = int(folder.partition("-")[0])  # the folder is "<batch>-<token>"
        armed = spark_files.task_fault(batch_id)
        if armed is not None:
            frame = frame.mapInArrow(spark_files.dying(armed, batch_id), frame.schema)
        (frame.select(*[spark_name(c) for c in columns if c in frame.columns])
         .write.options(**WRITE_OPTIONS).mode("error").parquet(target.as_uri()))
        return sorted(p.as_uri() for p in target.glob("*.parquet"))

    def _commit(self, table: Any, batch_id: int, folder: str, paths: list[str], metadata: str,
                deletes: list[Any]) -> None:
        """Step 4: the files (replacing ``deletes``), the summary and the marker's properties in one commit.

        pyiceberg retries a commit a concurrent commit refused on its own, re-applying the files
        on the new snapshot (the table property ``commit.retry.num-retries``) — without step 2's
        decision, so a concurrent attempt of the same batch would commit it twice. The commit
        goes through a copy of ``table`` whose properties say no retries (the catalog applies the
        updates to the table's own metadata: the copy's properties are never written); the
        refusal comes back here and step 2 decides again. A keyed table's commit (an overwrite:
        the touched files out, their merged rows in) asserts the snapshot its files were picked
        from, like an append.
        """
        from pyiceberg.io.pyarrow import parquet_file_to_data_file
        from pyiceberg.table import TableProperties

        summary = {"onceflow": metadata}
        once = table.metadata.model_copy(update={"properties": {**table.properties,
                                                                TableProperties.COMMIT_NUM_RETRIES: "0"}})
        table = type(table)(table.name(), once, table.metadata_location, table.io, table.catalog)
        with table.transaction() as tx:
            if deletes:
                if tx.table_metadata.name_mapping() is None:  # Spark's files carry no field ids
                    tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                                       tx.table_metadata.schema().name_mapping.model_dump_json()})
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as files:
                    for old in deletes:
                        files.delete_data_file(old)
                    for path in paths:
                        files.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, path))
            elif paths:
                tx.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
            else:
                tx.append(table.schema().as_arrow().empty_table(), snapshot_properties=summary)
            tx.set_properties({self._key("batch"): str(batch_id), self._key("files"): folder,
                               self._key("marker"): metadata})

    def tables(self) -> list[str]:
        """The names of the namespace's tables."""
        return sorted(ident[-1] for ident in self.catalog.list_tables(self.namespace))

    def batches(self) -> list[dict[str, Any]]:
        """One dict per batch id in the tables' snapshot summaries and last markers (by batch id)."""
        found: dict[int, dict[str, Any]] = {}
        for name in self.tables():
            table = self._table(name)
            if table is None:
                continue
            for snap in table.snapshots():
                raw = snap.summary.additional_properties.get("onceflow") if snap.summary else None
                meta = json.loads(raw) if raw else {}
                if meta.get("sink_id") == self.sink_id:
                    found.setdefault(int(meta["batch_id"]), {**meta, "committed_ms": snap.timestamp_ms})
            last = table.properties.get(self._key("marker"))
            if last:  # the newest batch's marker, also when snapshot expiry took its snapshot
                meta = json.loads(last)
                found.setdefault(int(meta["batch_id"]), {**meta, "committed_ms": None})
        return marker.with_amendments([found[b] for b in sorted(found)])

    def flush(self) -> None:
        """Nothing to wait for: a batch is in the tables when ``commit_frames`` returns."""

    def close(self) -> None:
        """Nothing to release (the catalog's connections are SQLAlchemy's pool)."""
