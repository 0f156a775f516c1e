"""deploy/compose/compose.yaml checked without a Docker engine: the real Compose
implementation (``docker-compose config``, the CLI plugin built by
``scripts/deploy_tools.sh``) must accept and normalize it; then the normalized JSON is read
against the code and the other files it names:

- every ``KEMBED_*`` variable a service sets is a setting of the role it runs (the topics
  job: the worker's settings, which ``kembed topics`` reads);
- each health check asks a path the role serves, on the role's port variable and port;
  the published gateway port is the gateway's;
- each ``build.target`` is a stage of deploy/docker/Dockerfile and the image is named after
  it; the kembed services start after the topics job has succeeded, which waits for a
  healthy Kafka; the sink's results topic and the gateway's reply topic are created;
- every file mounted from the repository exists; Prometheus loads deploy/prometheus/rules.yml
  and scrapes Compose services on their ports; Grafana gets the dashboard and a data source
  pointing at the Prometheus service;
- Kafka is a 4.x KRaft node the clients' bootstrap address reaches; the sink's password
  comes from the environment (``POSTGRES_PASSWORD``), never from the file.

The Compose binary is ``./.tools/docker-compose``; without it the tests fail, not skip.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import yaml  # type: ignore[import-untyped]

from gateway.settings import GatewaySettings
from kembed_shared.observability.service import routes
from sink.settings import SinkSettings
from tests.deploy_env import kembed_args_problem, role_env_names
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "deploy" / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
PASSWORD = "not-a-real-password-1"

# Each role's port: its variable and default (the contract, docs/deploy.md).
ROLE_PORT = {
    "worker": ("KEMBED_HTTP_PORT", WorkerSettings.model_fields["http_port"].default),
    "sink": ("KEMBED_SINK_HTTP_PORT", SinkSettings.model_fields["http_port"].default),
    "gateway": ("KEMBED_GATEWAY_PORT", GatewaySettings.model_fields["port"].default),
}
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
PROMETHEUS_PORT = 9090
GRAFANA_PROVISIONING = PurePosixPath("/etc/grafana/provisioning")


def deploy_tool(name: str) -> Path:
    """``./.tools/<name>`` from scripts/deploy_tools.sh; a failure, not a skip, without it."""
    path = ROOT / ".tools" / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run scripts/deploy_tools.sh (builds {name} once)")
    return path


def run_config(env_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` in a clean environment: only what ``env_file`` says (as a
    user's deploy/compose/.env would), so the machine's variables cannot hide a mistake."""
    return subprocess.run(
        [
            str(deploy_tool("docker-compose")),
            "--file",
            str(COMPOSE_FILE),
            "--env-file",
            str(env_file),
            "config",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")},
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env_file = tmp_path_factory.mktemp("compose") / "env"
    env_file.write_text(f"POSTGRES_PASSWORD={PASSWORD}\n")
    result = run_config(env_file, "--format", "json")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert isinstance(loaded, dict)
    return loaded


# -- what the code says ----------------------------------------------------------------


@cache
def served_paths(role: str) -> frozenset[str]:
    """The HTTP paths a role answers: the worker's and sink's endpoint table, the gateway
    app's routes."""
    if role == "gateway":
        from gateway.app import create_app

        app = create_app(GatewaySettings.model_validate({}))
        return frozenset(str(getattr(r, "path", "")) for r in app.routes)
    probes = SimpleNamespace(health_response=None, ready_response=None)
    return frozenset(routes(cast(Any, probes), cast(Any, None), dict))


def dockerfile_targets() -> set[str]:
    text = DOCKERFILE.read_text(encoding="utf-8")
    return set(re.findall(r"(?im)^FROM\s+\S+\s+AS\s+(\S+)\s*$", text))


# -- reading the normalized configuration ----------------------------------------------


def services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return cast(dict[str, dict[str, Any]], config["services"])


def image_of(service: dict[str, Any]) -> str:
    return str(service.get("image", ""))


def kembed_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services(config).items() if image_of(s).startswith("kembed-")}


def is_topics_job(service: dict[str, Any]) -> bool:
    return bool((service.get("command") or [""])[0] == "topics")


def role_of(service: dict[str, Any]) -> str:
    """The role whose settings a kembed container reads: its build target, except the
    topics job, which reads the worker's (kembed topics plans from the worker settings)."""
    if is_topics_job(service):
        return "worker"
    return str(service.get("build", {}).get("target", image_of(service).removeprefix("kembed-")))


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def port_of(service: dict[str, Any]) -> int:
    """The port a long-running kembed service listens on (its variable, else the default)."""
    variable, default = ROLE_PORT[role_of(service)]
    return int(environment(service).get(variable, default))


def duration_s(value: str) -> float:
    """A Go duration as Compose normalizes them (``45s``, ``1m30s``)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", value)
    assert "".join(n + u for n, u in parts) == value, value
    return sum(float(n) * units[u] for n, u in parts)


def binds(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts: container path to host path."""
    return {
        str(v["target"]): Path(v["source"])
        for v in service.get("volumes") or []
        if v.get("type") == "bind"
    }


def one_service(config: dict[str, Any], image: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(n, s) for n, s in services(config).items() if image_of(s).startswith(image)]
    return found


# -- the checks ------------------------------------------------------------------------


def env_problems(config: dict[str, Any]) -> list[str]:
    """Every KEMBED_* variable a kembed service sets is a setting of its role."""
    problems = []
    for name, service in kembed_services(config).items():
        role = role_of(service)
        if role not in ROLE_PORT:
            problems.append(f"{name}: runs no kembed role ({role!r})")
            continue
        for variable in sorted(environment(service)):
            if variable.startswith("KEMBED_") and variable not in role_env_names(role):
                problems.append(f"{name}: {variable} is not a setting of kembed {role}")
    return problems


def health_problems(config: dict[str, Any]) -> list[str]:
    """Each service but the one-shot job has a health check; a kembed one asks a path its
    role serves, on the role's port variable and the port the service listens on."""
    problems = []
    for name, service in services(config).items():
        check = service.get("healthcheck") or {}
        if is_topics_job(service):
            continue
        test = check.get("test") or []
        if check.get("disable") or not test:
            problems.append(f"{name}: no health check")
            continue
        role = role_of(service)
        if name not in kembed_services(config) or role not in ROLE_PORT:
            continue
        variable, _ = ROLE_PORT[role]
        path = test[2] if len(test) > 2 else ""
        expect = ["CMD", "kembed-healthcheck", path, variable, str(port_of(service))]
        if test != expect:
            problems.append(f"{name}: health check {test} is not {expect}")
        elif test[2] not in served_paths(role) or test[2] != "/health":
            problems.append(f"{name}: kembed {role} does not serve {test[2]} as liveness")
    return problems


def port_problems(config: dict[str, Any]) -> list[str]:
    """Published container ports are the ports the services listen on."""
    problems = []
    for name, service in kembed_services(config).items():
        if role_of(service) not in ROLE_PORT:
            continue
        for port in service.get("ports") or []:
            if int(port["target"]) != port_of(service):
                problems.append(
                    f"{name}: publishes {port['target']}, listens on {port_of(service)}"
                )
    return problems


def build_problems(config: dict[str, Any]) -> list[str]:
    """Each kembed image is built from deploy/docker/Dockerfile at one of its targets, in the
    repository root as context, and named kembed-<target>."""
    problems = []
    targets = dockerfile_targets()
    for name, service in kembed_services(config).items():
        build = service.get("build")
        if build is None:
            problems.append(f"{name}: no build section")
            continue
        target = build.get("target")
        if target not in targets or target not in ROLE_PORT:
            problems.append(f"{name}: build target {target!r} is not a role of the Dockerfile")
        if Path(build["context"]) != ROOT or build.get("dockerfile") != "deploy/docker/Dockerfile":
            problems.append(f"{name}: builds {build.get('dockerfile')} in {build['context']}")
        if image_of(service) != f"kembed-{target}":
            problems.append(f"{name}: image {image_of(service)} for target {target}")
    return problems


def order_problems(config: dict[str, Any]) -> list[str]:
    """Kafka is healthy before the topics job; the kembed services start after it succeeded."""
    problems = []
    jobs = [n for n, s in kembed_services(config).items() if is_topics_job(s)]
    if len(jobs) != 1:
        return [f"one topics job expected, found {jobs}"]
    kafka, _ = one_service(config, "apache/kafka:")
    for name, service in kembed_services(config).items():
        depends = service.get("depends_on") or {}
        wanted = {kafka: "service_healthy"}
        if name != jobs[0]:
            wanted[jobs[0]] = "service_completed_successfully"
        for other, condition in wanted.items():
            if (depends.get(other) or {}).get("condition") != condition:
                problems.append(f"{name}: does not wait for {other} ({condition})")
    return problems


def kafka_problems(config: dict[str, Any]) -> list[str]:
    """A single Kafka 4.x node in KRaft mode whose advertised in-network listener is the
    bootstrap address of every kembed service."""
    problems = []
    name, kafka = one_service(config, "apache/kafka:")
    env = environment(kafka)
    if not re.fullmatch(r"apache/kafka:4\.\d+\.\d+", image_of(kafka)):
        problems.append(f"{name}: image {image_of(kafka)} is not Kafka 4.x")
    roles = set(env.get("KAFKA_PROCESS_ROLES", "").split(","))
    if roles != {"broker", "controller"} or any("ZOOKEEPER" in k for k in env):
        problems.append(f"{name}: not a KRaft broker+controller node: {sorted(roles)}")
    if len(base64.urlsafe_b64decode(env.get("CLUSTER_ID", "") + "==")) != 16:
        problems.append(f"{name}: CLUSTER_ID is not a base64 UUID")
    advertised = {urlsplit(u).netloc for u in env.get("KAFKA_ADVERTISED_LISTENERS", "").split(",")}
    for service_name, service in kembed_services(config).items():
        for address in environment(service).get("KEMBED_BOOTSTRAP_SERVERS", "").split(","):
            if address not in advertised or address.split(":")[0] not in services(config):
                problems.append(f"{service_name}: bootstrap {address!r} is not {name}'s")
    return problems


def topics_problems(config: dict[str, Any]) -> list[str]:
    """The topics job creates the sinks' results topics with one replica (one broker);
    the gateway's reply topic is the workers' results topic, which it creates anyway."""
    problems = []
    ((job_name, job),) = [(n, s) for n, s in kembed_services(config).items() if is_topics_job(s)]
    command = list(job["command"])
    if command[:2] != ["topics", "create"]:
        problems.append(f"{job_name}: runs {command}")
    if (refused := kembed_args_problem(command)) is not None:
        problems.append(f"{job_name}: {refused}")
    flags = list(zip(command[2::2], command[3::2], strict=False))
    results = {v for k, v in flags if k == "--results"}
    if ("--replication-factor", "1") not in flags:
        problems.append(f"{job_name}: a single broker needs --replication-factor 1")
    job_env = environment(job)
    worker_results = job_env.get(
        "KEMBED_RESULTS_TOPIC", WorkerSettings.model_fields["results_topic"].default
    )
    for name, service in kembed_services(config).items():
        env = environment(service)
        if role_of(service) == "sink" and not is_topics_job(service):
            topic = env.get(
                "KEMBED_SINK_RESULTS_TOPIC", SinkSettings.model_fields["results_topic"].default
            )
            if topic not in results:
                problems.append(f"{name}: reads {topic}, which {job_name} does not create")
        if role_of(service) == "gateway":
            reply = env.get(
                "KEMBED_GATEWAY_REPLY_TOPIC", GatewaySettings.model_fields["reply_topic"].default
            )
            if reply != worker_results and reply not in results:
                problems.append(f"{name}: replies on {reply}, which {job_name} does not create")
    return problems


def worker_problems(config: dict[str, Any]) -> list[str]:
    """Two workers (replicas), each given longer than its drain to stop."""
    problems = []
    for name, service in kembed_services(config).items():
        if role_of(service) != "worker" or is_topics_job(service):
            continue
        replicas = (service.get("deploy") or {}).get("replicas", 1)
        if replicas < 2:
            problems.append(f"{name}: {replicas} replica(s), two workers expected")
        drain = float(
            environment(service).get(
                "KEMBED_SHUTDOWN_TIMEOUT_S",
                WorkerSettings.model_fields["shutdown_timeout_s"].default,
            )
        )
        grace = duration_s(str(service.get("stop_grace_period", "10s")))
        if grace <= drain:
            problems.append(f"{name}: stop_grace_period {grace} s <= shutdown timeout {drain} s")
    return problems


def sink_problems(config: dict[str, Any]) -> list[str]:
    """The sink writes to the pgvector service as its user and database, with the
    password the environment gave Compose (the one PostgreSQL gets as a secret)."""
    problems = []
    pg_name, pg = one_service(config, "pgvector/pgvector:")
    pg_env = environment(pg)
    secrets = {s["source"] for s in pg.get("secrets") or []}
    secret_file = pg_env.get("POSTGRES_PASSWORD_FILE", "")
    if "POSTGRES_PASSWORD" in pg_env or PurePosixPath(secret_file).name not in secrets:
        problems.append(f"{pg_name}: the password is not read from a Compose secret")
    for name in secrets:
        if config["secrets"][name].get("environment") != "POSTGRES_PASSWORD":
            problems.append(f"secret {name} does not come from POSTGRES_PASSWORD")
    for name, service in kembed_services(config).items():
        if role_of(service) != "sink":
            continue
        env = environment(service)
        target = urlsplit(env.get("KEMBED_SINK_TARGET", ""))
        if (target.scheme, target.hostname, target.port or 5432) != ("postgresql", pg_name, 5432):
            problems.append(f"{name}: target {target.geturl()} is not {pg_name}")
        if target.password is not None:
            problems.append(f"{name}: the target URI holds a password")
        if (target.username, target.path.lstrip("/")) != (
            pg_env.get("POSTGRES_USER"),
            pg_env.get("POSTGRES_DB"),
        ):
            problems.append(f"{name}: user/database differ from {pg_name}'s")
        if env.get("KEMBED_SINK_TARGET_PASSWORD") != PASSWORD:
            problems.append(f"{name}: the password is not POSTGRES_PASSWORD from the environment")
        if (service.get("depends_on") or {}).get(pg_name, {}).get("condition") != "service_healthy":
            problems.append(f"{name}: does not wait for a healthy {pg_name}")
    return problems


def mount_problems(config: dict[str, Any]) -> list[str]:
    """Every file or folder mounted from the host is one of the repository's."""
    problems = []
    for name, service in services(config).items():
        for target, source in binds(service).items():
            if not source.exists() or not source.resolve().is_relative_to(ROOT / "deploy"):
                problems.append(f"{name}: mounts {source} at {target}, not a file under deploy/")
    return problems


def prometheus_problems(config: dict[str, Any]) -> list[str]:
    """Prometheus loads deploy/prometheus/rules.yml and scrapes every long-running kembed
    service on its port, by Compose service name, under the job names the rules use."""
    problems = []
    name, prometheus = one_service(config, "prom/prometheus:")
    mounts = binds(prometheus)
    if PROMETHEUS_CONFIG not in mounts:
        return [f"{name}: no configuration mounted at {PROMETHEUS_CONFIG}"]
    prom_config = yaml.safe_load(mounts[PROMETHEUS_CONFIG].read_text(encoding="utf-8"))
    config_dir = PurePosixPath(PROMETHEUS_CONFIG).parent
    rules = ROOT / "deploy" / "prometheus" / "rules.yml"
    loaded = {str(config_dir / f) for f in prom_config.get("rule_files", [])}
    if not any(mounts.get(f) == rules for f in loaded):
        problems.append(f"{name}: rule_files {sorted(loaded)} do not load {rules}")
    scraped: dict[str, set[str]] = {}
    for job in prom_config.get("scrape_configs", []):
        addresses = [t for s in job.get("static_configs", []) for t in s.get("targets", [])]
        for sd in job.get("dns_sd_configs", []):
            addresses += [f"{n}:{sd.get('port')}" for n in sd.get("names", [])]
        for address in addresses:
            host, _, port = address.rpartition(":")
            service = kembed_services(config).get(host)
            if service is None or is_topics_job(service) or role_of(service) not in ROLE_PORT:
                problems.append(f"{name}: job {job['job_name']} scrapes {address}, no service")
                continue
            if int(port) != port_of(service):
                problems.append(f"{name}: scrapes {address}; {host} listens on {port_of(service)}")
            if job.get("metrics_path", "/metrics") not in served_paths(role_of(service)):
                problems.append(f"{name}: {host} does not serve {job.get('metrics_path')}")
            scraped.setdefault(host, set()).add(job["job_name"])
    for host, service in kembed_services(config).items():
        if not is_topics_job(service) and host not in scraped:
            problems.append(f"{name}: {host} is not scraped")
    jobs = {j for js in scraped.values() for j in js}
    for job in set(re.findall(r'job="([^"]+)"', rules.read_text(encoding="utf-8"))) - jobs:
        problems.append(f"{name}: rules.yml names job {job}, which no scrape config has")
    return problems


def grafana_problems(config: dict[str, Any]) -> list[str]:
    """Grafana's provisioning: a data source on the Prometheus service, and a dashboard
    provider whose folder holds deploy/grafana/kembed-dashboard.json."""
    problems = []
    name, grafana = one_service(config, "grafana/grafana:")
    prometheus, _ = one_service(config, "prom/prometheus:")
    mounts = binds(grafana)
    provisioned = {
        PurePosixPath(t): s
        for t, s in mounts.items()
        if PurePosixPath(t).is_relative_to(GRAFANA_PROVISIONING)
    }
    sources = [
        d
        for t, s in provisioned.items()
        if t.parent.name == "datasources"
        for d in yaml.safe_load(s.read_text(encoding="utf-8"))["datasources"]
    ]
    uid = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/kembed-prometheus.yml").read_text()
    )["datasources"][0]["uid"]
    if [(urlsplit(d["url"]).netloc, d.get("uid")) for d in sources] != [
        (f"{prometheus}:{PROMETHEUS_PORT}", uid)
    ]:
        problems.append(f"{name}: data sources {sources} are not {prometheus}'s")
    folders = [
        PurePosixPath(p["options"]["path"])
        for t, s in provisioned.items()
        if t.parent.name == "dashboards"
        for p in yaml.safe_load(s.read_text(encoding="utf-8"))["providers"]
    ]
    dashboard = ROOT / "deploy" / "grafana" / "kembed-dashboard.json"
    placed = [PurePosixPath(t).parent for t, s in mounts.items() if s == dashboard]
    if not placed or placed[0] not in folders:
        problems.append(f"{name}: the dashboard is at {placed}, the providers read {folders}")
    return problems


