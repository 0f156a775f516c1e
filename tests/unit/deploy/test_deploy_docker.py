"""deploy/docker/Dockerfile checked without a Docker engine: hadolint, then a reading of the
file against the contract the Compose stack and the Helm chart rely on (docs/deploy.md,
"Container images"): each role's build target runs ``kembed <role>`` as uid 10001, checks
its own ``/health`` on its own port, stops on SIGTERM, installs its role's extra from the
build context with the lock as constraints, names no package index, and the build context
(.dockerignore) holds what the COPY lines need and builds a wheel. The health check
program the images run is tested against a real HTTP server.

hadolint comes from ``scripts/deploy_tools.sh`` (``./.tools/hadolint``); the test fails,
rather than skips, without it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from gateway.settings import GatewaySettings
from sink.settings import SinkSettings
from tests.deploy_env import role_env_names
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
HEALTHCHECK = ROOT / "deploy" / "docker" / "healthcheck.py"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

ROLES = ("worker", "sink", "gateway")
# The contract of docs/deploy.md: each role's port setting and its default.
ROLE_PORT: dict[str, tuple[type[BaseSettings], str, int]] = {
    "worker": (WorkerSettings, "http_port", 8080),
    "sink": (SinkSettings, "http_port", 8081),
    "gateway": (GatewaySettings, "port", 8080),
}
UID = "10001"
# The only hadolint rules the Dockerfile may silence (each with its reason next to it).
ALLOWED_IGNORES = {"DL3008"}
_HOST = re.compile(r"\b(?:[a-z0-9-]+\.)+(?:org|com|net|io|dev|ai|cloud|sh)\b", re.IGNORECASE)


def deploy_tool(name: str) -> Path:
    """``./.tools/<name>`` from scripts/deploy_tools.sh; a failure, not a skip, without it."""
    path = ROOT / ".tools" / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run scripts/deploy_tools.sh (builds {name} once)")
    return path


def port_env(role: str) -> tuple[str, int]:
    """The role's port variable (``KEMBED_...``) and its default."""
    model, name, _ = ROLE_PORT[role]
    prefix = str(model.model_config.get("env_prefix", ""))
    default = model.model_fields[name].default
    assert isinstance(default, int)
    return f"{prefix}{name}".upper(), default


# -- reading the Dockerfile ------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[dict[str, str], dict[str, Stage]]:
    """The global ARGs (name: default) and the stages by name, continuation lines joined
    and comments dropped (as Docker reads them)."""
    logical: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].strip() if continued else line)
        if not continued:
            logical.append((start, " ".join(pending)))
            pending = []
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for number, line in logical:
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "FROM":
            words = value.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name, words[0])
        elif current is None:
            if keyword == "ARG":
                arg, _, default = value.partition("=")
                global_args[arg] = default
        else:
            current.instructions.append(Instruction(keyword, value, number))
    return global_args, stages


def chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    found = [stages[name]]
    while found[-1].base in stages:
        found.append(stages[found[-1].base])
    return found


def effective(stages: dict[str, Stage], name: str, keyword: str) -> Instruction | None:
    """The instruction in force in a stage (its own last one, else its base stage's)."""
    for stage in chain(stages, name):
        if stage.all(keyword):
            return stage.all(keyword)[-1]
    return None


def environment(stages: dict[str, Stage], name: str) -> dict[str, str]:
    """ENV of a stage, its base stages' included."""
    env: dict[str, str] = {}
    for stage in reversed(chain(stages, name)):
        for instruction in stage.all("ENV"):
            for word in shlex.split(instruction.value):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def stage_args(stage: Stage) -> dict[str, str]:
    return {
        name: default for name, _, default in (i.value.partition("=") for i in stage.all("ARG"))
    }


def copies(stage: Stage) -> list[tuple[dict[str, str], list[str], str]]:
    """Each COPY as (flags, sources, destination)."""
    found = []
    for instruction in stage.all("COPY"):
        words = shlex.split(instruction.value)
        flags: dict[str, str] = {}
        for word in (w for w in words if w.startswith("--")):
            key, _, value = word[2:].partition("=")
            flags[key] = value
        paths = [w for w in words if not w.startswith("--")]
        found.append((flags, paths[:-1], paths[-1]))
    return found


