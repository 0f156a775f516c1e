"""Kafka security for every kembed client: settings to aiokafka options, and clear errors.

aiokafka reports a rejected login only as "Unable to bootstrap" (the reason goes to its own
log), and an unauthorized topic in a subscription as nothing at all: the consumer waits for
partitions that never come. So a client asks two questions itself: can it log in
(:func:`diagnose_login`), and may its principal do what it needs on each topic and its group
(:func:`check_access`, from the broker's own answer, KIP-430)? The worker, the sink and the
client commands get :class:`~kembed_shared.ports.KafkaAccessError`; the SDK passes its own
exception type (``producer_sdk.errors.AuthenticationError``). No error text holds a secret.

The settings are anything with the security fields (:class:`~kembed_shared.security_fields.
SecuritySettings`): :class:`~kembed_shared.settings.KafkaClientSettings` and the SDK's
``ClientConfig`` alike.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from kembed_shared.ports import KafkaAccessError
from kembed_shared.security_fields import SecuritySettings, secret_value

__all__ = ["AccessError", "check_access", "client_options", "diagnose_login", "principal_of"]

AccessError = Callable[[str, str], Exception]
"""Makes the exception to raise from a ``kind`` ("authentication", "tls") and a ``reason``
(a sentence without a secret): :class:`~kembed_shared.ports.KafkaAccessError` by default."""

# AclOperation codes, as bits of the authorized-operations field (KIP-430).
_OPERATION_BITS = {"read": 3, "write": 4, "describe": 8}
_NOT_PROVIDED = -(2**31)  # Kafka's "authorized operations not requested/known"
_PROBE_S = 10.0


def client_options(
    settings: SecuritySettings, *, tls_error: AccessError | None = KafkaAccessError
) -> dict[str, Any]:
    """Keyword arguments for aiokafka's clients: security_protocol, SASL and TLS.

    TLS files that cannot be loaded (a wrong key password, a file that is no PEM) raise
    ``tls_error("tls", reason)``, the reason naming the settings involved; with
    ``tls_error=None``, ssl's own error (``ssl.SSLError`` or ``OSError``)."""
    options: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL_"):
        options.update(
            sasl_mechanism=settings.sasl_mechanism,
            sasl_plain_username=settings.sasl_username,
            sasl_plain_password=secret_value(settings.sasl_password),
        )
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        try:
            context = create_ssl_context(
                cafile=settings.ssl_cafile,
                certfile=settings.ssl_certfile,
                keyfile=settings.ssl_keyfile,
                password=secret_value(settings.ssl_password),
            )
        except (ssl.SSLError, OSError) as exc:
            if tls_error is None:
                raise
            raise tls_error(
                "tls",
                "cannot load the TLS files (ssl_cafile, ssl_certfile, ssl_keyfile with "
                f"ssl_password): {exc}",
            ) from None
        context.check_hostname = settings.ssl_check_hostname
        options["ssl_context"] = context
    return options


def principal_of(options: Mapping[str, Any]) -> str:
    """How the broker will name this client, for error messages."""
    username = options.get("sasl_plain_username")
    if username:
        return f"User:{username}"
    if options.get("security_protocol") in ("SSL", "SASL_SSL"):
        return "this client (its TLS certificate's principal)"
    return "User:ANONYMOUS"


def _scrub(text: str, options: Mapping[str, Any]) -> str:
    secret = options.get("sasl_plain_password")
    return text.replace(secret, "***") if secret else text


