"""The model catalog as the gateway sees it: read through the SDK, cached a few seconds.

Every embedding request checks its model against the catalog, and ``/ready`` asks whether
any model is live; one read (a short-lived Kafka consumer) serves them all for
``max_age_s``, and a request whose model the cache knows never waits for one. Concurrent
callers share the read in flight, and a failed read is cached as long as a good one, so an
unreachable Kafka is not asked again by every request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from producer_sdk.catalog import CatalogModel, resolve

__all__ = ["CatalogCache"]

Reader = Callable[[], Awaitable[Sequence[CatalogModel]]]


class CatalogCache:
    def __init__(
        self,
        read: Reader,
        *,
        max_age_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._models: Sequence[CatalogModel] = ()
        self._error: BaseException | None = None
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    async def models(self, max_age_s: float | None = None) -> Sequence[CatalogModel]:
        """The live models, read again when the last read is older than ``max_age_s``
        (default the cache's); raises what the last read raised (CatalogUnavailableError
        when Kafka did not answer)."""
        if self._older_than(self._max_age_s if max_age_s is None else max_age_s):
            await asyncio.shield(self._refresh_in_flight())
        if self._error is not None:
            raise self._error
        return self._models

    async def find(self, model: str) -> CatalogModel | None:
        """The live model ``model`` names (by name or alias). A model the cache holds is
        answered at once, the cache refreshed in the background when old (so no request
        waits for a catalog read while its model is known); one the cache lacks is looked
        up in a catalog at most a second old, so a model that just came up is found."""
        if self._read_at is not None and self._error is None:
            entry = resolve(self._models, model)
            if entry is not None:
                if self._older_than(self._max_age_s):
                    self._refresh_in_flight()
                return entry
        entry = resolve(await self.models(), model)
        if entry is None:
            entry = resolve(await self.models(max_age_s=1.0), model)
        return entry

    def _older_than(self, seconds: float) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= seconds

    def _refresh_in_flight(self) -> asyncio.Task[None]:
        """The read in flight, or a new one: one read at a time."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._refresh(), name="gateway-catalog")
        return self._reading

    async def close(self) -> None:
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)

    async def _refresh(self) -> None:
        try:
            models = await self._read()
        except Exception as exc:  # noqa: BLE001 (kept and raised to every caller until retried)
            self._error = exc
        else:
            self._models, self._error = tuple(models), None
        self._read_at = self._clock()
