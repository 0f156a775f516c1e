"""The quality gate: does a precision or quantization still rank like fp32?

A reference set of sentence pairs with gold similarity scores (default: the STS Benchmark
test split, English) is embedded twice: with the configured model, dtype, quantization and
compilation (the *candidate*) and with the same model in fp32, eager and unquantized (the
*reference*). The report gives Spearman x100 of cosine similarity against the gold scores
for both, and the mean and minimum cosine between each sentence's two vectors. It passes
when the Spearman drop is at most ``max_spearman_drop`` and the mean cosine at least
``min_mean_cosine``: the first catches ranking damage, the second drift that happens to
keep this benchmark's ranking (nf4 on the bundled model keeps Spearman but not cosine).

``kembed validate`` prints the report; with ``KEMBED_QUALITY_GATE=true`` a worker runs it
before joining its group and refuses to start when it fails.

The default pairs ship with the package (``worker/data/stsb-en-test.csv``, read through
``importlib.resources``; attribution in ``worker/data/README.md``): nothing outside the
installed package is read unless ``KEMBED_STSB_DIR``, ``quality_gate_pairs`` or
``--pairs`` names it.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "GateThresholds",
    "PAIRS_FILE",
    "QualityReport",
    "bundled_pairs_path",
    "default_pairs_path",
    "gate_pairs_path",
    "judge",
    "judge_embedders",
    "load_pairs",
    "spearman",
    "validate",
]

PAIRS_FILE = "stsb-en-test.csv"
"""The default reference pairs' file name: in the package's data, or in KEMBED_STSB_DIR."""


@dataclass(frozen=True, slots=True)
class GateThresholds:
    max_spearman_drop: float = 0.5
    min_mean_cosine: float = 0.99


@dataclass(frozen=True, slots=True)
class Pair:
    first: str
    second: str
    score: float


@dataclass(slots=True)
class QualityReport:
    pairs: int
    reference_spearman: float
    candidate_spearman: float
    mean_cosine: float
    min_cosine: float
    thresholds: GateThresholds
    passed: bool
    failures: list[str]
    candidate: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] | None = None
    """dtype/torch_compile auto: the candidates measured and the one chosen."""
    pairs_source: str = ""
    """Where the reference pairs were read from (``kembed validate`` fills it in)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        return (
            f"{self.pairs} pairs; Spearman x100 {self.candidate_spearman:.2f} (candidate) vs "
            f"{self.reference_spearman:.2f} (fp32 reference); cosine to reference mean "
            f"{self.mean_cosine:.4f}, min {self.min_cosine:.4f}: {verdict}"
        )


def bundled_pairs_path() -> Traversable:
    """STS-B test, English, as shipped in the package (``worker/data``)."""
    return files("worker") / "data" / PAIRS_FILE


def default_pairs_path() -> Traversable:
    """The gate's default reference pairs: ``stsb-en-test.csv`` in ``KEMBED_STSB_DIR`` when
    that is set, else the copy shipped in the package."""
    folder = os.environ.get("KEMBED_STSB_DIR")
    return Path(folder) / PAIRS_FILE if folder else bundled_pairs_path()


def gate_pairs_path(configured: str | Path | None) -> Traversable:
    """The pairs a gate reads: ``configured`` (``--pairs`` or quality_gate_pairs) if given,
    else :func:`default_pairs_path`."""
    return Path(configured) if configured else default_pairs_path()


def load_pairs(path: Traversable, limit: int | None = None) -> list[Pair]:
    """CSV rows ``text1,text2,score`` (no header), as the STS-B files are. ``path`` is a
    file, or a package resource (read as bytes: a resource may live in a zip)."""
    text = path.read_bytes().decode("utf-8")
    rows = csv.reader(io.StringIO(text, newline=""))
    pairs = [Pair(row[0], row[1], float(row[2])) for row in rows if row]
    return pairs[:limit] if limit else pairs


