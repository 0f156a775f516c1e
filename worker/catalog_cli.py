"""``kembed models``: the live models of the catalog topic, as a table or JSON.

Reads the catalog with the producer SDK's reader (``producer_sdk.catalog``), so the command
shows exactly what clients route by.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from schemas.catalog import DEFAULT_CATALOG_TOPIC
from worker.settings import SECURITY_FIELDS, KafkaClientSettings

if TYPE_CHECKING:
    from producer_sdk.catalog import CatalogModel

__all__ = ["add_models_command", "models_json", "render_models"]

_COLUMNS = ("name", "aliases", "dim", "pooling", "dtype", "quantization", "workers", "topic")


def add_models_command(
    commands: Any,
    add_flags: Callable[[argparse.ArgumentParser, type[KafkaClientSettings]], None],
    settings: Callable[[argparse.Namespace], KafkaClientSettings | None],
) -> None:
    """Add ``models`` to the ``kembed`` subcommands. ``add_flags`` adds the Kafka connection
    flags; ``settings`` reads them back (None after printing why they are invalid)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "models",
        help="list the models the workers serve (the model catalog)",
        description="Read the model catalog topic and list the models live workers "
        "announce: name, aliases, dimension, pooling, precision, how many workers serve "
        "it and the topic requests for it go to. Exit status 0, or 2 when the brokers "
        "cannot be reached.",
    )
    add_flags(parser, KafkaClientSettings)
    parser.add_argument(
        "--catalog-topic",
        default=os.environ.get("KEMBED_CATALOG_TOPIC") or DEFAULT_CATALOG_TOPIC,
        help="the catalog topic [env: KEMBED_CATALOG_TOPIC] (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for Kafka (default: 10)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=lambda args: _run(args, settings(args)))


def _run(args: argparse.Namespace, kafka: KafkaClientSettings | None) -> int:
    from producer_sdk import ClientConfig, KembedError
    from producer_sdk.catalog import read_catalog

    if kafka is None:
        return 2
    security = {name: getattr(kafka, name) for name in SECURITY_FIELDS}
    config = ClientConfig(
        kafka.bootstrap_servers,
        client_id="kembed-models",
        catalog_topic=args.catalog_topic,
        **security,
    )
    # aiokafka logs every failed connection attempt; the outcome is reported once below.
    aiokafka_log = logging.getLogger("aiokafka")
    quiet, propagate = logging.NullHandler(), aiokafka_log.propagate
    aiokafka_log.addHandler(quiet)
    aiokafka_log.propagate = False
    try:
        models = asyncio.run(read_catalog(config, timeout=args.timeout))
    except KembedError as exc:
        print(f"kembed models: {exc}", file=sys.stderr)
        return 2
    finally:
        aiokafka_log.removeHandler(quiet)
        aiokafka_log.propagate = propagate
    if args.json:
        json.dump(models_json(models), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif models:
        print(render_models(models))
    else:
        print(f"no live models on {args.catalog_topic}")
    return 0


def models_json(models: Sequence[CatalogModel]) -> list[dict[str, Any]]:
    return [
        {
            **dataclasses.asdict(model),
            "aliases": list(model.aliases),
            "instances": list(model.instances),
            "prompts": dict(model.prompts),
        }
        for model in models
    ]


def render_models(models: Sequence[CatalogModel]) -> str:
    rows = [
        (
            model.name,
            ", ".join(model.aliases) or "-",
            str(model.dim),
            model.pooling,
            model.dtype,
            model.quantization,
            str(model.workers),
            model.requests_topic,
        )
        for model in models
    ]
    widths = [max(len(row[i]) for row in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in [_COLUMNS, *rows]]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)
