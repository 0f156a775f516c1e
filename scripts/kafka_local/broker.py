"""``LocalKafka``: a single-node KRaft broker as a child JVM, for tests and local runs."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

from aiokafka import errors as kafka_errors

from scripts.kafka_local.acls import (
    AclBinding,
    AclTarget,
    acl_bindings,
    create_acls_async,
    delete_acls_async,
)
from scripts.kafka_local.config import (
    ADMIN_USER,
    SCRAM_MECHANISMS,
    check_scram_users,
    format_storage,
    render_server_properties,
    secured_server_properties,
)
from scripts.kafka_local.layout import (
    BOOTSTRAP_NAME,
    CONFIG_NAME,
    HOST,
    LOG_DIRS_NAME,
    LOG_NAME,
    OUT_NAME,
    PID_NAME,
    TLS_DIR_NAME,
)
from scripts.kafka_local.maven import ensure_jars
from scripts.kafka_local.process import (
    java_command,
    port_accepts,
    previous_port,
    running_pid,
    tail_file,
    terminate_child,
    write_text_atomic,
)
from scripts.kafka_local.tls import make_tls_files
from scripts.kafka_local.topics import DEFAULT_TOPICS, TopicSpec, create_topics, run_sync
from scripts.local_server import LocalServer, free_port


class LocalKafka(LocalServer):
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
            check_scram_users(self.scram_users)
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
            format_storage(libs, self.data_dir, self.config_path, self.scram_users)
        self._spawn(libs)
        try:
            self._wait_until_ready(time.monotonic() + timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 30) -> None:
        """Shut the broker down cleanly (SIGTERM), SIGKILL it after ``timeout``. Idempotent."""
        if self._proc is not None:
            terminate_child(self._proc, timeout)
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

    def grant(self, principal: str, operations: Sequence[str], **target: Unpack[AclTarget]) -> None:
        """Allow ``principal`` (``"alice"`` or ``"User:alice"``) ``operations`` on one topic
        or one consumer group (``topic=`` or ``group=``), and return once the broker
        enforces it.

        Operations are Kafka's ACL operations, case-insensitive: read, write, describe,
        create, delete, alter, describe_configs, alter_configs, all (read and write imply
        describe). ``"*"`` names every topic or group; ``prefixed=True`` makes the name a
        prefix; ``timeout`` (seconds, default 30) bounds the wait. Secured mode only.
        """
        if not self.secured:
            raise RuntimeError("LocalKafka.grant() needs a broker started with scram_users")
        if not self.running:
            raise RuntimeError("LocalKafka.grant() needs a started broker")
        bindings = acl_bindings("grant", principal, operations, target)
        self._change_acls(create_acls_async, bindings, target.get("timeout", 30))

    def revoke(
        self, principal: str, operations: Sequence[str], **target: Unpack[AclTarget]
    ) -> None:
        """Remove what ``grant()`` with the same arguments allowed, and return once the
        broker no longer allows it (a right revoked from a running client). Secured mode
        only."""
        if not self.secured or not self.running:
            raise RuntimeError("LocalKafka.revoke() needs a started broker with scram_users")
        bindings = acl_bindings("revoke", principal, operations, target)
        self._change_acls(delete_acls_async, bindings, target.get("timeout", 30))

    def _change_acls(
        self,
        change: Callable[[str, Mapping[str, Any], Sequence[AclBinding]], Awaitable[None]],
        bindings: Sequence[AclBinding],
        timeout: float,
    ) -> None:
        """Apply ``change`` (create or delete) to ``bindings`` within ``timeout`` seconds."""
        admin = self.client_config()

        async def bounded() -> None:
            async with asyncio.timeout(timeout):
                await change(self.bootstrap_servers, admin, bindings)

        run_sync(bounded)

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
            self._port = previous_port(self.data_dir) or free_port()
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
        command = java_command(libs, self.data_dir, "kafka.Kafka", str(self.config_path))
        with (self.data_dir / OUT_NAME).open("ab") as out:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=self.detach,
            )
        write_text_atomic(self.data_dir / PID_NAME, f"{self._proc.pid}\n")
        write_text_atomic(self.data_dir / BOOTSTRAP_NAME, f"{self.bootstrap_servers}\n")
        if not self.detach:
            # A test that dies without stop() must not leave a JVM behind.
            self._reaper = weakref.finalize(self, terminate_child, self._proc, 10)

    def _wait_until_ready(self, deadline: float) -> None:
        while not port_accepts(self.port):
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
            f"--- {OUT_NAME} (tail) ---\n{tail_file(self.data_dir / OUT_NAME)}\n"
            f"--- {LOG_NAME} (tail) ---\n{tail_file(self.data_dir / LOG_NAME)}"
        )

    def _forget_process(self) -> None:
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None
        if self._proc is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / PID_NAME).unlink()
        self._proc = None
