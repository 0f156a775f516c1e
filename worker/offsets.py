"""Which offsets are safe to commit: per partition, up to the first unanswered record.

Results are published out of order (batches mix partitions, short requests overtake long
ones), so a partition's committable offset is the lowest offset still in flight, or one past
the highest offset seen when nothing is. Committing that never skips an unanswered request:
a crash redelivers everything from it, and answers already sent are duplicates that clients
drop by request id.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable

from kembed_shared.ports import TopicPartition

__all__ = ["OffsetTracker"]


class _Partition:
    __slots__ = ("heap", "high", "outstanding")

    def __init__(self) -> None:
        self.outstanding: set[int] = set()  # offsets received and not answered
        self.heap: list[int] = []  # min-heap over outstanding (answered ones popped lazily)
        self.high = -1  # highest offset seen


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _Partition] = {}

    def track(self, tp: TopicPartition, offset: int) -> None:
        """Record that ``offset`` was received and is not answered yet (idempotent)."""
        part = self._partitions.setdefault(tp, _Partition())
        if offset not in part.outstanding:
            part.outstanding.add(offset)
            heapq.heappush(part.heap, offset)
        part.high = max(part.high, offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        """Record that ``offset`` is answered; unknown offsets and partitions are ignored."""
        part = self._partitions.get(tp)
        if part is None or offset not in part.outstanding:
            return
        part.outstanding.discard(offset)
        while part.heap and part.heap[0] not in part.outstanding:
            heapq.heappop(part.heap)

    def committable(self, tp: TopicPartition) -> int | None:
        """The offset to commit for ``tp`` (next to read), or None if nothing was seen."""
        part = self._partitions.get(tp)
        if part is None or part.high < 0:
            return None
        return part.heap[0] if part.heap else part.high + 1

    def first_unanswered(self, tp: TopicPartition, ready: Container[int]) -> int | None:
        """The lowest offset of ``tp`` in flight and not in ``ready``; None if there is none.

        The offset ``committable`` would give once the records in ``ready`` are answered
        (if any in flight remains): answers below it may be committed, those above must
        wait for it. Walks the heap in order, so it costs O(k log k) for the k offsets
        below the result (answered ones still in the heap included)."""
        part = self._partitions.get(tp)
        if part is None:
            return None
        heap = part.heap
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            offset, index = heapq.heappop(frontier)
            if offset in part.outstanding and offset not in ready:
                return offset
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return None

    def in_flight(self, tps: Iterable[TopicPartition] | None = None) -> int:
        """How many records are unanswered, in ``tps`` or in all partitions."""
        keys = self._partitions.keys() if tps is None else tps
        return sum(len(p.outstanding) for tp in keys if (p := self._partitions.get(tp)) is not None)

    def partitions(self) -> list[TopicPartition]:
        return list(self._partitions)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop revoked partitions: their new owner resumes from the last commit."""
        for tp in tps:
            self._partitions.pop(tp, None)
