"""Run a local single-node Apache Kafka 4.x broker (KRaft mode) for tests and local runs.

Why this exists: the integration tests and local development need a real Kafka broker, but not
Docker or a system-wide install. A KRaft broker is a single JVM process, so this package fetches
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
logins and ACLs (``grant()``, via ``acls.py``), with ``admin`` the super user.

Broker logs go to ``DATA_DIR/broker.log`` (INFO) and ``DATA_DIR/broker.out`` (JVM stdout/stderr,
log ERRORs only).

One job a module: ``layout`` (version, cache and data-dir locations), ``maven`` (the jars),
``process`` (the JVM process, ports, pid file), ``config`` (``server.properties``, storage
format), ``tls`` (CA and broker certificate), ``topics``, ``acls``, ``broker``
(``LocalKafka``) and ``cli``. This module re-exports what the tests and load tests use.
"""

from scripts.kafka_local.acls import (
    OPERATIONS,
    AclBinding,
    AclError,
    create_acls_async,
    delete_acls_async,
    describe_acls_async,
)
from scripts.kafka_local.broker import LocalKafka
from scripts.kafka_local.config import (
    ADMIN_USER,
    SCRAM_MECHANISMS,
    render_server_properties,
    secured_server_properties,
)
from scripts.kafka_local.layout import (
    HOST,
    KAFKA_VERSION,
    NODE_ID,
    cache_root,
    default_data_dir,
    kafka_version,
    libs_dir,
)
from scripts.kafka_local.maven import ensure_jars
from scripts.kafka_local.process import DEFAULT_HEAP, running_pid, terminate_pid
from scripts.kafka_local.tls import TlsFiles, make_tls_files
from scripts.kafka_local.topics import (
    CATALOG_TOPIC_CONFIG,
    DEFAULT_TOPICS,
    TopicCreationError,
    TopicSpec,
    create_topics,
    create_topics_async,
    run_sync,
)
from scripts.local_server import free_port

__all__ = [
    "ADMIN_USER",
    "CATALOG_TOPIC_CONFIG",
    "DEFAULT_HEAP",
    "DEFAULT_TOPICS",
    "HOST",
    "KAFKA_VERSION",
    "NODE_ID",
    "OPERATIONS",
    "SCRAM_MECHANISMS",
    "AclBinding",
    "AclError",
    "LocalKafka",
    "TlsFiles",
    "TopicCreationError",
    "TopicSpec",
    "cache_root",
    "create_acls_async",
    "create_topics",
    "create_topics_async",
    "default_data_dir",
    "delete_acls_async",
    "describe_acls_async",
    "ensure_jars",
    "free_port",
    "kafka_version",
    "libs_dir",
    "make_tls_files",
    "render_server_properties",
    "run_sync",
    "running_pid",
    "secured_server_properties",
    "terminate_pid",
]
