"""``kembed ingest``: a JSONL file (or stdin) into the bulk lane, with a progress bar.

:func:`run` parses the command line and the Kafka settings and calls
:func:`run_ingest_command`, which reads, sends and reports on the SDK's public API.

Exit status: 0 when every document was acknowledged by Kafka (lines skipped with
``skip_invalid`` are reported, not failures); 1 when Kafka refused or failed (cannot
connect, login rejected, no right to write the topic, a send failed); 2 for unusable input
(unreadable file, an invalid line without ``skip_invalid``, a document too large for one
request) or arguments; 130 when interrupted. After a failure the error message says how
many documents were acknowledged before it: those are in Kafka and will be answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from kembed_cli.common import (
    add_chunking_flags,
    add_settings_flags,
    positive_int,
    quiet_kafka_logs,
    security_options,
    settings_from,
)
from kembed_cli.progress import ProgressBar, format_bytes
from kembed_shared.kafka.errors import KafkaError
from kembed_shared.settings import KafkaClientSettings
from producer_sdk.client import EmbedClient
from producer_sdk.errors import IngestError, KembedError, RequestTooLargeError
from producer_sdk.ingest import IngestSummary, ingest
from producer_sdk.jsonl import JsonlError, JsonlReader
from schemas import Chunking, Encoding
from schemas.codec import is_valid_topic
from worker.settings import WorkerSettings

__all__ = ["IngestCommand", "DESCRIPTION", "add_arguments", "run", "run_ingest_command"]

OK, KAFKA_FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130

_DEFAULT_TOPIC = str(WorkerSettings.model_fields["bulk_topic"].default)


DESCRIPTION = (
    "Read documents from a JSONL file (one JSON object per line; - reads "
    "standard input) and submit them in batches to the bulk request topic, without "
    "waiting for the vectors: workers answer on --reply-to, one result per batch with "
    "the documents' ids as keys and their metadata in meta.docs, for a sink to read. "
    "Exit status 0 when Kafka acknowledged every document, 1 when Kafka failed or "
    "refused, 2 for unusable input or settings. Takes the Kafka flags of kembed embed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="FILE", help="JSONL file, or - for standard input")
    parser.add_argument("--text-field", default="text", help="field holding the text")
    parser.add_argument("--id-field", default="id", help="field holding the document id")
    parser.add_argument(
        "--meta-field",
        dest="meta_fields",
        action="append",
        default=[],
        metavar="FIELD",
        help="field copied into the document's metadata (repeat for more)",
    )
    parser.add_argument("--reply-to", default=None, help="topic for the results")
    parser.add_argument("--model", default=None, help="model to ask for")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="docs per request")
    parser.add_argument(
        "--max-in-flight", type=positive_int, default=4, help="requests awaiting Kafka at once"
    )
    parser.add_argument(
        "--topic",
        default=os.environ.get("KEMBED_BULK_TOPIC") or _DEFAULT_TOPIC,
        help="request topic [env: KEMBED_BULK_TOPIC] (default: %(default)s)",
    )
    parser.add_argument("--prompt", default=None, help="text prepended to every input")
    parser.add_argument("--dimensions", type=positive_int, default=None, help="keep N dims")
    parser.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    parser.add_argument(
        "--encoding", choices=[str(e) for e in Encoding], default=str(Encoding.FLOAT32)
    )
    add_chunking_flags(
        parser,
        pooling_help="none: one vector (row) per chunk; mean: one per document, the mean of its "
        "chunks' (with --chunk-tokens; default: none)",
    )
    parser.add_argument(
        "--chunks-per-request",
        type=positive_int,
        default=256,
        metavar="N",
        help="with --chunk-tokens: about N chunks per request at most (estimated at 3 "
        "characters per token), so results stay under the workers' max_result_bytes and "
        "max_client_batch_size (default: %(default)s)",
    )
    parser.add_argument(
        "--sparse-model",
        default=None,
        metavar="NAME",
        help="also send each batch to this sparse (SPLADE-style) encoder: a sink writes both "
        "kinds of each document (not chunked: one sparse vector per document)",
    )
    parser.add_argument(
        "--sparse-top-k",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --sparse-model: keep each document's N largest term weights (pgvector's "
        "HNSW index holds at most 1000)",
    )
    parser.add_argument(
        "--no-dense",
        action="store_true",
        help="with --sparse-model: send the sparse requests only",
    )
    parser.add_argument(
        "--skip-invalid", action="store_true", help="skip and count bad lines instead of failing"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_settings_flags(parser, KafkaClientSettings)


def run(args: argparse.Namespace) -> int:
    kafka = settings_from(KafkaClientSettings, args, "ingest")
    if kafka is None:
        return 2
    command = IngestCommand(
        source=args.source,
        text_field=args.text_field,
        id_field=args.id_field,
        meta_fields=tuple(args.meta_fields),
        topic=args.topic,
        reply_to=args.reply_to,
        model=args.model,
        batch_size=args.batch_size,
        max_in_flight=args.max_in_flight,
        prompt=args.prompt,
        normalize=not args.no_normalize,
        dimensions=args.dimensions,
        encoding=args.encoding,
        chunk_tokens=args.chunk_tokens,
        chunk_overlap=args.chunk_overlap,
        chunk_pooling=args.chunk_pooling,
        chunks_per_request=args.chunks_per_request,
        sparse_model=args.sparse_model,
        sparse_top_k=args.sparse_top_k,
        dense=not args.no_dense,
        skip_invalid=args.skip_invalid,
        quiet=args.quiet,
    )
    return run_ingest_command(command, kafka.bootstrap_servers, security_options(kafka))


@dataclass(frozen=True, slots=True)
class IngestCommand:
    source: str
    """A JSONL file, or "-" for standard input."""
    text_field: str = "text"
    id_field: str = "id"
    meta_fields: tuple[str, ...] = ()
    topic: str = "embed.requests.bulk"
    reply_to: str | None = None
    model: str | None = None
    batch_size: int = 256
    max_in_flight: int = 4
    prompt: str | None = None
    normalize: bool = True
    dimensions: int | None = None
    encoding: str = "float32"
    chunk_tokens: int | None = None
    """Chunk each document into windows of this many tokens (None: no chunking)."""
    chunk_overlap: int = 0
    chunk_pooling: str = "none"
    chunks_per_request: int = 256
    sparse_model: str | None = None
    """Also send each batch to this sparse encoder."""
    sparse_top_k: int | None = None
    dense: bool = True
    skip_invalid: bool = False
    quiet: bool = False

    def chunking(self) -> Chunking | None:
        """The requests' ``chunking`` (ValueError for impossible numbers)."""
        if self.chunk_tokens is None:
            return None
        return Chunking(self.chunk_tokens, self.chunk_overlap)


