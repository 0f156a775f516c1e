"""The retrieval measurement's pure parts: the corpus it builds and how it scores."""

from __future__ import annotations

import numpy as np

from loadtest.chunk_retrieval import accuracy, build_corpus, long_document
from loadtest.data import load_stsb


def test_each_query_has_its_paraphrase_in_exactly_its_document() -> None:
    corpus = build_corpus(5, 20, 3, seed=2)
    assert len(corpus.documents) == 5
    assert len(corpus.queries) == len(corpus.answers) == 15
    firsts = {pair.second: pair.first for pair in load_stsb() if pair.score >= 4.0}
    for query, answer in zip(corpus.queries, corpus.answers, strict=True):
        paraphrase = firsts[query].strip().rstrip(".!?")
        holding = [d for d, text in enumerate(corpus.documents) if paraphrase in text]
        assert holding == [answer]
        assert query.strip().rstrip(".!?") not in corpus.documents[answer]


def test_accuracy_scores_a_document_by_its_best_row() -> None:
    """Query 0 is nearest to a chunk of document 1 (not to its mean), query 1 to document 0."""
    queries = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    documents = [
        np.array([[0.6, 0.8]], np.float32),
        np.array([[0.0, -1.0], [1.0, 0.0]], np.float32),
    ]
    assert accuracy(queries, documents, [1, 0]) == 1.0
    assert accuracy(queries, documents, [0, 0]) == 0.5


def test_long_document_has_the_words_asked_for() -> None:
    text = long_document(20_000)
    assert 20_000 <= len(text.split()) < 20_100
