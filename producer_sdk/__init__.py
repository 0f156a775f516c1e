"""kembed producer SDK: ``vectors = await client.embed(texts)`` over Kafka."""

from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.errors import ClientClosedError, EmbedError, EmbedTimeoutError, KembedError

__all__ = [
    "ClientClosedError",
    "ClientConfig",
    "EmbedClient",
    "EmbedError",
    "EmbedTimeoutError",
    "KembedError",
]
