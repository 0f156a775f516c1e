"""The embed kind: texts (with the model's prompt, through the vector cache, chunked when
asked) become vectors (``worker.publish``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from schemas import EmbedRequest, Kind, ModelRequest
from worker.chunking import input_index
from worker.kinds.base import Finished, ModelKind, Pieces, Tokenizing, per_request
from worker.publish import encode_vectors

__all__ = ["EMBED", "EmbedKind"]


class EmbedKind(ModelKind):
    kind = Kind.EMBED
    input_name = "input"

    async def tokenize(self, requests: Sequence[ModelRequest], call: Tokenizing) -> list[Pieces]:
        model, direction = call.model, call.direction
        texts = [
            model.prompt_for(request) + text
            for request in requests
            if isinstance(request, EmbedRequest)
            for text in request.inputs
        ]
        # Cached texts skip the tokenizer and the encoder.
        side = direction or model.tokenizer.direction
        lookup = call.cache.lookup(model.name, model.encoder.info, side, texts)
        misses = (
            await call.offload(
                partial(model.tokenizer.encode, lookup.misses, direction),
                sum(map(len, lookup.misses)),
            )
            if lookup.misses
            else []
        )
        return per_request(requests, *lookup.complete(misses))

    def result(self, job: Finished, max_bytes: int) -> bytes:
        request, requested_ms = job.request, job.record.timestamp_ms
        assert isinstance(request, EmbedRequest)
        return encode_vectors(
            request, job.vectors, job.tokens, job.model.name, max_bytes, requested_ms=requested_ms
        )

    def error_index(self, request: ModelRequest, index: int) -> int:
        return input_index(request, index) if isinstance(request, EmbedRequest) else index


EMBED = EmbedKind()
