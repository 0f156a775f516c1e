"""A benchmark instrument: the real worker with an encoder that costs nothing.

    python -m loadtest.ceiling_worker        (settings from KEMBED_* variables, as the worker)

Everything but the model is the production worker: Kafka fetch, decoding, tokenization with
the model's real tokenizer, batching, result encoding, publishing and commits. The encoder
is :class:`FixedEncoder`, which pads each batch as a real encoder does and returns fixed
vectors at once, so the process measures how fast the host side can feed a device that is
never the bottleneck (``python -m loadtest.ceiling``). It is injected through
``worker.app.run_worker``'s ``load`` argument; no setting of the production worker
(``kembed worker``) can select it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from worker.encoder import ModelInfo, Prepared
from worker.served import ServedModel
from worker.settings import ModelSpec, WorkerSettings
from worker.tokenization import TextTokenizer

__all__ = ["FixedEncoder", "load_stand_in", "main"]

# all-MiniLM-L6-v2's output size and sequence limit: the stand-in answers like the model
# whose tokenizer it uses.
DIM = 384
MAX_SEQ_LENGTH = 256


class FixedEncoder:
    """Satisfies ``worker.encoder.Encoder``: pads like the torch encoder (that part of the
    work stays on the host whatever the device), then returns the same unit vector for
    every row without computing anything."""

    def __init__(self, info: ModelInfo, pad_id: int = 0) -> None:
        self.info = info
        self._pad_id = pad_id
        row = np.arange(1, info.dim + 1, dtype=np.float32)
        self._rows = np.tile(row / np.linalg.norm(row), (1, 1))

    def prepare(
        self,
        batch: Sequence[Sequence[int]],
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        return Prepared.pad(batch, self._pad_id, segments, pooled_from)

    def run(self, prepared: Prepared) -> npt.NDArray[np.float32]:
        rows = prepared.rows
        if self._rows.shape[0] < rows:
            self._rows = np.tile(self._rows[:1], (rows, 1))
        return self._rows[:rows]

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        return self.run(self.prepare(batch))


def load_stand_in(settings: WorkerSettings, spec: ModelSpec) -> ServedModel:
    """A ``worker.app.ModelLoader``: the configured model's real tokenizer (and prompts)
    with a :class:`FixedEncoder` in place of the model."""
    from worker.encoder.models import read_prompts, resolve_model_dir

    model_dir = resolve_model_dir(spec.model)
    tokenizer = TextTokenizer.from_model_dir(
        model_dir, MAX_SEQ_LENGTH, settings.truncation_direction
    )
    info = ModelInfo(
        name=spec.served_name(),
        path=Path(model_dir),
        dim=DIM,
        max_seq_length=MAX_SEQ_LENGTH,
        pooling="mean",
        dtype="stand-in",
        device="none",
    )
    prompts, default = read_prompts(model_dir)
    requests_topic, bulk_topic = settings.topics_of(spec)
    return ServedModel(
        name=spec.served_name(),
        encoder=FixedEncoder(info, tokenizer.pad_id),
        tokenizer=tokenizer,
        aliases=frozenset(spec.aliases),
        prompts=prompts,
        default_prompt_name=default,
        requests_topic=requests_topic,
        bulk_topic=bulk_topic,
    )


def main() -> int:
    from kembed_shared.observability.logging import configure_logging
    from worker.app import run_worker

    settings = WorkerSettings.model_validate({})  # KEMBED_* variables, as the worker reads them
    configure_logging(settings.log_level, settings.log_format)
    asyncio.run(run_worker(settings, load=load_stand_in))
    return 0


if __name__ == "__main__":
    sys.exit(main())
