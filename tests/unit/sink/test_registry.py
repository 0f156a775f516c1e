"""The store registry: every scheme reaches its store, errors keep their words, and a new
database is one module plus one line in ``STORES``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from kembed_shared.settings import describe_errors
from sink.app import make_store
from sink.registry import STORES, StoreEntry, parse_target
from sink.settings import SinkSettings
from sink.store import TargetError
from sink.targets import server_target

# A store module as a new database would bring it: its class builds itself from settings.
_STORE_MODULE = """
from sink.targets import TargetSpec


class VecStore:
    def __init__(self, spec: TargetSpec, table: str, timeout: float) -> None:
        self.spec, self.name, self.timeout = spec, table, timeout

    @classmethod
    def from_settings(cls, spec, settings):
        return cls(spec, settings.table, settings.connect_timeout_s)
"""


@pytest.fixture
def vecdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreEntry]:
    """A database ``vecdb://`` added as a new one would be: its module, its line."""
    (tmp_path / "kembed_vecdb_store.py").write_text(_STORE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = StoreEntry(
        "VecDB", "kembed_vecdb_store", "VecStore", "vecdb",
        schemes=("vecdb",), forms=("vecdb://host:7000",),
    )  # fmt: skip
    monkeypatch.setitem(STORES, "vecdb", entry)
    monkeypatch.delenv("KEMBED_SINK_TARGET", raising=False)
    yield entry
    sys.modules.pop("kembed_vecdb_store", None)


_SCHEMES = [(kind, scheme) for kind, entry in STORES.items() for scheme in entry.schemes]


@pytest.mark.parametrize(("kind", "scheme"), _SCHEMES)
def test_every_scheme_names_its_database_and_every_store_loads(kind: str, scheme: str) -> None:
    spec = parse_target(f"{scheme.upper()}://user:pw@db.example:1234/x")
    assert spec.kind == kind
    assert "pw" not in spec.display
    assert spec.password is not None
    assert spec.password.get_secret_value() == "pw"
    store = STORES[kind].load()
    assert isinstance(store, type)
    assert callable(getattr(store, "from_settings", None))


def test_a_scheme_less_file_is_the_database_whose_suffix_it_has() -> None:
    spec = parse_target(" ./data/docs.db ")
    assert (spec.kind, spec.uri, spec.lite) == ("milvus", "./data/docs.db", True)
    with pytest.raises(ValueError, match="a URI without a scheme is not supported"):
        parse_target("./data/docs.sqlite")


def test_an_unknown_scheme_lists_every_database_form() -> None:
    with pytest.raises(ValueError, match="not supported") as caught:
        parse_target("mysql://u:hunter2@h/db")
    assert str(caught.value) == (
        "target mysql://... is not supported: use postgresql://, milvus:///file.db, "
        "http(s)://host:19530 or milvus://host:19530"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"target": "milvus:///x.db", "table": "s.t"},
         "table: a schema-qualified name is for Postgres targets only"),
        ({"target": "http://m:19530", "index": "after"},
         "index: after (bulk mode) is for Postgres targets only"),
    ],
)  # fmt: skip
def test_abilities_come_from_the_registry(
    settings: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KEMBED_SINK_TARGET", raising=False)
    with pytest.raises(ValidationError) as caught:
        SinkSettings.model_validate(settings)
    assert message in describe_errors(caught.value)
    # Milvus given the ability: the same settings pass, and the message would name both.
    monkeypatch.setitem(
        STORES, "milvus", replace(STORES["milvus"], schema_tables=True, index_after=True)
    )
    assert SinkSettings.model_validate(settings).target_spec().kind == "milvus"


def test_a_new_database_is_its_module_plus_one_line(vecdb: StoreEntry) -> None:
    settings = SinkSettings.model_validate(
        {"target": "vecdb://svc:pw@vec.example:7000", "table": "docs", "connect_timeout_s": 3}
    )
    spec = settings.target_spec()
    assert (spec.kind, spec.uri, spec.user) == ("vecdb", "http://vec.example:7000", "svc")
    assert vecdb.parse is server_target  # the default grammar: a server with a host
    store = make_store(settings)
    assert (type(store).__name__, store.name, vars(store)["timeout"]) == ("VecStore", "docs", 3)
    with pytest.raises(ValidationError, match="for Postgres targets only"):
        SinkSettings.model_validate({"target": "vecdb://vec.example", "table": "a.b"})
    with pytest.raises(ValidationError, match="vecdb://HOST:PORT needs a host"):
        SinkSettings.model_validate({"target": "vecdb:///nowhere"})
    with pytest.raises(ValueError, match=r"milvus://host:19530 or vecdb://host:7000$"):
        parse_target("redis://cache")


def test_a_missing_client_names_the_extra_that_installs_it(
    vecdb: StoreEntry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kembed_vecdb_store.py").write_text("import vecdb_client_not_installed\n")
    settings = SinkSettings.model_validate(
        {"target": "vecdb://vec.example", "target_password": SecretStr("hunter2")}
    )
    with pytest.raises(TargetError) as caught:
        make_store(settings)
    assert str(caught.value) == (
        "VecDB targets need the vecdb_client_not_installed package: pip install 'kembed[vecdb]'"
    )
    # A store module that is itself missing is a broken install, not a missing extra.
    monkeypatch.setitem(STORES, "vecdb", replace(vecdb, module="kembed_vecdb_gone"))
    with pytest.raises(ModuleNotFoundError):
        make_store(settings)
