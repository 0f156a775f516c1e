"""A sentence-transformers model folder, read as sentence-transformers reads it (no torch).

``modules.json`` lists the modules a text goes through: a Transformer, a Pooling, then any
Dense and Normalize modules, in order. kembed runs exactly those; a folder with any other
module, or of another sentence-transformers model type (a sparse or multi-vector encoder),
is refused with :class:`UnsupportedModelError` naming it, never served as something else.
Both folder formats are read:

- pooling mode: version 5 (and earlier) sets one of the ``pooling_mode_<mode>_token(s)``
  flags, version 6 names it in ``pooling_mode``;
- length limit: version 5 keeps ``max_seq_length`` in ``sentence_bert_config.json``,
  version 6 the tokenizer's ``model_max_length`` (``tokenizer_config.json``);
- module types: ``sentence_transformers.models.<Type>`` in version 5,
  ``sentence_transformers.<package>.modules.<module>.<Type>`` in version 6.

A plain Hugging Face folder (no ``modules.json``) is a Transformer with mean pooling, as
sentence-transformers makes of it. :func:`usable_positions` is the window the position
embeddings allow, family by family (RoBERTa's positions start after its padding index).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DENSE_ACTIVATIONS",
    "DenseLayer",
    "ModelFolder",
    "length_limit",
    "UnsupportedModelError",
    "read_folder",
    "usable_positions",
]

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len")
"""kembed's names for the pooling modes it runs (``worker.encoder.pooling``)."""

_LEGACY_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_MODE_NAMES = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "lasttoken": "lasttoken",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "mean_sqrt_len": "mean_sqrt_len",
    "weightedmean": "weightedmean",
}

DENSE_ACTIVATIONS = ("Identity", "Tanh", "Sigmoid", "ReLU", "GELU", "SiLU")
"""The torch.nn activations a Dense module may name (``torch.nn.<Name>``)."""
_TORCH_PREFIXES = ("torch.nn.", "torch.nn.modules.activation.", "torch.nn.modules.linear.")

_MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
_ROBERTA_FAMILY = (
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "data2vec-text",
    "mpnet",
)
_TYPE_NAMES = {
    "SparseEncoder": "a sparse encoder (SPLADE-style)",
    "MultiVectorEncoder": "a multi-vector encoder (ColBERT-style)",
    "CrossEncoder": "a cross-encoder",
}


class UnsupportedModelError(ValueError):
    """A model folder kembed cannot serve as sentence-transformers would: the message is one
    line naming the module, type or setting."""


@dataclass(frozen=True, slots=True)
class DenseLayer:
    """A ``Dense`` module: ``activation(x @ W.T + b)``, its weights in ``path``."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str
    """One of :data:`DENSE_ACTIVATIONS`."""


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """What the folder's modules do after the transformer, and its limits."""

    pooling: str = "mean"
    include_prompt: bool = True
    """False: the Pooling module leaves the prompt's tokens out (INSTRUCTOR, GRIT and
    LLM2Vec-style models): the first ``prompt_length`` positions are masked out of the
    pooling only (the transformer still sees them), as sentence-transformers does."""
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = False
    """A ``Normalize`` module ends the stack (the request's ``normalize``: see
    ``worker.encoder.head``)."""
    truncate_dim: int | None = None
    """``config_sentence_transformers.json`` ``truncate_dim``: vectors cut to it."""
    max_seq_length: int | None = None
    """The length limit the folder sets, wherever its version keeps it (None: none)."""
    modules: tuple[str, ...] = ("Transformer", "Pooling")

    def output_dim(self, hidden: int) -> int:
        """The vector's length for a transformer of ``hidden`` units."""
        dim = self.dense[-1].out_features if self.dense else hidden
        return min(dim, self.truncate_dim) if self.truncate_dim else dim


def read_folder(model_dir: Path) -> ModelFolder:
    """The folder's module stack; UnsupportedModelError for a module, model type or
    setting kembed does not run."""
    _refuse_multi_vector(model_dir)
    st_config = _json(model_dir / "config_sentence_transformers.json")
    model_type = st_config.get("model_type")
    if isinstance(model_type, str) and model_type != "SentenceTransformer":
        what = _TYPE_NAMES.get(model_type, f"model type {model_type!r}")
        if model_type == "SparseEncoder":
            raise UnsupportedModelError(
                f"{model_dir.name}: {what} is not an embedding model: serve it as kind sparse"
            )
        raise UnsupportedModelError(f"{model_dir.name}: {what} is not served by kembed")
    truncate_dim = st_config.get("truncate_dim")
    if truncate_dim is not None and (not isinstance(truncate_dim, int) or truncate_dim < 1):
        raise UnsupportedModelError(f"{model_dir.name}: truncate_dim must be a positive int")
    limit = length_limit(model_dir)
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return ModelFolder(truncate_dim=truncate_dim, max_seq_length=limit)
    pooling, include_prompt, normalize = None, True, False
    dense: list[DenseLayer] = []
    kinds: list[str] = []
    for entry in json.loads(modules_path.read_text()):
        kind = _module_kind(model_dir, entry)
        where = model_dir / str(entry.get("path", ""))
        expected = _next_kinds(kinds)
        if kind not in expected:
            order = " -> ".join([*kinds, kind])
            raise UnsupportedModelError(
                f"{model_dir.name}: modules in the order {order} are not supported "
                "(kembed runs Transformer -> Pooling -> Dense... -> Normalize)"
            )
        kinds.append(kind)
        if kind == "Pooling":
            pooling, include_prompt = _pooling(_json(where / "config.json"), model_dir.name)
        elif kind == "Dense":
            dense.append(_dense(where, model_dir.name))
        elif kind == "Normalize":
            normalize = True
    if pooling is None:
        raise UnsupportedModelError(
            f"{model_dir.name}: modules.json has no Pooling module (token vectors, not one "
            "vector per text: not served by kembed)"
        )
    return ModelFolder(
        pooling, include_prompt, tuple(dense), normalize, truncate_dim, limit, tuple(kinds)
    )


