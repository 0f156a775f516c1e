"""What every API does with an embedding, rerank, tokenize or decode request, without
HTTP: the model check against the catalog (its name, and its ``kind``), the in-flight
bound, the call through the SDK, and the SDK's errors as :class:`~gateway.errors.ApiError`.

Each request is one :class:`EmbedClient` call (``embed_result``, ``rerank``, ``tokenize``
or ``decode``) on the interactive lane, waiting at most ``timeout_s`` (which the SDK sends
as the request's ``deadline_ms``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypedDict, TypeVar, Unpack

import structlog

from gateway.catalog import CatalogCache
from gateway.errors import ApiError, from_sdk
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from producer_sdk.catalog import CatalogModel
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import EmbedTimeoutError, KembedError
from producer_sdk.rerank import Reranked
from producer_sdk.sparse import SparseEmbeddings
from producer_sdk.tokens import Decoding, Tokenization
from schemas import Encoding, Kind

__all__ = ["EmbedOptions", "Gateway", "GatewayClient", "Outcome", "RerankOptions"]

log = structlog.get_logger("kembed.gateway")

_RETRY_AFTER_S = "1"
_SURROGATE = re.compile("[\ud800-\udfff]")
"""JSON can carry lone surrogates (``"\\udc80"``), which no UTF-8 message can."""
_MAX_NAME_SHOWN = 200
_KIND_NAMES: dict[str, str] = {
    Kind.EMBED: "an embedding model",
    Kind.RERANK: "a reranker (a cross-encoder)",
    Kind.SPARSE: "a sparse encoder (SPLADE-style)",
}
_KIND_USE: dict[str, str] = {
    Kind.EMBED: "embed with it (POST /v1/embeddings, /v2/embed, /embed), or name a reranker",
    Kind.RERANK: "rerank with it (POST /v1/rerank, /v2/rerank, /rerank), or name an "
    "embedding model",
    Kind.SPARSE: "ask it for term weights (POST /embed_sparse), or name an embedding model",
}
T = TypeVar("T")


class _Answer(Protocol):
    @property
    def model(self) -> str: ...


A = TypeVar("A", bound=_Answer)


class GatewayClient(Protocol):
    """What the gateway uses of :class:`producer_sdk.EmbedClient`."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def models(self, timeout: float | None = None) -> list[CatalogModel]: ...

    async def embed_result(
        self, texts: Sequence[str], *, timeout: float | None = None, **options: Unpack[EmbedOptions]
    ) -> Embeddings: ...

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        timeout: float | None = None,
        **options: Unpack[RerankOptions],
    ) -> Reranked: ...

    async def embed_sparse(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = None,
        **options: Unpack[SparseOptions],
    ) -> SparseEmbeddings: ...

    async def tokenize(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
        timeout: float | None = None,
    ) -> Tokenization: ...

    async def decode(
        self,
        ids: Sequence[Sequence[int]],
        *,
        model: str | None = None,
        skip_special_tokens: bool = True,
        timeout: float | None = None,
    ) -> Decoding: ...


class EmbedOptions(TypedDict, total=False):
    """How to embed, as both APIs describe it: keyword arguments of
    :meth:`producer_sdk.EmbedClient.embed_result`."""

    model: str | None
    normalize: bool
    truncate: bool
    dimensions: int | None
    prompt_name: str | None
    truncation_direction: Literal["right", "left"] | None
    encoding: Encoding | str


class RerankOptions(TypedDict, total=False):
    """How to rerank, as both APIs describe it: keyword arguments of
    :meth:`producer_sdk.EmbedClient.rerank`."""

    model: str | None
    top_n: int | None
    raw_scores: bool
    truncate: bool
    truncation_direction: Literal["right", "left"] | None