def spearman(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / denominator if denominator else 0.0


def _ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    # Tied values share the average of their ranks.
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    averaged: npt.NDArray[np.float64] = sums[inverse] / counts[inverse]
    return averaged


def judge(
    pairs: Sequence[Pair],
    sentences: Sequence[str],
    reference: npt.NDArray[np.float32],
    candidate: npt.NDArray[np.float32],
    thresholds: GateThresholds,
) -> QualityReport:
    """Compare two sets of L2-normalized sentence vectors (rows follow ``sentences``)."""
    row = {s: i for i, s in enumerate(sentences)}
    first = [row[p.first] for p in pairs]
    second = [row[p.second] for p in pairs]
    gold = [p.score for p in pairs]

    def score(vectors: npt.NDArray[np.float32]) -> float:
        return 100 * spearman(np.sum(vectors[first] * vectors[second], axis=1), gold)

    cosine = np.sum(reference * candidate, axis=1)
    ref_score, cand_score = score(reference), score(candidate)
    failures = []
    if ref_score - cand_score > thresholds.max_spearman_drop:
        failures.append(
            f"Spearman dropped {ref_score - cand_score:.2f} > {thresholds.max_spearman_drop}"
        )
    if float(cosine.mean()) < thresholds.min_mean_cosine:
        failures.append(f"mean cosine {cosine.mean():.4f} < {thresholds.min_mean_cosine}")
    return QualityReport(
        pairs=len(pairs),
        reference_spearman=ref_score,
        candidate_spearman=cand_score,
        mean_cosine=float(cosine.mean()),
        min_cosine=float(cosine.min()),
        thresholds=thresholds,
        passed=not failures,
        failures=failures,
    )


def judge_embedders(
    pairs: Sequence[Pair],
    reference: Callable[[list[str]], npt.NDArray[np.float32]],
    candidate: Callable[[list[str]], npt.NDArray[np.float32]],
    thresholds: GateThresholds,
) -> QualityReport:
    """The gate for two embedding functions (texts -> unnormalized vectors)."""
    sentences = sorted({s for p in pairs for s in (p.first, p.second)})
    expected, actual = _normalized(reference(sentences)), _normalized(candidate(sentences))
    return judge(pairs, sentences, expected, actual, thresholds)


def _normalized(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = vectors / np.maximum(norms, 1e-12)
    return out


def validate(
    settings: Any, pairs: Sequence[Pair], thresholds: GateThresholds, batch: int = 64
) -> QualityReport:
    """Embed ``pairs`` with the configured encoder and the fp32 reference, and judge.

    ``settings`` is a WorkerSettings (model, device, dtype, quantization, torch_compile,
    max_seq_length, torch_threads).
    """
    from worker.encoder.models import resolve_model_dir
    from worker.encoder.torch_backend import TorchEncoder, resolve_compile, resolve_device
    from worker.tokenization import TextTokenizer

    model_dir = resolve_model_dir(settings.model)
    sentences = sorted({s for p in pairs for s in (p.first, p.second)})
    probe = TextTokenizer.from_model_dir(model_dir, 512)
    # The same pooling on both sides: the gate judges precision, not a pooling choice.
    common = {
        "pad_id": probe.pad_id,
        "threads": settings.torch_threads,
        "pooling": settings.pooling,
    }
    device = resolve_device(settings.device)
    tune = settings.quantization == "none" and "auto" in (settings.dtype, settings.torch_compile)
    candidate = TorchEncoder(
        model_dir,
        settings.served_name(),
        device=settings.device,
        # auto: measured below, from the worker's safe start
        dtype="float32" if tune and settings.dtype == "auto" else settings.dtype,
        max_seq_length=settings.max_seq_length,
        compile=False if tune else resolve_compile(settings.torch_compile, device),
        quantization=settings.quantization,
        **common,
    )
    tuning = _tune(settings, candidate, probe) if tune else None
    reference = TorchEncoder(
        model_dir,
        "reference",
        device="cpu",
        dtype="float32",
        max_seq_length=candidate.info.max_seq_length,
        **common,
    )
    tokenizer = TextTokenizer.from_model_dir(model_dir, candidate.info.max_seq_length)
    ids = [piece.ids for piece in tokenizer.encode(sentences)]
    # Length-sorted batches, as the worker runs them (and much faster than random order).
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))

    def embed(encoder: Any) -> npt.NDArray[np.float32]:
        out = np.empty((len(ids), encoder.info.dim), dtype=np.float32)
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            out[rows] = encoder.encode([ids[i] for i in rows])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        normalized: npt.NDArray[np.float32] = out / np.maximum(norms, 1e-12)
        return normalized

    report = judge(pairs, sentences, embed(reference), embed(candidate), thresholds)
    report.candidate = _describe(candidate.info)
    report.reference = _describe(reference.info)
    report.tuning = tuning
    return report


def _tune(settings: Any, encoder: Any, probe: Any) -> dict[str, Any]:
    """What ``auto`` picks on this machine, as a worker would measure it; the table."""
    from worker.encoder import autotune

    tokenizer = probe.__class__.from_model_dir(encoder.info.path, encoder.info.max_seq_length)
    ids = [piece.ids for piece in tokenizer.encode(autotune.workload_texts())]
    options = autotune.candidates(
        settings.dtype, settings.torch_compile, encoder.device.type, bf16_supported=True
    )
    result = autotune.tune(
        encoder,
        options,
        workload=autotune.tuning_workload(ids, settings.max_batch_tokens, settings.max_batch_size),
        reference_ids=[p.ids for p in tokenizer.encode(autotune.tuning_texts()[:48])],
        min_mean_cosine=settings.quality_min_mean_cosine,
        budget_s=settings.tune_budget_s,
        on_encoder=lambda fn: fn(),
    )
    return result.as_dict()


def _describe(info: Any) -> dict[str, Any]:
    return {
        "model": info.name,
        "dtype": info.dtype,
        "device": info.device,
        "quantization": info.quantization,
        "compiled": info.compiled,
        "memory_bytes": info.memory_bytes,
    }
