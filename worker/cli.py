"""The ``kembed`` command.

    kembed worker [--flag value ...]   run a worker (flags mirror KEMBED_* env vars)
    kembed embed TEXT [TEXT ...]       embed texts through Kafka and print JSON

Worker flags are generated from :class:`~worker.settings.WorkerSettings`, so a setting, its
env var and its flag can never drift apart; a flag given on the command line wins over the
env var.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from schemas import Encoding
from worker.settings import WorkerSettings

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handler: Any = args.handler
    return int(handler(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kembed", description="Kafka-native text-embedding service."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    worker = commands.add_parser(
        "worker",
        help="run a worker",
        description="Consume embedding requests, publish vectors. Every flag is also an "
        "environment variable KEMBED_<FLAG> (dashes as underscores); a flag wins.",
    )
    _add_settings_flags(worker)
    worker.set_defaults(handler=_run_worker)

    embed = commands.add_parser(
        "embed", help="embed texts through Kafka and print the vectors as JSON"
    )
    embed.add_argument("texts", nargs="+", metavar="TEXT")
    embed.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KEMBED_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers [env: KEMBED_BOOTSTRAP_SERVERS]",
    )
    embed.add_argument("--model", default=None, help="model to ask for (default: the served one)")
    embed.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    embed.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    embed.add_argument("--dimensions", type=int, default=None, help="keep the first N dims")
    embed.add_argument(
        "--encoding",
        choices=[str(encoding) for encoding in Encoding],
        default=str(Encoding.FLOAT32),
        help="output encoding: int8 prints codes and per-vector scales, binary packed bytes",
    )
    embed.set_defaults(handler=_run_embed)
    return parser


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in WorkerSettings.model_fields.items():
        env = f"KEMBED_{name.upper()}"
        kind, choices = _flag_type(field.annotation)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            metavar=name.upper() if choices is None else None,
            help=f"{field.description} [env: {env}] (default: {field.default})",
        )


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """argparse type and choices for a settings field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if annotation is bool:
        return str, ["true", "false"]
    if annotation in (int, float):
        return annotation, None
    return str, None


def _run_worker(args: argparse.Namespace) -> int:
    overrides = {
        name: value
        for name in WorkerSettings.model_fields
        if (value := getattr(args, name)) is not None
    }
    try:
        settings = WorkerSettings(**overrides)
    except ValidationError as exc:
        print(f"kembed worker: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    # Never reach for a model hub at run time: models come from local files only.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # One tokenizer thread is enough and leaves the cores to the encoder (the Rust
    # tokenizer would otherwise spread each large batch over every core).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from worker.app import run_worker

    asyncio.run(run_worker(settings))
    return 0


def _run_embed(args: argparse.Namespace) -> int:
    from producer_sdk import EmbedClient, KembedError

    async def run() -> dict[str, Any]:
        async with EmbedClient(args.bootstrap_servers) as client:
            result = await client.embed_result(
                args.texts,
                timeout=args.timeout,
                model=args.model,
                normalize=not args.no_normalize,
                dimensions=args.dimensions,
                encoding=args.encoding,
            )
        output: dict[str, Any] = {"dim": result.dim, "vectors": result.vectors.tolist()}
        if result.encoding != Encoding.FLOAT32:
            output["encoding"] = str(result.encoding)
        if result.scales is not None:
            output["scales"] = result.scales.tolist()
        return output

    try:
        output = asyncio.run(run())
    except KembedError as exc:
        print(f"kembed embed: {exc}", file=sys.stderr)
        return 1
    json.dump(output, sys.stdout)
    sys.stdout.write("\n")
    return 0
