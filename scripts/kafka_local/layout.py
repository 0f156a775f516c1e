"""Where the local broker keeps things: the Kafka version and its jar cache, the Maven and
log4j files in the clone, and the names of the files in a broker's data dir."""

from __future__ import annotations

import os
from pathlib import Path

from scripts.local_server import LOOPBACK

KAFKA_VERSION = "4.1.1"
HOST = LOOPBACK
NODE_ID = 1

KAFKA_DIR = Path(__file__).resolve().parents[1] / "kafka"
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
