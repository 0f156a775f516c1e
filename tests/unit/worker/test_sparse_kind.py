"""The sparse kind's pure parts: reading a SparseEncoder folder (and refusing what kembed
does not run), keeping a text's weights as sentence-transformers does, and the wire
result's checks; the SDK's view of a result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from producer_sdk import SparseEmbeddings
from producer_sdk.options import SparseOptions, SubmitOptions
from schemas import (
    ErrorResult,
    Kind,
    SchemaError,
    SparseRequest,
    SparseResult,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from schemas.codec import _pack
from worker.encoder.folder import UnsupportedModelError
from worker.encoder.models import detect_kind
from worker.encoder.sparse_folder import read_sparse
from worker.kinds.sparse import encode_weights, sparsify

MLM = "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer"
SPLADE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"


def _folder(
    root: Path, types: list[str], pooling: dict[str, object] | None = None, **st: object
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    modules = [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_M", "type": t}
               for i, t in enumerate(types)]  # fmt: skip
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_M").mkdir(exist_ok=True)
    (root / "1_M" / "config.json").write_text(json.dumps(pooling or {}))
    config = {"model_type": "SparseEncoder", **st}
    (root / "config_sentence_transformers.json").write_text(json.dumps(config))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 96}))
    return root


def test_a_splade_folder_reads_as_sentence_transformers_saves_it(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path / "m",
        [MLM, SPLADE],
        {"pooling_strategy": "sum", "activation_function": "log1p_relu"},
        max_active_dims=128,
    )
    read = read_sparse(folder)
    assert (read.strategy, read.activation, read.max_active_dims, read.max_seq_length) == (
        "sum",
        "log1p_relu",
        128,
        96,
    )
    assert detect_kind(folder) == Kind.SPARSE


@pytest.mark.parametrize(
    ("types", "pooling", "message"),
    [
        (
            [MLM, "sentence_transformers.sparse_encoder.modules.SparseAutoEncoder"],
            None,
            "the sparse encoder module 'sentence_transformers.sparse_encoder.modules."
            "SparseAutoEncoder' is not supported",
        ),
        ([SPLADE, MLM], None, "modules SpladePooling -> MLMTransformer are not supported"),
        ([MLM], None, "modules MLMTransformer are not supported"),
        ([MLM, SPLADE], {"pooling_strategy": "mean"}, "SpladePooling 'mean' / 'relu'"),
        (
            ["sentence_transformers.base.modules.transformer.Transformer", SPLADE],
            None,
            "must be a masked LM (transformer_task fill-mask), not None",
        ),
    ],
)
def test_any_other_sparse_module_stack_is_refused_with_one_line(
    tmp_path: Path, types: list[str], pooling: dict[str, object] | None, message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=r"^m: ") as refused:
        read_sparse(_folder(tmp_path / "m", types, pooling))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_weights_are_kept_as_sentence_transformers_keeps_them() -> None:
    """Every positive weight, ids ascending; with top_k the largest that many, as
    sentence-transformers' max_active_dims keeps them (torch.topk on the dense row)."""
    import torch
    from sentence_transformers.util import select_max_active_dims

    rng = np.random.default_rng(3)
    rows = np.maximum(rng.normal(-1.0, 1.0, size=(5, 300)), 0).astype(np.float32)
    rows[2] = 0.0  # a text with no weight at all
    counts, ids, weights = sparsify(rows, None)
    assert counts == [int((row > 0).sum()) for row in rows]
    assert counts[2] == 0
    start = 0
    for row, count in zip(rows, counts, strict=True):
        kept = ids[start : start + count]
        assert np.array_equal(kept, np.flatnonzero(row > 0))
        assert np.array_equal(weights[start : start + count], row[kept])
        start += count
    counts, ids, weights = sparsify(rows, 7)
    expected = select_max_active_dims(torch.from_numpy(rows), max_active_dims=7).numpy()
    dense = np.zeros_like(rows)
    dense[np.repeat(np.arange(5), counts), ids] = weights
    assert np.array_equal(dense, expected)
    assert counts == [7, 7, 0, 7, 7]


