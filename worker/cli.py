"""The ``kembed`` command.

    kembed worker [--flag value ...]   run a worker (flags mirror KEMBED_* env vars)
    kembed embed TEXT [TEXT ...]       embed texts through Kafka and print JSON
    kembed validate [--flag value ...] the quality gate: this precision against fp32
    kembed status [--json]             the consumer group: members, assignment, lag
    kembed ingest FILE.jsonl [...]     submit documents to the bulk lane (answers to --reply-to)
    kembed models [--json]             the models live workers announce (the catalog)
    kembed sink --target URI [...]     upsert results into pgvector or Milvus (sink/)

Worker flags are generated from :class:`~worker.settings.WorkerSettings`, so a setting, its
env var and its flag can never drift apart; a flag given on the command line wins over the
env var.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from schemas import Encoding
from worker.catalog_cli import add_models_command
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
    validate.add_argument(
        "--pairs",
        type=Path,
        default=None,
        help="CSV text1,text2,score (default: STS-B test, English, shipped with kembed)",
    )
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
    embed.add_argument(
        "--encoding",
        choices=[str(encoding) for encoding in Encoding],
        default=str(Encoding.FLOAT32),
        help="output encoding: int8 prints codes and per-vector scales, binary packed bytes",
    )
    embed.set_defaults(handler=_run_embed)

    status = commands.add_parser(
        "status",
        help="show the consumer group: members, partition assignment, lag and backlog",
        description="Ask the brokers about the workers' consumer group: its members, the "
        "partitions each holds, and per request partition the committed offset, the end "
        "offset (high watermark) and the lag. Exit status 0, or 2 when the brokers cannot "
        "be reached or the group is unknown.",
    )
    _add_settings_flags(status, KafkaClientSettings)
    status.add_argument(
        "--group",
        default=os.environ.get("KEMBED_GROUP_ID", _default("group_id")),
        help="the workers' consumer group [env: KEMBED_GROUP_ID]",
    )
    status.add_argument(
        "--topics",
        default=",".join(_request_topics()),
        help="request topics to report, comma separated "
        "[env: KEMBED_REQUESTS_TOPIC, KEMBED_BULK_TOPIC, KEMBED_MODELS] (default: %(default)s)",
    )
    status.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's /metrics URL (repeat for each worker) to add the backlog in tokens "
        "(kembed_backlog_tokens); without it the backlog is reported in messages only",
    )
    status.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for answers (default: 10)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.set_defaults(handler=_run_status)

    ingest = commands.add_parser(
        "ingest",
        help="submit the documents of a JSONL file to the bulk lane",
        description="Read documents from a JSONL file (one JSON object per line; - reads "
        "standard input) and submit them in batches to the bulk request topic, without "
        "waiting for the vectors: workers answer on --reply-to, one result per batch with "
        "the documents' ids as keys and their metadata in meta.docs, for a sink to read. "
        "Exit status 0 when Kafka acknowledged every document, 1 when Kafka failed or "
        "refused, 2 for unusable input or settings. Takes the Kafka flags of kembed embed.",
    )
    ingest.add_argument("source", metavar="FILE", help="JSONL file, or - for standard input")
    ingest.add_argument("--text-field", default="text", help="field holding the text")
    ingest.add_argument("--id-field", default="id", help="field holding the document id")
    ingest.add_argument(
        "--meta-field",
        dest="meta_fields",
        action="append",
        default=[],
        metavar="FIELD",
        help="field copied into the document's metadata (repeat for more)",
    )
    ingest.add_argument("--reply-to", default=None, help="topic for the results")
    ingest.add_argument("--model", default=None, help="model to ask for")
    ingest.add_argument("--batch-size", type=_positive_int, default=256, help="docs per request")
    ingest.add_argument(
        "--max-in-flight", type=_positive_int, default=4, help="requests awaiting Kafka at once"
    )
    ingest.add_argument(
        "--topic",
        default=os.environ.get("KEMBED_BULK_TOPIC") or _default("bulk_topic"),
        help="request topic [env: KEMBED_BULK_TOPIC] (default: %(default)s)",
    )
    ingest.add_argument("--prompt", default=None, help="text prepended to every input")
    ingest.add_argument("--dimensions", type=_positive_int, default=None, help="keep N dims")
    ingest.add_argument("--no-normalize", action="store_true", help="skip L2 normalization")
    ingest.add_argument(
        "--encoding", choices=[str(e) for e in Encoding], default=str(Encoding.FLOAT32)
    )
    ingest.add_argument(
        "--skip-invalid", action="store_true", help="skip and count bad lines instead of failing"
    )
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_settings_flags(ingest, KafkaClientSettings)
    ingest.set_defaults(handler=_run_ingest)
    add_models_command(
        commands, _add_settings_flags, lambda a: _settings(KafkaClientSettings, a, "models")
    )

    sink = commands.add_parser(
        "sink",
        help="consume results and upsert them into PostgreSQL/pgvector or Milvus",
        description="Consume a results topic as a consumer group and upsert each vector by "
        "its key into a PostgreSQL table with pgvector or a Milvus collection; offsets are "
        "committed after the database transaction. Sink flags are also environment "
        "variables KEMBED_SINK_<FLAG>; the Kafka connection flags are the worker's "
        "(KEMBED_<FLAG>). Exit status 2 for invalid settings or an unusable target (a table "
        "of another dimension), 1 when Kafka or the database fails.",
    )
    _add_settings_flags(sink, _sink_settings_model(), env_prefix="KEMBED_SINK_")
    _add_settings_flags(sink, KafkaClientSettings)
    sink.set_defaults(handler=_run_sink)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return value


def _default(name: str) -> str:
    return str(WorkerSettings.model_fields[name].default)


def _request_topics() -> list[str]:
    """The workers' request topics, as their env vars (KEMBED_MODELS included) name them;
    the defaults when those do not validate (a worker would refuse to start with them)."""
    try:
        interactive, bulk = WorkerSettings.model_validate({}).request_topics()
    except ValidationError:
        return [_default("requests_topic"), _default("bulk_topic")]
    return interactive + bulk


def _add_settings_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel] = WorkerSettings,
    env_prefix: str = "KEMBED_",
) -> None:
    for name, field in model.model_fields.items():
        env = f"{env_prefix}{name.upper()}"
        kind, choices = _flag_type(field.annotation)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            metavar=name.upper() if choices is None else None,
            help=f"{field.description} [env: {env}] "
            + ("(required)" if field.is_required() else f"(default: {field.default})"),
        )


def _sink_settings_model() -> type[BaseModel]:
    from sink.settings import SinkSettings

    return SinkSettings


def _run_sink(args: argparse.Namespace) -> int:
    from sink.cli import run
    from sink.settings import SinkSettings

    settings = _settings(SinkSettings, args, "sink")
    kafka = _settings(KafkaClientSettings, args, "sink")
    if settings is None or kafka is None:
        return 2
    return run(settings, kafka)


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
    from worker.observability.fatal import ExitCode, install_hooks, log_fatal, secrets_of
    from worker.observability.logging import configure_logging

    # From here on every way out is one log event (docs/operations.md, "Exit statuses"):
    # no raw traceback, whatever fails, the imports of torch and transformers included.
    configure_logging(settings.log_level, settings.log_format)
    install_hooks(secrets_of(settings))
    try:
        return _serve_worker(settings)
    except KeyboardInterrupt as exc:  # SIGINT before the worker's own handler is in place
        log_fatal(exc, "worker.interrupted", exit_code=int(ExitCode.INTERRUPTED))
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (anything else: logged, never a raw traceback)
        log_fatal(exc, exit_code=int(ExitCode.FAILED))
        return ExitCode.FAILED


def _serve_worker(settings: WorkerSettings) -> int:
    """Run the worker; the exit status of the failures it logged itself."""
    from worker.app import ModelLoadError, QualityGateFailedError, run_worker
    from worker.observability.fatal import ExitCode
    from worker.ports import KafkaAccessError

    try:
        asyncio.run(run_worker(settings))
    except KafkaAccessError:
        return ExitCode.FAILED  # logged as kafka.*_failed
    except ModelLoadError:
        return ExitCode.STARTUP  # logged as model.load_failed
    except QualityGateFailedError:
        return ExitCode.QUALITY_GATE  # logged as quality_gate.failed
    return ExitCode.OK


def _run_validate(args: argparse.Namespace) -> int:
    settings = _settings(WorkerSettings, args, "validate")
    if settings is None:
        return 2
    _local_models_only()
    from worker.quality import GateThresholds, gate_pairs_path, load_pairs, validate

    thresholds = GateThresholds(
        settings.quality_max_spearman_drop
        if args.max_spearman_drop is None
        else args.max_spearman_drop,
        settings.quality_min_mean_cosine if args.min_mean_cosine is None else args.min_mean_cosine,
    )
    path = gate_pairs_path(args.pairs or settings.quality_gate_pairs)
    try:
        pairs = load_pairs(path, args.limit)
    except (OSError, ValueError, IndexError) as exc:
        print(f"kembed validate: cannot read reference pairs {path}: {exc}", file=sys.stderr)
        return 2
    passed = True
    specs = settings.model_specs()
    for spec in specs:  # KEMBED_MODELS: each model as its worker would serve it
        report = validate(settings.for_model(spec), pairs, thresholds)
        report.pairs_source = str(path)
        passed = passed and report.passed
        name = spec.served_name()
        if args.json:
            json.dump(report.as_dict() | ({"model": name} if len(specs) > 1 else {}), sys.stdout)
            sys.stdout.write("\n")
        else:
            if report.tuning is not None:
                print(_tuning_table(name, report.tuning))
            print(f"{name}: {report.summary()}" if len(specs) > 1 else report.summary())
    return 0 if passed else 1


def _tuning_table(name: str, tuning: dict[str, Any]) -> str:
    """dtype/torch_compile auto as measured, one line per candidate."""
    lines = [f"{name}: auto measured {len(tuning['table'])} candidates, chose {tuning['chosen']}"]
    for row in tuning["table"]:
        speed = "-" if row["texts_per_s"] is None else f"{row['texts_per_s']:.0f} texts/s"
        cosine = "-" if row["mean_cosine"] is None else f"{row['mean_cosine']:.5f}"
        mark = " <- chosen" if row["chosen"] else ""
        lines.append(
            f"  {row['candidate']:<18} {row['status']:<8} {speed:>14}  cosine {cosine}{mark}"
        )
    return "\n".join(lines)


def _run_embed(args: argparse.Namespace) -> int:
    from producer_sdk import EmbedClient, KembedError

    kafka = _settings(KafkaClientSettings, args, "embed")
    if kafka is None:
        return 2
    security = {name: getattr(kafka, name) for name in SECURITY_FIELDS}

    async def run() -> dict[str, Any]:
        async with EmbedClient(kafka.bootstrap_servers, **security) as client:
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


def _run_ingest(args: argparse.Namespace) -> int:
    from producer_sdk.ingest_command import IngestCommand, run_ingest_command

    kafka = _settings(KafkaClientSettings, args, "ingest")
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
        skip_invalid=args.skip_invalid,
        quiet=args.quiet,
    )
    security = {name: getattr(kafka, name) for name in SECURITY_FIELDS}
    return run_ingest_command(command, kafka.bootstrap_servers, security)


def _run_status(args: argparse.Namespace) -> int:
    import logging

    from worker.fleet import (
        FleetStatus,
        StatusError,
        read_backlog_tokens,
        render_table,
        to_json,
    )
    from worker.kafka.group_status import read_fleet_status
    from worker.kafka.security import client_options

    kafka = _settings(KafkaClientSettings, args, "status")
    if kafka is None:
        return 2
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]

    async def read() -> FleetStatus:
        async with asyncio.timeout(args.timeout):
            return await read_fleet_status(
                kafka.bootstrap_servers,
                args.group,
                topics,
                request_timeout_ms=max(int(args.timeout * 1000), 1),
                security=client_options(kafka),
            )

    # aiokafka logs every failed connection attempt; the outcome is reported once below.
    aiokafka_log = logging.getLogger("aiokafka")
    quiet, propagate = logging.NullHandler(), aiokafka_log.propagate
    aiokafka_log.addHandler(quiet)
    aiokafka_log.propagate = False
    try:
        if not topics:
            raise StatusError("no topics to report (--topics is empty)")
        status = asyncio.run(read())
        if args.metrics_url:
            status = dataclasses.replace(
                status,
                backlog_tokens=read_backlog_tokens(args.metrics_url, args.timeout),
                metrics_urls=tuple(args.metrics_url),
            )
    except StatusError as exc:
        print(f"kembed status: {exc}", file=sys.stderr)
        return 2
    except TimeoutError:
        print(
            f"kembed status: no answer from Kafka at {kafka.bootstrap_servers} "
            f"within {args.timeout:g} s",
            file=sys.stderr,
        )
        return 2
    finally:
        aiokafka_log.removeHandler(quiet)
        aiokafka_log.propagate = propagate
    if args.json:
        json.dump(to_json(status), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
