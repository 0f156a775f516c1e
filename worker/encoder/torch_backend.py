"""The torch encoder: a Hugging Face transformer and the sentence-transformers modules its
folder lists after it (pooling, Dense, Normalize: ``worker.encoder.folder``).

The only module of the worker that imports torch and transformers. It is driven from one
dedicated thread; torch releases the GIL inside its kernels, so the event loop keeps
fetching, heartbeating and publishing while a batch runs.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog
import torch
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from worker.encoder.base import EncoderOutOfMemoryError, ModelInfo, Prepared
from worker.encoder.folder import ModelFolder, read_folder, usable_positions
from worker.encoder.head import Head
from worker.encoder.pooling import POOLING_MODES, pool
from worker.encoder.quantize import memory_bytes, quantize_linear_layers

__all__ = ["TorchEncoder", "Variant", "resolve_compile", "resolve_device", "resolve_dtype"]

log = structlog.get_logger("kembed.encoder")

# A batch this small runs on one CPU thread. Measured on 2 cores: after an idle gap a lone
# text took ~15 ms on two OpenMP threads (the sleeping second thread must be woken) and
# ~10 ms on one; from ~16 texts up, two threads win. GPUs ignore this.
_SINGLE_THREAD_TOKENS = 64

# How torch's CPU allocator words a failed allocation (a plain RuntimeError).
_CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_has_fast_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AMX or AVX512-BF16), per /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def bf16_supported(device_type: str) -> bool:
    """Whether bf16 is a candidate: on CUDA when the GPU computes it; CPUs emulate it at
    worst, and the tuner measures whether it pays."""
    return bool(torch.cuda.is_bf16_supported()) if device_type == "cuda" else True


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: fp16 on CUDA; bf16 on CPUs with native bf16 (measured ~2x fp32 on a 2-core
    AMX CPU, STS-B within 0.1 of fp32, see docs/performance.md); fp32 elsewhere."""
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.float16
    return torch.bfloat16 if device.type == "cpu" and cpu_has_fast_bf16() else torch.float32


def resolve_compile(setting: str, device: torch.device) -> bool:
    """``auto``: compile on CPUs, where inductor's fused kernels and frozen (prepacked)
    weights measured 1.35-1.7x eager bf16 on a 2-core AMX CPU (docs/performance.md);
    eager on CUDA, where it has not been measured."""
    if setting == "auto":
        return device.type == "cpu"
    return setting == "on"


