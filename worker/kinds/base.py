"""The protocol every model kind implements (see :mod:`worker.kinds`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from schemas import Kind, Request
from worker.cache import CacheNote, Hit, VectorCache
from worker.encoder import Encoder, Prepared
from worker.served import ServedModel
from worker.tokenization import Tokenized

__all__ = ["ModelKind", "Offload", "Pieces"]

_T = TypeVar("_T")


class Offload(Protocol):
    """Runs ``work`` (tokenizing ``chars`` characters) on the event loop when it is short,
    on the tokenizer thread otherwise."""

    def __call__(self, work: Callable[[], _T], chars: int) -> Awaitable[_T]: ...


Pieces = tuple[list[Tokenized | Hit], list[CacheNote]]
"""One request's inputs, tokenized (or found in the vector cache), and per input how the
cache files its vector once encoded (empty: not cached)."""


class ModelKind(Protocol):
    """What one kind of model does with its requests and results."""

    kind: Kind
    input_name: str
    """What one input is, in errors: ``input``, ``(query, document) pair``."""

    async def tokenize(
        self,
        model: ServedModel,
        requests: Sequence[Request],
        direction: str | None,
        cache: VectorCache,
        offload: Offload,
    ) -> list[Pieces]:
        """``requests`` (of ``model``, one truncation side) tokenized in one call, per
        request in order."""
        ...

    def segments(self, pieces: Sequence[Tokenized | Hit]) -> list[int] | None:
        """Per input, its first segment's length (token types), for kinds of pairs."""
        ...

    def prepare(
        self, encoder: Encoder, ids: Sequence[Sequence[int]], segments: Callable[[], list[int]]
    ) -> Prepared:
        """A batch of ``ids`` for the encoder (``segments``: the inputs' segment lengths)."""
        ...

    def result(
        self,
        model: ServedModel,
        request: Request,
        outputs: npt.NDArray[np.float32],
        tokens: list[int],
        max_bytes: int,
        requested_ms: int | None,
    ) -> bytes:
        """The result message of a request whose inputs are all encoded (``outputs``: the
        encoder's rows, one per input)."""
        ...

    def error_index(self, request: Request, index: int) -> int:
        """The index a failed input's error names (a chunk's: its input's)."""
        ...
