"""Offset-commit failures: which a consumer shrugs off, which stop it
(kembed_shared.kafka.commit_errors), on the exceptions aiokafka really raises."""

from __future__ import annotations

import pytest
from aiokafka import errors as kafka_errors

from kembed_shared.kafka.commit_errors import commit_error_hint, commit_error_is_fatal


def _commit_failed(cause: BaseException) -> BaseException:
    """What aiokafka's ``commit`` raises for a group error: CommitFailedError from it."""
    wrapped: BaseException = kafka_errors.CommitFailedError()
    wrapped.__cause__ = cause
    return wrapped


@pytest.mark.parametrize(
    "exc",
    [
        _commit_failed(kafka_errors.RebalanceInProgressError("g")),
        _commit_failed(kafka_errors.IllegalGenerationError("g")),
        _commit_failed(kafka_errors.UnknownMemberIdError("g")),
        kafka_errors.RebalanceInProgressError("g"),
        kafka_errors.IllegalGenerationError("g"),
        kafka_errors.UnknownMemberIdError("g"),
        kafka_errors.IllegalStateError(
            "Partition TopicPartition(topic='t', partition=0) is not assigned"
        ),
        kafka_errors.KafkaTimeoutError(),
        kafka_errors.RequestTimedOutError(),
        kafka_errors.NotCoordinatorForGroupError(),
        kafka_errors.GroupCoordinatorNotAvailableError(),
        kafka_errors.KafkaConnectionError("connection lost"),
    ],
    ids=lambda exc: f"{type(exc).__name__}({type(exc.__cause__).__name__})",
)
def test_a_rebalance_or_a_passing_failure_is_benign(exc: BaseException) -> None:
    """aiokafka rejoins the group by itself after these (or retries them): a later commit
    can succeed, so the consumer goes on."""
    assert not commit_error_is_fatal(exc)
    assert "retrying will not help" not in commit_error_hint(exc)


@pytest.mark.parametrize(
    "exc",
    [
        kafka_errors.GroupAuthorizationFailedError("sinks"),
        kafka_errors.TopicAuthorizationFailedError({"embed.results.docs"}),
        kafka_errors.ClusterAuthorizationFailedError(),
        kafka_errors.TransactionalIdAuthorizationFailed("kembed-worker-0"),
        kafka_errors.ProducerFenced(),
        kafka_errors.InvalidProducerEpoch(),
        kafka_errors.TransactionCoordinatorFenced(),
        kafka_errors.UnknownError(),  # FENCED_INSTANCE_ID (82) reaches aiokafka users as this
        kafka_errors.for_code(82)(),
        kafka_errors.OffsetMetadataTooLargeError(),
        kafka_errors.InvalidCommitOffsetSizeError(),
        kafka_errors.IllegalOperation("Requires group_id"),
        ValueError("bad offsets"),
        RuntimeError("anything else"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_lost_rights_fencing_and_unknown_failures_are_fatal(exc: BaseException) -> None:
    """Every later commit would fail the same way: the consumer must stop."""
    assert commit_error_is_fatal(exc)


def test_hints_say_what_to_fix_and_name_only_the_type() -> None:
    revoked = kafka_errors.GroupAuthorizationFailedError("sinks")
    assert commit_error_hint(revoked).startswith("GroupAuthorizationFailedError: ")
    assert commit_error_hint(revoked).endswith(
        "grant it READ on the consumer group and the topic again"
    )
    transactional = kafka_errors.TransactionalIdAuthorizationFailed("kembed-worker-0")
    assert "WRITE on the transactional id" in commit_error_hint(transactional)
    fenced = commit_error_hint(kafka_errors.ProducerFenced())
    assert "transactional id" in fenced
    rebalance = _commit_failed(kafka_errors.RebalanceInProgressError("g"))
    assert "rebalancing" in commit_error_hint(rebalance)
    # CommitFailedError's own text is a paragraph of advice: the hint does not repeat it.
    assert "max_poll_interval_ms" not in commit_error_hint(rebalance)
    assert commit_error_hint(kafka_errors.KafkaTimeoutError()) == (
        "KafkaTimeoutError: a passing failure; the commit is tried again"
    )
    assert commit_error_hint(ValueError("secret-ish detail")) == (
        "ValueError: the commit failed, and retrying will not help"
    )
