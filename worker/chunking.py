"""Chunking: a request with ``chunking`` becomes a request for its inputs' chunk texts.

Each input is tokenized once with the model's own tokenizer (character offsets included)
and cut into windows of at most ``window`` tokens, ``window`` being ``max_tokens`` less the
model's special tokens and the prompt's (``schemas/README.md``, "Chunking"). A window that
does not reach the end of the text ends at the last sentence boundary in its last tenth,
else at the last whitespace there, else exactly at its end; always between two tokens.

A chunk's text, tokenized on its own (with the prompt), need not give the tokens it held
in the whole text: a word piece at its start becomes a word start and may split
differently. So every chunk is tokenized again as the encoder will see it, and one that
comes out over ``max_tokens`` is shortened by its excess (keeping the boundary
preference) until it fits. Chunk texts therefore never need truncation.

The pipeline then treats the chunk texts as inputs like any other (batching, the vector
cache, the encoder): :class:`ChunkedRequest` is the request for them, and :func:`pool`
puts the results back together per input, as the result reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from schemas import Chunking, EmbedRequest, ErrorCode, ErrorInfo
from schemas.v1 import Span

__all__ = [
    "ChunkedRequest",
    "Chunker",
    "ChunkingError",
    "expand",
    "expand_all",
    "input_index",
    "pool",
]

_SENTENCE_ENDS = frozenset(".!?")
# Full-width sentence ends (Chinese, Japanese): such text has no spaces between sentences,
# so a cut right after one of these is a sentence boundary without whitespace.
_FULL_WIDTH_ENDS = frozenset("\u3002\uff01\uff1f")  # ideographic full stop, full-width ! and ?
_LINE_BREAKS = frozenset("\n\r\u2028\u2029\x0b\x0c\x85")


class ChunkingError(Exception):
    """A request that cannot be chunked; ``error`` is its answer."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


class _TooCostlyError(ChunkingError):
    """One input's chunks would hold too many tokens (:meth:`Chunker.split`'s ``factor``)."""


def _invalid(message: str) -> ChunkingError:
    return ChunkingError(ErrorInfo(ErrorCode.INVALID_REQUEST, message))


@dataclass(frozen=True, slots=True)
class ChunkedRequest(EmbedRequest):
    """The request for a chunked request's chunk texts (``inputs``), in input order then
    chunk order; every other field (``keys``, ``meta``, ``chunk_pooling``, ...) is the
    original request's."""

    chunks: tuple[int, ...] = ()
    """Per original input, how many of ``inputs`` are its chunks."""
    spans: tuple[Span, ...] = ()
    """Per chunk, its ``[start, end)`` in its original input."""


