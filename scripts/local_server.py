"""What the local servers for tests and local runs share: a free loopback port, and
start/stop as a context manager (``scripts/kafka_local``, ``scripts/pg_local``)."""

from __future__ import annotations

import abc
import socket
from typing import Self

__all__ = ["LOOPBACK", "LocalServer", "free_port"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A loopback TCP port that is free right now (another process may still take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalServer(abc.ABC):
    """A server process for tests: ``with Server() as server:`` starts it and stops it."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server and return once it serves."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the server; a no-op when it is not running."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