def exec_form(instruction: Instruction | None) -> list[str] | None:
    if instruction is None:
        return None
    value = json.loads(instruction.value)
    assert isinstance(value, list)
    return [str(v) for v in value]


def healthcheck_command(instruction: Instruction | None) -> list[str] | None:
    if instruction is None:
        return None
    _, _, command = instruction.value.partition("CMD ")
    return exec_form(Instruction("CMD", command, instruction.line))


# -- the checks ------------------------------------------------------------------------


def role_problems(stages: dict[str, Stage], role: str) -> list[str]:
    """What the role's build target gets wrong against the contract."""
    if role not in stages:
        return [f"no build target {role!r}"]
    problems: list[str] = []
    variable, default = port_env(role)
    expect = {
        "ENTRYPOINT": ["kembed"],
        "CMD": [role],
        "HEALTHCHECK": ["kembed-healthcheck", "/health", variable, str(default)],
    }
    got = {
        "ENTRYPOINT": exec_form(effective(stages, role, "ENTRYPOINT")),
        "CMD": exec_form(effective(stages, role, "CMD")),
        "HEALTHCHECK": healthcheck_command(effective(stages, role, "HEALTHCHECK")),
    }
    problems += [f"{role}: {k} is {got[k]}, not {v}" for k, v in expect.items() if got[k] != v]
    user = effective(stages, role, "USER")
    if user is None or user.value != f"{UID}:{UID}":
        problems.append(f"{role}: USER is {user and user.value}, not {UID}:{UID}")
    signal = effective(stages, role, "STOPSIGNAL")
    if signal is None or signal.value != "SIGTERM":
        problems.append(f"{role}: STOPSIGNAL is {signal and signal.value}, not SIGTERM")
    exposed = [i.value for s in chain(stages, role) for i in s.all("EXPOSE")]
    if exposed != [str(default)]:
        problems.append(f"{role}: EXPOSE {exposed}, not [{default}] ({variable})")
    env = environment(stages, role)
    if env.get("HF_HUB_OFFLINE") != "1":
        problems.append(f"{role}: HF_HUB_OFFLINE is not 1")
    unknown = {k for k in env if k.startswith("KEMBED_")} - role_env_names(role)
    problems += [f"{role}: ENV {k} is not a setting of kembed {role}" for k in sorted(unknown)]
    # The final image takes only the virtual environment its own build stage made, and
    # (besides the health check program) nothing from the build context.
    for flags, sources, destination in (c for s in chain(stages, role) for c in copies(s)):
        origin = flags.get("from")
        if origin is None and sources != ["deploy/docker/healthcheck.py"]:
            problems.append(f"{role}: copies {sources} from the build context")
        if origin is not None and (origin, sources, destination) != (
            f"build-{role}",
            ["/opt/kembed"],
            "/opt/kembed",
        ):
            problems.append(f"{role}: copies {sources} from {origin}")
    return problems


def install_problems(stages: dict[str, Stage], role: str) -> list[str]:
    """The role's build stage installs the project with the role's extra (one pyproject
    defines), with the lock as constraints, and takes every index from a build argument."""
    stage = stages.get(f"build-{role}")
    if stage is None:
        return [f"no build stage build-{role}"]
    problems: list[str] = []
    script = " ".join(i.value for i in stage.all("RUN"))
    extras = re.findall(r'"\.\[([a-z,]+)\]"', script)
    if extras != [role]:
        problems.append(f"build-{role} installs extras {extras}, not [{role!r}]")
    for extra in (e for group in extras for e in group.split(",")):
        if extra not in PYPROJECT["project"]["optional-dependencies"]:
            problems.append(f"build-{role}: pyproject has no extra {extra!r}")
    if not re.search(r'pip install --constraint requirements\.lock "\.\[', script):
        problems.append(f"build-{role}: the project is not installed with the lock")
    args = stage_args(stage)
    for flag, value in re.findall(r"--((?:extra-)?index-url)[ =](\S+)", script):
        variable = re.fullmatch(r'"?\$\{?([A-Z_]+)\}?"?', value)
        if variable is None or variable[1] not in args:
            problems.append(f"build-{role}: --{flag} {value} is not a build argument")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if name not in args:
            problems.append(f"build-{role}: no build argument {name}")
    return problems


