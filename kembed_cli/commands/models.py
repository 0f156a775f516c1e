"""``kembed models``: the live models of the catalog topic, as a table or JSON.

Reads the catalog with the producer SDK's reader (``producer_sdk.catalog``), so the command
shows exactly what clients route by.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kembed_cli.common import (
    add_settings_flags,
    quiet_kafka_logs,
    security_options,
    settings_from,
    text_table,
    write_json,
)
from kembed_shared.settings import KafkaClientSettings
from schemas.catalog import DEFAULT_CATALOG_TOPIC

if TYPE_CHECKING:
    from producer_sdk.catalog import CatalogModel

__all__ = ["DESCRIPTION", "add_arguments", "models_json", "render_models", "run"]

_COLUMNS = (
    "name",
    "kind",
    "aliases",
    "dim",
    "pooling",
    "dtype",
    "quantization",
    "workers",
    "topic",
)


DESCRIPTION = (
    "Read the model catalog topic and list the models live workers "
    "announce: name, kind (embed: an embedding model; rerank: a cross-encoder), "
    "aliases, dimension, pooling, precision, how many workers serve "
    "it and the topic requests for it go to. Exit status 0, or 2 when the brokers "
    "cannot be reached."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, KafkaClientSettings)
    parser.add_argument(
        "--catalog-topic",
        default=os.environ.get("KEMBED_CATALOG_TOPIC") or DEFAULT_CATALOG_TOPIC,
        help="the catalog topic [env: KEMBED_CATALOG_TOPIC] (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for Kafka (default: 10)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from producer_sdk import ClientConfig, KembedError
    from producer_sdk.catalog import read_catalog

    kafka = settings_from(KafkaClientSettings, args, "models")
    if kafka is None:
        return 2
    config = ClientConfig(
        kafka.bootstrap_servers,
        client_id="kembed-models",
        catalog_topic=args.catalog_topic,
        **security_options(kafka),
    )
    try:
        with quiet_kafka_logs():
            models = asyncio.run(read_catalog(config, timeout=args.timeout))
    except KembedError as exc:
        print(f"kembed models: {exc}", file=sys.stderr)
        return 2
    if args.json:
        write_json(models_json(models), indent=2)
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
            model.kind,
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
    return "\n".join(text_table(_COLUMNS, rows))
