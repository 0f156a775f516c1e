"""What :meth:`EmbedClient.rerank <producer_sdk.EmbedClient.rerank>` returns: a
cross-encoder's relevance score per document, and the documents by score.

    reranked = await client.rerank("what is kafka?", documents, top_n=3)
    for index, score, _ in reranked.results:      # the best three, highest score first
        print(score, documents[index])
    reranked.scores                               # float32 (len(documents),), input order

The wire result is in ``schemas/README.md``, "Reranking".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from schemas import RerankResult

__all__ = ["RankedDocument", "Reranked"]


class RankedDocument(NamedTuple):
    """One entry of :attr:`Reranked.results`: a document's index in the request, its
    score, and its text when ``return_documents`` asked for it (else None)."""

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, on purpose
    score: float
    document: str | None


@dataclass(frozen=True, slots=True)
class Reranked:
    """The scores for one rerank call."""

    scores: npt.NDArray[np.float32]
    """One score per document, in the documents' order (float32): after the model's
    activation (sigmoid for a one-label cross-encoder), or its logits with ``raw_scores``."""
    order: tuple[int, ...]
    """Document indices by score, highest first (ties: the lower index first); the best
    ``top_n`` of them, all without ``top_n``."""
    tokens: tuple[int, ...]
    """Tokens per (query, document) pair after truncation, special tokens included."""
    model: str
    """The model that scored them."""
    documents: tuple[str, ...] | None = None
    """With ``return_documents``: the text of each document ``order`` names, in that order."""

    @classmethod
    def from_result(cls, result: RerankResult) -> Reranked:
        scores = np.frombuffer(result.scores, dtype="<f4").astype(np.float32)
        return cls(
            scores=scores,
            order=result.order,
            tokens=result.tokens,
            model=result.model,
            documents=result.documents,
        )

    def __len__(self) -> int:
        """How many documents were scored."""
        return len(self.tokens)

    @property
    def results(self) -> list[RankedDocument]:
        """``(index, score, document)`` for each document ``order`` names, best first."""
        texts: Sequence[str | None] = self.documents or [None] * len(self.order)
        return [
            RankedDocument(index, float(self.scores[index]), text)
            for index, text in zip(self.order, texts, strict=True)
        ]
