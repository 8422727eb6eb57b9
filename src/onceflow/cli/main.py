"""Entry point of the ``onceflow`` command."""

from __future__ import annotations

import sys

import click

from onceflow import __version__
from onceflow.cli.demo import demo
from onceflow.cli.effects import effects
from onceflow.cli.generate import generate
from onceflow.cli.ingest import ingest, send
from onceflow.cli.jars import jars, kafka_tool
from onceflow.cli.rejects import rejects
from onceflow.cli.repair import repair
from onceflow.cli.run import connect_server, pipelines, run
from onceflow.cli.tables import maintain, tables
from onceflow.cli.verify import verify
from onceflow.errors import OnceflowError
from onceflow.verify.resume import register_self


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onceflow")
def cli() -> None:
    """Exactly-once stream processing for PySpark Structured Streaming."""


cli.add_command(generate)
cli.add_command(run)
cli.add_command(pipelines)
cli.add_command(connect_server)
cli.add_command(demo)
cli.add_command(verify)
cli.add_command(ingest)
cli.add_command(send)
cli.add_command(effects)
cli.add_command(rejects)
cli.add_command(repair)
cli.add_command(tables)
cli.add_command(maintain)
cli.add_command(jars)
cli.add_command(kafka_tool)


def main() -> None:
    """Run the CLI; onceflow errors print one clear message and exit 1."""
    register_self()  # a process started by ``onceflow verify``: list it for a resume
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except OnceflowError as exc:
        click.echo(f"onceflow: error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
