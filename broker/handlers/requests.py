"""kio's request classes for the versions spool serves, one union per API.

A handler's request parameter is the union of the classes of exactly the versions it
is registered for (`broker/handlers/__init__.py`; a unit test keeps the two in step).
A union rather than the newest version's class keeps the code honest: mypy accepts
`req.field` only if every served version has that field, so a field that older
versions lack must be read as such, through a `TypeIs` guard on the entity's
`__version__` narrowing to the versions that have it (the aliases below the unions) or
`getattr(req, name, default)` naming the value Kafka assumes for those versions.
Reading the newest class would let a field missing in v0 pass the type checker and
fail (AttributeError) on the wire.

The handlers import this module for type checking only: importing it loads every
served version's kio classes, which took most of a broker's start. At run time a
version's classes are loaded by its first request (`protocol.api.request_class`).
"""

from __future__ import annotations

from typing import TypeAlias

from kio.schema.add_offsets_to_txn import v0 as add_offsets_to_txn_v0
from kio.schema.add_offsets_to_txn import v1 as add_offsets_to_txn_v1
from kio.schema.add_offsets_to_txn import v2 as add_offsets_to_txn_v2
from kio.schema.add_offsets_to_txn import v3 as add_offsets_to_txn_v3
from kio.schema.add_offsets_to_txn import v4 as add_offsets_to_txn_v4
from kio.schema.add_partitions_to_txn import v0 as add_partitions_to_txn_v0
from kio.schema.add_partitions_to_txn import v1 as add_partitions_to_txn_v1
from kio.schema.add_partitions_to_txn import v2 as add_partitions_to_txn_v2
from kio.schema.add_partitions_to_txn import v3 as add_partitions_to_txn_v3
from kio.schema.add_partitions_to_txn import v4 as add_partitions_to_txn_v4
from kio.schema.add_partitions_to_txn import v5 as add_partitions_to_txn_v5
from kio.schema.alter_share_group_offsets import v0 as alter_share_group_offsets_v0
from kio.schema.alter_user_scram_credentials import v0 as alter_user_scram_credentials_v0
from kio.schema.api_versions import v0 as api_versions_v0
from kio.schema.api_versions import v1 as api_versions_v1
from kio.schema.api_versions import v2 as api_versions_v2
from kio.schema.api_versions import v3 as api_versions_v3
from kio.schema.api_versions import v4 as api_versions_v4
from kio.schema.consumer_group_describe import v0 as consumer_group_describe_v0
from kio.schema.consumer_group_describe import v1 as consumer_group_describe_v1
from kio.schema.consumer_group_heartbeat import v0 as consumer_group_heartbeat_v0
from kio.schema.consumer_group_heartbeat import v1 as consumer_group_heartbeat_v1
from kio.schema.create_acls import v1 as create_acls_v1
from kio.schema.create_acls import v2 as create_acls_v2
from kio.schema.create_acls import v3 as create_acls_v3
from kio.schema.create_partitions import v0 as create_partitions_v0
from kio.schema.create_partitions import v1 as create_partitions_v1
from kio.schema.create_partitions import v2 as create_partitions_v2
from kio.schema.create_partitions import v3 as create_partitions_v3
from kio.schema.create_topics import v2 as create_topics_v2
from kio.schema.create_topics import v3 as create_topics_v3
from kio.schema.create_topics import v4 as create_topics_v4
from kio.schema.create_topics import v5 as create_topics_v5
from kio.schema.create_topics import v6 as create_topics_v6
from kio.schema.create_topics import v7 as create_topics_v7
from kio.schema.delete_acls import v1 as delete_acls_v1
from kio.schema.delete_acls import v2 as delete_acls_v2
from kio.schema.delete_acls import v3 as delete_acls_v3
from kio.schema.delete_groups import v0 as delete_groups_v0
from kio.schema.delete_groups import v1 as delete_groups_v1
from kio.schema.delete_groups import v2 as delete_groups_v2
from kio.schema.delete_records import v0 as delete_records_v0
from kio.schema.delete_records import v1 as delete_records_v1
from kio.schema.delete_records import v2 as delete_records_v2
from kio.schema.delete_share_group_offsets import v0 as delete_share_group_offsets_v0
from kio.schema.delete_share_group_state import v0 as delete_share_group_state_v0
from kio.schema.delete_topics import v1 as delete_topics_v1
from kio.schema.delete_topics import v2 as delete_topics_v2
from kio.schema.delete_topics import v3 as delete_topics_v3
from kio.schema.delete_topics import v4 as delete_topics_v4
from kio.schema.delete_topics import v5 as delete_topics_v5
from kio.schema.delete_topics import v6 as delete_topics_v6
from kio.schema.describe_acls import v1 as describe_acls_v1
from kio.schema.describe_acls import v2 as describe_acls_v2
from kio.schema.describe_acls import v3 as describe_acls_v3
from kio.schema.describe_cluster import v0 as describe_cluster_v0
from kio.schema.describe_cluster import v1 as describe_cluster_v1
from kio.schema.describe_cluster import v2 as describe_cluster_v2
from kio.schema.describe_configs import v1 as describe_configs_v1
from kio.schema.describe_configs import v2 as describe_configs_v2
from kio.schema.describe_configs import v3 as describe_configs_v3
from kio.schema.describe_configs import v4 as describe_configs_v4
from kio.schema.describe_groups import v0 as describe_groups_v0
from kio.schema.describe_groups import v1 as describe_groups_v1
from kio.schema.describe_groups import v2 as describe_groups_v2
from kio.schema.describe_groups import v3 as describe_groups_v3
from kio.schema.describe_groups import v4 as describe_groups_v4
from kio.schema.describe_groups import v5 as describe_groups_v5
from kio.schema.describe_groups import v6 as describe_groups_v6
from kio.schema.describe_share_group_offsets import v0 as describe_share_group_offsets_v0
from kio.schema.describe_share_group_offsets import v1 as describe_share_group_offsets_v1
from kio.schema.describe_transactions import v0 as describe_transactions_v0
from kio.schema.describe_user_scram_credentials import v0 as describe_user_scram_credentials_v0
from kio.schema.end_txn import v0 as end_txn_v0
from kio.schema.end_txn import v1 as end_txn_v1
from kio.schema.end_txn import v2 as end_txn_v2
from kio.schema.end_txn import v3 as end_txn_v3
from kio.schema.end_txn import v4 as end_txn_v4
from kio.schema.fetch import v4 as fetch_v4
from kio.schema.fetch import v5 as fetch_v5
from kio.schema.fetch import v6 as fetch_v6
from kio.schema.fetch import v7 as fetch_v7
from kio.schema.fetch import v8 as fetch_v8
from kio.schema.fetch import v9 as fetch_v9
from kio.schema.fetch import v10 as fetch_v10
from kio.schema.fetch import v11 as fetch_v11
from kio.schema.fetch import v12 as fetch_v12
from kio.schema.fetch import v13 as fetch_v13
from kio.schema.fetch import v14 as fetch_v14
from kio.schema.fetch import v15 as fetch_v15
from kio.schema.fetch import v16 as fetch_v16
from kio.schema.fetch import v17 as fetch_v17
from kio.schema.fetch import v18 as fetch_v18
from kio.schema.find_coordinator import v0 as find_coordinator_v0
from kio.schema.find_coordinator import v1 as find_coordinator_v1
from kio.schema.find_coordinator import v2 as find_coordinator_v2
from kio.schema.find_coordinator import v3 as find_coordinator_v3
from kio.schema.find_coordinator import v4 as find_coordinator_v4
from kio.schema.find_coordinator import v5 as find_coordinator_v5
from kio.schema.find_coordinator import v6 as find_coordinator_v6
from kio.schema.heartbeat import v0 as heartbeat_v0
from kio.schema.heartbeat import v1 as heartbeat_v1
from kio.schema.heartbeat import v2 as heartbeat_v2
from kio.schema.heartbeat import v3 as heartbeat_v3
from kio.schema.heartbeat import v4 as heartbeat_v4
from kio.schema.incremental_alter_configs import v0 as incremental_alter_configs_v0
from kio.schema.incremental_alter_configs import v1 as incremental_alter_configs_v1
from kio.schema.init_producer_id import v0 as init_producer_id_v0
from kio.schema.init_producer_id import v1 as init_producer_id_v1
from kio.schema.init_producer_id import v2 as init_producer_id_v2
from kio.schema.init_producer_id import v3 as init_producer_id_v3
from kio.schema.init_producer_id import v4 as init_producer_id_v4
from kio.schema.init_producer_id import v5 as init_producer_id_v5
from kio.schema.initialize_share_group_state import v0 as initialize_share_group_state_v0
from kio.schema.join_group import v0 as join_group_v0
from kio.schema.join_group import v1 as join_group_v1
from kio.schema.join_group import v2 as join_group_v2
from kio.schema.join_group import v3 as join_group_v3
from kio.schema.join_group import v4 as join_group_v4
from kio.schema.join_group import v5 as join_group_v5
from kio.schema.join_group import v6 as join_group_v6
from kio.schema.join_group import v7 as join_group_v7
from kio.schema.join_group import v8 as join_group_v8
from kio.schema.join_group import v9 as join_group_v9
from kio.schema.leave_group import v0 as leave_group_v0
from kio.schema.leave_group import v1 as leave_group_v1
from kio.schema.leave_group import v2 as leave_group_v2
from kio.schema.leave_group import v3 as leave_group_v3
from kio.schema.leave_group import v4 as leave_group_v4
from kio.schema.leave_group import v5 as leave_group_v5
from kio.schema.list_groups import v0 as list_groups_v0
from kio.schema.list_groups import v1 as list_groups_v1
from kio.schema.list_groups import v2 as list_groups_v2
from kio.schema.list_groups import v3 as list_groups_v3
from kio.schema.list_groups import v4 as list_groups_v4
from kio.schema.list_groups import v5 as list_groups_v5
from kio.schema.list_offsets import v1 as list_offsets_v1
from kio.schema.list_offsets import v2 as list_offsets_v2
from kio.schema.list_offsets import v3 as list_offsets_v3
from kio.schema.list_offsets import v4 as list_offsets_v4
from kio.schema.list_offsets import v5 as list_offsets_v5
from kio.schema.list_offsets import v6 as list_offsets_v6
from kio.schema.list_offsets import v7 as list_offsets_v7
from kio.schema.list_offsets import v8 as list_offsets_v8
from kio.schema.list_offsets import v9 as list_offsets_v9
from kio.schema.list_offsets import v10 as list_offsets_v10
from kio.schema.list_offsets import v11 as list_offsets_v11
from kio.schema.list_transactions import v0 as list_transactions_v0
from kio.schema.list_transactions import v1 as list_transactions_v1
from kio.schema.list_transactions import v2 as list_transactions_v2
from kio.schema.metadata import v0 as metadata_v0
from kio.schema.metadata import v1 as metadata_v1
from kio.schema.metadata import v2 as metadata_v2
from kio.schema.metadata import v3 as metadata_v3
from kio.schema.metadata import v4 as metadata_v4
from kio.schema.metadata import v5 as metadata_v5
from kio.schema.metadata import v6 as metadata_v6
from kio.schema.metadata import v7 as metadata_v7
from kio.schema.metadata import v8 as metadata_v8
from kio.schema.metadata import v9 as metadata_v9
from kio.schema.metadata import v10 as metadata_v10
from kio.schema.metadata import v11 as metadata_v11
from kio.schema.metadata import v12 as metadata_v12
from kio.schema.metadata import v13 as metadata_v13
from kio.schema.offset_commit import v2 as offset_commit_v2
from kio.schema.offset_commit import v3 as offset_commit_v3
from kio.schema.offset_commit import v4 as offset_commit_v4
from kio.schema.offset_commit import v5 as offset_commit_v5
from kio.schema.offset_commit import v6 as offset_commit_v6
from kio.schema.offset_commit import v7 as offset_commit_v7
from kio.schema.offset_commit import v8 as offset_commit_v8
from kio.schema.offset_commit import v9 as offset_commit_v9
from kio.schema.offset_commit import v10 as offset_commit_v10
from kio.schema.offset_delete import v0 as offset_delete_v0
from kio.schema.offset_fetch import v1 as offset_fetch_v1
from kio.schema.offset_fetch import v2 as offset_fetch_v2
from kio.schema.offset_fetch import v3 as offset_fetch_v3
from kio.schema.offset_fetch import v4 as offset_fetch_v4
from kio.schema.offset_fetch import v5 as offset_fetch_v5
from kio.schema.offset_fetch import v6 as offset_fetch_v6
from kio.schema.offset_fetch import v7 as offset_fetch_v7
from kio.schema.offset_fetch import v8 as offset_fetch_v8
from kio.schema.offset_fetch import v9 as offset_fetch_v9
from kio.schema.offset_fetch import v10 as offset_fetch_v10
from kio.schema.produce import v3 as produce_v3
from kio.schema.produce import v4 as produce_v4
from kio.schema.produce import v5 as produce_v5
from kio.schema.produce import v6 as produce_v6
from kio.schema.produce import v7 as produce_v7
from kio.schema.produce import v8 as produce_v8
from kio.schema.produce import v9 as produce_v9
from kio.schema.produce import v10 as produce_v10
from kio.schema.produce import v11 as produce_v11
from kio.schema.produce import v12 as produce_v12
from kio.schema.produce import v13 as produce_v13
from kio.schema.read_share_group_state import v0 as read_share_group_state_v0
from kio.schema.read_share_group_state_summary import v0 as read_share_group_state_summary_v0
from kio.schema.read_share_group_state_summary import v1 as read_share_group_state_summary_v1
from kio.schema.sasl_authenticate import v0 as sasl_authenticate_v0
from kio.schema.sasl_authenticate import v1 as sasl_authenticate_v1
from kio.schema.sasl_authenticate import v2 as sasl_authenticate_v2
from kio.schema.sasl_handshake import v0 as sasl_handshake_v0
from kio.schema.sasl_handshake import v1 as sasl_handshake_v1
from kio.schema.share_acknowledge import v1 as share_acknowledge_v1
from kio.schema.share_acknowledge import v2 as share_acknowledge_v2
from kio.schema.share_fetch import v1 as share_fetch_v1
from kio.schema.share_fetch import v2 as share_fetch_v2
from kio.schema.share_group_describe import v1 as share_group_describe_v1
from kio.schema.share_group_heartbeat import v1 as share_group_heartbeat_v1
from kio.schema.sync_group import v0 as sync_group_v0
from kio.schema.sync_group import v1 as sync_group_v1
from kio.schema.sync_group import v2 as sync_group_v2
from kio.schema.sync_group import v3 as sync_group_v3
from kio.schema.sync_group import v4 as sync_group_v4
from kio.schema.sync_group import v5 as sync_group_v5
from kio.schema.txn_offset_commit import v0 as txn_offset_commit_v0
from kio.schema.txn_offset_commit import v1 as txn_offset_commit_v1
from kio.schema.txn_offset_commit import v2 as txn_offset_commit_v2
from kio.schema.txn_offset_commit import v3 as txn_offset_commit_v3
from kio.schema.txn_offset_commit import v4 as txn_offset_commit_v4
from kio.schema.txn_offset_commit import v5 as txn_offset_commit_v5
from kio.schema.write_share_group_state import v0 as write_share_group_state_v0
from kio.schema.write_share_group_state import v1 as write_share_group_state_v1
from kio.schema.write_txn_markers import v1 as write_txn_markers_v1
from kio.schema.write_txn_markers import v2 as write_txn_markers_v2

