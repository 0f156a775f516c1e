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

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

import msgpack

from schemas.encodings import Encoding, row_bytes
from schemas.errors import Envelope, ErrorCode, SchemaError
from schemas.kinds import Kind
from schemas.v1 import (
    CHUNK_POOLINGS,
    MAX_ID_BYTES,
    MAX_TOPIC_LENGTH,
    REQUEST_KINDS,
    TRUNCATION_DIRECTIONS,
    VERSION,
    Chunking,
    EmbedRequest,
    EmbedResult,
    ErrorInfo,
    ErrorResult,
    Key,
    Request,
    RerankRequest,
    RerankResult,
    Result,
    Span,
    chunking_problem,
)

__all__ = [
    "PackedMap",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "is_valid_topic",
]

_ENCODING_NAMES = frozenset(encoding.value for encoding in Encoding)
_DOCS = "docs"  # meta["docs"]: one item of metadata per input (see schemas/README.md)
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_T = TypeVar("_T")


def is_valid_topic(name: str) -> bool:
    return (
        0 < len(name) <= MAX_TOPIC_LENGTH
        and name not in (".", "..")
        and bool(_TOPIC.fullmatch(name))
    )


# ---------------------------------------------------------------------------- encoding


def encode_request(request: Request) -> bytes:
    if isinstance(request, RerankRequest):
        return _encode_rerank_request(request)
    body: dict[str, Any] = {"v": VERSION, "id": request.id, "inputs": list(request.inputs)}
    if request.model is not None:
        body["model"] = request.model
    if not request.normalize:
        body["normalize"] = False
    if not request.truncate:
        body["truncate"] = False
    _put(body, "truncation_direction", request.truncation_direction)
    _put(body, "dimensions", request.dimensions)
    if request.encoding != Encoding.FLOAT32:
        body["encoding"] = str(request.encoding)
    _put(body, "prompt", request.prompt)
    _put(body, "prompt_name", request.prompt_name)
    _put(body, "deadline_ms", request.deadline_ms)
    _put(body, "reply_to", request.reply_to)
    _put(body, "reply_partition", request.reply_partition)
    _put(body, "keys", None if request.keys is None else list(request.keys))
    _put(body, "meta", request.meta)
    if request.chunking is not None:
        chunking: dict[str, int] = {"max_tokens": request.chunking.max_tokens}
        if request.chunking.overlap_tokens:
            chunking["overlap_tokens"] = request.chunking.overlap_tokens
        body["chunking"] = chunking
    if request.chunk_pooling != "none":
        body["chunk_pooling"] = request.chunk_pooling
    return _pack(body)


def _encode_rerank_request(request: RerankRequest) -> bytes:
    body: dict[str, Any] = {
        "v": VERSION,
        "id": request.id,
        "kind": Kind.RERANK.value,
        "query": request.query,
        "documents": list(request.documents),
    }
    _put(body, "model", request.model)
    _put(body, "top_n", request.top_n)
    if request.return_documents:
        body["return_documents"] = True
    if request.raw_scores:
        body["raw_scores"] = True
    if not request.truncate:
        body["truncate"] = False
    _put(body, "truncation_direction", request.truncation_direction)
    _put(body, "deadline_ms", request.deadline_ms)
    _put(body, "reply_to", request.reply_to)
    _put(body, "reply_partition", request.reply_partition)
    _put(body, "meta", request.meta)
    return _pack(body)


def encode_result(result: Result) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "id": result.id}
    if isinstance(result, RerankResult):
        body["kind"] = Kind.RERANK.value
        body["model"] = result.model
        body["scores"] = result.scores
        body["order"] = list(result.order)
        body["tokens"] = list(result.tokens)
        _put(body, "documents", None if result.documents is None else list(result.documents))
        _put(body, "requested_ms", result.requested_ms)
        _put(body, "meta", result.meta)
        return _pack(body)
    if isinstance(result, EmbedResult):
        body["model"] = result.model
        body["dim"] = result.dim
        body["dtype"] = str(result.dtype)
        body["vectors"] = result.vectors
        _put(body, "scales", result.scales)
        body["tokens"] = list(result.tokens)
        _put(body, "requested_ms", result.requested_ms)
    else:
        error: dict[str, Any] = {"code": str(result.error.code), "message": result.error.message}
        _put(error, "index", result.error.index)
        body["error"] = error
    _put(body, "keys", None if result.keys is None else list(result.keys))
    _put(body, "meta", result.meta)
    if isinstance(result, EmbedResult):
        _put(body, "chunks", None if result.chunks is None else list(result.chunks))
        _put(body, "spans", None if result.spans is None else [list(s) for s in result.spans])
        _put(body, "chunk_pooling", result.chunk_pooling)
    return _pack(body)


