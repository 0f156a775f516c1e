"""Worker settings of the model: which model(s) to serve, how, and the quality gate and
start-up tuning (part of :class:`worker.settings.WorkerSettings`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DEFAULT_MODEL", "ModelFields", "ModelSpec"]

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

DType = Literal["auto", "float32", "bfloat16", "float16"]
Quantization = Literal["none", "int8", "nf4"]
Pooling = Literal["auto", "mean", "cls", "max", "lasttoken", "mean_sqrt_len"]
TruncationDirection = Literal["right", "left"]
ModelKind = Literal["auto", "embed", "rerank", "sparse"]


class ModelSpec(BaseModel):
    """One model a worker serves (an entry of ``KEMBED_MODELS``).

    Unset fields take the worker-wide setting of the same name (``dtype``,
    ``quantization``, ``max_seq_length``) or the model's own configuration (``pooling``,
    ``prompts``, ``default_prompt_name``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    name: str | None = None
    aliases: tuple[str, ...] = ()
    dtype: DType | None = None
    quantization: Quantization | None = None
    max_seq_length: int | None = Field(None, gt=0)
    pooling: Pooling = "auto"
    truncation_direction: TruncationDirection = "right"
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    requests_topic: str | None = None
    bulk_topic: str | None = None
    kind: ModelKind | None = None

    def served_name(self) -> str:
        return self.name or default_name(self.model)


def default_name(model: str) -> str:
    """The name a model configured as ``model`` is served under when none is given: a
    local directory's own name (``/models/e5-small-v2``: ``e5-small-v2``), so that no
    filesystem path is ever a model name in the catalog; else ``model`` itself (a model
    id, the bundled model)."""
    path = Path(model).expanduser()
    if model.startswith(("/", ".", "~")) or path.is_dir():
        return path.resolve().name or model
    return model


def _json_if_text(value: Any) -> Any:
    """Structured settings arrive as JSON text from flags (env vars are decoded already)."""
    return json.loads(value) if isinstance(value, str) else value


