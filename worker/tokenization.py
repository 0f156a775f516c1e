"""Tokenize stage: texts to token ids with the model's fast (Rust) tokenizer.

``encode_batch`` releases the GIL and runs on several threads, so the pipeline calls
:meth:`TextTokenizer.encode` from a thread pool and the event loop keeps fetching and
publishing meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer, normalizers

from schemas import Token

__all__ = ["DIRECTIONS", "PRECUT_CHARS_PER_TOKEN", "TextTokenizer", "Tokenized"]

DIRECTIONS = ("right", "left")
PRECUT_CHARS_PER_TOKEN = 16
"""A text of more than this many characters per token of the model's maximum is cut
before it is tokenized (:meth:`TextTokenizer.encode`)."""
_PRECUT_MARGIN_TOKENS = 16
"""Tokens a cut text must still have beyond the window for its ids to be used."""


@dataclass(frozen=True, slots=True)
class Tokenized:
    ids: list[int]
    truncated: bool
    """True when the text was longer than the model's maximum and was cut."""
    segment: int | None = None
    """A pair's first-segment length (the query with its special tokens): the tokens after
    it have type id 1. For a single text of a model whose pooling leaves the prompt out:
    the prompt's leading tokens (``TextTokenizer.prompt_length``). None otherwise."""


