"""In-process baselines, measured in the same run as the end-to-end figures.

- the *in-process limit*: kembed's own tokenizer, batcher and encoder called directly (no
  Kafka), same model and precision as the worker, at the best ``max_batch_tokens`` found;
- sentence-transformers' default ``encode()`` (fp32, batch size 32), what a user would
  write without kembed;
- single-text latency in-process: tokenize and encode one text, the floor for ``embed()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.batcher import Batcher, Item
from worker.encoder import autotune
from worker.encoder.models import resolve_model_dir
from worker.encoder.torch_backend import TorchEncoder, resolve_compile, resolve_device
from worker.tokenization import TextTokenizer

__all__ = ["InProcess", "sentence_transformers_default"]


@dataclass(frozen=True)
class Throughput:
    texts: int
    tokens: int
    seconds: float

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class InProcess:
    def __init__(
        self, model: str, dtype: str, torch_compile: str = "auto", max_batch_tokens: int = 2048
    ) -> None:
        self.model_dir = resolve_model_dir(model)
        self.tuning: dict[str, Any] | None = None
        if "auto" in (dtype, torch_compile):
            # As the worker does: start from the safe variant, measure, keep the fastest.
            self.encoder = TorchEncoder(
                self.model_dir, model, dtype="float32" if dtype == "auto" else dtype
            )
            self.tokenizer = TextTokenizer.from_model_dir(
                self.model_dir, self.encoder.info.max_seq_length
            )
            self.tuning = self._tune(dtype, torch_compile, max_batch_tokens)
        else:
            compiled = resolve_compile(torch_compile, resolve_device("auto"))
            self.encoder = TorchEncoder(self.model_dir, model, dtype=dtype, compile=compiled)
            self.tokenizer = TextTokenizer.from_model_dir(
                self.model_dir, self.encoder.info.max_seq_length
            )
        # The first calls pay one-off set-up (and compilation, at both thread counts).
        self.encoder.encode([[101, 2023, 102]] * 64)
        self.encoder.encode([[101, 102]])

    def _tune(self, dtype: str, torch_compile: str, max_batch_tokens: int) -> dict[str, Any]:
        ids = [piece.ids for piece in self.tokenizer.encode(autotune.workload_texts())]
        result = autotune.tune(
            self.encoder,
            autotune.candidates(dtype, torch_compile, self.encoder.device.type),
            workload=autotune.tuning_workload(ids, max_batch_tokens, 256),
            reference_ids=[p.ids for p in self.tokenizer.encode(autotune.tuning_texts()[:48])],
            min_mean_cosine=0.99,
            budget_s=600,
            on_encoder=lambda fn: fn(),
        )
        return result.as_dict()

    def throughput(
        self, texts: list[str], max_batch_tokens: int, max_batch_size: int = 256
    ) -> Throughput:
        """Tokenize, batch (kembed's batcher) and encode ``texts``, timed end to end."""
        started = time.perf_counter()
        tokenized = self.tokenizer.encode(texts)
        batcher: Batcher[None] = Batcher(max_batch_tokens, max_batch_size)
        for index, piece in enumerate(tokenized):
            batcher.add(Item(None, index, piece.ids, 0.0))
        while len(batcher):
            self.encoder.encode([item.ids for item in batcher.next_batch()])
        seconds = time.perf_counter() - started
        return Throughput(len(texts), sum(len(t.ids) for t in tokenized), seconds)

    def single_latencies_ms(self, texts: list[str], count: int) -> list[float]:
        """Latency of tokenizing and encoding one text at a time."""
        latencies = []
        for i in range(count):
            started = time.perf_counter()
            pieces = self.tokenizer.encode([texts[i % len(texts)]])
            self.encoder.encode([pieces[0].ids])
            latencies.append((time.perf_counter() - started) * 1000)
        return latencies


def sentence_transformers_default(model_dir: Path, texts: list[str], tokens: int) -> Throughput:
    """sentence-transformers ``encode()`` with its defaults: fp32, batch size 32.
    ``tokens`` is the texts' token count, for a tokens/s figure comparable to the others."""
    from sentence_transformers import SentenceTransformer

    model: Any = SentenceTransformer(str(model_dir), device="cpu")
    model.encode(texts[:64])
    started = time.perf_counter()
    model.encode(texts, batch_size=32)
    return Throughput(len(texts), tokens, time.perf_counter() - started)
