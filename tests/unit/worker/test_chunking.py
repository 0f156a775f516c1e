"""Unit tests for worker.chunking with the real bundled tokenizer (all-MiniLM-L6-v2):
spans, the token limit of every chunk on its own, boundary preference, overlap, invalid
numbers, expansion of requests and pooling of the results."""

from __future__ import annotations

import random
import string
from functools import cache
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from loadtest.data import stsb_sentences
from schemas import Chunking, EmbedRequest, ErrorCode, ErrorInfo
from schemas.v1 import Span
from worker.chunking import (
    ChunkedRequest,
    Chunker,
    ChunkingError,
    expand,
    expand_all,
    input_index,
    pool,
)
from worker.encoder.models import resolve_model_dir

MAX_SEQ = 256


@cache
def chunker() -> Chunker:
    path = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2") / "tokenizer.json"
    return Chunker(Tokenizer.from_file(str(path)), MAX_SEQ)


@cache
def offsets(text: str) -> list[tuple[int, int]]:
    return list(chunker()._tokenizer.encode(text, add_special_tokens=False).offsets)


@cache
def sentences() -> list[str]:
    return stsb_sentences("en")[:400] + stsb_sentences("zh")[:400]


def check_spans(
    text: str, spans: list[Span], chunking: Chunking, prompt: str = "", *, exact: bool = True
) -> None:
    """Every property the contract gives a text's chunks."""
    c = chunker()
    first, last = len(text) - len(text.lstrip()), len(text.rstrip())
    assert spans, "at least one chunk"
    assert all(0 <= start < end <= len(text) for start, end in spans)
    assert spans[0][0] == first
    assert spans[-1][1] == last
    for (start, end), (next_start, next_end) in pairwise(spans):
        assert start <= next_start
        assert end < next_end
        # Consecutive chunks overlap, or only text without tokens (whitespace) lies between.
        assert next_start <= end or not offsets(text[end:next_start].strip())
    for start, end in spans:
        assert c.count(prompt + text[start:end]) <= chunking.max_tokens, (start, end)
    # Overlap, in tokens of the whole text: the requested number, unless the chunk before
    # held fewer (a chunk always moves on by at least one token); less where a chunk had
    # to give up overlap to fit on its own (``exact`` False: texts where that may happen).
    tokens = offsets(text)
    inside = [
        {i for i, (s, e) in enumerate(tokens) if start <= s and e <= end} for start, end in spans
    ]
    for held, following in pairwise(inside):
        expected = min(chunking.overlap_tokens, len(held) - 1)
        assert len(held & following) == expected if exact else len(held & following) <= expected


# ---------------------------------------------------------------------------- properties


@st.composite
def long_texts(draw: st.DrawFn) -> str:
    """STS-B sentences (English and Chinese), long words, whitespace runs and line breaks."""
    parts = draw(
        st.lists(
            st.one_of(
                st.sampled_from(sentences()),
                st.text(alphabet=string.ascii_lowercase, min_size=15, max_size=80),
                st.text(min_size=1, max_size=30),
            ),
            min_size=1,
            max_size=40,
        )
    )
    separators = st.sampled_from([" ", "  ", "\n", "\n\n", "\t ", "", "      \n  "])
    text = "".join(part + draw(separators) for part in parts)
    return draw(st.sampled_from(["", " ", "\n "])) + text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_texts(), st.integers(min_value=4, max_value=MAX_SEQ), st.data())
