"""The options of the client's calls, each checked once, where it is made.

:class:`EmbedOptions` is how to embed (``embed``, ``embed_result``, ``submit``),
:class:`SubmitOptions` what ``submit`` adds (where the result goes, keys and metadata), and
:class:`RerankOptions` how to rerank. Each raises TypeError or ValueError for a value no
worker would accept, so a call that has its options sends nothing invalid; the texts and
what depends on their number (keys, metadata) are checked by :func:`check_texts` and
:meth:`SubmitOptions.request`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from producer_sdk.errors import InputTooLongError
from schemas import CHUNK_POOLINGS, Chunking, EmbedRequest, Encoding, RerankRequest, SparseRequest
from schemas.codec import is_valid_topic
from schemas.v1 import MAX_ID_BYTES

__all__ = [
    "DOCS_META_KEY",
    "EmbedKeywords",
    "EmbedOptions",
    "RerankOptions",
    "SparseOptions",
    "SubmitOptions",
    "UnchunkedKeywords",
    "check_lengths",
    "check_texts",
]

_ENCODING_NAMES = frozenset(encoding.value for encoding in Encoding)
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # the integers msgpack can carry
DOCS_META_KEY = "docs"
"""The request ``meta`` key that carries per-input metadata (see ``submit``)."""

Side = Literal["right", "left"]


class EmbedKeywords(TypedDict, total=False):
    """The keywords of ``embed()`` besides ``chunking``, ``chunk_pooling`` and ``encoding``
    (which decide the type of its result): see :meth:`producer_sdk.EmbedClient.embed`."""

    timeout: float | None
    model: str | None
    normalize: bool
    truncate: bool
    dimensions: int | None
    prompt: str | None
    prompt_name: str | None
    truncation_direction: Side | None


class UnchunkedKeywords(EmbedKeywords, total=False):
    """:class:`EmbedKeywords` with ``chunking`` and ``chunk_pooling`` at their defaults
    (the result is one row per text)."""

    chunking: None
    chunk_pooling: Literal["none"]


@dataclasses.dataclass(frozen=True, slots=True)
class EmbedOptions:
    """How to embed: the fields of an embed request besides its texts (the keywords of
    :meth:`producer_sdk.EmbedClient.embed`, which documents them)."""

    model: str | None = None
    normalize: bool = True
    truncate: bool = True
    dimensions: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    truncation_direction: str | None = None
    chunking: Chunking | None = None
    chunk_pooling: str = "none"
    encoding: Encoding | str = Encoding.FLOAT32

    def __post_init__(self) -> None:
        if self.encoding not in _ENCODING_NAMES:
            raise ValueError(
                f"encoding must be one of {', '.join(Encoding)}, not {self.encoding!r}"
            )
        object.__setattr__(self, "encoding", Encoding(self.encoding))
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("give prompt (the text) or prompt_name (a model's prompt), not both")
        _check_side(self.truncation_direction)
        if self.chunking is not None and not isinstance(self.chunking, Chunking):
            raise TypeError(
                f"chunking must be a Chunking(max_tokens, overlap_tokens), not {self.chunking!r}"
            )
        if self.chunk_pooling not in CHUNK_POOLINGS:
            raise ValueError(f"chunk_pooling must be 'none' or 'mean', not {self.chunk_pooling!r}")
        if self.chunk_pooling != "none" and self.chunking is None:
            raise ValueError(f"chunk_pooling {self.chunk_pooling!r} needs chunking")

    @property
    def chunked(self) -> bool:
        """Whether the result has one vector per chunk (``chunking``, pooling ``none``)."""
        return self.chunking is not None and self.chunk_pooling == "none"

    def request(
        self,
        texts: Sequence[str],
        max_input_chars: int,
        default_model: str | None,
        request_id: str | None = None,
        **fields: Any,
    ) -> EmbedRequest:
        """The request for ``texts`` (checked against ``max_input_chars``, unless chunked:
        chunks use all of a text); ``fields``: its other fields (``reply_to``, ``keys``,
        ``meta``)."""
        if self.chunking is None:
            check_lengths(texts, max_input_chars)
        # Each option is the request field of its name.
        options = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        options["model"] = self.model or default_model
        return EmbedRequest(
            id=request_id or uuid.uuid4().hex, inputs=tuple(texts), **options, **fields
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SubmitOptions:
    """What :meth:`producer_sdk.EmbedClient.submit` (and ``submit_sparse``) adds to a
    request: where its result goes, its id, lane and partition key, and the request-level
    ``meta``."""

    reply_to: str
    meta: Mapping[str, Any] | None = None
    bulk: bool = True
    request_id: str | None = None
    affinity: bool = False

    def __post_init__(self) -> None:
        if self.request_id is not None and (
            not isinstance(self.request_id, str)
            or not 0 < len(self.request_id.encode("utf-8")) <= MAX_ID_BYTES
        ):
            raise ValueError(f"request_id must be 1 to {MAX_ID_BYTES} bytes of UTF-8")
        if not is_valid_topic(self.reply_to):
            raise ValueError(f"reply_to {self.reply_to!r} is not a valid Kafka topic name")

    def request(
        self,
        texts: Sequence[str],
        embed: EmbedOptions,
        max_input_chars: int,
        default_model: str | None,
        keys: Sequence[str | int] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> EmbedRequest:
        """The request for ``texts`` with one key and one metadata map (or None) per text."""
        fields = self._fields(len(texts), keys, metadata)
        request = embed.request(texts, max_input_chars, default_model, self.request_id, **fields)
        if not all(request.inputs):
            index = request.inputs.index("")
            raise ValueError(f"texts[{index}] is empty; the worker refuses empty inputs")
        dimensions = embed.dimensions
        if dimensions is not None and (isinstance(dimensions, bool) or dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, not {dimensions!r}")
        return request

    def sparse_request(
        self,
        texts: Sequence[str],
        sparse: SparseOptions,
        max_input_chars: int,
        default_model: str | None,
        keys: Sequence[str | int] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> SparseRequest:
        """The sparse request for ``texts``, with keys and metadata as :meth:`request`."""
        fields = self._fields(len(texts), keys, metadata)
        return sparse.request(texts, max_input_chars, default_model, self.request_id, **fields)

    def _fields(
        self,
        count: int,
        keys: Sequence[str | int] | None,
        metadata: Sequence[Mapping[str, Any] | None] | None,
    ) -> dict[str, Any]:
        """The fields a submitted request of ``count`` texts carries besides its options."""
        return {
            "reply_to": self.reply_to,
            "keys": _check_keys(keys, count),
            "meta": _combined_meta(self.meta, metadata, count),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RerankOptions:
    """How to rerank (the keywords of :meth:`producer_sdk.EmbedClient.rerank`)."""

    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: str | None = None

    def __post_init__(self) -> None:
        top_n = self.top_n
        if top_n is not None and (
            isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1
        ):
            raise ValueError(f"top_n must be a positive integer or None, not {top_n!r}")
        _check_side(self.truncation_direction)

    def request(
        self, query: str, documents: Sequence[str], max_input_chars: int, default_model: str | None
    ) -> RerankRequest:
        """The request to score ``documents`` against ``query``, both checked: TypeError or
        ValueError for what no worker would accept, InputTooLongError for a text over
        ``max_input_chars``."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, not {type(query).__name__}")
        if not query:
            raise ValueError("query must not be empty")
        if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
            raise TypeError("documents must be a sequence of strings")
        if not documents:
            raise ValueError("documents must not be empty")
        for index, document in enumerate(documents):
            if not document:
                raise ValueError(f"documents[{index}] is empty; the worker refuses empty documents")
        check_lengths([query], max_input_chars, "query")
        check_lengths(documents, max_input_chars, "document")
        return RerankRequest(
            id=uuid.uuid4().hex,
            query=query,
            documents=tuple(documents),
            model=self.model or default_model,
            top_n=self.top_n,
            return_documents=self.return_documents,
            raw_scores=self.raw_scores,
            truncate=self.truncate,
            truncation_direction=self.truncation_direction,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SparseOptions:
    """How to embed sparsely (the keywords of :meth:`producer_sdk.EmbedClient.embed_sparse`)."""

    model: str | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    top_k: int | None = None
    truncate: bool = True
    truncation_direction: str | None = None

    def __post_init__(self) -> None:
        top_k = self.top_k
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k must be a positive integer or None, not {top_k!r}")
        if self.prompt is not None and self.prompt_name is not None:
            raise ValueError("prompt and prompt_name are exclusive: give the text or the name")
        _check_side(self.truncation_direction)

    def request(
        self,
        texts: Sequence[str],
        max_input_chars: int,
        default_model: str | None,
        request_id: str | None = None,
        **fields: Any,
    ) -> SparseRequest:
        """The request for ``texts``, checked as :class:`EmbedOptions` checks them;
        ``fields``: its other fields (``reply_to``, ``keys``, ``meta``)."""
        check_texts(texts)
        for index, text in enumerate(texts):
            if not text:
                raise ValueError(f"texts[{index}] is empty; the worker refuses empty inputs")
        check_lengths(texts, max_input_chars)
        return SparseRequest(
            id=request_id or uuid.uuid4().hex,
            inputs=tuple(texts),
            model=self.model or default_model,
            truncate=self.truncate,
            truncation_direction=self.truncation_direction,
            prompt=self.prompt,
            prompt_name=self.prompt_name,
            top_k=self.top_k,
            **fields,
        )


def check_texts(texts: Sequence[str]) -> None:
    """TypeError unless ``texts`` is a sequence of strings; ValueError when it is empty."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of strings")
    if not texts:
        raise ValueError("texts must not be empty")


def check_lengths(texts: Sequence[str], limit: int, item: str = "input") -> None:
    """InputTooLongError for the first of ``texts`` over ``limit`` characters (``item``:
    what they are; "query": one text, named without an index)."""
    for index, text in enumerate(texts):
        if len(text) > limit:
            raise InputTooLongError(len(text), limit, None if item == "query" else index, item)


def _check_side(truncation_direction: str | None) -> None:
    if truncation_direction not in (None, "right", "left"):
        raise ValueError(
            f"truncation_direction must be 'right' or 'left', not {truncation_direction!r}"
        )


def _check_keys(keys: Sequence[str | int] | None, count: int) -> tuple[str | int, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, str | bytes):
        raise TypeError("keys must be a sequence of strings or integers, one per text")
    checked = tuple(keys)
    if len(checked) != count:
        raise ValueError(f"keys has {len(checked)} entries for {count} texts; give one per text")
    for index, key in enumerate(checked):
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"keys[{index}] must be a string or an integer, not {key!r}")
        if isinstance(key, int) and not _INT64_MIN <= key <= _UINT64_MAX:
            raise ValueError(f"keys[{index}] does not fit in 64 bits")
    return checked


def _combined_meta(
    meta: Mapping[str, Any] | None,
    metadata: Sequence[Mapping[str, Any] | None] | None,
    count: int,
) -> dict[str, Any] | None:
    """The request's ``meta``: the request-level keys, and ``docs`` for per-input maps."""
    combined = _string_keyed(meta, "meta") if meta is not None else {}
    if metadata is not None:
        if DOCS_META_KEY in combined:
            raise ValueError(
                f"meta[{DOCS_META_KEY!r}] is reserved for the per-input metadata; "
                "pass those as metadata="
            )
        if isinstance(metadata, Mapping | str | bytes):
            raise TypeError("metadata must be a sequence of maps (or None), one per text")
        docs = [
            {} if item is None else _string_keyed(item, f"metadata[{index}]")
            for index, item in enumerate(metadata)
        ]
        if len(docs) != count:
            raise ValueError(
                f"metadata has {len(docs)} entries for {count} texts; give one per text"
            )
        combined[DOCS_META_KEY] = docs
    return combined or None


def _string_keyed(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a map with string keys, not {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{name} must have string keys, not {key!r}")
    return dict(value)
