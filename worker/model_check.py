"""``kembed models check DIR``: prove a model folder before serving it.

The folder is loaded twice, by kembed (the worker's encoder and tokenizer, fp32 on the
CPU, eager) and by sentence-transformers (``SentenceTransformer(dir)``, fp32 on the CPU),
and both embed the same shipped texts (``worker/data/check_texts.json``: short, long,
several scripts, code, emoji, plus one built to run past the model's window) in one
mixed-length batch, once per prompt the model names (and once with none, or with its
default prompt). Each text's cosine between the two is reported; the check passes when
every one is at least :data:`THRESHOLD`. A folder kembed refuses
(:class:`worker.encoder.folder.UnsupportedModelError`) fails before anything runs.

sentence-transformers is the reference, so it must be installed
(``pip install 'kembed[check]'``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from worker.encoder.models import read_prompts
from worker.tokenization import TextTokenizer

__all__ = [
    "THRESHOLD",
    "CheckReport",
    "ReferenceMissingError",
    "TextCheck",
    "check_model",
    "check_texts",
]

THRESHOLD = 0.9999
"""The least cosine, per text, between kembed's vector and sentence-transformers' (fp32)."""


@dataclass(frozen=True, slots=True)
class TextCheck:
    label: str
    prompt: str | None
    """The prompt name the text was embedded with (None: none, or the model's default)."""
    tokens: int
    """Tokens kembed fed the model (after truncation to the window)."""
    cosine: float

    @property
    def passed(self) -> bool:
        return self.cosine >= THRESHOLD


@dataclass(frozen=True, slots=True)
class CheckReport:
    model: str
    dim: int
    max_seq_length: int
    pooling: str
    texts: tuple[TextCheck, ...]

    @property
    def passed(self) -> bool:
        return all(text.passed for text in self.texts)

    @property
    def worst(self) -> TextCheck:
        return min(self.texts, key=lambda text: text.cosine)

    def as_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "dim": self.dim,
            "max_seq_length": self.max_seq_length,
            "pooling": self.pooling,
            "threshold": THRESHOLD,
            "passed": self.passed,
            "texts": [
                {
                    "label": t.label,
                    "prompt": t.prompt,
                    "tokens": t.tokens,
                    "cosine": round(t.cosine, 7),
                    "passed": t.passed,
                }
                for t in self.texts
            ],
        }


def check_texts() -> list[tuple[str, str]]:
    """The shipped texts, as (label, text)."""
    raw = resources.files("worker").joinpath("data/check_texts.json").read_text("utf-8")
    return [(entry["label"], entry["text"]) for entry in json.loads(raw)]


def check_model(
    model_dir: Path, name: str | None = None, pooling: str = "auto", direction: str = "right"
) -> CheckReport:
    """Embed the shipped texts with kembed and with sentence-transformers; see the module.
    ``pooling`` and ``direction`` (the truncation side): the worker's settings, so that a
    worker checks the model as it serves it (sentence-transformers cuts at that side too)."""
    from worker.encoder.torch_backend import TorchEncoder

    encoder = TorchEncoder(
        model_dir, name or model_dir.name, device="cpu", dtype="float32", pooling=pooling
    )
    info = encoder.info
    tokenizer = TextTokenizer.from_model_dir(model_dir, info.max_seq_length, direction)
    texts = check_texts()
    longest = max(texts, key=lambda entry: len(entry[1]))[1]
    over = longest
    while len(tokenizer.encode([over])[0].ids) < info.max_seq_length:
        over = f"{over} {longest}"
    texts.append(("over the window", f"{over} {longest}"))
    reference = _reference(model_dir, info.max_seq_length, direction)
    prompts, default = read_prompts(model_dir)
    checks: list[TextCheck] = []
    for prompt_name in [None, *[p for p in prompts if p != default]]:
        prompt = prompts.get(prompt_name or default or "", "")
        tokenized = tokenizer.encode([prompt + text for _, text in texts])
        skip = None if info.include_prompt else [tokenizer.prompt_length(prompt)] * len(texts)
        ours = encoder.run(encoder.prepare([t.ids for t in tokenized], pooled_from=skip))
        theirs = reference([text for _, text in texts], prompt_name)
        cosines = _cosines(ours, theirs)
        checks.extend(
            TextCheck(label, prompt_name, len(tok.ids), float(cos))
            for (label, _), tok, cos in zip(texts, tokenized, cosines, strict=True)
        )
    return CheckReport(info.name, info.dim, info.max_seq_length, info.pooling, tuple(checks))


class ReferenceMissingError(RuntimeError):
    """sentence-transformers is not installed."""


def _reference(model_dir: Path, window: int, direction: str) -> _Reference:
    """sentence-transformers on the folder, cutting at ``direction``. A folder that sets no
    length limit its positions can hold (a plain Hugging Face folder whose tokenizer says
    none) runs at kembed's ``window``: sentence-transformers itself would index past the
    position table on the over-long text."""
    try:
        from sentence_transformers import SentenceTransformer
    except ModuleNotFoundError:
        raise ReferenceMissingError(
            "kembed models check compares with sentence-transformers: pip install 'kembed[check]'"
        ) from None
    model = SentenceTransformer(str(model_dir), device="cpu")
    if model.max_seq_length is None or model.max_seq_length > window:
        model.max_seq_length = window
    model.tokenizer.truncation_side = direction
    return _Reference(model)


class _Reference:
    def __init__(self, model: object) -> None:
        self._model = model

    def __call__(self, texts: list[str], prompt_name: str | None) -> npt.NDArray[np.float32]:
        encode = getattr(self._model, "encode")  # noqa: B009 (untyped third-party model)
        vectors = encode(texts, prompt_name=prompt_name, convert_to_numpy=True, batch_size=64)
        return np.asarray(vectors, dtype=np.float32)


def _cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    if a.shape != b.shape:
        return np.full(len(a), -1.0)  # another dimension: no text can pass
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dots = (a64 * b64).sum(axis=1)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    result: npt.NDArray[np.float64] = dots / np.maximum(norms, 1e-30)
    return result
