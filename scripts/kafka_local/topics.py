"""The local broker's topics: the fleet's topic plan (``kembed_shared.kafka.topics``, the
code ``kembed topics create`` runs) for the default settings, with the partition counts the
tests and load tests expect. The creation helpers are re-exported from there."""

from __future__ import annotations

from kembed_shared.kafka.topics import (
    CATALOG_TOPIC_CONFIG,
    TopicCreationError,
    TopicNeeds,
    TopicSpec,
    create_topics,
    create_topics_async,
    plan,
    run_sync,
)

__all__ = [
    "CATALOG_TOPIC_CONFIG",
    "DEFAULT_TOPICS",
    "TopicCreationError",
    "TopicSpec",
    "create_topics",
    "create_topics_async",
    "run_sync",
]

# Request topics take twice the workers' max_request_bytes (4 MiB), so an oversized request
# reaches a worker and is answered with message_too_large instead of being refused by the
# broker with no answer at all; the catalog is compacted (see the plan).
DEFAULT_TOPICS: tuple[TopicSpec, ...] = tuple(
    plan(TopicNeeds(), partitions=4, results_partitions=8)
)
