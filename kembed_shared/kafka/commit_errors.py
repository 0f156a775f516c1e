"""Which offset-commit failures a consumer may shrug off, and which must stop the process.

A commit that fails leaves the offsets where they were, and the records after them are
processed again by whoever owns the partition next: harmless for kembed's consumers, whose
writes are idempotent (the sink) or deduplicated (the worker). So a failed commit is
*benign* when the client repairs itself and a later commit can succeed, and *fatal* when
every later commit will fail the same way: then the consumer would keep working while its
offsets never move, and the only useful thing left is to say so once and exit, for the
orchestrator to restart it (and an operator to fix the cause).

Benign (:func:`commit_error_is_fatal` is false):

- ``CommitFailedError``: aiokafka raises it for REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION
  and UNKNOWN_MEMBER_ID, after it has already asked its coordinator to rejoin the group
  (``request_rejoin``, or ``reset_generation``: a fresh member id, generation -1). The next
  poll rejoins, the rebalance listener sees the partitions move, and commits for the
  partitions still owned succeed under the new generation. UNKNOWN_MEMBER_ID is therefore
  no dead end here: it means the coordinator expelled this member (a session timeout, or
  ``max_poll_interval_ms`` exceeded), and joining again as a new member is the cure. The
  bare ``RebalanceInProgressError``, ``IllegalGenerationError`` and ``UnknownMemberIdError``
  (raised by a client that does not wrap them) are benign for the same reason.
- ``IllegalStateError``: the partitions to commit are no longer assigned (a rebalance took
  them between the choice of offsets and the commit); their next owner replays.
- ``KafkaTimeoutError``, and any other Kafka error aiokafka marks retriable (coordinator
  moving, a request timed out): aiokafka already retries those inside ``commit``; one that
  escapes is worth another try.

Fatal (true): everything else, and in particular

- ``GroupAuthorizationFailedError``, ``TopicAuthorizationFailedError``,
  ``ClusterAuthorizationFailedError``, ``TransactionalIdAuthorizationFailed``: an ACL was
  removed (or never granted). Rejoining does not restore a right; the broker answers the
  same until an operator acts.
- ``ProducerFenced``, ``InvalidProducerEpoch``, ``TransactionCoordinatorFenced``: a
  transactional commit whose producer was replaced by another with the same transactional
  id (or whose transaction timed out); aiokafka's producer is unusable after it.
- a fenced static member (FENCED_INSTANCE_ID): aiokafka has no class for error 82 and
  raises ``UnknownError`` for it, which is fatal here like every unknown broker error.
  (aiokafka commits with OffsetCommit v2/v3, which carry no group instance id, so a static
  member replaced by a twin gets UNKNOWN_MEMBER_ID instead, rejoins and fences the twin in
  turn: a ping-pong no single error reveals. A caller that counts benign failures, and
  gives up when commits keep failing for longer than a rebalance can take, covers it.)
- ``OffsetMetadataTooLargeError``, ``InvalidCommitOffsetSizeError``, ``IllegalOperation``,
  ``ValueError``, any non-Kafka exception: the request itself is wrong, and sending it
  again changes nothing.

A consumer that meets a fatal failure raises :class:`FatalCommitError`, a
:class:`~kembed_shared.ports.KafkaAccessError` (so it ends the process like a refused login or a
missing ACL found at start-up: one error event, exit status 1).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiokafka import errors as kafka_errors
from structlog.typing import FilteringBoundLogger

from kembed_shared.ports import KafkaAccessError, TopicPartition

__all__ = [
    "CommitFailures",
    "FatalCommitError",
    "commit_error_hint",
    "commit_error_is_fatal",
    "log_commit_retried",
]

_REBALANCE: tuple[type[BaseException], ...] = (
    kafka_errors.CommitFailedError,
    kafka_errors.RebalanceInProgressError,
    kafka_errors.IllegalGenerationError,
    kafka_errors.UnknownMemberIdError,
    kafka_errors.IllegalStateError,
)
_BENIGN = (*_REBALANCE, kafka_errors.KafkaTimeoutError)
_AUTHORIZATION: tuple[type[BaseException], ...] = (
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailed,
)
_FENCED: tuple[type[BaseException], ...] = (
    kafka_errors.ProducerFenced,
    kafka_errors.InvalidProducerEpoch,
    kafka_errors.TransactionCoordinatorFenced,
)


def commit_error_is_fatal(exc: BaseException) -> bool:
    """Whether every later commit will fail like this one (see the module's docstring):
    true for authorization errors, fenced producers, unknown broker errors and anything
    that is not a Kafka error; false for a group rebalance, a timeout and retriable Kafka
    errors."""
    if isinstance(exc, _BENIGN):
        return False
    if isinstance(exc, _AUTHORIZATION + _FENCED):
        return True
    return not (isinstance(exc, kafka_errors.KafkaError) and exc.retriable)


def commit_error_hint(exc: BaseException) -> str:
    """One line for the operator: what the failure means and what to do. It names the
    error's type only (never its text, which can be long or carry broker detail)."""
    name = type(exc).__name__
    if isinstance(exc, _AUTHORIZATION):
        right = {
            kafka_errors.TransactionalIdAuthorizationFailed: "WRITE on the transactional id",
            kafka_errors.ClusterAuthorizationFailedError: "the cluster right it needs",
        }.get(type(exc), "READ on the consumer group and the topic")
        return (
            f"{name}: the principal may no longer commit offsets (an ACL was removed?): "
            f"grant it {right} again"
        )
    if isinstance(exc, _FENCED):
        return (
            f"{name}: another producer took over this transactional id, or its transaction "
            "timed out"
        )
    if isinstance(exc, _REBALANCE):
        return f"{name}: the group is rebalancing; the partitions' next owner replays"
    if not commit_error_is_fatal(exc):
        return f"{name}: a passing failure; the commit is tried again"
    return f"{name}: the commit failed, and retrying will not help"


def log_commit_retried(
    log: FilteringBoundLogger, exc: BaseException, partitions: Iterable[TopicPartition]
) -> None:
    """Say (``commit.failed``, a warning) that a commit failed in a way a later commit can
    cure: its type, :func:`commit_error_hint`, and the partitions whose offsets stay
    pending."""
    log.warning(
        "commit.failed",
        error=type(exc).__name__,
        reason=commit_error_hint(exc),
        partitions=sorted(f"{topic}-{partition}" for topic, partition in partitions),
    )


class FatalCommitError(KafkaAccessError):
    """A commit failure that no retry will cure. ``kind``: "authorization" (an ACL is
    missing: the event is ``kafka.authorization_failed``, as for a right found missing at
    start-up) or "commit" (anything else); ``error``: the failure's type name; ``reason``:
    what it means and what to do, never a secret."""

    def __init__(self, kind: str, reason: str, error: str) -> None:
        super().__init__(kind, reason)
        self.error = error

    @classmethod
    def of(cls, exc: BaseException) -> FatalCommitError:
        """The error to raise for ``exc``, a failure :func:`commit_error_is_fatal` judged fatal."""
        kind = "authorization" if isinstance(exc, _AUTHORIZATION) else "commit"
        return cls(kind, commit_error_hint(exc), type(exc).__name__)


class CommitFailures:
    """A consumer's commit failures over time. A failure :func:`commit_error_is_fatal`
    judges fatal is fatal at once; benign ones (a rebalance) become fatal when they go on
    for longer than ``give_up_after_s``: a rebalance ends within the rebalance timeout
    (``max_poll_interval_ms``), so commits still failing "because the group rebalanced"
    after that and a session mean the consumer never gets back in (a twin fencing its
    group instance id, or every batch outlasting ``max_poll_interval_ms``)."""

    def __init__(self, give_up_after_s: float, consumer: str) -> None:
        self._give_up_after = give_up_after_s
        self._consumer = consumer  # "the worker", "the sink": for the reason
        self._since: float | None = None  # time.monotonic() of the first failure in a row

    @classmethod
    def of_group(
        cls, max_poll_interval_ms: int, session_timeout_ms: int, consumer: str
    ) -> CommitFailures:
        """Failures judged against the group timeouts of a consumer's settings."""
        return cls((max_poll_interval_ms + session_timeout_ms) / 1000, consumer)

    def succeeded(self) -> None:
        self._since = None

    def failed(self, exc: BaseException) -> FatalCommitError | None:
        """The error to stop with for ``exc``, or None if the commit is to be retried."""
        if commit_error_is_fatal(exc):
            fatal = FatalCommitError.of(exc)
        else:
            now = time.monotonic()
            since = self._since = self._since or now
            if now - since <= self._give_up_after:
                return None
            fatal = FatalCommitError(
                "commit",
                f"offset commits have failed for {now - since:.0f} s, longer than a rebalance "
                f"may take (last: {commit_error_hint(exc)}): {self._consumer} does not get "
                "back into its group (does every batch outlast max_poll_interval_ms?)",
                type(exc).__name__,
            )
        fatal.__cause__ = exc
        return fatal
