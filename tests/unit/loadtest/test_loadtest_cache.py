"""The cache benchmark's pure parts: the Zipf stream and the LRU replay it is judged by."""

from __future__ import annotations

from collections import Counter

from loadtest.cache import lru_hit_rate, zipf_stream


def test_the_zipf_stream_is_seeded_and_follows_the_exponent() -> None:
    stream = zipf_stream(1000, 50_000, 1.0)
    assert stream == zipf_stream(1000, 50_000, 1.0)
    assert stream != zipf_stream(1000, 50_000, 1.0, seed=8)
    counts = [count for _, count in Counter(stream).most_common()]
    harmonic = sum(1 / rank for rank in range(1, 1001))
    # The most popular item takes ~1/H(1000) of the draws, the second half as much.
    assert abs(counts[0] / len(stream) - 1 / harmonic) < 0.01
    assert abs(counts[1] / counts[0] - 0.5) < 0.1
    flatter = Counter(zipf_stream(1000, 50_000, 0.5)).most_common(1)[0][1]
    assert flatter < counts[0]


def test_the_lru_replay_counts_hits() -> None:
    assert lru_hit_rate([1, 1, 2, 1], 1) == 0.25  # 1 hit: the second 1
    assert lru_hit_rate([1, 2, 1, 3, 2, 1], 2) == 1 / 6  # only the 1 after 2
    stream = zipf_stream(500, 5000, 1.1)
    # Room for everything: only first sightings miss.
    assert lru_hit_rate(stream, 500) == 1 - len(set(stream)) / len(stream)
    assert lru_hit_rate(stream, 25) < lru_hit_rate(stream, 100) < lru_hit_rate(stream, 500)
