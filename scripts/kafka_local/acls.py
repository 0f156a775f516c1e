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
from typing import Any, TypedDict

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
    "AclTarget",
    "acl_bindings",
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


class AclTarget(TypedDict, total=False):
    """What ``LocalKafka.grant()`` and ``revoke()`` apply to: exactly one of ``topic`` and
    ``group`` (``"*"`` names every one; ``prefixed`` makes the name a prefix), and how many
    seconds to wait for the broker (``timeout``, 30 by default)."""

    topic: str | None
    group: str | None
    prefixed: bool
    timeout: float


def acl_bindings(
    call: str, principal: str, operations: Sequence[str], target: AclTarget
) -> list[AclBinding]:
    """The bindings of ``principal``'s ``operations`` (case-insensitive) on ``target``;
    ``call`` names the caller in errors."""
    unexpected = sorted(set(target) - AclTarget.__optional_keys__)
    if unexpected:
        raise TypeError(f"{call}() got unexpected keyword arguments {unexpected}")
    topic, group = target.get("topic"), target.get("group")
    if (topic is None) == (group is None):
        raise ValueError(f"{call}() takes exactly one of topic= or group=")
    resource_type, resource = ("topic", topic) if topic is not None else ("group", group)
    assert resource is not None
    unknown = [op for op in operations if op.lower() not in OPERATIONS]
    if unknown or not operations:
        raise ValueError(f"operations must be some of {sorted(OPERATIONS)}, not {unknown}")
    return [
        AclBinding(
            principal if ":" in principal else f"User:{principal}",
            resource_type,
            resource,
            operation.lower(),
            "prefixed" if target.get("prefixed", False) else "literal",
        )
        for operation in operations
    ]


# -- the three requests, version 2 -------------------------------------------------------------

_STRING = CompactString("utf-8")
_TAGS = ("tags", TaggedFields)
# One binding as the wire carries it; a filter (DescribeAcls, DeleteAcls) has the same layout,
# its fields named *_filter in Kafka's JSON, and with every field given matches one binding.
_BINDING = (
    ("resource_type", Int8),
    ("resource_name", _STRING),
    ("pattern_type", Int8),
    ("principal", _STRING),
    ("host", _STRING),
    ("operation", Int8),
    ("permission_type", Int8),
    _TAGS,
)
_ERROR = (("error_code", Int16), ("error_message", _STRING))


def _acl_api(api_key: int, request: Schema, response: Schema) -> Any:
    """A ``Request`` class for version 2 of ``api_key``: built from the request struct's
    field values, answered with a struct of ``response``."""

    class ResponseV2(Response):  # type: ignore[misc]
        API_KEY = api_key
        API_VERSION = 2
        SCHEMA = response

    class RequestV2(RequestStruct):  # type: ignore[misc]
        FLEXIBLE_VERSION = True
        API_KEY = api_key
        API_VERSION = 2
        RESPONSE_TYPE = ResponseV2
        SCHEMA = request

    class AclRequest(Request[RequestV2]):  # type: ignore[misc]
        API_KEY = api_key

        def __init__(self, *values: Any) -> None:
            self._values = values

        def build(self, request_struct_class: type[RequestV2]) -> RequestV2:
            return request_struct_class(*self._values)

    return AclRequest


_CreateAcls = _acl_api(
    30,
    Schema(("creations", CompactArray(*_BINDING)), _TAGS),
    Schema(("throttle_time_ms", Int32), ("results", CompactArray(*_ERROR, _TAGS)), _TAGS),
)
_DescribeAcls = _acl_api(
    29,
    Schema(*_BINDING),
    Schema(
        ("throttle_time_ms", Int32),
        *_ERROR,
        (
            "resources",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", _STRING),
                ("pattern_type", Int8),
                (
                    "acls",
                    CompactArray(
                        ("principal", _STRING),
                        ("host", _STRING),
                        ("operation", Int8),
                        ("permission_type", Int8),
                        _TAGS,
                    ),
                ),
                _TAGS,
            ),
        ),
        _TAGS,
    ),
)
_DeleteAcls = _acl_api(
    31,
    Schema(("filters", CompactArray(*_BINDING)), _TAGS),
    Schema(
        ("throttle_time_ms", Int32),
        (
            "results",  # filter_results in Kafka's JSON
            CompactArray(*_ERROR, ("matching_acls", CompactArray(*_ERROR, *_BINDING)), _TAGS),
        ),
        _TAGS,
    ),
)


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
    match_all = _DescribeAcls(_ANY, None, _ANY, None, None, _ANY, _ANY, {})
    response = await _send(bootstrap_servers, client_config, match_all)
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
    await _change(bootstrap_servers, client_config, bindings, create=True)


async def delete_acls_async(
    bootstrap_servers: str, client_config: Mapping[str, Any], bindings: Sequence[AclBinding]
) -> None:
    """Delete ``bindings`` and wait until the broker no longer enforces them (as for
    ``create_acls_async``, the broker's authorizer may apply the change a moment after the
    controller committed it). No deadline of its own: callers bound it."""
    await _change(bootstrap_servers, client_config, bindings, create=False)


async def _change(
    bootstrap_servers: str,
    client_config: Mapping[str, Any],
    bindings: Sequence[AclBinding],
    *,
    create: bool,
) -> None:
    """Create or delete ``bindings``, then poll DescribeAcls until the broker's authorizer
    holds them all (create) or none of them (delete)."""
    if not bindings:
        return
    api, verb = (_CreateAcls, "creating") if create else (_DeleteAcls, "deleting")
    request = api([binding.wire() for binding in bindings], {})
    response = await _send(bootstrap_servers, client_config, request)
    failures = [
        f"{binding}: {kafka_errors.for_code(code).__name__} {message or ''}".strip()
        for binding, (code, message, *_) in zip(bindings, response.results, strict=True)
        if code
    ]
    if failures:
        raise AclError(f"{verb} ACLs failed:\n" + "\n".join(failures))
    changed = set(bindings)
    while True:
        held = await describe_acls_async(bootstrap_servers, client_config)
        if (changed <= held) if create else not (changed & held):
            return
        await asyncio.sleep(0.05)
