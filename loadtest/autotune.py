"""``python -m loadtest.autotune``: every dtype x compile candidate in-process, and the one
``auto`` chooses, in the same run.

Each candidate is built as the worker builds it (a compiled one through the tuner's own
path), warmed with one pass, then timed over STS-B sentences cut by kembed's batcher at
``max_batch_tokens``; its best of ``--passes`` counts. Then a fresh encoder runs the tuner
(on the bundled texts, as a worker does at start-up) and the variant it installs is timed
the same way. Target: the chosen variant's throughput >= 0.95x the best candidate's.
Nothing is asserted; the figures are printed (and written as JSON with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from loadtest.data import stsb_sentences
from worker.batcher import Batcher, Item
from worker.encoder import autotune
from worker.encoder.models import resolve_model_dir
from worker.encoder.torch_backend import TorchEncoder
from worker.tokenization import TextTokenizer

TARGET = 0.95


def _throughput(encoder: TorchEncoder, ids: list[list[int]], budget: int, passes: int) -> float:
    best = 0.0
    for _ in range(passes):
        started = time.perf_counter()
        batcher: Batcher[None] = Batcher(budget, 256)
        for index, seq in enumerate(ids):
            batcher.add(Item(None, index, seq, 0.0))
        while len(batcher):
            encoder.encode([item.ids for item in batcher.next_batch()])
        best = max(best, len(ids) / (time.perf_counter() - started))
    return best


def _built(model_dir: Path, pad_id: int, candidate: autotune.Candidate) -> TorchEncoder:
    encoder = TorchEncoder(model_dir, "bench", dtype=candidate.dtype, pad_id=pad_id)
    if candidate.compiled:
        variant = encoder.variant(encoder.current.dtype, compiled=True)
        encoder.pin_threads(True)
        autotune._compile(encoder, variant)
        encoder.pin_threads(False)
        encoder.install(variant)
    return encoder


def run(texts: int, budget: int, passes: int, dtype: str, torch_compile: str) -> dict[str, Any]:
    model_dir = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    tokenizer = TextTokenizer.from_model_dir(model_dir, 256)
    sentences = stsb_sentences()[:texts]
    ids = [piece.ids for piece in tokenizer.encode(sentences)]
    rows: list[dict[str, Any]] = []
    for candidate in autotune.candidates(dtype, torch_compile, "cpu"):
        begun = time.monotonic()
        encoder = _built(model_dir, tokenizer.pad_id, candidate)
        build_s = time.monotonic() - begun
        _throughput(encoder, ids, budget, 1)  # warm: first sight of each shape
        speed = _throughput(encoder, ids, budget, passes)
        rows.append({"candidate": candidate.name, "texts_per_s": speed, "build_s": build_s})
        print(f"{candidate.name:<18} {speed:8.1f} texts/s  (built in {build_s:.1f} s)", flush=True)
        del encoder
    begun = time.monotonic()
    encoder = TorchEncoder(model_dir, "auto", dtype="float32", pad_id=tokenizer.pad_id)
    workload_ids = [piece.ids for piece in tokenizer.encode(autotune.workload_texts())]
    tuned = autotune.tune(
        encoder,
        autotune.candidates(dtype, torch_compile, "cpu"),
        workload=autotune.tuning_workload(workload_ids, budget, 256),
        reference_ids=[p.ids for p in tokenizer.encode(autotune.tuning_texts()[:48])],
        min_mean_cosine=0.99,
        budget_s=600,
        on_encoder=lambda fn: fn(),
    )
    tune_s = time.monotonic() - begun
    _throughput(encoder, ids, budget, 1)
    chosen_speed = _throughput(encoder, ids, budget, passes)
    best = max(rows, key=lambda row: row["texts_per_s"])
    ratio = chosen_speed / best["texts_per_s"]
    print(
        f"auto chose {tuned.chosen.name if tuned.chosen else None} in {tune_s:.1f} s: "
        f"{chosen_speed:.1f} texts/s = {ratio:.2f}x the best candidate "
        f"({best['candidate']}, {best['texts_per_s']:.1f}); target >= {TARGET}",
        flush=True,
    )
    return {
        "texts": len(sentences),
        "max_batch_tokens": budget,
        "passes": passes,
        "candidates": rows,
        "auto": {
            "chosen": tuned.chosen.name if tuned.chosen else None,
            "tuning_s": tune_s,
            "texts_per_s": chosen_speed,
            "table": tuned.as_dict()["table"],
        },
        "best": best["candidate"],
        "chosen_over_best": ratio,
        "target_met": ratio >= TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2758, help="STS-B sentences per pass")
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--passes", type=int, default=2, help="timed passes; the best counts")
    parser.add_argument("--dtype", default="auto", help="auto, or one dtype to fix")
    parser.add_argument("--torch-compile", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    report = run(args.texts, args.max_batch_tokens, args.passes, args.dtype, args.torch_compile)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
