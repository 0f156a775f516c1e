"""What travels through the pipeline's rooms: a :class:`Job` (a request being encoded) and a
:class:`Batch` (inputs of one model and lane, prepared for the encoder)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kembed_shared.ports import Record
from schemas import ModelRequest
from worker.batcher import Item
from worker.cache import CacheNote
from worker.encoder import ModelInfo, Prepared
from worker.served import ServedModel

__all__ = ["Admitted", "Batch", "Job"]

Admitted = tuple[Record, ModelRequest, ServedModel]
"""A request decoded and accepted, with its record and the model that answers it."""


@dataclass(eq=False, slots=True)
class Job:
    """A request whose inputs are being encoded; published when ``remaining`` reaches 0."""

    record: Record
    request: ModelRequest
    lane: str
    model: ServedModel
    vectors: npt.NDArray[np.float32]
    tokens: list[int]
    remaining: int
    settled: bool = field(default=False)
    cache_notes: list[CacheNote] = field(default_factory=list)
    """Per input, how the vector cache files it once encoded (empty: cache off)."""
    segments: list[int] | None = None
    """A rerank job's pairs: per pair, its first segment's length (token types)."""


@dataclass(slots=True)
class Batch:
    model: ServedModel
    lane: str
    items: list[Item[Job]]
    prepared: Prepared
    started: float = 0.0
    retry: bool = False
    """Half of a failed batch: it runs before new batches and is never preempted or
    refilled, so that the failing input is isolated in a few steps."""
    ran_as: ModelInfo | None = None
    """The encoder variant that ran it, read on the encoder thread (the vector cache files
    its vectors under it)."""
