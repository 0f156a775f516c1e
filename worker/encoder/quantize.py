"""Weight quantization with bitsandbytes: LLM.int8 (``int8``) and 4-bit NormalFloat (``nf4``).

Every ``nn.Linear`` of the transformer is replaced by its bitsandbytes counterpart holding
the same weights; the embeddings and layer norms stay in the model's dtype, and so do the
layers the architecture says must keep their precision (its ``_keep_in_fp32_modules``, as
transformers' own bitsandbytes loading leaves them: T5's feed-forward ``wo``, whose forward
casts its input to that layer's weight dtype, which a 4-bit layer stores as uint8). On a
CPU with AVX512-BF16, bitsandbytes runs 4-bit layers on a packed weight layout that needs
``in_features`` a multiple of its 64-weight block and ``out_features`` a multiple of 32
(and fails in the first forward pass otherwise): there, ``nf4`` keeps a layer of another
shape unquantized too (:func:`packable_4bit`; no real model's layer is that small or odd,
a tiny test model's can be). The weights are
quantized when the model is moved to its device (CUDA, or the CPU, which bitsandbytes 0.45+
also supports, slowly). Quality is not assumed: ``kembed validate`` measures it against
fp32 (docs/models.md has the figures).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["QUANTIZATIONS", "memory_bytes", "packable_4bit", "quantize_linear_layers"]

QUANTIZATIONS = ("none", "int8", "nf4")

# LLM.int8's outlier threshold: activations above it stay in 16/32-bit (the paper's 6.0).
_INT8_THRESHOLD = 6.0


# bitsandbytes' 4-bit block (weights per absmax scale) and the row block of its packed
# CPU layout (bitsandbytes.functional._convert_weight_packed_for_cpu).
_NF4_BLOCK = 64
_CPU_PACK_ROWS = 32


def quantize_linear_layers(
    model: nn.Module, kind: str, compute_dtype: torch.dtype, device: str = "cpu"
) -> int:
    """Replace ``model``'s linear layers in place (for a model that will run on
    ``device``'s type); returns how many were replaced."""
    if kind == "none":
        return 0
    if kind not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {kind!r}; expected one of {QUANTIZATIONS}")
    import bitsandbytes as bnb

    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    packed = kind == "nf4" and device == "cpu" and _cpu_packs_4bit()
    replaced = 0
    for prefix, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            path = f"{prefix}.{name}" if prefix else name
            if not isinstance(child, nn.Linear) or keep.intersection(path.split(".")):
                continue
            if packed and not packable_4bit(child):
                continue
            setattr(parent, name, _quantized(bnb, child, kind, compute_dtype))
            replaced += 1
    return replaced


def packable_4bit(linear: nn.Linear) -> bool:
    """Whether bitsandbytes' packed CPU layout can hold ``linear`` in 4 bits."""
    return linear.in_features % _NF4_BLOCK == 0 and linear.out_features % _CPU_PACK_ROWS == 0


def _cpu_packs_4bit() -> bool:
    """Whether bitsandbytes runs 4-bit layers on this CPU in its packed layout: it does
    where its native library reports AVX512-BF16 (the same test its layers make)."""
    import bitsandbytes.functional

    probe: Any = bitsandbytes.functional.has_avx512bf16  # untyped in bitsandbytes
    return bool(probe())


def _quantized(bnb: Any, linear: nn.Linear, kind: str, compute_dtype: torch.dtype) -> nn.Module:
    has_bias = linear.bias is not None
    weight = linear.weight.data.detach().clone()
    layer: nn.Module
    if kind == "int8":
        layer = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            bias=has_bias,
            has_fp16_weights=False,
            threshold=_INT8_THRESHOLD,
        )
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=has_bias,
            compute_dtype=compute_dtype,
            quant_type="nf4",
        )
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
    if has_bias:
        assert linear.bias is not None
        layer.bias = nn.Parameter(linear.bias.data.detach().clone(), requires_grad=False)
    return layer


def memory_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters and buffers (quantized weights at their size)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
