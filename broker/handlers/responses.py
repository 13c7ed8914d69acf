"""kio's response modules the handlers build their answers with, loaded on first use.

A handler answers a kio response entity built with the classes of one version of its
API, the newest (`protocol.api.at_version` converts it to the request's version), so
mypy checks every field it sets. Six APIs changed a field's kind within the versions
spool serves, and their handlers build an older version's classes for the older
requests: Produce and Fetch name topics before v13 and by id from v13 (KIP-516),
FindCoordinator answers one coordinator before v4 and a list from v4 (KIP-699),
AddPartitionsToTxn answers per topic before v4 and per transaction from v4 (KIP-890),
OffsetCommit names topics before v10 and by id from v10 (KIP-848), and OffsetFetch
answers one group before v8 and a list from v8 (KIP-709), whose topics are named
before v10 and by id from v10 (KIP-848): its handler builds v7, v9 or v10. JoinGroup's
protocol name may be null only from v7: an older request is answered "" for none, as
Kafka answers it. Metadata's cluster authorized operations (KIP-430) exist only in
v8-10: asked for there, the answer is converted to v10 to carry them.

The handlers read these names as `responses.metadata_v13.MetadataResponse`. A module
is imported when a request first reads it (`protocol.api.lazy_module`): importing
every API's response module took 0.25 s more than the broker's other imports, which a
start does not wait for (`Broker.warm_up` loads them once the broker serves).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from kio.static.primitive import i32Timedelta

from protocol.api import lazy_module

__all__ = [
    "NO_THROTTLE",
    "add_offsets_to_txn_v4",
    "add_partitions_to_txn_v3",
    "add_partitions_to_txn_v5",
    "alter_share_group_offsets_v0",
    "alter_user_scram_credentials_v0",
    "api_versions_v4",
    "consumer_group_describe_v1",
    "consumer_group_heartbeat_v1",
    "create_acls_v3",
    "create_partitions_v3",
    "create_topics_v7",
    "delete_acls_v3",
    "delete_groups_v2",
    "delete_records_v2",
    "delete_share_group_offsets_v0",
    "delete_share_group_state_v0",
    "delete_topics_v6",
    "describe_acls_v3",
    "describe_cluster_v2",
    "describe_configs_v4",
    "describe_groups_v6",
    "describe_share_group_offsets_v1",
    "describe_transactions_v0",
    "describe_user_scram_credentials_v0",
    "end_txn_v4",
    "fetch_v12",
    "fetch_v18",
    "find_coordinator_v3",
    "find_coordinator_v6",
    "heartbeat_v4",
    "incremental_alter_configs_v1",
    "init_producer_id_v5",
    "initialize_share_group_state_v0",
    "join_group_v9",
    "leave_group_v5",
    "list_groups_v5",
    "list_offsets_v11",
    "list_transactions_v2",
    "metadata_v10",
    "metadata_v13",
    "offset_commit_v9",
    "offset_commit_v10",
    "offset_delete_v0",
    "offset_fetch_v7",
    "offset_fetch_v9",
    "offset_fetch_v10",
    "produce_v12",
    "produce_v13",
    "read_share_group_state_summary_v1",
    "read_share_group_state_v0",
    "sasl_authenticate_v2",
    "sasl_handshake_v1",
    "share_acknowledge_v2",
    "share_fetch_v2",
    "share_group_describe_v1",
    "share_group_heartbeat_v1",
    "sync_group_v5",
    "txn_offset_commit_v5",
    "write_share_group_state_v1",
    "write_txn_markers_v2",
]

if TYPE_CHECKING:
    from kio.schema.add_offsets_to_txn.v4 import response as add_offsets_to_txn_v4
    from kio.schema.add_partitions_to_txn.v3 import response as add_partitions_to_txn_v3
    from kio.schema.add_partitions_to_txn.v5 import response as add_partitions_to_txn_v5
    from kio.schema.alter_share_group_offsets.v0 import response as alter_share_group_offsets_v0
    from kio.schema.alter_user_scram_credentials.v0 import (
        response as alter_user_scram_credentials_v0,
    )
    from kio.schema.api_versions.v4 import response as api_versions_v4
    from kio.schema.consumer_group_describe.v1 import response as consumer_group_describe_v1
    from kio.schema.consumer_group_heartbeat.v1 import response as consumer_group_heartbeat_v1
    from kio.schema.create_acls.v3 import response as create_acls_v3
    from kio.schema.create_partitions.v3 import response as create_partitions_v3
    from kio.schema.create_topics.v7 import response as create_topics_v7
    from kio.schema.delete_acls.v3 import response as delete_acls_v3
    from kio.schema.delete_groups.v2 import response as delete_groups_v2
    from kio.schema.delete_records.v2 import response as delete_records_v2
    from kio.schema.delete_share_group_offsets.v0 import response as delete_share_group_offsets_v0
    from kio.schema.delete_share_group_state.v0 import response as delete_share_group_state_v0
    from kio.schema.delete_topics.v6 import response as delete_topics_v6
    from kio.schema.describe_acls.v3 import response as describe_acls_v3
    from kio.schema.describe_cluster.v2 import response as describe_cluster_v2
    from kio.schema.describe_configs.v4 import response as describe_configs_v4
    from kio.schema.describe_groups.v6 import response as describe_groups_v6
    from kio.schema.describe_share_group_offsets.v1 import (
        response as describe_share_group_offsets_v1,
    )
    from kio.schema.describe_transactions.v0 import response as describe_transactions_v0
    from kio.schema.describe_user_scram_credentials.v0 import (
        response as describe_user_scram_credentials_v0,
    )
    from kio.schema.end_txn.v4 import response as end_txn_v4
    from kio.schema.fetch.v12 import response as fetch_v12
    from kio.schema.fetch.v18 import response as fetch_v18
    from kio.schema.find_coordinator.v3 import response as find_coordinator_v3
    from kio.schema.find_coordinator.v6 import response as find_coordinator_v6
    from kio.schema.heartbeat.v4 import response as heartbeat_v4
    from kio.schema.incremental_alter_configs.v1 import response as incremental_alter_configs_v1
    from kio.schema.init_producer_id.v5 import response as init_producer_id_v5
    from kio.schema.initialize_share_group_state.v0 import (
        response as initialize_share_group_state_v0,
    )
    from kio.schema.join_group.v9 import response as join_group_v9
    from kio.schema.leave_group.v5 import response as leave_group_v5
    from kio.schema.list_groups.v5 import response as list_groups_v5
    from kio.schema.list_offsets.v11 import response as list_offsets_v11
    from kio.schema.list_transactions.v2 import response as list_transactions_v2
    from kio.schema.metadata.v10 import response as metadata_v10
    from kio.schema.metadata.v13 import response as metadata_v13
    from kio.schema.offset_commit.v9 import response as offset_commit_v9
    from kio.schema.offset_commit.v10 import response as offset_commit_v10
    from kio.schema.offset_delete.v0 import response as offset_delete_v0
    from kio.schema.offset_fetch.v7 import response as offset_fetch_v7
    from kio.schema.offset_fetch.v9 import response as offset_fetch_v9
    from kio.schema.offset_fetch.v10 import response as offset_fetch_v10
    from kio.schema.produce.v12 import response as produce_v12
    from kio.schema.produce.v13 import response as produce_v13
    from kio.schema.read_share_group_state.v0 import response as read_share_group_state_v0
    from kio.schema.read_share_group_state_summary.v1 import (
        response as read_share_group_state_summary_v1,
    )
    from kio.schema.sasl_authenticate.v2 import response as sasl_authenticate_v2
    from kio.schema.sasl_handshake.v1 import response as sasl_handshake_v1
    from kio.schema.share_acknowledge.v2 import response as share_acknowledge_v2
    from kio.schema.share_fetch.v2 import response as share_fetch_v2
    from kio.schema.share_group_describe.v1 import response as share_group_describe_v1
    from kio.schema.share_group_heartbeat.v1 import response as share_group_heartbeat_v1
    from kio.schema.sync_group.v5 import response as sync_group_v5
    from kio.schema.txn_offset_commit.v5 import response as txn_offset_commit_v5
    from kio.schema.write_share_group_state.v1 import response as write_share_group_state_v1
    from kio.schema.write_txn_markers.v2 import response as write_txn_markers_v2
else:
    add_offsets_to_txn_v4 = lazy_module("kio.schema.add_offsets_to_txn.v4.response")
    add_partitions_to_txn_v3 = lazy_module("kio.schema.add_partitions_to_txn.v3.response")
    add_partitions_to_txn_v5 = lazy_module("kio.schema.add_partitions_to_txn.v5.response")
    alter_share_group_offsets_v0 = lazy_module("kio.schema.alter_share_group_offsets.v0.response")
    alter_user_scram_credentials_v0 = lazy_module(
        "kio.schema.alter_user_scram_credentials.v0.response"
    )
    describe_user_scram_credentials_v0 = lazy_module(
        "kio.schema.describe_user_scram_credentials.v0.response"
    )
    api_versions_v4 = lazy_module("kio.schema.api_versions.v4.response")
    sasl_authenticate_v2 = lazy_module("kio.schema.sasl_authenticate.v2.response")
    sasl_handshake_v1 = lazy_module("kio.schema.sasl_handshake.v1.response")
    create_acls_v3 = lazy_module("kio.schema.create_acls.v3.response")
    delete_acls_v3 = lazy_module("kio.schema.delete_acls.v3.response")
    describe_acls_v3 = lazy_module("kio.schema.describe_acls.v3.response")
    create_partitions_v3 = lazy_module("kio.schema.create_partitions.v3.response")
    create_topics_v7 = lazy_module("kio.schema.create_topics.v7.response")
    delete_groups_v2 = lazy_module("kio.schema.delete_groups.v2.response")
    delete_records_v2 = lazy_module("kio.schema.delete_records.v2.response")
    delete_share_group_offsets_v0 = lazy_module("kio.schema.delete_share_group_offsets.v0.response")
    delete_share_group_state_v0 = lazy_module("kio.schema.delete_share_group_state.v0.response")
    delete_topics_v6 = lazy_module("kio.schema.delete_topics.v6.response")
    describe_cluster_v2 = lazy_module("kio.schema.describe_cluster.v2.response")
    describe_configs_v4 = lazy_module("kio.schema.describe_configs.v4.response")
    describe_share_group_offsets_v1 = lazy_module(
        "kio.schema.describe_share_group_offsets.v1.response"
    )
    end_txn_v4 = lazy_module("kio.schema.end_txn.v4.response")
    fetch_v12 = lazy_module("kio.schema.fetch.v12.response")
    fetch_v18 = lazy_module("kio.schema.fetch.v18.response")
    find_coordinator_v3 = lazy_module("kio.schema.find_coordinator.v3.response")
    find_coordinator_v6 = lazy_module("kio.schema.find_coordinator.v6.response")
    incremental_alter_configs_v1 = lazy_module("kio.schema.incremental_alter_configs.v1.response")
    init_producer_id_v5 = lazy_module("kio.schema.init_producer_id.v5.response")
    initialize_share_group_state_v0 = lazy_module(
        "kio.schema.initialize_share_group_state.v0.response"
    )
    list_groups_v5 = lazy_module("kio.schema.list_groups.v5.response")
    list_transactions_v2 = lazy_module("kio.schema.list_transactions.v2.response")
    describe_transactions_v0 = lazy_module("kio.schema.describe_transactions.v0.response")
    list_offsets_v11 = lazy_module("kio.schema.list_offsets.v11.response")
    metadata_v10 = lazy_module("kio.schema.metadata.v10.response")
    metadata_v13 = lazy_module("kio.schema.metadata.v13.response")
    produce_v12 = lazy_module("kio.schema.produce.v12.response")
    produce_v13 = lazy_module("kio.schema.produce.v13.response")
    read_share_group_state_v0 = lazy_module("kio.schema.read_share_group_state.v0.response")
    read_share_group_state_summary_v1 = lazy_module(
        "kio.schema.read_share_group_state_summary.v1.response"
    )
    share_acknowledge_v2 = lazy_module("kio.schema.share_acknowledge.v2.response")
    share_fetch_v2 = lazy_module("kio.schema.share_fetch.v2.response")
    share_group_describe_v1 = lazy_module("kio.schema.share_group_describe.v1.response")
    share_group_heartbeat_v1 = lazy_module("kio.schema.share_group_heartbeat.v1.response")
    txn_offset_commit_v5 = lazy_module("kio.schema.txn_offset_commit.v5.response")
    write_share_group_state_v1 = lazy_module("kio.schema.write_share_group_state.v1.response")
    # Issue 26's consumer groups, offsets and WriteTxnMarkers (no handler answers yet).
    consumer_group_describe_v1 = lazy_module("kio.schema.consumer_group_describe.v1.response")
    consumer_group_heartbeat_v1 = lazy_module("kio.schema.consumer_group_heartbeat.v1.response")
    describe_groups_v6 = lazy_module("kio.schema.describe_groups.v6.response")
    heartbeat_v4 = lazy_module("kio.schema.heartbeat.v4.response")
    join_group_v9 = lazy_module("kio.schema.join_group.v9.response")
    leave_group_v5 = lazy_module("kio.schema.leave_group.v5.response")
    offset_commit_v9 = lazy_module("kio.schema.offset_commit.v9.response")
    offset_commit_v10 = lazy_module("kio.schema.offset_commit.v10.response")
    offset_delete_v0 = lazy_module("kio.schema.offset_delete.v0.response")
    offset_fetch_v7 = lazy_module("kio.schema.offset_fetch.v7.response")
    offset_fetch_v9 = lazy_module("kio.schema.offset_fetch.v9.response")
    offset_fetch_v10 = lazy_module("kio.schema.offset_fetch.v10.response")
    sync_group_v5 = lazy_module("kio.schema.sync_group.v5.response")
    write_txn_markers_v2 = lazy_module("kio.schema.write_txn_markers.v2.response")

# No quota throttles spool's clients: every response's throttle time.
NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))
