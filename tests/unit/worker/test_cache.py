"""The vector cache: its key, its byte bound and LRU order, its SQLite persistence, its
metrics, and the pipeline answering repeated texts from it with the same results.

Pipeline tests run the real pipeline over the fakes of ``test_batch_failures`` (a fake
encoder that records every batch, a word-level tokenizer); the worker with its real model
and broker is in ``tests/integration/test_cache.py``.
"""

from __future__ import annotations

import dataclasses
import gc
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import EmbedRequest, EmbedResult, Encoding, ErrorCode, ErrorResult, Result
from tests.unit.worker.test_batch_failures import (
    REPLIES,
    TOPIC,
    FakeEncoder,
    Harness,
)
from worker.cache import CacheNote, VectorCache, content_key, model_fingerprint, variant_identity
from worker.encoder import ModelInfo
from worker.metrics import Metrics

INFO = ModelInfo("m", Path("/models/m"), 4, 32, "mean", "float32", "cpu")
ENTRY = VectorCache.entry_bytes(bytes(32), bytes(4 * 4))  # one 4-dimension entry


def never_fails(*_: object) -> None:
    return None


def vector(seed: int, dim: int = 4) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


def put(cache: VectorCache, texts: list[str], info: ModelInfo = INFO, name: str = "m") -> None:
    """Store a vector for each text (seeded by its position in ``texts``)."""
    lookup = cache.lookup(name, info, "right", texts)
    cache.store(
        name,
        info,
        (
            (CacheNote(key, False), vector(i, info.dim), 3)
            for i, key in enumerate(lookup.keys or [])
        ),
    )


def hits(
    cache: VectorCache, texts: list[str], info: ModelInfo = INFO, name: str = "m"
) -> list[bool]:
    lookup = cache.lookup(name, info, "right", texts)
    return [hit is not None for hit in lookup.hits or [None] * len(texts)]


# ---------------------------------------------------------------------- the key


def test_the_key_changes_with_every_field_that_determines_the_vector() -> None:
    """Each of the model's name, directory, pooling, dtype, quantization, compilation, token
    limit and dimension changes the identity; the text (prompt included) and the truncation
    side change the content key."""
    base = variant_identity("m", INFO)
    changed = [
        variant_identity("other", INFO),
        variant_identity("m", dataclasses.replace(INFO, path=Path("/models/n"))),
        variant_identity("m", dataclasses.replace(INFO, pooling="cls")),
        variant_identity("m", dataclasses.replace(INFO, dtype="bfloat16")),
        variant_identity("m", dataclasses.replace(INFO, quantization="int8")),
        variant_identity("m", dataclasses.replace(INFO, compiled=True)),
        variant_identity("m", dataclasses.replace(INFO, max_seq_length=16)),
        variant_identity("m", dataclasses.replace(INFO, dim=8)),
    ]
    assert len({base, *changed}) == len(changed) + 1
    # Fields that do not change the vector leave it alone.
    assert variant_identity("m", dataclasses.replace(INFO, device="cuda:0", memory_bytes=7)) == base

    text = content_key("a text", "right")
    others = [
        content_key("a text ", "right"),
        content_key("query: a text", "right"),  # a prompt is part of the tokenized text
        content_key("a text", "left"),
    ]
    assert len({text, *others}) == len(others) + 1
    assert content_key("a text", "right") == text


def test_the_model_fingerprint_follows_the_files_and_the_revision(tmp_path: Path) -> None:
    """Replacing a model's config or weights, or another snapshot (revision) of it,
    changes the fingerprint; the same files give the same one."""
    fingerprints = []
    for n, (config, weights) in enumerate(
        [("{}", b"w" * 8), ('{"x": 1}', b"w" * 8), ("{}", b"w" * 9)]
    ):
        directory = tmp_path / f"model{n}"
        directory.mkdir()
        (directory / "config.json").write_text(config)
        (directory / "model.safetensors").write_bytes(weights)
        fingerprints.append(model_fingerprint(directory))
        assert model_fingerprint(directory) == fingerprints[-1]
    assert len(set(fingerprints)) == 3
    revisions = [tmp_path / "hub" / "snapshots" / rev for rev in ("abc", "def")]
    for path in revisions:
        path.mkdir(parents=True)
    assert model_fingerprint(revisions[0]) != model_fingerprint(revisions[1])


# ---------------------------------------------------------------------- bound and order


def test_bytes_are_bounded_and_the_least_recently_used_leaves_first() -> None:
    metrics = Metrics()
    cache = VectorCache(3 * ENTRY, metrics)
    cache.watch("m")
    put(cache, ["a", "b", "c"])
    assert len(cache) == 3
    assert cache.size_bytes == 3 * ENTRY
    assert hits(cache, ["a"]) == [True]  # a is now the most recently used
    put(cache, ["d"])
    assert hits(cache, ["a", "b", "c", "d"]) == [True, False, True, True]
    assert cache.size_bytes == 3 * ENTRY <= cache.max_bytes
    sample = metrics.registry.get_sample_value
    assert sample("kembed_cache_evictions_total", {"model": "m"}) == 1
    assert sample("kembed_cache_bytes", {"model": "m"}) == 3 * ENTRY
    assert sample("kembed_cache_entries", {"model": "m"}) == 3
    # lookups: a b c (put) + a + d (put) + a b c d
    assert sample("kembed_cache_hits_total", {"model": "m"}) == 4
    assert sample("kembed_cache_misses_total", {"model": "m"}) == 5


