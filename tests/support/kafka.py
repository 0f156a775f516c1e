"""Stand-ins for the Kafka ports (``kembed_shared.ports``): a consumer and a publisher in
memory, for the unit tests of the worker's pipeline and delivery and of the sink."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from kembed_shared.ports import PublishError, Record, TopicPartition

__all__ = ["FakePublisher", "FakeSource", "FakeTransactions"]


class FakeSource:
    """A consumer group member: each poll hands out the next queued wave of records (or
    nothing within the poll's timeout), and commits are recorded in order. ``commit_error``
    is raised by every commit while it is set (each try counts in ``attempts``);
    ``member`` is what :meth:`in_group` says."""

    def __init__(self, partitions: Iterable[TopicPartition] = ()) -> None:
        self.owned: set[TopicPartition] = set(partitions)
        self.waves: asyncio.Queue[list[Record]] = asyncio.Queue()
        self.commits: list[dict[TopicPartition, int]] = []
        self.attempts = 0
        self.commit_error: Exception | None = None
        self.member = True

    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        try:
            return await asyncio.wait_for(self.waves.get(), timeout_ms / 1000)
        except TimeoutError:
            return []

    def assignment(self) -> set[TopicPartition]:
        return set(self.owned)

    def pause(self, partitions: set[TopicPartition]) -> None:
        pass

    def resume(self, partitions: set[TopicPartition]) -> None:
        pass

    def lag(self) -> dict[TopicPartition, int]:
        return {}

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.attempts += 1
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(dict(offsets))

    def in_group(self) -> bool:
        return self.member


class FakePublisher:
    """Records each message sent (topic, value, headers); ``more`` is set after each.
    ``on_send(topic, headers)``, when given, sees each message first (a call log)."""

    def __init__(self, on_send: Callable[[str, dict[str, bytes]], None] | None = None) -> None:
        self.sent: list[tuple[str, bytes, dict[str, bytes]]] = []
        self.more = asyncio.Event()
        self._on_send = on_send

    async def send(self, topic: str, value: bytes, **options: Any) -> None:
        """The port's ``send``; of its keywords (key, partition, headers) headers are noted."""
        headers = dict(options.get("headers", ()))
        if self._on_send is not None:
            self._on_send(topic, headers)
        self.sent.append((topic, value, headers))
        self.more.set()


class FakeTransactions:
    """A transactional producer: records what it was asked to do, as a list of events;
    ``fail_send_to``, ``max_value_bytes``, ``fail_commit`` and ``hang_commit`` make it fail."""

    def __init__(
        self,
        topics: Mapping[str, int] | None = None,
        destination_failures: Sequence[PublishError] = (),
    ) -> None:
        self.topics = dict(topics or {"embed.results": 2, "embed.requests.dlq": 1, "r": 1})
        self.destination_failures = list(destination_failures)
        """Raised by the next destination checks, one each, before the topics are asked."""
        self.checked = 0
        self.events: list[tuple[Any, ...]] = []
        self.fail_send_to: str | None = None
        self.max_value_bytes: int | None = None  # larger messages are refused
        self.fail_commit = False
        self.hang_commit = False
        self.open = False
        self.begun: list[float] = []
        self.committed: list[float] = []

    async def check_destination(self, topic: str, partition: int | None) -> None:
        self.checked += 1
        if self.destination_failures:
            raise self.destination_failures.pop(0)
        if topic not in self.topics:
            raise PublishError(f"topic {topic!r} is not available", retriable=False)
        if partition is not None and not 0 <= partition < self.topics[topic]:
            raise PublishError(f"partition {partition} does not exist", retriable=False)

    async def begin(self) -> None:
        assert not self.open, "one transaction at a time"
        self.open = True
        self.events.append(("begin",))
        self.begun.append(time.monotonic())

    async def send(self, topic: str, value: bytes, **options: Any) -> Awaitable[object]:
        """The port's ``send``; of its keywords (key, partition, headers) headers are noted."""
        assert self.open, "a message outside a transaction"
        self.events.append(("send", topic, value, dict(options.get("headers", ()))))
        delivered: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        too_large = self.max_value_bytes is not None and len(value) > self.max_value_bytes
        if topic == self.fail_send_to or too_large:
            delivered.set_exception(RuntimeError("the broker refused the message"))
        else:
            delivered.set_result(None)
        return delivered

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        assert self.open
        self.events.append(("offsets", dict(offsets), group_id))

    async def commit(self) -> None:
        assert self.open
        if self.hang_commit:
            await asyncio.sleep(3600)
        if self.fail_commit:
            raise RuntimeError("commit failed")
        self.open = False
        self.events.append(("commit",))
        self.committed.append(time.monotonic())

    async def abort(self) -> None:
        self.open = False
        self.events.append(("abort",))

    def sent_topics(self) -> list[str]:
        """The topic of each message sent, in order."""
        return [event[1] for event in self.events if event[0] == "send"]

    def transactions(self) -> list[list[tuple[Any, ...]]]:
        """Committed transactions, each as its events between begin and commit."""
        done: list[list[tuple[Any, ...]]] = []
        current: list[tuple[Any, ...]] = []
        for event in self.events:
            if event[0] == "begin":
                current = []
            elif event[0] == "commit":
                done.append(current)
            else:
                current.append(event)
        return done
