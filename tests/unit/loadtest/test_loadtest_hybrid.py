"""The hybrid retrieval benchmark's pure parts: the paraphrase corpus, reciprocal-rank
fusion and the retrieval scores."""

from __future__ import annotations

import pytest

from loadtest.hybrid import build_corpus, rrf, scores


def test_the_corpus_holds_each_querys_paraphrase_once_among_distinct_documents() -> None:
    corpus = build_corpus(300, 60, seed=3)
    assert len(corpus.documents) == 300
    assert len(set(corpus.documents)) == 300
    assert len(corpus.queries) == len(corpus.answers) == 60
    assert len(set(corpus.answers)) == 60
    assert not set(corpus.queries) & set(corpus.documents)
    again = build_corpus(300, 60, seed=3)
    assert again == corpus
    assert build_corpus(300, 60, seed=4).documents != corpus.documents
    with pytest.raises(ValueError, match="queries asked"):
        build_corpus(10, 20)


def test_rrf_sums_reciprocal_ranks_and_breaks_ties_by_the_best_rank() -> None:
    # 7: 1/61 + 1/63 = 0.032266; 3: 2/62 = 0.032258; 5: 1/61; 9: 1/63.
    assert rrf([[7, 3, 9], [5, 3, 7]], k=60) == [7, 3, 5, 9]
    # With a small k the head counts more: 7 (1/2 + 1/4) beats 3 (2/3).
    assert rrf([[7, 3, 9], [5, 3, 7]], k=1)[:3] == [7, 3, 5]
    assert rrf([[1, 2], [2, 1]]) == [1, 2]  # equal sums: the lower document first
    assert rrf([[], [4]]) == [4]


def test_scores_count_top1_recall_and_reciprocal_rank() -> None:
    rankings = [[1, 2, 3], [5, 4], list(range(20)), []]
    result = scores(rankings, [1, 4, 15, 0])
    assert result.top1 == pytest.approx(1 / 4)
    assert result.recall_at_10 == pytest.approx(2 / 4)  # 15 is past the tenth
    assert result.mrr_at_10 == pytest.approx((1 + 1 / 2) / 4)