def test_a_result_over_max_result_bytes_is_result_too_large() -> None:
    request = SparseRequest(id="r", inputs=("a", "b"))
    rows = np.ones((2, 1000), dtype=np.float32)
    fits = decode_result(encode_weights(request, rows, [3, 3], "m", None, 1 << 20))
    assert isinstance(fits, SparseResult)
    assert fits.counts == (1000, 1000)
    capped = decode_result(encode_weights(request, rows, [3, 3], "m", 10, 1 << 20))
    assert isinstance(capped, SparseResult)
    assert capped.counts == (10, 10)  # the model's max_active_dims
    too_large = decode_result(encode_weights(request, rows, [3, 3], "m", None, 4096))
    assert getattr(too_large, "error").code == "result_too_large"  # noqa: B009


def test_keys_and_docs_of_a_sparse_request_come_back_on_its_result_and_its_error() -> None:
    """A sparse request for a sink carries one key per input and meta["docs"]; the
    result, and a result_too_large error in its place, carry them back."""
    options = SubmitOptions("embed.ingest.sparse", {"source": "wiki"})
    request = options.sparse_request(
        ["a", "b"], SparseOptions(), 1000, None, ["doc-1", 2], [{"lang": "en"}, None]
    )
    decoded = decode_request(encode_request(request))
    assert isinstance(decoded, SparseRequest)
    assert decoded.keys == ("doc-1", 2)
    assert decoded.reply_to == "embed.ingest.sparse"
    assert dict(decoded.meta or {}) == {"source": "wiki", "docs": [{"lang": "en"}, {}]}
    rows = np.ones((2, 100), dtype=np.float32)
    result = decode_result(encode_weights(decoded, rows, [3, 3], "m", None, 1 << 20))
    assert isinstance(result, SparseResult)
    assert result.keys == ("doc-1", 2)
    assert dict(result.meta or {})["docs"] == [{"lang": "en"}, {}]
    error = decode_result(encode_weights(decoded, rows, [3, 3], "m", None, 256))
    assert isinstance(error, ErrorResult)
    assert error.keys == ("doc-1", 2)
    with pytest.raises(ValueError, match="keys"):
        options.sparse_request(["a", "b"], SparseOptions(), 1000, None, ["only-one"])


def _result(**fields: object) -> bytes:
    body: dict[str, object] = {
        "v": 1,
        "id": "r",
        "kind": "sparse",
        "model": "m",
        "vocab": 10,
        "counts": [2, 1],
        "indices": np.array([1, 4, 9], dtype="<u4").tobytes(),
        "values": np.array([0.5, 1.0, 2.0], dtype="<f4").tobytes(),
        "tokens": [3, 2],
    }
    body.update(fields)
    return _pack(body)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"counts": [2]}, "'counts' has 1 entries for 2 in 'tokens'"),
        ({"counts": [3, 1]}, "must hold 4 uint32 and 4 float32"),
        ({"indices": np.array([4, 1, 9], dtype="<u4").tobytes()}, "must ascend"),
        ({"indices": np.array([1, 4, 10], dtype="<u4").tobytes()}, "below 'vocab' 10"),
    ],
)
def test_a_malformed_sparse_result_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        decode_result(_result(**fields))


def test_the_sdk_reads_a_result_per_text_as_dicts_and_dense() -> None:
    result = decode_result(_result())
    assert isinstance(result, SparseResult)
    assert encode_result(result) == _result()
    weights = SparseEmbeddings.from_result(result)
    assert len(weights) == 2
    assert weights[1].indices.tolist() == [9]
    assert weights[-1].values.tolist() == [2.0]
    assert weights.as_dicts() == [{1: 0.5, 4: 1.0}, {9: 2.0}]
    dense = weights.to_dense()
    assert dense.shape == (2, 10)
    assert dense[0, 4] == 1.0
    assert float(dense.sum()) == 3.5
    with pytest.raises(IndexError):
        weights[2]
