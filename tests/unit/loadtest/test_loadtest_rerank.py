"""The rerank benchmark's model and workload (its measurements run in
tests/integration/test_rerank.py)."""

from __future__ import annotations

from pathlib import Path

from loadtest.rerank import build_minilm_reranker, markdown, workload
from worker.encoder.models import detect_kind, read_activation


def test_the_minilm_sized_reranker_is_a_one_label_cross_encoder(tmp_path: Path) -> None:
    from worker.encoder.cross_encoder import TorchCrossEncoder

    model_dir = build_minilm_reranker(tmp_path / "reranker", max_length=256)
    assert detect_kind(model_dir) == "rerank"
    assert read_activation(model_dir) == "sigmoid"
    encoder = TorchCrossEncoder(model_dir, "r", device="cpu", dtype="float32")
    assert (encoder.info.dim, encoder.info.max_seq_length) == (1, 256)
    # MiniLM-L6's size: 6 layers of 384 (about 22.7M parameters, 90 MB in fp32).
    assert 80 * 2**20 < encoder.info.memory_bytes < 100 * 2**20


def test_the_workload_has_the_requested_shape() -> None:
    work = workload(3, 100, 40)
    assert len(work) == 3
    assert all(len(documents) == 100 for _, documents in work)
    assert len({query for query, _ in work}) == 3
    assert len(set(work[0][1])) == 100
    words = [len(d.split()) for d in work[0][1]]
    assert 30 < sum(words) / len(words) < 80


def test_the_report_names_both_paths_and_the_ratio() -> None:
    report = {
        "requests": 2,
        "documents": 100,
        "pairs": 200,
        "dtype": "float32",
        "model": "m",
        "when": "now",
        "inprocess": {
            "seconds": 2.0,
            "tokens": 14000,
            "pairs_per_s": 100.0,
            "pairs_per_s_runs": [90.0, 100.0],
        },
        "kafka": {
            "seconds": 2.5,
            "pairs_per_s": 80.0,
            "errors": 0,
            "max_abs_score_difference": 0.0,
        },
        "kafka_over_inprocess": 0.8,
    }
    text = markdown(report, "python -m loadtest.rerank")
    assert "**0.80x**" in text
    assert "| in-process (tokenizer, batcher, encoder), faster of two runs | 2.00 | 100 |" in text
    assert "90, 100 pairs/s" in text
    assert "70 tokens per pair" in text
