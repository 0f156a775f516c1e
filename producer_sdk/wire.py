"""A request as Kafka carries it: its bytes, checked against the client's size limit, and
the message key that sends the same content to the same partition."""

from __future__ import annotations

import hashlib

import msgpack

from producer_sdk.errors import RequestTooLargeError
from producer_sdk.options import DOCS_META_KEY
from schemas import EmbedRequest, Request, encode_request

__all__ = ["content_key", "encoded"]


def encoded(request: Request, max_request_bytes: int) -> bytes:
    """The request's message value. Raises TypeError when a value in it cannot be encoded
    as msgpack (naming where), RequestTooLargeError when it exceeds ``max_request_bytes``."""
    try:
        value = encode_request(request)
    except (TypeError, ValueError, OverflowError) as exc:  # msgpack: not serializable
        raise TypeError(f"the request cannot be encoded as msgpack: {_where(request)}") from exc
    if len(value) > max_request_bytes:
        raise RequestTooLargeError(len(value), max_request_bytes)
    return value


def content_key(request: EmbedRequest) -> bytes:
    """A Kafka message key for ``request`` from what decides its vectors (model, prompt,
    truncation side, texts): the same content sent again lands on the same partition."""
    digest = hashlib.blake2b(digest_size=16, person=b"kembed-affinity")
    options = (request.model, request.prompt, request.prompt_name, request.truncation_direction)
    for part in (*options, *request.inputs):
        data = b"\xff" if part is None else part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.digest()


def _where(request: Request) -> str:
    """Which part of a request msgpack cannot encode (its meta is the only free-form part)."""
    meta = request.meta or {}
    for index, doc in enumerate(meta.get(DOCS_META_KEY) or ()):
        if not _packable(doc):
            return f"metadata[{index}] holds a value msgpack cannot encode"
    for key, value in meta.items():
        if key != DOCS_META_KEY and not _packable(value):
            return f"meta[{key!r}] holds a value msgpack cannot encode"
    return "a field holds a value msgpack cannot encode"


def _packable(value: object) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True
