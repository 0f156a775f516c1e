"""The broker's configuration: ``server.properties`` for one KRaft node, the overrides of
the secured mode (SASL/SCRAM, ACLs, TLS), and formatting its storage with the SCRAM users."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from scripts.kafka_local.layout import HOST, NODE_ID
from scripts.kafka_local.process import java_command
from scripts.kafka_local.tls import TlsFiles

# Secured mode: the super user that the broker itself and topic creation authenticate as.
ADMIN_USER = "admin"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# Names and passwords end up in server.properties (JAAS) and StorageTool arguments: keep them
# to characters that need no quoting in either.
_SAFE_CREDENTIAL = re.compile(r"[A-Za-z0-9._~-]+")


def check_scram_users(scram_users: Mapping[str, str]) -> None:
    """Raise ValueError unless the users include ``admin`` and need no quoting anywhere."""
    if ADMIN_USER not in scram_users:
        raise ValueError(f"scram_users must include the super user {ADMIN_USER!r}")
    for name, password in scram_users.items():
        if not (_SAFE_CREDENTIAL.fullmatch(name) and _SAFE_CREDENTIAL.fullmatch(password)):
            raise ValueError(
                f"SCRAM user {name!r}: names and passwords may only use letters, digits and . _ ~ -"
            )


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


def _random_cluster_id() -> str:
    # Same format as `kafka-storage random-uuid` (base64url of 16 random bytes, never starting
    # with "-"), generated here to save a JVM start.
    while True:
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def format_storage(
    libs: Path, data_dir: Path, config: Path, scram_users: Mapping[str, str] | None = None
) -> None:
    """Format the KRaft storage of ``config`` (a new cluster id), with ``scram_users``."""
    # SCRAM credentials written at format time (KIP-900) exist before the broker first
    # starts, so the broker can authenticate its own inter-broker connections as admin.
    scram = [
        arg
        for name, password in (scram_users or {}).items()
        for mechanism in SCRAM_MECHANISMS
        for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
    ]
    command = java_command(
        libs, data_dir, "kafka.tools.StorageTool",
        "format", "--ignore-formatted", "-t", _random_cluster_id(), "-c", str(config), *scram,
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        for password in (scram_users or {}).values():
            output = output.replace(password, "***")
        raise RuntimeError(f"formatting Kafka storage in {data_dir} failed:\n{output}")