CHECKS = (
    env_problems,
    health_problems,
    port_problems,
    build_problems,
    order_problems,
    kafka_problems,
    topics_problems,
    worker_problems,
    sink_problems,
    mount_problems,
    prometheus_problems,
    grafana_problems,
)


# -- the tests -------------------------------------------------------------------------


def test_compose_accepts_the_file(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(f"POSTGRES_PASSWORD={PASSWORD}\n")
    result = run_config(env_file, "--quiet")
    assert (result.returncode, result.stderr) == (0, "")


def test_the_password_is_not_in_the_file(tmp_path: Path) -> None:
    """Without POSTGRES_PASSWORD, Compose refuses the file and says what to set."""
    empty = tmp_path / "env"
    empty.write_text("")
    result = run_config(empty, "--quiet")
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The same binary fails a file the spec does not allow (so passing means something)."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        "services:\n  a:\n    image: x\n    depends_on:\n      b:\n        condition: bogus\n"
    )
    result = subprocess.run(
        [str(deploy_tool("docker-compose")), "--file", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode != 0


def test_the_stack_has_its_services(config: dict[str, Any]) -> None:
    images = {n: image_of(s).partition(":")[0] for n, s in services(config).items()}
    assert images == {
        "kafka": "apache/kafka",
        "topics": "kembed-gateway",
        "worker": "kembed-worker",
        "gateway": "kembed-gateway",
        "sink": "kembed-sink",
        "postgres": "pgvector/pgvector",
        "prometheus": "prom/prometheus",
        "grafana": "grafana/grafana",
    }
    assert services(config)["worker"]["build"]["args"]["VARIANT"] == "cpu"
    assert {int(p["target"]) for p in services(config)["gateway"]["ports"]} == {8080}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_cross_check(config: dict[str, Any], check: Any) -> None:
    assert check(config) == []


def test_the_role_paths_are_served() -> None:
    for role in ROLE_PORT:
        assert {"/health", "/ready", "/metrics"} <= served_paths(role)


def test_the_checks_catch_mistakes(config: dict[str, Any], tmp_path: Path) -> None:
    def changed(edit: Any) -> dict[str, Any]:
        mutated = copy.deepcopy(config)
        edit(services(mutated))
        return mutated

    def problems(mutated: dict[str, Any]) -> list[str]:
        return [p for check in CHECKS for p in check(mutated)]

    assert problems(changed(lambda s: s["worker"]["environment"].update(KEMBED_MODLE="x")))
    assert problems(changed(lambda s: s["topics"]["environment"].update(KEMBED_SINK_TABLE="t")))
    assert problems(changed(lambda s: s["sink"]["healthcheck"]["test"].__setitem__(2, "/hlth")))
    assert problems(changed(lambda s: s["sink"]["environment"].update(KEMBED_SINK_HTTP_PORT="9")))
    assert problems(changed(lambda s: s["gateway"]["build"].update(target="gatewy")))
    assert problems(changed(lambda s: s["worker"]["depends_on"].pop("topics")))
    assert problems(changed(lambda s: s["worker"].update(stop_grace_period="30s")))
    assert problems(
        changed(lambda s: s["sink"]["environment"].update(KEMBED_SINK_RESULTS_TOPIC="r"))
    )
    assert problems(
        changed(lambda s: s["gateway"]["environment"].update(KEMBED_BOOTSTRAP_SERVERS="k:1"))
    )
    assert problems(changed(lambda s: s["kafka"].update(image="apache/kafka:3.9.1")))
    assert any(
        "unrecognized arguments: --replicas" in p
        for p in topics_problems(
            changed(lambda s: s["topics"]["command"].extend(["--replicas", "1"]))
        )
    )
    assert problems(changed(lambda s: s["grafana"]["volumes"][2].update(source="/nonexistent")))
    prom_config = tmp_path / "prometheus.yml"
    mounted = binds(services(config)["prometheus"])[PROMETHEUS_CONFIG]
    prom_config.write_text(mounted.read_text().replace("sink:8081", "sink:8080"))

    def moved(s: dict[str, Any]) -> None:
        s["prometheus"]["volumes"][0]["source"] = str(prom_config)

    assert any("sink listens on 8081" in p for p in prometheus_problems(changed(moved)))
