"""A failing batch costs only the request whose input fails alone.

The pipeline runs here as in the worker (its loops, the lane scheduler, the at-least-once
delivery and offset tracking), over a fake source and publisher and a fake encoder whose
failures the tests choose: one that raises on a marked input, one that runs out of memory
above a number of padded tokens. The tokenizer is a real word-level tokenizer, so that an
input's token count is its word count. ``tests/integration/test_batch_failures.py`` shows
the same with the real worker, broker and model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import structlog
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

import worker.pipeline.lifecycle
from kembed_shared.ports import Record, TopicPartition
from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorResult,
    Result,
    decode_result,
)
from schemas.codec import encode_request
from tests.support.kafka import FakePublisher, FakeSource
from worker.batcher import TokenBudget
from worker.cache import VectorCache
from worker.encoder import EncoderOutOfMemoryError, ModelInfo, Prepared
from worker.metrics import Metrics
from worker.pipeline import Pipeline, ServedModel
from worker.settings import WorkerSettings
from worker.tokenization import TextTokenizer

TOPIC = "embed.requests"
BULK_TOPIC = "embed.requests.bulk"
REPLIES = "test.replies"
WORDS = [f"w{i}" for i in range(200)]
VOCAB = {"[PAD]": 0, "[UNK]": 1, "poison": 2, "sibling": 3}
VOCAB |= {word: 10 + i for i, word in enumerate(WORDS)}
POISON, SIBLING = VOCAB["poison"], VOCAB["sibling"]
MAX_SEQ = 32  # the fake model's longest input: the floor of a lowered budget
DIM = 4


def word_tokenizer() -> TextTokenizer:
    tokenizer = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return TextTokenizer(tokenizer, max_length=MAX_SEQ)


def expected_vector(ids: Sequence[int]) -> npt.NDArray[np.float32]:
    """The fake model's embedding of ``ids``, normalized as results are by default."""
    raw = np.array([len(ids), sum(ids), ids[0], ids[-1]], dtype=np.float32)
    normalized: npt.NDArray[np.float32] = raw / np.linalg.norm(raw)
    return normalized


Failure = Callable[[Prepared, list[tuple[int, ...]]], BaseException | None]


