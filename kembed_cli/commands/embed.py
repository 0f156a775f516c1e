"""``kembed embed``: embed texts through Kafka and print the vectors as JSON."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from kembed_cli.common import (
    add_chunking_flags,
    add_settings_flags,
    chunking_from,
    security_options,
    settings_from,
    write_json,
)
from kembed_shared.settings import KafkaClientSettings
from schemas import Encoding

__all__ = ["DESCRIPTION", "add_arguments", "run"]


DESCRIPTION = (
    "Embed texts through Kafka and print the vectors as JSON. The Kafka "
    "connection flags are the worker's, and read the same KEMBED_* environment "
    "variables (so a password need not be on the command line)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="+", metavar="TEXT")
    add_settings_flags(parser, KafkaClientSettings)
    parser.add_argument("--model", default=None, help="model to ask for (default: the served one)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    parser.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    parser.add_argument("--dimensions", type=int, default=None, help="keep the first N dims")
    parser.add_argument(
        "--encoding",
        choices=[str(encoding) for encoding in Encoding],
        default=str(Encoding.FLOAT32),
        help="output encoding: int8 prints codes and per-vector scales, binary packed bytes",
    )
    add_chunking_flags(
        parser,
        pooling_help="with --chunk-tokens: 'none' prints a vector per chunk with its span, "
        "'mean' one vector per text (the mean of its chunks)",
    )


def run(args: argparse.Namespace) -> int:
    from producer_sdk import EmbedClient, KembedError

    kafka = settings_from(KafkaClientSettings, args, "embed")
    if kafka is None:
        return 2
    try:
        chunking = chunking_from(args)
        if args.chunk_pooling != "none" and chunking is None:
            raise ValueError("--chunk-pooling needs --chunk-tokens")
    except ValueError as exc:
        print(f"kembed embed: {exc}", file=sys.stderr)
        return 2

    async def embed() -> dict[str, Any]:
        async with EmbedClient(kafka.bootstrap_servers, **security_options(kafka)) as client:
            result = await client.embed_result(
                args.texts,
                timeout=args.timeout,
                model=args.model,
                normalize=not args.no_normalize,
                dimensions=args.dimensions,
                encoding=args.encoding,
                chunking=chunking,
                chunk_pooling=args.chunk_pooling,
            )
        output: dict[str, Any] = {"dim": result.dim, "vectors": result.vectors.tolist()}
        if result.chunks is not None and result.spans is not None:
            # One vector per chunk (or per text with mean pooling), and where each chunk is.
            output["chunks"] = list(result.chunks)
            output["spans"] = [list(span) for span in result.spans]
            output["tokens"] = list(result.tokens)
        if result.encoding != Encoding.FLOAT32:
            output["encoding"] = str(result.encoding)
        if result.scales is not None:
            output["scales"] = result.scales.tolist()
        return output

    try:
        output = asyncio.run(embed())
    except KembedError as exc:
        print(f"kembed embed: {exc}", file=sys.stderr)
        return 1
    write_json(output)
    return 0