class TextTokenizer:
    """Cuts over-long inputs at ``direction`` by default (``right`` keeps the beginning,
    ``left`` the end); :meth:`encode` may ask for the other end."""

    def __init__(self, tokenizer: Tokenizer, max_length: int, direction: str = "right") -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"truncation direction must be one of {DIRECTIONS}")
        padding = tokenizer.padding
        self.pad_id = int(padding["pad_id"]) if padding else 0
        self._tokenizers: dict[str, Tokenizer] = {}
        for side in DIRECTIONS:
            copy = Tokenizer.from_str(tokenizer.to_str())
            # The model's own limit, not tokenizer.json's (which often says 128 for 256-token
            # models); special tokens count, as in sentence-transformers.
            copy.enable_truncation(max_length=max_length, direction=side)
            copy.no_padding()
            self._tokenizers[side] = copy
        self.max_length = max_length
        self.direction = direction
        self._untruncated = Tokenizer.from_str(tokenizer.to_str())
        self._untruncated.no_truncation()
        self._untruncated.no_padding()
        # Pairs from their texts' encodings need "" to tokenize to nothing (the second
        # text is tokenized as the pair ("", text)); a tokenizer that makes tokens of ""
        # tokenizes every pair whole.
        empty = self._untruncated.encode("", add_special_tokens=False)
        self._pair_budget = max_length - self._untruncated.num_special_tokens_to_add(True)
        self._pairs_by_parts = not empty.ids and self._pair_budget >= 1
        self._prompt_lengths: dict[str, int] = {}

    @classmethod
    def from_model_dir(
        cls, model_dir: Path, max_length: int, direction: str = "right"
    ) -> TextTokenizer:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir} has no tokenizer.json (a fast tokenizer)")
        tokenizer = Tokenizer.from_file(str(path))
        if _lower_cases(model_dir):
            # sentence-transformers lower-cases before the tokenizer's own normalizer.
            current = tokenizer.normalizer
            rest = [] if current is None else [current]
            tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *rest])
        return cls(tokenizer, max_length, direction)

    def prompt_length(self, prompt: str) -> int:
        """How many leading tokens of ``prompt + text`` are the prompt's, as
        sentence-transformers counts them for a Pooling that leaves the prompt out: the
        prompt tokenized alone, special tokens included, less a special token at its end
        (0 for no prompt)."""
        if not prompt:
            return 0
        if prompt not in self._prompt_lengths:
            encoding = self._untruncated.encode(prompt, add_special_tokens=True)
            length = len(encoding.ids)
            if length and encoding.special_tokens_mask[-1]:
                length -= 1
            self._prompt_lengths[prompt] = min(length, self.max_length)
        return self._prompt_lengths[prompt]

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer (cutting at the default end): to copy, not to change."""
        return self._tokenizers[self.direction]

    @property
    def vocab_size(self) -> int:
        """Ids below this are the tokenizer's (added tokens included)."""
        return int(self._untruncated.get_vocab_size(with_added_tokens=True))

    def tokens(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[tuple[Token, ...]]:
        """Each text's tokens, not truncated, as TEI's ``/tokenize`` gives them: id, text,
        whether special, and a text token's ``[start, stop)`` UTF-8 byte offsets into the
        text (a special token: its own text, no offsets)."""
        encodings = self._untruncated.encode_batch(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [_tokens_of(text, enc) for text, enc in zip(texts, encodings, strict=True)]

    def decode(
        self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        """The text of each sequence of ids (every id below :attr:`vocab_size`)."""
        return list(
            self._untruncated.decode_batch(
                [list(ids) for ids in sequences], skip_special_tokens=skip_special_tokens
            )
        )

    def encode(self, texts: Sequence[str], direction: str | None = None) -> list[Tokenized]:
        """Each text's ids, cut to ``max_length`` at ``direction`` (the default: this
        tokenizer's).

        A text far longer than the model can use (over ``PRECUT_CHARS_PER_TOKEN`` characters
        per token of ``max_length``) is first cut at a whitespace near that many
        characters, at the end truncation cuts: its tokens beyond the window would be
        thrown away anyway, and a megabyte of text costs no more than a window's worth.
        Tokenizers split text into words at whitespace before anything else, so the words
        kept tokenize as they do in the whole text; a piece that comes out with no more
        than a few tokens over the window (long words) is tokenized whole after all, so
        the ids are the whole text's."""
        side = direction or self.direction
        tokenizer = self._tokenizers[side]
        limit = PRECUT_CHARS_PER_TOKEN * self.max_length
        pieces = [_precut(text, side, limit) for text in texts]
        # The fast variant skips the character offsets, which nothing here reads: ~15% less
        # CPU per text, the same ids and the same overflow.
        encodings = tokenizer.encode_batch_fast(pieces, add_special_tokens=True)
        short = [
            i
            for i, (enc, piece) in enumerate(zip(encodings, pieces, strict=True))
            if piece is not texts[i] and _overflow(enc) < _PRECUT_MARGIN_TOKENS
        ]
        if short:
            whole = tokenizer.encode_batch_fast([texts[i] for i in short], add_special_tokens=True)
            for i, enc in zip(short, whole, strict=True):
                encodings[i] = enc
        return [Tokenized(enc.ids, bool(enc.overflowing)) for enc in encodings]

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], direction: str | None = None
    ) -> list[Tokenized]:
        """(query, document) pairs tokenized as pairs (a cross-encoder's input), with the
        special tokens of the model's pair template. An over-long pair is cut longest-first
        (a token at a time off whichever text is longer) at ``direction``'s end of each
        text: the ids and type ids of Hugging Face's ``tokenizer(query, document,
        truncation=True)`` with that ``truncation_side``, as sentence-transformers'
        CrossEncoder tokenizes.

        Each distinct query is tokenized once, not once per document, and each text is cut
        to just over the pair's token budget before pairing: the cost is linear in the
        request's characters, whatever the query's length (see :class:`_PairCutter`)."""
        side = direction or self.direction
        if not self._pairs_by_parts:
            return self._encode_pairs_whole(pairs, side)
        cutter = _PairCutter(self._untruncated, self._tokenizers[side], side, self._pair_budget)
        return cutter.encode(pairs)

    def _encode_pairs_whole(self, pairs: Sequence[tuple[str, str]], side: str) -> list[Tokenized]:
        """Every pair tokenized whole (for a tokenizer that tokenizes an empty text to
        tokens, which :class:`_PairCutter` cannot use)."""
        # Not encode_batch_fast: without a post-processor (a pair template) it gives the
        # second text type 0, where encode_batch (and so Hugging Face) gives it type 1.
        encodings = self._tokenizers[side].encode_batch(list(pairs), add_special_tokens=True)
        return [_pair_piece(enc) for enc in encodings]


def _tokens_of(text: str, enc: Encoding) -> tuple[Token, ...]:
    """``enc``'s tokens with byte offsets into ``text`` (the tokenizer's are characters)."""
    starts: list[int] | None = None
    if not text.isascii():
        starts = [0]
        for char in text:
            starts.append(starts[-1] + len(char.encode("utf-8")))
    out: list[Token] = []
    for token_id, (start, stop), special, token in zip(
        enc.ids, enc.offsets, enc.special_tokens_mask, enc.tokens, strict=True
    ):
        if special:
            out.append((token_id, token, True, None, None))
        else:
            if starts is not None:
                start_byte, stop_byte = starts[start], starts[stop]
            else:
                start_byte, stop_byte = start, stop
            out.append((token_id, text[start:stop], False, start_byte, stop_byte))
    return tuple(out)


def _pair_piece(enc: Encoding) -> Tokenized:
    # Templates give the first text's tokens type 0 and the second's type 1 (models with
    # one token type: all 0, so the first segment is the whole pair).
    return Tokenized(enc.ids, bool(enc.overflowing), len(enc.ids) - sum(enc.type_ids))


class _PairCutter:
    """Pairs from their texts' tokens, each text tokenized once and cut before pairing.

    Hugging Face's ``tokenize(a, b)`` tokenizes both texts and then post-processes the two
    encodings: truncation (longest-first) and the pair template. Here the same
    post-processing (``Tokenizer.post_process``, Hugging Face's own) is applied to encodings
    made once per distinct text, so a query of 16k tokens is tokenized once rather than
    once per document. Longest-first keeps of each text a number of tokens that depends
    only on the two lengths, the budget (``max_length`` less the template's special
    tokens) and which text is longer; so a text over the budget is first cut (at
    ``side``, as truncation cuts) to ``budget + 1`` tokens, or ``budget + 2`` for a query
    longer than a document that is over the budget too: both still over the budget, in
    the same order. The pair then comes out token for token as it would have whole, and
    neither text drags thousands of tokens (and their overflow) through every pair."""

    def __init__(self, untruncated: Tokenizer, truncating: Tokenizer, side: str, budget: int):
        self._untruncated = untruncated
        self._truncating = truncating
        self._side = side
        self._budget = budget
        self._queries: dict[str, tuple[Encoding, Encoding | None, int]] = {}

    def encode(self, pairs: Sequence[tuple[str, str]]) -> list[Tokenized]:
        budget = self._budget
        # The document as Hugging Face tokenizes the second text of a pair (type id 1,
        # which a tokenizer without a template keeps): the pair ("", document).
        documents = self._untruncated.encode_batch(
            [("", document) for _, document in pairs], add_special_tokens=False
        )
        pieces = []
        for (query, _), document in zip(pairs, documents, strict=True):
            short, long_, length = self._query(query)
            first = short
            if len(document) > budget:
                if length > len(document) and long_ is not None:
                    first = long_
                _cut(document, budget + 1, self._side)
            enc = self._truncating.post_process(first, document, add_special_tokens=True)
            pieces.append(_pair_piece(enc))
        return pieces

    def _query(self, query: str) -> tuple[Encoding, Encoding | None, int]:
        """The query's encoding cut to ``budget + 1`` tokens, to ``budget + 2`` (None when
        it is not that long), and its whole length in tokens."""
        known = self._queries.get(query)
        if known is None:
            whole = self._untruncated.encode(query, add_special_tokens=False)
            length, budget = len(whole), self._budget
            long_ = None
            if length > budget + 1:
                _cut(whole, budget + 2, self._side)
                long_ = whole
                whole = Encoding.merge([long_], growing_offsets=False)  # a copy
                _cut(whole, budget + 1, self._side)
            known = (whole, long_, length)
            self._queries[query] = known
        return known


def _cut(encoding: Encoding, length: int, side: str) -> None:
    """Cut ``encoding`` to ``length`` tokens at ``side``, leaving it little overflow.

    ``truncate`` keeps what it cuts as overflowing pieces (and the pair template copies
    them into every pair); cutting once more, by one token, replaces them with that one
    token, so the encoding still tells that it was cut."""
    if len(encoding) > length + 1:
        encoding.truncate(length + 1, direction=side)
    if len(encoding) > length:
        encoding.truncate(length, direction=side)


def _precut(text: str, side: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters; else its first (``side``
    right) or last (left) ``limit`` characters or fewer, cut at whitespace: the piece
    ends just before a whitespace character (right), or starts with one (left). ``text``
    itself when no whitespace lies in the last quarter of that range (nowhere to cut
    between words)."""
    if len(text) <= limit:
        return text
    reach = max(1, limit // 4)
    if side == "right":
        for cut in range(limit, limit - reach, -1):
            if text[cut].isspace():
                return text[:cut]
        return text
    for cut in range(len(text) - limit, len(text) - limit + reach):
        if text[cut].isspace():
            return text[cut:]
    return text


def _overflow(encoding: Encoding) -> int:
    """Tokens truncation cut off ``encoding``."""
    return sum(len(part.ids) for part in encoding.overflowing)


def _lower_cases(model_dir: Path) -> bool:
    """Whether sentence-transformers lower-cases this model's inputs:
    ``sentence_bert_config.json`` ``do_lower_case``."""
    path = model_dir / "sentence_bert_config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    return isinstance(config, dict) and config.get("do_lower_case") is True
