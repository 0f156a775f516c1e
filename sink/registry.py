"""Which store writes to a target: one line per kind of database.

A kind (``TargetSpec.kind``, from the target URI's scheme) names the module that holds its
store and the pip extra that installs its client. The module is imported only when a sink
writes there, so ``kembed sink --help`` works without the extra. Each store builds itself
from the sink's settings (``from_settings``): the options it takes are its own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol, cast

from sink.settings import SinkSettings
from sink.store import VectorStore
from sink.targets import TargetSpec

__all__ = ["STORES", "StoreEntry", "make_store"]


class StoreFactory(Protocol):
    def from_settings(self, spec: TargetSpec, settings: SinkSettings) -> VectorStore: ...


@dataclass(frozen=True, slots=True)
class StoreEntry:
    module: str
    """The module that holds the store (and imports its database client)."""
    store: str
    """The store class in it."""
    extra: str
    """The pip extra that installs the client: ``pip install 'kembed[EXTRA]'``."""

    def load(self) -> StoreFactory:
        return cast(StoreFactory, getattr(importlib.import_module(self.module), self.store))


STORES: dict[str, StoreEntry] = {
    "postgres": StoreEntry("sink.postgres", "PostgresStore", "sink"),
    "milvus": StoreEntry("sink.milvus", "MilvusStore", "sink"),
}


def make_store(settings: SinkSettings) -> VectorStore:
    """The store the target URI names."""
    spec = settings.target_spec()
    return STORES[spec.kind].load().from_settings(spec, settings)
