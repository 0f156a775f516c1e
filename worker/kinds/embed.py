"""The embed kind: texts (with the model's prompt, through the vector cache, chunked when
asked) become vectors (``worker.publish``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from schemas import EmbedRequest, Kind, ModelRequest
from worker.cache import Hit
from worker.chunking import input_index
from worker.encoder import Encoder, Prepared
from worker.kinds.base import Finished, ModelKind, Pieces, Tokenizing, per_request
from worker.publish import encode_vectors
from worker.tokenization import Tokenized

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
        pieces = per_request(requests, *lookup.complete(misses))
        if model.encoder.info.include_prompt:
            return pieces
        # The model pools without its prompt: each text notes how many leading tokens
        # are the prompt's (Tokenized.segment), for the batch's pool mask.
        length = model.tokenizer.prompt_length
        embeds = [r for r in requests if isinstance(r, EmbedRequest)]
        return [
            ([_pooled_from(p, length(model.prompt_for(r))) for p in found], notes)
            for r, (found, notes) in zip(embeds, pieces, strict=True)
        ]

    def segments(self, pieces: Sequence[Tokenized | Hit]) -> list[int] | None:
        """Per input, the prompt's tokens its pooling leaves out (None: the model pools
        them)."""
        skips = [p.segment for p in pieces if isinstance(p, Tokenized)]
        if not skips or skips[0] is None:
            return None
        return [p.segment or 0 if isinstance(p, Tokenized) else 0 for p in pieces]

    def prepare(
        self, encoder: Encoder, ids: Sequence[Sequence[int]], segments: Callable[[], list[int]]
    ) -> Prepared:
        if encoder.info.include_prompt:
            return encoder.prepare(ids)
        return encoder.prepare(ids, pooled_from=segments())

    def result(self, job: Finished, max_bytes: int) -> bytes:
        request, requested_ms = job.request, job.record.timestamp_ms
        assert isinstance(request, EmbedRequest)
        return encode_vectors(
            request, job.vectors, job.tokens, job.model.name, max_bytes, requested_ms=requested_ms
        )

    def error_index(self, request: ModelRequest, index: int) -> int:
        return input_index(request, index) if isinstance(request, EmbedRequest) else index


EMBED = EmbedKind()


def _pooled_from(piece: Tokenized | Hit, prompt_tokens: int) -> Tokenized | Hit:
    return replace(piece, segment=prompt_tokens) if isinstance(piece, Tokenized) else piece
