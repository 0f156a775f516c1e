"""Model kinds: what a request asks of a model, and what a model does (its catalog card's
``kind``). A :class:`Kind` is the string it stands for, on the wire and in settings."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Kind"]


class Kind(StrEnum):
    """The kinds of model kembed serves; a request of one kind is answered only by a model
    of the same kind (``wrong_model_kind`` otherwise)."""

    EMBED = "embed"
    """An embedding model: embed requests, answered with vectors."""
    RERANK = "rerank"
    """A cross-encoder: rerank requests ((query, document) pairs), answered with scores."""
    SPARSE = "sparse"
    """A sparse (SPLADE-style) encoder: sparse requests, answered with term weights."""
