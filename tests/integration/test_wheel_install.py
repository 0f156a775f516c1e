"""kembed as a user installs it: the wheel built with ``python -m build``, installed into
fresh virtual environments, used from a directory outside the clone.

- ``pip install kembed`` (no extras): the SDK and the client commands work against a worker
  run from the development environment, and return its vectors; torch, transformers,
  psycopg and pymilvus are not there; ``kembed worker`` / ``validate`` / ``sink`` say in one
  line which extra to install and exit 2, while their ``--help`` still works.
- ``kembed validate`` from the wheel, with the worker's third-party packages present but no
  ``../shared`` beside it: the quality gate's reference pairs come from the package.

The build tool lives in a small environment cached beside the development one (keyed by the
build requirements), so the development environment and requirements.lock stay as they are.
The fresh environment's packages are pinned to requirements.lock's versions (constraints), so
it holds what a user of this lock gets. Its size, next to the development environment's, is
printed (``pytest -s``) and recorded in the test's properties.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from loadtest.data import stsb_sentences
from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka
from tests.conftest import ROOT, WorkerProcess
from tests.integration.test_sync_client import cosines

pytestmark = pytest.mark.integration

CACHE = Path(os.environ.get("KEMBED_CACHE_DIR") or Path.home() / ".cache" / "kembed")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
HEAVY = (
    "torch",
    "transformers",
    "tokenizers",
    "bitsandbytes",
    "psycopg",
    "pymilvus",
    "fastapi",
    "uvicorn",
)
"""What the base install must not bring: the worker's, the sink's and the gateway's extras."""
TIMEOUT = 300


def run(
    command: Sequence[str | Path],
    cwd: Path,
    env: dict[str, str],
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, command))} exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def clean_env() -> dict[str, str]:
    """This process's environment without what would point a child at the development
    tree: PYTHONPATH, the active virtual environment, KEMBED_STSB_DIR."""
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "KEMBED_STSB_DIR"}
    return {name: value for name, value in os.environ.items() if name not in dropped}


def site_packages(env: Path) -> Path:
    """The site-packages folder of the virtual environment ``env`` (this Python's layout)."""
    relative = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    return env / relative


def editable_paths(packages: Path) -> set[Path]:
    """The folders the .pth files of an editable install in ``packages`` add to sys.path."""
    return {
        Path(line.strip()).resolve()
        for pth in packages.glob("__editable__*.pth")
        for line in pth.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith(("import ", "#"))
    }


def du_bytes(path: Path) -> int:
    output = subprocess.run(
        ["du", "-sk", str(path.resolve())], capture_output=True, text=True, check=True
    ).stdout
    return int(output.split()[0]) * 1024


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with nothing of the clone in it."""
    return tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build --wheel`` over a copy of the project's packaged files (building in
    place would leave build/ and *.egg-info in the clone)."""
    builder = builder_env()
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in packaged():
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    run(
        [builder / "bin" / "python", "-m", "build", "--wheel", "--no-isolation",
         "--outdir", work / "dist", source],
        cwd=work,
        env=clean_env(),
    )  # fmt: skip
    (built,) = (work / "dist").glob("kembed-*.whl")
    return built


def packaged() -> list[str]:
    """The top-level packages the wheel holds (pyproject's packages.find include)."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return [pattern.rstrip("*") for pattern in include]


def builder_env() -> Path:
    """A virtual environment with ``build`` and the build-system requirements, made once per
    set of requirements and Python version (a lock file keeps two runs from racing)."""
    requires = sorted(PYPROJECT["build-system"]["requires"])
    key = hashlib.sha256(json.dumps([requires, sys.version]).encode()).hexdigest()[:16]
    env = CACHE / f"wheel-builder-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "wheel-builder.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env / ".kembed-complete").exists():
            shutil.rmtree(env, ignore_errors=True)
            run([sys.executable, "-m", "venv", env], cwd=CACHE, env=clean_env())
            run(
                [env / "bin" / "python", "-m", "pip", "install", "--quiet", "build", *requires],
                cwd=CACHE,
                env=clean_env(),
            )
            (env / ".kembed-complete").touch()
    return env


@pytest.fixture(scope="module")
def base_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install kembed``: the wheel without extras in a fresh virtual environment."""
    env = tmp_path_factory.mktemp("base") / "venv"
    run([sys.executable, "-m", "venv", env], cwd=env.parent, env=clean_env())
    run(
        [env / "bin" / "python", "-m", "pip", "install", "--quiet",
         "--constraint", ROOT / "requirements.lock", wheel],
        cwd=env.parent,
        env=clean_env(),
    )  # fmt: skip
    return env


