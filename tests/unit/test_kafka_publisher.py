"""Unit tests for worker.kafka.publisher that need no broker."""

from __future__ import annotations

import logging

from aiokafka.errors import NotEnoughReplicasError, NotLeaderForPartitionError

from worker.kafka.publisher import _ExpectedRetries


def _retry_warning(error: type[Exception]) -> logging.LogRecord:
    return logging.LogRecord(
        "aiokafka.producer.sender",
        logging.WARNING,
        __file__,
        1,
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        ("TopicPartition(topic='embed.results', partition=0)", error),
        None,
    )


def test_only_the_expected_transactional_retry_warning_is_dropped() -> None:
    """The transactional producer's NOT_ENOUGH_REPLICAS retry (a produce racing the previous
    transaction's completion) is not logged; other produce retries still are."""
    expected = _ExpectedRetries()
    assert expected.filter(_retry_warning(NotEnoughReplicasError)) is False
    assert expected.filter(_retry_warning(NotLeaderForPartitionError)) is True
    other = logging.LogRecord("x", logging.WARNING, __file__, 1, "something else", None, None)
    assert expected.filter(other) is True
