"""Bulk inputs are queued for batching in the order their records came, whether a poll's
texts were tokenized on the tokenizer thread (long) or inline (short).

The pipeline runs over the fakes of ``test_batch_failures`` (a fake source and encoder, a
real word-level tokenizer); the encoder records the rows of every batch in the order it ran
them.
"""

from __future__ import annotations

from schemas import EmbedRequest, EmbedResult
from tests.unit.worker.test_batch_failures import (
    BULK_TOPIC,
    REPLIES,
    VOCAB,
    WORDS,
    FakeEncoder,
    Harness,
)


def _never_fails(*_: object) -> None:
    return None


async def test_a_short_poll_does_not_overtake_a_long_poll_still_being_tokenized() -> None:
    """A poll of long bulk texts (tokenized on the tokenizer thread) then a poll of one
    short text (small enough to be tokenized inline): the short text was queued after every
    long one, so the first batch holds long texts only. Before the fix the inline text was
    queued first, became the oldest input, and ran in the first batch: a later request
    overtook a backlog, and one with a deadline could be computed when it should have
    expired behind it."""
    long_texts = tuple(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(20)) for i in range(100))
    assert sum(len(text) for text in long_texts) > 4096  # over the inline limit: the thread
    encoder = FakeEncoder(_never_fails)
    async with Harness(encoder, max_batch_size=16, max_batch_tokens=4096) as h:
        h.send([(EmbedRequest(id="backlog", inputs=long_texts, reply_to=REPLIES), (BULK_TOPIC, 0))])
        h.send([(EmbedRequest(id="late", inputs=("w1",), reply_to=REPLIES), (BULK_TOPIC, 0))])
        results = await h.answers()

    assert all(isinstance(result, EmbedResult) for result in results.values())
    late_row = (VOCAB["w1"],)
    first_rows, _ = encoder.calls[0]
    assert late_row not in first_rows, "the later request ran in the first batch"
    assert len(first_rows) == 16
    assert all(len(row) == 20 for row in first_rows)
    assert sum(rows.count(late_row) for rows, _ in encoder.calls) == 1
