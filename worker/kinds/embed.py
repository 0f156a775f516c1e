"""The embed kind: texts (with the model's prompt, through the vector cache, chunked when
asked) become vectors (``worker.publish``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from schemas import EmbedRequest, Kind, Request
from worker.cache import Hit, VectorCache
from worker.chunking import input_index
from worker.encoder import Encoder, Prepared
from worker.kinds.base import Offload, Pieces
from worker.kinds.requests import input_count
from worker.publish import encode_vectors
from worker.served import ServedModel
from worker.tokenization import Tokenized

__all__ = ["EMBED", "EmbedKind"]


class EmbedKind:
    kind = Kind.EMBED
    input_name = "input"

    async def tokenize(
        self,
        model: ServedModel,
        requests: Sequence[Request],
        direction: str | None,
        cache: VectorCache,
        offload: Offload,
    ) -> list[Pieces]:
        texts = [
            model.prompt_for(request) + text
            for request in requests
            if isinstance(request, EmbedRequest)
            for text in request.inputs
        ]
        # Cached texts skip the tokenizer and the encoder.
        side = direction or model.tokenizer.direction
        lookup = cache.lookup(model.name, model.encoder.info, side, texts)
        misses = (
            await offload(
                partial(model.tokenizer.encode, lookup.misses, direction),
                sum(map(len, lookup.misses)),
            )
            if lookup.misses
            else []
        )
        pieces, filed = lookup.complete(misses)
        out: list[Pieces] = []
        start = 0
        for request in requests:
            count = input_count(request)
            out.append((pieces[start : start + count], filed[start : start + count]))
            start += count
        return out

    def segments(self, pieces: Sequence[Tokenized | Hit]) -> list[int] | None:
        return None

    def prepare(
        self, encoder: Encoder, ids: Sequence[Sequence[int]], segments: Callable[[], list[int]]
    ) -> Prepared:
        return encoder.prepare(ids)

    def result(
        self,
        model: ServedModel,
        request: Request,
        outputs: npt.NDArray[np.float32],
        tokens: list[int],
        max_bytes: int,
        requested_ms: int | None,
    ) -> bytes:
        assert isinstance(request, EmbedRequest)
        return encode_vectors(
            request, outputs, tokens, model.name, max_bytes, requested_ms=requested_ms
        )

    def error_index(self, request: Request, index: int) -> int:
        return input_index(request, index) if isinstance(request, EmbedRequest) else index


EMBED = EmbedKind()