ApiVersionsRequest: TypeAlias = (
    api_versions_v0.ApiVersionsRequest
    | api_versions_v1.ApiVersionsRequest
    | api_versions_v2.ApiVersionsRequest
    | api_versions_v3.ApiVersionsRequest
    | api_versions_v4.ApiVersionsRequest
)
SaslHandshakeRequest: TypeAlias = (
    sasl_handshake_v0.SaslHandshakeRequest | sasl_handshake_v1.SaslHandshakeRequest
)
SaslAuthenticateRequest: TypeAlias = (
    sasl_authenticate_v0.SaslAuthenticateRequest
    | sasl_authenticate_v1.SaslAuthenticateRequest
    | sasl_authenticate_v2.SaslAuthenticateRequest
)
MetadataRequest: TypeAlias = (
    metadata_v0.MetadataRequest
    | metadata_v1.MetadataRequest
    | metadata_v2.MetadataRequest
    | metadata_v3.MetadataRequest
    | metadata_v4.MetadataRequest
    | metadata_v5.MetadataRequest
    | metadata_v6.MetadataRequest
    | metadata_v7.MetadataRequest
    | metadata_v8.MetadataRequest
    | metadata_v9.MetadataRequest
    | metadata_v10.MetadataRequest
    | metadata_v11.MetadataRequest
    | metadata_v12.MetadataRequest
    | metadata_v13.MetadataRequest
)
DescribeClusterRequest: TypeAlias = (
    describe_cluster_v0.DescribeClusterRequest
    | describe_cluster_v1.DescribeClusterRequest
    | describe_cluster_v2.DescribeClusterRequest
)
FindCoordinatorRequest: TypeAlias = (
    find_coordinator_v0.FindCoordinatorRequest
    | find_coordinator_v1.FindCoordinatorRequest
    | find_coordinator_v2.FindCoordinatorRequest
    | find_coordinator_v3.FindCoordinatorRequest
    | find_coordinator_v4.FindCoordinatorRequest
    | find_coordinator_v5.FindCoordinatorRequest
    | find_coordinator_v6.FindCoordinatorRequest
)
InitProducerIdRequest: TypeAlias = (
    init_producer_id_v0.InitProducerIdRequest
    | init_producer_id_v1.InitProducerIdRequest
    | init_producer_id_v2.InitProducerIdRequest
    | init_producer_id_v3.InitProducerIdRequest
    | init_producer_id_v4.InitProducerIdRequest
    | init_producer_id_v5.InitProducerIdRequest
)
CreateTopicsRequest: TypeAlias = (
    create_topics_v2.CreateTopicsRequest
    | create_topics_v3.CreateTopicsRequest
    | create_topics_v4.CreateTopicsRequest
    | create_topics_v5.CreateTopicsRequest
    | create_topics_v6.CreateTopicsRequest
    | create_topics_v7.CreateTopicsRequest
)
DeleteTopicsRequest: TypeAlias = (
    delete_topics_v1.DeleteTopicsRequest
    | delete_topics_v2.DeleteTopicsRequest
    | delete_topics_v3.DeleteTopicsRequest
    | delete_topics_v4.DeleteTopicsRequest
    | delete_topics_v5.DeleteTopicsRequest
    | delete_topics_v6.DeleteTopicsRequest
)
CreateAclsRequest: TypeAlias = (
    create_acls_v1.CreateAclsRequest
    | create_acls_v2.CreateAclsRequest
    | create_acls_v3.CreateAclsRequest
)
DescribeAclsRequest: TypeAlias = (
    describe_acls_v1.DescribeAclsRequest
    | describe_acls_v2.DescribeAclsRequest
    | describe_acls_v3.DescribeAclsRequest
)
DeleteAclsRequest: TypeAlias = (
    delete_acls_v1.DeleteAclsRequest
    | delete_acls_v2.DeleteAclsRequest
    | delete_acls_v3.DeleteAclsRequest
)
CreatePartitionsRequest: TypeAlias = (
    create_partitions_v0.CreatePartitionsRequest
    | create_partitions_v1.CreatePartitionsRequest
    | create_partitions_v2.CreatePartitionsRequest
    | create_partitions_v3.CreatePartitionsRequest
)
DescribeConfigsRequest: TypeAlias = (
    describe_configs_v1.DescribeConfigsRequest
    | describe_configs_v2.DescribeConfigsRequest
    | describe_configs_v3.DescribeConfigsRequest
    | describe_configs_v4.DescribeConfigsRequest
)
IncrementalAlterConfigsRequest: TypeAlias = (
    incremental_alter_configs_v0.IncrementalAlterConfigsRequest
    | incremental_alter_configs_v1.IncrementalAlterConfigsRequest
)
ProduceRequest: TypeAlias = (
    produce_v3.ProduceRequest
    | produce_v4.ProduceRequest
    | produce_v5.ProduceRequest
    | produce_v6.ProduceRequest
    | produce_v7.ProduceRequest
    | produce_v8.ProduceRequest
    | produce_v9.ProduceRequest
    | produce_v10.ProduceRequest
    | produce_v11.ProduceRequest
    | produce_v12.ProduceRequest
    | produce_v13.ProduceRequest
)
FetchRequest: TypeAlias = (
    fetch_v4.FetchRequest
    | fetch_v5.FetchRequest
    | fetch_v6.FetchRequest
    | fetch_v7.FetchRequest
    | fetch_v8.FetchRequest
    | fetch_v9.FetchRequest
    | fetch_v10.FetchRequest
    | fetch_v11.FetchRequest
    | fetch_v12.FetchRequest
    | fetch_v13.FetchRequest
    | fetch_v14.FetchRequest
    | fetch_v15.FetchRequest
    | fetch_v16.FetchRequest
    | fetch_v17.FetchRequest
    | fetch_v18.FetchRequest
)
ListOffsetsRequest: TypeAlias = (
    list_offsets_v1.ListOffsetsRequest
    | list_offsets_v2.ListOffsetsRequest
    | list_offsets_v3.ListOffsetsRequest
    | list_offsets_v4.ListOffsetsRequest
    | list_offsets_v5.ListOffsetsRequest
    | list_offsets_v6.ListOffsetsRequest
    | list_offsets_v7.ListOffsetsRequest
    | list_offsets_v8.ListOffsetsRequest
    | list_offsets_v9.ListOffsetsRequest
    | list_offsets_v10.ListOffsetsRequest
    | list_offsets_v11.ListOffsetsRequest
)
DeleteRecordsRequest: TypeAlias = (
    delete_records_v0.DeleteRecordsRequest
    | delete_records_v1.DeleteRecordsRequest
    | delete_records_v2.DeleteRecordsRequest
)
ShareGroupHeartbeatRequest: TypeAlias = share_group_heartbeat_v1.ShareGroupHeartbeatRequest
ShareGroupDescribeRequest: TypeAlias = share_group_describe_v1.ShareGroupDescribeRequest
ListGroupsRequest: TypeAlias = (
    list_groups_v0.ListGroupsRequest
    | list_groups_v1.ListGroupsRequest
    | list_groups_v2.ListGroupsRequest
    | list_groups_v3.ListGroupsRequest
    | list_groups_v4.ListGroupsRequest
    | list_groups_v5.ListGroupsRequest
)
ShareFetchRequest: TypeAlias = share_fetch_v1.ShareFetchRequest | share_fetch_v2.ShareFetchRequest
ShareAcknowledgeRequest: TypeAlias = (
    share_acknowledge_v1.ShareAcknowledgeRequest | share_acknowledge_v2.ShareAcknowledgeRequest
)
InitializeShareGroupStateRequest: TypeAlias = (
    initialize_share_group_state_v0.InitializeShareGroupStateRequest
)
ReadShareGroupStateRequest: TypeAlias = read_share_group_state_v0.ReadShareGroupStateRequest
WriteShareGroupStateRequest: TypeAlias = (
    write_share_group_state_v0.WriteShareGroupStateRequest
    | write_share_group_state_v1.WriteShareGroupStateRequest
)
DeleteShareGroupStateRequest: TypeAlias = delete_share_group_state_v0.DeleteShareGroupStateRequest
ReadShareGroupStateSummaryRequest: TypeAlias = (
    read_share_group_state_summary_v0.ReadShareGroupStateSummaryRequest
    | read_share_group_state_summary_v1.ReadShareGroupStateSummaryRequest
)