def test_chunks_cover_the_text_fit_the_window_and_overlap(
    text: str, max_tokens: int, data: st.DataObject
) -> None:
    """For any text: spans increase, cover the text from its first to its last
    non-space character, overlap by the requested tokens, and every chunk tokenizes to at
    most max_tokens tokens on its own (special tokens included)."""
    window = max_tokens - chunker().special_tokens
    overlap = data.draw(st.integers(min_value=0, max_value=min(window - 1, max_tokens // 2)))
    chunking = Chunking(max_tokens, overlap)
    if not text.strip():
        assert chunker().split(text, chunking) == [(0, len(text))]
        return
    check_spans(text, chunker().split(text, chunking), chunking, exact=False)


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=400), st.integers(min_value=12, max_value=40))
def test_any_unicode_text_is_chunked_within_the_limit(text: str, max_tokens: int) -> None:
    """Arbitrary code points (control characters, emoji, combining marks) still give
    chunks that fit, covering the text."""
    chunking = Chunking(max_tokens, max_tokens // 4)
    spans = chunker().split(text, chunking)
    assert all(chunker().count(text[s:e]) <= max_tokens for s, e in spans)
    if text.strip():
        check_spans(text, spans, chunking, exact=False)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_a_tiny_window_refuses_only_a_piece_too_long_on_its_own(text: str) -> None:
    """With one text token per chunk, a word piece that alone tokenizes to more (``TF``
    in ``0TF`` is one piece, ``t ##f`` alone) cannot be held: invalid_request, saying so."""
    try:
        spans = chunker().split(text, Chunking(3))
    except ChunkingError as exc:
        error = exc.error
    else:
        assert all(chunker().count(text[s:e]) <= 3 for s, e in spans)
        return
    assert error.code == ErrorCode.INVALID_REQUEST
    where = error.message.split("cannot hold the text at characters ")[1].split(",")[0]
    start, end = map(int, where.split(".."))
    assert chunker().count(text[start:end]) > 3


def test_a_piece_too_long_on_its_own_is_refused() -> None:
    with pytest.raises(ChunkingError, match=r"cannot hold the text at characters 1\.\.3"):
        chunker().split("0TF", Chunking(3))


def test_long_stsb_documents_with_a_prompt() -> None:
    """Documents of 2,000 STS-B sentences (English, Chinese), chunked with a prompt: the
    prompt's tokens count against every chunk."""
    for language in ("en", "zh"):
        text = " ".join(stsb_sentences(language)[:2000])
        chunking = Chunking(64, 8)
        spans = chunker().split(text, chunking, prompt="query: ")
        assert len(spans) > 20
        check_spans(text, spans, chunking, prompt="query: ")
        assert max(chunker().count("query: " + text[s:e]) for s, e in spans) >= 60


def test_chunks_that_retokenize_longer_are_shortened() -> None:
    """Cutting inside a word makes the next chunk start with a word piece, which on its
    own may make more tokens: such chunks are shortened until they fit. (Without the
    check, some of these texts give chunks over the limit.)"""
    rng = random.Random(7)
    c = chunker()
    naive_over = 0
    for _ in range(200):
        text = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(20, 200)))
        chunking = Chunking(rng.randint(4, 20), rng.randint(0, 1))
        tokens = offsets(text)
        window = c.window(chunking)
        # What a chunker without the check would do: windows of exactly `window` tokens.
        naive = range(0, len(tokens), window - chunking.overlap_tokens)
        naive_over += any(
            c.count(text[tokens[i][0] : tokens[min(i + window, len(tokens)) - 1][1]])
            > chunking.max_tokens
            for i in naive
        )
        check_spans(text, c.split(text, chunking), chunking, exact=False)
    assert naive_over >= 10


# ---------------------------------------------------------------------------- boundaries


def words(count: int, word: str = "word") -> str:
    return " ".join([word] * count)


def test_text_within_the_window_is_one_chunk_without_outer_whitespace() -> None:
    text = "  Hello there.\n"
    assert chunker().split(text, Chunking(8)) == [(2, 14)]
    whole = words(30)
    assert chunker().split(whole, Chunking(32)) == [(0, len(whole))]
    assert len(chunker().split(whole, Chunking(31))) == 2


def test_whitespace_only_text_is_one_chunk() -> None:
    assert chunker().split(" \n\t ", Chunking(8)) == [(0, 4)]


