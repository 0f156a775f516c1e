"""What both APIs do with an embedding request, without HTTP: the model check against the
catalog, the in-flight bound, the call through the SDK, and the SDK's errors as
:class:`~gateway.errors.ApiError`.

Each request is one :meth:`EmbedClient.embed_result` call on the interactive lane, waiting
at most ``timeout_s`` (which the SDK sends as the request's ``deadline_ms``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, Unpack

import structlog

from gateway.catalog import CatalogCache
from gateway.errors import ApiError, from_sdk
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from producer_sdk.catalog import CatalogModel
from producer_sdk.encodings import Embeddings
from producer_sdk.errors import EmbedTimeoutError, KembedError

__all__ = ["EmbedOptions", "Gateway", "GatewayClient", "Outcome"]

log = structlog.get_logger("kembed.gateway")

_RETRY_AFTER_S = "1"
_SURROGATE = re.compile("[\ud800-\udfff]")
"""JSON can carry lone surrogates (``"\\udc80"``), which no UTF-8 message can."""
_MAX_NAME_SHOWN = 200


class GatewayClient(Protocol):
    """What the gateway uses of :class:`producer_sdk.EmbedClient`."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def models(self, timeout: float | None = None) -> list[CatalogModel]: ...

    async def embed_result(
        self, texts: Sequence[str], *, timeout: float | None = None, **options: Unpack[EmbedOptions]
    ) -> Embeddings: ...


class EmbedOptions(TypedDict, total=False):
    """How to embed, as both APIs describe it: keyword arguments of
    :meth:`producer_sdk.EmbedClient.embed_result`."""

    model: str | None
    normalize: bool
    truncate: bool
    dimensions: int | None
    prompt_name: str | None
    truncation_direction: Literal["right", "left"] | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A result, and the catalog's name of the model that made it."""

    embeddings: Embeddings
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

    def check_inputs(self, texts: Sequence[str]) -> None:
        """The gateway's own validation of the texts: at least one, none empty, at most
        ``max_inputs``."""
        if not texts:
            raise ApiError("empty_input", "input must not be empty", param="input")
        if len(texts) > self.settings.max_inputs:
            raise ApiError(
                "too_many_inputs",
                f"{len(texts)} inputs, above this gateway's limit of {self.settings.max_inputs}",
                param="input",
            )
        for index, text in enumerate(texts):
            if not text:
                raise ApiError("invalid_request", f"input[{index}] is empty", param="input")
            if not text.isascii() and _SURROGATE.search(text):
                raise ApiError(
                    "invalid_request",
                    f"input[{index}] is not valid Unicode text (it holds a lone surrogate)",
                    param="input",
                )

    async def embed(self, texts: Sequence[str], options: EmbedOptions) -> Outcome:
        """The result for ``texts``; raises ApiError for everything that is not one."""
        self.check_inputs(texts)
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
            return await self._embed(texts, options)
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()

    async def _embed(self, texts: Sequence[str], options: EmbedOptions) -> Outcome:
        deadline = time.monotonic() + self.settings.timeout_s
        model = options.get("model")
        name = await self._model_name(model)
        try:
            result = await self._call(texts, options, deadline)
        except ApiError as error:
            error.model = name
            raise
        return Outcome(result, result.model or name)

    async def _model_name(self, model: str | None) -> str:
        """The catalog's name of ``model`` (empty for None: the workers' default); raises
        ApiError ``model_not_found`` when no live worker serves it."""
        if model is None:
            return ""
        entry = await self._find(model)
        if entry is None:
            raise ApiError(
                "model_not_found",
                f"the model {model[:_MAX_NAME_SHOWN]!r} does not exist: no live worker "
                "announces it (GET /v1/models lists the served models)",
                param="model",
            )
        return entry.name

    async def _call(
        self, texts: Sequence[str], options: EmbedOptions, deadline: float
    ) -> Embeddings:
        try:
            wait = max(deadline - time.monotonic(), 0.001)
            return await self.client.embed_result(texts, timeout=wait, **options)
        except EmbedTimeoutError as exc:
            live = await self._serving(options.get("model"))
            raise from_sdk(exc, workers_live=live) from None
        except KembedError as exc:
            raise _failed(from_sdk(exc), exc) from None
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
