"""Client settings."""

from __future__ import annotations

from dataclasses import dataclass

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