def test_cut_prefers_a_sentence_end_within_the_last_tenth() -> None:
    """Window 100 text tokens: a sentence ending at token 93 (in the last tenth) ends the
    first chunk; one ending at token 85 (before the last tenth) does not."""
    inside = words(92) + ". " + words(200)
    spans = chunker().split(inside, Chunking(102))
    assert inside[: spans[0][1]].endswith("word.")
    assert spans[1][0] == spans[0][1] + 1
    outside = words(84) + ". " + words(200)
    spans = chunker().split(outside, Chunking(102))
    assert len(offsets(outside[: spans[0][1]])) == 100


def test_line_break_is_a_sentence_boundary_and_beats_a_later_space() -> None:
    text = words(94) + "\n" + words(200)
    (first, *_) = chunker().split(text, Chunking(102))
    assert text[first[1]] == "\n"
    assert len(offsets(text[: first[1]])) == 94


def test_without_a_sentence_end_the_cut_is_at_whitespace() -> None:
    """'don't' is three tokens (don ' t): a window ending inside it ends before it."""
    text = " ".join(["don't"] * 100)
    spans = chunker().split(text, Chunking(32))
    assert all(text[start:end].endswith("don't") for start, end in spans)
    assert all(text[start:end].startswith("don") for start, end in spans)


def test_a_full_width_sentence_end_is_a_boundary_without_whitespace() -> None:
    """Chinese has no spaces: a chunk ends right after a 。 in its last tenth."""
    text = "\u4e2d" * 95 + "\u3002" + "\u6587" * 200  # 中...。文...: one token a character
    (first, *_) = chunker().split(text, Chunking(102))
    assert text[: first[1]].endswith("\u3002")
    assert chunker().count(text[: first[1]]) == 98  # 96 characters + [CLS] + [SEP]
    early = "\u4e2d" * 80 + "\u3002" + "\u6587" * 200  # before the last tenth: ignored
    (first, *_) = chunker().split(early, Chunking(102))
    assert chunker().count(early[: first[1]]) == 102


def test_without_whitespace_the_cut_is_exactly_at_the_window() -> None:
    # Chinese: one token per character, no spaces (and no sentence ends, which would win)
    text = "".join(sentences()[400:420]).translate(dict.fromkeys(map(ord, "\u3002\uff01\uff1f")))
    spans = chunker().split(text, Chunking(22))
    full = [chunker().count(text[s:e]) for s, e in spans[:-1]]
    assert len(full) > 5
    assert all(count == 22 for count in full)


# ---------------------------------------------------------------------------- invalid numbers


@pytest.mark.parametrize(
    ("chunking", "prompt", "words"),
    [
        pytest.param(Chunking(257), "", "exceeds the model's max_seq_length 256", id="too long"),
        pytest.param(Chunking(2), "", "no room for text", id="only special tokens"),
        pytest.param(Chunking(4), "query: ", "2 prompt tokens = 0 tokens", id="prompt fills it"),
        pytest.param(Chunking(4, 2), "", "below the window of 2 text tokens", id="overlap"),
        pytest.param(Chunking(16, 8), "a b c d e f", "window of 8", id="overlap with prompt"),
    ],
)
def test_impossible_windows_are_invalid_request(
    chunking: Chunking, prompt: str, words: str
) -> None:
    with pytest.raises(ChunkingError) as caught:
        chunker().split("some text", chunking, prompt)
    assert caught.value.error.code == ErrorCode.INVALID_REQUEST
    assert words in caught.value.error.message


# ---------------------------------------------------------------------------- requests


def test_expand_gives_chunk_texts_in_input_order() -> None:
    texts = (words(50), "short", "  " + words(20, "other") + " ")
    request = EmbedRequest(
        id="r", inputs=texts, keys=("a", "b", "c"), truncate=False, chunking=Chunking(20, 3)
    )
    expanded = expand(request, chunker(), "", max_inputs=100)
    assert isinstance(expanded, ChunkedRequest)
    assert expanded.chunks[1] == 1
    assert sum(expanded.chunks) == len(expanded.inputs) == len(expanded.spans)
    assert expanded.keys == request.keys
    assert expanded.truncate  # chunk texts fit: truncation does not apply
    i = 0
    for text, count in zip(texts, expanded.chunks, strict=True):
        for start, end in expanded.spans[i : i + count]:
            assert expanded.inputs[i] == text[start:end]
            i += 1
    assert [input_index(expanded, i) for i in range(len(expanded.inputs))] == [
        k for k, count in enumerate(expanded.chunks) for _ in range(count)
    ]
    assert input_index(request, 2) == 2


