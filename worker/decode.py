"""Decode stage: a Kafka record becomes a request to compute, an error to answer, or a
dead letter.

Nothing here raises for bad input. A message is answered with an error result whenever it
names a request id (in the body, or in the ``kafka_correlationId`` header when the body is
unreadable); only messages nobody could correlate an answer with go to the dead-letter
topic, and so do messages whose reply topic the worker may not answer on
(``reply_forbidden``): an error result would be written to that very topic. An
interactive request naming an ingestion results topic (``ingest_topics``: a sink's input,
the bulk lane's alone) is answered there with an error result ``reply_forbidden``, its
inputs not computed.

Routing follows Spring's request/reply headers where the body is silent: the
``kafka_replyTopic`` and ``kafka_replyPartition`` headers fill a missing ``reply_to`` and
``reply_partition`` (the body wins where both are present).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from kembed_shared.ports import Record
from schemas import (
    DecodeRequest,
    EmbedRequest,
    ErrorCode,
    ErrorInfo,
    Kind,
    Request,
    RerankRequest,
    SchemaError,
    SparseRequest,
    TokenizeRequest,
    TokenizerRequest,
    decode_request,
)
from schemas.errors import Envelope
from schemas.headers import envelope_from_headers, fill_from_headers
from worker.kinds.requests import input_count, request_keys, request_kind, wrong_kind

__all__ = ["Accepted", "DeadLetter", "Limits", "ModelLimits", "Rejected", "decode_record"]


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What decoding needs to know of one served model."""

    name: str
    """The name it is served under (results' ``model``)."""
    dim: int
    prompt_names: Collection[str] = ()
    max_seq_length: int | None = None
    """Its longest input in tokens (the limit of ``chunking.max_tokens``); None: unchecked."""
    kind: Kind = Kind.EMBED
    """``embed`` (an embedding model) or ``rerank`` (a cross-encoder): the requests it
    answers."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int
    max_client_batch_size: int
    models: Mapping[str, ModelLimits]
    """Every name and alias a request may use, to its model; the first entry's model
    answers requests that name none, unless ``topic_models`` says otherwise."""
    topic_models: Mapping[str, str] = field(default_factory=dict)
    """Request topic -> the name of the model answering its requests that name none."""
    reply_allowed: Callable[[str], bool] = field(default=lambda topic: True)
    """Whether a request may name a topic as its reply topic (the worker's reply_topics,
    ingest_topics and results topic)."""
    ingest_topic: Callable[[str], bool] = field(default=lambda topic: False)
    """Whether a topic is an ingestion results topic (ingest_topics): a reply topic for
    requests of the bulk lane alone."""
    bulk_topics: frozenset[str] = frozenset()
    """The bulk lane's request topics."""
    max_input_chars: int | None = None
    """Most characters in a text (an unchunked input, a query, a document); None: any."""

    def model_for(self, requested: str | None, topic: str) -> ModelLimits | None:
        if requested is not None:
            return self.models.get(requested)
        name = self.topic_models.get(topic)
        if name is None:
            return next(iter(self.models.values()))
        return self.models[name]


@dataclass(frozen=True, slots=True)
class Accepted:
    request: Request
    model: str
    """The served name of the model that computes it."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """An error result to send to ``reply_to`` (None: the worker's results topic)."""

    request_id: str
    reply_to: str | None
    reply_partition: int | None
    error: ErrorInfo
    keys: tuple[str | int, ...] | None = None
    meta: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    code: ErrorCode
    message: str


Decoded = Accepted | Rejected | DeadLetter


def decode_record(record: Record, limits: Limits, now_ms: int) -> Decoded:
    headers = envelope_from_headers(record.headers)
    if record.value is None:
        error = SchemaError(ErrorCode.INVALID_REQUEST, "message has no value")
        return _answer(error, headers, limits)
    if len(record.value) > limits.max_request_bytes:
        error = SchemaError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {len(record.value)} bytes exceeds {limits.max_request_bytes}",
        )
        return _answer(error, headers, limits)
    try:
        request = decode_request(record.value)
    except SchemaError as exc:
        return _answer(exc, headers, limits)
    body = Envelope(request.id, request.reply_to, request.reply_partition)
    routing = fill_from_headers(body, headers)
    if routing != body:
        request = replace(
            request, reply_to=routing.reply_to, reply_partition=routing.reply_partition
        )
    if (forbidden := _forbidden(request.reply_to, limits)) is not None:
        return forbidden
    model = limits.model_for(request.model, record.topic)
    problem = _lane_problem(request.reply_to, record.topic, limits)
    problem = problem or _check(request, limits, model, now_ms)
    if problem is not None or model is None:
        return Rejected(
            request.id,
            request.reply_to,
            request.reply_partition,
            problem or _unknown_model(limits),
            request_keys(request),
            request.meta,
        )
    return Accepted(request, model.name)


def _forbidden(reply_to: str | None, limits: Limits) -> DeadLetter | None:
    if reply_to is None or limits.reply_allowed(reply_to):
        return None
    return DeadLetter(
        ErrorCode.REPLY_FORBIDDEN,
        f"reply topic {reply_to!r} is not allowed: it must match the worker's reply_topics",
    )


