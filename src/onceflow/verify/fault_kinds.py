"""The faults ``onceflow verify`` injects, and which sinks and options can reach each.

A fault either makes a round (the driver is killed, crashes at a named point, sees an
ambiguous commit, ...; :data:`ROUND_FAULTS`) or holds for the whole run (producer retries and
late events in the input, a receiver dropping acks; :data:`INPUT_FAULTS`). ``--faults all``
means :func:`default_faults`: every fault the run's sink and options can reach.
"""

from __future__ import annotations

from onceflow.verify.ingest_rig import INGEST_INPUT_FAULTS, INGEST_ROUND_FAULTS

CRASH_FAULTS = {
    "crash_before_sink_write": "before_sink_write",
    "crash_inside_sink_txn": "inside_sink_txn",
    "crash_after_sink_commit": "after_sink_commit",
    "crash_after_commit_log": "after_commit_log",
    "crash_apply_pending": "apply_pending",
    "crash_effects_started": "effects_started",
    "crash_effects_sent": "effects_sent",
    "crash_task_after_write": "task_after_write",
}
"""Fault name -> crash point: the driver SIGKILLs its JVM and itself there."""

STAGED_SQLITE_FAULTS = ("crash_apply_pending",)
"""Faults at a point only the SQLite sink's staged path (``--sink sqlite``) has."""

EFFECT_FAULTS = ("crash_effects_started", "crash_effects_sent")
"""Faults at points only the side-effect sinks' driver-side path (``--sink http``, ``http-naive``) has."""

TASK_SINKS = ("delta-tasks", "sqlite-tasks", "postgres-tasks", "kafka-tasks", "http-tasks", "http-tasks-pg",
              "iceberg")
"""The sinks whose every batch Spark's tasks write (``collect_below=0``; Iceberg's always)."""

TASK_FAULTS = ("crash_task_after_write",)
"""Faults of the tasks that write a batch's rows (the :data:`TASK_SINKS`): not the driver. Not on a
cluster, where Spark retries a failed task (the batch then commits in the same round)."""

NO_TXN_SINKS = ("http", "http-tasks", "http-tasks-pg", "http-naive")
"""Sinks without a transaction to crash inside (no ``crash_inside_sink_txn``)."""


def reaches(sink: str, fault: str) -> bool:
    """Whether a run with ``--sink sink`` can reach ``fault`` (several sinks ``a+b``: if one can)."""
    if "+" in sink:
        return any(reaches(one, fault) for one in sink.split("+"))
    if fault in STAGED_SQLITE_FAULTS:
        return sink == "sqlite"
    if fault in EFFECT_FAULTS:
        return sink in ("http", "http-naive")
    if fault in TASK_FAULTS or fault == "executor_kill_mid_write":
        return sink in TASK_SINKS
    if fault == "crash_inside_sink_txn":
        return sink not in NO_TXN_SINKS
    if fault == "crash_after_sink_commit":
        return sink != "http-naive"  # no ledger commit: the naive sink returns after its calls
    if fault == "sink_outage":  # a database or table to take away, or a writer to race (not a service)
        return sink not in NO_TXN_SINKS
    return True

SPARK_FAULTS = ["kill_random", *CRASH_FAULTS, "ambiguous_commit", "trigger_change", "executor_kill",
                "worker_kill", "executor_kill_mid_write", "sink_outage"]
"""Faults of the Spark side that make a round."""

ROUND_FAULTS = SPARK_FAULTS + INGEST_ROUND_FAULTS
"""Faults that make a round."""

VERIFY_KILL = "verify_kill"
"""Record kind of a resumed round whose input was all in the log when verify was killed."""

INPUT_FAULTS = ["producer_duplicates", "late_events", *INGEST_INPUT_FAULTS]
"""Faults that hold for the whole run (in the input, or the receiver dropping acks)."""

ALL_FAULTS = ROUND_FAULTS + INPUT_FAULTS
INGEST_FAULTS = INGEST_ROUND_FAULTS + INGEST_INPUT_FAULTS
CLUSTER_MASTER = "local-cluster[2,1,1024]"


CLUSTERS = ("", "local", "standalone", "connect")
"""``--cluster`` choices: none (``local[*]``), ``local-cluster[2,1,1024]``, a standalone master
and two workers (:mod:`onceflow.verify.standalone`), or Spark Connect: each driver a client of a
server of its own (``onceflow run --remote local``, :func:`onceflow.verify.connect_server.private_server`),
the batches run by the server's ``foreachBatch`` worker, the crash points fired there."""

CLUSTER_FAULTS = {"executor_kill": ("local",), "worker_kill": ("standalone",),
                  "executor_kill_mid_write": ("local", "standalone")}
"""Faults that need executors of a cluster kind: an executor JVM of the local cluster killed,
a whole standalone worker (with its executor) killed and restarted, or (``--sink *-tasks``) the
executor of a task that has written part of its rows killed by the task itself (crash point
``task_mid_write``, each task's first attempt: Spark runs it again elsewhere)."""


def default_faults(sink: str = "sqlite", cluster: bool | str = "", ingest: bool = False,
                   pipeline: bool = False) -> list[str]:
    """What ``--faults all`` means for a run: every fault the sink and options can reach.

    Args:
        sink: The run's ``--sink``.
        cluster: One of :data:`CLUSTERS` (True: ``local``).
        ingest: Senders and a receiver feed the log (the ingest faults).
        pipeline: A user's pipeline (``--pipeline``): its sample is the input, so none of the
            input faults verify generates.

    Returns:
        Fault names, in :data:`ALL_FAULTS` order.
    """
    kind = cluster_kind(cluster)
    return [f for f in ALL_FAULTS if kind in CLUSTER_FAULTS.get(f, (kind,))
            and (ingest or f not in INGEST_FAULTS) and reaches(sink, f)
            and not (pipeline and f in INPUT_FAULTS) and not (kind and f in TASK_FAULTS)]


def cluster_kind(cluster: bool | str) -> str:
    """The ``--cluster`` choice a ``cluster`` value means (True: ``local``; False: none)."""
    return "local" if cluster is True else "" if cluster is False else cluster
