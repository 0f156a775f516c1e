"""The Kafka client's base error, for callers that catch it without importing the client."""

from __future__ import annotations

from aiokafka.errors import KafkaError

__all__ = ["KafkaError"]
