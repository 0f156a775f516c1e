"""Unit tests of reranking in the worker: ordering, activations, model kinds, rerank results,
wrong-kind decoding, pair tokenization (against Hugging Face's tokenizer) and the torch
cross-encoder (against sentence-transformers' CrossEncoder)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kembed_shared.ports import Record
from schemas import (
    EmbedRequest,
    ErrorCode,
    ErrorResult,
    Kind,
    RerankRequest,
    RerankResult,
    decode_result,
    encode_request,
)
from tests.cross_encoder import build_cross_encoder
from tests.unit.worker.tokenizer_cost import peak_growth_mib
from worker.decode import Accepted, Limits, ModelLimits, Rejected, decode_record
from worker.encoder import Prepared
from worker.encoder.models import detect_kind, parse_activation, read_activation
from worker.kinds.rerank import (
    activate,
    encode_scores,
    order_by_score,
)
from worker.tokenization import TextTokenizer

MAX_LENGTH = 24
QUERY = "what is the tallest mountain in the alps and how high is it exactly"
DOCUMENTS = [
    "mont blanc is the highest mountain in the alps, rising 4,808 metres above sea level "
    "on the border of france and italy",
    "short",
    "the matterhorn",
    "berlin " * 30,
]


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "model", max_length=MAX_LENGTH)


# ---------------------------------------------------------------------- ordering


def test_order_is_by_score_descending_ties_lower_index_first() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9], dtype=np.float32)
    assert order_by_score(scores, None) == (1, 4, 0, 2, 3)


def test_top_n_cuts_the_order_and_a_larger_top_n_names_all() -> None:
    scores = np.array([0.2, 0.7, 0.4], dtype=np.float32)
    assert order_by_score(scores, 2) == (1, 2)
    assert order_by_score(scores, 1) == (1,)
    assert order_by_score(scores, 10) == (1, 2, 0)


def test_negative_and_equal_logits_order() -> None:
    scores = np.array([-3.0, -1.0, -1.0, 2.0], dtype=np.float32)
    assert order_by_score(scores, None) == (3, 1, 2, 0)


# ---------------------------------------------------------------------- activation


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, "sigmoid"),
        (
            {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}},
            "sigmoid",
        ),
        ({"sentence_transformers": {"activation_fn": "torch.nn.Sigmoid"}}, "sigmoid"),
        (
            {"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
            "identity",
        ),
        ({"sentence_transformers": {"activation_fn": "torch.nn.Identity"}}, "identity"),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "tanh"),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "identity"),
        ({"sentence_transformers": {"version": "4.0"}}, "sigmoid"),
    ],
)
def test_activation_is_read_like_sentence_transformers(
    config: dict[str, Any], expected: str
) -> None:
    assert parse_activation(config) == expected


@pytest.mark.parametrize(
    "path", ["torch.nn.modules.activation.Softmax", "my.module.Sigmoid", "Sigmoid", 3]
)
def test_an_unsupported_activation_is_an_error_naming_it(path: object) -> None:
    with pytest.raises(ValueError, match="unsupported reranker activation") as error:
        parse_activation({"sentence_transformers": {"activation_fn": path}})
    assert repr(path) in str(error.value)


def test_activations_compute_their_functions() -> None:
    logits = np.array([-2.0, 0.0, 1.5], dtype=np.float32)
    np.testing.assert_allclose(activate("sigmoid", logits), 1 / (1 + np.exp(-logits)), rtol=1e-6)
    np.testing.assert_array_equal(activate("identity", logits), logits)
    np.testing.assert_allclose(activate("tanh", logits), np.tanh(logits), rtol=1e-6)
    assert activate("sigmoid", logits).dtype == np.float32


def test_model_kind_from_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert detect_kind(tmp_path) == "embed"
    config = {"architectures": ["XLMRobertaForSequenceClassification"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert detect_kind(tmp_path) == "rerank"


# ---------------------------------------------------------------------- results


def _request(**fields: Any) -> RerankRequest:
    base: dict[str, Any] = {"id": "r1", "query": "q", "documents": ("a", "b", "c")}
    return RerankRequest(**(base | fields))


def _result(value: bytes) -> RerankResult:
    result = decode_result(value)
    assert isinstance(result, RerankResult), result
    return result


def test_result_applies_the_activation_orders_and_cuts() -> None:
    logits = np.array([[0.5], [2.0], [-1.0]], dtype=np.float32)
    request = _request(top_n=2, return_documents=True, meta={"trace": 7})
    result = _result(encode_scores(request, logits, [5, 6, 7], "ce", "sigmoid", 1 << 20, 123))
    expected = (1 / (1 + np.exp(-logits.reshape(-1).astype(np.float64)))).astype(np.float32)
    assert list(result.score_values()) == expected.tolist()
    assert result.order == (1, 0)
    assert result.documents == ("b", "a")
    assert result.tokens == (5, 6, 7)
    assert result.model == "ce"
    assert result.requested_ms == 123
    assert result.meta == {"trace": 7}


def test_raw_scores_are_the_logits_and_documents_are_left_out_by_default() -> None:
    logits = np.array([[0.25], [-0.5], [0.75]], dtype=np.float32)
    result = _result(
        encode_scores(_request(raw_scores=True), logits, [1, 1, 1], "ce", "sigmoid", 1 << 20)
    )
    assert list(result.score_values()) == [0.25, -0.5, 0.75]
    assert result.order == (2, 0, 1)
    assert result.documents is None
    assert result.requested_ms is None


def test_a_result_over_the_limit_is_result_too_large() -> None:
    logits = np.zeros((3, 1), dtype=np.float32)
    request = _request(documents=("x" * 500,) * 3, return_documents=True)
    result = decode_result(encode_scores(request, logits, [1, 1, 1], "ce", "sigmoid", 1000))
    assert isinstance(result, ErrorResult)
    assert result.error.code == ErrorCode.RESULT_TOO_LARGE


# ---------------------------------------------------------------------- decoding

_EMBED = ModelLimits("minilm", 384)
_RERANK = ModelLimits("ce", 1, kind=Kind.RERANK)
LIMITS = Limits(
    max_request_bytes=1 << 20, max_client_batch_size=4, models={"minilm": _EMBED, "ce": _RERANK}
)


def _decode(request: EmbedRequest | RerankRequest) -> object:
    record = Record(topic="embed.requests", partition=0, offset=1, value=encode_request(request))
    return decode_record(record, LIMITS, 1_700_000_000_000)


def test_a_rerank_request_to_a_reranker_is_accepted() -> None:
    request = _request(model="ce", top_n=1)
    decoded = _decode(request)
    assert isinstance(decoded, Accepted)
    assert decoded.request == request
    assert decoded.model == "ce"


def test_wrong_kind_both_ways_is_invalid_request_naming_the_kind() -> None:
    to_embedder = _decode(_request(model="minilm"))
    assert isinstance(to_embedder, Rejected)
    assert to_embedder.error.code == ErrorCode.INVALID_REQUEST
    assert "minilm" in to_embedder.error.message
    assert "kind embed" in to_embedder.error.message
    to_reranker = _decode(EmbedRequest(id="e1", inputs=("x",), model="ce"))
    assert isinstance(to_reranker, Rejected)
    assert to_reranker.error.code == ErrorCode.INVALID_REQUEST
    assert "model ce is a reranker (kind rerank)" in to_reranker.error.message


def test_more_documents_than_max_client_batch_size_is_too_many_inputs() -> None:
    decoded = _decode(_request(model="ce", documents=("d",) * 5, meta={"m": 1}))
    assert isinstance(decoded, Rejected)
    assert decoded.error.code == ErrorCode.TOO_MANY_INPUTS
    assert "5 documents" in decoded.error.message
    assert decoded.meta == {"m": 1}


# ---------------------------------------------------------------------- tokenization


def test_segments_become_token_types() -> None:
    prepared = Prepared.pad([[1, 2, 3, 4, 5], [6, 7, 8]], 0, [2, 3])
    assert prepared.types is not None
    assert prepared.types.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]]
    assert Prepared.pad([[1, 2]], 0).types is None


@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_tokenize_as_hugging_face_tokenizer_does(cross_encoder_dir: Path, side: str) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    hf.truncation_side = side
    tokenizer = TextTokenizer.from_model_dir(cross_encoder_dir, MAX_LENGTH)
    pieces = tokenizer.encode_pairs([(QUERY, d) for d in DOCUMENTS], side)
    truncated = []
    for piece, document in zip(pieces, DOCUMENTS, strict=True):
        expected = hf(QUERY, document, truncation=True)
        assert piece.ids == expected["input_ids"]
        types = Prepared.pad([piece.ids], 0, [piece.segment or 0]).types
        assert types is not None
        assert types[0].tolist() == expected["token_type_ids"]
        full = hf(QUERY, document, truncation=False)["input_ids"]
        truncated.append(piece.truncated)
        assert piece.truncated == (len(full) > MAX_LENGTH)
    assert any(truncated)
    assert not all(truncated)


def _words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["alps", "mont", "blanc", "unbelievable", "snow", "metres", ".", "tallest"]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


@pytest.mark.parametrize("max_length", [MAX_LENGTH, MAX_LENGTH - 1])
@pytest.mark.parametrize("side", ["right", "left"])
def test_long_pairs_tokenize_as_hugging_face_tokenizer_does(
    cross_encoder_dir: Path, side: str, max_length: int
) -> None:
    """Queries and documents of every length around the pair's token budget, and far over
    it (hundreds of tokens), with an even and an odd budget (where longest-first
    gives the extra token to the longer text): the ids, token types and truncation flag of
    Hugging Face's tokenizer(query, document, truncation=True)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    hf.truncation_side = side
    tokenizer = TextTokenizer.from_model_dir(cross_encoder_dir, max_length)
    lengths = [1, 9, 10, 11, 12, 20, 21, 22, 23, 400]
    queries = [_words(n, seed=n) for n in lengths]
    documents = [_words(n, seed=100 + n) for n in lengths]
    pairs = [(q, d) for q in queries for d in documents]
    pieces = tokenizer.encode_pairs(pairs, side)
    for piece, (query, document) in zip(pieces, pairs, strict=True):
        expected = hf(query, document, truncation=True, max_length=max_length)
        assert piece.ids == expected["input_ids"]
        types = Prepared.pad([piece.ids], 0, [piece.segment or 0]).types
        assert types is not None
        assert types[0].tolist() == expected["token_type_ids"]
        whole = hf(query, document, truncation=False)["input_ids"]
        assert piece.truncated == (len(whole) > max_length)


