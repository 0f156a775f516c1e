"""kembed producer SDK: ``vectors = await client.embed(texts)`` over Kafka."""

from producer_sdk.catalog import CatalogModel
from producer_sdk.client import EmbedClient
from producer_sdk.config import ClientConfig
from producer_sdk.encodings import (
    Embeddings,
    dequantize_int8,
    hamming_distances,
    unpack_bits,
)
from producer_sdk.errors import (
    AuthenticationError,
    AuthorizationError,
    CatalogUnavailableError,
    ClientClosedError,
    EmbedError,
    EmbedTimeoutError,
    KafkaAccessError,
    KembedError,
    UnexpectedEncodingError,
)
from schemas import Encoding

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "CatalogModel",
    "CatalogUnavailableError",
    "ClientClosedError",
    "ClientConfig",
    "EmbedClient",
    "EmbedError",
    "EmbedTimeoutError",
    "Embeddings",
    "Encoding",
    "KafkaAccessError",
    "KembedError",
    "UnexpectedEncodingError",
    "dequantize_int8",
    "hamming_distances",
    "unpack_bits",
]