def _put(body: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        body[key] = value


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
    result_id = _required(body, "id", _id)
    keys = _optional(body, "keys", _keys)
    meta = _optional(body, "meta", _meta)
    if meta is not None:
        meta = PackedMap(meta, _packed_value(data, "meta"))
    if body.get("error") is not None:
        error = body["error"]
        if not isinstance(error, dict):
            _fail("'error' must be a map")
        info = ErrorInfo(
            code=_code(_required(error, "code", _str)),
            message=_required(error, "message", _str),
            index=_optional(error, "index", _non_negative),
        )
        return ErrorResult(id=result_id, error=info, keys=keys, meta=meta)
    if body.get("kind") is not None and _field("kind", body["kind"], _kind) == Kind.RERANK:
        return _rerank_result(body, result_id, meta)
    dim = _required(body, "dim", _positive)
    dtype = _required(body, "dtype", _str)
    vectors = _required(body, "vectors", _bin)
    tokens = tuple(_required(body, "tokens", _int_list))
    if dtype not in _ENCODING_NAMES:
        _fail(f"unknown dtype {dtype!r}")
    encoding = Encoding(dtype)
    if len(vectors) != len(tokens) * row_bytes(encoding, dim):
        _fail(f"'vectors' holds {len(vectors)} bytes, expected {len(tokens)} x {dim} {dtype}")
    scales = _optional(body, "scales", _bin)
    if encoding == Encoding.INT8:
        if scales is None:
            _fail("missing required field 'scales' (dtype int8)")
        if len(scales) != len(tokens) * 4:
            _fail(f"'scales' holds {len(scales)} bytes, expected {len(tokens)} float32")
    elif scales is not None:
        _fail(f"'scales' is only valid with dtype int8, not {dtype}")
    chunks = _optional(body, "chunks", _chunk_counts)
    spans = _optional(body, "spans", _spans)
    if chunks is not None or spans is not None:
        _check_chunks(chunks, spans, len(tokens))
    chunk_pooling = _optional(body, "chunk_pooling", _chunk_pooling)
    if chunk_pooling is not None:
        _check_pooling(chunk_pooling, chunks, len(tokens))
    return EmbedResult(
        requested_ms=_optional(body, "requested_ms", _non_negative),
        id=result_id,
        model=_required(body, "model", _str),
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
        _fail("'chunk_pooling' needs 'chunks' and 'spans'")
    expected = sum(chunks) if pooling == "none" else len(chunks)
    if rows != expected:
        _fail(f"{rows} vectors with 'chunk_pooling' {pooling!r}: expected {expected}")


def _rerank_result(body: dict[str, Any], result_id: str, meta: Any) -> RerankResult:
    scores = _required(body, "scores", _bin)
    tokens = tuple(_required(body, "tokens", _int_list))
    if len(scores) != 4 * len(tokens):
        _fail(f"'scores' holds {len(scores)} bytes, expected {len(tokens)} float32")
    order = tuple(_required(body, "order", _int_list))
    if len(set(order)) != len(order) or any(not 0 <= i < len(tokens) for i in order):
        _fail(f"'order' must hold distinct document indices in 0..{len(tokens) - 1}")
    documents = _optional(body, "documents", _str_list)
    if documents is not None and len(documents) != len(order):
        _fail(f"'documents' has {len(documents)} entries for {len(order)} in 'order'")
    return RerankResult(
        id=result_id,
        model=_required(body, "model", _str),
        scores=scores,
        order=order,
        tokens=tokens,
        documents=documents,
        requested_ms=_optional(body, "requested_ms", _non_negative),
        meta=meta,
    )


def _check_chunks(
    chunks: tuple[int, ...] | None, spans: tuple[Span, ...] | None, rows: int
) -> None:
    """``chunks`` and ``spans`` come together: one span per chunk, and one row per chunk
    (``chunk_pooling`` none) or per input (mean)."""
    if chunks is None or spans is None:
        _fail("'chunks' and 'spans' must be given together")
    total = sum(chunks)
    if len(spans) != total:
        _fail(f"'spans' has {len(spans)} entries for {total} chunks")
    if rows not in (total, len(chunks)):
        _fail(f"{rows} vectors for {len(chunks)} inputs in {total} chunks")


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
        _fail("message is not valid msgpack")
    if not isinstance(body, dict):
        _fail("message must be a msgpack map")
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
            return _optional(body, key, check)
        except SchemaError:
            return None

    return Envelope(
        id=get("id", _id),
        reply_to=get("reply_to", _topic),
        reply_partition=get("reply_partition", _non_negative),
    )


def _check_version(body: dict[str, Any]) -> None:
    version = _required(body, "v", _int)
    if version > VERSION:
        raise SchemaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"version {version} is not supported; this worker speaks v{VERSION}",
        )
    if version != VERSION:
        _fail(f"'v' must be {VERSION}")


def _request_from_map(body: dict[str, Any]) -> Request:
    _check_version(body)
    request_id = _required(body, "id", _id)
    if (_optional(body, "kind", _kind) or Kind.EMBED) == Kind.RERANK:
        return _rerank_from_map(body, request_id)
    inputs = _required(body, "inputs", _inputs)
    keys = _optional(body, "keys", _keys)
    if keys is not None and len(keys) != len(inputs):
        _fail(f"'keys' has {len(keys)} entries for {len(inputs)} inputs")
    meta = _optional(body, "meta", _meta)
    if meta is not None:
        _check_docs(meta, len(inputs))
    prompt = _optional(body, "prompt", _str)
    prompt_name = _optional(body, "prompt_name", _non_empty_str)
    if prompt is not None and prompt_name is not None:
        _fail("'prompt' and 'prompt_name' are exclusive: give the text or the name")
    chunking = _optional(body, "chunking", _chunking)
    chunk_pooling = _optional(body, "chunk_pooling", _chunk_pooling) or "none"
    if chunk_pooling != "none" and chunking is None:
        _fail(f"'chunk_pooling' {chunk_pooling!r} needs 'chunking'")
    return EmbedRequest(
        id=request_id,
        inputs=inputs,
        model=_optional(body, "model", _non_empty_str),
        normalize=_flag(body, "normalize"),
        truncate=_flag(body, "truncate"),
        truncation_direction=_optional(body, "truncation_direction", _direction),
        dimensions=_optional(body, "dimensions", _positive),
        encoding=_optional(body, "encoding", _encoding) or Encoding.FLOAT32,
        prompt=prompt,
        prompt_name=prompt_name,
        deadline_ms=_optional(body, "deadline_ms", _non_negative),
        reply_to=_optional(body, "reply_to", _topic),
        reply_partition=_optional(body, "reply_partition", _non_negative),
        keys=keys,
        meta=meta,
        chunking=chunking,
        chunk_pooling=chunk_pooling,
    )


def _rerank_from_map(body: dict[str, Any], request_id: str) -> RerankRequest:
    return RerankRequest(
        id=request_id,
        query=_required(body, "query", _non_empty_str),
        documents=_required(body, "documents", _inputs),
        model=_optional(body, "model", _non_empty_str),
        top_n=_optional(body, "top_n", _positive),
        return_documents=_optional(body, "return_documents", _bool) or False,
        raw_scores=_optional(body, "raw_scores", _bool) or False,
        truncate=_flag(body, "truncate"),
        truncation_direction=_optional(body, "truncation_direction", _direction),
        deadline_ms=_optional(body, "deadline_ms", _non_negative),
        reply_to=_optional(body, "reply_to", _topic),
        reply_partition=_optional(body, "reply_partition", _non_negative),
        meta=_optional(body, "meta", _meta),
    )


def _check_docs(meta: dict[str, Any], inputs: int) -> None:
    """``meta["docs"]``, when present, holds exactly one map (or nil) per input."""
    docs = meta.get(_DOCS)
    if docs is None:
        return
    if not isinstance(docs, list):
        _fail("'meta.docs' must be an array with one map per input")
    if len(docs) != inputs:
        _fail(f"'meta.docs' has {len(docs)} entries for {inputs} inputs")
    for index, item in enumerate(docs):
        if item is not None and not (
            isinstance(item, dict) and all(isinstance(k, str) for k in item)
        ):
            _fail(f"'meta.docs'[{index}] must be a map with string keys, or nil", index)


def _fail(message: str, index: int | None = None) -> NoReturn:
    raise SchemaError(ErrorCode.INVALID_REQUEST, message, index=index)


def _required(body: dict[str, Any], key: str, check: Callable[[object], _T]) -> _T:
    if key not in body:
        _fail(f"missing required field {key!r}")
    return _field(key, body[key], check)


def _optional(body: dict[str, Any], key: str, check: Callable[[object], _T]) -> _T | None:
    value = body.get(key)
    if value is None:  # an explicit nil means "absent", as in most msgpack peers
        return None
    return _field(key, value, check)


def _flag(body: dict[str, Any], key: str) -> bool:
    """An optional boolean that defaults to true."""
    value = _optional(body, key, _bool)
    return True if value is None else value


def _field(key: str, value: object, check: Callable[[object], _T]) -> _T:
    try:
        return check(value)
    except _MistypedError as exc:
        _fail(f"{key!r} {exc.args[0]}", index=exc.index)


class _MistypedError(Exception):
    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _MistypedError("must be an integer")
    return value


def _non_negative(value: object) -> int:
    number = _int(value)
    if number < 0:
        raise _MistypedError("must be >= 0")
    return number


def _positive(value: object) -> int:
    number = _int(value)
    if number < 1:
        raise _MistypedError("must be >= 1")
    return number


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise _MistypedError("must be a boolean")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise _MistypedError("must be a string")
    return value


def _non_empty_str(value: object) -> str:
    text = _str(value)
    if not text:
        raise _MistypedError("must not be empty")
    return text


def _bin(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise _MistypedError("must be binary")
    return value


def _encoding(value: object) -> Encoding:
    text = _str(value)
    if text not in _ENCODING_NAMES:
        raise _MistypedError(f"must be one of {', '.join(Encoding)}")
    return Encoding(text)


def _one_of(choices: tuple[str, ...]) -> Callable[[object], str]:
    """The check of a string field that must be one of ``choices`` (exact)."""

    def check(value: object) -> str:
        text = _str(value)
        if text not in choices:
            raise _MistypedError(f"must be one of {', '.join(choices)}")
        return text

    return check


_direction = _one_of(TRUNCATION_DIRECTIONS)
_kind = _one_of(REQUEST_KINDS)
_chunk_pooling = _one_of(CHUNK_POOLINGS)


def _code(value: str) -> ErrorCode | str:
    try:
        return ErrorCode(value)
    except ValueError:
        return value  # a code newer than this client: keep it, callers treat it as internal


def _id(value: object) -> str:
    text = _non_empty_str(value)
    if len(text.encode("utf-8")) > MAX_ID_BYTES:
        raise _MistypedError(f"must be at most {MAX_ID_BYTES} bytes of UTF-8")
    return text


def _topic(value: object) -> str:
    text = _str(value)
    if not is_valid_topic(text):
        raise _MistypedError("is not a valid Kafka topic name")
    return text


def _inputs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _MistypedError("must be an array of strings")
    if not value:
        raise _MistypedError("must hold at least one input")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _MistypedError(f"[{index}] must be a string", index)
        if not item:
            raise _MistypedError(f"[{index}] must not be empty", index)
    return tuple(value)


def _str_list(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _MistypedError("must be an array of strings")
    return tuple(value)


def _keys(value: object) -> tuple[Key, ...]:
    if not isinstance(value, list):
        raise _MistypedError("must be an array")
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise _MistypedError(f"[{index}] must be a string or an integer", index)
    return tuple(value)


def _int_list(value: object) -> list[int]:
    if not isinstance(value, list):
        raise _MistypedError("must be an array of integers")
    return [_int(item) for item in value]


def _chunking(value: object) -> Chunking:
    if not isinstance(value, dict):
        raise _MistypedError("must be a map with 'max_tokens' and optionally 'overlap_tokens'")
    unknown = sorted(str(key) for key in value if key not in ("max_tokens", "overlap_tokens"))
    if unknown:
        raise _MistypedError(f"has unknown keys {', '.join(map(repr, unknown))}")
    if value.get("max_tokens") is None:
        raise _MistypedError("must hold 'max_tokens'")
    overlap = value.get("overlap_tokens")
    overlap = 0 if overlap is None else overlap
    problem = chunking_problem(value["max_tokens"], overlap)
    if problem is not None:
        _fail(problem)
    return Chunking(value["max_tokens"], overlap)


def _chunk_counts(value: object) -> tuple[int, ...]:
    counts = _int_list(value)
    if any(count < 1 for count in counts):
        raise _MistypedError("must hold integers >= 1")
    return tuple(counts)


def _spans(value: object) -> tuple[Span, ...]:
    if not isinstance(value, list):
        raise _MistypedError("must be an array of [start, end] pairs")
    spans: list[Span] = []
    for index, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2):
            raise _MistypedError(f"[{index}] must be a [start, end] pair")
        start, end = _int(item[0]), _int(item[1])
        if not 0 <= start < end:
            raise _MistypedError(f"[{index}] must have 0 <= start < end, not [{start}, {end}]")
        spans.append((start, end))
    return tuple(spans)


def _meta(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _MistypedError("must be a map with string keys")
    return value