async def diagnose_login(
    bootstrap_servers: str, options: Mapping[str, Any], error: AccessError = KafkaAccessError
) -> None:
    """After aiokafka could not bootstrap: raise ``error("authentication", reason)`` if the
    reason is a rejected login or TLS handshake; return if no broker answered at all (the
    caller's error stands)."""
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            continue
        try:
            conn = await create_conn(
                host.strip("[]"), int(port), request_timeout_ms=int(_PROBE_S * 1000), **options
            )
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.UnsupportedSaslMechanismError,
            kafka_errors.IllegalSaslStateError,
        ) as exc:
            mechanism = options.get("sasl_mechanism")
            raise error(
                "authentication",
                _scrub(
                    f"Kafka at {server.strip()} rejected the login of "
                    f"{principal_of(options)} with {mechanism}: {_describe(exc)}",
                    options,
                ),
            ) from None
        except ssl.SSLError as exc:
            detail = (
                f"certificate verify failed: {exc.verify_message}"
                if isinstance(exc, ssl.SSLCertVerificationError)
                else exc.reason or str(exc)
            )
            raise error(
                "authentication", f"TLS handshake with Kafka at {server.strip()} failed: {detail}"
            ) from None
        except (OSError, TimeoutError, kafka_errors.KafkaError):
            continue
        conn.close()
        return


def _describe(exc: BaseException) -> str:
    args = [str(arg) for arg in getattr(exc, "args", ()) if arg]
    return f"{type(exc).__name__}: {' '.join(args)}" if args else type(exc).__name__


# -- topic rights (Metadata v8: the broker reports each topic's authorized operations) ----------


class _MetadataResponseV8(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            Array(
                ("node_id", Int32),
                ("host", String("utf-8")),
                ("port", Int32),
                ("rack", String("utf-8")),
            ),
        ),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("name", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", Array(Int32)),
                        ("isr_nodes", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(Schema(("name", String("utf-8"))))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class _TopicOperationsRequest(Request[_MetadataRequestV8]):  # type: ignore[misc]
    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class([(t,) for t in self._topics], False, False, True)


async def check_access(
    client: Any,
    needs: Mapping[str, Iterable[str]],
    options: Mapping[str, Any],
    group_id: str | None = None,
) -> None:
    """Raise KafkaAccessError naming every topic right in ``needs`` (topic -> operations
    such as "read", "write") that the broker says this client's principal lacks, and the
    consumer group ``group_id`` if the principal may not even describe it.

    ``client`` is a started aiokafka ``AIOKafkaClient``. Topics that do not exist are not
    this check's business (a consumer waits for them; a publish to one fails on its own).
    READ on the group itself shows only when the consumer joins (``KafkaSource.poll``).
    """
    missing = await _missing_topic_rights(client, needs)
    if group_id is not None:
        try:
            await asyncio.wait_for(client.coordinator_lookup(0, group_id), _PROBE_S)
        except kafka_errors.GroupAuthorizationFailedError:
            missing.append(f"READ on consumer group {group_id!r}")
        except (TimeoutError, kafka_errors.KafkaError):
            pass  # no coordinator yet: the consumer will wait for one
    if missing:
        raise KafkaAccessError(
            "authorization",
            f"{principal_of(options)} is not authorized for {', '.join(missing)}: "
            "each needs an ACL allowing it",
        )


async def _missing_topic_rights(client: Any, needs: Mapping[str, Iterable[str]]) -> list[str]:
    topics = sorted(needs)
    node = client.get_random_node()
    try:
        response = await asyncio.wait_for(
            client.send(node, _TopicOperationsRequest(topics)), _PROBE_S
        )
    except (NotImplementedError, kafka_errors.IncompatibleBrokerVersion):
        return []  # a broker older than Kafka 2.3 cannot say; failures will show at use
    missing: list[str] = []
    for error_code, name, _internal, _partitions, operations in response.topics:
        wanted = sorted(set(needs.get(name, ())))
        if error_code == kafka_errors.TopicAuthorizationFailedError.errno:
            lacking = wanted
        elif error_code != 0 or operations == _NOT_PROVIDED:
            continue
        else:
            lacking = [op for op in wanted if not operations & (1 << _OPERATION_BITS[op])]
        missing.extend(f"{op.upper()} on topic {name!r}" for op in lacking)
    return missing