class Chunker:
    """Cuts texts into token windows with one model's tokenizer (thread-safe)."""

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int) -> None:
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.max_seq_length = max_seq_length
        with_special = self._tokenizer.encode("", add_special_tokens=True)
        plain = self._tokenizer.encode("", add_special_tokens=False)
        self.special_tokens = len(with_special.ids) - len(plain.ids)

    def count(self, text: str) -> int:
        """Tokens of ``text`` as the encoder gets it (special tokens included)."""
        return len(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def window(self, chunking: Chunking, prompt: str = "") -> int:
        """Text tokens per chunk; ChunkingError (invalid_request) when the numbers leave
        no room for text or for progress past the overlap."""
        if chunking.max_tokens > self.max_seq_length:
            raise _invalid(
                f"'chunking.max_tokens' {chunking.max_tokens} exceeds the model's "
                f"max_seq_length {self.max_seq_length}"
            )
        prompt_tokens = len(self._tokenizer.encode(prompt, add_special_tokens=False).ids)
        window = chunking.max_tokens - self.special_tokens - prompt_tokens
        parts = f"max_tokens {chunking.max_tokens} - {self.special_tokens} special tokens"
        parts += f" - {prompt_tokens} prompt tokens" if prompt_tokens else ""
        if window < 1:
            raise _invalid(f"'chunking' leaves no room for text: {parts} = {window} tokens")
        if chunking.overlap_tokens >= window:
            raise _invalid(
                f"'chunking.overlap_tokens' {chunking.overlap_tokens} must be below the "
                f"window of {window} text tokens ({parts})"
            )
        return window

    def split(
        self,
        text: str,
        chunking: Chunking,
        prompt: str = "",
        limit: int | None = None,
        factor: float | None = None,
    ) -> list[Span]:
        """The spans of ``text``'s chunks; at most ``limit`` of them (ChunkingError
        too_many_inputs beyond), holding at most ``factor`` times the tokens of ``text``
        tokenized whole (ChunkingError invalid_request beyond), both checked on the plan,
        before any chunk is tokenized."""
        window = self.window(chunking, prompt)
        first, last = len(text) - len(text.lstrip()), len(text.rstrip())
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        if first >= last or not offsets:  # nothing but whitespace, or no tokens at all
            return [(0, len(text))] if first >= last else [(first, last)]
        cut = _Cut(text, offsets, first, last, chunking, prompt, window, limit)
        # Plan every window first and check them in one batch: a chunk rarely comes out
        # over the limit on its own; from the first that does, plan again checking each.
        planned = cut.windows(0, self, 1, check=False)
        if factor is not None:
            self._check_cost(planned, len(offsets), chunking.max_tokens - window, factor)
        texts = [prompt + text[start:end] for _, _, start, end in planned]
        encodings = self._tokenizer.encode_batch_fast(texts, add_special_tokens=True)
        over = (i for i, e in enumerate(encodings) if len(e.ids) > chunking.max_tokens)
        redo = next(over, None)
        if redo is not None:
            floor = planned[redo - 1][1] + 1 if redo else 1
            planned[redo:] = cut.windows(planned[redo][0], self, floor, check=True, before=redo)
        return [(start, end) for _, _, start, end in planned]

    @staticmethod
    def _check_cost(
        planned: Sequence[tuple[int, int, int, int]], tokens: int, overhead: int, factor: float
    ) -> None:
        """ChunkingError (invalid_request) when the planned chunks, each with ``overhead``
        special and prompt tokens, hold more than ``factor`` times the ``tokens`` of the
        text and one ``overhead``: what the text costs embedded whole."""
        whole = tokens + overhead
        total = sum(end - start for start, end, _, _ in planned) + overhead * len(planned)
        if total > factor * whole:
            raise _TooCostlyError(
                ErrorInfo(
                    ErrorCode.INVALID_REQUEST,
                    f"'chunking' would make {len(planned)} chunks of {total} tokens in all from "
                    f"a text of {whole} tokens, more than {factor:g} times as many "
                    "(max_chunk_tokens_factor): raise 'chunking.max_tokens' or lower "
                    "'chunking.overlap_tokens' (or the prompt)",
                )
            )


@dataclass(frozen=True, slots=True)
class _Cut:
    """One text's windows: ``offsets`` of its tokens, ``first``..``last`` its span without
    surrounding whitespace."""

    text: str
    offsets: Sequence[tuple[int, int]]
    first: int
    last: int
    chunking: Chunking
    prompt: str
    window: int
    limit: int | None

    def windows(
        self, start_token: int, chunker: Chunker, floor: int, *, check: bool, before: int = 0
    ) -> list[tuple[int, int, int, int]]:
        """(start token, end token, start, end) of each chunk from ``start_token`` on,
        each checked to fit on its own when ``check``; ``before`` chunks came earlier, the
        last of them ending before token ``floor``."""
        text, offsets, n = self.text, self.offsets, len(self.offsets)
        max_tokens, planned = self.chunking.max_tokens, []
        while True:
            end_token = min(n, start_token + self.window)
            if end_token < n:
                end_token = _boundary(text, offsets, floor, end_token, self.window)
            while True:  # shorten until the chunk, tokenized on its own, fits
                start = self.first if start_token == 0 else offsets[start_token][0]
                end = self.last if end_token == n else offsets[end_token - 1][1]
                excess = chunker.count(self.prompt + text[start:end]) - max_tokens if check else 0
                if excess <= 0:
                    break
                if end_token > floor:  # end earlier ...
                    shorter = max(floor, end_token - excess)
                    end_token = _boundary(text, offsets, floor, shorter, self.window)
                elif start_token < end_token - 1:  # ... else overlap less
                    start_token += 1
                else:
                    raise _invalid(
                        f"'chunking.max_tokens' {max_tokens} cannot hold the text at "
                        f"characters {start}..{end}, which alone makes "
                        f"{excess + max_tokens} tokens"
                    )
            planned.append((start_token, end_token, start, end))
            if self.limit is not None and before + len(planned) > self.limit:
                raise ChunkingError(
                    ErrorInfo(ErrorCode.TOO_MANY_INPUTS, f"more than {self.limit} chunks")
                )
            if end_token == n:
                return planned
            start_token = max(end_token - self.chunking.overlap_tokens, start_token + 1)
            floor = end_token + 1  # a chunk ends past the one before it


def _boundary(
    text: str, offsets: Sequence[tuple[int, int]], lowest: int, end: int, window: int
) -> int:
    """Where a chunk ending at token ``end`` at the latest (``end`` < all tokens), and at
    ``lowest`` at the earliest, should end: the last sentence boundary between two tokens
    in the window's last tenth (``.!?`` or a line break then whitespace, or a full-width
    sentence end: ideographic full stop, full-width exclamation or question mark), else
    the last whitespace there, else ``end``."""
    lowest = max(lowest, end - max(1, window // 10) + 1)
    spaced = None
    for cut in range(end, lowest - 1, -1):
        left, right = offsets[cut - 1][1], offsets[cut][0]
        gap = text[left:right]
        if text[left - 1] in _FULL_WIDTH_ENDS:
            return cut
        if not any(char.isspace() for char in gap):
            continue
        if text[left - 1] in _SENTENCE_ENDS or any(char in _LINE_BREAKS for char in gap):
            return cut
        if spaced is None:
            spaced = cut
    return end if spaced is None else spaced


def expand(
    request: EmbedRequest,
    chunker: Chunker,
    prompt: str,
    max_inputs: int,
    factor: float | None = None,
) -> ChunkedRequest:
    """The request for ``request``'s chunk texts (``request.chunking`` must be set);
    ChunkingError when it has bad numbers for this model, more than ``max_inputs``
    chunks in all, or an input whose chunks hold more than ``factor`` times its own
    tokens (the error's ``index`` names it)."""
    chunking = request.chunking
    if chunking is None:
        raise ValueError("expand() needs a request with chunking")
    texts: list[str] = []
    chunks: list[int] = []
    spans: list[Span] = []
    for index, text in enumerate(request.inputs):
        try:
            found = chunker.split(text, chunking, prompt, max_inputs - len(spans), factor)
        except _TooCostlyError as exc:
            raise ChunkingError(replace(exc.error, index=index)) from None
        except ChunkingError as exc:
            if exc.error.code != ErrorCode.TOO_MANY_INPUTS:
                raise
            raise ChunkingError(
                ErrorInfo(
                    ErrorCode.TOO_MANY_INPUTS,
                    f"the inputs make more than {max_inputs} chunks "
                    f"(max_client_batch_size {max_inputs})",
                )
            ) from None
        chunks.append(len(found))
        spans.extend(found)
        texts.extend(text[start:end] for start, end in found)
    same = {field.name: getattr(request, field.name) for field in fields(EmbedRequest)}
    same.update(inputs=tuple(texts), truncate=True, truncation_direction=None)
    return ChunkedRequest(**same, chunks=tuple(chunks), spans=tuple(spans))


def expand_all(
    work: Sequence[tuple[EmbedRequest, Chunker, str]],
    max_inputs: int,
    factor: float | None = None,
) -> list[ChunkedRequest | ErrorInfo]:
    """:func:`expand` for each (request, chunker, prompt); an error in place of each
    request that cannot be chunked."""
    expanded: list[ChunkedRequest | ErrorInfo] = []
    for request, chunker, prompt in work:
        try:
            expanded.append(expand(request, chunker, prompt, max_inputs, factor))
        except ChunkingError as exc:
            expanded.append(exc.error)
    return expanded


def input_index(request: EmbedRequest, index: int) -> int:
    """The original input that input ``index`` of ``request`` belongs to (itself unless
    ``request`` is a :class:`ChunkedRequest`, whose inputs are chunks)."""
    if not isinstance(request, ChunkedRequest):
        return index
    bounds = np.cumsum(request.chunks)
    return int(np.searchsorted(bounds, index, side="right"))


def pool(
    request: EmbedRequest, vectors: npt.NDArray[np.float32], tokens: Sequence[int]
) -> tuple[npt.NDArray[np.float32], list[int]]:
    """Finished vectors (``dimensions`` and ``normalize`` applied) and token counts of
    ``request``'s inputs, as the result reports them: per chunk, or with ``chunk_pooling``
    mean per original input (the mean of its chunks, re-normalized when ``normalize``;
    the sum of their tokens)."""
    if not isinstance(request, ChunkedRequest) or request.chunk_pooling != "mean":
        return vectors, list(tokens)
    starts = np.concatenate(([0], np.cumsum(request.chunks)[:-1]))
    sums = np.add.reduceat(vectors.astype(np.float64), starts, axis=0)
    means = sums / np.asarray(request.chunks, dtype=np.float64)[:, None]
    if request.normalize:
        means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    counts = np.add.reduceat(np.asarray(tokens, dtype=np.int64), starts)
    return np.ascontiguousarray(means, dtype="<f4"), [int(count) for count in counts]
