"""Stable input: a micro-batch's output is computed once, persisted, and every retry reads it back.

Spark replays a batch's *input* exactly (same offsets, same state), but a transformation may
still give another answer on the retry: it reads the clock, draws random numbers, asks a
service whose answer changed, or reads a source that is not replayable. A sink that is
idempotent per batch does not care (the retry is skipped by its marker); a side effect does —
the first attempt may already have sent "charge A 12" when the retry computes "charge A 13".
This is Beam's ``Reshuffle`` / ``@RequiresStableInput``: persist the output before anything
sees it, and let every retry see the persisted copy.

Storage: ``<checkpoint>/onceflow_stable/<batch_id>/`` — one Parquet file (Arrow outputs) or
directory (DataFrame outputs, written by Spark's executors) per table, and ``_meta.json`` (the
query id, the tables, the batch's row count). Protocol of :class:`StableOutputs`, for batch N of
the query whose checkpoint it is:

1. :meth:`StableOutputs.cleanup`, before the first batch of a process: delete the persisted
   batches that Spark's commit log has (their sink committed them, and Spark will not re-run
   them) and any half-written ``.tmp-*`` directory (a crash in step 3). May run any number of
   times.
2. :meth:`StableOutputs.load`: if ``<root>/N`` exists, it was complete when step 3 renamed it
   into place; it is checked whole against its manifest (every data file there, of its size and
   row count; a driver-written file's SHA-256 too): a file lost or cut short since (a disk, a
   hand) is never read as the batch. A sound copy's tables replace the freshly computed ones,
   before any of them is materialized, so the retry's own answer is never used. A damaged copy
   is computed again only when that cannot mix two computations in the sink (``recompute``:
   the sink committed N already, or commits a batch all or nothing); else
   :class:`StableCopyError` names the batch and what to check.
3. Else :meth:`StableOutputs.save`: write every stable table into ``<root>/.tmp-N-<random>/``,
   fsync the files (Arrow outputs) and the directory, then rename it to ``<root>/N`` and fsync
   ``<root>``. Crash point ``after_stable_save``: N is persisted, no sink has seen it; the retry
   reads it (step 2). A crash before the rename leaves a ``.tmp`` directory that step 1 removes
   and N is computed again — nothing has seen the first computation.
4. The sink commits N from the persisted tables (DataFrame outputs are read back from the
   persisted files, so the executors' writes also see the stable copy).
5. :meth:`StableOutputs.drop` once the sink committed N: nothing reads ``<root>/N`` again —
   a retry of N (the sink committed, Spark had not written ``commits/N``) is skipped by the
   sink's marker. Crash point ``before_stable_drop``: the copy stays until step 1 of the next
   process sees ``commits/N``, or the retry re-uses it.

Persisted copies survive process crashes (``kill -9``: the rename is atomic and the Arrow
files are fsynced); DataFrame outputs are written by Spark, whose local-filesystem writes are
not fsynced: against power loss, put the checkpoint on storage that is durable on close
(HDFS, object stores), as Spark's own checkpoint needs anyway.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow import faults
from onceflow.errors import ConfigError, UnstableOutputError
from onceflow.faults import CrashPoint
from onceflow.runtime.files import file_sha256, fsync_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DIR = "onceflow_stable"
"""Directory under the checkpoint that holds the persisted batches."""


class StableCopyError(UnstableOutputError):
    """A persisted batch is not whole (a file missing or changed) and cannot safely be computed again."""


def _manifest(directory: Path, digests: bool) -> dict[str, dict[str, Any]]:
    """Every Parquet data file under a table's copy: size, rows (from its footer), and SHA-256 if asked."""
    files = [directory] if directory.is_file() else sorted(
        p for p in directory.rglob("*.parquet") if not p.name.startswith((".", "_")))
    out = {}
    for p in files:
        entry: dict[str, Any] = {"bytes": p.stat().st_size, "rows": pq.read_metadata(p).num_rows}
        if digests:
            entry["sha256"] = file_sha256(p)
        out[str(p.relative_to(directory.parent))] = entry
    return out


