"""Stand-ins for the Kafka ports (``kembed_shared.ports``): a consumer and a publisher in
memory, for the unit tests of the worker's pipeline and delivery and of the sink."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from kembed_shared.ports import Record, TopicPartition

__all__ = ["FakePublisher", "FakeSource"]


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
    """Records each message sent (topic, value, headers); ``more`` is set after each."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, bytes]]] = []
        self.more = asyncio.Event()

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        self.sent.append((topic, value, dict(headers)))
        self.more.set()
