"""Which store writes to a target: one line per kind of database.

Each entry of :data:`STORES` (its key is the kind, ``TargetSpec.kind``) says which URI
schemes name that database and how its URIs read (a grammar from ``sink.targets``), which
module holds its store and which pip extra installs its client, and what the database can
do that not all can (schema-qualified tables, an index built after a bulk load). The
store's module is imported only when a sink writes there, so ``kembed sink --help`` and the
settings' checks work without the extra; this module imports no database client. Each
store builds itself from the sink's settings (``from_settings``): the options it takes are
its own.

A new database is its store module plus its line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import SecretStr

from sink.store import TargetError
from sink.targets import TargetParser, TargetSpec, libpq_target, milvus_target, server_target

__all__ = ["STORES", "StoreEntry", "able", "parse_target"]


@dataclass(frozen=True, slots=True)
class StoreEntry:
    title: str
    """The database's name in messages."""
    module: str
    """The module that holds the store (and imports its database client)."""
    store: str
    """The store class in it."""
    extra: str
    """The pip extra that installs the client: ``pip install 'kembed[EXTRA]'``."""
    schemes: tuple[str, ...]
    """The URI schemes (lower case) that name this database."""
    forms: tuple[str, ...]
    """Its URIs as the error for an unknown scheme spells them."""
    parse: TargetParser = server_target
    """How its URIs read (``sink.targets``)."""
    files: tuple[str, ...] = ()
    """Suffixes of scheme-less paths that name a local file of this database."""
    schema_tables: bool = False
    """Tables may be schema-qualified (``schema.table``)."""
    index_after: bool = False
    """The vector index can be left to build after a bulk load (``index: after``)."""

    def load(self) -> object:
        """The store class (a ``from_settings`` factory). TargetError, naming the extra,
        when its database client is not installed."""
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if exc.name is None or f"{self.module}.".startswith(f"{exc.name}."):
                raise
            raise TargetError(
                f"{self.title} targets need the {exc.name} package: "
                f"pip install 'kembed[{self.extra}]'"
            ) from None
        return getattr(module, self.store)


STORES: dict[str, StoreEntry] = {
    "postgres": StoreEntry(
        "Postgres", "sink.postgres", "PostgresStore", "sink",
        schemes=("postgres", "postgresql"), forms=("postgresql://",), parse=libpq_target,
        schema_tables=True, index_after=True,
    ),
    "milvus": StoreEntry(
        "Milvus", "sink.milvus", "MilvusStore", "sink",
        schemes=("milvus", "http", "https"),
        forms=("milvus:///file.db", "http(s)://host:19530", "milvus://host:19530"),
        parse=milvus_target, files=(".db",),
    ),
}  # fmt: skip


def parse_target(target: str, password: SecretStr | None = None) -> TargetSpec:
    """The target a URI names; ValueError (whose text holds no password) when unusable.
    ``password`` (the ``target_password`` setting) wins over one in the URI."""
    text = target.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    for kind, entry in STORES.items():
        if scheme in entry.schemes:
            return entry.parse(kind, parts, password)
    if not scheme:
        for kind, entry in STORES.items():
            if entry.files and text.endswith(entry.files):
                return TargetSpec(kind, text, lite=True)
    shown = f"{scheme}://..." if scheme else "a URI without a scheme"
    forms = [form for entry in STORES.values() for form in entry.forms]
    raise ValueError(f"target {shown} is not supported: use {', '.join(forms[:-1])} or {forms[-1]}")


def able(ability: Callable[[StoreEntry], bool]) -> str:
    """The databases with an ability (``lambda entry: entry.schema_tables``), as a message
    names them: "Postgres", "Postgres or Milvus"."""
    return " or ".join(entry.title for entry in STORES.values() if ability(entry))
