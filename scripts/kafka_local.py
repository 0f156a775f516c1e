"""Run a local single-node Apache Kafka 4.x broker (KRaft mode) for tests and local runs.

Why this exists: the integration tests and local development need a real Kafka broker, but not
Docker or a system-wide install. A KRaft broker is a single JVM process, so this module fetches
the broker jars once with Maven (``scripts/kafka/pom.xml``) into a per-version cache outside the
clone, ``${KEMBED_CACHE_DIR:-~/.cache/kembed}/kafka-<version>/libs``, and runs
``java kafka.Kafka`` against a generated ``server.properties`` on free loopback ports.

Two ways to use it:

* In Python (pytest fixtures): ``LocalKafka(data_dir).start()`` blocks until the broker accepts
  connections and the project's topics exist with leaders, then ``stop()``, ``restart()`` (same
  ports and data, for broker-restart tests) and ``kill()`` (crash simulation).
* From a shell: ``python -m scripts.kafka_local start|stop|status|fetch``. ``start`` leaves the
  broker running detached and prints its bootstrap address; ``fetch`` only warms the jar cache.

``LocalKafka(data_dir, scram_users={"admin": ..., "alice": ...})`` runs it secured: SASL/SCRAM
logins and ACLs (``grant()``, via ``scripts/kafka_acls.py``), with ``admin`` the super user.

Broker logs go to ``DATA_DIR/broker.log`` (INFO) and ``DATA_DIR/broker.out`` (JVM stdout/stderr,
log ERRORs only).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from scripts.kafka_acls import OPERATIONS, AclBinding, create_acls_async, delete_acls_async

KAFKA_VERSION = "4.1.1"
DEFAULT_HEAP = "512m"
HOST = "127.0.0.1"
NODE_ID = 1

# Secured mode: the super user that the broker itself and topic creation authenticate as.
ADMIN_USER = "admin"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# Names and passwords end up in server.properties (JAAS) and StorageTool arguments: keep them
# to characters that need no quoting in either.
_SAFE_CREDENTIAL = re.compile(r"[A-Za-z0-9._~-]+")

KAFKA_DIR = Path(__file__).resolve().parent / "kafka"
POM_FILE = KAFKA_DIR / "pom.xml"
LOG4J_CONFIG = KAFKA_DIR / "log4j2.properties"

# Names of the files kept in a broker's data dir.
CONFIG_NAME = "server.properties"
PID_NAME = "broker.pid"
BOOTSTRAP_NAME = "bootstrap"
OUT_NAME = "broker.out"
LOG_NAME = "broker.log"
LOG_DIRS_NAME = "kafka-logs"
TLS_DIR_NAME = "tls"

_T = TypeVar("_T")


@dataclass(frozen=True)
class TopicSpec:
    """A topic the local broker should have: name, partition count and topic-level config."""

    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


# Request topics (and the DLQ, which copies requests) take messages above the worker's
# max_request_bytes (4 MiB), so an oversized request reaches the worker and is answered
# with message_too_large instead of being refused by the broker with no answer at all.
_LARGE_MESSAGES = {"max.message.bytes": str(8 * 1024 * 1024)}

# The model catalog keeps the latest card per key (compact) and drops what a day has not
# refreshed (delete): workers re-announce every 30 s, so a day-old card is long dead.
CATALOG_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(24 * 60 * 60 * 1000),
}

DEFAULT_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("embed.requests", 4, _LARGE_MESSAGES),
    TopicSpec("embed.results", 8),
    TopicSpec("embed.requests.bulk", 4, _LARGE_MESSAGES),
    TopicSpec("embed.requests.dlq", 1, _LARGE_MESSAGES),
    TopicSpec("embed.models", 1, CATALOG_TOPIC_CONFIG),
)


# --------------------------------------------------------------------------------------------
# Locations and jar cache
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """Directory shared by all clones for jars and the CLI's default broker data."""
    override = os.environ.get("KEMBED_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "kembed"


def kafka_version() -> str:
    """Kafka version to run; ``KEMBED_KAFKA_VERSION`` lets CI try another one without edits."""
    return os.environ.get("KEMBED_KAFKA_VERSION") or KAFKA_VERSION


def default_data_dir() -> Path:
    return cache_root() / "local-broker"


def libs_dir(version: str | None = None) -> Path:
    return cache_root() / f"kafka-{version or kafka_version()}" / "libs"


def ensure_jars(version: str | None = None) -> Path:
    """Return the directory holding the broker jars, fetching them with Maven if missing.

    The jars are copied into a temporary directory next to the cache entry and renamed into
    place, so an interrupted download never looks like a complete cache. A file lock keeps
    parallel test processes from fetching the same version twice.
    """
    version = version or kafka_version()
    target = libs_dir(version)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / ".fetch.lock"):
        if target.is_dir():  # another process fetched it while we waited for the lock
            return target
        _remove_stale_fetches(target.parent)
        work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
        try:
            _maven_copy_dependencies(version, work)
            os.rename(work / "libs", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_fetches(version_dir: Path) -> None:
    # Only called under the fetch lock, so any leftover temp dir belongs to a dead fetch.
    for leftover in version_dir.glob(".fetch-*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def _maven_copy_dependencies(version: str, work: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            f"Maven (mvn) is needed once to fetch the Kafka {version} jars into "
            f"{libs_dir(version)}; install it or populate that directory with the broker jars."
        )
    # Maven runs on a copy of the pom so that it never writes a target/ dir into the clone.
    pom = work / "pom.xml"
    shutil.copyfile(POM_FILE, pom)
    command = [
        mvn, "-q", "-B", "-f", str(pom),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={work / 'libs'}",
        "-DincludeScope=runtime",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=work, capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise RuntimeError(f"fetching Kafka {version} jars failed:\n{_tail_text(output)}")


# --------------------------------------------------------------------------------------------
# Broker configuration and processes
# --------------------------------------------------------------------------------------------


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java (17 or newer) is needed to run the local Kafka broker")
    return java


def _java_command(libs: Path, data_dir: Path, main_class: str, *args: str) -> list[str]:
    heap = os.environ.get("KEMBED_KAFKA_HEAP") or DEFAULT_HEAP
    return [
        _java(),
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        f"-Dkafka.logs.dir={data_dir}",
        "-cp",
        f"{libs}{os.sep}*",
        main_class,
        *args,
    ]


def free_port() -> int:
    """A loopback TCP port that is free right now (another process may still take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The JVM binds with SO_REUSEADDR, so TIME_WAIT leftovers of a stopped broker are fine.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _previous_port(data_dir: Path) -> int | None:
    """The client port a former broker in ``data_dir`` used, if it is free again."""
    try:
        port = int((data_dir / BOOTSTRAP_NAME).read_text().strip().rpartition(":")[2])
    except (FileNotFoundError, ValueError):
        return None
    return port if _port_is_free(port) else None


def render_server_properties(
    port: int, controller_port: int, log_dirs: Path, extra: Mapping[str, str]
) -> str:
    """A combined broker+controller KRaft config for one node; ``extra`` overrides defaults."""
    config = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dirs),
        # One node: internal topics cannot have more than one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        # Tests create consumer groups constantly; the default 3 s delay only slows them down.
        "group.initial.rebalance.delay.ms": "0",
        # After a SIGKILL the restarted node's registration is refused until the old one's
        # session expires (9 s by default); a short session keeps kill()+start() quick.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # Topics come from TopicSpec only, so a typo in a topic name fails instead of
        # silently creating a one-partition topic.
        "auto.create.topics.enable": "false",
    }
    config.update(extra)
    return "".join(f"{key}={value}\n" for key, value in config.items())


@dataclass(frozen=True)
class TlsFiles:
    """A local CA (PEM, for clients' ``ssl_cafile``) and the broker's PKCS12 keystore."""

    ca_file: Path
    keystore: Path
    password: str


def secured_server_properties(
    port: int,
    controller_port: int,
    admin_password: str,
    tls: TlsFiles | None = None,
    tls_port: int | None = None,
) -> dict[str, str]:
    """Overrides that turn ``render_server_properties`` into a SASL/SCRAM broker with ACLs.

    Clients use SASL_PLAINTEXT with SCRAM-SHA-256 or -512 (credentials live in the cluster
    metadata, added at format time), and with ``tls`` also SASL_SSL on ``tls_port``. The
    controller listener, loopback only, uses SASL PLAIN with a static admin credential: the
    controller must authenticate the broker before any SCRAM credential can be read. The
    broker talks to itself and to its controller as ``admin``, the only super user;
    everyone else needs ACLs (``LocalKafka.grant``).
    """
    user, password = ADMIN_USER, admin_password
    scram = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{password}" user_{user}="{password}";'
    )
    client_listeners = {"SASL_PLAINTEXT": port}
    if tls is not None:
        if tls_port is None:
            raise ValueError("a TLS listener needs tls_port")
        client_listeners["SASL_SSL"] = tls_port
    endpoints = ",".join(f"{name}://{HOST}:{p}" for name, p in client_listeners.items())
    config = {
        "listeners": f"{endpoints},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": endpoints,
        "listener.security.protocol.map": ",".join(
            [*(f"{name}:{name}" for name in client_listeners), "CONTROLLER:SASL_PLAINTEXT"]
        ),
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{user}",
    }
    for name in client_listeners:
        for mechanism in SCRAM_MECHANISMS:
            config[f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config"] = scram
    if tls is not None:
        prefix = "listener.name.sasl_ssl.ssl"
        config[f"{prefix}.keystore.type"] = "PKCS12"
        config[f"{prefix}.keystore.location"] = str(tls.keystore)
        config[f"{prefix}.keystore.password"] = tls.password
        config[f"{prefix}.key.password"] = tls.password
    return config


def _keytool() -> str:
    sibling = Path(_java()).resolve().parent / "keytool"
    if sibling.exists():
        return str(sibling)
    found = shutil.which("keytool")
    if found is None:
        raise RuntimeError("keytool (part of the JDK) is needed for a TLS listener")
    return found


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA and a broker certificate it signed for 127.0.0.1 (an IP SAN, so clients can
    check the host name), made with the JDK's keytool once per ``directory``."""
    ca_file, keystore = directory / "ca.pem", directory / "broker.p12"
    secret = directory / "keystore-password"
    if ca_file.exists() and keystore.exists() and secret.exists():
        return TlsFiles(ca_file, keystore, secret.read_text().strip())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    password = secrets.token_hex(16)
    env = {**os.environ, "KEMBED_KEYSTORE_PASSWORD": password}
    store = ["-storetype", "PKCS12", "-storepass:env", "KEMBED_KEYSTORE_PASSWORD"]
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", "3650"]
    ca, broker = str(directory / "ca.p12"), str(keystore)
    csr, signed, chain = (
        str(directory / name) for name in ("broker.csr", "broker.crt", "chain.pem")
    )
    steps = [
        ["-genkeypair", "-alias", "ca", "-dname", "CN=kembed-local-ca", "-ext", "bc:c", *key,
         "-keystore", ca, *store],
        ["-exportcert", "-alias", "ca", "-rfc", "-file", str(ca_file), "-keystore", ca, *store],
        ["-genkeypair", "-alias", "broker", "-dname", f"CN={HOST}", *key, "-keystore", broker,
         *store],
        ["-certreq", "-alias", "broker", "-file", csr, "-keystore", broker, *store],
        ["-gencert", "-alias", "ca", "-infile", csr, "-rfc", "-outfile", signed,
         "-ext", f"SAN=ip:{HOST}", "-ext", "EKU=serverAuth", "-validity", "3650",
         "-keystore", ca, *store],
    ]  # fmt: skip
    for step in steps:
        _run_keytool(step, env)
    Path(chain).write_text(ca_file.read_text() + Path(signed).read_text())
    _run_keytool(
        ["-importcert", "-noprompt", "-alias", "broker", "-file", chain, "-keystore", broker,
         *store],
        env,
    )  # fmt: skip
    secret.write_text(password)
    secret.chmod(0o600)
    return TlsFiles(ca_file, keystore, password)


def _run_keytool(args: list[str], env: Mapping[str, str]) -> None:
    result = subprocess.run(
        [_keytool(), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise RuntimeError(f"keytool {args[0]} failed:\n{output}")


def _random_cluster_id() -> str:
    # Same format as `kafka-storage random-uuid` (base64url of 16 random bytes, never starting
    # with "-"), generated here to save a JVM start.
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _format_storage(
    libs: Path, data_dir: Path, config: Path, scram_users: Mapping[str, str] | None = None
) -> None:
    # SCRAM credentials written at format time (KIP-900) exist before the broker first
    # starts, so the broker can authenticate its own inter-broker connections as admin.
    scram = [
        arg
        for name, password in (scram_users or {}).items()
        for mechanism in SCRAM_MECHANISMS
        for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
    ]
    command = _java_command(
        libs, data_dir, "kafka.tools.StorageTool",
        "format", "--ignore-formatted", "-t", _random_cluster_id(), "-c", str(config), *scram,
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        for password in (scram_users or {}).values():
            output = output.replace(password, "***")
        raise RuntimeError(f"formatting Kafka storage in {data_dir} failed:\n{output}")


def _tail_text(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _tail_file(path: Path, lines: int = 40) -> str:
    try:
        return _tail_text(path.read_text(errors="replace"), lines)
    except FileNotFoundError:
        return "(missing)"


def _write_text_atomic(path: Path, text: str) -> None:
    # Readers (the CLI, other shells) must never see a half-written pid or address.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pid_runs_broker(pid: int, config: Path) -> bool:
    """Whether ``pid`` is alive and is the broker of ``config`` (guards against pid reuse)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the pid file
    # A zombie has an empty cmdline, so it counts as stopped.
    return str(config).encode() in args


def running_pid(data_dir: Path) -> int | None:
    """The pid of the broker running from ``data_dir`` according to its pid file, if any."""
    try:
        pid = int((data_dir / PID_NAME).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _pid_runs_broker(pid, data_dir / CONFIG_NAME) else None


def terminate_pid(pid: int, config: Path, timeout: float = 30) -> None:
    """SIGTERM a broker that is not our child, SIGKILL it if it outlives ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_runs_broker(pid, config):
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10  # SIGKILL cannot be ignored; just wait for it
        time.sleep(0.1)


def _terminate_child(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------------------------
# Topic administration (aiokafka is async; these helpers make it callable from sync code)
# --------------------------------------------------------------------------------------------


class TopicCreationError(RuntimeError):
    """The broker refused to create a topic for a reason that retrying will not fix."""


def run_sync(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion from sync code, whether or not a loop runs in this thread.

    When called from inside a running event loop (an async test, say) the loop cannot be
    blocked on with a nested loop, so the coroutine gets a private loop in a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _is_startup_transient(error: type[Exception]) -> bool:
    # Right after start the broker may not have registered with its controller yet; the
    # controller then rejects replication factor 1 ("only 0 broker(s) are registered"), which
    # Kafka marks as non-retriable although it resolves itself within a second.
    return bool(getattr(error, "retriable", False)) or (
        error is kafka_errors.InvalidReplicationFactorError
    )


def _check_create_response(response: Any) -> None:
    for topic, code, *message in response.topic_errors:
        error = kafka_errors.for_code(code)
        if code == 0 or error is kafka_errors.TopicAlreadyExistsError:
            continue
        detail = f"creating topic {topic!r} failed: {error.__name__} {' '.join(map(str, message))}"
        if _is_startup_transient(error):
            raise error(detail)
        raise TopicCreationError(detail)


async def _leaders_ready(admin: Any, names: list[str]) -> bool:
    topics = await admin.describe_topics(names)
    return len(topics) == len(names) and all(
        topic["error_code"] == 0
        and topic["partitions"]
        and all(partition["leader"] >= 0 for partition in topic["partitions"])
        for topic in topics
    )


async def create_topics_async(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Create ``specs`` (existing topics are left alone) and wait until all have leaders.

    ``client_config`` holds aiokafka security options (a secured broker's admin login).
    Has no deadline of its own; callers bound it with ``asyncio.timeout``.
    """
    if not specs:
        return
    names = [spec.name for spec in specs]
    new_topics = [NewTopic(s.name, s.partitions, 1, topic_configs=dict(s.config)) for s in specs]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **(client_config or {}))
    try:
        await admin.start()
        _check_create_response(await admin.create_topics(new_topics))
        # The controller acknowledges before the broker has loaded the new partitions;
        # waiting for leaders means producers never see UNKNOWN_TOPIC_OR_PARTITION.
        while True:
            if await _leaders_ready(admin, names):
                return
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def create_topics(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    timeout: float = 30,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Sync version of ``create_topics_async``, bounded by ``timeout`` seconds."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await create_topics_async(bootstrap_servers, specs, client_config)

    run_sync(bounded)


# --------------------------------------------------------------------------------------------
# LocalKafka
# --------------------------------------------------------------------------------------------


class LocalKafka:
    """A single-node KRaft broker running as a child JVM, with its state in ``data_dir``.

    ``port`` fixes the client (PLAINTEXT) port; by default a free loopback port is picked on the
    first start (the previous one of ``data_dir`` if it is free) and kept for restarts, so
    clients can reconnect to the same address.
    ``detach`` starts the JVM in its own session so that it outlives this Python process
    (the CLI uses it); otherwise the broker is also stopped when this process exits.

    ``scram_users`` (name -> password) turns on the secured mode: the client listener is
    SASL_PLAINTEXT with SCRAM-SHA-256 and SCRAM-SHA-512, these users exist from the first
    start, and the StandardAuthorizer denies everything that no ACL allows. The users must
    include ``admin``, the super user that the broker itself and topic creation use; give
    the others rights with :meth:`grant` and connect with :meth:`client_config`. A data dir
    keeps the users it was first formatted with. ``tls`` adds a SASL_SSL listener
    (``tls_bootstrap_servers``) whose certificate, for 127.0.0.1, a local CA signed
    (``ca_file``).
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        topics: Sequence[TopicSpec] = DEFAULT_TOPICS,
        extra_config: Mapping[str, str] | None = None,
        *,
        detach: bool = False,
        scram_users: Mapping[str, str] | None = None,
        tls: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.topics = tuple(topics)
        self.extra_config = dict(extra_config or {})
        self.detach = detach
        self.scram_users = dict(scram_users or {})
        self.tls = tls
        if tls and not self.scram_users:
            raise ValueError("tls=True needs scram_users (the TLS listener is SASL_SSL)")
        if self.scram_users:
            if ADMIN_USER not in self.scram_users:
                raise ValueError(f"scram_users must include the super user {ADMIN_USER!r}")
            for name, password in self.scram_users.items():
                if not (_SAFE_CREDENTIAL.fullmatch(name) and _SAFE_CREDENTIAL.fullmatch(password)):
                    raise ValueError(
                        f"SCRAM user {name!r}: names and passwords may only use "
                        "letters, digits and . _ ~ -"
                    )
        self._port = port
        self._controller_port: int | None = None
        self._tls_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[Any, LocalKafka] | None = None

    # -- properties ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalKafka has no port before the first start()")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_NAME

    @property
    def secured(self) -> bool:
        return bool(self.scram_users)

    @property
    def tls_bootstrap_servers(self) -> str:
        """The SASL_SSL listener's address (``tls=True``)."""
        if self._tls_port is None:
            raise RuntimeError("LocalKafka has a TLS listener only with tls=True, once started")
        return f"{HOST}:{self._tls_port}"

    @property
    def ca_file(self) -> Path:
        """PEM certificate of the CA that signed the TLS listener's certificate."""
        return self.data_dir / TLS_DIR_NAME / "ca.pem"

    @property
    def security_protocol(self) -> str:
        """The client listener's protocol: PLAINTEXT, or SASL_PLAINTEXT when secured."""
        return "SASL_PLAINTEXT" if self.secured else "PLAINTEXT"

    def client_config(
        self, user: str = ADMIN_USER, mechanism: str = "SCRAM-SHA-256"
    ) -> dict[str, Any]:
        """aiokafka keyword arguments to connect as ``user`` (empty when not secured)."""
        if not self.secured:
            return {}
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"mechanism must be one of {SCRAM_MECHANISMS}")
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": self.scram_users[user],
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 90) -> None:
        """Start the broker and block until it serves requests and ``topics`` exist.

        ``timeout`` covers the broker start, not the one-off jar fetch. Raises RuntimeError
        with the tail of the broker logs if the JVM exits or the broker is not ready in time.
        """
        if self.running:
            return
        self._forget_process()  # a broker that died on its own leaves a stale pid file
        libs = ensure_jars()
        self._refuse_foreign_broker()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config(*self._choose_ports())
        if not (self.data_dir / LOG_DIRS_NAME / "meta.properties").exists():
            _format_storage(libs, self.data_dir, self.config_path, self.scram_users)
        self._spawn(libs)
        try:
            self._wait_until_ready(time.monotonic() + timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 30) -> None:
        """Shut the broker down cleanly (SIGTERM), SIGKILL it after ``timeout``. Idempotent."""
        if self._proc is not None:
            _terminate_child(self._proc, timeout)
        self._forget_process()

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would; ``start()`` then recovers from the same data."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._forget_process()

    def restart(self, timeout: float = 90) -> None:
        """Stop and start again on the same ports and data."""
        self.stop()
        self.start(timeout)

    def create_topics(self, specs: Sequence[TopicSpec], timeout: float = 30) -> None:
        """Create topics on the running broker (existing ones are kept as they are)."""
        if not self.running:
            raise RuntimeError("LocalKafka.create_topics() needs a started broker")
        create_topics(self.bootstrap_servers, specs, timeout, self.client_config())

    def grant(
        self,
        principal: str,
        operations: Sequence[str],
        *,
        topic: str | None = None,
        group: str | None = None,
        prefixed: bool = False,
        timeout: float = 30,
    ) -> None:
        """Allow ``principal`` (``"alice"`` or ``"User:alice"``) ``operations`` on one topic
        or one consumer group, and return once the broker enforces it.

        Operations are Kafka's ACL operations, case-insensitive: read, write, describe,
        create, delete, alter, describe_configs, alter_configs, all (read and write imply
        describe). ``"*"`` names every topic or group; ``prefixed`` makes the name a prefix.
        Secured mode only.
        """
        if not self.secured:
            raise RuntimeError("LocalKafka.grant() needs a broker started with scram_users")
        if not self.running:
            raise RuntimeError("LocalKafka.grant() needs a started broker")
        self._change_acls(
            "grant", create_acls_async, principal, operations, topic, group, prefixed, timeout
        )

    def revoke(
        self,
        principal: str,
        operations: Sequence[str],
        *,
        topic: str | None = None,
        group: str | None = None,
        prefixed: bool = False,
        timeout: float = 30,
    ) -> None:
        """Remove what ``grant()`` with the same arguments allowed, and return once the
        broker no longer allows it (a right revoked from a running client). Secured mode
        only."""
        if not self.secured or not self.running:
            raise RuntimeError("LocalKafka.revoke() needs a started broker with scram_users")
        self._change_acls(
            "revoke", delete_acls_async, principal, operations, topic, group, prefixed, timeout
        )

    def _change_acls(
        self,
        name: str,
        change: Callable[[str, Mapping[str, Any], Sequence[AclBinding]], Awaitable[None]],
        principal: str,
        operations: Sequence[str],
        topic: str | None,
        group: str | None,
        prefixed: bool,
        timeout: float,
    ) -> None:
        """Apply ``change`` (create or delete) to the bindings of ``principal``'s
        ``operations`` on one topic or one group."""
        if (topic is None) == (group is None):
            raise ValueError(f"{name}() takes exactly one of topic= or group=")
        resource_type, resource = ("topic", topic) if topic is not None else ("group", group)
        assert resource is not None
        unknown = [op for op in operations if op.lower() not in OPERATIONS]
        if unknown or not operations:
            raise ValueError(f"operations must be some of {sorted(OPERATIONS)}, not {unknown}")
        bindings = [
            AclBinding(
                principal if ":" in principal else f"User:{principal}",
                resource_type,
                resource,
                operation.lower(),
                "prefixed" if prefixed else "literal",
            )
            for operation in operations
        ]
        admin = self.client_config()

        async def bounded() -> None:
            async with asyncio.timeout(timeout):
                await change(self.bootstrap_servers, admin, bindings)

        run_sync(bounded)

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- start helpers ---------------------------------------------------------------------------

    def _refuse_foreign_broker(self) -> None:
        # Two brokers on one log dir would fight over its lock; say so instead of a JVM trace.
        pid = running_pid(self.data_dir)
        if pid is not None:
            raise RuntimeError(
                f"a broker (pid {pid}) already runs from {self.data_dir}; "
                "stop it first (python -m scripts.kafka_local stop --data-dir ...)"
            )

    def _choose_ports(self) -> tuple[int, int]:
        # Chosen once and kept, so that restart() serves the same address; a new LocalKafka on
        # an old data dir (CLI stop/start) also keeps the old address when it can.
        if self._port is None:
            self._port = _previous_port(self.data_dir) or free_port()
        while self._controller_port is None or self._controller_port == self._port:
            self._controller_port = free_port()
        while self.tls and self._tls_port in (None, self._port, self._controller_port):
            self._tls_port = free_port()
        return self._port, self._controller_port

    def _write_config(self, port: int, controller_port: int) -> None:
        extra = dict(self.extra_config)
        if self.secured:
            tls = make_tls_files(self.data_dir / TLS_DIR_NAME) if self.tls else None
            secured = secured_server_properties(
                port, controller_port, self.scram_users[ADMIN_USER], tls, self._tls_port
            )
            extra = {**secured, **extra}
        text = render_server_properties(port, controller_port, self.data_dir / LOG_DIRS_NAME, extra)
        # Secured mode keeps the admin password in here: readable by its owner only.
        self.config_path.touch(mode=0o600)
        self.config_path.chmod(0o600)
        self.config_path.write_text(text)

    def _spawn(self, libs: Path) -> None:
        command = _java_command(libs, self.data_dir, "kafka.Kafka", str(self.config_path))
        with (self.data_dir / OUT_NAME).open("ab") as out:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=self.detach,
            )
        _write_text_atomic(self.data_dir / PID_NAME, f"{self._proc.pid}\n")
        _write_text_atomic(self.data_dir / BOOTSTRAP_NAME, f"{self.bootstrap_servers}\n")
        if not self.detach:
            # A test that dies without stop() must not leave a JVM behind.
            self._reaper = weakref.finalize(self, _terminate_child, self._proc, 10)

    def _wait_until_ready(self, deadline: float) -> None:
        while not _port_accepts(self.port):
            self._check_alive()
            if time.monotonic() >= deadline:
                self._fail("did not open its port")
            time.sleep(0.1)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            attempt_timeout = min(15.0, max(1.0, deadline - time.monotonic()))
            try:
                create_topics(
                    self.bootstrap_servers, self.topics, attempt_timeout, self.client_config()
                )
                return
            except (kafka_errors.KafkaError, OSError) as error:
                # Until the broker has registered with its controller, admin requests fail.
                last_error = error
                time.sleep(0.2)
        self._fail(f"did not become ready for topic creation (last error: {last_error!r})")

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._fail(f"exited with status {self._proc.returncode}")

    def _fail(self, what: str) -> None:
        raise RuntimeError(
            f"local Kafka broker in {self.data_dir} {what}.\n"
            f"--- {OUT_NAME} (tail) ---\n{_tail_file(self.data_dir / OUT_NAME)}\n"
            f"--- {LOG_NAME} (tail) ---\n{_tail_file(self.data_dir / LOG_NAME)}"
        )

    def _forget_process(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None
        if self._proc is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / PID_NAME).unlink()
        self._proc = None


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _read_bootstrap(data_dir: Path) -> str:
    try:
        return (data_dir / BOOTSTRAP_NAME).read_text().strip()
    except FileNotFoundError:
        return "(unknown address)"


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    if running_pid(data_dir) is not None:
        print(_read_bootstrap(data_dir))
        return 0
    broker = LocalKafka(data_dir, port=args.port, detach=True)
    broker.start(timeout=args.timeout)
    print(broker.bootstrap_servers)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    pid = running_pid(data_dir)
    if pid is not None:
        terminate_pid(pid, data_dir / CONFIG_NAME, timeout=args.timeout)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / PID_NAME).unlink()
    print("stopped")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    if running_pid(data_dir) is None:
        print("stopped")
        return 1
    print(f"running {_read_bootstrap(data_dir)}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(ensure_jars())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.kafka_local",
        description="Run a local single-node Kafka (KRaft) broker for tests and local runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.set_defaults(handler=handler)
        return sub

    start = add("start", "start a detached broker and print its bootstrap address", _cmd_start)
    start.add_argument("--port", type=int, default=None, help="client port (default: free)")
    start.add_argument("--timeout", type=float, default=90, help="seconds to wait for readiness")
    stop = add("stop", "stop the broker running from the data dir", _cmd_stop)
    stop.add_argument("--timeout", type=float, default=30, help="seconds before SIGKILL")
    status = add("status", "print running/stopped (exit status 0/1)", _cmd_status)
    add("fetch", "only fetch the broker jars into the cache (CI cache warming)", _cmd_fetch)
    for sub in (start, stop, status):
        sub.add_argument(
            "--data-dir",
            type=Path,
            default=default_data_dir(),
            help="broker state, logs, pid file (default: %(default)s)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
