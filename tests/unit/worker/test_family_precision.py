"""Precision per model family: every tiny family through the quality gate (``validate``, as
``kembed validate`` and ``KEMBED_QUALITY_GATE`` run it) in bf16, fp16 and both bitsandbytes
quantizations, on the CPU, against its own fp32.

The gate's two criteria are the Spearman drop on STS-B and the mean cosine to fp32. With
random weights only the second one means anything: a random model's sentence vectors are
nearly collinear, so its STS-B Spearman is noise (its rank order flips on differences
of 1e-5 in cosine: the bf16 BERT-with-Dense model drops 15 points at a mean cosine of
0.99999). So these tests hold each family to the cosine, and the real model's Spearman
is held by the gate's own tests and figures (docs/models.md).

fp16 here runs on the CPU: it proves each family's fp16 path (casts, the Dense head, the
pool mask), not a GPU's numerics; the figures per family are in docs/models.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.encoder import quantize
from worker.quality import GateThresholds, QualityReport, default_pairs_path, load_pairs, validate
from worker.settings import WorkerSettings

# 100 pairs: ~200 sentences of mixed lengths, enough for the mean and the worst cosine.
PAIRS = load_pairs(default_pairs_path(), limit=100)

FAMILIES = [
    "bert-dense",
    "t5",
    "xlmr",
    "mpnet",
    "modernbert",
    "bert-instructor",
    "qwen3",
    "qwen2",
    "mistral",
    "llama",
]

# (dtype, quantization) -> (least mean cosine, least single cosine) to the family's fp32.
# bf16 and fp16 keep 8 and 11 mantissa bits; LLM.int8 keeps outliers in 16 bits; nf4 keeps
# 4 bits a weight, and the tiny decoders' few, wide layers lose the most (mean 0.98 at worst).
PRECISIONS = {
    ("bfloat16", "none"): (0.9995, 0.995),
    ("float16", "none"): (0.9999, 0.999),
    ("float32", "int8"): (0.9995, 0.995),
    ("float32", "nf4"): (0.97, 0.8),
}


def _gate(folder: Path, dtype: str, quantization: str) -> QualityReport:
    settings = WorkerSettings.model_validate(
        {"model": str(folder), "dtype": dtype, "quantization": quantization, "torch_compile": "off"}
    )
    return validate(settings, PAIRS, GateThresholds())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("dtype", "quantization"), list(PRECISIONS))
def test_every_family_keeps_its_vectors_in_every_precision(
    family_folders: dict[str, Path], family: str, dtype: str, quantization: str
) -> None:
    report = _gate(family_folders[family], dtype, quantization)
    # The candidate really ran as asked, and the reference is the same folder in fp32.
    assert report.candidate is not None
    assert report.reference is not None
    assert (report.candidate["dtype"], report.candidate["quantization"]) == (dtype, quantization)
    assert (report.reference["dtype"], report.reference["quantization"]) == ("float32", "none")
    least_mean, least_single = PRECISIONS[(dtype, quantization)]
    assert report.mean_cosine >= least_mean, report.summary()
    assert report.min_cosine >= least_single, report.summary()


def test_a_t5_encoder_keeps_its_feed_forward_output_unquantized_in_nf4(
    family_folders: dict[str, Path],
) -> None:
    """T5's feed-forward casts its input to the dtype of ``wo``'s weight; a 4-bit ``wo``
    stores uint8, so quantizing it turned every activation into bytes (mean cosine -0.04).
    It stays in the model's dtype, as transformers' ``_keep_in_fp32_modules`` says."""
    from worker.encoder.torch_backend import TorchEncoder

    encoder = TorchEncoder(family_folders["t5"], "t5", quantization="nf4", compile=False)
    module = encoder.module(encoder.current.dtype)
    quantized = {type(m).__name__ for n, m in module.named_modules() if n.endswith(".wo")}
    assert quantized == {"Linear"}
    others = {type(m).__name__ for n, m in module.named_modules() if n.endswith(".wi")}
    # wi (32 -> 64) is 4-bit unless this CPU's packed 4-bit layout cannot hold its shape.
    assert others == {"Linear" if quantize._cpu_packs_4bit() else "Linear4bit"}


@pytest.mark.parametrize("packs", [False, True])
def test_nf4_keeps_layers_the_packed_cpu_layout_cannot_hold(
    packs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where bitsandbytes packs 4-bit weights for the CPU (AVX512-BF16), a layer whose
    ``in_features`` is not a multiple of 64 or ``out_features`` not of 32 failed in its
    first forward pass ("shape '[32, 0]' is invalid"); there it stays unquantized, and
    the model still runs. Elsewhere every layer is quantized."""
    this_cpu_packs = quantize._cpu_packs_4bit()
    monkeypatch.setattr(quantize, "_cpu_packs_4bit", lambda: packs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.Linear(32, 64), torch.nn.Linear(64, 48)
    )
    replaced = quantize.quantize_linear_layers(model, "nf4", torch.float32, device="cpu")
    kinds = [type(layer).__name__ for layer in model]
    if packs:
        assert (replaced, kinds) == (1, ["Linear4bit", "Linear", "Linear"])
    else:
        assert (replaced, kinds) == (3, ["Linear4bit"] * 3)
    assert [quantize.packable_4bit(torch.nn.Linear(i, o)) for i, o in ((64, 32), (32, 64))] == [
        True,
        False,
    ]
    if packs == this_cpu_packs:  # the layout this CPU really uses: run it
        model = model.to("cpu").eval()  # bitsandbytes quantizes on the move
        with torch.no_grad():
            out = model(torch.randn(3, 64))
        assert out.shape == (3, 48)
        assert bool(torch.isfinite(out).all())
