"""Create, list and delete Kafka ACLs from Python, for the local broker's secured mode.

aiokafka 0.14's admin client has no ACL methods, and the CreateAcls/DescribeAcls request
versions it ships (v0-v1) were removed from Kafka 4.0 (KIP-896). The v2 requests (the first
"flexible" versions, still served by Kafka 4.x) are small, so they are declared here with
aiokafka's protocol types and sent over an authenticated ``AIOKafkaClient``: no JVM start
per grant, and no extra jar in the broker's cache.

Wire layouts follow Kafka's ``CreateAclsRequest.json`` / ``DescribeAclsRequest.json`` /
``DeleteAclsRequest.json``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

__all__ = [
    "OPERATIONS",
    "AclBinding",
    "AclError",
    "create_acls_async",
    "delete_acls_async",
    "describe_acls_async",
]

# org.apache.kafka.common.resource.ResourceType codes.
RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
# org.apache.kafka.common.resource.PatternType codes.
PATTERN_TYPES = {"literal": 3, "prefixed": 4}
# org.apache.kafka.common.acl.AclOperation codes.
OPERATIONS = {
    "all": 2,
    "read": 3,
    "write": 4,
    "create": 5,
    "delete": 6,
    "alter": 7,
    "describe": 8,
    "cluster_action": 9,
    "describe_configs": 10,
    "alter_configs": 11,
    "idempotent_write": 12,
}
_ANY = 1  # the "any" value of every filter enum
_ALLOW = 3  # AclPermissionType.ALLOW


class AclError(RuntimeError):
    """The broker refused to create (or list) an ACL."""


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may do ``operation`` on a resource, from ``host``."""

    principal: str
    resource_type: str
    resource_name: str
    operation: str
    pattern: str = "literal"
    host: str = "*"

    def __post_init__(self) -> None:
        for value, known in (
            (self.resource_type, RESOURCE_TYPES),
            (self.operation, OPERATIONS),
            (self.pattern, PATTERN_TYPES),
        ):
            if value not in known:
                raise ValueError(f"{value!r} is not one of {sorted(known)}")
        if ":" not in self.principal:
            raise ValueError(f"principal {self.principal!r} must look like 'User:name'")

    def wire(self) -> tuple[int, str, int, str, str, int, int, dict[int, bytes]]:
        return (
            RESOURCE_TYPES[self.resource_type],
            self.resource_name,
            PATTERN_TYPES[self.pattern],
            self.principal,
            self.host,
            OPERATIONS[self.operation],
            _ALLOW,
            {},
        )


# -- CreateAcls v2 (API key 30) ------------------------------------------------------------------