AddPartitionsToTxnRequest: TypeAlias = (
    add_partitions_to_txn_v0.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v1.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v2.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v3.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v4.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v5.AddPartitionsToTxnRequest
)
AddOffsetsToTxnRequest: TypeAlias = (
    add_offsets_to_txn_v0.AddOffsetsToTxnRequest
    | add_offsets_to_txn_v1.AddOffsetsToTxnRequest
    | add_offsets_to_txn_v2.AddOffsetsToTxnRequest
    | add_offsets_to_txn_v3.AddOffsetsToTxnRequest
    | add_offsets_to_txn_v4.AddOffsetsToTxnRequest
)
TxnOffsetCommitRequest: TypeAlias = (
    txn_offset_commit_v0.TxnOffsetCommitRequest
    | txn_offset_commit_v1.TxnOffsetCommitRequest
    | txn_offset_commit_v2.TxnOffsetCommitRequest
    | txn_offset_commit_v3.TxnOffsetCommitRequest
    | txn_offset_commit_v4.TxnOffsetCommitRequest
    | txn_offset_commit_v5.TxnOffsetCommitRequest
)
EndTxnRequest: TypeAlias = (
    end_txn_v0.EndTxnRequest
    | end_txn_v1.EndTxnRequest
    | end_txn_v2.EndTxnRequest
    | end_txn_v3.EndTxnRequest
    | end_txn_v4.EndTxnRequest
)