def test_too_many_chunks_is_too_many_inputs() -> None:
    request = EmbedRequest(id="r", inputs=(words(100), words(100)), chunking=Chunking(12))
    assert sum(expand(request, chunker(), "", max_inputs=100).chunks) == 20
    with pytest.raises(ChunkingError) as caught:
        expand(request, chunker(), "", max_inputs=19)
    assert caught.value.error.code == ErrorCode.TOO_MANY_INPUTS
    assert "more than 19 chunks" in caught.value.error.message


def test_chunks_holding_many_times_the_text_are_invalid_request_naming_the_input() -> None:
    """Windows of 2 text tokens under 6 of prompt and special tokens, a token apart: each
    chunk of 8 tokens brings 1 new, so a text of 100 tokens would make about 800 tokens of
    chunks: invalid_request at that input, before any chunk is tokenized; the same text
    in windows that cost less than max_chunk_tokens_factor times it is chunked."""
    prompt, text = "a b c d", words(100)
    costly = EmbedRequest(id="r", inputs=("short", text), chunking=Chunking(8, 1))
    with pytest.raises(ChunkingError) as caught:
        expand(costly, chunker(), prompt, max_inputs=512, factor=4)
    assert caught.value.error.code == ErrorCode.INVALID_REQUEST
    assert caught.value.error.index == 1
    assert "max_chunk_tokens_factor" in caught.value.error.message
    assert "from a text of 106 tokens" in caught.value.error.message
    (answer,) = expand_all([(costly, chunker(), prompt)], 512, factor=4)
    assert isinstance(answer, ErrorInfo)
    assert answer.index == 1
    fine = EmbedRequest(id="r", inputs=("short", text), chunking=Chunking(32, 8))
    assert isinstance(expand(fine, chunker(), prompt, max_inputs=512, factor=4), ChunkedRequest)


def test_expand_all_answers_each_request() -> None:
    good = EmbedRequest(id="a", inputs=("x y",), chunking=Chunking(8))
    bad = EmbedRequest(id="b", inputs=("x y",), chunking=Chunking(3, 1))
    done = expand_all([(good, chunker(), ""), (bad, chunker(), "")], 10)
    assert isinstance(done[0], ChunkedRequest)
    assert isinstance(done[1], ErrorInfo)
    assert done[1].code == ErrorCode.INVALID_REQUEST


def _chunked(pooling: str, normalize: bool = True) -> ChunkedRequest:
    return ChunkedRequest(
        id="r",
        inputs=("a", "b", "c"),
        normalize=normalize,
        chunking=Chunking(8),
        chunk_pooling=pooling,
        chunks=(2, 1),
        spans=((0, 1), (1, 2), (0, 1)),
    )


def test_mean_pooling_renormalizes_and_sums_tokens() -> None:
    rows = np.array([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    vectors, tokens = pool(_chunked("mean"), rows, [5, 4, 3])
    assert tokens == [9, 3]
    expected = np.array([[0.3, 0.9], [1.0, 0.0]]) / np.array([[np.sqrt(0.9)], [1.0]])
    np.testing.assert_allclose(vectors, expected, rtol=1e-6)
    assert vectors.dtype == np.float32
    raw, _ = pool(_chunked("mean", normalize=False), rows * 2, [5, 4, 3])
    np.testing.assert_allclose(raw, [[0.6, 1.8], [2.0, 0.0]], rtol=1e-6)


def test_pooling_none_keeps_the_chunk_rows() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    vectors, tokens = pool(_chunked("none"), rows, [5, 4, 3])
    assert vectors is rows
    assert tokens == [5, 4, 3]
