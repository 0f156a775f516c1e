"""Bytes <-> wire-format v1 objects.

Encoding is canonical: map keys in the order of ``schemas/README.md``, optional fields left
out when they hold their default. Decoding accepts any key order, ignores unknown keys, and
raises :class:`~schemas.errors.SchemaError` (and nothing else) for any input that is not a
valid message, carrying whatever routing envelope could still be read.

``meta`` is decoded as a :class:`PackedMap`, which keeps the bytes it was read from:
encoding it again (a request's into its result) writes those bytes, so ``meta`` comes back
byte for byte as the client wrote it (a float32 stays a float32, an integer keeps its
width).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import msgpack

from schemas.encodings import Encoding, row_bytes
from schemas.errors import Envelope, ErrorCode, SchemaError
from schemas.fields import (
    ENCODING_NAMES,
    binary,
    check_docs,
    chunk_counts,
    chunk_pooling_name,
    chunking_value,
    direction,
    encoding_value,
    error_code,
    fail,
    field_value,
    flag,
    identifier,
    input_keys,
    inputs_list,
    int_list,
    integer,
    is_valid_topic,
    keys_list,
    kind_name,
    meta_map,
    non_empty,
    non_negative,
    optional,
    positive,
    put,
    required,
    spans_list,
    string,
    topic_name,
)
from schemas.kinds import Kind
from schemas.messages import (
    rerank_request,
    rerank_request_body,
    rerank_result,
    rerank_result_body,
    sparse_request,
    sparse_request_body,
    sparse_result,
    sparse_result_body,
    tokenizer_request,
    tokenizer_request_body,
    tokenizer_result,
    tokenizer_result_body,
)
from schemas.v1 import (
    TOKENIZER_KINDS,
    VERSION,
    DecodeRequest,
    DecodeResult,
    EmbedRequest,
    EmbedResult,
    ErrorInfo,
    ErrorResult,
    Request,
    RerankRequest,
    RerankResult,
    Result,
    Span,
    SparseRequest,
    SparseResult,
    TokenizeRequest,
    TokenizeResult,
)

__all__ = [
    "PackedMap",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "is_valid_topic",
]

_T = TypeVar("_T")


def encode_request(request: Request) -> bytes:
    if isinstance(request, RerankRequest):
        return _pack(rerank_request_body(request))
    if isinstance(request, SparseRequest):
        return _pack(sparse_request_body(request))
    if isinstance(request, TokenizeRequest | DecodeRequest):
        return _pack(tokenizer_request_body(request))
    body: dict[str, Any] = {"v": VERSION, "id": request.id, "inputs": list(request.inputs)}
    if request.model is not None:
        body["model"] = request.model
    if not request.normalize:
        body["normalize"] = False
    if not request.truncate:
        body["truncate"] = False
    put(body, "truncation_direction", request.truncation_direction)
    put(body, "dimensions", request.dimensions)
    if request.encoding != Encoding.FLOAT32:
        body["encoding"] = str(request.encoding)
    put(body, "prompt", request.prompt)
    put(body, "prompt_name", request.prompt_name)
    put(body, "deadline_ms", request.deadline_ms)
    put(body, "reply_to", request.reply_to)
    put(body, "reply_partition", request.reply_partition)
    put(body, "keys", None if request.keys is None else list(request.keys))
    put(body, "meta", request.meta)
    if request.chunking is not None:
        chunking: dict[str, int] = {"max_tokens": request.chunking.max_tokens}
        if request.chunking.overlap_tokens:
            chunking["overlap_tokens"] = request.chunking.overlap_tokens
        body["chunking"] = chunking
    if request.chunk_pooling != "none":
        body["chunk_pooling"] = request.chunk_pooling
    return _pack(body)


def encode_result(result: Result) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "id": result.id}
    if isinstance(result, TokenizeResult | DecodeResult):
        return _pack(tokenizer_result_body(result))
    if isinstance(result, RerankResult):
        return _pack(rerank_result_body(result))
    if isinstance(result, SparseResult):
        return _pack(sparse_result_body(result))
    if isinstance(result, EmbedResult):
        body["model"] = result.model
        body["dim"] = result.dim
        body["dtype"] = str(result.dtype)
        body["vectors"] = result.vectors
        put(body, "scales", result.scales)
        body["tokens"] = list(result.tokens)
        put(body, "requested_ms", result.requested_ms)
    else:
        error: dict[str, Any] = {"code": str(result.error.code), "message": result.error.message}
        put(error, "index", result.error.index)
        body["error"] = error
    put(body, "keys", None if result.keys is None else list(result.keys))
    put(body, "meta", result.meta)
    if isinstance(result, EmbedResult):
        put(body, "chunks", None if result.chunks is None else list(result.chunks))
        put(body, "spans", None if result.spans is None else [list(s) for s in result.spans])
        put(body, "chunk_pooling", result.chunk_pooling)
    return _pack(body)


class PackedMap(dict[str, Any]):
    """A map decoded from msgpack that keeps the exact bytes it was decoded from.

    Encoded again, it is written as those bytes, unless its contents no longer equal them
    (it was changed after decoding, or holds a NaN, which equals nothing): then it is
    encoded from its contents like any map."""

    __slots__ = ("packed",)

    def __init__(self, items: dict[str, Any], packed: bytes) -> None:
        super().__init__(items)
        self.packed = packed

    def unchanged(self) -> bool:
        return bool(msgpack.unpackb(self.packed, raw=False, strict_map_key=False) == self)


def _pack(body: dict[str, Any]) -> bytes:
    if not any(isinstance(value, PackedMap) for value in body.values()):
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        return packed
    # The same bytes msgpack.packb writes for a map, with each unchanged PackedMap's own.
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts.append(packer.pack(key))
        verbatim = isinstance(value, PackedMap) and value.unchanged()
        parts.append(value.packed if verbatim else packer.pack(value))
    return b"".join(parts)


# ---------------------------------------------------------------------------- decoding


def decode_request(data: bytes) -> Request:
    """Parse and validate one request; raise SchemaError with the envelope when readable."""
    body = _unpack_map(data)
    envelope = _envelope(body)
    try:
        request = _request_from_map(body)
    except SchemaError as exc:
        raise exc.with_envelope(envelope) from None
    if request.meta is None:
        return request
    return replace(request, meta=PackedMap(request.meta, _packed_value(data, "meta")))


def decode_result(data: bytes) -> Result:
    """Parse one result (for clients); raise SchemaError when it is malformed."""
    body = _unpack_map(data)
    _check_version(body)
    result_id = required(body, "id", identifier)
    keys = optional(body, "keys", keys_list)
    meta = optional(body, "meta", meta_map)
    if meta is not None:
        meta = PackedMap(meta, _packed_value(data, "meta"))
    if body.get("error") is not None:
        error = body["error"]
        if not isinstance(error, dict):
            fail("'error' must be a map")
        info = ErrorInfo(
            code=error_code(required(error, "code", string)),
            message=required(error, "message", string),
            index=optional(error, "index", non_negative),
        )
        return ErrorResult(id=result_id, error=info, keys=keys, meta=meta)
    kind = None if body.get("kind") is None else field_value("kind", body["kind"], kind_name)
    if kind == Kind.RERANK:
        return rerank_result(body, result_id, meta)
    if kind == Kind.SPARSE:
        return sparse_result(body, result_id, meta)
    if kind in TOKENIZER_KINDS:
        return tokenizer_result(body, kind, result_id, meta)
    dim = required(body, "dim", positive)
    dtype = required(body, "dtype", string)
    vectors = required(body, "vectors", binary)
    tokens = tuple(required(body, "tokens", int_list))
    if dtype not in ENCODING_NAMES:
        fail(f"unknown dtype {dtype!r}")
    encoding = Encoding(dtype)
    if len(vectors) != len(tokens) * row_bytes(encoding, dim):
        fail(f"'vectors' holds {len(vectors)} bytes, expected {len(tokens)} x {dim} {dtype}")
    scales = optional(body, "scales", binary)
    if encoding == Encoding.INT8:
        if scales is None:
            fail("missing required field 'scales' (dtype int8)")
        if len(scales) != len(tokens) * 4:
            fail(f"'scales' holds {len(scales)} bytes, expected {len(tokens)} float32")
    elif scales is not None:
        fail(f"'scales' is only valid with dtype int8, not {dtype}")
    chunks = optional(body, "chunks", chunk_counts)
    spans = optional(body, "spans", spans_list)
    if chunks is not None or spans is not None:
        _check_chunks(chunks, spans, len(tokens))
    chunk_pooling = optional(body, "chunk_pooling", chunk_pooling_name)
    if chunk_pooling is not None:
        _check_pooling(chunk_pooling, chunks, len(tokens))
    return EmbedResult(
        requested_ms=optional(body, "requested_ms", non_negative),
        id=result_id,
        model=required(body, "model", string),
        dim=dim,
        vectors=vectors,
        tokens=tokens,
        dtype=encoding,
        keys=keys,
        meta=meta,
        scales=scales,
        chunks=chunks,
        spans=spans,
        chunk_pooling=chunk_pooling,
    )


def _check_pooling(pooling: str, chunks: tuple[int, ...] | None, rows: int) -> None:
    """A result's ``chunk_pooling`` comes with ``chunks``, and says how many vectors."""
    if chunks is None:
        fail("'chunk_pooling' needs 'chunks' and 'spans'")
    expected = sum(chunks) if pooling == "none" else len(chunks)
    if rows != expected:
        fail(f"{rows} vectors with 'chunk_pooling' {pooling!r}: expected {expected}")


