"""Encoders: the interface (``base``) and its torch implementation (imported lazily)."""

from worker.encoder.base import Encoder, EncoderOutOfMemoryError, ModelInfo, Prepared

__all__ = ["Encoder", "EncoderOutOfMemoryError", "ModelInfo", "Prepared"]
