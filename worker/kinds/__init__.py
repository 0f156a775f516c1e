"""Model kinds as a seam: what the data path does differently for each kind of model.

The pipeline (``worker.pipeline``) moves inputs, batches and results without knowing what
they are; a :class:`ModelKind` says how a kind's requests become tokenized inputs, how its
batches are prepared for the encoder and how a finished request becomes its result. One
module per kind (:mod:`worker.kinds.embed`, :mod:`worker.kinds.rerank`,
:mod:`worker.kinds.sparse`), found by :func:`kind_of`. A new kind is a schemas message
pair, a module here, an encoder class, one SDK method and one gateway route
(docs/design.md, "Adding a model kind").
"""

from __future__ import annotations

from schemas import Kind
from worker.kinds.base import Finished, ModelKind, Offload, Pieces, Tokenizing
from worker.kinds.embed import EMBED
from worker.kinds.rerank import RERANK
from worker.kinds.sparse import SPARSE
from worker.served import ServedModel

__all__ = ["KINDS", "Finished", "ModelKind", "Offload", "Pieces", "Tokenizing", "kind_of"]

KINDS: dict[Kind, ModelKind] = {EMBED.kind: EMBED, RERANK.kind: RERANK, SPARSE.kind: SPARSE}
"""Every kind the worker serves, by its name."""


def kind_of(model: ServedModel) -> ModelKind:
    """The module of ``model``'s kind."""
    return KINDS[model.kind]
