"""Encoders: the interface (``base``) and its torch implementation (imported lazily)."""

from worker.encoder.base import Encoder, ModelInfo, Prepared

__all__ = ["Encoder", "ModelInfo", "Prepared"]
