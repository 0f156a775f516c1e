"""The gateway's FastAPI application: :func:`create_app`.

Composition: the lifespan creates and starts one :class:`producer_sdk.EmbedClient` (the
shared Kafka settings, ``client_id="kembed-gateway"``, its own reply partition) and closes
it at shutdown; the routes are the OpenAI API (:mod:`gateway.openai_api`), the Cohere/Jina
rerank API ``/v1/rerank`` (:mod:`gateway.rerank_api`), Cohere's v2 API
(:mod:`gateway.cohere_api`), TEI's routes (:mod:`gateway.tei_api`), ``/health``,
``/ready`` and ``/metrics``. Around them
one ASGI middleware (:class:`Guard`) checks the API key and the body size before anything
is parsed, and counts and times every API request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import cohere_api, openai_api, rerank_api, tei_api
from gateway.auth import ApiKeys
from gateway.common import gateway_of
from gateway.errors import ApiError, Shape
from gateway.fast_path import FastRoute
from gateway.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.service import Gateway, GatewayClient
from gateway.settings import GatewaySettings
from kembed_shared.settings import KafkaClientSettings, security_options
from kembed_shared.version import kembed_version
from producer_sdk import EmbedClient

__all__ = ["API_ENDPOINTS", "CLIENT_ID", "TEI_ENDPOINTS", "ClientFactory", "Guard", "create_app"]

log = structlog.get_logger("kembed.gateway")

CLIENT_ID = "kembed-gateway"
TEI_ENDPOINTS = frozenset(
    {
        "/",
        "/invocations",
        "/embed",
        "/embed_sparse",
        "/rerank",
        "/similarity",
        "/tokenize",
        "/decode",
        "/info",
    }
)
"""The endpoints that answer errors in TEI's shape (``/v2/...``: Cohere's; the others,
unknown paths included: OpenAI's)."""
API_ENDPOINTS = TEI_ENDPOINTS | {
    "/v1/embeddings",
    "/v1/models",
    "/v1/rerank",
    "/v2/embed",
    "/v2/rerank",
}
"""The endpoints counted and timed in the metrics (not probes, scrapes or the docs)."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout"}
"""The gateway code of the framework's own HTTP errors (the rest: invalid_request, or
internal from 500 on)."""

ClientFactory = Callable[..., GatewayClient]
"""Makes the client: ``EmbedClient(bootstrap_servers, **options)`` (a fake in tests)."""


class StartupError(RuntimeError):
    """The gateway could not connect to Kafka (logged as ``gateway.kafka_failed``)."""


def create_app(
    settings: GatewaySettings,
    kafka: KafkaClientSettings | None = None,
    *,
    client_factory: ClientFactory = EmbedClient,
) -> FastAPI:
    """The application; its lifespan connects to Kafka (``kafka``: the ``KEMBED_*``
    connection settings, read from the environment when None)."""
    kafka = kafka if kafka is not None else KafkaClientSettings.model_validate({})
    metrics = GatewayMetrics()
    keys = ApiKeys(settings.keys())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not keys.required:
            log.warning(
                "gateway.no_api_keys",
                hint="every client is served: set KEMBED_GATEWAY_API_KEYS or "
                "KEMBED_GATEWAY_API_KEYS_FILE",
            )
        client = client_factory(
            kafka.bootstrap_servers,
            **security_options(kafka),
            client_id=CLIENT_ID,
            requests_topic=settings.requests_topic,
            reply_topic=settings.reply_topic,
            catalog_topic=settings.catalog_topic,
            timeout=settings.timeout_s,
            max_input_chars=settings.max_input_chars,
        )
        try:
            await client.start()
        except Exception as exc:  # noqa: BLE001 (logged once here, then startup fails)
            log.error(
                "gateway.kafka_failed",
                bootstrap_servers=kafka.bootstrap_servers,
                error_type=type(exc).__name__,
                error=str(exc),
            )
            raise StartupError("the gateway could not connect to Kafka") from None
        gateway = Gateway(settings, client, metrics)
        app.state.gateway = gateway
        log.info(
            "gateway.ready_to_serve",
            api_keys=len(settings.keys()),
            timeout_s=settings.timeout_s,
            max_in_flight=settings.max_in_flight,
            model=settings.model,
            rerank_model=settings.rerank_model,
        )
        try:
            yield
        finally:
            app.state.gateway = None
            await gateway.catalog.close()
            await client.close()
            log.info("gateway.stopped")

    app = FastAPI(
        title="kembed gateway",
        version=kembed_version(),
        description="OpenAI-, Cohere- and text-embeddings-inference-shaped embedding APIs, "
        "and Cohere/Jina- and TEI-shaped rerank APIs, in front of a kembed fleet on Kafka.",
        lifespan=lifespan,
    )
    app.state.gateway = None
    app.state.metrics = metrics
    bearer = [Depends(HTTPBearer(auto_error=False))]  # documents the key in the OpenAPI page
    app.include_router(openai_api.router, dependencies=bearer)
    app.include_router(rerank_api.router, dependencies=bearer)
    app.include_router(cohere_api.router, dependencies=bearer)
    app.include_router(tei_api.router, dependencies=bearer)
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _failed)
    app.add_middleware(
        Guard,
        keys=keys,
        metrics=metrics,
        fast={"/v1/embeddings": openai_api.FAST_EMBEDDINGS, "/embed": tei_api.FAST_EMBED},
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
    )

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        """200 while the process serves."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"])
    async def ready(request: Request) -> JSONResponse:
        """200 when Kafka answers and at least one live model is in the catalog, else 503
        (the catalog is read at most every few seconds)."""
        gateway: Gateway | None = request.app.state.gateway
        if gateway is None:
            return JSONResponse({"status": "unready", "reason": "starting"}, status_code=503)
        try:
            models = await gateway.catalog.models()
        except Exception:  # noqa: BLE001 (an unreadable catalog is the answer)
            reason = "Kafka did not answer (the model catalog could not be read)"
            return JSONResponse({"status": "unready", "reason": reason}, status_code=503)
        if not models:
            reason = "no live model in the catalog"
            return JSONResponse({"status": "unready", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ready", "models": [model.name for model in models]})

    @app.get("/metrics", tags=["operations"])
    async def prometheus() -> Response:
        """Prometheus metrics (text format)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    return app


def shape_of(path: str) -> Shape:
    """TEI's error shape for its routes, Cohere's under ``/v2/``, OpenAI's for everything
    else."""
    if path in TEI_ENDPOINTS:
        return "tei"
    return "cohere" if path.startswith("/v2/") else "openai"


def error_response(error: ApiError, shape: Shape) -> JSONResponse:
    return JSONResponse(error.body(shape), status_code=error.status(shape), headers=error.headers)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    if error.model:
        request.state.model = error.model
    return error_response(error, shape_of(request.url.path))


async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
    """pydantic's verdict on a body, as a 400 (OpenAI) or 422 (TEI) that names the field
    and never repeats the input."""
    first = error.errors()[0] if error.errors() else {}
    where = [str(part) for part in first.get("loc", ()) if part != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        message, param = "the body is not valid JSON", None
    elif not where:
        content_type = request.headers.get("content-type", "")
        if "json" not in content_type:
            message = "send the body as JSON, with 'Content-Type: application/json'"
        else:
            message = "the body must be a JSON object"
        param = None
    else:
        param = where[0]  # the field; pydantic's loc goes on into union members and items
        message = f"{param}: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}"
    answer = ApiError("invalid_request", message, param=param)
    return error_response(answer, shape_of(request.url.path))


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    """The framework's own answers (no route for the path: 404; not for the method: 405;
    a body it could not parse: 400) in the API's shape, not FastAPI's ``{"detail": ...}``."""
    code = _HTTP_CODES.get(error.status_code)
    if code is None:
        code = "internal" if error.status_code >= 500 else "invalid_request"
    if code == "not_found":
        message = f"no endpoint {request.url.path!r}: see /docs"[:300]
    elif code == "method_not_allowed":
        message = f"{request.url.path!r} does not take {request.method}"[:300]
    elif code == "invalid_request":
        message = "the body could not be parsed: send it as UTF-8 JSON"
    else:
        message = "the gateway failed to answer the request"
    headers = dict(error.headers or {})  # 405: Allow
    answer = ApiError(code, message, headers=headers)
    return error_response(answer, shape_of(request.url.path))


async def _failed(request: Request, error: Exception) -> JSONResponse:
    """Anything else that escaped a route: 500 ``internal`` in the API's shape (the error
    is logged by the server, without the request)."""
    log.error("gateway.failed", error_type=type(error).__name__, path=request.url.path[:300])
    answer = ApiError("internal", "the gateway failed to answer the request")
    return error_response(answer, shape_of(request.url.path))


@dataclass(slots=True, eq=False)
class Guard:
    """Pure ASGI middleware before the routes: the API key, then the body size (the
    Content-Length header, then the bytes as they stream in; the body is read here, at
    most ``max_body_bytes`` of it, within ``body_timeout_s`` of the headers, and handed on
    whole), and for the API endpoints the request's metrics and log line."""

    app: ASGIApp
    _: KW_ONLY
    keys: ApiKeys
    metrics: GatewayMetrics
    max_body_bytes: int
    body_timeout_s: float = 30.0
    fast: Mapping[str, FastRoute[Any]] = field(default_factory=dict)
    """Routes whose plain bodies skip FastAPI (gateway.fast_path), by path."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        state: MutableMapping[str, Any] = scope.setdefault("state", {})
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, sending, path)
        finally:
            if path in API_ENDPOINTS:
                self._account(path, state, status, time.perf_counter() - started)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        shape = shape_of(path)
        headers = Headers(scope=scope)
        if not self.keys.allows(path, headers.get("authorization")):
            missing = headers.get("authorization") is None
            error = ApiError(
                "invalid_api_key",
                "no API key: send 'Authorization: Bearer <key>'"
                if missing
                else "incorrect API key provided",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await error_response(error, shape)(scope, receive, send)
            return
        if scope["method"] in _BODY_METHODS:
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body = await self._body(headers, receive)
            except TimeoutError:
                body = ApiError(
                    "request_timeout",
                    f"the body did not arrive within {self.body_timeout_s:g} s",
                    headers={"Connection": "close"},  # the rest of it is not read
                )
            if isinstance(body, ApiError):
                await error_response(body, shape)(scope, receive, send)
                return
            if body is None:
                return  # the client went away
            route = self.fast.get(path) if scope["method"] == "POST" else None
            parsed = None if route is None else route.parse(body, headers.get("content-type"))
            if route is not None and parsed is not None:
                await _serve_fast(route, parsed, Request(scope, _replay(body, receive)), send)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _body(self, headers: Headers, receive: Receive) -> bytes | ApiError | None:
        """The whole body, or the error that refuses it; None if the client disconnected."""
        too_large = ApiError(
            "request_too_large",
            f"the body is over this gateway's limit of {self.max_body_bytes} bytes",
        )
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return ApiError("invalid_request", "Content-Length is not a number")
            if int(length) > self.max_body_bytes:
                return too_large
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _account(
        self, endpoint: str, state: MutableMapping[str, Any], status: int, seconds: float
    ) -> None:
        model = str(state.get("model", ""))
        self.metrics.requests.labels(endpoint, model, str(status)).inc()
        self.metrics.seconds.labels(endpoint).observe(seconds)
        event = log.debug if status < 400 else log.info
        event(
            "gateway.request",
            endpoint=endpoint,
            status=status,
            model=model,
            inputs=state.get("inputs"),
            ms=round(seconds * 1000, 2),
        )


async def _serve_fast(route: FastRoute[Any], body: Any, request: Request, send: Send) -> None:
    """``route``'s function on a body it parsed, with the answers of the app's exception
    handlers (an unexpected error is answered 500 and raised on to the server, as
    Starlette does)."""
    failure: Exception | None = None
    try:
        response: Response = await route.handle(body, request, await gateway_of(request))
    except ApiError as error:
        response = await _api_error(request, error)
    except Exception as error:  # noqa: BLE001 (answered, then raised on below)
        response, failure = await _failed(request, error), error
    await response(request.scope, request.receive, send)
    if failure is not None:
        raise failure


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole first, then waits as ``receive`` does (for
    the disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