@dataclass(slots=True)
class Variant:
    """One way to run the model: its weights in ``dtype``, eagerly or under torch.compile.

    A compiled variant runs batches of at most ``_SINGLE_THREAD_TOKENS`` padded tokens on
    its eager module at one thread: the compiled graph is specialized on the torch thread
    count (a global), so it is compiled for the full count only. That halves compilation,
    and lets a compiled variant be built on another thread while the encoder serves (the
    thread count then stays put until the variant is installed).
    """

    dtype: torch.dtype
    module: torch.nn.Module
    forward: Any
    compiled: bool

    @property
    def name(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        return f"{str(self.dtype).removeprefix('torch.')}/{mode}"


class TorchEncoder:
    def __init__(
        self,
        model_dir: Path,
        name: str,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_seq_length: int | None = None,
        pad_id: int = 0,
        threads: int | None = None,
        compile: bool = False,
        quantization: str = "none",
        pooling: str = "auto",
    ) -> None:
        """``dtype`` ``auto`` and ``compile`` here follow the static rules of
        :func:`resolve_dtype`; the worker starts from an explicit, safe variant and lets
        :mod:`worker.encoder.autotune` install a measured one (:meth:`install`)."""
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # not a log line
        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # no load reports
        self._threads = threads or torch.get_num_threads()
        self._current_threads = 0
        self._pinned = False
        self._device = resolve_device(device)
        self._model_dir = model_dir
        self._folder = self._read_folder()
        self._quantization = quantization
        self._modules: dict[torch.dtype, torch.nn.Module] = {}
        first_dtype = resolve_dtype(dtype, self._device)
        model = self.module(first_dtype)
        if quantization != "none" and compile:
            # bitsandbytes' kernels are opaque to inductor: nothing to fuse or prepack.
            log.info("encoder.compile_skipped", reason=f"quantization={quantization}")
            compile = False
        config: Any = getattr(model, "config")  # noqa: B009 (untyped HF attribute)
        limit = self._model_limit(config)
        self._pooling = self._pooling_mode(pooling)
        self._head = Head(self._folder, self._device)
        self._pad_id = pad_id
        self._uses_token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        self.info = ModelInfo(
            name=name,
            path=model_dir,
            dim=self._output_dim(config),
            max_seq_length=min(limit, max_seq_length or limit),
            pooling=self._pooling,
            dtype=str(first_dtype).removeprefix("torch."),
            device=str(self._device),
            compiled=False,
            quantization=quantization,
            memory_bytes=memory_bytes(model),
            include_prompt=self._folder.include_prompt,
        )
        self._variant = Variant(first_dtype, model, model, False)
        if compile:
            self.install(self.variant(first_dtype, compiled=True))

    # What a subclass (worker.encoder.cross_encoder) changes: the model class it loads,
    # what one row of output is, and how long an input may be.

    def _read_folder(self) -> ModelFolder:
        """The sentence-transformers modules after the transformer (refusing any other)."""
        return read_folder(self._model_dir)

    def _load_module(self, dtype: torch.dtype) -> torch.nn.Module:
        return _load(self._model_dir, dtype)

    def _model_limit(self, config: Any) -> int:
        """sentence-transformers' ``max_seq_length`` (wherever the folder's version keeps
        it), capped by what the position embeddings can place; 512 when neither says."""
        usable = usable_positions(config.to_dict())
        limits = [value for value in (self._folder.max_seq_length, usable) if value]
        return min(limits) if limits else 512

    def _pooling_mode(self, pooling: str) -> str:
        mode = self._folder.pooling if pooling == "auto" else pooling
        if mode not in POOLING_MODES:
            known = ", ".join(POOLING_MODES)
            raise ValueError(f"unknown pooling {pooling!r}; known: auto, {known}")
        return mode

    def _output_dim(self, config: Any) -> int:
        hidden = getattr(config, "hidden_size", None) or config.d_model  # T5 names it d_model
        return self._folder.output_dim(int(hidden))

    def _rows(
        self, forward: Any, inputs: dict[str, torch.Tensor], pooled: torch.Tensor | None
    ) -> torch.Tensor:
        """One output row per sequence: the last hidden state pooled under ``pooled`` (None:
        the attention mask), through the folder's Dense and Normalize modules, cut to its
        ``truncate_dim``."""
        hidden = forward(**inputs).last_hidden_state
        mask = inputs["attention_mask"] if pooled is None else pooled
        return self._head(pool(hidden, mask, self._pooling))

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def current(self) -> Variant:
        return self._variant

    def module(self, dtype: torch.dtype) -> torch.nn.Module:
        """The eager model with weights in ``dtype`` (loaded once per dtype)."""
        if dtype not in self._modules:
            model = self._load_module(dtype)
            if self._quantization != "none":
                quantize_linear_layers(
                    model, self._quantization, compute_dtype=dtype, device=self._device.type
                )
            self._modules[dtype] = model.to(self._device).eval()
        return self._modules[dtype]

    def variant(self, dtype: torch.dtype, *, compiled: bool) -> Variant:
        """A variant (not yet installed; a compiled one compiles on its first batch)."""
        module = self.module(dtype)
        return Variant(dtype, module, _compiled(module) if compiled else module, compiled)

    def drop_modules_except(self, keep: Sequence[torch.dtype]) -> None:
        """Free the weights of dtypes no longer needed (after tuning)."""
        for dtype in [d for d in self._modules if d not in keep]:
            del self._modules[dtype]
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def install(self, variant: Variant) -> None:
        """Serve ``variant`` from the next batch on. One attribute assignment: a batch
        runs entirely on the variant it started with."""
        self._variant = variant
        self.info = replace(
            self.info,
            dtype=str(variant.dtype).removeprefix("torch."),
            compiled=variant.compiled,
            memory_bytes=memory_bytes(variant.module),
        )

    def pin_threads(self, pinned: bool) -> None:
        """While pinned, every batch runs at the full thread count (torch's thread count is
        process-wide: a variant compiling on another thread must not see it change)."""
        self._pinned = pinned
        if pinned:
            self._use_threads(self._threads)

    def compile_variant(self, variant: Variant, prepared: Prepared) -> None:
        """Compile ``variant`` now (its first call), on the calling thread; raises what the
        compiler raises (no eager fallback: the variant is not being served)."""
        self._forward_pooled(variant.forward, prepared)

    def prepare(
        self,
        batch: Sequence[Sequence[int]],
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        """Pad ``batch`` into id and mask arrays (cheap; done while the previous batch runs)."""
        return Prepared.pad(batch, self._pad_id, segments, pooled_from)

    def run(self, prepared: Prepared) -> npt.NDArray[np.float32]:
        return self.run_variant(self._variant, prepared)

    def run_variant(self, variant: Variant, prepared: Prepared) -> npt.NDArray[np.float32]:
        """Run ``prepared`` on ``variant`` (installed or not), on the encoder thread."""
        try:
            return self._run(variant, prepared)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            if self._device.type == "cuda":
                # Hand the failed attempt's cached blocks back, so that the smaller batches
                # the pipeline retries with find them free.
                torch.cuda.empty_cache()
            raise EncoderOutOfMemoryError(
                f"{prepared.rows} x {prepared.ids.shape[1]} tokens did not fit on {self._device}"
            ) from exc

    def _run(self, variant: Variant, prepared: Prepared) -> npt.NDArray[np.float32]:
        small = prepared.padded_tokens <= _SINGLE_THREAD_TOKENS
        self._use_threads(1 if small and not self._pinned else self._threads)
        rows = prepared.rows
        if not variant.compiled or (small and self._device.type == "cpu"):
            return self._forward_pooled(variant.module, prepared)[:rows]
        padded = prepared
        if rows == 1:
            # A compiled graph specializes on size 1; two identical rows reuse the dynamic
            # graph instead of compiling another one (a lone text costs about the same).
            padded = Prepared(
                _twice(prepared.ids),
                _twice(prepared.mask),
                None if prepared.types is None else _twice(prepared.types),
                None if prepared.pool_mask is None else _twice(prepared.pool_mask),
            )
        try:
            return self._forward_pooled(variant.forward, padded)[:rows]
        except Exception as exc:  # any compiler failure: serve eagerly
            if _out_of_memory(exc):
                raise  # the batch is too big, not the compiler at fault
            # inductor needs a C++ compiler and may meet an op it cannot lower; the eager
            # model computes the same function, only slower.
            log.warning("encoder.compile_failed", error=type(exc).__name__, fallback="eager")
            variant.forward, variant.compiled = variant.module, False
            if variant is self._variant:
                self.install(variant)
        return self._forward_pooled(variant.module, prepared)[:rows]

    def _forward_pooled(self, forward: Any, prepared: Prepared) -> npt.NDArray[np.float32]:
        input_ids = self._tensor(prepared.ids)
        kwargs = {"input_ids": input_ids, "attention_mask": self._tensor(prepared.mask)}
        if self._uses_token_types:
            types = prepared.types
            kwargs["token_type_ids"] = (
                torch.zeros_like(input_ids) if types is None else self._tensor(types)
            )
        pooled = None if prepared.pool_mask is None else self._tensor(prepared.pool_mask)
        with torch.inference_mode():
            rows = self._rows(forward, kwargs, pooled)
        out: npt.NDArray[np.float32] = rows.float().cpu().numpy().astype(np.float32, copy=False)
        return out

    def _tensor(self, array: npt.NDArray[np.int64]) -> torch.Tensor:
        return torch.from_numpy(array).to(self._device, non_blocking=True)

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        return self.run(self.prepare(batch))

    def _use_threads(self, threads: int) -> None:
        # torch's thread count is process-wide; only the encoder thread changes it.
        if threads != self._current_threads:
            torch.set_num_threads(threads)
            self._current_threads = threads


def _twice(array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.repeat(array, 2, axis=0)


def _out_of_memory(exc: Exception) -> bool:
    """Whether ``exc`` says a batch did not fit: torch's OutOfMemoryError (CUDA and other
    accelerators), a failed CPU allocation (a RuntimeError from torch's CPU allocator), or
    Python's MemoryError."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and _CPU_ALLOCATION_FAILED in str(exc)


def _compiled(model: torch.nn.Module) -> Any:
    """``model`` under torch.compile with dynamic shapes and frozen weights.

    Freezing folds the (inference-only) weights into the graph as constants, which lets
    inductor prepack them for oneDNN's AMX/AVX-512 matmuls; most of the gain on CPU comes
    from that and from fusing GELU, layer norm and the residual adds. Compilation happens on
    the first call, for the torch thread count then in use (dynamo guards on it).
    """
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(model, dynamic=True)


_ENCODER_ONLY = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}
"""Encoder-decoder families whose encoder alone makes the token states (as
sentence-transformers loads them)."""


def _load(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The transformer without its classification pooler (a dense layer + tanh per batch
    that sentence embeddings never use); models without that option load as they are; a
    T5-family model as its encoder alone."""
    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if model_type in _ENCODER_ONLY:
        import transformers

        encoder: torch.nn.Module = getattr(transformers, _ENCODER_ONLY[model_type]).from_pretrained(
            str(model_dir), dtype=dtype
        )
        return encoder
    try:
        model = AutoModel.from_pretrained(str(model_dir), dtype=dtype, add_pooling_layer=False)
    except TypeError:
        model = AutoModel.from_pretrained(str(model_dir), dtype=dtype)
    module: torch.nn.Module = model
    return module
