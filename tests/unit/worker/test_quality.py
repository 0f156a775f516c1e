"""The quality gate's arithmetic: Spearman with ties, and the pass/fail rules; where its
default reference pairs come from."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

import worker
from loadtest.data import ROOT, load_stsb
from worker.quality import (
    PAIRS_FILE,
    GateThresholds,
    Pair,
    bundled_pairs_path,
    default_pairs_path,
    gate_pairs_path,
    judge,
    load_pairs,
    spearman,
)


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


# The default reference pairs ship with the package.


def test_default_pairs_are_package_data_equal_to_the_shared_stsb_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without KEMBED_STSB_DIR the gate reads STS-B test (English) from inside the worker
    package, and that copy holds the same pairs as the shared data set's file."""
    monkeypatch.delenv("KEMBED_STSB_DIR", raising=False)
    path = default_pairs_path()
    assert path == bundled_pairs_path()
    assert Path(str(path)).resolve().is_relative_to(Path(worker.__file__).resolve().parent)
    pairs = load_pairs(path)
    shared = load_stsb("en")
    assert len(pairs) == len(shared) == 1379
    assert [(p.first, p.second, p.score) for p in pairs] == [
        (p.first, p.second, p.score) for p in shared
    ]


def test_kembed_stsb_dir_and_a_configured_file_override_the_bundled_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / PAIRS_FILE).write_text('"a, b",c,1.5\nd,e,4\n', encoding="utf-8")
    mine = tmp_path / "mine.csv"
    mine.write_text("x,y,2\n", encoding="utf-8")
    monkeypatch.setenv("KEMBED_STSB_DIR", str(tmp_path))
    assert default_pairs_path() == tmp_path / PAIRS_FILE
    assert load_pairs(gate_pairs_path(None)) == [Pair("a, b", "c", 1.5), Pair("d", "e", 4.0)]
    assert load_pairs(gate_pairs_path(str(mine))) == [Pair("x", "y", 2.0)]
    monkeypatch.delenv("KEMBED_STSB_DIR")
    assert gate_pairs_path(None) == bundled_pairs_path()
    assert load_pairs(gate_pairs_path(mine), limit=1) == [Pair("x", "y", 2.0)]


def test_pyproject_declares_the_pairs_and_their_attribution_as_package_data() -> None:
    """A wheel carries worker/data: the package-data globs match both files."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["worker"]
    package = Path(worker.__file__).parent
    shipped = {str(f.relative_to(package)) for g in globs for f in package.glob(g)}
    assert {f"data/{PAIRS_FILE}", "data/README.md"} <= shipped
    assert "STS Benchmark" in (package / "data" / "README.md").read_text(encoding="utf-8")


def test_the_workers_gate_reads_the_bundled_pairs_unless_configured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """KEMBED_QUALITY_GATE=true: run_quality_gate judges the shipped pairs by default and
    the quality_gate_pairs file when set (the model part is replaced: pairs only)."""
    from worker import app
    from worker.settings import WorkerSettings

    judged: list[list[Pair]] = []

    def validate(settings: object, pairs: list[Pair], thresholds: object) -> None:
        judged.append(pairs)

    monkeypatch.delenv("KEMBED_STSB_DIR", raising=False)
    monkeypatch.setattr(app, "validate", validate)
    mine = tmp_path / "mine.csv"
    mine.write_text("x,y,2\n", encoding="utf-8")
    configs: list[dict[str, Any]] = [{}, {"quality_gate_pairs": str(mine)}]
    for options in configs:
        app.run_quality_gate(WorkerSettings(**options))
    assert judged[0] == load_pairs(bundled_pairs_path())
    assert len(judged[0]) == 1379
    assert judged[1] == [Pair("x", "y", 2.0)]
