"""What every model kind implements (see :mod:`worker.kinds`), with the defaults most kinds
share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kembed_shared.ports import Record
from schemas import Kind, ModelRequest
from worker.cache import CacheNote, Hit, VectorCache
from worker.encoder import Encoder, Prepared
from worker.kinds.requests import input_count
from worker.served import ServedModel
from worker.tokenization import Tokenized

__all__ = ["Finished", "ModelKind", "Offload", "Pieces", "Tokenizing", "per_request"]

_T = TypeVar("_T")


class Offload(Protocol):
    """Runs ``work`` (tokenizing ``chars`` characters) on the event loop when it is short,
    on the tokenizer thread otherwise."""

    def __call__(self, work: Callable[[], _T], chars: int) -> Awaitable[_T]: ...


Pieces = tuple[list[Tokenized | Hit], list[CacheNote]]
"""One request's inputs, tokenized (or found in the vector cache), and per input how the
cache files its vector once encoded (empty: not cached)."""


def per_request(
    requests: Sequence[ModelRequest],
    pieces: list[Tokenized | Hit],
    filed: list[CacheNote] | None = None,
) -> list[Pieces]:
    """The inputs of ``requests``, tokenized in one call (``pieces``, and ``filed``: how the
    cache files each; None: not cached), cut back into each request's, in order."""
    out: list[Pieces] = []
    start = 0
    for request in requests:
        end = start + input_count(request)
        out.append((pieces[start:end], [] if filed is None else filed[start:end]))
        start = end
    return out


@dataclass(frozen=True, slots=True)
class Tokenizing:
    """What one tokenizer call runs with."""

    model: ServedModel
    direction: str | None
    """The truncation side the requests ask for (None: the model's)."""
    cache: VectorCache
    offload: Offload


class Finished(Protocol):
    """A request whose inputs are all encoded, as the pipeline holds it (its ``Job``)."""

    record: Record
    request: ModelRequest
    model: ServedModel
    vectors: npt.NDArray[np.float32]
    """The encoder's rows, one per input."""
    tokens: list[int]


class ModelKind(ABC):
    """What one kind of model does with its requests and results. A kind implements
    ``tokenize`` and ``result``; the other methods' defaults fit a kind of single texts."""

    kind: Kind
    input_name: str
    """What one input is, in errors: ``input``, ``(query, document) pair``."""

    @abstractmethod
    async def tokenize(self, requests: Sequence[ModelRequest], call: Tokenizing) -> list[Pieces]:
        """``requests`` (of ``call.model``, one truncation side) tokenized in one call, per
        request in order."""

    def segments(self, pieces: Sequence[Tokenized | Hit]) -> list[int] | None:
        """Per input, its first segment's length (token types), for kinds of pairs; None
        (the default): inputs of one segment."""
        return None

    def prepare(
        self, encoder: Encoder, ids: Sequence[Sequence[int]], segments: Callable[[], list[int]]
    ) -> Prepared:
        """A batch of ``ids`` for the encoder (``segments``: the inputs' segment lengths, which
        the default, for inputs of one segment, does not ask for)."""
        return encoder.prepare(ids)

    @abstractmethod
    def result(self, job: Finished, max_bytes: int) -> bytes:
        """The result message of ``job``, whose inputs are all encoded (a
        ``result_too_large`` error result if it would exceed ``max_bytes``)."""

    def error_index(self, request: ModelRequest, index: int) -> int:
        """The index a failed input's error names (a chunk's: its input's); by default, the
        input's own."""
        return index