class _CreateAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 30
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAclsRequestV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 30
    API_VERSION = 2
    RESPONSE_TYPE = _CreateAclsResponseV2
    SCHEMA = Schema(
        (
            "creations",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("resource_pattern_type", Int8),
                ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _CreateAclsRequest(Request[_CreateAclsRequestV2]):  # type: ignore[misc]
    API_KEY = 30

    def __init__(self, bindings: Sequence[AclBinding]) -> None:
        self._bindings = bindings

    def build(self, request_struct_class: type[_CreateAclsRequestV2]) -> _CreateAclsRequestV2:
        return request_struct_class([b.wire() for b in self._bindings], {})


# -- DescribeAcls v2 (API key 29) ----------------------------------------------------------------


class _DescribeAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 29
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        (
            "resources",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("pattern_type", Int8),
                (
                    "acls",
                    CompactArray(
                        ("principal", CompactString("utf-8")),
                        ("host", CompactString("utf-8")),
                        ("operation", Int8),
                        ("permission_type", Int8),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeAclsRequestV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 29
    API_VERSION = 2
    RESPONSE_TYPE = _DescribeAclsResponseV2
    SCHEMA = Schema(
        ("resource_type_filter", Int8),
        ("resource_name_filter", CompactString("utf-8")),
        ("pattern_type_filter", Int8),
        ("principal_filter", CompactString("utf-8")),
        ("host_filter", CompactString("utf-8")),
        ("operation", Int8),
        ("permission_type", Int8),
        ("tags", TaggedFields),
    )


class _DescribeAllAclsRequest(Request[_DescribeAclsRequestV2]):  # type: ignore[misc]
    API_KEY = 29

    def build(self, request_struct_class: type[_DescribeAclsRequestV2]) -> _DescribeAclsRequestV2:
        return request_struct_class(_ANY, None, _ANY, None, None, _ANY, _ANY, {})


# -- DeleteAcls v2 (API key 31) ------------------------------------------------------------------


class _DeleteAclsResponseV2(Response):  # type: ignore[misc]
    API_KEY = 31
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "filter_results",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                (
                    "matching_acls",
                    CompactArray(
                        ("error_code", Int16),
                        ("error_message", CompactString("utf-8")),
                        ("resource_type", Int8),
                        ("resource_name", CompactString("utf-8")),
                        ("pattern_type", Int8),
                        ("principal", CompactString("utf-8")),
                        ("host", CompactString("utf-8")),
                        ("operation", Int8),
                        ("permission_type", Int8),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DeleteAclsRequestV2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 31
    API_VERSION = 2
    RESPONSE_TYPE = _DeleteAclsResponseV2
    SCHEMA = Schema(
        (
            "filters",
            CompactArray(
                ("resource_type_filter", Int8),
                ("resource_name_filter", CompactString("utf-8")),
                ("pattern_type_filter", Int8),
                ("principal_filter", CompactString("utf-8")),
                ("host_filter", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DeleteAclsRequest(Request[_DeleteAclsRequestV2]):  # type: ignore[misc]
    API_KEY = 31

    def __init__(self, bindings: Sequence[AclBinding]) -> None:
        self._bindings = bindings

    def build(self, request_struct_class: type[_DeleteAclsRequestV2]) -> _DeleteAclsRequestV2:
        # A filter with every field given matches exactly its binding.
        return request_struct_class([b.wire() for b in self._bindings], {})


# -- calls ---------------------------------------------------------------------------------------


async def _send(
    bootstrap_servers: str, client_config: Mapping[str, Any], request: Request[Any]
) -> Any:
    client = AIOKafkaClient(bootstrap_servers=bootstrap_servers, **client_config)
    try:
        await client.bootstrap()
        node = client.get_random_node()
        return await client.send(node, request)
    finally:
        await client.close()


async def describe_acls_async(
    bootstrap_servers: str, client_config: Mapping[str, Any]
) -> set[AclBinding]:
    """Every ALLOW binding the broker's authorizer currently holds."""
    response = await _send(bootstrap_servers, client_config, _DescribeAllAclsRequest())
    if response.error_code:
        error = kafka_errors.for_code(response.error_code).__name__
        raise AclError(f"listing ACLs failed: {error} {response.error_message or ''}".strip())
    names = {code: name for name, code in RESOURCE_TYPES.items()}
    patterns = {code: name for name, code in PATTERN_TYPES.items()}
    operations = {code: name for name, code in OPERATIONS.items()}
    return {
        AclBinding(principal, names[rtype], rname, operations[op], patterns[ptype], host)
        for rtype, rname, ptype, acls, _ in response.resources
        if rtype in names and ptype in patterns
        for principal, host, op, permission, _ in acls
        if permission == _ALLOW and op in operations
    }


async def create_acls_async(
    bootstrap_servers: str, client_config: Mapping[str, Any], bindings: Sequence[AclBinding]
) -> None:
    """Create ``bindings`` and wait until the broker enforces them.

    The broker forwards CreateAcls to the controller and answers once the change is
    committed, which can be a moment before the broker's own authorizer has applied it; a
    client connecting right after would still be denied. So this polls DescribeAcls (which
    the broker answers from its authorizer) until every binding shows. No deadline of its
    own: callers bound it with ``asyncio.timeout``.
    """
    if not bindings:
        return
    response = await _send(bootstrap_servers, client_config, _CreateAclsRequest(bindings))
    failures = [
        f"{binding}: {kafka_errors.for_code(code).__name__} {message or ''}".strip()
        for binding, (code, message, _) in zip(bindings, response.results, strict=True)
        if code
    ]
    if failures:
        raise AclError("creating ACLs failed:\n" + "\n".join(failures))
    wanted = set(bindings)
    while True:
        if wanted <= await describe_acls_async(bootstrap_servers, client_config):
            return
        await asyncio.sleep(0.05)


async def delete_acls_async(
    bootstrap_servers: str, client_config: Mapping[str, Any], bindings: Sequence[AclBinding]
) -> None:
    """Delete ``bindings`` and wait until the broker no longer enforces them (as for
    ``create_acls_async``, the broker's authorizer may apply the change a moment after the
    controller committed it). No deadline of its own: callers bound it."""
    if not bindings:
        return
    response = await _send(bootstrap_servers, client_config, _DeleteAclsRequest(bindings))
    failures = [
        f"{binding}: {kafka_errors.for_code(code).__name__} {message or ''}".strip()
        for binding, (code, message, _, _) in zip(bindings, response.filter_results, strict=True)
        if code
    ]
    if failures:
        raise AclError("deleting ACLs failed:\n" + "\n".join(failures))
    gone = set(bindings)
    while True:
        if not gone & await describe_acls_async(bootstrap_servers, client_config):
            return
        await asyncio.sleep(0.05)