def _lane_problem(reply_to: str | None, topic: str, limits: Limits) -> ErrorInfo | None:
    """An interactive request that names an ingestion results topic (a sink's input) is
    refused: only the bulk lane writes there. The error result goes to that topic (the
    worker may write it, and the caller may be reading it); a sink dead-letters it, as it
    does every result not of the bulk lane."""
    if reply_to is None or topic in limits.bulk_topics or not limits.ingest_topic(reply_to):
        return None
    bulk = ", ".join(sorted(limits.bulk_topics)) or "none is served here"
    return ErrorInfo(
        ErrorCode.REPLY_FORBIDDEN,
        f"reply topic {reply_to!r} is an ingestion results topic (the worker's "
        f"ingest_topics): it takes results of the bulk lane only; send the request to a "
        f"bulk topic ({bulk})",
    )


def _unknown_model(limits: Limits) -> ErrorInfo:
    served = ", ".join(sorted(limits.models))
    return ErrorInfo(ErrorCode.UNKNOWN_MODEL, f"model not served here; served: {served}")


def _check(
    request: Request, limits: Limits, model: ModelLimits | None, now_ms: int
) -> ErrorInfo | None:
    count = input_count(request)
    if count > limits.max_client_batch_size:
        what = {"rerank": "documents", "decode": "sequences"}.get(request_kind(request), "inputs")
        return ErrorInfo(
            ErrorCode.TOO_MANY_INPUTS,
            f"{count} {what} exceed max_client_batch_size {limits.max_client_batch_size}",
        )
    if request.deadline_ms is not None and request.deadline_ms <= now_ms:
        return ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before computation")
    if limits.max_input_chars is not None:
        too_long = _too_many_chars(request, limits.max_input_chars)
        if too_long is not None:
            return too_long
    if model is None:
        return _unknown_model(limits)
    if isinstance(request, TokenizeRequest | DecodeRequest):
        return _check_tokenizer(request, model)  # any model's tokenizer answers these
    if request_kind(request) != model.kind:
        return wrong_kind(model.name, model.kind)
    if isinstance(request, RerankRequest):
        return None
    if isinstance(request, SparseRequest):
        return _check_prompt_name(request.prompt_name, model)
    return _check_embed(request, model)


def _check_tokenizer(request: TokenizerRequest, model: ModelLimits) -> ErrorInfo | None:
    if isinstance(request, TokenizeRequest):
        return _check_prompt_name(request.prompt_name, model)
    return None


def _too_many_chars(request: Request, limit: int) -> ErrorInfo | None:
    """``input_too_long`` for the first text over ``limit`` characters: an input of an
    embed request without chunking (chunks use all of a text), the query (no index) or a
    document of a rerank request."""
    if isinstance(request, RerankRequest):
        if len(request.query) > limit:
            return _chars_error("the query", len(request.query), limit, None)
        texts, what = request.documents, "document"
    elif isinstance(request, DecodeRequest):
        return None
    elif isinstance(request, TokenizeRequest | SparseRequest) or request.chunking is None:
        texts, what = request.inputs, "input"
    else:
        return None
    for index, text in enumerate(texts):
        if len(text) > limit:
            return _chars_error(f"the {what}", len(text), limit, index)
    return None


def _chars_error(what: str, length: int, limit: int, index: int | None) -> ErrorInfo:
    return ErrorInfo(
        ErrorCode.INPUT_TOO_LONG,
        f"{what} has {length} characters, above the worker's max_input_chars {limit} "
        "(a model uses only a text's first tokens; send less of it)",
        index,
    )


def _check_embed(request: EmbedRequest, model: ModelLimits) -> ErrorInfo | None:
    if request.dimensions is not None and request.dimensions > model.dim:
        return ErrorInfo(
            ErrorCode.INVALID_REQUEST, f"'dimensions' must be <= the model's {model.dim}"
        )
    chunking, longest = request.chunking, model.max_seq_length
    if chunking is not None and longest is not None and chunking.max_tokens > longest:
        return ErrorInfo(
            ErrorCode.INVALID_REQUEST,
            f"'chunking.max_tokens' {chunking.max_tokens} exceeds the model's "
            f"max_seq_length {longest}",
        )
    return _check_prompt_name(request.prompt_name, model)


def _check_prompt_name(prompt_name: str | None, model: ModelLimits) -> ErrorInfo | None:
    if prompt_name is not None and prompt_name not in model.prompt_names:
        known = ", ".join(sorted(model.prompt_names)) or "none"
        return ErrorInfo(
            ErrorCode.INVALID_REQUEST,
            f"unknown prompt_name for model {model.name}; its prompts: {known}",
        )
    return None


def _answer(error: SchemaError, headers: Envelope, limits: Limits) -> Rejected | DeadLetter:
    envelope = fill_from_headers(error.envelope, headers)
    if envelope.id is None:
        return DeadLetter(error.code, error.message)
    if (forbidden := _forbidden(envelope.reply_to, limits)) is not None:
        return forbidden
    info = ErrorInfo(error.code, error.message, error.index)
    return Rejected(envelope.id, envelope.reply_to, envelope.reply_partition, info)