DescribeTransactionsRequest: TypeAlias = describe_transactions_v0.DescribeTransactionsRequest
ListTransactionsRequest: TypeAlias = (
    list_transactions_v0.ListTransactionsRequest
    | list_transactions_v1.ListTransactionsRequest
    | list_transactions_v2.ListTransactionsRequest
)
DeleteGroupsRequest: TypeAlias = (
    delete_groups_v0.DeleteGroupsRequest
    | delete_groups_v1.DeleteGroupsRequest
    | delete_groups_v2.DeleteGroupsRequest
)
DescribeShareGroupOffsetsRequest: TypeAlias = (
    describe_share_group_offsets_v0.DescribeShareGroupOffsetsRequest
    | describe_share_group_offsets_v1.DescribeShareGroupOffsetsRequest
)
AlterShareGroupOffsetsRequest: TypeAlias = (
    alter_share_group_offsets_v0.AlterShareGroupOffsetsRequest
)
DeleteShareGroupOffsetsRequest: TypeAlias = (
    delete_share_group_offsets_v0.DeleteShareGroupOffsetsRequest
)

# Consumer groups (classic and KIP-848), committed offsets and WriteTxnMarkers: the
# versions Kafka 4.2 serves (tests/unit/test_request_unions.py checks them).
JoinGroupRequest: TypeAlias = (
    join_group_v0.JoinGroupRequest
    | join_group_v1.JoinGroupRequest
    | join_group_v2.JoinGroupRequest
    | join_group_v3.JoinGroupRequest
    | join_group_v4.JoinGroupRequest
    | join_group_v5.JoinGroupRequest
    | join_group_v6.JoinGroupRequest
    | join_group_v7.JoinGroupRequest
    | join_group_v8.JoinGroupRequest
    | join_group_v9.JoinGroupRequest
)
SyncGroupRequest: TypeAlias = (
    sync_group_v0.SyncGroupRequest
    | sync_group_v1.SyncGroupRequest
    | sync_group_v2.SyncGroupRequest
    | sync_group_v3.SyncGroupRequest
    | sync_group_v4.SyncGroupRequest
    | sync_group_v5.SyncGroupRequest
)
HeartbeatRequest: TypeAlias = (
    heartbeat_v0.HeartbeatRequest
    | heartbeat_v1.HeartbeatRequest
    | heartbeat_v2.HeartbeatRequest
    | heartbeat_v3.HeartbeatRequest
    | heartbeat_v4.HeartbeatRequest
)
LeaveGroupRequest: TypeAlias = (
    leave_group_v0.LeaveGroupRequest
    | leave_group_v1.LeaveGroupRequest
    | leave_group_v2.LeaveGroupRequest
    | leave_group_v3.LeaveGroupRequest
    | leave_group_v4.LeaveGroupRequest
    | leave_group_v5.LeaveGroupRequest
)
DescribeGroupsRequest: TypeAlias = (
    describe_groups_v0.DescribeGroupsRequest
    | describe_groups_v1.DescribeGroupsRequest
    | describe_groups_v2.DescribeGroupsRequest
    | describe_groups_v3.DescribeGroupsRequest
    | describe_groups_v4.DescribeGroupsRequest
    | describe_groups_v5.DescribeGroupsRequest
    | describe_groups_v6.DescribeGroupsRequest
)
OffsetCommitRequest: TypeAlias = (
    offset_commit_v2.OffsetCommitRequest
    | offset_commit_v3.OffsetCommitRequest
    | offset_commit_v4.OffsetCommitRequest
    | offset_commit_v5.OffsetCommitRequest
    | offset_commit_v6.OffsetCommitRequest
    | offset_commit_v7.OffsetCommitRequest
    | offset_commit_v8.OffsetCommitRequest
    | offset_commit_v9.OffsetCommitRequest
    | offset_commit_v10.OffsetCommitRequest
)
OffsetFetchRequest: TypeAlias = (
    offset_fetch_v1.OffsetFetchRequest
    | offset_fetch_v2.OffsetFetchRequest
    | offset_fetch_v3.OffsetFetchRequest
    | offset_fetch_v4.OffsetFetchRequest
    | offset_fetch_v5.OffsetFetchRequest
    | offset_fetch_v6.OffsetFetchRequest
    | offset_fetch_v7.OffsetFetchRequest
    | offset_fetch_v8.OffsetFetchRequest
    | offset_fetch_v9.OffsetFetchRequest
    | offset_fetch_v10.OffsetFetchRequest
)
OffsetDeleteRequest: TypeAlias = offset_delete_v0.OffsetDeleteRequest
ConsumerGroupHeartbeatRequest: TypeAlias = (
    consumer_group_heartbeat_v0.ConsumerGroupHeartbeatRequest
    | consumer_group_heartbeat_v1.ConsumerGroupHeartbeatRequest
)
ConsumerGroupDescribeRequest: TypeAlias = (
    consumer_group_describe_v0.ConsumerGroupDescribeRequest
    | consumer_group_describe_v1.ConsumerGroupDescribeRequest
)
WriteTxnMarkersRequest: TypeAlias = (
    write_txn_markers_v1.WriteTxnMarkersRequest | write_txn_markers_v2.WriteTxnMarkersRequest
)

