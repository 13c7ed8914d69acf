"""What the handlers share for authorization: the broker's `authorizer` in a Protocol
every handler module's broker Protocol includes, and KIP-430's authorized-operations
bit field.

The checks themselves are in the handlers, at the granularity Kafka 4.2's KafkaApis
(and ControllerApis, for the requests a KRaft broker forwards to its controller) makes
them: per partition, topic, group, resource or the whole request. With no authorizer
configured every check allows (`broker.authorizer`), so nothing changes then.
"""

from __future__ import annotations

from typing import Protocol

from broker.authorizer import Authorizer, Requester
from coordinator.acls import CLUSTER_NAME, SUPPORTED_OPERATIONS, AclOperation, ResourceType


class Guarded(Protocol):
    """The broker's authorizer, which every handler module's broker Protocol includes."""

    @property
    def authorizer(self) -> Authorizer: ...


def authorized_operations(
    authorizer: Authorizer,
    ctx: Requester,
    resource_type: ResourceType,
    name: str = CLUSTER_NAME,
) -> int:
    """KIP-430: the operations the principal may do on the resource, one bit per
    operation code (Kafka's AuthHelper.authorizedOperations; denials not logged)."""
    bits = 0
    for op in SUPPORTED_OPERATIONS[resource_type]:
        if authorizer.allows(ctx, op, resource_type, name, log_denied=False):
            bits |= 1 << op
    return bits


# Kafka's default messages for its *_AUTHORIZATION_FAILED errors (Errors.message()),
# which it sends where a response has a message field and nothing more specific.
TOPIC_DENIED = "Topic authorization failed."
GROUP_DENIED = "Group authorization failed."
CLUSTER_DENIED = "Cluster authorization failed."
TRANSACTIONAL_ID_DENIED = "Transactional Id authorization failed."


# What a described group answers when a topic of its members' assignments may not be
# described (Kafka's ShareGroupDescribe and ConsumerGroupDescribe in KafkaApis).
UNDESCRIBABLE_TOPICS = (
    "The group has described topic(s) that the client is not authorized to describe."
)


def hides_a_topic(authorizer: Authorizer, ctx: Requester, names: list[str]) -> bool:
    """Whether the principal may not DESCRIBE one of `names` (denials logged)."""
    if not authorizer.enabled:
        return False
    allowed = authorizer.filter(
        ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names, log_denied=True
    )
    return len(allowed) < len(names)
