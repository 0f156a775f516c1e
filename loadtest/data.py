"""Benchmark and test texts: STS-B sentences, and passages built from them."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StsPair", "load_stsb", "mixed_texts", "passages", "stsb_dir", "stsb_sentences"]


ROOT = Path(__file__).resolve().parents[1]


def stsb_dir() -> Path:
    """STS-B test, English and Chinese, for benchmarks and tests: the shared data folder
    beside the clone, or KEMBED_STSB_DIR. (The worker ships its own copy of the English
    split for the quality gate: ``worker.quality.bundled_pairs_path``.)"""
    return Path(os.environ.get("KEMBED_STSB_DIR", ROOT.parent / "shared" / "data" / "stsb"))


@dataclass(frozen=True)
class StsPair:
    first: str
    second: str
    score: float


def load_stsb(language: str = "en") -> list[StsPair]:
    with (stsb_dir() / f"stsb-{language}-test.csv").open(newline="", encoding="utf-8") as f:
        return [StsPair(a, b, float(score)) for a, b, score in csv.reader(f)]


def stsb_sentences(language: str = "en") -> list[str]:
    """The distinct sentences of the STS-B test split, in a stable order."""
    return sorted({s for pair in load_stsb(language) for s in (pair.first, pair.second)})


def passages(sentences: list[str], words: int = 150) -> list[str]:
    """Consecutive sentences joined into passages of about ``words`` words (~200 tokens)."""
    out: list[str] = []
    current: list[str] = []
    count = 0
    for sentence in sentences:
        current.append(sentence)
        count += len(sentence.split())
        if count >= words:
            out.append(" ".join(current))
            current, count = [], 0
    return out


def mixed_texts(sentences: list[str], count: int, long_every: int = 5) -> list[str]:
    """``count`` texts where every ``long_every``-th is a long passage, the rest sentences."""
    long = passages(sentences)
    return [
        long[i % len(long)] if i % long_every == 0 else sentences[i % len(sentences)]
        for i in range(count)
    ]