def test_the_base_install_is_the_client_side_without_torch_or_databases(
    base_env: Path, outside: Path, record_property: Any
) -> None:
    """From the fresh environment, outside the clone: the SDK imports from the installed
    wheel, none of the extras' packages is there, the client commands' help works, and
    the size of the environment is recorded next to the development one's."""
    python = base_env / "bin" / "python"
    probe = (
        "import importlib.util, json, producer_sdk, kembed_cli\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'sdk': producer_sdk.__file__, 'cli': kembed_cli.__file__,\n"
        "  'found': [name for name in heavy if importlib.util.find_spec(name)]}))\n"
    )
    found = json.loads(run([python, "-c", probe], outside, clean_env()).stdout)
    installed = site_packages(base_env)
    assert Path(found["sdk"]).is_relative_to(installed), found
    assert Path(found["cli"]).is_relative_to(installed), found
    assert found["found"] == []
    no_torch = run([python, "-c", "import torch"], outside, clean_env(), check=False)
    assert no_torch.returncode == 1
    assert "No module named 'torch'" in no_torch.stderr

    kembed = base_env / "bin" / "kembed"
    version = run([kembed, "--version"], outside, clean_env()).stdout
    assert version.strip() == f"kembed {PYPROJECT['project']['version']}"
    # Help never needs an extra: only running a worker, the gate or a sink does.
    for command in (
        "embed",
        "ingest",
        "models",
        "status",
        "topics",
        "worker",
        "validate",
        "sink",
        "gateway",
    ):
        shown = run([kembed, command, "--help"], outside, clean_env())
        assert shown.stdout.startswith(f"usage: kembed {command}"), shown.stdout[:200]

    base_size, dev_size = du_bytes(base_env), du_bytes(Path(sys.prefix))
    record_property("base_env_bytes", base_size)
    record_property("dev_env_bytes", dev_size)
    print(
        f"\nenvironment sizes (du -sk): pip install kembed {base_size / 2**20:.0f} MiB; "
        f"development environment (requirements.lock, every extra and the dev tools) "
        f"{dev_size / 2**20:.0f} MiB ({dev_size / base_size:.0f}x)"
    )
    assert base_size * 10 < dev_size


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["worker"], "worker"),
        (["validate", "--limit", "8"], "worker"),
        (["sink", "--target", "postgresql://localhost/kembed?table=docs"], "sink"),
        (["gateway"], "gateway"),
    ],
)
def test_a_command_whose_extra_is_missing_exits_2_naming_it(
    base_env: Path, outside: Path, argv: list[str], extra: str
) -> None:
    """One line on stderr that names the extra and how to install it, nothing on stdout."""
    result = run([base_env / "bin" / "kembed", *argv], outside, clean_env(), check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"kembed[{extra}]" in lines[0]
    assert f"pip install 'kembed[{extra}]'" in lines[0]


def test_kembed_embed_and_the_sync_client_from_the_base_install_get_the_workers_vectors(
    base_env: Path, outside: Path, kafka: LocalKafka, worker: WorkerProcess
) -> None:
    """A worker run from the development environment answers the fresh environment's
    ``kembed embed`` and ``SyncEmbedClient`` with the vectors it gives the dev client."""
    texts = stsb_sentences()[:6]

    async def embed_here() -> npt.NDArray[np.float32]:
        async with EmbedClient(kafka.bootstrap_servers) as client:
            return await client.embed(texts, timeout=60)

    expected = asyncio.run(embed_here())

    env = clean_env() | {"KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    # The local broker's topics are the plan for the default settings: the base install's
    # kembed topics check (no extra needed) finds nothing to report.
    checked = run([base_env / "bin" / "kembed", "topics", "check"], outside, env)
    assert "0 problem(s)" in checked.stdout, checked.stdout
    embedded = run([base_env / "bin" / "kembed", "embed", "--timeout", "60", *texts], outside, env)
    output = json.loads(embedded.stdout)
    from_cli = np.asarray(output["vectors"], dtype=np.float32)
    assert output["dim"] == 384
    assert from_cli.shape == expected.shape == (6, 384)
    assert cosines(from_cli, expected).min() > 0.9999

    script = (
        "import json, os, sys\n"
        "from producer_sdk import SyncEmbedClient\n"
        "texts = json.loads(sys.stdin.read())\n"
        "with SyncEmbedClient(os.environ['KEMBED_BOOTSTRAP_SERVERS']) as client:\n"
        "    vectors = client.embed(texts, timeout=60)\n"
        "print(json.dumps(vectors.tolist()))\n"
    )
    synced = run([base_env / "bin" / "python", "-c", script], outside, env, stdin=json.dumps(texts))
    from_sync = np.asarray(json.loads(synced.stdout), dtype=np.float32)
    assert from_sync.shape == (6, 384)
    assert cosines(from_sync, expected).min() > 0.9999


def test_kembed_validate_from_the_wheel_reads_the_pairs_shipped_in_the_package(
    wheel: Path, outside: Path, tmp_path: Path
) -> None:
    """The wheel (no dependencies) in a fresh environment that sees the development
    environment's third-party packages through a plain path line, never this clone or
    ../shared: ``kembed validate`` passes on the reference pairs inside the installed
    package."""
    env = tmp_path / "venv"
    run([sys.executable, "-m", "venv", env], tmp_path, clean_env())
    run([env / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", wheel],
        tmp_path, clean_env())  # fmt: skip
    installed = site_packages(env)
    dev_packages = Path(sysconfig.get_path("purelib")).resolve()
    # A plain path line: site appends the folder to sys.path without running the .pth files
    # in it, so the development environment's editable kembed (a path to a clone) stays out.
    (installed / "kembed-dev-packages.pth").write_text(f"{dev_packages}\n", encoding="utf-8")

    python = env / "bin" / "python"
    probe = (
        "import json, sys, kembed_cli, worker, torch\n"
        "print(json.dumps({'cli': kembed_cli.__file__, 'worker': worker.__file__,\n"
        "  'torch': torch.__file__, 'path': sys.path}))\n"
    )
    seen = json.loads(run([python, "-c", probe], outside, clean_env()).stdout)
    assert Path(seen["cli"]).is_relative_to(installed), seen["cli"]
    assert Path(seen["worker"]).is_relative_to(installed), seen["worker"]
    assert Path(seen["torch"]).resolve().is_relative_to(dev_packages), seen["torch"]
    # Neither this clone nor the folders the editable install's .pth files name are seen.
    hidden = {ROOT.resolve(), *editable_paths(dev_packages)}
    assert not {Path(entry).resolve() for entry in seen["path"] if entry} & hidden, seen["path"]

    # bf16 against fp32: a real judgement, without dtype auto's start-up measurement.
    result = run(
        [env / "bin" / "kembed", "validate", "--limit", "64", "--json", "--dtype", "bfloat16"],
        outside,
        clean_env() | {"HF_HUB_OFFLINE": "1", "KEMBED_TORCH_COMPILE": "off"},
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])  # after the log lines
    assert report["passed"] is True, report
    assert report["candidate"]["dtype"] == "bfloat16"
    assert report["pairs"] == 64
    source = Path(report["pairs_source"])
    assert source == installed / "worker" / "data" / "stsb-en-test.csv"
    assert source.is_file()
