"""``onceflow jars``: fetch the Java jars onceflow runs with (Kafka connector and broker, PostgreSQL JDBC)."""

from __future__ import annotations

import click

from onceflow.runtime import jars as jar_sets

_HELP = ("Java jars onceflow can run with, fetched from Maven Central and checked by SHA-256.\n\n"
         "\b\n"  # click: the table below is not rewrapped
         "kafka-connector  Spark's own Kafka connector, for onceflow.session(kafka=True)\n"
         "kafka-broker     a single-node Kafka broker (KRaft), for tests, demos and verify\n"
         "postgres-jdbc    PostgreSQL's JDBC driver, for onceflow.write_realtime\n"
         "onceflow         onceflow's own jars (id state store, checkpoint file manager), built into\n"
         "                 the wheel: `onceflow jars path onceflow` for spark-submit --jars\n")


def _kafka_tools() -> list[str]:
    from onceflow.verify.kafka_server import TOOLS

    return list(TOOLS)


@click.group("jars", help=_HELP)
def jars() -> None:
    """Java jars onceflow can run with (the sets are listed by ``onceflow jars --help``)."""


@jars.command("fetch")
@click.argument("names", nargs=-1, required=True, type=click.Choice(sorted(jar_sets.SETS)))
def fetch(names: tuple[str, ...]) -> None:
    """Download the named sets into the jar cache (once; a fetched set is kept).

    The cache is ~/.cache/onceflow/jars (ONCEFLOW_JARS_DIR); ONCEFLOW_MAVEN_REPO names a mirror
    with Maven Central's layout. Every jar's SHA-256 must match onceflow's pin.
    """
    for name in names:
        found = jar_sets.fetch(name, progress=lambda line: click.echo(line, err=True))
        click.echo(f"{name}: {len(found)} jars in {jar_sets.set_dir(name)}")


@jars.command("path")
@click.argument("name", type=click.Choice(sorted([*jar_sets.SETS, "onceflow"])))
def path(name: str) -> None:
    """Print the set's jars, comma-separated (for spark.jars / spark-submit --jars).

    ``onceflow`` prints onceflow's own jars: built into the wheel for the Spark version it was
    built with; for another Spark version they are compiled now into the cache (a few seconds).
    """
    if name == "onceflow":
        from onceflow.runtime import scalac

        click.echo(",".join(str(p) for p in scalac.shipped_jars()))
        return
    click.echo(",".join(str(p) for p in jar_sets.require(name)))


@click.command("kafka-tool", context_settings={"ignore_unknown_options": True,
                                               "allow_interspersed_args": False})
@click.argument("name", metavar="TOOL", type=click.Choice(sorted(_kafka_tools())))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kafka_tool(name: str, args: tuple[str, ...]) -> None:
    """Run one of Apache Kafka's own tools with the kafka-broker jar set (fetched on first use).

    TOOL is topics (kafka-topics.sh), console-consumer, console-producer, consumer-groups,
    get-offsets, transactions, verifiable-producer, verifiable-consumer or dump-log
    (kafka-dump-log.sh); every argument after it goes to the tool as it is, e.g.
    `onceflow kafka-tool console-consumer --bootstrap-server 127.0.0.1:9092 --topic orders
    --from-beginning --isolation-level read_committed`. Its logs (WARN and above) go to stderr.
    """
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from onceflow.verify.kafka_server import tool_command

    command = tool_command(name, list(args), Path(tempfile.gettempdir()) / "onceflow-kafka-tools")
    sys.exit(subprocess.call(command))
