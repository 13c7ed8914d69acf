"""Request handlers: one module-level function per API, found in the table below.

Every handler is `async def name(ctx, req, broker) -> response entity | None`:
- `ctx` is the server's `RequestContext` (header, client, connection);
- `req` is kio's decoded request entity, typed as the union of the versions served
  (`broker.handlers.requests` says why a union);
- `broker` is typed as the module's small Protocol of the stores and managers the
  handler uses (`TopicsBroker`, ...), so a handler sees only those; the `Broker` is
  bound to it when the table is built, and mypy checks it satisfies every Protocol.
The response is a kio response entity of the handler's API, built with one version's
classes (`broker.handlers.responses`, mostly the newest), which mypy checks field by
field; `protocol.api.at_version` converts it to the request's version and refuses
anything that is not a response of that API.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from broker.handlers import (
    acls,
    classic,
    cluster,
    configs,
    consumer,
    offsets,
    produce_fetch,
    share,
    share_admin,
    share_state,
    topics,
    transactions,
    txn_markers,
    users,
)
from broker.server import RequestContext
from protocol.api import ApiTable, Response


class HandlerBroker(
    acls.AclsBroker,
    classic.ClassicBroker,
    cluster.ClusterBroker,
    configs.ConfigsBroker,
    consumer.ConsumerBroker,
    offsets.OffsetsBroker,
    produce_fetch.DataBroker,
    share.ShareBroker,
    share_admin.ShareAdminBroker,
    share_state.ShareStateBroker,
    topics.TopicsBroker,
    transactions.TxnBroker,
    txn_markers.MarkersBroker,
    users.UsersBroker,
    Protocol,
):
    """Every handler module's Protocol at once: what the table needs of the broker.
    `broker.broker.Broker` builds the table with itself, so mypy checks it there."""


# A handler before the broker is bound to it. The request is `Any` here because each
# handler takes its own API's request union; the unit tests check that union against
# the versions registered below.
BrokerHandler = Callable[[RequestContext, Any, HandlerBroker], Awaitable[Response | None]]


@dataclass(slots=True, frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: BrokerHandler


# Every API spool serves, with the versions it advertises in ApiVersions.
APIS: tuple[Api, ...] = (
    Api(18, 0, 4, cluster.api_versions),
    # SASL listeners answer these themselves before authentication (broker.sasl); the
    # handlers answer them afterwards and on other listeners.
    Api(17, 0, 1, cluster.sasl_handshake),
    Api(36, 0, 2, cluster.sasl_authenticate),
    Api(3, 0, 13, cluster.metadata),
    Api(60, 0, 2, cluster.describe_cluster),
    Api(10, 0, 6, cluster.find_coordinator),
    # v6 (KIP-939) is latestVersionUnstable in Kafka 4.2: a default broker stops at v5.
    Api(22, 0, 5, cluster.init_producer_id),
    # Transaction version 1 (transactions.py): EndTxn v5 would mean KIP-890 part 2.
    Api(24, 0, 5, transactions.add_partitions_to_txn),
    Api(25, 0, 4, transactions.add_offsets_to_txn),
    Api(26, 0, 4, transactions.end_txn),
    Api(28, 0, 5, transactions.txn_offset_commit),
    Api(65, 0, 0, transactions.describe_transactions),
    # v1 adds the duration filter (KIP-994), v2 the transactional id pattern (KIP-1152).
    Api(66, 0, 2, transactions.list_transactions),
    # From a transaction coordinator on another broker (broker.txn_markers).
    Api(27, 1, 2, txn_markers.write_txn_markers),
    Api(19, 2, 7, topics.create_topics),
    Api(20, 1, 6, topics.delete_topics),
    Api(37, 0, 3, topics.create_partitions),
    Api(32, 1, 4, configs.describe_configs),
    Api(44, 0, 1, configs.incremental_alter_configs),
    # v0 was removed in Kafka 4.0; v1 is the baseline.
    Api(29, 1, 3, acls.describe_acls),
    Api(30, 1, 3, acls.create_acls),
    Api(31, 1, 3, acls.delete_acls),
    # KIP-554: SCRAM credentials in the cluster metadata (broker.handlers.users).
    Api(50, 0, 0, users.describe_user_scram_credentials),
    Api(51, 0, 0, users.alter_user_scram_credentials),
    Api(0, 3, 13, produce_fetch.produce),
    Api(1, 4, 18, produce_fetch.fetch),
    Api(2, 1, 11, produce_fetch.list_offsets),
    Api(21, 0, 2, produce_fetch.delete_records),
    Api(76, 1, 1, share.share_group_heartbeat),
    Api(77, 1, 1, share.share_group_describe),
    Api(16, 0, 5, share.list_groups),
    # Classic consumer groups (JoinGroup/SyncGroup), broker.handlers.classic.
    Api(11, 0, 9, classic.join_group),
    Api(12, 0, 4, classic.heartbeat),
    Api(13, 0, 5, classic.leave_group),
    Api(14, 0, 5, classic.sync_group),
    Api(15, 0, 6, classic.describe_groups),
    Api(78, 1, 2, share.share_fetch),
    Api(79, 1, 2, share.share_acknowledge),
    Api(83, 0, 0, share_state.initialize_share_group_state),
    Api(84, 0, 0, share_state.read_share_group_state),
    Api(85, 0, 1, share_state.write_share_group_state),
    Api(86, 0, 0, share_state.delete_share_group_state),
    Api(87, 0, 1, share_state.read_share_group_state_summary),
    Api(42, 0, 2, share_admin.delete_groups),
    # Committed offsets of consumer and classic groups (coordinator.offsets).
    Api(8, 2, 10, offsets.offset_commit),
    Api(9, 1, 10, offsets.offset_fetch),
    Api(47, 0, 0, offsets.offset_delete),
    # KIP-848 consumer groups (coordinator.consumer_group).
    Api(68, 0, 1, consumer.consumer_group_heartbeat),
    Api(69, 0, 1, consumer.consumer_group_describe),
    Api(90, 0, 1, share_admin.describe_share_group_offsets),
    Api(91, 0, 0, share_admin.alter_share_group_offsets),
    Api(92, 0, 0, share_admin.delete_share_group_offsets),
)


def build_table(broker: HandlerBroker) -> ApiTable[RequestContext]:
    """The broker's ApiTable: every entry of `APIS` with `broker` bound."""
    table: ApiTable[RequestContext] = ApiTable()
    for api in APIS:
        table.register(
            api.key, api.min_version, api.max_version, functools.partial(_call, api.handler, broker)
        )
    return table


async def _call(
    handler: BrokerHandler, broker: HandlerBroker, ctx: RequestContext, req: Any
) -> Response | None:
    return await handler(ctx, req, broker)
