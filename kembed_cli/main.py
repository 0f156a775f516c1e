"""The ``kembed`` command.

    kembed worker [--flag value ...]   run a worker (flags mirror KEMBED_* env vars)
    kembed validate [--flag value ...] the quality gate: this precision against fp32
    kembed embed TEXT [TEXT ...]       embed texts through Kafka and print JSON
    kembed ingest FILE.jsonl [...]     submit documents to the bulk lane (answers to --reply-to)
    kembed status [--json]             the consumer group: members, assignment, lag
    kembed models [--json]             the models live workers announce (the catalog)
    kembed models check DIR            prove a model folder against sentence-transformers
    kembed sink --target URI [...]     upsert results into pgvector or Milvus (sink/)
    kembed gateway [--flag value ...]  OpenAI- and TEI-shaped HTTP APIs (gateway/)
    kembed topics create|check [...]   create or check the fleet's topics

Each subcommand is a module of :mod:`kembed_cli.commands` with ``DESCRIPTION``,
``add_arguments`` and ``run``; only the module of the subcommand being run is imported,
so ``kembed embed`` never loads the worker, and a subcommand whose extra is not installed
(``kembed[worker]``, ``kembed[sink]``, ``kembed[gateway]``) says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from kembed_cli.extras import MissingExtraError
from kembed_shared.version import kembed_version

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

COMMANDS: dict[str, str] = {
    "worker": "run a worker",
    "validate": "check a precision or quantization against fp32 on reference pairs",
    "embed": "embed texts through Kafka and print the vectors as JSON",
    "ingest": "submit the documents of a JSONL file to the bulk lane",
    "status": "show the consumer group: members, partition assignment, lag and backlog",
    "models": "list the models the workers serve (the model catalog)",
    "sink": "consume results and upsert them into PostgreSQL/pgvector or Milvus",
    "gateway": "serve OpenAI's and TEI's embedding APIs over HTTP, in front of Kafka",
    "topics": "create or check the topics the workers and sinks need",
}
"""Subcommand -> one line of help; the module is ``kembed_cli.commands.<subcommand>``."""

_USAGE = 2


class Command(Protocol):
    """What a module of :mod:`kembed_cli.commands` provides."""

    DESCRIPTION: str
    """What the subcommand does, for its ``--help``."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's arguments and flags to its parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Run it; the exit status."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = next((arg for arg in args if not arg.startswith("-")), None)
    if name not in COMMANDS:
        overview = _parser(None)
        if name is None and any(arg in ("-h", "--help", "--version") for arg in args):
            overview.parse_args(args)  # prints the help or the version and exits 0
        if name is None:
            overview.print_help()
        else:
            overview.print_usage(sys.stderr)
            choices = ", ".join(COMMANDS)
            print(f"kembed: unknown command {name!r} (choose from {choices})", file=sys.stderr)
        return _USAGE
    command = _command(name)
    parsed = build_parser(name).parse_args(args)
    try:
        return int(command.run(parsed))
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return _USAGE


def build_parser(name: str) -> argparse.ArgumentParser:
    """The ``kembed`` parser with subcommand ``name`` in full (and the others listed)."""
    return _parser((name, _command(name)))


def _command(name: str) -> Command:
    return cast(Command, importlib.import_module(f"kembed_cli.commands.{name}"))


def _parser(chosen: tuple[str, Command] | None) -> argparse.ArgumentParser:
    """The parser with every subcommand listed; with ``command``, that one in full."""
    parser = argparse.ArgumentParser(
        prog="kembed", description="Kafka-native text-embedding service."
    )
    parser.add_argument(
        "--version", action="version", version=f"kembed {kembed_version('(not installed)')}"
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if chosen is not None and chosen[0] == name:
            command = chosen[1]
            command.add_arguments(
                subcommands.add_parser(name, help=summary, description=command.DESCRIPTION)
            )
        else:
            subcommands.add_parser(name, help=summary)
    return parser
