"""The quality gate's arithmetic: Spearman with ties, and the pass/fail rules."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from worker.quality import GateThresholds, Pair, judge, spearman


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.floats(-5, 5, allow_nan=False)), min_size=3, max_size=60
    )
)
def test_spearman_matches_scipy_including_ties(rows: list[tuple[int, float]]) -> None:
    a = [float(x) for x, _ in rows]
    b = [y for _, y in rows]
    if len(set(a)) == 1 or len(set(b)) == 1:  # a constant column: no ranking to correlate
        assert spearman(a, b) == 0.0
    else:
        assert abs(spearman(a, b) - spearmanr(a, b).statistic) < 1e-9


def _unit(rows: np.ndarray) -> np.ndarray:
    unit: np.ndarray = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return unit


def _fixture(seed: int = 0) -> tuple[list[Pair], list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    sentences = [f"s{i}" for i in range(40)]
    vectors = _unit(rng.normal(size=(40, 16)))
    pairs = [
        Pair(sentences[i], sentences[i + 20], float(vectors[i] @ vectors[i + 20]))
        for i in range(20)
    ]
    return pairs, sentences, vectors


def test_identical_vectors_pass() -> None:
    pairs, sentences, vectors = _fixture()
    report = judge(pairs, sentences, vectors, vectors.copy(), GateThresholds())
    assert report.passed
    assert report.failures == []
    assert abs(report.reference_spearman - 100) < 1e-6
    assert report.mean_cosine > 0.9999


def test_drift_that_keeps_the_ranking_fails_on_cosine() -> None:
    """Vectors rotated far from fp32 in a way that keeps every pair's cosine (nf4's case:
    same Spearman, low cosine to the reference) fail the cosine rule only."""
    pairs, sentences, vectors = _fixture()
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(16, 16)))
    rotated = (vectors @ rotation).astype(np.float32)
    report = judge(pairs, sentences, vectors, rotated, GateThresholds())
    assert not report.passed
    assert abs(report.candidate_spearman - report.reference_spearman) < 1e-6
    assert [f.split(" ")[0] for f in report.failures] == ["mean"]


def test_ranking_damage_fails_on_spearman() -> None:
    pairs, sentences, vectors = _fixture()
    noisy = _unit(vectors + np.random.default_rng(2).normal(scale=0.6, size=vectors.shape))
    report = judge(pairs, sentences, vectors, noisy, GateThresholds(min_mean_cosine=-1.0))
    assert not report.passed
    assert report.failures[0].startswith("Spearman dropped")