def test_an_entry_larger_than_the_budget_is_not_kept() -> None:
    cache = VectorCache(ENTRY - 1)
    put(cache, ["a"])
    assert len(cache) == 0
    assert cache.size_bytes == 0


def test_zero_bytes_disables_the_cache() -> None:
    metrics = Metrics()
    cache = VectorCache(0, metrics)
    cache.watch("m")
    lookup = cache.lookup("m", INFO, "right", ["a", "b"])
    assert lookup.misses == ["a", "b"]
    assert lookup.keys is None
    _pieces, notes = lookup.complete([])
    assert notes == []
    cache.store("m", INFO, [(CacheNote(b"k" * 16, False), vector(0), 1)])
    assert len(cache) == 0
    assert metrics.registry.get_sample_value("kembed_cache_misses_total", {"model": "m"}) == 0


def test_the_counted_bytes_are_what_python_allocates() -> None:
    """size_bytes is within 10% of the memory the entries take (tracemalloc), for
    384-dimension vectors (the bundled model's)."""
    info = dataclasses.replace(INFO, dim=384)
    cache = VectorCache(2**30)
    texts = [f"text {i}" for i in range(5000)]
    lookup = cache.lookup("m", info, "right", texts)
    rows = np.random.default_rng(0).standard_normal((len(texts), 384)).astype(np.float32)
    notes = [CacheNote(key, False) for key in lookup.keys or []]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache.store("m", info, ((note, row, 5) for note, row in zip(notes, rows, strict=True)))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    allocated = after - before
    assert abs(cache.size_bytes - allocated) <= 0.1 * allocated, (cache.size_bytes, allocated)


# ---------------------------------------------------------------------- persistence