def run_ingest_command(
    command: IngestCommand,
    bootstrap_servers: str,
    client_options: Mapping[str, Any],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``kembed ingest``; return its exit status. ``client_options`` are further
    :class:`~producer_sdk.ClientConfig` fields (the security settings)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr

    def fail(message: str, status: int) -> int:
        print(f"kembed ingest: {message}", file=err)
        return status

    if command.reply_to is not None and not is_valid_topic(command.reply_to):
        return fail(f"--reply-to {command.reply_to!r} is not a valid Kafka topic name", BAD_INPUT)
    if not is_valid_topic(command.topic):
        return fail(f"--topic {command.topic!r} is not a valid Kafka topic name", BAD_INPUT)
    if command.chunk_tokens is None and (command.chunk_overlap or command.chunk_pooling != "none"):
        return fail("--chunk-overlap and --chunk-pooling need --chunk-tokens", BAD_INPUT)
    try:
        command.chunking()
    except ValueError as exc:
        return fail(f"--chunk-tokens/--chunk-overlap: {exc}", BAD_INPUT)
    try:
        opened = _open(command.source)
    except OSError as exc:
        return fail(f"cannot read {command.source}: {exc.strerror or exc}", BAD_INPUT)
    with opened as file, quiet_kafka_logs():
        reader = JsonlReader(
            file,
            text_field=command.text_field,
            id_field=command.id_field,
            meta_fields=command.meta_fields,
            skip_invalid=command.skip_invalid,
        )
        bar = ProgressBar(err, enabled=not command.quiet)
        try:
            summary = asyncio.run(
                _ingest(command, reader, bar, bootstrap_servers, dict(client_options))
            )
        except KeyboardInterrupt:
            bar.close()
            return fail(
                "interrupted; requests not yet acknowledged may or may not be in Kafka", 130
            )
        except IngestError as exc:
            bar.close()
            return fail(_stopped(exc), _status(exc.cause))
        except (KembedError, KafkaError) as exc:
            bar.close()
            return fail(_kafka_failure(exc, bootstrap_servers), KAFKA_FAILED)
        bar.close()
    _report_skipped(reader, err)
    print(_summary_line(command, summary, reader), file=out)
    return OK


async def _ingest(
    command: IngestCommand,
    reader: JsonlReader,
    bar: ProgressBar,
    bootstrap_servers: str,
    client_options: dict[str, Any],
) -> IngestSummary:
    client = EmbedClient(
        bootstrap_servers,
        bulk_topic=command.topic,
        read_replies=False,
        client_id="kembed-ingest",
        **client_options,
    )
    async with client:
        return await ingest(
            client,
            reader,
            batch_size=command.batch_size,
            max_in_flight=command.max_in_flight,
            on_progress=lambda summary: bar.update(summary, reader.position, reader.total_bytes),
            reply_to=command.reply_to,
            model=command.model,
            prompt=command.prompt,
            normalize=command.normalize,
            dimensions=command.dimensions,
            encoding=command.encoding,
            chunking=command.chunking(),
            chunk_pooling=command.chunk_pooling,
            chunks_per_request=command.chunks_per_request,
            sparse_model=command.sparse_model,
            sparse_top_k=command.sparse_top_k,
            dense=command.dense,
        )


def _open(source: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    if source == "-":
        return contextlib.nullcontext(sys.stdin.buffer)
    return Path(source).open("rb")


def _status(cause: BaseException) -> int:
    if isinstance(cause, JsonlError | RequestTooLargeError | OSError):
        return BAD_INPUT
    if isinstance(cause, KembedError | KafkaError):
        return KAFKA_FAILED
    return BAD_INPUT  # TypeError, ValueError: arguments the request refused


def _stopped(exc: IngestError) -> str:
    done = exc.summary
    cause = exc.cause
    reason = str(cause) if isinstance(cause, KembedError) else f"{type(cause).__name__}: {cause}"
    if isinstance(cause, OSError):
        reason = f"cannot read input: {cause}"
    if done.documents:
        return (
            f"{reason}\nkembed ingest: {_count(done.documents, 'document')} in "
            f"{_count(done.requests, 'request')} were acknowledged before it stopped; "
            "they will be answered"
        )
    return f"{reason} (nothing was sent)"


def _kafka_failure(exc: BaseException, bootstrap_servers: str) -> str:
    if isinstance(exc, KembedError):
        return str(exc)
    return f"cannot use Kafka at {bootstrap_servers}: {type(exc).__name__}: {exc}"


def _report_skipped(reader: JsonlReader, err: TextIO) -> None:
    if not reader.skipped:
        return
    print(f"kembed ingest: skipped {_count(reader.skipped, 'invalid line')}", file=err)
    for error in reader.errors:
        print(f"  {error}", file=err)
    if reader.skipped > len(reader.errors):
        print(f"  ... and {reader.skipped - len(reader.errors):,} more", file=err)


def _summary_line(command: IngestCommand, summary: IngestSummary, reader: JsonlReader) -> str:
    reply_to = command.reply_to or "embed.results"
    line = (
        f"ingested {_count(summary.documents, 'document')} in "
        f"{_count(summary.requests, 'request')} "
        f"({format_bytes(summary.bytes)} of text) to {command.topic} in "
        f"{summary.seconds:.1f} s ({summary.documents_per_second:,.0f} docs/s); "
        f"answers go to {reply_to}"
    )
    if reader.skipped:
        line += f"; skipped {_count(reader.skipped, 'invalid line')}"
    return line


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
