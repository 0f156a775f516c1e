"""structlog set-up: JSON lines in production, readable lines for people.

Log events carry ids, counts, lengths and Kafka coordinates, never request text; settings
are logged through :func:`redacted` so that secrets never reach a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from pydantic import SecretBytes, SecretStr

from kembed_shared.ports import Record, TopicPartition

__all__ = ["configure_logging", "partition_names", "record_fields", "redacted"]

_SECRET_WORDS = ("password", "secret", "credential")


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Route structlog and stdlib logging (aiokafka, transformers) to one stderr stream."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    logging.captureWarnings(True)  # Python warnings as log events, not raw stderr lines
    root.setLevel(logging.getLevelNamesMapping()[level.upper()])
    # Libraries' info chatter (every aiokafka rebalance step) is noise; keep their warnings.
    for noisy in ("aiokafka", "kafka", "transformers", "huggingface_hub", "urllib3"):
        logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings fit for a log line: anything that looks like a secret is masked."""
    return {
        name: "***" if value and _secret(name, value) else value for name, value in settings.items()
    }


def _secret(name: str, value: object) -> bool:
    return isinstance(value, SecretStr | SecretBytes) or any(w in name for w in _SECRET_WORDS)


def record_fields(record: Record) -> dict[str, Any]:
    """The log fields that say which record an event is about."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


def partition_names(partitions: Iterable[TopicPartition]) -> list[str]:
    """Partitions as a log field: ``topic-partition`` names, sorted."""
    return sorted(f"{topic}-{partition}" for topic, partition in partitions)
