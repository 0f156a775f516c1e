"""Where Kafka is and how to log in: the settings every kembed client shares.

The worker, the sink and the client commands take these as ``KEMBED_<NAME>`` env vars and
as flags of the same names; the SDK's :class:`producer_sdk.ClientConfig` takes the same
names as keyword arguments (:data:`SECURITY_FIELDS`); both are checked by the same rules
(:mod:`kembed_shared.security_fields`).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kembed_shared.security_fields import SECURITY_FIELDS, security_problems

__all__ = [
    "SECURITY_FIELDS",
    "KafkaClientSettings",
    "describe_errors",
    "none_if_blank",
    "security_options",
    "security_problems",
]


def none_if_blank(value: Any) -> Any:
    """An empty env var (a manifest that sets it to nothing) means unset."""
    return None if isinstance(value, str) and not value.strip() else value


class KafkaClientSettings(BaseSettings):
    """Where Kafka is and how to log in: shared by ``kembed worker`` and ``kembed embed``.

    Names follow Kafka's client configs (``security.protocol``, ``sasl.mechanism``, ...).
    Secrets are ``SecretStr``: they print as ``**********`` and are read only where a
    connection is made.
    """

    model_config = SettingsConfigDict(env_prefix="KEMBED_", extra="ignore", frozen=True)

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers, comma separated host:port."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Kafka security.protocol: PLAINTEXT, SSL (TLS), SASL_SSL (SASL login over "
        "TLS), or SASL_PLAINTEXT (SASL login without TLS: trusted networks only).",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None,
        description="SASL mechanism, required by the SASL_* protocols. SCRAM never sends the "
        "password; PLAIN does, so use PLAIN with SASL_SSL only.",
    )
    sasl_username: str | None = Field(
        None, description="SASL user name; the Kafka principal is User:<name>."
    )
    sasl_password: SecretStr | None = Field(
        None,
        description="SASL password. Prefer the env var to the flag (other users can see "
        "command lines); it is never logged.",
    )
    ssl_cafile: str | None = Field(
        None,
        description="PEM file of the CA certificates that signed the brokers' certificates "
        "(SSL, SASL_SSL). Unset: the system's trust store.",
    )
    ssl_certfile: str | None = Field(
        None,
        description="PEM client certificate chain for mutual TLS (may also hold the key).",
    )
    ssl_keyfile: str | None = Field(
        None, description="PEM private key of ssl_certfile, when it is a separate file."
    )
    ssl_password: SecretStr | None = Field(
        None, description="Password of an encrypted ssl_keyfile; it is never logged."
    )
    ssl_check_hostname: bool = Field(
        True,
        description="Check that a broker's certificate names the host connected to (Kafka's "
        "ssl.endpoint.identification.algorithm=https). Turn off only for certificates "
        "issued for other names.",
    )

    @model_validator(mode="after")
    def _check_security(self) -> Self:
        problems = security_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def security_options(kafka: KafkaClientSettings) -> dict[str, Any]:
    """The security settings as :class:`producer_sdk.ClientConfig` keyword arguments."""
    return {name: getattr(kafka, name) for name in SECURITY_FIELDS}


def describe_errors(error: ValidationError) -> str:
    """A settings error for people, one line per problem, without the input values.

    pydantic's own text repeats the inputs (``input_value=...``), and the input of a
    model-wide check is every setting, secrets included.
    """
    lines = []
    for item in error.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}" if where else f"  {message}")
    return "\n".join(lines)
