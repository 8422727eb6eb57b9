"""The ingest receiver's commit protocol: validated events -> dedup catalog -> event log.

Requests reach this module validated and authorized (:mod:`onceflow.ingest.server`), with
their ids already in the catalog's namespace (``<sender>/<event_id>`` under the default
``sender`` id scope). Valid requests are **group-committed**: one writer takes every request
queued while the previous group was committing and writes them as one segment and one
catalog transaction, so throughput does not cost tiny files.

Group commit protocol (a crash or a power loss at any step neither loses an acked event nor
publishes an event twice; each step names what makes it durable):

1. Classify the group's events with the catalog (NEW / DUPLICATE / TOO_OLD); write nothing.
2. Stage the NEW events as a hidden file ``.ingest-<token>.parquet.tmp`` in the log
   directory, with the token in its Parquet metadata. Durable: the file is fsynced, then
   the directory (so the staged *name* survives a power loss too). Spark and the log ignore
   hidden files. Crash point ``ingest_after_stage``: recovery deletes a staged file without
   a pending row; its ids were not recorded and no sender got an ack, so the senders retry
   and the events are new.
3. One catalog transaction: insert the NEW ids and the row ``ingest_pending(token, file,
   ids)``. Durable: the store's commit (SQLite ``synchronous=FULL``, PostgreSQL
   ``synchronous_commit``). Crash point ``ingest_after_record``: the ids are recorded, so
   the events must appear: recovery publishes every pending file.
4. Publish the staged file as the next segment. Durable: rename, then fsync of the
   directory. Crash point ``ingest_after_publish``.
5. Delete the pending row (durable: the store's commit). A crash before this: recovery
   finds the file gone and the token in a published segment's metadata, and deletes the row.
6. Answer every request of the group with a status per event: ``new`` and ``duplicate``
   are acks; ``too_old`` means "too old to deduplicate": behind the GC watermark, not
   appended, counted — the sender must not retry it.

Recovery (:meth:`Receiver.recover`; at start-up before serving, and in the running process
after a group commit failed): for every pending row, in order —

* its staged file exists: steps 4-5 (the ids are recorded; the events must appear);
* the file is gone and a published segment carries its token: step 5 (published already);
* the file is gone and no segment carries its token: the file was never durably written
  (storage that lost a synced write, or an operator who deleted it). No sender got an ack
  for it, so the ids are taken back (:meth:`CatalogStore.unrecord`) and the senders'
  retries are new — never answered ``duplicate`` for events that are not in the log;

then deletion of staged files that have no pending row (step 2 without step 3).

A failed group commit (a full disk, a lost database connection) never stops the receiver:
the group's requests get 503 (507 for a full disk) and retry, the Bloom filters are
dropped (the store may hold ids they lack), and recovery runs before the next group. While
recovery itself fails the receiver answers 503 and tries again with the next request.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from onceflow import faults
from onceflow.errors import ConfigError, OnceflowError, StorageError
from onceflow.faults import CrashPoint
from onceflow.ingest.catalog import CatalogConfig, DedupCatalog
from onceflow.ingest.catalog.catalog import DUPLICATE, NEW, TOO_OLD
from onceflow.ingest.catalog.store import CatalogStore
from onceflow.sources.events import EVENT_SCHEMA
from onceflow.sources.log import EventLog

MIN_FREE_BYTES = 1 << 20
"""Below this much free space on the log's disk the receiver refuses to start."""


@dataclass
class ReceiverStats:
    """What the receiver did since it started.

    Attributes:
        requests: Requests answered 200.
        rejected: Requests answered 4xx.
        failed: Requests answered 5xx (a failed group commit, busy, not ready).
        groups: Group commits.
        failed_groups: Group commits that raised (answered 503/507, then recovered).
        events_new: Events appended to the log.
        events_duplicate: Events answered duplicate.
        events_too_old: Events answered too old.
        segments: Segments published.
        recovered: Pending segments published by recovery.
        unrecorded: Ids taken back by recovery (their segment was never written).
    """

    requests: int = 0
    rejected: int = 0
    failed: int = 0
    groups: int = 0
    failed_groups: int = 0
    events_new: int = 0
    events_duplicate: int = 0
    events_too_old: int = 0
    segments: int = 0
    recovered: int = 0
    unrecorded: int = 0
    group_sizes: list[int] = field(default_factory=list)


