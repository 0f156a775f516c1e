"""The import contracts bite: each kind of violation, seeded in a copy of the tree, fails.

The packages and ``pyproject.toml`` are copied into a temporary directory once; each case
adds its modules (or appends an import to an existing one), runs ``lint-imports`` there,
and puts the copy back as it was. A contract that stops covering the module it should
(a hand-written list that drifted, a home too wide) fails its case here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "kembed_shared", "worker", "sink", "producer_sdk", "gateway", "kembed_cli")

TORCH = "torch, transformers and bitsandbytes only in worker.encoder"
AIOKAFKA = "aiokafka only in kembed_shared.kafka and the SDK's transport and catalog reader"
PSYCOPG = "psycopg only in sink.postgres"
PYMILVUS = "pymilvus only in sink.milvus"
WEB = "fastapi and starlette only in gateway"
UVICORN = "uvicorn only in gateway.server and kembed gateway"
GATEWAY_SETTINGS = "gateway.settings imports no web stack (kembed gateway --help without the extra)"
TOKENIZERS = "tokenizers only in worker.tokenization and worker.chunking"
CYCLES = "no import cycles inside a package"


@dataclass(frozen=True)
class Seed:
    """One violation: new modules, imports appended to existing ones, what must be said."""

    contract: str
    says: str
    new: dict[str, str] = field(default_factory=dict)
    append: dict[str, str] = field(default_factory=dict)


SEEDS = {
    "cycle in worker": Seed(
        CYCLES,
        "No cycles are allowed in worker.",
        new={
            "worker/_seed_a.py": "import worker._seed_b\n",
            "worker/_seed_b.py": "import worker._seed_a\n",
        },
    ),
    "torch in worker.chunking": Seed(
        TORCH, "worker.chunking -> torch", append={"worker/chunking.py": "import torch\n"}
    ),
    "fastapi in kembed topics": Seed(
        WEB,
        "kembed_cli.commands.topics -> fastapi",
        append={"kembed_cli/commands/topics.py": "import fastapi\n"},
    ),
    "aiokafka in the SDK's rerank": Seed(
        AIOKAFKA,
        "producer_sdk.rerank -> aiokafka",
        append={"producer_sdk/rerank.py": "import aiokafka\n"},
    ),
    "aiokafka in a new kembed_shared module": Seed(
        AIOKAFKA,
        "kembed_shared.seeded -> aiokafka",
        new={"kembed_shared/seeded.py": "import aiokafka\n"},
    ),
    "psycopg in a new sink store": Seed(
        PSYCOPG, "sink.qdrant -> psycopg", new={"sink/qdrant.py": "import psycopg\n"}
    ),
    "psycopg in the gateway": Seed(
        PSYCOPG, "gateway.seeded -> psycopg", new={"gateway/seeded.py": "import psycopg\n"}
    ),
    "pymilvus outside sink.milvus": Seed(
        PYMILVUS, "sink.seeded -> pymilvus", new={"sink/seeded.py": "import pymilvus\n"}
    ),
    "transformers in the SDK": Seed(
        TORCH,
        "producer_sdk.seeded -> transformers",
        new={"producer_sdk/seeded.py": "import transformers\n"},
    ),
    "tokenizers in the worker's app": Seed(
        TOKENIZERS, "worker.seeded -> tokenizers", new={"worker/seeded.py": "import tokenizers\n"}
    ),
    "uvicorn in the gateway's app": Seed(
        UVICORN, "gateway.app -> uvicorn", append={"gateway/app.py": "import uvicorn\n"}
    ),
    "web stack in gateway.settings": Seed(
        GATEWAY_SETTINGS,
        "gateway.settings -> starlette",
        append={"gateway/settings.py": "import starlette\n"},
    ),
    "cycle in sink": Seed(
        CYCLES,
        "No cycles are allowed in sink.",
        new={
            "sink/_seed_a.py": "import sink._seed_b\n",
            "sink/_seed_b.py": "import sink._seed_a\n",
        },
    ),
    "cycle in a nested package": Seed(
        CYCLES,
        "No cycles are allowed in kembed_shared.kafka.",
        new={
            "kembed_shared/kafka/_seed_a.py": "import kembed_shared.kafka._seed_b\n",
            "kembed_shared/kafka/_seed_b.py": "import kembed_shared.kafka._seed_a\n",
        },
    ),
}


def _lint_imports() -> str:
    found = Path(sys.executable).with_name("lint-imports")
    return str(found) if found.exists() else shutil.which("lint-imports") or "lint-imports"


def _sources_only(directory: str, names: list[str]) -> set[str]:
    """Copy the Python sources only (no data files, no caches)."""
    here = Path(directory)
    return {
        name
        for name in names
        if name == "__pycache__" or ((here / name).is_file() and not name.endswith(".py"))
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("contracts")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=_sources_only)
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def run_lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_lint_imports(), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def seeded(tree: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    seed: Seed = SEEDS[request.param]
    originals = {path: (tree / path).read_text() for path in seed.append}
    try:
        for path, text in seed.new.items():
            assert not (tree / path).exists(), f"{path} exists: pick another name for the seed"
            (tree / path).write_text(text)
        for path, text in seed.append.items():
            (tree / path).write_text(originals[path] + "\n" + text)
        yield tree
    finally:
        for path in seed.new:
            (tree / path).unlink(missing_ok=True)
        for path, text in originals.items():
            (tree / path).write_text(text)


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = run_lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("seeded", list(SEEDS), indirect=True)
def test_a_seeded_violation_breaks_its_contract(
    seeded: Path, request: pytest.FixtureRequest
) -> None:
    seed = SEEDS[request.node.callspec.params["seeded"]]
    result = run_lint_imports(seeded)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"{seed.contract} BROKEN" in output, output
    assert seed.says in output, output
