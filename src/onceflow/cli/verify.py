"""``onceflow verify``: inject faults into real runs and prove the sink exact."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from onceflow.cli.options import SinkKind, secret_dsn
from onceflow.verify.sinks import REALTIME, SINKS

if TYPE_CHECKING:
    from onceflow.verify.chaos import VerifyResult


@click.command()
@click.option("--rounds", default=10, show_default=True, type=click.IntRange(min=1),
              help="Fault rounds (each restarts the pipeline from its checkpoint).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--faults", default="all", show_default=True,
              help="Comma-separated fault names, or 'all' (executor_kill only with --cluster local, "
                   "worker_kill only with --cluster standalone, "
                   "crash_apply_pending only with --sink sqlite, crash_effects_* only with --sink "
                   "http (which has no crash_inside_sink_txn), crash_task_after_write only with --sink "
                   "delta-tasks, sqlite-tasks, postgres-tasks, kafka-tasks, http-tasks or http-tasks-pg, the "
                   "receiver_*, "
                   "sender_kill and dropped_acks faults only with --ingest).")
@click.option("--sink", type=SinkKind([*SINKS, REALTIME]), default="sqlite", show_default=True,
              help="The sink under test (as in 'onceflow run'; http: calls to a demo service verify "
                   "starts; delta-tasks, sqlite-tasks, postgres-tasks, kafka-tasks, http-tasks: every batch "
                   "written by Spark's tasks; http-tasks-pg: as http-tasks, the ledger in a new schema of "
                   "--pg-dsn; iceberg: the tables in Iceberg, a SQLite catalog); naive, lossy, "
                   "postgres-naive, http-naive, delta-naive and iceberg-naive are "
                   "negative controls: verify must fail. realtime: a --pipeline that writes with "
                   "onceflow.write_realtime "
                   "(Spark's Real-Time Mode into PostgreSQL; --source kafka; faults kill_random, "
                   "sink_outage).")
@click.option("--pg-dsn", envvar="ONCEFLOW_PG_DSN", default=None, show_envvar=True, callback=secret_dsn,
              help="PostgreSQL server for postgres* sinks and http-tasks-pg's ledger; the run writes to a "
                   "new schema there.")
@click.option("--cluster", type=click.Choice(["local", "standalone", "connect"]), is_flag=False,
              flag_value="local",
              default=None,
              help="Run on executors in their own JVMs: 'local' (also plain --cluster) is "
                   "local-cluster[2,1,1024] (enables executor_kill); 'standalone' starts a Spark "
                   "standalone master and two workers as separate processes on loopback (enables "
                   "worker_kill: a busy worker and its executor SIGKILLed, then restarted); 'connect' "
                   "runs every driver as a Spark Connect client of a server of its own (onceflow run "
                   "--remote local): the batches and crash points run in the server, a kill takes both.")
@click.option("--source", type=click.Choice(["log", "kafka"]), default="log", show_default=True,
              help="Where the pipeline reads: the event log (or --input's files with --pipeline), or a "
                   "Kafka topic on a Kafka broker (Apache Kafka's server, one KRaft node on loopback) that "
                   "verify starts and produces to (with --pipeline, input is '<bootstrap>/<topic>').")
@click.option("--ingest", is_flag=True,
              help="Feed the log through real senders and an 'onceflow ingest serve' receiver "
                   "(enables the receiver_*, sender_kill and dropped_acks faults).")
@click.option("--pipeline", default=None, metavar="PATH.py:FUNCTION",
              help="Verify your own pipeline instead of Example 5-1: a function (spark, input, sink, "
                   "checkpoint, once) that builds the query with onceflow.write_stream over the "
                   "directory input and returns it (see docs/verify.md). Needs --input.")
@click.option("--input", "input_dir", default=None, metavar="DIR|RECORDS",
              type=click.Path(exists=True, path_type=Path),
              help="With --pipeline: a directory of sample files your pipeline reads (JSON lines, CSV, "
                   "Parquet...); verify cuts them into pieces and feeds them in rounds. With --source "
                   "kafka: a JSON-lines file (or directory) of records ({\"key\", \"value\", "
                   "\"headers\"} or the value itself) verify produces to the topic in rounds.")
@click.option("--report", "report_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for report.json, report.html and the run's work files.")
@click.option("--resume", is_flag=True,
              help="Continue the run in --report DIR after an interruption (same other options).")
@click.option("--events-per-round", default=4_000, show_default=True, type=click.IntRange(min=100),
              help="Distinct events fed per round (1,000 to a segment); a soak is cheaper with "
                   "1000: one segment a round leaves no backlog for trigger_change rounds.")
@click.option("--fast-start/--no-fast-start", default=True, show_default=True,
              help="Start drivers from a class-data archive of Spark's classes with a quick JIT "
                   "(trained once per machine, kept in ~/.cache/onceflow), and pre-start the next "
                   "two rounds' drivers as hot standbys that touch nothing until released: "
                   "rounds ~2.5x cheaper; what the pipeline computes and commits is the same.")
@click.option("--keep-sink", is_flag=True,
              help="Keep the PostgreSQL schema the run wrote (by default it is dropped once judged).")
def verify(rounds: int, seed: int, faults: str, sink: str, pg_dsn: str | None, cluster: str | None,
           source: str, ingest: bool, resume: bool, report_dir: Path, events_per_round: int,
           fast_start: bool, pipeline: str | None, input_dir: Path | None, keep_sink: bool) -> None:
    """Run the pipeline under injected faults and check the sink against the oracle.

    Exit 0 when nothing was lost or duplicated and every round counted, 1 on any violation, 2 for
    bad usage, 3 when INCONCLUSIVE (fewer rounds counted than asked).
    """
    from onceflow.errors import ConfigError
    from onceflow.verify.chaos import VerifyConfig, run_verify
    from onceflow.verify.fault_kinds import default_faults

    names = [f.strip() for f in faults.split(",") if f.strip()]
    if sink == REALTIME:
        _verify_realtime(rounds, seed, names, pg_dsn, cluster, source, ingest, resume, report_dir,
                         pipeline, input_dir, keep_sink)
        return
    if names == ["all"]:
        names = default_faults(sink, cluster or "", ingest, pipeline=bool(pipeline))
    report_dir = report_dir.absolute()
    work = report_dir / "work"
    try:
        cfg = VerifyConfig(workdir=work, rounds=rounds, faults=names, seed=seed, sink=sink,
                           pg_dsn=pg_dsn, cluster=cluster or "", ingest=ingest, source=source,
                           events_per_round=events_per_round, fast_start=fast_start, pipeline=pipeline,
                           input_dir=input_dir.absolute() if input_dir else None, keep_sink=keep_sink)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    if work.exists() and not resume:
        shutil.rmtree(work)
    click.echo(f"verify: {rounds} rounds, faults {', '.join(names)}, sink {sink}, seed {seed}, "
               f"source {source}" + (f", cluster {cluster}" if cluster else "")
               + (", through senders and the ingest receiver" if ingest else "")
               + (f", pipeline {pipeline}" if pipeline else ""))
    _report(lambda: run_verify(cfg, say=click.echo, resume=resume), report_dir)


def _verify_realtime(rounds: int, seed: int, names: list[str], pg_dsn: str | None, cluster: str | None,
                     source: str, ingest: bool, resume: bool, report_dir: Path, pipeline: str | None,
                     input_dir: Path | None, keep_sink: bool) -> None:
    """``--sink realtime``: a Real-Time Mode pipeline's rounds (:mod:`onceflow.verify.realtime_rounds`)."""
    from onceflow.errors import ConfigError
    from onceflow.verify import realtime_rounds as rt

    try:  # the options of this command; run_realtime checks the pipeline and the connection string
        faults = rt.check(pipeline, source, list(rt.FAULTS) if names == ["all"] else names, cluster or "")
        if ingest or resume:
            raise ConfigError("--sink realtime does not combine with --ingest or --resume")
        if input_dir is None:
            raise ConfigError("--sink realtime needs --input RECORDS (a JSON-lines file of records)")
        assert pipeline is not None
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    report_dir = report_dir.absolute()
    work = report_dir / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    click.echo(f"verify: {rounds} rounds, faults {', '.join(faults)}, sink realtime, seed {seed}, source "
               f"kafka, pipeline {pipeline}")
    records = input_dir.absolute()
    _report(lambda: rt.run_realtime(work, pipeline, records, rounds, faults, seed, pg_dsn, say=click.echo,
                                    keep_sink=keep_sink), report_dir)


def _report(run: Callable[[], VerifyResult], report_dir: Path) -> None:
    """Run, print the summary, write the reports.

    Exit 0 when OK, 1 on a violation, 2 on bad usage, 3 when INCONCLUSIVE (no violation, but
    fewer rounds counted than asked: their faults hit no batch with input).
    """
    from onceflow.errors import ConfigError
    from onceflow.verify.report import print_summary, write_reports

    try:
        result = run()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    print_summary(result)
    jpath, hpath = write_reports(result, report_dir)
    click.echo(f"report written to {hpath} and {jpath}")
    sys.exit(0 if result.proven else 3 if result.ok else 1)