def usable_positions(config: dict[str, Any]) -> int | None:
    """How many tokens the position embeddings of ``config`` (``config.json``) can place;
    None when the model has no such limit (T5's relative positions). RoBERTa-family models
    (and MPNet) number positions from ``pad_token_id + 1``, so 514 positions hold 512
    tokens."""
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(positions, int) or positions <= 0:
        return None
    if config.get("model_type") in _ROBERTA_FAMILY:
        pad = config.get("pad_token_id")
        return positions - (int(pad) if isinstance(pad, int) else 1) - 1
    return positions


def _module_kind(model_dir: Path, entry: dict[str, Any]) -> str:
    module = str(entry.get("type", ""))
    package, _, name = module.rpartition(".")
    if package.startswith("sentence_transformers") and name in _MODULE_KINDS:
        return name
    hint = " (ColBERT-style multi-vector output)" if "pylate" in module.lower() else ""
    raise UnsupportedModelError(
        f"{model_dir.name}: the module {module!r}{hint} is not supported; kembed runs "
        f"{', '.join(_MODULE_KINDS)}"
    )


def _next_kinds(kinds: list[str]) -> tuple[str, ...]:
    if not kinds:
        return ("Transformer",)
    last = kinds[-1]
    if last == "Transformer":
        return ("Pooling",)
    if last in ("Pooling", "Dense"):
        return ("Dense", "Normalize")
    return ()  # nothing after Normalize


def _pooling(config: dict[str, Any], name: str) -> tuple[str, bool]:
    mode: Any = config.get("pooling_mode")
    if mode is None:
        flags = [value for key, value in _LEGACY_FLAGS.items() if config.get(key)]
        mode = flags[0] if len(flags) == 1 else flags
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    kembed_mode = _MODE_NAMES.get(mode) if isinstance(mode, str) else None
    if kembed_mode not in POOLING_MODES:
        raise UnsupportedModelError(
            f"{name}: unsupported pooling {mode!r}; kembed pools "
            f"{', '.join(POOLING_MODES)} (one mode)"
        )
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise UnsupportedModelError(f"{name}: include_prompt must be true or false")
    return str(kembed_mode), include_prompt


def _dense(where: Path, name: str) -> DenseLayer:
    config = _json(where / "config.json")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    short = None
    if isinstance(activation, str):
        for prefix in _TORCH_PREFIXES:
            if activation.startswith(prefix) and activation[len(prefix) :] in DENSE_ACTIVATIONS:
                short = activation[len(prefix) :]
    if short is None:
        raise UnsupportedModelError(
            f"{name}: Dense activation {activation!r} is not supported; supported: "
            + ", ".join(f"torch.nn.{a}" for a in DENSE_ACTIVATIONS)
        )
    weights = [
        where / f for f in ("model.safetensors", "pytorch_model.bin") if (where / f).is_file()
    ]
    if not weights:
        raise UnsupportedModelError(f"{name}: {where.name} has no weights file")
    try:
        return DenseLayer(
            weights[0],
            int(config["in_features"]),
            int(config["out_features"]),
            bool(config.get("bias", True)),
            short,
        )
    except (KeyError, TypeError, ValueError):
        message = f"{name}: {where.name}/config.json is not a Dense config"
        raise UnsupportedModelError(message) from None


def length_limit(model_dir: Path) -> int | None:
    """sentence-transformers' ``max_seq_length``: version 5 keeps it in
    ``sentence_bert_config.json``, version 6 as the tokenizer's ``model_max_length``. A
    tokenizer's "no limit" (a huge number) is no limit."""
    value = _json(model_dir / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(value, int) and value > 0:
        return value
    value = _json(model_dir / "tokenizer_config.json").get("model_max_length")
    if isinstance(value, int | float) and 0 < value < 1_000_000:
        return int(value)
    return None


def _refuse_multi_vector(model_dir: Path) -> None:
    config = _json(model_dir / "config.json")
    architectures = config.get("architectures") or []
    if (
        any(isinstance(a, str) and "colbert" in a.lower() for a in architectures)
        or (model_dir / "artifact.metadata").is_file()
    ):
        raise UnsupportedModelError(
            f"{model_dir.name}: a ColBERT-style multi-vector model is not served by kembed "
            "(it would need one vector per token)"
        )


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}