# Versions grouped by a field they share, for `isinstance`.
DeleteTopicsByIdRequest: TypeAlias = delete_topics_v6.DeleteTopicsRequest
FetchSessionRequest: TypeAlias = (
    fetch_v7.FetchRequest
    | fetch_v8.FetchRequest
    | fetch_v9.FetchRequest
    | fetch_v10.FetchRequest
    | fetch_v11.FetchRequest
    | fetch_v12.FetchRequest
    | fetch_v13.FetchRequest
    | fetch_v14.FetchRequest
    | fetch_v15.FetchRequest
    | fetch_v16.FetchRequest
    | fetch_v17.FetchRequest
    | fetch_v18.FetchRequest
)
# AddPartitionsToTxn v4+: the batched broker-to-broker form.
AddPartitionsToTxnBatchRequest: TypeAlias = (
    add_partitions_to_txn_v4.AddPartitionsToTxnRequest
    | add_partitions_to_txn_v5.AddPartitionsToTxnRequest
)
FindCoordinatorBatchRequest: TypeAlias = (
    find_coordinator_v4.FindCoordinatorRequest
    | find_coordinator_v5.FindCoordinatorRequest
    | find_coordinator_v6.FindCoordinatorRequest
)

# The partition entries of the share-state RPCs (83-87), one class per version.
InitializeStatePartition: TypeAlias = initialize_share_group_state_v0.request.PartitionData
ReadStatePartition: TypeAlias = read_share_group_state_v0.request.PartitionData
WriteStatePartition: TypeAlias = (
    write_share_group_state_v0.request.PartitionData
    | write_share_group_state_v1.request.PartitionData
)
DeleteStatePartition: TypeAlias = delete_share_group_state_v0.request.PartitionData
ReadStateSummaryPartition: TypeAlias = (
    read_share_group_state_summary_v0.request.PartitionData
    | read_share_group_state_summary_v1.request.PartitionData
)
DescribeUserScramCredentialsRequest: TypeAlias = (
    describe_user_scram_credentials_v0.DescribeUserScramCredentialsRequest
)
AlterUserScramCredentialsRequest: TypeAlias = (
    alter_user_scram_credentials_v0.AlterUserScramCredentialsRequest
)
