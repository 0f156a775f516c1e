"""How a Kafka client logs in: the security settings' names, their shape, and their rules.

Every kembed client takes the same security settings under the same names: the worker, the
sink and the client commands as :class:`~kembed_shared.settings.KafkaClientSettings`
(``KEMBED_<NAME>`` env vars and flags), the SDK as :class:`producer_sdk.ClientConfig`
keyword arguments. Both satisfy :class:`SecuritySettings`, so one set of rules
(:func:`security_problems`) checks them and one function
(:func:`kembed_shared.kafka.security.client_options`) turns them into aiokafka options.

This module is light on purpose (the standard library and pydantic's ``SecretStr``): the
SDK's configuration imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import SecretStr

__all__ = [
    "MECHANISMS",
    "PROTOCOLS",
    "SECURITY_FIELDS",
    "SecuritySettings",
    "secret_value",
    "security_problems",
]

SECURITY_FIELDS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_check_hostname",
)
"""How to reach Kafka securely: the same names in the worker, ``kembed embed`` and the SDK."""

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka's security.protocol values."""
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms kembed clients log in with."""


class SecuritySettings(Protocol):
    """The security fields of a client's settings (:data:`SECURITY_FIELDS`), read-only."""

    @property
    def security_protocol(self) -> str: ...
    @property
    def sasl_mechanism(self) -> str | None: ...
    @property
    def sasl_username(self) -> str | None: ...
    @property
    def sasl_password(self) -> SecretStr | str | None: ...
    @property
    def ssl_cafile(self) -> str | None: ...
    @property
    def ssl_certfile(self) -> str | None: ...
    @property
    def ssl_keyfile(self) -> str | None: ...
    @property
    def ssl_password(self) -> SecretStr | str | None: ...
    @property
    def ssl_check_hostname(self) -> bool: ...


def secret_value(value: SecretStr | str | None) -> str | None:
    """A password as the one place that connects needs it."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def security_problems(settings: SecuritySettings) -> list[str]:
    """Contradictory or incomplete security settings, each as a sentence to show a person.

    Unknown protocol or mechanism names are reported too (the SDK's plain dataclass has no
    type check of its own; the pydantic settings refuse them before this runs)."""
    protocol = settings.security_protocol
    if protocol not in PROTOCOLS:
        return [f"security_protocol must be one of {', '.join(PROTOCOLS)}"]
    problems = []
    if settings.sasl_mechanism is not None and settings.sasl_mechanism not in MECHANISMS:
        problems.append(f"sasl_mechanism must be one of {', '.join(MECHANISMS)}")
    sasl = {
        "sasl_mechanism": settings.sasl_mechanism,
        "sasl_username": settings.sasl_username,
        "sasl_password": settings.sasl_password,
    }
    if protocol.startswith("SASL_"):
        missing = [name for name, value in sasl.items() if not value]
        if missing:
            problems.append(f"security_protocol {protocol} needs {', '.join(missing)}")
    elif given := [name for name, value in sasl.items() if value]:
        problems.append(
            f"{', '.join(given)} given, but security_protocol {protocol} sends no SASL "
            f"credentials: use {'SASL_SSL' if protocol == 'SSL' else 'SASL_SSL or SASL_PLAINTEXT'}"
        )
    tls = {
        "ssl_cafile": settings.ssl_cafile,
        "ssl_certfile": settings.ssl_certfile,
        "ssl_keyfile": settings.ssl_keyfile,
        "ssl_password": settings.ssl_password,
    }
    if protocol not in ("SSL", "SASL_SSL"):
        if given := [name for name, value in tls.items() if value]:
            problems.append(
                f"{', '.join(given)} given, but security_protocol {protocol} does not use TLS: "
                f"use {'SASL_SSL' if protocol == 'SASL_PLAINTEXT' else 'SSL or SASL_SSL'}"
            )
        return problems
    orphans = [name for name in ("ssl_keyfile", "ssl_password") if tls[name]]
    if orphans and not settings.ssl_certfile:
        problems.append(f"{', '.join(orphans)} given without ssl_certfile")
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = tls[name]
        if isinstance(path, str) and not Path(path).is_file():
            problems.append(f"{name}: no such file: {path}")
    return problems