def _differences(final: Path, name: str, kind: str, want: dict[str, dict[str, Any]]) -> str | None:
    """How a table's copy differs from its manifest (None: it is whole)."""
    where = final / (f"{name}.parquet" if kind == "arrow" else name)
    if not where.exists():
        return f"{where.name} is missing"
    try:
        have = _manifest(where, digests=kind == "arrow")
    except (OSError, pa.ArrowException) as exc:
        return f"a file of {where.name} cannot be read ({exc})"
    gone = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if gone or extra:
        return (f"{len(gone)} file(s) missing (e.g. {gone[0]})" if gone else f"{len(extra)} file(s) added "
                f"(e.g. {extra[0]})")
    for path, entry in want.items():
        if have[path] != entry:
            return f"{path} changed (saved {entry}, found {have[path]})"
    return None


class Persisted:
    """One persisted batch: its stable tables and the batch's row count.

    Attributes:
        tables: Table name -> Arrow table, or DataFrame read back from the persisted files.
        rows_out: Rows of the batch's DataFrame when it was first computed.
    """

    def __init__(self, tables: dict[str, Any], rows_out: int) -> None:
        self.tables, self.rows_out = tables, rows_out


class StableOutputs:
    """Persist each batch's stable tables once (see the module protocol).

    Args:
        checkpoint: The query's Spark checkpoint directory.
        tables: The table names to keep stable; None: every table of the batch.
    """

    def __init__(self, checkpoint: str | Path, tables: Iterable[str] | None = None) -> None:
        self.root = Path(checkpoint) / DIR
        self.tables = None if tables is None else frozenset(tables)

    def wants(self, name: str) -> bool:
        """Whether table ``name`` is kept stable."""
        return self.tables is None or name in self.tables

    def cleanup(self, committed: Iterable[int]) -> list[int]:
        """Step 1: delete the copies of batches in Spark's commit log and half-written directories.

        Args:
            committed: Batch ids in Spark's commit log.

        Returns:
            The batch ids whose copies were deleted.
        """
        if not self.root.is_dir():
            return []
        done = set(committed)
        removed = []
        for entry in self.root.iterdir():
            if entry.name.startswith((".tmp-", ".damaged-")):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.isdigit() and int(entry.name) in done:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(int(entry.name))
        return sorted(removed)

    def batches(self) -> list[int]:
        """Batch ids persisted now."""
        if not self.root.is_dir():
            return []
        return sorted(int(e.name) for e in self.root.iterdir() if e.name.isdigit())

    def load(self, batch_id: int, query_id: str, spark: SparkSession | None = None,
             recompute: Callable[[], bool] = lambda: False) -> Persisted | None:
        """Step 2: the persisted copy of batch ``batch_id``, or None if there is none (or it is recomputed).

        Args:
            batch_id: Spark's micro-batch id.
            query_id: The checkpoint's query id.
            spark: The session that reads back tables Spark persisted.
            recompute: Asked only for a damaged copy: whether it may be set aside and the batch
                computed again (no sink can hold part of the first computation).

        Raises:
            ConfigError: The copy belongs to another query (a checkpoint copied by hand).
            StableCopyError: The copy is damaged and ``recompute`` is False.
        """
        final = self.root / str(batch_id)
        if not final.is_dir():
            return None
        try:
            meta = json.loads((final / "_meta.json").read_text())
        except (OSError, ValueError) as exc:
            meta = {"query_id": query_id, "tables": {}, "damaged": f"_meta.json cannot be read ({exc})"}
        if meta["query_id"] != query_id:
            raise ConfigError(f"{final} holds batch {batch_id} of query {meta['query_id']}, not of this "
                              f"checkpoint's query {query_id}; delete {self.root} if it was copied here")
        damaged = meta.get("damaged") or next(
            (f"table {name!r}: {why}" for name, kind in meta["tables"].items()
             if "files" in meta and (why := _differences(final, name, kind, meta["files"].get(name, {})))),
            None)  # a copy saved by an older onceflow has no manifest: taken as it is
        if damaged:
            if not recompute():
                raise StableCopyError(
                    f"the stable copy of batch {batch_id} in {final} is not whole: {damaged}. A sink may "
                    "hold part of the batch from this copy, so computing it again could mix two answers; "
                    "nothing of this attempt was written. Bring the file back (from a backup of the "
                    f"checkpoint); or, if the sink holds nothing of batch {batch_id}, delete {final} and "
                    "restart: the batch is computed again")
            aside = self.root / f".damaged-{batch_id}-{uuid.uuid4().hex[:8]}"
            os.rename(final, aside)
            logging.getLogger("onceflow.stable").warning(
                "the stable copy of batch %d is not whole (%s): moved to %s, the batch is computed again "
                "(the sink holds none of it, or commits a batch all or nothing)", batch_id, damaged, aside)
            return None
        tables: dict[str, Any] = {}
        for name, kind in meta["tables"].items():
            if kind == "arrow":
                tables[name] = pq.read_table(final / f"{name}.parquet")
            else:
                if spark is None:
                    raise ConfigError(f"batch {batch_id}'s table {name!r} was persisted by Spark; "
                                      "reading it back needs the SparkSession")
                from pyspark.sql.types import StructType

                schema = StructType.fromJson(json.loads(meta["schemas"][name]))
                tables[name] = spark.read.schema(schema).parquet(str(final / name))
        return Persisted(tables, int(meta["rows_out"]))

    def save(self, batch_id: int, query_id: str, tables: Mapping[str, Any], rows_out: int) -> Persisted:
        """Step 3: persist the stable tables of batch ``batch_id`` atomically, once.

        May be called again for the same batch only after a crash (step 1 removed the partial
        copy); a complete copy is never replaced.

        Args:
            batch_id: Spark's micro-batch id.
            query_id: The checkpoint's query id.
            tables: Table name -> ``pyarrow.Table`` or Spark ``DataFrame`` (only the names
                :meth:`wants` are persisted).
            rows_out: Rows of the batch's DataFrame.

        Returns:
            The persisted copy (Arrow tables as given, DataFrames read back from their files).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{batch_id}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        kinds, schemas = {}, {}
        for name, value in tables.items():
            if not self.wants(name):
                continue
            if isinstance(value, pa.Table):
                pq.write_table(value, tmp / f"{name}.parquet", compression="lz4")
                fsync_path(tmp / f"{name}.parquet")
                kinds[name] = "arrow"
            else:
                value.write.parquet(str(tmp / name))
                kinds[name] = "spark"
                schemas[name] = value.schema.json()  # read back without inferring it (a job less)
        files = {name: _manifest(tmp / (f"{name}.parquet" if kind == "arrow" else name), kind == "arrow")
                 for name, kind in kinds.items()}
        meta = {"query_id": query_id, "batch_id": batch_id, "tables": kinds, "rows_out": rows_out,
                "schemas": schemas, "files": files}  # paths relative to the batch's directory
        (tmp / "_meta.json").write_text(json.dumps(meta))
        fsync_path(tmp / "_meta.json")
        fsync_path(tmp)
        final = self.root / str(batch_id)
        os.rename(tmp, final)
        fsync_path(self.root)
        faults.reached(CrashPoint.AFTER_STABLE_SAVE, batch_id)
        kept = {n: v if isinstance(v, pa.Table)
                else v.sparkSession.read.schema(v.schema).parquet(str(final / n))
                for n, v in tables.items() if self.wants(n)}
        return Persisted(kept, rows_out)

    def drop(self, batch_id: int) -> None:
        """Step 5: delete the copy of a batch its sink committed (idempotent)."""
        faults.reached(CrashPoint.BEFORE_STABLE_DROP, batch_id)
        shutil.rmtree(self.root / str(batch_id), ignore_errors=True)

