"""Read the consumer group's state from the brokers, for ``kembed status``.

Three questions to the cluster: the group's description (members and, decoded from the
consumer protocol, each member's assignment), the group's committed offsets, and the
request partitions' log start and end offsets. Nothing is joined or committed, and no
topic is created by asking about it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError, for_code

from kembed_shared.fleet import FleetStatus, Member, PartitionLag, StatusError

__all__ = ["read_fleet_status"]

# A classic group the coordinator does not know is described as "Dead" (DescribeGroups
# v0-v5); later versions answer GROUP_ID_NOT_FOUND instead.
_UNKNOWN_STATE = "Dead"
_GROUP_ID_NOT_FOUND = 69


async def read_fleet_status(
    bootstrap_servers: str,
    group: str,
    topics: Sequence[str],
    *,
    client_id: str = "kembed-status",
    request_timeout_ms: int = 5000,
    security: Mapping[str, Any] | None = None,
) -> FleetStatus:
    """The group's members, their assignment, and lag per partition of ``topics``.

    Raises :class:`StatusError` when the cluster cannot be reached, the group is unknown,
    or none of ``topics`` exists."""
    # Both of its clients connect alike.
    connection: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "client_id": client_id,
        **(security or {}),  # security_protocol, SASL and TLS (kafka/security.py)
    }
    admin = AIOKafkaAdminClient(**connection, request_timeout_ms=request_timeout_ms)
    try:
        await admin.start()
    except KafkaError as exc:
        raise StatusError(
            f"cannot reach Kafka at {bootstrap_servers} ({type(exc).__name__})"
        ) from None
    try:
        state, protocol, members = await _describe_group(admin, group)
        committed = await admin.list_consumer_group_offsets(group)
        if state == _UNKNOWN_STATE and not committed:
            raise StatusError(
                f"consumer group {group!r} is unknown to the cluster at {bootstrap_servers} "
                "(no members and no committed offsets; check --group)"
            )
        existing = set(await admin.list_topics())
        present = [t for t in dict.fromkeys(topics) if t in existing]
        missing = tuple(t for t in dict.fromkeys(topics) if t not in existing)
        if not present:
            raise StatusError(f"none of the topics {', '.join(topics)} exists")
        described = await admin.describe_topics(present)
    except KafkaError as exc:
        raise StatusError(f"Kafka at {bootstrap_servers} refused the query: {exc}") from None
    finally:
        await admin.close()

    partitions = [
        TopicPartition(t["topic"], p["partition"])
        for t in sorted(described, key=lambda t: present.index(t["topic"]))
        for p in sorted(t["partitions"], key=lambda p: int(p["partition"]))
    ]
    log_start, end = await _log_bounds(connection, partitions)
    owner = {tp: m.member_id for m in members for tp in m.partitions}
    lags = tuple(
        PartitionLag(
            topic=tp.topic,
            partition=tp.partition,
            log_start=log_start[tp],
            end=end[tp],
            committed=_committed(committed.get(tp)),
            member_id=owner.get((tp.topic, tp.partition)),
        )
        for tp in partitions
    )
    return FleetStatus(
        group=group,
        state=state,
        protocol=protocol,
        members=members,
        partitions=lags,
        missing_topics=missing,
    )


async def _describe_group(
    admin: AIOKafkaAdminClient, group: str
) -> tuple[str, str, tuple[Member, ...]]:
    (response,) = await admin.describe_consumer_groups([group])
    error_code, _, state, protocol_type, protocol, raw_members = response.groups[0][:6]
    if error_code == _GROUP_ID_NOT_FOUND:
        return _UNKNOWN_STATE, "", ()
    if error_code:
        raise StatusError(f"cannot describe group {group!r}: {for_code(error_code).__name__}")
    members = tuple(
        sorted(
            (
                Member(
                    member_id=member_id,
                    client_id=client_id,
                    host=client_host.lstrip("/"),
                    partitions=_assignment(protocol_type, assignment),
                )
                for member_id, client_id, client_host, _metadata, assignment in raw_members
            ),
            key=lambda m: (m.client_id, m.member_id),
        )
    )
    return str(state), str(protocol), members


def _assignment(protocol_type: str, raw: bytes) -> tuple[tuple[str, int], ...]:
    """The partitions in a member's consumer-protocol assignment; none while the group
    rebalances (the assignment is then empty) or for groups of another protocol."""
    if protocol_type != "consumer" or not raw:
        return ()
    decoded = ConsumerProtocolMemberAssignment.decode(raw)
    return tuple(sorted((topic, int(p)) for topic, ps in decoded.assignment for p in ps))


def _committed(offset: Any) -> int | None:
    if offset is None or offset.offset < 0:
        return None
    return int(offset.offset)


async def _log_bounds(
    connection: Mapping[str, Any], partitions: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Log start and end (high watermark) offsets, read by a consumer outside any group."""
    consumer = AIOKafkaConsumer(**connection, enable_auto_commit=False)
    try:
        await consumer.start()
        start = await consumer.beginning_offsets(partitions)
        end = await consumer.end_offsets(partitions)
    except KafkaError as exc:
        servers = connection["bootstrap_servers"]
        raise StatusError(f"cannot read offsets from Kafka at {servers}: {exc}") from None
    finally:
        await consumer.stop()
    return dict(start), dict(end)
