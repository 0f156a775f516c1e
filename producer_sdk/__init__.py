"""kembed producer SDK: ``vectors = await client.embed(texts)`` over Kafka,
``ranked = await client.rerank(query, documents)`` for a cross-encoder's scores, and
``await client.submit(texts, keys=ids)`` / ``ingest(client, documents)`` for ingestion;
``SyncEmbedClient`` for ``vectors = client.embed(texts)`` without asyncio."""

from producer_sdk.catalog import CatalogModel
from producer_sdk.chunked import ChunkedEmbeddings, InputChunks
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
    IngestError,
    InputTooLongError,
    KafkaAccessError,
    KembedError,
    RequestTooLargeError,
    UnexpectedEncodingError,
    UnexpectedResultError,
)
from producer_sdk.ingest import Document, IngestSummary, ingest
from producer_sdk.jsonl import JsonlError, JsonlReader
from producer_sdk.rerank import RankedDocument, Reranked
from producer_sdk.sparse import SparseEmbeddings, SparseVector
from producer_sdk.sync import SyncEmbedClient
from producer_sdk.tokens import Decoding, Token, Tokenization
from schemas import Chunking, Encoding

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "CatalogModel",
    "CatalogUnavailableError",
    "ChunkedEmbeddings",
    "Chunking",
    "ClientClosedError",
    "ClientConfig",
    "EmbedClient",
    "EmbedError",
    "Decoding",
    "Document",
    "EmbedTimeoutError",
    "Embeddings",
    "Encoding",
    "IngestError",
    "InputTooLongError",
    "IngestSummary",
    "InputChunks",
    "JsonlError",
    "JsonlReader",
    "KafkaAccessError",
    "KembedError",
    "RankedDocument",
    "RequestTooLargeError",
    "Reranked",
    "SparseEmbeddings",
    "SparseVector",
    "SyncEmbedClient",
    "Token",
    "Tokenization",
    "UnexpectedEncodingError",
    "UnexpectedResultError",
    "dequantize_int8",
    "hamming_distances",
    "ingest",
    "unpack_bits",
]
