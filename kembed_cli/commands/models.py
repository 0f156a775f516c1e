"""``kembed models``: the live models of the catalog topic, as a table or JSON; and
``kembed models check DIR``, which proves a model folder against sentence-transformers
before it is served (``worker.model_check``).

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
    local_models_only,
    quiet_kafka_logs,
    security_options,
    settings_from,
    text_table,
    write_json,
)
from kembed_cli.extras import require
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
    "cannot be reached. 'kembed models check DIR' compares a model folder as kembed "
    "serves it with sentence-transformers instead (see 'kembed models check --help')."
)

CHECK_DESCRIPTION = (
    "Load a model folder in kembed and in sentence-transformers (fp32, CPU), embed a "
    "fixed, shipped set of texts (short, long, over the window, several scripts) with "
    "each of the model's prompts, and report each text's cosine between the two. Exit "
    "status 0 when every cosine is at least 0.9999, 1 when one is lower, 2 when kembed "
    "refuses the folder (a module or setting it does not run), cannot find it, or "
    "sentence-transformers is not installed (pip install 'kembed[check]')."
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
    actions = parser.add_subparsers(dest="models_action", metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="prove a model folder against sentence-transformers",
        description=CHECK_DESCRIPTION,
    )
    check.add_argument(
        "model", help="a model folder, or a model id in the local Hugging Face cache"
    )
    check.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "models_action", None) == "check":
        return run_check(args.model, as_json=args.json)
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


def run_check(model: str, *, as_json: bool) -> int:
    """``kembed models check``: see :data:`CHECK_DESCRIPTION`."""
    require("models check", "worker")
    local_models_only()
    from worker.encoder.models import ModelNotFoundError, resolve_model_dir
    from worker.model_check import THRESHOLD, ReferenceMissingError, check_model
    from worker.model_settings import default_name

    try:
        report = check_model(resolve_model_dir(model), default_name(model))
    except (ModelNotFoundError, ReferenceMissingError, ValueError) as exc:
        print(f"kembed models check: {exc}", file=sys.stderr)
        return 2
    if as_json:
        write_json(report.as_json(), indent=2)
    else:
        rows = [
            (
                t.label,
                t.prompt or "-",
                str(t.tokens),
                f"{t.cosine:.6f}",
                "ok" if t.passed else "FAIL",
            )
            for t in report.texts
        ]
        print(
            f"{report.model}: dim {report.dim}, window {report.max_seq_length} tokens, "
            f"pooling {report.pooling}"
        )
        print("\n".join(text_table(("text", "prompt", "tokens", "cosine", "result"), rows)))
        worst = report.worst
        verdict = "passed" if report.passed else "FAILED"
        print(
            f"{verdict}: the lowest cosine is {worst.cosine:.6f} ({worst.label}); "
            f"threshold {THRESHOLD}"
        )
    return 0 if report.passed else 1
