"""The client's Kafka security: ClientConfig to aiokafka options, and clear login errors.

aiokafka reports a rejected login only as "Unable to bootstrap" (the reason goes to its own
log), so when a client cannot start, :func:`diagnose_login` opens one connection itself to
tell a wrong password or a failed TLS handshake from a broker that is not there.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

from producer_sdk.config import ClientConfig
from producer_sdk.errors import AuthenticationError

__all__ = ["client_options", "diagnose_login", "principal_of"]

_PROBE_TIMEOUT_MS = 10_000


def _secret(value: SecretStr | str | None) -> str | None:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def client_options(config: ClientConfig) -> dict[str, Any]:
    """Keyword arguments for aiokafka's clients: security_protocol, SASL and TLS."""
    options: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.security_protocol.startswith("SASL_"):
        options.update(
            sasl_mechanism=config.sasl_mechanism,
            sasl_plain_username=config.sasl_username,
            sasl_plain_password=_secret(config.sasl_password),
        )
    if config.security_protocol in ("SSL", "SASL_SSL"):
        context = create_ssl_context(
            cafile=config.ssl_cafile,
            certfile=config.ssl_certfile,
            keyfile=config.ssl_keyfile,
            password=_secret(config.ssl_password),
        )
        context.check_hostname = config.ssl_check_hostname
        options["ssl_context"] = context
    return options


def principal_of(config: ClientConfig) -> str:
    """How the broker names this client, for error messages."""
    if config.security_protocol.startswith("SASL_"):
        return f"User:{config.sasl_username}"
    if config.security_protocol == "SSL":
        return "this client (its TLS certificate's principal)"
    return "User:ANONYMOUS"


async def diagnose_login(config: ClientConfig, options: Mapping[str, Any]) -> None:
    """After aiokafka could not bootstrap: raise AuthenticationError if the reason is a
    rejected login or TLS handshake; return if no broker answered at all."""
    secret = _secret(config.sasl_password)
    for server in config.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            continue
        try:
            conn = await create_conn(
                host.strip("[]"), int(port), request_timeout_ms=_PROBE_TIMEOUT_MS, **options
            )
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.UnsupportedSaslMechanismError,
            kafka_errors.IllegalSaslStateError,
        ) as exc:
            detail = " ".join(str(arg) for arg in exc.args if arg) or type(exc).__name__
            message = (
                f"authentication failed: Kafka at {server.strip()} rejected the login of "
                f"{principal_of(config)} with {config.sasl_mechanism}: {detail}"
            )
            raise AuthenticationError(
                message.replace(secret, "***") if secret else message
            ) from None
        except ssl.SSLError as exc:
            detail = (
                f"certificate verify failed: {exc.verify_message}"
                if isinstance(exc, ssl.SSLCertVerificationError)
                else exc.reason or str(exc)
            )
            raise AuthenticationError(
                f"authentication failed: TLS handshake with Kafka at {server.strip()} "
                f"failed: {detail}"
            ) from None
        except (OSError, TimeoutError, kafka_errors.KafkaError):
            continue
        conn.close()
        return