def host_problems(text: str) -> list[str]:
    """A URL or a host name anywhere in the file (comments included)."""
    found = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if "://" in line or _HOST.search(line)
    ]
    return [f"names a host: {line}" for line in found]


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage]]:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(deploy_tool("hadolint")), "--no-color", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_hadolint_passes() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_reports_what_the_dockerfile_avoids(tmp_path: Path) -> None:
    """The same hadolint fails an unpinned base, a pip install without versions or lock,
    and the apt-get install the Dockerfile silences with its reason."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python\nRUN pip install torch\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends g++\n"
    )
    result = hadolint(bad)
    assert result.returncode == 1
    for rule in ("DL3006", "DL3013", "DL3042", "DL3008"):
        assert rule in result.stdout


def test_every_hadolint_ignore_has_its_reason_above() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        rules = re.match(r"#\s*hadolint\s+ignore=(\S+)", line.strip())
        if rules is None:
            continue
        assert set(rules[1].split(",")) <= ALLOWED_IGNORES, line
        above = lines[number - 1].strip()
        assert above.startswith("#"), f"no reason above line {number + 1}"
        assert len(above) > 20, f"no reason above line {number + 1}"


def test_the_role_ports_are_the_documented_ones() -> None:
    assert {role: port_env(role) for role in ROLES} == {
        "worker": ("KEMBED_HTTP_PORT", 8080),
        "sink": ("KEMBED_SINK_HTTP_PORT", 8081),
        "gateway": ("KEMBED_GATEWAY_PORT", 8080),
    }


@pytest.mark.parametrize("role", ROLES)
def test_each_role_target_follows_the_contract(
    dockerfile: tuple[dict[str, str], dict[str, Stage]], role: str
) -> None:
    _, stages = dockerfile
    assert role_problems(stages, role) == []
    assert install_problems(stages, role) == []


def test_stages_build_from_the_pinned_slim_python_base(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    global_args, stages = dockerfile
    image = global_args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", image)
    assert {s.base for s in stages.values()} <= {"${PYTHON_IMAGE}", *stages}
    # The worker is the last stage: a build without --target gives it.
    assert list(stages)[-1] == "worker"


def test_final_images_hold_no_compiler_unless_asked(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    """sink and gateway install nothing; the worker installs g++ only for TORCH_COMPILE
    auto/on, and with the default (off) also tells the worker not to compile."""
    _, stages = dockerfile
    for role in ("sink", "gateway", "runtime"):
        assert "apt-get" not in " ".join(i.value for i in stages[role].all("RUN"))
    worker = stages["worker"]
    assert stage_args(worker)["TORCH_COMPILE"] == "off"
    (run,) = [i.value for i in worker.all("RUN") if "apt-get" in i.value]
    assert re.match(r'case "\$TORCH_COMPILE" in off\) ;; auto\|on\) apt-get', run)
    assert environment(stages, "worker")["KEMBED_TORCH_COMPILE"] == "${TORCH_COMPILE}"
    compile_setting = WorkerSettings.model_fields["torch_compile"].annotation
    assert set(getattr(compile_setting, "__args__", ())) == {"auto", "on", "off"}


def test_worker_variant_checks_the_torch_it_installed(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    _, stages = dockerfile
    build = stages["build-worker"]
    assert stage_args(build)["VARIANT"] == "cpu"
    assert "TORCH_INDEX_URL" in stage_args(build)
    script = " ".join(i.value for i in build.all("RUN"))
    assert 'case "$VARIANT" in cpu|gpu)' in script
    assert "torch.version.cuda" in script
    # The torch line of the lock, which the build installs from TORCH_INDEX_URL.
    lock = (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines()
    assert len([line for line in lock if re.match(r"(?i)torch==", line)]) == 1


def test_no_package_index_host_is_named() -> None:
    for path in (DOCKERFILE, DOCKERIGNORE, HEALTHCHECK):
        assert host_problems(path.read_text(encoding="utf-8")) == [], path


def test_the_checks_catch_mistakes(dockerfile: tuple[dict[str, str], dict[str, Stage]]) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")

    def problems_of(changed: str, role: str = "worker") -> list[str]:
        assert changed != text
        _, stages = parse(changed)
        return role_problems(stages, role) + install_problems(stages, role)

    assert problems_of(text.replace('CMD ["sink"]', 'CMD ["worker"]'), "sink")
    assert problems_of(text.replace("USER 10001:10001", "USER root"))
    assert problems_of(text.replace("STOPSIGNAL SIGTERM", "STOPSIGNAL SIGINT"))
    assert problems_of(text.replace('"KEMBED_HTTP_PORT", "8080"', '"KEMBED_PORT", "8080"'))
    assert problems_of(text.replace('"/health", "KEMBED_SINK', '"/healthz", "KEMBED_SINK'), "sink")
    assert problems_of(text.replace("KEMBED_TORCH_COMPILE=", "KEMBED_TORCH_COMPILED="))
    assert problems_of(text.replace('".[gateway]"', '".[web]"'), "gateway")
    assert problems_of(text.replace("--from=build-sink", "--from=build-worker"), "sink")
    assert problems_of(text.replace("FROM runtime AS gateway", "FROM runtime AS api"), "gateway")
    assert problems_of(text.replace('"$TORCH_INDEX_URL"', "https://example.org/simple"))
    assert host_problems("ARG PIP_INDEX_URL=https://example.org/simple")
    assert host_problems("RUN pip install --index-url mirror.example.com torch")


# -- the build context -----------------------------------------------------------------


def context_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_sends_only_what_the_dockerfile_copies(
    dockerfile: tuple[dict[str, str], dict[str, Stage]],
) -> None:
    """Everything is excluded, then exactly the COPY sources are let back in: no .git,
    .venv, .tools, caches or data reach the builder."""
    _, stages = dockerfile
    patterns = context_patterns()
    assert patterns[0] == "*"
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources = {
        source.rstrip("/")
        for stage in stages.values()
        for flags, paths, _ in copies(stage)
        if "from" not in flags
        for source in paths
    }
    assert included == sources
    assert all((ROOT / path).exists() for path in included)
    assert not included & {".git", ".venv", ".tools", "tests", "loadtest", "docs"}


def test_the_build_context_builds_the_wheel(tmp_path: Path) -> None:
    """The files .dockerignore lets through are enough for the install the build stages
    run: a wheel with every package and its data files."""
    context = tmp_path / "context"
    context.mkdir()
    for pattern in context_patterns():
        if not pattern.startswith("!"):
            continue
        source = ROOT / pattern[1:].rstrip("/")
        target = context / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("kembed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert f"{package.rstrip('*')}/__init__.py" in names
    assert any(re.fullmatch(r"worker/data/.+\.csv", n) for n in names)
    assert "worker/encoder/tuning_texts.txt" in names


# -- the health check program ----------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def healthcheck(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )


def test_healthcheck_follows_the_port_variable(server_port: int) -> None:
    port = str(server_port)
    ok = healthcheck("/health", "KEMBED_HTTP_PORT", "1", env={"KEMBED_HTTP_PORT": port})
    assert (ok.returncode, ok.stderr) == (0, "")
    by_default = healthcheck("/health", "KEMBED_SINK_HTTP_PORT", port, env={})
    assert by_default.returncode == 0
    unhealthy = healthcheck("/ready", "KEMBED_HTTP_PORT", port, env={})
    assert unhealthy.returncode == 1
    assert "status 503" in unhealthy.stderr


def test_healthcheck_fails_with_one_line_when_nothing_answers(server_port: int) -> None:
    # Docker reserves exit status 2: every failure is 1.
    closed = healthcheck("/health", "KEMBED_HTTP_PORT", "1", env={})
    assert closed.returncode == 1
    assert len(closed.stderr.splitlines()) == 1
    assert healthcheck("/health", "P", "x", env={}).returncode == 1
    assert healthcheck("health", "P", str(server_port), env={}).returncode == 1
    assert healthcheck(env={}).returncode == 1
