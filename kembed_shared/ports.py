"""What the pipeline needs from the outside world, as data and Protocols.

Only ``kembed_shared.kafka`` implements these with aiokafka; the stages and their tests see these
types alone, so a stage can be tested with a fake source and publisher.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "KafkaAccessError",
    "PublishError",
    "Publisher",
    "Record",
    "Source",
    "TopicPartition",
    "TransactionalPublisher",
]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    key: bytes | None = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


class PublishError(Exception):
    """A message could not be written; ``reason`` is safe to log and to put in a header."""

    def __init__(self, reason: str, *, retriable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


class KafkaAccessError(Exception):
    """Kafka refused the worker: ``kind`` is "authentication" (login or TLS handshake
    rejected), "authorization" (the principal lacks an ACL), "tls" (the TLS files cannot
    be loaded) or "commit" (offset commits refused for good:
    ``kembed_shared.kafka.commit_errors.FatalCommitError``). Retrying will not help, so the worker
    stops; ``reason`` says what to fix and never holds a secret."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind} failed: {reason}")
        self.kind = kind
        self.reason = reason


class Publisher(Protocol):
    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Return once the broker acknowledged the message; raise PublishError otherwise."""
        ...


@runtime_checkable
class TransactionalPublisher(Protocol):
    """A producer whose messages and consumer offsets are committed atomically, or not at all.

    One transaction at a time: ``begin``, any number of ``send`` and one ``send_offsets``,
    then ``commit`` (or ``abort``). A message sent outside a transaction is an error.
    """

    async def check_destination(self, topic: str, partition: int | None) -> None:
        """Raise PublishError if ``topic``, or ``partition`` of it, cannot be written; the
        check a message must pass before it may join a transaction. Not retriable: the topic
        or partition does not exist, or may not be written; retriable: the broker did not
        say in time (restarting, unreachable)."""
        ...

    async def begin(self) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Awaitable[object]:
        """Queue a message in the open transaction; the awaitable completes when the broker
        has it (it is visible to read_committed readers only after ``commit``)."""
        ...

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        """Add next-offsets-to-read of ``group_id`` to the open transaction."""
        ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...


class Source(Protocol):
    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, partitions: set[TopicPartition]) -> None: ...

    def resume(self, partitions: set[TopicPartition]) -> None: ...

    def lag(self) -> dict[TopicPartition, int]:
        """Per assigned partition whose positions are known: messages not yet fetched."""
        ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the given next-offsets-to-read (Kafka's convention)."""
        ...

    def in_group(self) -> bool:
        """False once the consumer knows it was expelled from its group (its partitions are
        lost, not handed over): its answers must then not be committed."""
        ...
