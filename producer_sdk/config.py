"""Client settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr

__all__ = ["ClientConfig"]

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


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
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                f"isolation_level must be read_uncommitted or read_committed, "
                f"not {self.isolation_level!r}"
            )
        for name in ("sasl_password", "ssl_password"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, SecretStr(value))
        problems = self.security_problems()
        if problems:
            raise ValueError("invalid security settings: " + "; ".join(problems))

    def security_problems(self) -> list[str]:
        """Contradictory or incomplete security settings, as sentences for people."""
        protocol = self.security_protocol
        if protocol not in _PROTOCOLS:
            return [f"security_protocol must be one of {', '.join(_PROTOCOLS)}"]
        problems = []
        if self.sasl_mechanism is not None and self.sasl_mechanism not in _MECHANISMS:
            problems.append(f"sasl_mechanism must be one of {', '.join(_MECHANISMS)}")
        sasl = {
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_username": self.sasl_username,
            "sasl_password": self.sasl_password,
        }
        if protocol.startswith("SASL_"):
            if missing := [name for name, value in sasl.items() if not value]:
                problems.append(f"security_protocol {protocol} needs {', '.join(missing)}")
        elif given := [name for name, value in sasl.items() if value]:
            problems.append(
                f"{', '.join(given)} given, but security_protocol {protocol} sends no SASL "
                "credentials: use a SASL_* protocol"
            )
        tls = {
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": self.ssl_password,
        }
        if protocol not in ("SSL", "SASL_SSL"):
            if given := [name for name, value in tls.items() if value]:
                problems.append(
                    f"{', '.join(given)} given, but security_protocol {protocol} does not "
                    "use TLS: use SSL or SASL_SSL"
                )
        elif not self.ssl_certfile and (self.ssl_keyfile or self.ssl_password):
            problems.append("ssl_keyfile and ssl_password need ssl_certfile")
        return problems
