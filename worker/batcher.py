"""Batch stage: group waiting inputs into token-budgeted, length-homogeneous batches.

Cost model: a padded encoder computes ``len(batch) * longest`` tokens, so a batch is built
around the oldest waiting input (which bounds every input's wait) from its neighbours in
length order, adding at each step the neighbour that wastes the fewest padded tokens, until
the next one would exceed ``max_batch_tokens`` or ``max_batch_size``. An input longer than
the budget still forms a batch of its own: nothing can wait forever.

The core (:class:`Batcher`) is pure and synchronous; the pipeline decides *when* to cut a
batch (:meth:`Batcher.ready`) and runs the encoder. :class:`TokenBudget` is the pure rule
by which a batcher's ``max_batch_tokens`` shrinks after a batch runs out of memory and
grows back.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["BULK", "INTERACTIVE", "Batcher", "Item", "LaneScheduler", "TokenBudget"]

J = TypeVar("J")


@dataclass(slots=True, eq=False)
class Item(Generic[J]):
    """One input waiting to be encoded: input ``index`` of request ``job``."""

    job: J
    index: int
    ids: Sequence[int]
    enqueued: float
    seq: int = field(default=0)
    length: int = field(init=False)
    """``len(ids)``, kept: batching reads it many times per input."""

    def __post_init__(self) -> None:
        self.length = len(self.ids)


class Batcher(Generic[J]):
    def __init__(self, max_batch_tokens: int, max_batch_size: int, window: int = 0) -> None:
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError("batch limits must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        # How many of the oldest inputs are candidates for one batch: enough to find
        # similar lengths, bounded so that building a batch stays cheap.
        self.window = window or max(4 * max_batch_size, 256)
        self._waiting: dict[int, Item[J]] = {}  # insertion-ordered: oldest first
        self._seq = 0
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def waiting_tokens(self) -> int:
        return self._tokens

    def add(self, item: Item[J]) -> None:
        item.seq = self._seq
        self._seq += 1
        self._waiting[item.seq] = item
        self._tokens += item.length

    def put_back(self, items: list[Item[J]]) -> None:
        """Return a batch that was cut but not run; items keep their age and place."""
        returned = sorted((item.seq, item) for item in items)
        self._tokens += sum(item.length for _, item in returned)
        # Keep oldest-first order, which the window and oldest_enqueued rely on (a linear
        # merge: both sides are already in order).
        merged = heapq.merge(returned, self._waiting.items(), key=lambda pair: pair[0])
        self._waiting = dict(merged)

    def oldest_enqueued(self) -> float | None:
        for item in self._waiting.values():
            return item.enqueued
        return None

    def ready(self, now: float, max_wait: float) -> bool:
        """Whether a batch should be cut now: it would be full, or the oldest waited enough."""
        oldest = self.oldest_enqueued()
        if oldest is None:
            return False
        if now - oldest >= max_wait or len(self._waiting) >= self.max_batch_size:
            return True
        longest = max(item.length for item in self._waiting.values())
        return len(self._waiting) * longest >= self.max_batch_tokens

    def next_batch(self, max_tokens: int | None = None) -> list[Item[J]]:
        """Remove and return the next batch (empty if nothing waits); ``max_tokens`` lowers
        the token budget for this batch only."""
        if not self._waiting:
            return []
        budget = min(self.max_batch_tokens, max_tokens or self.max_batch_tokens)
        candidates = self._window()
        oldest = candidates[0]  # the window is oldest first
        candidates.sort(key=_LENGTH_SEQ)
        lengths = [it.length for it in candidates]
        lo = bisect.bisect_left(lengths, oldest.length)
        while candidates[lo] is not oldest:
            lo += 1
        hi = lo + 1  # the batch is candidates[lo:hi]
        longest = oldest.length
        while hi - lo < self.max_batch_size:
            # Shorter neighbour: padded to `longest`. Longer neighbour: everyone padded more.
            size = hi - lo + 1
            left_ok = lo > 0 and size * longest <= budget
            right_ok = hi < len(lengths) and size * lengths[hi] <= budget
            if left_ok and right_ok:
                waste_left = longest - lengths[lo - 1]
                waste_right = (hi - lo) * (lengths[hi] - longest)
                left_ok = waste_left <= waste_right
                right_ok = not left_ok
            if left_ok:
                lo -= 1
            elif right_ok:
                longest = lengths[hi]
                hi += 1
            else:
                break
        batch = candidates[lo:hi]
        for item in batch:
            del self._waiting[item.seq]
            self._tokens -= item.length
        return batch

    def _window(self) -> list[Item[J]]:
        """The ``window`` oldest inputs, oldest first."""
        if len(self._waiting) <= self.window:
            return list(self._waiting.values())
        return list(itertools.islice(self._waiting.values(), self.window))


_LENGTH_SEQ = operator.attrgetter("length", "seq")


INTERACTIVE = "interactive"
BULK = "bulk"


class LaneScheduler(Generic[J]):
    """Two lanes of batchers per model: interactive work first, bulk never starved.

    When both lanes have a batch ready, interactive batches go first, but after
    ``bulk_every - 1`` interactive batches in a row the next one is bulk, so a flood of
    interactive traffic still leaves bulk ingestion at least 1/``bulk_every`` of the batches.

    A running batch cannot be interrupted, so while interactive inputs keep arriving (one
    came within ``interactive_recent_s``) bulk batches are cut at ``busy_bulk_tokens``: an
    interactive input then waits behind at most one short bulk batch.

    A worker serving several models has one pair of lanes per model (a batch holds one
    model's inputs) and one encoder for all: the rules above hold across models, the
    interactive batch chosen is the model whose oldest interactive input waited longest,
    and models with bulk work take bulk turns in rotation.
    """

    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_size: int,
        bulk_every: int,
        busy_bulk_tokens: int | None = None,
        interactive_recent_s: float = 1.0,
        models: Sequence[str] = ("",),
        max_seq_lengths: Mapping[str, int] | None = None,
        budget_restore_s: float = 60.0,
    ) -> None:
        if bulk_every < 1:
            raise ValueError("bulk_every must be >= 1")
        if not models or len(set(models)) != len(models):
            raise ValueError("models must be distinct names, at least one")
        self.models = tuple(models)
        self._batchers: dict[tuple[str, str], Batcher[J]] = {
            (model, lane): Batcher(max_batch_tokens, max_batch_size)
            for model in self.models
            for lane in (INTERACTIVE, BULK)
        }
        self.budgets = {
            key: TokenBudget(
                max_batch_tokens, (max_seq_lengths or {}).get(key[0], 1), budget_restore_s
            )
            for key in self._batchers
        }
        """Per (model, lane), the effective ``max_batch_tokens`` (:class:`TokenBudget`):
        lowered by :meth:`out_of_memory`, raised again by :meth:`succeeded`."""
        self.bulk_every = bulk_every
        self.busy_bulk_tokens = busy_bulk_tokens
        self.interactive_recent_s = interactive_recent_s
        self._last_interactive = float("-inf")
        self._interactive_streak = 0
        self._bulk_owed = False
        self._bulk_turn = 0

    def lane(self, lane: str, model: str = "") -> Batcher[J]:
        return self._batchers[model, lane]

    def out_of_memory(
        self, lane: str, model: str, padded_tokens: int, now: float
    ) -> TokenBudget | None:
        """A batch of ``padded_tokens`` of ``model``'s ``lane`` ran out of memory: lower
        that batcher's budget (the budget, when it changed)."""
        budget = self.budgets[model, lane]
        return self._apply(lane, model) if budget.out_of_memory(padded_tokens, now) else None

    def succeeded(self, lane: str, model: str, now: float) -> TokenBudget | None:
        """A batch of ``model``'s ``lane`` ran: raise a lowered budget one step when its
        quiet while is over (the budget, when it changed)."""
        budget = self.budgets[model, lane]
        return self._apply(lane, model) if budget.succeeded(now) else None

    def _apply(self, lane: str, model: str) -> TokenBudget:
        budget = self.budgets[model, lane]
        self._batchers[model, lane].max_batch_tokens = budget.tokens
        return budget

    def add(self, lane: str, item: Item[J], model: str = "") -> None:
        self._batchers[model, lane].add(item)
        if lane == INTERACTIVE:
            self._last_interactive = max(self._last_interactive, item.enqueued)

    def put_back(self, lane: str, items: list[Item[J]], model: str = "") -> None:
        self._batchers[model, lane].put_back(items)

    def refill(self, lane: str, items: list[Item[J]], model: str = "") -> list[Item[J]]:
        """Cut a not-yet-running batch of ``lane`` again, now that more inputs wait there;
        lane accounting is unchanged (it is still the same turn)."""
        batcher = self._batchers[model, lane]
        batcher.put_back(items)
        return batcher.next_batch()

    def preemptible(self, lane: str, now: float, max_wait: float) -> bool:
        """Whether a cut but not yet running batch of ``lane`` should yield to interactive
        work that became ready (of any model): only a bulk batch that was not owed to bulk's
        share."""
        return (
            lane == BULK and not self._bulk_owed and bool(self._ready(INTERACTIVE, now, max_wait))
        )

    def ready(self, lane: str, now: float, max_wait: float, model: str | None = None) -> bool:
        """Whether ``lane`` has a batch ready, for ``model`` or (None) for any model."""
        if model is not None:
            return self._batchers[model, lane].ready(now, max_wait)
        return bool(self._ready(lane, now, max_wait))

    def _ready(self, lane: str, now: float, max_wait: float) -> list[str]:
        return [m for m in self.models if self._batchers[m, lane].ready(now, max_wait)]

    def wake_at(self, prepared_lane: str | None, max_wait: float) -> float | None:
        """When the next scheduling decision can change by the clock alone: with nothing
        prepared, when some lane's oldest input reaches its maximum wait; with a preemptible
        bulk batch prepared, when interactive work does; otherwise never (only new work or a
        finished batch can change it)."""
        if prepared_lane is None:
            lanes = list(self._batchers.values())
        elif prepared_lane == BULK and not self._bulk_owed:
            lanes = [self._batchers[m, INTERACTIVE] for m in self.models]
        else:
            return None
        oldest = [t for lane in lanes if (t := lane.oldest_enqueued()) is not None]
        return min(oldest) + max_wait if oldest else None

    def next_batch(self, now: float, max_wait: float) -> tuple[str, list[Item[J]]] | None:
        """The lane and items of the next batch, or None when no lane is ready (for a
        single-model scheduler; see :meth:`next_model_batch`)."""
        chosen = self.next_model_batch(now, max_wait)
        return None if chosen is None else (chosen[1], chosen[2])

    def next_model_batch(
        self, now: float, max_wait: float
    ) -> tuple[str, str, list[Item[J]]] | None:
        """The model, lane and items of the next batch, or None when no lane is ready."""
        interactive = self._ready(INTERACTIVE, now, max_wait)
        bulk = self._ready(BULK, now, max_wait)
        if interactive and not (bulk and self._interactive_streak >= self.bulk_every - 1):
            self._interactive_streak += 1
            model = min(interactive, key=self._oldest_interactive)
            return model, INTERACTIVE, self._batchers[model, INTERACTIVE].next_batch()
        if bulk:
            self._bulk_owed = bool(interactive)  # chosen over ready interactive work
            self._interactive_streak = 0
            busy = now - self._last_interactive < self.interactive_recent_s
            cap = self.busy_bulk_tokens if busy else None
            model = self._next_bulk_model(bulk)
            return model, BULK, self._batchers[model, BULK].next_batch(cap)
        return None

    def _oldest_interactive(self, model: str) -> float:
        oldest = self._batchers[model, INTERACTIVE].oldest_enqueued()
        return float("inf") if oldest is None else oldest

    def _next_bulk_model(self, ready: list[str]) -> str:
        """Models with bulk work ready take turns, in the order they were configured."""
        count = len(self.models)
        for step in range(count):
            model = self.models[(self._bulk_turn + step) % count]
            if model in ready:
                self._bulk_turn = (self.models.index(model) + 1) % count
                return model
        raise AssertionError("no bulk-ready model")  # unreachable: ``ready`` is non-empty


class TokenBudget:
    """The effective ``max_batch_tokens`` of one batcher (a model's lane), which drops when
    a batch runs out of memory and comes back after a quiet while.

    Out of memory, the budget becomes half the smaller of itself and the failed batch's
    padded tokens, never below ``floor`` (one input of the model's maximum length: smaller
    batches would not fit such an input anyway, and an input above the budget still forms a
    batch of its own). Once ``restore_after_s`` pass without another out-of-memory error, a
    successful batch doubles it, step by step (one step per ``restore_after_s``), up to
    ``ceiling`` (the configured budget). Memory may have been short for a while only (a
    fragmented device, another process on it), so the worker probes its way back rather
    than staying slow for good; each probe that fails costs one split batch.
    """

    def __init__(self, ceiling: int, floor: int, restore_after_s: float) -> None:
        if ceiling < 1 or restore_after_s < 0:
            raise ValueError("a token budget needs a positive ceiling and a non-negative delay")
        self.ceiling = ceiling
        self.floor = max(1, min(floor, ceiling))
        self.restore_after_s = restore_after_s
        self.tokens = ceiling
        self._changed_at = float("-inf")

    @property
    def lowered(self) -> bool:
        return self.tokens < self.ceiling

    def out_of_memory(self, padded_tokens: int, now: float) -> bool:
        """A batch of ``padded_tokens`` ran out of memory at ``now``: lower the budget, and
        restart the quiet while. True when the budget changed."""
        self._changed_at = now
        target = max(self.floor, min(self.tokens, padded_tokens) // 2)
        if target >= self.tokens:
            return False
        self.tokens = target
        return True

    def succeeded(self, now: float) -> bool:
        """A batch ran at ``now``: raise a lowered budget one step when the quiet while is
        over. True when the budget changed."""
        if not self.lowered or now - self._changed_at < self.restore_after_s:
            return False
        self.tokens = min(self.ceiling, self.tokens * 2)
        self._changed_at = now
        return True
