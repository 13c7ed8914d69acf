"""`spool compact` on a share-state log a real broker wrote under share traffic at scale.

A member of a share group on 64 partitions takes waves of records: each wave is one
record produced to every partition, a ShareFetch that acquires all 64 (an acquisition is
not written, KIP-932), a ShareAcknowledge releasing them (one share-state record each),
a ShareFetch that acquires them again and a ShareAcknowledge accepting them (one more
each). 1,700 waves write over 200,000 share-state records; the broker is killed with -9
half way and the member carries on after the restart. The stopped broker's closed
segments then compact to a small fraction of their size, the broker adopts the output
at start, and its replay equals the replay before, key by key.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from persister.spark.compact import compact
from persister.spark.segments import closed_segments, read_segment
from protocol.client import KafkaClient
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import Broker, create_topic
from tests.integration.share_helpers import (
    earliest,
    heartbeat,
    log_lines,
    share_ack_body,
    share_fetch_body,
    topic_id,
)
from tests.spark.helpers import replay_dir, states_of
from tests.spark.test_compact import assert_same_states

TOPIC = "scale"
GROUP = "scale-workers"
PARTITIONS = 64
WAVES = 1_700
TARGET_STATE_RECORDS = 200_000
PRODUCE = 0
SHARE_FETCH = 78
SHARE_ACK = 79
ACCEPT = 1
RELEASE = 2

SETTINGS = {
    "share.coordinator.state.topic.segment.bytes": str(1 << 20),
    # No compaction by the broker itself: the job gets the whole log to fold.
    "log.cleaner.enable": "false",
}


async def _waves(broker: Broker, first: int, last: int) -> None:
    """Run waves `first` .. `last` - 1 with a new member (the one before died with the
    broker, and a restart forgets its acquisitions: they are taken again, then accepted)."""
    client = await KafkaClient.connect(broker.host, broker.port, "scale")
    try:
        tid = await topic_id(client, TOPIC)
        member = str(uuid.uuid4())
        joined = await heartbeat(client, GROUP, member, 0, [TOPIC])
        assert joined.error_code == 0, joined
        member_epoch = joined.member_epoch
        epoch = 0
        acks: dict[tuple[uuid.UUID, int], list[dict[str, object]]] = {
            (tid, p): [] for p in range(PARTITIONS)
        }
        for wave in range(first, last):
            if wave % 50 == 0:  # stay a member however slow the machine is
                hb = await heartbeat(client, GROUP, member, member_epoch)
                assert hb.error_code == 0, hb
                member_epoch = hb.member_epoch
            blob = [bytes(build_batch([NewRecord(None, f"w{wave}".encode())]))]
            produced = await client.request(
                PRODUCE,
                9,
                {
                    "transactional_id": None,
                    "acks": -1,
                    "timeout": 30_000,
                    "topic_data": [
                        {
                            "name": TOPIC,
                            "partition_data": [
                                {"index": p, "records": blob[0]} for p in range(PARTITIONS)
                            ],
                        }
                    ],
                },
            )
            assert all(p.error_code == 0 for p in produced.responses[0].partition_responses), (
                produced
            )
            pending = set(range(PARTITIONS))
            for _ in range(20):
                if any(acks.values()):
                    # Acknowledged alone, as librdkafka's commit_async does.
                    ack_body = share_ack_body(
                        GROUP, member, epoch, {tp: b for tp, b in acks.items() if b}
                    )
                    done = await client.request(SHARE_ACK, 1, ack_body)
                    epoch += 1
                    assert done.error_code == 0, done
                    assert all(p.error_code == 0 for t in done.responses for p in t.partitions)
                    acks = {tp: [] for tp in acks}
                body = share_fetch_body(
                    GROUP, member, epoch, acks, max_wait=500, max_records=PARTITIONS
                )
                r = await client.request(SHARE_FETCH, 1, body)
                epoch += 1
                assert r.error_code == 0, r
                acks = {tp: [] for tp in acks}
                for t in r.responses:
                    for part in t.partitions:
                        assert part.error_code == 0 and part.acknowledge_error_code == 0, part
                        for a in part.acquired_records:
                            # Released on its first delivery and accepted on its second:
                            # two share-state records per record.
                            kind = RELEASE if a.delivery_count == 1 else ACCEPT
                            acks[(tid, part.partition_index)].append(
                                {
                                    "first_offset": a.first_offset,
                                    "last_offset": a.last_offset,
                                    "acknowledge_types": [kind],
                                }
                            )
                            if a.last_offset >= wave and kind == ACCEPT:
                                pending.discard(part.partition_index)
                if not pending:
                    break
            assert not pending, f"wave {wave}: nothing acquired on {sorted(pending)}"
        # The last wave's acknowledgements, and the session closed.
        final = share_fetch_body(GROUP, member, -1, acks)
        assert (await client.request(SHARE_FETCH, 1, final)).error_code == 0
    finally:
        await client.close()


def _state_records(log_dir: Path) -> int:
    files = sorted(log_dir.glob("*.log"))
    return sum(1 for f in files for _ in read_segment(f))


@pytest.mark.timeout(900)  # a few minutes of traffic on 2 cores; the default is 300 s
def test_a_real_brokers_share_state_log_at_scale_compacts_small_and_replays_the_same(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker = Broker(tmp_path / "data", tmp_path / "broker.log", SETTINGS)
    log_dir = broker.data_dir / "share-state"
    broker.start()
    try:
        create_topic(broker, TOPIC, partitions=PARTITIONS)
        earliest(broker, GROUP)
        half = WAVES // 2
        asyncio.run(_waves(broker, 0, half))
        broker.kill9()
        broker.start()
        asyncio.run(_waves(broker, half, WAVES))
        broker.stop()

        written = _state_records(log_dir)
        assert written >= TARGET_STATE_RECORDS, written
        before = states_of(replay_dir(log_dir))
        assert len(before) == PARTITIONS
        # Every record was accepted, the ones before the kill included: each key's start
        # offset is at the end of its partition.
        assert {s.start_offset for s in before.values() if s} == {WAVES}

        size_before = sum(s.size for s in closed_segments(log_dir))
        output = compact(spark, broker.data_dir)
        assert output.staging is not None
        broker.start()  # adopts the output before it replays
        assert log_lines(broker, "share_state_compaction_adopted", "at_start")
        broker.stop()
        size_after = sum(s.size for s in closed_segments(log_dir))
        assert size_after * 20 < size_before, (size_before, size_after)
        print(f"{written} share-state records; closed segments {size_before} -> {size_after} B")
        assert_same_states(before, states_of(replay_dir(log_dir)))
    finally:
        if broker.running:
            broker.kill9()