def test_a_persisted_cache_is_read_back_bit_for_bit(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    cache = VectorCache(10 * ENTRY)
    assert cache.open(path, [("m", INFO.path)]) == 0
    put(cache, ["a", "b", "c"])
    hits(cache, ["a"])  # a: most recently used
    first = cache.lookup("m", INFO, "right", ["a", "b", "c"]).hits
    cache.close()

    again = VectorCache(10 * ENTRY)
    assert again.open(path, [("m", INFO.path)]) == 3
    read = again.lookup("m", INFO, "right", ["a", "b", "c"]).hits
    assert first is not None
    assert read is not None
    for old, new in zip(first, read, strict=True):
        assert old is not None
        assert new is not None
        assert old.vector.tobytes() == new.vector.tobytes()
        assert (old.tokens, old.truncated) == (new.tokens, new.truncated)
    again.close()

    # A smaller budget keeps the most recently used (the last lookup: a, b, c in order).
    small = VectorCache(2 * ENTRY)
    assert small.open(path, [("m", INFO.path)]) == 2
    assert hits(small, ["a", "b", "c"]) == [False, True, True]
    small.close()
    rows = sqlite3.connect(path).execute("SELECT count(*) FROM entries").fetchone()[0]
    assert rows == 2, "the file keeps to the budget too"


def test_another_model_never_reads_a_persisted_cache(tmp_path: Path) -> None:
    """Entries of a model the worker no longer serves are deleted when the file opens; a
    variant of the same model (another dtype) misses."""
    path = tmp_path / "cache.sqlite"
    cache = VectorCache(10 * ENTRY)
    cache.open(path, [("m", INFO.path)])
    put(cache, ["a", "b"])
    cache.close()

    other = VectorCache(10 * ENTRY)
    assert other.open(path, [("m", Path("/models/replaced"))]) == 0
    assert hits(other, ["a", "b"], dataclasses.replace(INFO, path=Path("/models/replaced"))) == [
        False,
        False,
    ]
    other.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM entries").fetchone()[0] == 0

    cache = VectorCache(10 * ENTRY)
    cache.open(path, [("m", INFO.path)])
    put(cache, ["a"])
    cache.close()
    same = VectorCache(10 * ENTRY)
    assert same.open(path, [("m", INFO.path)]) == 1
    assert hits(same, ["a"], dataclasses.replace(INFO, dtype="bfloat16")) == [False]
    assert hits(same, ["a"]) == [True]
    same.close()


def test_evictions_and_touches_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    cache = VectorCache(2 * ENTRY)
    cache.open(path, [("m", INFO.path)])
    put(cache, ["a", "b"])
    hits(cache, ["a"])
    put(cache, ["c"])  # evicts b
    cache.flush()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 2
    cache.close()
    again = VectorCache(2 * ENTRY)
    again.open(path, [("m", INFO.path)])
    assert hits(again, ["a", "b", "c"]) == [True, False, True]
    again.close()


# ---------------------------------------------------------------------- in the pipeline


def options(**fields: object) -> list[EmbedRequest]:
    texts = ("w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w1 w2 w3")
    return [EmbedRequest(id="x", inputs=texts, reply_to=REPLIES, **fields)]  # type: ignore[arg-type]


VARIANTS: list[dict[str, Any]] = [
    {},
    {"normalize": False},
    {"dimensions": 2},
    {"encoding": Encoding.FLOAT16},
    {"encoding": Encoding.INT8},
    {"encoding": Encoding.INT8, "normalize": False},
    {"encoding": Encoding.BINARY, "dimensions": 3},
]


async def answer(
    cache: VectorCache | None, requests: list[list[EmbedRequest]]
) -> tuple[list[dict[str, Result]], FakeEncoder, Harness]:
    """Each wave of requests answered in turn by one pipeline (ids made unique)."""
    encoder = FakeEncoder(never_fails)
    harness = Harness(encoder)
    harness.cache = cache
    if cache is not None:
        cache._metrics = harness.metrics
    waves = []
    async with harness as h:
        for n, wave in enumerate(requests):
            h.requests.clear()
            h.publisher.sent.clear()
            h.send(
                [(dataclasses.replace(r, id=f"{n}-{i}"), (TOPIC, 0)) for i, r in enumerate(wave)]
            )
            waves.append(await h.answers())
    return waves, encoder, harness


async def test_repeated_texts_are_answered_from_the_cache_with_the_same_results() -> None:
    """A second wave of the same texts, under every output option, runs nothing on the
    encoder, and each result is byte for byte what a pipeline without cache answers."""
    waves = [options(**variant)[0:1] for variant in VARIANTS]
    cached, encoder, h = await answer(VectorCache(2**20), waves)
    plain, _, _ = await answer(None, waves)
    ran = [row for rows, _ in encoder.calls for row in rows]
    assert len(ran) == 4, "only the first wave's texts are encoded (its repeat too)"
    for with_cache, without in zip(cached, plain, strict=True):
        assert with_cache == without
    sample = h.metrics.registry.get_sample_value
    assert sample("kembed_cache_hits_total", {"model": "fake"}) == 4 * (len(VARIANTS) - 1)
    assert sample("kembed_cache_misses_total", {"model": "fake"}) == 4


async def test_hits_and_misses_in_one_request_keep_their_order() -> None:
    first = [EmbedRequest(id="a", inputs=("w1 w2", "w3"), reply_to=REPLIES)]
    mixed = [EmbedRequest(id="b", inputs=("w9", "w3", "w8 w7", "w1 w2", "w6"), reply_to=REPLIES)]
    (_, answer_mixed), encoder, h = await answer(VectorCache(2**20), [first, mixed])
    result = answer_mixed["1-0"]
    assert isinstance(result, EmbedResult)
    h.ids["1-0"] = [p.ids for p in h.tokenizer.encode(mixed[0].inputs)]
    h.check_vectors(result)
    assert result.tokens == (1, 1, 2, 2, 1)
    second_wave = [row for rows, _ in encoder.calls[-1:] for row in rows]
    assert sorted(len(row) for row in second_wave) == [1, 1, 2], "only the misses ran"


async def test_prompt_and_truncation_side_are_part_of_the_key() -> None:
    base = EmbedRequest(id="a", inputs=("w1 w2 w3",), reply_to=REPLIES)
    waves = [
        [base],
        [dataclasses.replace(base, prompt="w9 ")],
        [dataclasses.replace(base, truncation_direction="left")],
        [base],
    ]
    _, encoder, h = await answer(VectorCache(2**20), waves)
    assert len(encoder.calls) == 3
    assert h.metrics.registry.get_sample_value("kembed_cache_hits_total", {"model": "fake"}) == 1


async def test_a_cached_truncated_text_still_fails_a_request_that_forbids_truncation() -> None:
    long_text = " ".join(f"w{i}" for i in range(40))  # over the fake model's 32 tokens
    waves = [
        [EmbedRequest(id="a", inputs=(long_text,), reply_to=REPLIES)],
        [EmbedRequest(id="b", inputs=("w1", long_text), reply_to=REPLIES, truncate=False)],
    ]
    (first, second), _, _h = await answer(VectorCache(2**20), waves)
    assert isinstance(first["0-0"], EmbedResult)
    refused = second["1-0"]
    assert isinstance(refused, ErrorResult)
    assert refused.error.code == ErrorCode.INPUT_TOO_LONG
    assert refused.error.index == 1


async def test_a_pipeline_with_a_zero_byte_cache_encodes_every_time() -> None:
    waves = [options()[0:1], options()[0:1]]
    _, encoder, _ = await answer(VectorCache(0), waves)
    assert sum(len(rows) for rows, _ in encoder.calls) == 8


def test_a_file_that_is_no_cache_is_started_afresh(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    path.write_bytes(b"not a database, " * 512)
    cache = VectorCache(10 * ENTRY)
    assert cache.open(path, [("m", INFO.path)]) == 0
    put(cache, ["a"])
    cache.close()
    again = VectorCache(10 * ENTRY)
    assert again.open(path, [("m", INFO.path)]) == 1
    again.close()
