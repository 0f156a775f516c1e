"""What the ``kembed`` subcommands share: flags generated from settings models, reading
them back, and quiet Kafka client logs.

Flags are generated from the pydantic settings models (``WorkerSettings``,
``KafkaClientSettings``, ``SinkSettings``), so a setting, its env var and its flag can never
drift apart; a flag given on the command line wins over the env var.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from kembed_cli.extras import require
from kembed_shared.settings import KafkaClientSettings, describe_errors, security_options
from schemas import Chunking

__all__ = [
    "ServiceCommand",
    "add_chunking_flags",
    "add_settings_flags",
    "chunking_from",
    "local_models_only",
    "positive_int",
    "quiet_kafka_logs",
    "run_to_exit",
    "security_options",
    "settings_from",
    "text_table",
    "write_json",
]

_S = TypeVar("_S", bound=BaseModel)


def add_settings_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel] = KafkaClientSettings,
    env_prefix: str = "KEMBED_",
    only: Sequence[str] | None = None,
) -> None:
    """One ``--flag`` per field of ``model`` (or of its fields named in ``only``), its help
    the field's description."""
    for name, field in model.model_fields.items():
        if only is not None and name not in only:
            continue
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


def settings_from(model: type[_S], args: argparse.Namespace, command: str) -> _S | None:
    """Settings from flags over env vars; None (after saying why) when they are invalid."""
    overrides = {
        name: value
        for name in model.model_fields
        if (value := getattr(args, name, None)) is not None
    }
    try:
        return model(**overrides)
    except ValidationError as exc:
        # Never print pydantic's own text: it repeats the inputs, secrets included.
        print(f"kembed {command}: invalid settings:\n{describe_errors(exc)}", file=sys.stderr)
        return None


@dataclass(frozen=True, slots=True)
class ServiceCommand(Generic[_S]):
    """A service's subcommand (``sink``, ``gateway``): its module takes ``add_arguments``
    and ``run`` from one of these."""

    name: str
    """The subcommand, which is also the name of the extra it needs."""
    model: type[_S]
    """Its settings."""
    prefix: str
    """Their environment variables' prefix."""
    serve: Callable[[_S, KafkaClientSettings], int]
    """Serves with valid settings; the exit status."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Its own flags (env vars ``<prefix><NAME>``), then the Kafka connection flags
        every kembed process shares (``KEMBED_<NAME>``)."""
        add_settings_flags(parser, self.model, env_prefix=self.prefix)
        add_settings_flags(parser, KafkaClientSettings)

    def run(self, args: argparse.Namespace) -> int:
        """Its extra must be installed, its own settings and the Kafka ones valid (else
        exit status 2, after saying what is wrong with either); then ``serve(settings,
        kafka)``'s exit status."""
        require(self.name, self.name)
        settings = settings_from(self.model, args, self.name)
        kafka = settings_from(KafkaClientSettings, args, self.name)
        if settings is None or kafka is None:
            return 2
        return self.serve(settings, kafka)


def run_to_exit(service: str, body: Callable[[], int]) -> int:
    """``body()``'s exit status. Whatever else ends it is one log event
    (``<service>.interrupted``, ``<service>.fatal``), never a raw traceback
    (docs/operations.md, "Exit statuses")."""
    from kembed_shared.observability.fatal import ExitCode, log_fatal

    try:
        return body()
    except KeyboardInterrupt as exc:  # SIGINT before the service's own handler is in place
        log_fatal(exc, f"{service}.interrupted", exit_code=int(ExitCode.INTERRUPTED))
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (anything else: logged, never a raw traceback)
        log_fatal(exc, f"{service}.fatal", exit_code=int(ExitCode.FAILED))
        return ExitCode.FAILED


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return value


def add_chunking_flags(parser: argparse.ArgumentParser, *, pooling_help: str) -> None:
    """``--chunk-tokens N`` and ``--chunk-overlap M``: cut each text into windows of at
    most N tokens (special and prompt tokens included) overlapping by M, instead of
    truncating it (schemas/README.md, "Chunking"); read back by :func:`chunking_from`.
    ``--chunk-pooling none|mean`` (``pooling_help``: what each gives the command's user)."""
    parser.add_argument(
        "--chunk-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="cut each text into chunks of at most N tokens instead of truncating it",
    )
    parser.add_argument(
        "--chunk-overlap",
        type=int,
        default=0,
        metavar="M",
        help="tokens consecutive chunks share (with --chunk-tokens; default 0)",
    )
    parser.add_argument(
        "--chunk-pooling", choices=["none", "mean"], default="none", help=pooling_help
    )


def chunking_from(args: argparse.Namespace) -> Chunking | None:
    """The ``chunking`` the flags of :func:`add_chunking_flags` ask for; ValueError for
    numbers that make no window."""
    if args.chunk_tokens is None:
        if args.chunk_overlap:
            raise ValueError("--chunk-overlap needs --chunk-tokens")
        return None
    try:
        return Chunking(args.chunk_tokens, args.chunk_overlap)
    except ValueError:
        raise ValueError(
            f"--chunk-overlap must be 0..{args.chunk_tokens - 1} (below --chunk-tokens), "
            f"not {args.chunk_overlap}"
        ) from None


def local_models_only() -> None:
    """Never reach for a model hub at run time: models come from local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # One tokenizer thread is enough and leaves the cores to the encoder (the Rust
    # tokenizer would otherwise spread each large batch over every core).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextlib.contextmanager
def quiet_kafka_logs() -> Iterator[None]:
    """aiokafka logs every failed connection attempt; a command reports the outcome once."""
    kafka_log = logging.getLogger("aiokafka")
    quiet, propagate = logging.NullHandler(), kafka_log.propagate
    kafka_log.addHandler(quiet)
    kafka_log.propagate = False
    try:
        yield
    finally:
        kafka_log.removeHandler(quiet)
        kafka_log.propagate = propagate


def write_json(value: Any, indent: int | None = None) -> None:
    """``value`` as JSON on standard output, one document and a newline."""
    import json

    json.dump(value, sys.stdout, indent=indent)
    sys.stdout.write("\n")


def text_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] | None = None
) -> list[str]:
    """Aligned text columns, two spaces apart; columns in ``right`` align right."""
    right = right or set()
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]
