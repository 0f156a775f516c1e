"""``dtype=auto`` / ``torch_compile=auto``: measure the candidate variants, keep the fastest.

Which precision and whether to compile depends on the hardware more than any rule read
from ``/proc/cpuinfo`` can say: on a 2-core AMX CPU bf16 compiled was the fastest; on a CPU
with AVX512-BF16 but no AMX, fp32 compiled beat bf16 by ~1.8x through Kafka. So the worker
measures, on the machine it runs on:

1. every candidate (dtype x eager/compiled; an explicit setting leaves one value of its
   axis) is built; a compiled one is compiled for the full thread count;
2. its vectors for a few reference texts are compared with fp32's: a candidate whose mean
   cosine falls under the quality gate's ``min_mean_cosine`` is out;
3. the remaining ones are timed, in rounds, on length-sorted token-budgeted batches
   (kembed's batcher at ``max_batch_tokens``) of texts bundled with the package;
4. the fastest is installed (an attribute swap between two batches).

Model execution (timing, reference vectors) runs on the encoder thread, through
``on_encoder``, one batch at a time between the batches being served; only compilation,
which would hold the encoder for many seconds, runs on the tuner's own thread. While
tuning, the encoder keeps the full thread count (torch's thread count is process-wide and
a compiled graph guards on it). The tuner never touches requests, so a switch can
neither lose nor repeat one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import resources
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import structlog

__all__ = [
    "Candidate",
    "Measurement",
    "TuningResult",
    "candidates",
    "choose",
    "tuning_texts",
    "tuning_workload",
]

log = structlog.get_logger("kembed.encoder")

T = TypeVar("T")

# How many times each candidate is timed over the workload; its best pass counts.
ROUNDS = 2


@dataclass(frozen=True, slots=True)
class Candidate:
    dtype: str  # float32, bfloat16, float16
    compiled: bool

    @property
    def name(self) -> str:
        return f"{self.dtype}/{'compiled' if self.compiled else 'eager'}"


@dataclass(slots=True)
class Measurement:
    """One row of the tuning table. ``status``: ok, quality (cosine to fp32 too low),
    failed (building or compiling raised), skipped (the budget ran out first)."""

    candidate: Candidate
    status: str = "pending"
    texts_per_s: float | None = None
    mean_cosine: float | None = None
    build_s: float | None = None
    error: str | None = None
    chosen: bool = False

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["candidate"] = self.candidate.name
        row["dtype"] = self.candidate.dtype
        row["compiled"] = self.candidate.compiled
        for key in ("texts_per_s", "mean_cosine", "build_s"):
            if row[key] is not None:
                row[key] = round(row[key], 5 if key == "mean_cosine" else 1)
        return row


@dataclass(slots=True)
class TuningResult:
    phase: str  # tuning, then eager or compiled (what is served once done)
    table: list[Measurement] = field(default_factory=list)
    chosen: Candidate | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "chosen": self.chosen.name if self.chosen else None,
            "seconds": round(self.seconds, 1),
            "table": [row.as_dict() for row in self.table],
        }


def candidates(
    dtype: str, compile_setting: str, device_type: str, *, bf16_supported: bool = True
) -> list[Candidate]:
    """The variants ``auto`` chooses among; an explicit setting fixes its axis.

    CPU: fp32 and bf16; CUDA: fp16, bf16 (when the GPU supports it) and fp32. Eager ones
    come first: they cost nothing to build, so the tuner can switch to the best of them
    before it spends time compiling.
    """
    if dtype != "auto":
        dtypes = [dtype]
    elif device_type == "cuda":
        dtypes = ["float16", *(["bfloat16"] if bf16_supported else []), "float32"]
    else:
        dtypes = ["float32", *(["bfloat16"] if bf16_supported else [])]
    compiled = {"on": [True], "off": [False]}.get(compile_setting, [False, True])
    return [Candidate(d, c) for c in compiled for d in dtypes]


def initial_candidate(dtype: str, device_type: str) -> Candidate:
    """What a worker serves while it tunes: the explicit dtype, else fp32 (exact), eager."""
    del device_type  # fp32 is the safe start on every device; tuning moves on from there
    return Candidate(dtype if dtype != "auto" else "float32", False)


def choose(table: Sequence[Measurement]) -> Candidate | None:
    """The fastest candidate that was measured and kept the quality."""
    timed = [row for row in table if row.status == "ok" and row.texts_per_s is not None]
    if not timed:
        return None
    return max(timed, key=lambda row: row.texts_per_s or 0.0).candidate


def tuning_texts() -> list[str]:
    """The bundled texts (sentences; passages are built from them)."""
    text = resources.files("worker.encoder").joinpath("tuning_texts.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def workload_texts(count: int = 384, long_every: int = 5) -> list[str]:
    """``count`` texts shaped like a mixed corpus: one in ``long_every`` a passage of
    consecutive sentences (~150-250 tokens), the others single sentences."""
    sentences = tuning_texts()
    passages = [" ".join(sentences[i : i + 12]) for i in range(0, len(sentences), 12)]
    return [
        passages[i % len(passages)] if i % long_every == 0 else sentences[i % len(sentences)]
        for i in range(count)
    ]


def tuning_workload(
    token_ids: Sequence[Sequence[int]], max_batch_tokens: int, max_batch_size: int
) -> list[list[Sequence[int]]]:
    """Batches cut as kembed's batcher cuts a backlog: length-sorted, each at most
    ``max_batch_tokens`` padded tokens (rows x longest) and ``max_batch_size`` rows."""
    batches: list[list[Sequence[int]]] = []
    current: list[Sequence[int]] = []
    for ids in sorted(token_ids, key=len):
        if current and (
            len(current) >= max_batch_size or (len(current) + 1) * len(ids) > max_batch_tokens
        ):
            batches.append(current)
            current = []
        current.append(ids)
    if current:
        batches.append(current)
    return batches


def mean_cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return float(np.sum(a * b, axis=1).mean())


OnEncoder = Callable[[Callable[[], Any]], Any]
Embed = Callable[[Sequence[Sequence[int]]], npt.NDArray[np.float32]]


def _embedder(encoder: Any, variant: Any, on_encoder: OnEncoder, batch: int = 64) -> Embed:
    """Token ids -> vectors on ``variant``, in length-sorted batches on the encoder thread."""

    def embed(ids: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), encoder.info.dim), dtype=np.float32)
        for start in range(0, len(order), batch):
            rows = order[start : start + batch]
            prepared = encoder.prepare([ids[i] for i in rows])
            out[rows] = on_encoder(partial(encoder.run_variant, variant, prepared))
        return out

    return embed


def tune(
    encoder: Any,
    options: Sequence[Candidate],
    *,
    workload: Sequence[Sequence[Sequence[int]]],
    reference_ids: Sequence[Sequence[int]],
    min_mean_cosine: float,
    budget_s: float,
    on_encoder: OnEncoder,
    result: TuningResult | None = None,
    on_switch: Callable[[Candidate], None] | None = None,
    gate: Callable[[Embed, Embed], str | None] | None = None,
) -> TuningResult:
    """Measure ``options`` on ``encoder`` (a TorchEncoder) and install the fastest.

    ``on_encoder(fn)`` runs ``fn`` on the encoder thread and returns its result.
    ``result`` is filled in place (the worker shows it in /info while tuning runs).
    ``gate(candidate, reference)``: the full quality gate on a variant before it is
    installed, given functions from token ids to its and fp32's vectors; returns why it
    failed, or None. A candidate that is already installed is not rebuilt.
    """
    import torch

    from worker.encoder.torch_backend import Variant

    started = time.monotonic()
    result = result or TuningResult("tuning")
    result.phase = "tuning"
    result.table = [Measurement(c) for c in options]
    texts = sum(len(batch) for batch in workload)
    prepared = [encoder.prepare(batch) for batch in workload]
    reference_batches = [encoder.prepare(list(reference_ids))]
    variants: dict[Candidate, Variant] = {}
    current = encoder.current
    current_candidate = Candidate(str(current.dtype).removeprefix("torch."), current.compiled)
    log.info(
        "encoder.tuning_started",
        model=encoder.info.name,
        candidates=[c.name for c in options],
        serving=current_candidate.name,
        budget_s=budget_s,
    )

    def vectors(variant: Variant, batches: Sequence[Any]) -> npt.NDArray[np.float32]:
        return np.concatenate([encoder.run_variant(variant, p) for p in batches])

    def run_timed(variant: Variant, batch: Any) -> float:
        begun = time.perf_counter()
        encoder.run_variant(variant, batch)
        return time.perf_counter() - begun

    def timed(variant: Variant) -> float:
        # One batch per slice on the encoder thread: served batches interleave with the
        # measurement batch by batch (a whole pass would hold them back for seconds).
        return float(sum(on_encoder(partial(run_timed, variant, p)) for p in prepared))

    on_encoder(lambda: encoder.pin_threads(True))
    try:
        fp32 = torch.float32
        reference_variant = Variant(fp32, encoder.module(fp32), encoder.module(fp32), False)
        reference = on_encoder(lambda: vectors(reference_variant, reference_batches))
        for phase_compiled in (False, True):
            rows = [r for r in result.table if r.candidate.compiled == phase_compiled]
            if not rows:
                continue
            for row in rows:
                if time.monotonic() - started > budget_s and len(options) > 1:
                    row.status = "skipped"
                    continue
                _build(encoder, row, variants, current, current_candidate, on_encoder)
                if row.status == "failed":
                    continue
                variant = variants[row.candidate]
                row.mean_cosine = mean_cosine(
                    on_encoder(partial(vectors, variant, reference_batches)), reference
                )
                row.status = "ok" if row.mean_cosine >= min_mean_cosine else "quality"
            if len(options) > 1:
                # Time everything that passed so far, in rounds, in the same conditions.
                ok = [r for r in result.table if r.status in ("ok", "timed")]
                for row in ok:
                    row.texts_per_s = None
                for _ in range(ROUNDS):
                    for row in ok:
                        seconds = timed(variants[row.candidate])
                        speed = texts / seconds
                        row.texts_per_s = max(row.texts_per_s or 0.0, speed)
            pick = choose(result.table)
            if len(options) == 1 and result.table[0].status == "ok":
                pick = options[0]  # nothing to compare: built and checked is enough
            if pick is not None and pick != current_candidate:
                reason = None
                if gate is not None:
                    reason = gate(
                        _embedder(encoder, variants[pick], on_encoder),
                        _embedder(encoder, reference_variant, on_encoder),
                    )
                if reason is not None:
                    log.error("encoder.tuning_gate_failed", candidate=pick.name, reason=reason)
                    next(r for r in result.table if r.candidate == pick).status = "quality"
                    pick = choose(result.table)
                if pick is not None and pick != current_candidate:
                    on_encoder(partial(encoder.install, variants[pick]))
                    current_candidate = pick
                    if on_switch is not None:
                        on_switch(pick)
                    log.info("encoder.switched", model=encoder.info.name, to=pick.name)
    finally:
        on_encoder(lambda: encoder.pin_threads(False))
    result.chosen = current_candidate
    for row in result.table:
        row.chosen = row.candidate == current_candidate
    served = encoder.current
    encoder.drop_modules_except([served.dtype])
    result.seconds = time.monotonic() - started
    result.phase = "compiled" if served.compiled else "eager"
    log.info(
        "encoder.tuned",
        model=encoder.info.name,
        chosen=current_candidate.name,
        compiled=served.compiled,
        dtype=encoder.info.dtype,
        seconds=round(result.seconds, 1),
        table=[row.as_dict() for row in result.table],
    )
    return result


def _build(
    encoder: Any,
    row: Measurement,
    variants: dict[Candidate, Any],
    current: Any,
    current_candidate: Candidate,
    on_encoder: OnEncoder,
) -> None:
    """Build ``row``'s variant (compiling it, on this thread, for the full thread count)."""
    import torch

    candidate = row.candidate
    if candidate == current_candidate:
        variants[candidate] = current
        row.build_s = 0.0
        return
    begun = time.monotonic()
    try:
        dtype = getattr(torch, candidate.dtype)
        # Loading weights of a new dtype happens on the encoder thread, between batches
        # (a second or so); compiling below happens here.
        variant = on_encoder(lambda: encoder.variant(dtype, compiled=candidate.compiled))
        if candidate.compiled:
            _compile(encoder, variant)
        variants[candidate] = variant
    except Exception as exc:  # noqa: BLE001 (any build failure takes the candidate out)
        row.status, row.error = "failed", type(exc).__name__
        log.warning(
            "encoder.compile_failed" if candidate.compiled else "encoder.variant_failed",
            candidate=candidate.name,
            error=type(exc).__name__,
            fallback="eager",
        )
    row.build_s = time.monotonic() - begun


def _compile(encoder: Any, variant: Any) -> None:
    """Compile ``variant`` by running it once on a full-size batch, on this thread.

    The thread count is pinned to the encoder's full count meanwhile (tune pins it). The
    graph is dynamic in both batch dimensions, so one call covers every shape served.
    A failure here raises: the tuner takes the candidate out; serving never saw it.
    """
    prepared = encoder.prepare([[0] * 24, [0] * 17, [0] * 9])
    encoder.compile_variant(variant, prepared)
