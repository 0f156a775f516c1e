"""``kembed ingest``: a JSONL file (or stdin) into the bulk lane, with a progress bar.

``worker.cli`` parses the command line and the Kafka settings and calls
:func:`run_ingest_command`; everything else (reading, sending, reporting, exit status)
lives here, on the SDK's public API.

Exit status: 0 when every document was acknowledged by Kafka (lines skipped with
``skip_invalid`` are reported, not failures); 1 when Kafka refused or failed (cannot
connect, login rejected, no right to write the topic, a send failed); 2 for unusable input
(unreadable file, an invalid line without ``skip_invalid``, a document too large for one
request) or arguments; 130 when interrupted. After a failure the error message says how
many documents were acknowledged before it: those are in Kafka and will be answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from aiokafka.errors import KafkaError

from producer_sdk.client import EmbedClient
from producer_sdk.errors import IngestError, KembedError, RequestTooLargeError
from producer_sdk.ingest import IngestSummary, JsonlError, JsonlReader, ingest
from producer_sdk.progress import ProgressBar, format_bytes
from schemas.codec import is_valid_topic

__all__ = ["IngestCommand", "run_ingest_command"]

OK, KAFKA_FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130


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
    skip_invalid: bool = False
    quiet: bool = False


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
    try:
        opened = _open(command.source)
    except OSError as exc:
        return fail(f"cannot read {command.source}: {exc.strerror or exc}", BAD_INPUT)
    with opened as file, _quiet_kafka_logs():
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


@contextlib.contextmanager
def _quiet_kafka_logs() -> Iterator[None]:
    """aiokafka logs every failed connection attempt; the outcome is reported once."""
    kafka_log = logging.getLogger("aiokafka")
    quiet, propagate = logging.NullHandler(), kafka_log.propagate
    kafka_log.addHandler(quiet)
    kafka_log.propagate = False
    try:
        yield
    finally:
        kafka_log.removeHandler(quiet)
        kafka_log.propagate = propagate
