"""Client settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import SecretStr

from kembed_shared.security_fields import security_problems
from schemas import DEFAULT_MAX_INPUT_CHARS

__all__ = ["ClientConfig"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    bootstrap_servers: str
    requests_topic: str = "embed.requests"
    """Interactive lane: where ``embed()`` sends, and ``submit(bulk=False)``."""
    bulk_topic: str = "embed.requests.bulk"
    """Bulk lane (ingestion backlogs): where ``submit()`` sends by default (``bulk=True``)."""
    reply_topic: str = "embed.results"
    """Topic this client reads its ``embed()`` results from; ``submit()``'s default
    ``reply_to``."""
    read_replies: bool = True
    """False makes a producer-only client, for ``submit()`` and ``ingest()``: it reads no
    reply partition, so it needs no READ right on ``reply_topic`` and costs no consumer;
    ``embed()`` then raises KembedError."""
    max_request_bytes: int = 4 * 1024 * 1024
    """Largest request message this client sends; a larger one raises RequestTooLargeError
    before anything is sent. Keep it at or below the workers' KEMBED_MAX_REQUEST_BYTES
    (default 4 MiB) and the request topics' max.message.bytes."""
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    """Most characters (code points) in one text: an input of an unchunked embed request,
    a rerank query or document. A longer one raises InputTooLongError before anything is
    sent; keep it at or below the workers' KEMBED_MAX_INPUT_CHARS (the same default),
    which answer it input_too_long."""
    reply_partition: int | None = None
    """The reply partition this client reads; None picks one at random at start."""
    model: str | None = None
    """Model to ask for; None lets the worker use the model it serves."""
    catalog_topic: str | None = "embed.models"
    """The workers' model catalog: a call naming a model is sent to the topic its workers
    announce there (see ``producer_sdk.catalog``); None turns discovery off."""
    model_topics: Mapping[str, str] = field(default_factory=dict)
    """Request topic per model name or alias, over the catalog."""
    catalog_refresh_s: float = 10.0
    """How old the cached catalog may get before a call naming a model re-reads it (at most
    one read per this many seconds)."""
    catalog_timeout: float = 5.0
    """Seconds a catalog read may take."""
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

    # Security, named like Kafka's client configs (and the worker's settings).
    security_protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: str | None = None
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; required by the SASL_* protocols."""
    sasl_username: str | None = None
    sasl_password: SecretStr | str | None = None
    """Kept as a ``SecretStr`` (a plain string is converted), so it never prints."""
    ssl_cafile: str | None = None
    """PEM file of the CAs that signed the brokers' certificates; None: the system's."""
    ssl_certfile: str | None = None
    """PEM client certificate chain, for mutual TLS."""
    ssl_keyfile: str | None = None
    """PEM private key of ``ssl_certfile``, when in a separate file."""
    ssl_password: SecretStr | str | None = None
    """Password of an encrypted ``ssl_keyfile``; kept as a ``SecretStr``."""
    ssl_check_hostname: bool = True
    """Check that a broker's certificate names the host connected to."""

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be positive, not {self.max_request_bytes}")
        if self.max_input_chars < 1:
            raise ValueError(f"max_input_chars must be positive, not {self.max_input_chars}")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                f"isolation_level must be read_uncommitted or read_committed, "
                f"not {self.isolation_level!r}"
            )
        for name in ("catalog_refresh_s", "catalog_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        object.__setattr__(self, "model_topics", dict(self.model_topics))
        for name in ("sasl_password", "ssl_password"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, SecretStr(value))
        problems = self.security_problems()
        if problems:
            raise ValueError("invalid security settings: " + "; ".join(problems))

    def security_problems(self) -> list[str]:
        """Contradictory or incomplete security settings, as sentences for people (the
        rules of the worker's settings: :func:`kembed_shared.security_fields.security_problems`)."""
        return security_problems(self)