class ModelFields(BaseModel):
    """The model a worker serves (or ``models``, several), its precision and its tuning."""

    # ------------------------------------------------------------------ model
    model: str = Field(
        DEFAULT_MODEL,
        description="Model to serve: a local sentence-transformers or Hugging Face model "
        "directory, a model id present in the local Hugging Face cache, or the bundled "
        f"default {DEFAULT_MODEL}.",
    )
    model_name: str | None = Field(
        None,
        description="Name the model is served under (requests' `model`, results' `model`). "
        "Default: the `model` setting, or for a local directory its own name (never its "
        "path).",
    )
    device: str = Field("auto", description="torch device: auto (cuda if present), cpu, cuda:N.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights and activations precision. auto: measured at start-up (see "
        "tune_budget_s): the fastest of float32 and bfloat16 (CUDA: float16, bfloat16, "
        "float32) whose vectors keep the quality gate's mean cosine to float32 on reference "
        "texts. float32 reproduces sentence-transformers exactly; bf16 keeps STS-B within 0.1.",
    )
    max_seq_length: int | None = Field(
        None,
        gt=0,
        description="Cap on tokens per input; unset means the model's own maximum. Longer "
        "inputs are truncated, or rejected when the request says truncate=false.",
    )
    pooling: Pooling = Field(
        "auto",
        description="How token vectors become one vector: auto reads the model's "
        "sentence-transformers Pooling config (mean for plain Hugging Face models); mean, cls, "
        "max, lasttoken (decoder embedders) or mean_sqrt_len override it.",
    )
    truncation_direction: TruncationDirection = Field(
        "right",
        description="Which end of an over-long input is cut: right keeps the beginning, left "
        "keeps the end. Requests may override it (truncation_direction).",
    )
    prompts: dict[str, str] | None = Field(
        None,
        description='Named prompts, as JSON (e.g. {"query": "query: ", "passage": "passage: "}); '
        "requests pick one with prompt_name. Unset: the model's own (sentence-transformers' "
        "config_sentence_transformers.json), if any.",
    )
    default_prompt_name: str | None = Field(
        None,
        description="Prompt applied to requests that name none (neither prompt nor "
        "prompt_name). Unset: the model's own default, usually none.",
    )
    model_kind: ModelKind = Field(
        "auto",
        description="What the model computes: embed (vectors: an embedding model), rerank "
        "(a relevance score per (query, document) pair: a one-label cross-encoder in "
        "sentence-transformers' CrossEncoder layout), sparse (term weights: a SPLADE-style "
        "encoder in sentence-transformers' SparseEncoder layout) or auto (rerank when the "
        "model's config.json names a ...ForSequenceClassification architecture, sparse for "
        "a SparseEncoder folder, else embed). A "
        "model answers requests of its own kind only.",
    )
    models: tuple[ModelSpec, ...] = Field(
        (),
        description="Several models in one worker, as a JSON list of objects with the keys "
        "model (required), name, aliases, dtype, quantization, max_seq_length, pooling, "
        "truncation_direction, prompts, default_prompt_name, requests_topic, bulk_topic, "
        "kind (auto, embed, rerank or sparse: see model_kind) (a "
        "model with its own requests_topic T has bulk topic T.bulk unless given); each "
        "gets its own batcher, and requests pick one by name or alias. Unset keys take the "
        "worker-wide setting. When set, the single-model settings above (model, model_name, "
        "pooling, prompts, ...) are ignored. The first model serving a topic answers that "
        "topic's requests that name no model.",
    )
    quantization: Literal["none", "int8", "nf4"] = Field(
        "none",
        description="Weight quantization with bitsandbytes: int8 (LLM.int8) or nf4 (4-bit "
        "NormalFloat) for every linear layer, computing in `dtype`. Saves memory (the "
        "embeddings stay unquantized); check quality with `kembed validate` first (on the "
        "bundled model int8 kept STS-B within 0.1 of fp32, nf4 drifted to mean cosine "
        "0.97). Slower than bf16 on CPUs.",
    )
    quality_gate: bool = Field(
        False,
        description="Before joining the group, run the quality gate (`kembed validate`) on "
        "this model, dtype and quantization, and refuse to start (exit 3) if it fails.",
    )
    model_check: bool = Field(
        False,
        description="Before joining the group, prove each embedding model's folder as "
        "`kembed models check` does (kembed and sentence-transformers, fp32 on the CPU, "
        "cos >= 0.9999 on every shipped text) and refuse to start (exit 3) if any text "
        "falls short. Needs sentence-transformers (`kembed[check]`; exit 2 without it).",
    )
    quality_gate_pairs: str | None = Field(
        None,
        description="CSV of reference pairs (text1,text2,gold score) for the gate; default "
        "the STS-B test split (English) shipped with the package (stsb-en-test.csv in "
        "KEMBED_STSB_DIR when that is set).",
    )
    quality_max_spearman_drop: float = Field(
        0.5, ge=0, description="Gate: largest allowed drop of Spearman x100 against fp32."
    )
    quality_min_mean_cosine: float = Field(
        0.99, ge=-1, le=1, description="Gate: smallest allowed mean cosine to fp32 vectors."
    )
    torch_compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Run the model under torch.compile (inductor, dynamic shapes, frozen "
        "weights). auto: measured at start-up against eager, with dtype (tune_budget_s). "
        "Compiling takes ~15-25 s on a 2-core CPU; with tune_in_background (the default) it "
        "happens while the worker already serves eagerly. If it fails (no C++ compiler), the "
        "worker serves eagerly.",
    )
    tune_in_background: bool = Field(
        True,
        description="Serve at once with a safe variant (the explicit dtype, else float32; "
        "eager) and measure the candidates of dtype/torch_compile auto, and compile, in the "
        "background, switching between two batches when done. false: do it all before "
        "joining the group (ready later, at full speed from the first request).",
    )
    tune_budget_s: float = Field(
        300.0,
        ge=0,
        description="Time the start-up measurement of dtype/torch_compile auto may take "
        "(compiling included); candidates not reached by then are skipped. 0: serve the safe "
        "variant (or the one explicit settings name) without measuring.",
    )
    compile_cache_dir: str | None = Field(
        None,
        description="Directory for torch.compile's caches (TORCHINDUCTOR_CACHE_DIR). On a "
        "volume that survives restarts, a restarted worker compiles faster.",
    )
    torch_threads: int | None = Field(
        None, gt=0, description="torch intra-op threads; unset lets torch choose."
    )

    _parse_models = field_validator("models", "prompts", mode="before")(_json_if_text)

    @model_validator(mode="after")
    def _check_models(self) -> Self:
        names: dict[str, str] = {}
        for spec in self.model_specs():
            served = spec.served_name()
            for name in {served, *spec.aliases}:
                if names.setdefault(name, served) != served:
                    raise ValueError(f"model name {name!r} is used by two models")
            prompts = spec.prompts or {}
            if (
                spec.default_prompt_name
                and spec.prompts is not None
                and (spec.default_prompt_name not in prompts)
            ):
                raise ValueError(
                    f"default_prompt_name {spec.default_prompt_name!r} of model {served!r} "
                    "is not one of its prompts"
                )
        return self

    def served_name(self) -> str:
        return self.model_name or default_name(self.model)

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """The models to serve: ``models``, or the one the single-model settings describe."""
        if self.models:
            return self.models
        return (
            ModelSpec(
                model=self.model,
                name=self.model_name,
                dtype=self.dtype,
                quantization=self.quantization,
                max_seq_length=self.max_seq_length,
                pooling=self.pooling,
                truncation_direction=self.truncation_direction,
                prompts=self.prompts,
                default_prompt_name=self.default_prompt_name,
                kind=self.model_kind,
            ),
        )
