"""Settings fields of the long-running consumers: the worker and the sink.

Both are a consumer group member with an HTTP endpoint and logs. Their settings classes
(each with its own env prefix, and its fields in its own order for the help text) declare
these fields with the definitions below, which take what differs between the two as
arguments::

    client_id: str = fields.client_id("kembed-sink")
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

__all__ = [
    "LogFormat",
    "LogLevel",
    "client_id",
    "fetch_max_wait",
    "health_stuck_batch",
    "heartbeat_interval",
    "http_host",
    "http_port",
    "log_format",
    "log_level",
    "max_poll_interval",
    "session_timeout",
]

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "json", "console"]


def client_id(default: str) -> Any:
    """``client_id``: the Kafka client id."""
    return Field(default, description="Kafka client id (quotas, broker logs).")


def max_poll_interval(advice: str) -> Any:
    """``max_poll_interval_ms``; ``advice`` follows the name of Kafka's setting."""
    return Field(300_000, gt=0, description=f"Kafka max.poll.interval.ms{advice}")


def fetch_max_wait(default: int, description: str) -> Any:
    """``fetch_max_wait_ms``: how long a fetch waits when nothing is waiting."""
    return Field(default, ge=0, description=description)


def session_timeout(member: str, more: str = "") -> Any:
    """``session_timeout_ms``: how long a dead ``member`` ("worker") holds its partitions."""
    what = f"how long a dead {member} holds its partitions{more}"
    return Field(45_000, gt=0, description=f"Kafka session.timeout.ms: {what}.")


def heartbeat_interval() -> Any:
    """``heartbeat_interval_ms``."""
    return Field(3_000, gt=0, description="Kafka heartbeat.interval.ms.")


def http_host(endpoints: str) -> Any:
    """``http_host``: the address of the HTTP endpoint serving ``endpoints``."""
    # 0.0.0.0: probes and scrapes come from outside the container
    return Field("0.0.0.0", description=f"Address of the HTTP endpoint ({endpoints}).")


def http_port(default: int) -> Any:
    """``http_port``."""
    what = "Port of the HTTP endpoint; 0 picks a free port (logged as http.started)."
    return Field(default, ge=0, le=65535, description=what)


def health_stuck_batch(batch: str, member: str, why: str = "") -> Any:
    """``health_stuck_batch_s``: /health fails after one ``batch`` ran this long."""
    what = f"when one {batch} has run longer than this{why}"
    return Field(
        300.0,
        gt=0,
        description=f"/health fails {what}, so that the orchestrator restarts the {member}.",
    )


def log_level() -> Any:
    """``log_level``."""
    return Field("info", description="Log level.")


def log_format() -> Any:
    """``log_format``."""
    return Field(
        "auto",
        description="json for production (one object per line), console for people; auto "
        "picks console on a terminal and json otherwise.",
    )
