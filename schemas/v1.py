"""Wire format v1: the messages, as plain immutable data.

The byte layout (msgpack maps, field order, limits) is specified in ``schemas/README.md``;
``schemas.codec`` turns these objects into bytes and back.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Any

from schemas.encodings import Encoding
from schemas.errors import ErrorCode
from schemas.kinds import Kind

__all__ = [
    "CHUNK_POOLINGS",
    "DEFAULT_MAX_INPUT_CHARS",
    "DEFAULT_RESULTS_TOPIC",
    "MAX_ID_BYTES",
    "MAX_TOPIC_LENGTH",
    "REQUEST_KINDS",
    "TRUNCATION_DIRECTIONS",
    "VERSION",
    "TOKENIZER_KINDS",
    "Chunking",
    "DecodeRequest",
    "DecodeResult",
    "EmbedRequest",
    "EmbedResult",
    "ErrorInfo",
    "ErrorResult",
    "RerankRequest",
    "RerankResult",
    "SparseRequest",
    "SparseResult",
    "ModelRequest",
    "Request",
    "Result",
    "Span",
    "Token",
    "TokenizeRequest",
    "TokenizeResult",
    "TokenizerRequest",
    "chunking_problem",
    "pack_float32",
    "unpack_float32",
]

VERSION = 1
MAX_ID_BYTES = 256
MAX_TOPIC_LENGTH = 249
TRUNCATION_DIRECTIONS = ("right", "left")
DEFAULT_RESULTS_TOPIC = "embed.results"
CHUNK_POOLINGS = ("none", "mean")
TOKENIZER_KINDS: tuple[str, ...] = ("tokenize", "decode")
"""Requests any model answers with its tokenizer alone, whatever its kind."""
REQUEST_KINDS: tuple[str, ...] = (*(kind.value for kind in Kind), *TOKENIZER_KINDS)
"""A request's ``kind``: what is asked of the model (a model kind's, in its catalog card,
or one of :data:`TOKENIZER_KINDS`)."""
DEFAULT_MAX_INPUT_CHARS = 100_000
"""Characters (code points) a text may have: an input of an embed request without
``chunking``, a rerank query or document. Workers (``KEMBED_MAX_INPUT_CHARS``), the SDK
(``ClientConfig.max_input_chars``) and the gateway (``KEMBED_GATEWAY_MAX_INPUT_CHARS``)
default to it: more than twice what a window of 8192 tokens holds in English, and a cap on
what a text costs to tokenize when a model can use only its first tokens."""

Key = str | int
Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Chunking:
    """A request's ``chunking``: cut each input into windows of at most ``max_tokens``
    tokens (special and prompt tokens included) that overlap by ``overlap_tokens``.

    Raises ValueError for numbers no model could accept; whether the window leaves room
    for text depends on the model, and the worker checks that."""

    max_tokens: int
    overlap_tokens: int = 0

    def __post_init__(self) -> None:
        problem = chunking_problem(self.max_tokens, self.overlap_tokens)
        if problem is not None:
            raise ValueError(problem)


def chunking_problem(max_tokens: object, overlap_tokens: object) -> str | None:
    """Why ``max_tokens`` and ``overlap_tokens`` are not a valid ``chunking``, or None.

    The overlap may be at most half the window (``max_tokens // 2``): every chunk then
    brings at least half its tokens new, so chunking costs at most about twice the text
    (the worker bounds the rest, which depends on the model's special and prompt tokens)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        return "'chunking.max_tokens' must be an integer"
    if isinstance(overlap_tokens, bool) or not isinstance(overlap_tokens, int):
        return "'chunking.overlap_tokens' must be an integer"
    if max_tokens < 1:
        return f"'chunking.max_tokens' must be >= 1, not {max_tokens}"
    if not 0 <= overlap_tokens <= max_tokens // 2:
        return (
            f"'chunking.overlap_tokens' must be in 0..{max_tokens // 2} (at most half of "
            f"max_tokens {max_tokens}), not {overlap_tokens}"
        )
    return None


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """One request: embed ``inputs`` and answer on ``reply_to`` under ``id``."""

    id: str
    inputs: tuple[str, ...]
    model: str | None = None
    normalize: bool = True
    truncate: bool = True
    truncation_direction: str | None = None
    dimensions: int | None = None
    encoding: Encoding = Encoding.FLOAT32
    prompt: str | None = None
    prompt_name: str | None = None
    deadline_ms: int | None = None
    reply_to: str | None = None
    reply_partition: int | None = None
    keys: tuple[Key, ...] | None = None
    meta: dict[str, Any] | None = None
    chunking: Chunking | None = None
    chunk_pooling: str = "none"
    """``none`` (one vector per chunk) or ``mean`` (one per input); only with ``chunking``."""

    @property
    def reply_topic(self) -> str:
        return self.reply_to or DEFAULT_RESULTS_TOPIC


@dataclass(frozen=True, slots=True)
class EmbedResult:
    """The vectors for one request: ``len(tokens)`` rows of ``dim`` values, row-major,
    encoded as ``dtype`` says (an :class:`~schemas.encodings.Encoding` value); ``scales``
    holds one little-endian float32 per row for int8 results and is None otherwise."""

    id: str
    model: str
    dim: int
    vectors: bytes
    tokens: tuple[int, ...]
    dtype: str = Encoding.FLOAT32
    keys: tuple[Key, ...] | None = None
    meta: dict[str, Any] | None = None
    scales: bytes | None = None
    requested_ms: int | None = None
    """When the request was produced (its Kafka record timestamp, Unix epoch ms): the
    version of these vectors, by which a sink keeps the newest answer per key."""
    chunks: tuple[int, ...] | None = None
    """With ``chunking``: per input, how many chunks it was cut into."""
    spans: tuple[Span, ...] | None = None
    """With ``chunking``: per chunk (inputs in order), its ``[start, end)`` code-point
    offsets into the input as sent."""
    chunk_pooling: str | None = None
    """With ``chunking``: the request's ``chunk_pooling`` (``none``: one vector per chunk,
    ``mean``: one per input); None from a worker that predates it."""

    @property
    def count(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """One rerank request (``kind`` ``rerank``): score each of ``documents`` against
    ``query`` with a cross-encoder, and answer on ``reply_to`` under ``id``.

    Each (query, document) pair is tokenized as a pair and cut, when longer than the
    model's maximum, longest-first (a token off the longer of the two at a time) at the
    ``truncation_direction`` end of each."""

    id: str
    query: str
    documents: tuple[str, ...]
    model: str | None = None
    top_n: int | None = None
    """How many documents ``order`` names (all of them when None or larger)."""
    return_documents: bool = False
    """The result carries the texts of the documents ``order`` names."""
    raw_scores: bool = False
    """Scores before the model's activation (logits) instead of after it."""
    truncate: bool = True
    truncation_direction: str | None = None
    deadline_ms: int | None = None
    reply_to: str | None = None
    reply_partition: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def reply_topic(self) -> str:
        return self.reply_to or DEFAULT_RESULTS_TOPIC


@dataclass(frozen=True, slots=True)
class RerankResult:
    """The scores for one rerank request: ``scores`` holds one little-endian float32 per
    document, in the request's order; ``order`` the indices of the best ``top_n``
    documents, highest score first (ties: the lower index first)."""

    id: str
    model: str
    scores: bytes
    order: tuple[int, ...]
    tokens: tuple[int, ...]
    """Tokens per (query, document) pair after truncation, special tokens included."""
    documents: tuple[str, ...] | None = None
    """With ``return_documents``: the text of each document ``order`` names, in that order."""
    requested_ms: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.tokens)

    def score_values(self) -> array[float]:
        """The scores as Python floats (float32 values), in the documents' order."""
        return unpack_float32(self.scores)


@dataclass(frozen=True, slots=True)
class SparseRequest:
    """One sparse request (``kind`` ``sparse``): the term weights of each of ``inputs`` by a
    sparse (SPLADE-style) encoder, answered on ``reply_to`` under ``id``."""

    id: str
    inputs: tuple[str, ...]
    model: str | None = None
    truncate: bool = True
    truncation_direction: str | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    top_k: int | None = None
    """Keep only each text's ``top_k`` largest weights (None: the model's
    ``max_active_dims``, else every nonzero weight)."""
    deadline_ms: int | None = None
    reply_to: str | None = None
    reply_partition: int | None = None
    keys: tuple[Key, ...] | None = None
    """The caller's ids for the inputs (for sinks), one per input; copied to the result."""
    meta: dict[str, Any] | None = None

    @property
    def reply_topic(self) -> str:
        return self.reply_to or DEFAULT_RESULTS_TOPIC


@dataclass(frozen=True, slots=True)
class SparseResult:
    """The term weights of a sparse request's inputs, in the request's order: input ``i``
    has ``counts[i]`` nonzero weights, its entries of ``indices`` (little-endian uint32
    vocabulary ids, ascending) and ``values`` (little-endian float32) following those of
    the inputs before it; ``vocab`` is the vocabulary's size (the vectors' dimension)."""

    id: str
    model: str
    vocab: int
    counts: tuple[int, ...]
    indices: bytes
    values: bytes
    tokens: tuple[int, ...]
    requested_ms: int | None = None
    keys: tuple[Key, ...] | None = None
    meta: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.counts)

    def rows(self) -> list[tuple[array[int], array[float]]]:
        """Per input, its (indices, weights), for clients without numpy."""
        ids = array("I")
        ids.frombytes(self.indices)
        if sys.byteorder != "little":
            ids.byteswap()
        weights = unpack_float32(self.values)
        out, start = [], 0
        for n in self.counts:
            out.append((ids[start : start + n], weights[start : start + n]))
            start += n
        return out


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: ErrorCode | str
    message: str
    index: int | None = None


@dataclass(frozen=True, slots=True)
class ErrorResult:
    """A request that produced no vectors; ``error.code`` says why."""

    id: str
    error: ErrorInfo
    keys: tuple[Key, ...] | None = None
    meta: dict[str, Any] | None = field(default=None)


Token = tuple[int, str, bool, int | None, int | None]
"""One token of a tokenize result: its id, its text, whether it is a special token, and
for a token of the text its ``[start, stop)`` UTF-8 byte offsets (None for a special
token), as TEI's ``/tokenize`` answers them."""


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """A tokenize request (``kind`` ``tokenize``): the tokens of each of ``inputs`` as the
    model's tokenizer makes them, not truncated, answered without running the model."""

    id: str
    inputs: tuple[str, ...]
    model: str | None = None
    add_special_tokens: bool = True
    prompt_name: str | None = None
    """A prompt of the model's, prepended to each input before it is tokenized (none
    unless named, as in TEI)."""
    deadline_ms: int | None = None
    reply_to: str | None = None
    reply_partition: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def reply_topic(self) -> str:
        return self.reply_to or DEFAULT_RESULTS_TOPIC


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    """The tokens of each input of a tokenize request, in the request's order."""

    id: str
    model: str
    tokens: tuple[tuple[Token, ...], ...]
    requested_ms: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A decode request (``kind`` ``decode``): the text of each sequence of token ``ids``,
    as the model's tokenizer decodes it."""

    id: str
    ids: tuple[tuple[int, ...], ...]
    model: str | None = None
    skip_special_tokens: bool = True
    deadline_ms: int | None = None
    reply_to: str | None = None
    reply_partition: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def reply_topic(self) -> str:
        return self.reply_to or DEFAULT_RESULTS_TOPIC


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """The text of each sequence of a decode request, in the request's order."""

    id: str
    model: str
    texts: tuple[str, ...]
    requested_ms: int | None = None
    meta: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.texts)


ModelRequest = EmbedRequest | RerankRequest | SparseRequest
"""A request the model computes (batched, encoded)."""
TokenizerRequest = TokenizeRequest | DecodeRequest
"""A request the model's tokenizer answers alone."""
Request = ModelRequest | TokenizerRequest
Result = EmbedResult | RerankResult | SparseResult | TokenizeResult | DecodeResult | ErrorResult


def pack_float32(values: array[float]) -> bytes:
    """Little-endian float32 bytes of ``values`` (an ``array('f')``), whatever the host order."""
    if values.typecode != "f":
        raise TypeError("expected array('f')")
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("f", values)
    swapped.byteswap()
    return swapped.tobytes()


def unpack_float32(blob: bytes) -> array[float]:
    """The float32 values of a little-endian blob, for clients without numpy."""
    values = array("f")
    values.frombytes(blob)
    if sys.byteorder != "little":
        values.byteswap()
    return values
