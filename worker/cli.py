"""The ``kembed`` command.

    kembed worker [--flag value ...]   run a worker (flags mirror KEMBED_* env vars)
    kembed embed TEXT [TEXT ...]       embed texts through Kafka and print JSON
    kembed validate [--flag value ...] the quality gate: this precision against fp32

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
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from worker.settings import (
    SECURITY_FIELDS,
    KafkaClientSettings,
    WorkerSettings,
    describe_errors,
)

__all__ = ["main"]

_S = TypeVar("_S", bound=BaseModel)


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

    validate = commands.add_parser(
        "validate",
        help="check a precision or quantization against fp32 on reference pairs",
        description="Embed reference pairs (default: STS-B test, English) with the "
        "configured model, dtype, quantization and compilation and with fp32, and report "
        "Spearman x100 against gold for both and the cosine between them. Exit 0 when the "
        "gate passes, 1 when it fails. Takes the worker's flags and KEMBED_* variables.",
    )
    _add_settings_flags(validate)
    validate.add_argument("--pairs", type=Path, default=None, help="CSV text1,text2,score")
    validate.add_argument("--limit", type=int, default=None, help="use the first N pairs")
    validate.add_argument(
        "--max-spearman-drop", type=float, default=None, help="gate threshold (default 0.5)"
    )
    validate.add_argument(
        "--min-mean-cosine", type=float, default=None, help="gate threshold (default 0.99)"
    )
    validate.add_argument("--json", action="store_true", help="print the report as JSON")
    validate.set_defaults(handler=_run_validate)

    embed = commands.add_parser(
        "embed",
        help="embed texts through Kafka and print the vectors as JSON",
        description="Embed texts through Kafka and print the vectors as JSON. The Kafka "
        "connection flags are the worker's, and read the same KEMBED_* environment "
        "variables (so a password need not be on the command line).",
    )
    embed.add_argument("texts", nargs="+", metavar="TEXT")
    _add_settings_flags(embed, KafkaClientSettings)
    embed.add_argument("--model", default=None, help="model to ask for (default: the served one)")
    embed.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    embed.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    embed.add_argument("--dimensions", type=int, default=None, help="keep the first N dims")
    embed.set_defaults(handler=_run_embed)
    return parser


def _add_settings_flags(
    parser: argparse.ArgumentParser, model: type[BaseModel] = WorkerSettings
) -> None:
    for name, field in model.model_fields.items():
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


def _settings(model: type[_S], args: argparse.Namespace, command: str) -> _S | None:
    """Settings from flags over env vars; None (after saying why) when they are invalid."""
    overrides = {
        name: value for name in model.model_fields if (value := getattr(args, name)) is not None
    }
    try:
        return model(**overrides)
    except ValidationError as exc:
        # Never print pydantic's own text: it repeats the inputs, secrets included.
        print(f"kembed {command}: invalid settings:\n{describe_errors(exc)}", file=sys.stderr)
        return None


def _local_models_only() -> None:
    # Never reach for a model hub at run time: models come from local files only.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # One tokenizer thread is enough and leaves the cores to the encoder (the Rust
    # tokenizer would otherwise spread each large batch over every core).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _run_worker(args: argparse.Namespace) -> int:
    settings = _settings(WorkerSettings, args, "worker")
    if settings is None:
        return 2
    _local_models_only()
    from worker.app import QualityGateFailedError, run_worker
    from worker.ports import KafkaAccessError

    try:
        asyncio.run(run_worker(settings))
    except KafkaAccessError:
        return 1  # run_worker logged why
    except QualityGateFailedError as exc:
        print(f"kembed worker: quality gate failed, not starting: {exc}", file=sys.stderr)
        return 3
    return 0


def _run_validate(args: argparse.Namespace) -> int:
    settings = _settings(WorkerSettings, args, "validate")
    if settings is None:
        return 2
    _local_models_only()
    from worker.quality import GateThresholds, default_pairs_path, load_pairs, validate

    thresholds = GateThresholds(
        settings.quality_max_spearman_drop
        if args.max_spearman_drop is None
        else args.max_spearman_drop,
        settings.quality_min_mean_cosine if args.min_mean_cosine is None else args.min_mean_cosine,
    )
    path = args.pairs or Path(settings.quality_gate_pairs or default_pairs_path())
    try:
        pairs = load_pairs(path, args.limit)
    except (OSError, ValueError, IndexError) as exc:
        print(f"kembed validate: cannot read reference pairs {path}: {exc}", file=sys.stderr)
        return 2
    report = validate(settings, pairs, thresholds)
    if args.json:
        json.dump(report.as_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(report.summary())
    return 0 if report.passed else 1


def _run_embed(args: argparse.Namespace) -> int:
    from producer_sdk import EmbedClient, KembedError

    kafka = _settings(KafkaClientSettings, args, "embed")
    if kafka is None:
        return 2
    security = {name: getattr(kafka, name) for name in SECURITY_FIELDS}

    async def run() -> dict[str, Any]:
        async with EmbedClient(kafka.bootstrap_servers, **security) as client:
            vectors = await client.embed(
                args.texts,
                timeout=args.timeout,
                model=args.model,
                normalize=not args.no_normalize,
                dimensions=args.dimensions,
            )
        return {"dim": int(vectors.shape[1]), "vectors": vectors.tolist()}

    try:
        output = asyncio.run(run())
    except KembedError as exc:
        print(f"kembed embed: {exc}", file=sys.stderr)
        return 1
    json.dump(output, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
