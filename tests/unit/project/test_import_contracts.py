"""The import contracts bite: each kind of violation, seeded in a copy of the tree, fails
``lint-imports`` and is reported under the contract that forbids it.

A contract that names modules by hand drifts as modules are added (a new module is not in
its list, so nothing is checked there); the contracts in pyproject.toml name packages. This
test keeps them honest: it copies the packages and pyproject.toml to a temporary directory,
checks that the copy passes, then adds one violation at a time and checks that the run fails
and names the expected contract.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("schemas", "kembed_shared", "worker", "sink", "producer_sdk", "gateway", "kembed_cli")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@dataclass(frozen=True)
class Seed:
    """One violation: lines appended to (or a new module written at) each path."""

    name: str
    lines: dict[str, str]
    contract: str


SEEDS = [
    Seed(
        "cycle in worker",
        {
            "worker/seeded_a.py": "import worker.seeded_b\n",
            "worker/seeded_b.py": "import worker.seeded_a\n",
        },
        "no import cycles inside any package",
    ),
    Seed(
        "cycle in sink",
        {"sink/seeded.py": "import sink.app\n", "sink/targets.py": "import sink.seeded\n"},
        "no import cycles inside any package",
    ),
    Seed(
        "torch in worker.chunking",
        {"worker/chunking.py": "import torch\n"},
        "torch, transformers and bitsandbytes only in worker.encoder",
    ),
    Seed(
        "transformers in a new worker module",
        {"worker/seeded.py": "import transformers\n"},
        "torch, transformers and bitsandbytes only in worker.encoder",
    ),
    Seed(
        "tokenizers in the sink",
        {"sink/rows.py": "import tokenizers\n"},
        "tokenizers only in worker.tokenization and worker.chunking",
    ),
    Seed(
        "fastapi in kembed topics",
        {"kembed_cli/commands/topics.py": "import fastapi\n"},
        "fastapi and starlette only in the gateway",
    ),
    Seed(
        "uvicorn in the gateway's app",
        {"gateway/app.py": "import uvicorn\n"},
        "uvicorn only in gateway.server and kembed gateway",
    ),
    Seed(
        "aiokafka in producer_sdk.rerank",
        {"producer_sdk/rerank.py": "import aiokafka\n"},
        "aiokafka only in kembed_shared.kafka and the SDK transport",
    ),
    Seed(
        "aiokafka in a new kembed_shared module",
        {"kembed_shared/seeded.py": "from aiokafka.errors import KafkaError\n"},
        "aiokafka only in kembed_shared.kafka and the SDK transport",
    ),
    Seed(
        "psycopg in a new sink.qdrant",
        {"sink/qdrant.py": "import psycopg\n"},
        "psycopg only in sink.postgres",
    ),
    Seed(
        "pymilvus in sink.postgres",
        {"sink/postgres/store.py": "import pymilvus\n"},
        "pymilvus only in sink.milvus",
    ),
    Seed(
        "a database client in the gateway",
        {"gateway/seeded.py": "import psycopg\n"},
        "only the sink reaches a database package",
    ),
    Seed(
        "the worker in the SDK",
        {"producer_sdk/seeded.py": "import worker.app\n"},
        "kembed layers",
    ),
    Seed(
        "numpy in schemas",
        {"schemas/seeded.py": "import numpy\n"},
        "schemas is a leaf: msgpack and the stdlib only",
    ),
]


def _lint(tree: Path) -> tuple[int, str]:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _broken(output: str) -> set[str]:
    """The names of the contracts a run reports broken (a long name wraps onto two lines)."""
    listing = output.split("Contracts:", 1)[0].rsplit("-----\n", 1)[-1]
    flat = " ".join(listing.split())
    verdicts = re.finditer(r"\s*(.+?) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?", flat)
    return {m.group(1) for m in verdicts if m.group(2) == "BROKEN"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("contracts")
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_the_tree_as_it_is_keeps_every_contract(tree: Path) -> None:
    code, output = _lint(tree)
    assert code == 0, output
    assert "0 broken" in output


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_a_seeded_violation_breaks_its_contract(tree: Path, seed: Seed) -> None:
    saved: dict[Path, str | None] = {}
    for name, line in seed.lines.items():
        path = tree / name
        saved[path] = path.read_text() if path.exists() else None
        path.write_text((saved[path] or "") + line)
    try:
        code, output = _lint(tree)
    finally:
        for path, text in saved.items():
            if text is None:
                path.unlink()
            else:
                path.write_text(text)
    assert code != 0, output
    broken = _broken(output)
    assert seed.contract in broken, (broken, output)