def storage_failure(exc: OSError, what: str) -> StorageError:
    """A clear error for a failed file operation: disk full and read-only named as such."""
    if isinstance(exc, StorageError):
        return exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc):
        return StorageError("full", f"{what}: the disk is full ({exc.strerror}); free space (nothing "
                                    "was accepted)")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only file system" in str(exc):
        return StorageError("read_only", f"{what}: cannot write ({exc.strerror}); make it writable")
    return StorageError("io", f"{what}: {exc}")


def check_log_dir(directory: Path) -> None:
    """At start-up: the log directory exists or can be made, is writable and has room.

    Raises:
        StorageError: Read-only, not writable, or (almost) full.
    """
    probe = directory / f".onceflow-probe-{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise storage_failure(exc, f"the log directory {directory}") from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:  # a read-only file system refuses even this
            pass
    free = shutil.disk_usage(directory).free
    if free < MIN_FREE_BYTES:
        raise StorageError("full", f"the log directory {directory} has only {free} bytes free; free space "
                                   "before starting the receiver")


class Receiver:
    """The group commit and its recovery (see the module protocol).

    Args:
        log_dir: The event log it appends to (it must be the log's only writer).
        catalog: The dedup catalog's SQLite file, or its store (e.g. PostgreSQL).
        cfg: Catalog configuration (GC delay required).
        id_scope: What the ids it gets are scoped by (``sender`` or ``global``); fixed in the
            catalog at first use, since a catalog filled under one scope cannot deduplicate
            retries under the other.
        max_group_events: Most events one group commit takes.

    Raises:
        StorageError: The log directory or the catalog cannot be written.
        ConfigError: The catalog was filled under another id scope.
    """

    def __init__(self, log_dir: Path, catalog: Path | CatalogStore, cfg: CatalogConfig,
                 id_scope: str = "sender", max_group_events: int = 100_000) -> None:
        self.log = EventLog(log_dir)
        check_log_dir(self.log.directory)
        self.catalog = DedupCatalog(catalog, cfg)
        self.store = self.catalog.store
        fixed = self.store.setting("id_scope", id_scope)
        if fixed != id_scope:
            self.store.close()
            raise ConfigError(f"the dedup catalog {self.store!r} holds ids of id scope {fixed!r}, not "
                              f"{id_scope!r}: its senders' retries would not be recognised; use "
                              f"--id-scope {fixed} or a new catalog (and log)")
        self._lock = threading.Lock()  # group commits, recovery and GC, one at a time
        self.max_group_events = max_group_events
        self.stats = ReceiverStats()
        self.broken: str | None = None
        """Why the last recovery failed (None: ready); requests get 503 meanwhile."""

    # ----------------------------------------------------------------- recovery
    def recover(self) -> int:
        """Finish or undo the groups a crash or a failure interrupted (see the module).

        Returns:
            Segments published.
        """
        with self._lock:
            return self._recover()

    def _recover(self) -> int:
        published = 0
        rows = self.store.pending()
        for token, name in rows:
            staged = self.log.directory / name
            if staged.exists():  # 4: recorded, not yet published
                self.log.publish(staged)
                published += 1
            elif self.log.find_token(token, last=len(rows) + 2) is None:  # never written
                gone = self.store.unrecord(token)
                self.stats.unrecorded += gone
                print(f"onceflow ingest: warning: the staged segment {name} of a recorded group is "
                      f"missing and was never published; took back its {gone} ids (no sender had an ack, "
                      "so they retry)", file=sys.stderr, flush=True)
                continue
            self.store.pending_done(token)  # 5
        pending = {f for _, f in self.store.pending()}
        for orphan in self.log.directory.glob(".ingest-*.tmp"):
            if orphan.name not in pending:  # staged, never recorded: no ack was sent
                orphan.unlink()
        self.stats.recovered += published
        self.broken = None
        return published

    def _after_failure(self, exc: BaseException) -> None:
        """A group commit raised: drop the filters, recover, or stay broken until it works."""
        self.stats.failed_groups += 1
        self.catalog.reset_filters()
        print(f"onceflow ingest: group commit failed ({exc}); recovering", file=sys.stderr, flush=True)
        try:
            self._recover()
        except Exception as again:  # storage still failing: refuse requests until it works
            self.broken = f"recovery after a failed group commit failed: {again}"
            print(f"onceflow ingest: {self.broken}; answering 503 until it succeeds",
                  file=sys.stderr, flush=True)

    # ----------------------------------------------------------------- commit
    def commit_group(self, groups: list[pa.Table]) -> list[np.ndarray]:
        """Steps 1-5 for the events of several requests (blocking; never leaves a half state).

        Args:
            groups: Each request's validated events (columns of the wire format, ids scoped).

        Returns:
            Each request's statuses, as catalog codes (``NEW``, ``DUPLICATE``, ``TOO_OLD``).

        Raises:
            StorageError: The storage failed (the group is not committed; recovery ran).
            OnceflowError: Another failure (same).
        """
        with self._lock:
            if self.broken is not None:
                try:
                    self._recover()
                except Exception as exc:
                    raise OnceflowError(f"the receiver cannot recover its storage yet: {exc}") from None
            try:
                return self._commit_group(groups)
            except Exception as exc:
                self._after_failure(exc)
                if isinstance(exc, OSError):
                    raise storage_failure(exc, "writing the log") from None
                if isinstance(exc, OnceflowError):
                    raise
                raise OnceflowError(f"group commit failed: {exc!r}") from None

    def _commit_group(self, groups: list[pa.Table]) -> list[np.ndarray]:
        flat = pa.concat_tables(groups)
        ids = flat.column("event_id").to_pylist()
        times = flat.column("system_time").to_numpy()
        codes = self.catalog.classify_codes(ids, times)  # 1
        fresh = flat.filter(pa.array(codes == NEW, pa.bool_()))
        self.stats.groups += 1
        n = self.stats.groups
        if fresh.num_rows:
            token = uuid.uuid4().hex
            staged = self.log.stage(_to_table(fresh), f".ingest-{token}.parquet.tmp", token)  # 2
            faults.reached(CrashPoint.INGEST_AFTER_STAGE, n)
            self.catalog.record_codes(ids, times, codes, pending=(token, staged.name))  # 3
            faults.reached(CrashPoint.INGEST_AFTER_RECORD, n)
            self.log.publish(staged)  # 4
            faults.reached(CrashPoint.INGEST_AFTER_PUBLISH, n)
            self.store.pending_done(token)  # 5
            self.stats.segments += 1
        counts = np.bincount(codes, minlength=3)
        self.stats.events_new += fresh.num_rows
        self.stats.events_duplicate += int(counts[DUPLICATE])
        self.stats.events_too_old += int(counts[TOO_OLD])
        self.stats.group_sizes.append(flat.num_rows)
        del self.stats.group_sizes[:-1000]
        out, i = [], 0
        for g in groups:
            out.append(codes[i:i + g.num_rows])
            i += g.num_rows
        return out

    def advance_gc(self) -> int:
        """Move the catalog's GC watermark (between group commits); return ids deleted."""
        with self._lock:
            return self.catalog.advance_gc()


def _to_table(events: pa.Table) -> pa.Table:
    """Wire-format columns -> the event schema (microsecond integers become timestamps)."""
    return pa.table([events.column(f.name).cast(f.type) for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)
