"""Encoders: the interface (``base``) and its torch implementation (imported lazily)."""

from worker.encoder.base import Encoder, ModelInfo

__all__ = ["Encoder", "ModelInfo"]