def test_a_long_query_is_tokenized_once_not_once_per_document() -> None:
    """A 64 KB query with 128 short documents: the tokenizer's peak memory stays within
    what one query and the windows take (tokenizing the query into every pair took about
    a quarter of a gigabyte, and the time to match)."""
    assert peak_growth_mib("pairs", chars=64 * 1024, n=128) < 64


def test_pairs_without_a_template_give_the_second_text_type_one() -> None:
    """A tokenizer with no pair template (no post-processor): the document's tokens still
    get type 1, as Hugging Face's tokenizer(query, document) gives them."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    raw = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[UNK]"))
    raw.pre_tokenizer = WhitespaceSplit()
    (piece,) = TextTokenizer(raw, max_length=16).encode_pairs([("a b", "c c c")])
    assert piece.ids == [1, 2, 3, 3, 3]
    assert piece.segment == 2
    assert raw.encode("a b", "c c c").type_ids == [0, 0, 1, 1, 1]


# ---------------------------------------------------------------------- encoder


def test_cross_encoder_scores_equal_sentence_transformers(cross_encoder_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    from worker.encoder.cross_encoder import TorchCrossEncoder

    encoder = TorchCrossEncoder(cross_encoder_dir, "ce", device="cpu", dtype="float32")
    assert (encoder.info.dim, encoder.info.pooling) == (1, "none")
    assert encoder.info.max_seq_length == MAX_LENGTH
    assert encoder.activation == "sigmoid"
    tokenizer = TextTokenizer.from_model_dir(cross_encoder_dir, encoder.info.max_seq_length)
    pieces = tokenizer.encode_pairs([(QUERY, d) for d in DOCUMENTS])
    logits = encoder.run(encoder.prepare([p.ids for p in pieces], [p.segment or 0 for p in pieces]))
    assert logits.shape == (len(DOCUMENTS), 1)
    assert logits.dtype == np.float32
    reference = CrossEncoder(str(cross_encoder_dir), device="cpu")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    np.testing.assert_allclose(
        activate("sigmoid", logits.reshape(-1)), reference.predict(pairs), atol=1e-5
    )
    import torch

    raw = reference.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(logits.reshape(-1), raw, atol=1e-5)
    # Token types matter: all-zero types (no segments) give other scores.
    zeros = encoder.run(encoder.prepare([p.ids for p in pieces]))
    assert np.abs(zeros - logits).max() > 1e-4


def test_more_than_one_label_is_a_load_error(tmp_path: Path) -> None:
    from worker.encoder.cross_encoder import TorchCrossEncoder

    model = build_cross_encoder(tmp_path / "two", num_labels=2, layers=1)
    with pytest.raises(ValueError, match="one label"):
        TorchCrossEncoder(model, "two", device="cpu", dtype="float32")


def test_an_unsupported_activation_in_the_config_is_a_load_error(tmp_path: Path) -> None:
    model = build_cross_encoder(
        tmp_path / "soft", activation="torch.nn.modules.activation.Softmax", layers=1
    )
    with pytest.raises(ValueError, match=r"torch\.nn\.modules\.activation\.Softmax"):
        read_activation(model)


def test_kembed_validate_skips_a_reranker(
    cross_encoder_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The STS-B gate judges embedding models: a reranker is skipped with a message, not
    judged by the cosines of its encoder's vectors."""
    from kembed_cli.main import main

    status = main(["validate", "--model", str(cross_encoder_dir), "--limit", "10"])
    assert status == 0
    assert "is a reranker (kind rerank)" in capsys.readouterr().err
