"""Kafka client errors, for the layers above that catch them: they import this module, not
aiokafka (aiokafka is imported only in ``kembed_shared.kafka``, the SDK's transport and its
catalog reader; see the import contracts in pyproject.toml)."""

from __future__ import annotations

from aiokafka.errors import KafkaError

__all__ = ["KafkaError"]
