"""Client settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ClientConfig"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    bootstrap_servers: str
    requests_topic: str = "embed.requests"
    reply_topic: str = "embed.results"
    reply_partition: int | None = None
    """The reply partition this client reads; None picks one at random at start."""
    model: str | None = None
    """Model to ask for; None lets the worker use the model it serves."""
    timeout: float = 30.0
    """Default seconds an ``embed`` call waits for its result."""
    client_id: str = "kembed-client"
    linger_ms: int = 0
    fetch_max_wait_ms: int = 100
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    """How results are read. read_committed shows only results of committed transactions:
    with exactly-once workers (KEMBED_DELIVERY=exactly_once) a call then never sees a result
    that a crashed worker wrote in a transaction it did not commit (nor, so, a duplicate);
    the cost is that a result becomes visible when its transaction commits (a few ms
    later), and that a crashed worker's open transaction holds back the results after it
    on the same reply partition until the broker aborts it (the workers'
    transaction_timeout_ms). With at-least-once workers both levels read the same."""

    def __post_init__(self) -> None:
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                f"isolation_level must be read_uncommitted or read_committed, "
                f"not {self.isolation_level!r}"
            )
