"""kembed producer SDK: ``vectors = await client.embed(texts)`` over Kafka."""

from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.errors import (
    AuthenticationError,
    AuthorizationError,
    ClientClosedError,
    EmbedError,
    EmbedTimeoutError,
    KafkaAccessError,
    KembedError,
)

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "ClientClosedError",
    "ClientConfig",
    "EmbedClient",
    "EmbedError",
    "EmbedTimeoutError",
    "KafkaAccessError",
    "KembedError",
]