class SparseOptions(TypedDict, total=False):
    """How to embed sparsely: keyword arguments of :meth:`producer_sdk.EmbedClient.embed_sparse`."""

    model: str | None
    prompt_name: str | None
    top_k: int | None
    truncate: bool
    truncation_direction: Literal["right", "left"] | None


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """A result (:class:`Embeddings` or :class:`Reranked`), and the catalog's name of the
    model that made it."""

    result: T
    model: str


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        client: GatewayClient,
        metrics: GatewayMetrics,
        catalog: CatalogCache | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.catalog = catalog or CatalogCache(client.models)
        self.in_flight = 0

    def check_inputs(self, texts: Sequence[str], field: str = "input") -> None:
        """The gateway's own validation of the texts (``field``: what the API calls them):
        at least one, none empty, at most ``max_inputs``."""
        if not texts:
            raise ApiError("empty_input", f"{field} must not be empty", param=field)
        if len(texts) > self.settings.max_inputs:
            noun = "inputs" if field == "input" else field
            raise ApiError(
                "too_many_inputs",
                f"{len(texts)} {noun}, above this gateway's limit of {self.settings.max_inputs}",
                param=field,
            )
        for index, text in enumerate(texts):
            _check_text(text, f"{field}[{index}]", field, self.settings.max_input_chars)

    async def embed(
        self, texts: Sequence[str], options: EmbedOptions, field: str = "input"
    ) -> Outcome[Embeddings]:
        """The result for ``texts`` (what the API calls ``field``); raises ApiError for
        everything that is not one."""
        self.check_inputs(texts, field)

        def call(wait: float) -> Awaitable[Embeddings]:
            return self.client.embed_result(texts, timeout=wait, **options)

        return await self._bounded(options.get("model"), Kind.EMBED, call, field)

    async def rerank(
        self, query: str, documents: Sequence[str], options: RerankOptions, field: str
    ) -> Outcome[Reranked]:
        """The scores of ``documents`` (what the API calls ``field``) for ``query``, by the
        model named, else :meth:`default_reranker`; raises ApiError for everything else."""
        _check_text(query, "query", "query", self.settings.max_input_chars)
        self.check_inputs(documents, field)
        model = options.get("model") or await self.default_reranker()
        chosen: RerankOptions = {**options, "model": model}

        def call(wait: float) -> Awaitable[Reranked]:
            return self.client.rerank(query, documents, timeout=wait, **chosen)

        return await self._bounded(model, Kind.RERANK, call, field)

    async def embed_sparse(
        self, texts: Sequence[str], options: SparseOptions, field: str = "inputs"
    ) -> Outcome[SparseEmbeddings]:
        """The term weights of ``texts`` by the model named, else :meth:`default_of` kind
        sparse; raises ApiError for everything that is not one."""
        self.check_inputs(texts, field)
        model = options.get("model") or await self.default_of(Kind.SPARSE)
        chosen: SparseOptions = {**options, "model": model}

        def call(wait: float) -> Awaitable[SparseEmbeddings]:
            return self.client.embed_sparse(texts, timeout=wait, **chosen)

        return await self._bounded(model, Kind.SPARSE, call, field)

    async def tokenize(
        self, texts: Sequence[str], add_special_tokens: bool, prompt_name: str | None
    ) -> Outcome[Tokenization]:
        """The tokens of ``texts`` by the gateway's model's tokenizer (any kind of model)."""
        self.check_inputs(texts, "inputs")
        model = self.settings.model

        def call(wait: float) -> Awaitable[Tokenization]:
            return self.client.tokenize(
                texts,
                model=model,
                add_special_tokens=add_special_tokens,
                prompt_name=prompt_name,
                timeout=wait,
            )

        return await self._bounded(model, None, call, "inputs")

    async def decode(
        self, ids: Sequence[Sequence[int]], skip_special_tokens: bool
    ) -> Outcome[Decoding]:
        """The texts of the sequences of token ``ids`` by the gateway's model's tokenizer."""
        if not ids:
            raise ApiError("empty_input", "`ids` cannot be empty", param="ids")
        if len(ids) > self.settings.max_inputs:
            raise ApiError(
                "too_many_inputs",
                f"{len(ids)} sequences, above this gateway's limit of {self.settings.max_inputs}",
                param="ids",
            )
        model = self.settings.model

        def call(wait: float) -> Awaitable[Decoding]:
            return self.client.decode(
                ids, model=model, skip_special_tokens=skip_special_tokens, timeout=wait
            )

        return await self._bounded(model, None, call, "ids")

    async def default_reranker(self) -> str:
        """``rerank_model`` when set, else the one live model of kind ``rerank`` in the
        catalog; ApiError when there is none (``model_not_found``) or several."""
        return await self.default_of(Kind.RERANK)

    async def default_of(self, kind: str) -> str:
        """The gateway's configured model of ``kind`` (``rerank_model``, ``sparse_model``)
        when set, else the one live model of ``kind`` in the catalog; ApiError when there
        is none (``model_not_found``) or several."""
        setting = "rerank_model" if kind == Kind.RERANK else "sparse_model"
        configured: str | None = getattr(self.settings, setting)
        if configured is not None:
            return configured
        try:
            models = await self.catalog.models()
        except KembedError as exc:
            raise _failed(from_sdk(exc), exc) from None
        names = [model.name for model in models if model.kind == kind]
        noun = "reranker" if kind == Kind.RERANK else "sparse encoder"
        if not names:
            raise ApiError(
                "model_not_found",
                f"no live worker serves a {noun} (a model of kind {kind})",
                param="model",
            )
        if len(names) > 1:
            raise ApiError(
                "invalid_request",
                f"{len(names)} {noun}s are served ({', '.join(names)}): name one in 'model', "
                f"or set the gateway's KEMBED_GATEWAY_{setting.upper()}",
                param="model",
            )
        return names[0]

    async def _bounded(
        self,
        model: str | None,
        kind: str | None,
        call: Callable[[float], Awaitable[A]],
        field: str,
    ) -> Outcome[A]:
        """``call(seconds left)`` for ``model`` (of ``kind``; None: any) within the
        in-flight bound and the timeout."""
        if self.in_flight >= self.settings.max_in_flight:
            raise ApiError(
                "overloaded",
                f"{self.in_flight} requests are waiting for results, this gateway's limit; "
                "retry after a second",
                headers={"Retry-After": _RETRY_AFTER_S},
            )
        self.in_flight += 1
        self.metrics.in_flight.inc()
        try:
            deadline = time.monotonic() + self.settings.timeout_s
            name = await self._model_name(model, kind)
            try:
                result = await self._call(call, model, deadline, field)
            except ApiError as error:
                error.model = name
                raise
            return Outcome(result, result.model or name)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()

    async def _model_name(self, model: str | None, kind: str | None) -> str:
        """The catalog's name of ``model`` (empty for None: the workers' default); raises
        ApiError ``model_not_found`` when no live worker serves it, ``invalid_request``
        when it is of another kind than ``kind``."""
        if model is None:
            return ""
        return (await self._named(model, kind)).name

    async def entry(self, model: str | None, kind: str = Kind.EMBED) -> CatalogModel:
        """The catalog entry of ``model``; None: the gateway's ``model`` (``rerank_model``
        for a reranker), else the workers' default (the embedding model served on the
        requests topic; the one reranker). Raises ApiError as :meth:`_model_name` does."""
        if model is None:
            model = self.settings.model if kind == Kind.EMBED else await self.default_reranker()
        if model is not None:
            return await self._named(model, kind)
        try:
            models = await self.catalog.models()
        except KembedError as exc:
            raise _failed(from_sdk(exc), exc) from None
        topic = self.settings.requests_topic
        for entry in models:
            if entry.kind == kind and topic in entry.topics:
                return entry
        raise ApiError(
            "model_not_found",
            f"no live worker serves an embedding model on {topic!r} (the default model); "
            "name one in 'model'",
            param="model",
        )

    async def _named(self, model: str, kind: str | None) -> CatalogModel:
        entry = await self._find(model)
        if entry is None:
            raise ApiError(
                "model_not_found",
                f"the model {model[:_MAX_NAME_SHOWN]!r} does not exist: no live worker "
                "announces it (GET /v1/models lists the served models)",
                param="model",
            )
        if kind is not None and entry.kind != kind:
            error = ApiError(
                "invalid_request",
                f"the model {entry.name!r} is {_KIND_NAMES.get(entry.kind, entry.kind)} "
                f"(kind {entry.kind}): {_KIND_USE.get(entry.kind, 'name another model')}",
                param="model",
            )
            error.model = entry.name
            raise error
        return entry

    async def _call(
        self,
        call: Callable[[float], Awaitable[A]],
        model: str | None,
        deadline: float,
        field: str,
    ) -> A:
        try:
            return await call(max(deadline - time.monotonic(), 0.001))
        except EmbedTimeoutError as exc:
            live = await self._serving(model)
            raise from_sdk(exc, workers_live=live) from None
        except KembedError as exc:
            raise _failed(from_sdk(exc, field=field), exc) from None
        except Exception as exc:  # noqa: BLE001 (any other failure is a 500, logged once)
            log.error("gateway.embed_failed", error_type=type(exc).__name__, error=str(exc))
            raise ApiError("internal", "the gateway failed to embed the request") from None

    async def _find(self, model: str) -> CatalogModel | None:
        try:
            return await self.catalog.find(model)
        except KembedError as exc:
            raise _failed(from_sdk(exc), exc) from None

    async def _serving(self, model: str | None) -> bool:
        """Whether the catalog shows a live worker for ``model`` (None: for the requests
        topic the SDK sends an unnamed model's requests to)."""
        try:
            models = await self.catalog.models(max_age_s=1.0)  # what the fleet is now
        except KembedError:
            return False
        if model is not None:
            return any(entry.serves(model) for entry in models)
        return any(self.settings.requests_topic in entry.topics for entry in models)


def _check_text(text: str, where: str, param: str, max_chars: int) -> None:
    """One text: not empty, at most ``max_chars`` characters, and encodable as UTF-8
    (``where`` names it in the message)."""
    if not text:
        raise ApiError("invalid_request", f"{where} is empty", param=param)
    if len(text) > max_chars:
        raise ApiError(
            "input_too_long",
            f"{where} has {len(text)} characters, above this gateway's limit of {max_chars} "
            "(a model uses only a text's first tokens; send less of it)",
            param=param,
        )
    if not text.isascii() and _SURROGATE.search(text):
        raise ApiError(
            "invalid_request",
            f"{where} is not valid Unicode text (it holds a lone surrogate)",
            param=param,
        )


def _failed(answer: ApiError, error: KembedError) -> ApiError:
    """``answer``, logged first when Kafka or a worker failed (the SDK's messages hold ids,
    sizes and topics, never request text)."""
    if answer.kind.status >= 500:
        log.warning(
            "gateway.request_failed",
            code=answer.code,
            error_type=type(error).__name__,
            error=str(error),
        )
    return answer