def _check_chunks(
    chunks: tuple[int, ...] | None, spans: tuple[Span, ...] | None, rows: int
) -> None:
    """``chunks`` and ``spans`` come together: one span per chunk, and one row per chunk
    (``chunk_pooling`` none) or per input (mean)."""
    if chunks is None or spans is None:
        fail("'chunks' and 'spans' must be given together")
    total = sum(chunks)
    if len(spans) != total:
        fail(f"'spans' has {len(spans)} entries for {total} chunks")
    if rows not in (total, len(chunks)):
        fail(f"{rows} vectors for {len(chunks)} inputs in {total} chunks")


def _packed_value(data: bytes, key: str) -> bytes:
    """The bytes of the value under ``key`` in ``data``, a msgpack map known to be valid
    and to hold ``key`` (of duplicate keys the last, as the decoded map keeps)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(data))
    unpacker.feed(data)
    found = b""
    for _ in range(unpacker.read_map_header()):
        name = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        if name == key:
            found = data[start : unpacker.tell()]
    return found


def _unpack_map(data: bytes) -> dict[str, Any]:
    try:
        # Non-string keys are legal msgpack: nested in `meta` they are the caller's business,
        # at the top level they are unknown fields and ignored.
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except UnicodeDecodeError:
        raise _invalid_utf8(data) from None
    except Exception:  # noqa: BLE001 (msgpack raises many types for garbage; all mean "invalid")
        fail("message is not valid msgpack")
    if not isinstance(body, dict):
        fail("message must be a msgpack map")
    return body


def _invalid_utf8(data: bytes) -> SchemaError:
    """Name the field holding invalid UTF-8, keeping the envelope if it is itself intact."""
    try:
        body = msgpack.unpackb(
            data, raw=False, strict_map_key=False, unicode_errors="surrogateescape"
        )
    except Exception:  # noqa: BLE001 (as above)
        return SchemaError(ErrorCode.INVALID_REQUEST, "message is not valid msgpack")
    if not isinstance(body, dict):
        return SchemaError(ErrorCode.INVALID_REQUEST, "message must be a msgpack map")
    index = None
    texts = body.get("documents" if body.get("kind") == Kind.RERANK else "inputs")
    if isinstance(texts, list):
        index = next((i for i, s in enumerate(texts) if isinstance(s, str) and not _utf8(s)), None)
    where = "a string field"
    if index is not None:
        where = "a document" if body.get("kind") == Kind.RERANK else "an input"
    clean = {k: v for k, v in body.items() if isinstance(k, str) and _utf8(k) and _clean(v)}
    return SchemaError(
        ErrorCode.INVALID_REQUEST,
        f"{where} is not valid UTF-8",
        index=index,
        envelope=_envelope(clean),
    )


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean(value: object) -> bool:
    return not isinstance(value, str) or _utf8(value)


def _envelope(body: dict[str, Any]) -> Envelope:
    def get(key: str, check: Callable[[object], _T]) -> _T | None:
        try:
            return optional(body, key, check)
        except SchemaError:
            return None

    return Envelope(
        id=get("id", identifier),
        reply_to=get("reply_to", topic_name),
        reply_partition=get("reply_partition", non_negative),
    )


def _check_version(body: dict[str, Any]) -> None:
    version = required(body, "v", integer)
    if version > VERSION:
        raise SchemaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"version {version} is not supported; this worker speaks v{VERSION}",
        )
    if version != VERSION:
        fail(f"'v' must be {VERSION}")


def _request_from_map(body: dict[str, Any]) -> Request:
    _check_version(body)
    request_id = required(body, "id", identifier)
    kind = optional(body, "kind", kind_name) or Kind.EMBED
    if kind == Kind.RERANK:
        return rerank_request(body, request_id)
    if kind == Kind.SPARSE:
        return sparse_request(body, request_id)
    if kind in TOKENIZER_KINDS:
        return tokenizer_request(body, kind, request_id)
    inputs = required(body, "inputs", inputs_list)
    keys = input_keys(body, len(inputs))
    meta = optional(body, "meta", meta_map)
    check_docs(meta, len(inputs))
    prompt = optional(body, "prompt", string)
    prompt_name = optional(body, "prompt_name", non_empty)
    if prompt is not None and prompt_name is not None:
        fail("'prompt' and 'prompt_name' are exclusive: give the text or the name")
    chunking = optional(body, "chunking", chunking_value)
    chunk_pooling = optional(body, "chunk_pooling", chunk_pooling_name) or "none"
    if chunk_pooling != "none" and chunking is None:
        fail(f"'chunk_pooling' {chunk_pooling!r} needs 'chunking'")
    return EmbedRequest(
        id=request_id,
        inputs=inputs,
        model=optional(body, "model", non_empty),
        normalize=flag(body, "normalize"),
        truncate=flag(body, "truncate"),
        truncation_direction=optional(body, "truncation_direction", direction),
        dimensions=optional(body, "dimensions", positive),
        encoding=optional(body, "encoding", encoding_value) or Encoding.FLOAT32,
        prompt=prompt,
        prompt_name=prompt_name,
        deadline_ms=optional(body, "deadline_ms", non_negative),
        reply_to=optional(body, "reply_to", topic_name),
        reply_partition=optional(body, "reply_partition", non_negative),
        keys=keys,
        meta=meta,
        chunking=chunking,
        chunk_pooling=chunk_pooling,
    )