class FakeEncoder:
    """Computes :func:`expected_vector` per row, unless ``fail`` says this batch raises.
    Records every batch it was given (rows without padding) and whether it failed."""

    def __init__(self, fail: Failure) -> None:
        self.fail = fail
        self.info = ModelInfo("fake", Path("fake"), DIM, MAX_SEQ, "mean", "float32", "cpu")
        self.calls: list[tuple[list[tuple[int, ...]], bool]] = []

    def prepare(
        self,
        batch: Sequence[Sequence[int]],
        segments: Sequence[int] | None = None,
        pooled_from: Sequence[int] | None = None,
    ) -> Prepared:
        longest = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return Prepared(ids, mask)

    def run(self, prepared: Prepared) -> npt.NDArray[np.float32]:
        rows = [
            tuple(int(t) for t in ids[mask == 1])
            for ids, mask in zip(prepared.ids, prepared.mask, strict=True)
        ]
        error = self.fail(prepared, rows)
        self.calls.append((rows, error is not None))
        if error is not None:
            raise error
        return np.stack([expected_vector(row) for row in rows])

    def encode(self, batch: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        return self.run(self.prepare(batch))


def fails_on_poison(prepared: Prepared, rows: list[tuple[int, ...]]) -> BaseException | None:
    if any(POISON in row for row in rows):
        return RuntimeError("device-side assert triggered")
    return None


def out_of_memory_above(
    tokens: int, error: type[BaseException] = EncoderOutOfMemoryError
) -> Failure:
    def fail(prepared: Prepared, rows: list[tuple[int, ...]]) -> BaseException | None:
        return error("out of memory") if prepared.padded_tokens > tokens else None

    return fail


class Harness:
    """A pipeline over the fakes; :meth:`send` adds a wave of requests, :meth:`answers`
    waits for them."""

    def __init__(
        self, encoder: FakeEncoder, cache: VectorCache | None = None, **settings: Any
    ) -> None:
        self.cache = cache
        partitions = {(topic, p) for topic in (TOPIC, BULK_TOPIC) for p in range(3)}
        self.source = FakeSource(partitions)
        self.publisher = FakePublisher()
        self.encoder = encoder
        self.metrics = Metrics()
        self.settings = WorkerSettings(
            requests_topic=TOPIC,
            bulk_topic=BULK_TOPIC,
            commit_interval_ms=10,
            **settings,
        )
        self.offsets: dict[TopicPartition, int] = {}
        self.requests: dict[str, EmbedRequest] = {}
        self.ids: dict[str, list[list[int]]] = {}
        self.tokenizer = word_tokenizer()

    async def __aenter__(self) -> Harness:
        model = ServedModel(
            "fake", self.encoder, self.tokenizer, requests_topic=TOPIC, bulk_topic=BULK_TOPIC
        )
        self.pipeline = Pipeline(
            source=self.source,
            publisher=self.publisher,
            models=[model],
            settings=self.settings,
            metrics=self.metrics,
            cache=self.cache,
        )
        self.task = asyncio.create_task(self.pipeline.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.pipeline.stop()
        await asyncio.wait_for(self.task, 30)

    def send(self, requests: list[tuple[EmbedRequest, TopicPartition]]) -> None:
        wave = []
        for request, tp in requests:
            offset = self.offsets.get(tp, 0)
            self.offsets[tp] = offset + 1
            value = encode_request(request)
            wave.append(Record(tp[0], tp[1], offset, value, timestamp_ms=1))
            self.requests[request.id] = request
            self.ids[request.id] = [piece.ids for piece in self.tokenizer.encode(request.inputs)]
        self.source.waves.put_nowait(wave)

    async def answers(self, timeout: float = 20.0) -> dict[str, Result]:
        """Every request's answer, once all are in; fails if any came twice."""
        async with asyncio.timeout(timeout):
            while len(self.publisher.sent) < len(self.requests):
                self.publisher.more.clear()
                await self.publisher.more.wait()
        await asyncio.sleep(0.05)  # a duplicate would show up meanwhile
        results = [decode_result(value) for _, value, _ in self.publisher.sent]
        ids = [result.id for result in results]
        assert len(ids) == len(set(ids)), "a request was answered twice"
        assert set(ids) == set(self.requests), set(self.requests) - set(ids)
        return {result.id: result for result in results}

    def check_vectors(self, result: EmbedResult) -> None:
        vectors = np.frombuffer(result.vectors, dtype=np.float32).reshape(-1, result.dim)
        expected = np.stack([expected_vector(ids) for ids in self.ids[result.id]])
        np.testing.assert_allclose(vectors, expected, rtol=1e-6)

    def committed(self) -> dict[TopicPartition, int]:
        last: dict[TopicPartition, int] = {}
        for commit in self.source.commits:
            last.update(commit)
        return last

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def mixed_requests(
    rng: random.Random, count: int, tag: str, topic: str = TOPIC, max_words: int = 30
) -> list[tuple[EmbedRequest, TopicPartition]]:
    """``count`` requests of 1-3 inputs of 1-``max_words`` words, over three partitions."""
    requests = []
    for n in range(count):
        inputs = tuple(text(rng, rng.randint(1, max_words)) for _ in range(rng.randint(1, 3)))
        request = EmbedRequest(id=f"{tag}-{n}", inputs=inputs, reply_to=REPLIES)
        requests.append((request, (topic, n % 3)))
    return requests


async def test_only_the_request_whose_input_fails_alone_gets_internal() -> None:
    """One batch holds every input of 24 requests of mixed lengths from three partitions;
    the encoder raises on any batch with the marked input. The batch is split until the
    marked input runs alone: its request gets ``internal`` naming that input, once; every
    other request gets its vectors, once; the marked request's other input is not computed
    after the failure; every offset is committed."""
    rng = random.Random(7)
    encoder = FakeEncoder(fails_on_poison)
    async with Harness(encoder, max_batch_tokens=8192, max_batch_size=256) as h:
        requests = mixed_requests(rng, 24, "r")
        poisoned = EmbedRequest(
            id="r-marked",
            inputs=("w1 w2 sibling w3", "w4 poison w5", "w6"),
            reply_to=REPLIES,
        )
        requests.insert(9, (poisoned, (TOPIC, 1)))
        with structlog.testing.capture_logs() as logs:
            h.send(requests)
            results = await h.answers()

    inputs = sum(len(request.inputs) for request, _ in requests)
    first_rows, first_failed = encoder.calls[0]
    assert len(first_rows) == inputs, "all inputs must share the first batch"
    assert first_failed

    failure = results.pop("r-marked")
    assert isinstance(failure, ErrorResult)
    assert failure.error.code == ErrorCode.INTERNAL
    assert failure.error.index == 1
    for result in results.values():
        assert isinstance(result, EmbedResult), result
        h.check_vectors(result)

    # Isolated by halving: about two runs per halving, not one per input.
    failed = [rows for rows, failed in encoder.calls if failed]
    assert failed[-1] == [tuple(h.ids["r-marked"][1])]
    assert len(failed) <= 2 + inputs.bit_length()
    alone = next(i for i, (rows, failed) in enumerate(encoder.calls) if failed and len(rows) == 1)
    assert not any(SIBLING in row for rows, _ in encoder.calls[alone + 1 :] for row in rows)

    assert h.committed() == h.offsets
    assert h.sample("kembed_batch_splits_total", lane="interactive", reason="error") >= 2
    assert h.sample("kembed_requests_total", model="fake", outcome="internal") == 1
    assert h.sample("kembed_requests_total", model="fake", outcome="ok") == 24
    assert h.sample("kembed_effective_batch_tokens", model="fake", lane="interactive") == 8192

    events = [entry["event"] for entry in logs]
    assert "batch.split" in events
    assert "batch.budget_lowered" not in events
    (failed_event,) = [entry for entry in logs if entry["event"] == "request.failed"]
    assert failed_event["request_id"] == "r-marked"
    assert failed_event["index"] == 1
    assert "poison" not in repr(logs), "logs must not contain request text"


async def test_bulk_requests_of_a_failed_batch_are_answered_with_their_vectors() -> None:
    """Ingestion requests (bulk lane, with keys): a failing batch answers ``internal`` only
    to the request with the marked input; the others' results carry their vectors and keys,
    so a sink stores them rather than dead-lettering whole requests."""
    rng = random.Random(11)
    encoder = FakeEncoder(fails_on_poison)
    async with Harness(encoder, max_batch_tokens=8192) as h:
        requests = []
        for request, tp in mixed_requests(rng, 12, "b", topic=BULK_TOPIC):
            keys = tuple(f"{request.id}/{i}" for i in range(len(request.inputs)))
            requests.append((dataclasses.replace(request, keys=keys), tp))
        poisoned = EmbedRequest(
            id="b-marked", inputs=("w9 w8", "w7 poison"), reply_to=REPLIES, keys=("p0", "p1")
        )
        requests.insert(5, (poisoned, (BULK_TOPIC, 2)))
        h.send(requests)
        results = await h.answers()

    failure = results.pop("b-marked")
    assert isinstance(failure, ErrorResult)
    assert (failure.error.code, failure.error.index, failure.keys) == (
        ErrorCode.INTERNAL,
        1,
        ("p0", "p1"),
    )
    for result in results.values():
        assert isinstance(result, EmbedResult), result
        assert result.keys == h.requests[result.id].keys
        h.check_vectors(result)
    assert h.committed() == h.offsets
    assert h.sample("kembed_batch_splits_total", lane="bulk", reason="error") >= 1


@pytest.mark.parametrize("error", [EncoderOutOfMemoryError, MemoryError])
async def test_out_of_memory_splits_and_lowers_the_lanes_token_budget(
    error: type[BaseException],
) -> None:
    """The encoder runs out of memory above 600 padded tokens, under a budget of 1024. Every
    request gets its vectors; the failed batch's halves pass; the lane's budget drops to at
    most half the failed batch (metric and log event); a later wave is cut within the
    lowered budget and never fails."""
    limit = 600
    rng = random.Random(3)
    encoder = FakeEncoder(out_of_memory_above(limit, error))
    async with Harness(encoder, max_batch_tokens=1024, max_batch_size=64) as h:
        with structlog.testing.capture_logs() as logs:
            h.send(mixed_requests(rng, 30, "first"))
            first = await h.answers()
            calls = len(encoder.calls)
            h.send(mixed_requests(rng, 30, "second"))
            second = await h.answers()

    for result in [*first.values(), *second.values()]:
        assert isinstance(result, EmbedResult), result
        h.check_vectors(result)
    failed = [rows for rows, failed in encoder.calls[:calls] if failed]
    assert failed
    budget = h.sample("kembed_effective_batch_tokens", model="fake", lane="interactive")
    assert MAX_SEQ <= budget <= len(failed[0]) * max(map(len, failed[0])) // 2
    later = encoder.calls[calls:]
    assert later
    assert not any(failed for _, failed in later)
    assert all(len(rows) * max(map(len, rows)) <= budget for rows, _ in later)
    assert h.sample("kembed_batch_splits_total", lane="interactive", reason="out_of_memory") >= 1
    assert h.sample("kembed_effective_batch_tokens", model="fake", lane="bulk") == 1024
    lowered = [entry for entry in logs if entry["event"] == "batch.budget_lowered"]
    assert lowered
    assert lowered[-1]["tokens"] == budget
    assert lowered[-1]["lane"] == "interactive"
    assert h.committed() == h.offsets


async def test_an_input_too_big_alone_gets_internal_and_the_rest_their_vectors() -> None:
    """Out of memory even alone (an input longer than the encoder can take): that request
    gets ``internal`` (out of memory), once; the others of its batch get their vectors."""
    rng = random.Random(5)
    encoder = FakeEncoder(out_of_memory_above(20))
    async with Harness(encoder, max_batch_tokens=4096) as h:
        requests = mixed_requests(rng, 10, "s", max_words=8)
        huge = EmbedRequest(id="s-huge", inputs=("w1", text(rng, 25)), reply_to=REPLIES)
        requests.insert(4, (huge, (TOPIC, 0)))
        h.send(requests)
        results = await h.answers()
    failure = results.pop("s-huge")
    assert isinstance(failure, ErrorResult)
    assert (failure.error.code, failure.error.index) == (ErrorCode.INTERNAL, 1)
    assert "out of memory" in failure.error.message
    for result in results.values():
        assert isinstance(result, EmbedResult), result
        h.check_vectors(result)
    assert h.committed() == h.offsets


async def test_a_lowered_budget_is_restored_after_a_quiet_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once batches stop running out of memory, the budget doubles back, one step per
    quiet while, to max_batch_tokens (log events batch.budget_restored)."""
    monkeypatch.setattr(worker.pipeline.lifecycle, "_BUDGET_RESTORE_S", 0.05)
    rng = random.Random(9)
    memory = {"limit": 600}

    def fail(prepared: Prepared, rows: list[tuple[int, ...]]) -> BaseException | None:
        return EncoderOutOfMemoryError() if prepared.padded_tokens > memory["limit"] else None

    encoder = FakeEncoder(fail)
    async with Harness(encoder, max_batch_tokens=1024, max_batch_size=64) as h:
        with structlog.testing.capture_logs() as logs:
            h.send(mixed_requests(rng, 30, "low"))
            await h.answers()
            low = h.sample("kembed_effective_batch_tokens", model="fake", lane="interactive")
            before = len(logs)
            memory["limit"] = 1 << 30
            for wave in range(12):
                await asyncio.sleep(0.06)
                h.send(mixed_requests(rng, 2, f"w{wave}"))
                await h.answers()
    assert any(failed for _, failed in encoder.calls)
    assert low <= 512
    assert h.sample("kembed_effective_batch_tokens", model="fake", lane="interactive") == 1024
    restored = [e["tokens"] for e in logs[before:] if e["event"] == "batch.budget_restored"]
    assert restored == sorted(restored)
    assert restored[-1] == 1024


def test_token_budget_halves_to_a_floor_and_doubles_back_after_quiet_whiles() -> None:
    budget = TokenBudget(ceiling=2048, floor=256, restore_after_s=60)
    assert not budget.lowered
    assert budget.out_of_memory(2000, now=0)  # half the failed batch
    assert budget.tokens == 1000
    assert budget.out_of_memory(700, now=1)  # the failed batch was under the budget
    assert budget.tokens == 350
    assert budget.out_of_memory(350, now=2)
    assert budget.tokens == 256  # the floor
    assert not budget.out_of_memory(300, now=3)  # at the floor: unchanged
    assert not budget.succeeded(now=62)  # 59 s since the last out of memory
    assert budget.succeeded(now=63)
    assert budget.tokens == 512
    assert not budget.succeeded(now=100)
    assert budget.succeeded(now=123)
    assert budget.tokens == 1024
    assert budget.succeeded(now=183)
    assert budget.tokens == 2048
    assert not budget.lowered
    assert not budget.succeeded(now=1000)


def test_token_budget_floor_is_never_above_the_ceiling() -> None:
    budget = TokenBudget(ceiling=128, floor=512, restore_after_s=0)
    assert budget.floor == 128
    assert not budget.out_of_memory(128, now=0)
    assert budget.tokens == 128


# ---------------------------------------------------------------------------- torch encoder


@pytest.fixture(scope="module")
def torch_encoder() -> Any:
    from worker.encoder.models import resolve_model_dir
    from worker.encoder.torch_backend import TorchEncoder

    model_dir = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    return TorchEncoder(model_dir, "m", device="cpu", dtype="float32")


def _cpu_allocation_failure() -> BaseException:
    """The error torch's CPU allocator raises when memory runs out, produced for real."""
    import torch

    try:
        torch.empty(1 << 50, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("a petabyte was allocated")


def _cuda_out_of_memory() -> BaseException:
    import torch

    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize(
    "make_error",
    [_cuda_out_of_memory, _cpu_allocation_failure, MemoryError],
    ids=["cuda", "cpu-allocator", "MemoryError"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_torch_encoder_reports_out_of_memory_as_encoder_out_of_memory(
    torch_encoder: Any,
    monkeypatch: pytest.MonkeyPatch,
    make_error: Callable[[], BaseException],
    compiled: bool,
) -> None:
    """The pipeline sees EncoderOutOfMemoryError (and no torch type); a compiled model is
    not dropped to eager for it, since the batch, not the compiler, was at fault."""
    error = make_error()

    def forward_pooled(*args: object) -> object:
        raise error

    monkeypatch.setattr(torch_encoder, "_forward_pooled", forward_pooled)
    monkeypatch.setattr(torch_encoder.current, "compiled", compiled)
    with pytest.raises(EncoderOutOfMemoryError) as raised:
        # Over 64 padded tokens: a compiled variant runs its compiled forward for this.
        torch_encoder.encode([[101] + [7592] * 40 + [102]] * 2)
    assert raised.value.__cause__ is error
    assert torch_encoder.current.compiled is compiled


def test_torch_encoder_passes_other_errors_on_unchanged(
    torch_encoder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = RuntimeError("index out of range in self")

    def forward_pooled(*args: object) -> object:
        raise error

    monkeypatch.setattr(torch_encoder, "_forward_pooled", forward_pooled)
    with pytest.raises(RuntimeError) as raised:
        torch_encoder.encode([[101, 102]])
    assert raised.value is error
