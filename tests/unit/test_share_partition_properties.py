"""SharePartition against a per-offset reference model, under random operation sequences.

The model keeps one entry per offset and applies Kafka's rules offset by offset; the machine
keeps ranges. Each change is committed or rolled back at random (its share-state write
succeeded or failed): a rollback must leave the machine exactly as before, and the model
applies only the committed changes. After every step both must agree, and KIP-932's
share-partition invariants must hold: every offset of [spso, speo) in exactly one state,
spso only moving forward and only over done records, delivery counts within the limit,
refused acknowledgements changing nothing, and the committed StateUpdates replaying (from
the first snapshot) to exactly `snapshot_state()` and to KIP-932's durable view of the
model (ACQUIRED is transient: stored as the AVAILABLE record it was before the acquisition).

With a dead-letter topic (KIP-1191, switched on and off at random) a rejected record, or one
given up on at the delivery limit, is ARCHIVING instead of ARCHIVED until the dead-letter
writer archives it: never acquired, SPSO never passes it, not in delivery_complete_count,
handed out once (`take_dead_letters`) with its exact reason, archived two-phase (a rollback
keeps it ARCHIVING), and handed out again by a reload of the durable state.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broker.share.dead_letters import DeadLetterReason
from broker.share.partition import (
    AcknowledgeType,
    AcquiredRange,
    ChangePending,
    PendingChange,
    RecordState,
    ShareAcquireMode,
    SharePartition,
    SharePartitionConfig,
    StateUpdate,
)
from protocol.errors import ErrorCode

A = RecordState.AVAILABLE
Q = RecordState.ACQUIRED
K = RecordState.ACKNOWLEDGED
X = RecordState.ARCHIVED
G = RecordState.ARCHIVING
DONE = (K, X)
MEMBERS = ("m1", "m2", "m3")
LOCK_MS = 100

Offset = tuple[RecordState, int, str | None, int | None]  # state, count, member, deadline
Durable = dict[int, tuple[int, int]]


def expand(sp: SharePartition) -> dict[int, Offset]:
    view: dict[int, Offset] = {}
    for r in sp.in_flight_ranges():
        for offset in range(r.first_offset, r.last_offset + 1):
            view[offset] = (r.state, r.delivery_count, r.member_id, r.lock_deadline_ms)
    return view


def durable_of(start_offset: int, batches: Sequence[tuple[int, int, int, int]]) -> Durable:
    out: Durable = {}
    for first, last, state, count in batches:
        for offset in range(max(first, start_offset), last + 1):
            out[offset] = (state, count)
    return out


def replay(durable: Durable, update: StateUpdate) -> Durable:
    """What the share coordinator does with a write: newer wins, drop below start offset."""
    merged = dict(durable)
    for first, last, state, count in update.state_batches:
        for offset in range(first, last + 1):
            merged[offset] = (state, count)
    return {o: v for o, v in merged.items() if o >= update.start_offset}


def kip_durable(model: dict[int, Offset]) -> Durable:
    """What KIP-932 stores for the model's offsets: an ACQUIRED record with delivery count n
    as AVAILABLE with n - 1, and nothing for AVAILABLE with count 0 (never delivered)."""
    out: Durable = {}
    for offset, (state, count, _member, _deadline) in model.items():
        value = (int(A), count - 1) if state is Q else (int(state), count)
        if value != (int(A), 0):
            out[offset] = value
    return out


per_offset_persisted = st.one_of(
    st.just((0, 0)),  # no state batch: never delivered
    st.tuples(st.just(0), st.integers(1, 4)),
    st.tuples(st.just(2), st.integers(1, 4)),
    st.tuples(st.just(4), st.integers(0, 4)),
    st.tuples(st.just(3), st.integers(1, 4)),
)


class SharePartitionMachine(RuleBasedStateMachine):
    sp: SharePartition
    model: dict[int, Offset]
    spso: int
    speo: int

    @initialize(
        limit=st.integers(1, 4),
        max_in_flight=st.integers(3, 60),
        batch_sizes=st.lists(st.integers(1, 6), min_size=20, max_size=40),
        gap_batches=st.sets(st.integers(0, 39), max_size=6),
        start_offset=st.integers(0, 10),
        persisted=st.lists(per_offset_persisted, max_size=15),
        dead_letter=st.booleans(),
    )
    def setup(
        self,
        limit: int,
        max_in_flight: int,
        batch_sizes: list[int],
        gap_batches: set[int],
        start_offset: int,
        persisted: list[tuple[int, int]],
        dead_letter: bool,
    ) -> None:
        self.limit = limit
        self.dead_letter = dead_letter
        self.log: list[tuple[int, int]] = []
        offset = 0
        for size in batch_sizes:
            self.log.append((offset, offset + size - 1))
            offset += size
        self.gaps = [b for i, b in enumerate(self.log) if i in gap_batches]
        self.log_start = 0
        self.now = 0
        # Persisted counts may exceed a limit lowered since: clamp so the invariant is checkable.
        batches = [
            (start_offset + i, start_offset + i, state, min(count, limit))
            for i, (state, count) in enumerate(persisted)
            if (state, count) != (0, 0)
        ]
        self.sp = SharePartition(
            "g",
            uuid.uuid4(),
            0,
            config=SharePartitionConfig(
                record_lock_duration_ms=LOCK_MS,
                delivery_count_limit=limit,
                max_in_flight_records=max_in_flight,
                dead_letter=dead_letter,
            ),
            state_epoch=0,
            start_offset=start_offset,
            state_batches=batches,
        )
        self.model = expand(self.sp)
        self.reasons: dict[int, DeadLetterReason] = {}
        self.handed: set[int] = set()
        self.infer_reasons()
        self.spso, self.speo = self.sp.spso, self.sp.speo
        start, snapshot = self.sp.snapshot_state()
        self.durable = durable_of(start, snapshot)
        self.last_spso, self.last_speo = self.spso, self.speo

    # -- helpers --------------------------------------------------------------------------

    def whole(self) -> tuple[object, ...]:
        sp = self.sp
        return (
            sp.spso,
            sp.speo,
            sp.snapshot_state(),
            sp.in_flight_ranges(),
            sp.acquired_count,
            sp.next_lock_deadline(),
            sp.next_fetch_offset(),
            sp.range_count,
            sp.can_acquire(),
            dict(sp._deadlines),
        )

    def complete(self, change: PendingChange, commit: bool, before: tuple[object, ...]) -> bool:
        """Commit the change, or roll it back and check nothing of it is left; True if kept."""
        if change.pending:
            with pytest.raises(ChangePending):
                self.sp.expire_locks(self.now)
        if commit:
            change.commit()
            return True
        change.rollback()
        assert self.whole() == before, "a rolled back change left something behind"
        return False

    def infer_reasons(self) -> None:
        """The reasons of loaded ARCHIVING records, as Kafka infers them."""
        self.reasons = {
            offset: DeadLetterReason.DELIVERY_LIMIT
            if count >= self.limit
            else DeadLetterReason.REJECTED
            for offset, (state, count, _m, _d) in self.model.items()
            if state is G
        }

    def give_up(self, offset: int, reason: DeadLetterReason) -> None:
        """The model of a record given up on: ARCHIVING with a dead-letter topic."""
        count = self.model[offset][1]
        if self.dead_letter:
            self.model[offset] = (G, count, None, None)
            self.reasons[offset] = reason
        else:
            self.model[offset] = (X, count, None, None)

    def advance_model(self) -> None:
        while self.spso < self.speo and self.model[self.spso][0] in DONE:
            del self.model[self.spso]
            self.spso += 1

    def record(self, update: StateUpdate | None, spso_before: int) -> None:
        if update is None:
            assert self.sp.spso == spso_before, "SPSO moved without a StateUpdate"
            return
        assert update.start_offset == self.sp.spso
        for first, last, _state, _count in update.state_batches:
            assert self.sp.spso <= first <= last < self.sp.speo
        self.durable = replay(self.durable, update)

    def read_log(self, from_offset: int, max_batches: int) -> list[tuple[int, int]]:
        return [b for b in self.log if b[1] >= from_offset][:max_batches]

    def release_model(self, offset: int) -> None:
        _state, count, _member, _deadline = self.model[offset]
        if count < self.limit:
            self.model[offset] = (A, count, None, None)
        else:
            self.give_up(offset, DeadLetterReason.DELIVERY_LIMIT)

    # -- rules ----------------------------------------------------------------------------

    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        self.now += data.draw(st.integers(0, 60))

    @precondition(lambda self: self.sp.next_lock_deadline() is not None)
    @rule()
    def tick_to_next_lock_deadline(self) -> None:
        deadline = self.sp.next_lock_deadline()
        assert deadline is not None
        self.now = max(self.now, deadline)

    @rule(
        member=st.sampled_from(MEMBERS),
        max_batches=st.integers(1, 6),
        max_records=st.integers(1, 20),
        batch_size=st.integers(1, 10),
        mode=st.sampled_from(ShareAcquireMode),
        commit=st.booleans(),
    )
    def acquire(
        self,
        member: str,
        max_batches: int,
        max_records: int,
        batch_size: int,
        mode: ShareAcquireMode,
        commit: bool,
    ) -> None:
        sp = self.sp
        fetch_offset = sp.next_fetch_offset()
        batches = self.read_log(fetch_offset, max_batches)
        spso_before, speo_before = sp.spso, sp.speo
        could_acquire = sp.can_acquire()
        whole_before = self.whole()
        before = dict(self.model)
        result = sp.acquire(
            member,
            batches,
            max_records=max_records,
            batch_size=batch_size,
            now_ms=self.now,
            gaps=self.gaps,
            mode=mode,
        )
        after = expand(sp)
        # Ascending, never overlapping or touching with the same delivery count.
        for previous, current in zip(result.acquired, result.acquired[1:], strict=False):
            assert previous.last_offset < current.first_offset
            assert (
                previous.last_offset + 1 < current.first_offset
                or previous.delivery_count != current.delivery_count
                or mode is ShareAcquireMode.BATCH_OPTIMIZED
            )
        acquired = {
            o: r.delivery_count
            for r in result.acquired
            for o in range(r.first_offset, r.last_offset + 1)
        }
        in_gap = {o for first, last in self.gaps for o in range(first, last + 1)}
        new_reasons: dict[int, DeadLetterReason] = {}
        for offset, count in acquired.items():
            assert after[offset] == (Q, count, member, self.now + LOCK_MS)
            assert offset not in in_gap
            if offset < speo_before:
                state, old_count, _, _ = before[offset]
                assert state is A and old_count < self.limit and count == old_count + 1
            else:
                assert count == 1
        for offset in range(spso_before, max(speo_before, sp.speo)):
            if offset in acquired:
                continue
            old = before.get(offset)
            new = after.get(offset)
            if old == new or (new is None and old is not None and old[0] in DONE):
                continue
            # Anything else a fetch changes is archived without being delivered: a record at
            # the delivery limit dead-lettered (ARCHIVING) with a dead-letter topic.
            if old is None:
                assert offset in in_gap
            else:
                assert old[0] is A and (old[1] >= self.limit or offset in in_gap)
            at_limit = old is not None and old[1] >= self.limit
            if new is not None and self.dead_letter and at_limit:
                assert new[0] is G
                new_reasons[offset] = DeadLetterReason.DELIVERY_LIMIT
            else:
                assert new is None or new[0] is X
        total = len(acquired)
        for offset in acquired:
            assert before.get(offset, (A,))[0] is not G, "an ARCHIVING record was acquired"
        longest_batch = max(last - first + 1 for first, last in self.log)
        assert total < max_records + longest_batch
        if mode is ShareAcquireMode.RECORD_LIMIT:
            # KIP-1206: MaxRecords is a hard limit, whatever the log batches.
            assert total <= max_records
        if sp.speo > speo_before:
            assert sp.speo - sp.spso <= sp.config.max_in_flight_records
        if could_acquire and batches:
            progressed = total or after != before or sp.speo != speo_before
            assert progressed, "a fetch that could acquire made no progress"
        if not self.complete(result.change, commit, whole_before):
            return
        self.model = after
        self.reasons.update(new_reasons)
        self.spso, self.speo = sp.spso, sp.speo
        self.record(result.state_update, spso_before)

    @rule(
        member=st.sampled_from(MEMBERS),
        data=st.data(),
        malformed=st.booleans(),
        commit=st.booleans(),
    )
    def acknowledge(self, member: str, data: st.DataObject, malformed: bool, commit: bool) -> None:
        sp = self.sp
        lo, hi = max(sp.spso - 3, 0), sp.speo + 2
        points = sorted(data.draw(st.sets(st.integers(lo, hi), min_size=1, max_size=6)))
        batches: list[tuple[int, int, tuple[int, ...]]] = []
        for first, last in zip(points[0::2], [*points[1::2], points[-1]], strict=False):
            if first > last:
                continue
            if data.draw(st.booleans()):
                types = tuple(
                    data.draw(
                        st.lists(
                            st.integers(0, 4), min_size=last - first + 1, max_size=last - first + 1
                        )
                    )
                )
            else:
                types = (data.draw(st.integers(0, 4)),)
            batches.append((first, last, types))
        if not batches:
            return
        if malformed:
            kind = data.draw(st.sampled_from(["reverse", "overlap", "bad_type", "count"]))
            first, last, types = batches[0]
            if kind == "reverse" and len(batches) > 1:
                batches.reverse()
            elif kind == "overlap":
                batches.append((last, last + 1, (1,)))
            elif kind == "bad_type":
                batches[0] = (first, last, (7,))
            elif kind == "count" and last > first:
                batches[0] = (first, last, (1,) * (last - first + 2))

        expected = self.expected_ack_error(member, batches)
        spso_before = sp.spso
        before = self.whole()
        result = sp.acknowledge(member, batches, now_ms=self.now)
        assert result.error_code == expected, (batches, result)
        if expected != ErrorCode.none:
            assert result.state_update is None
            assert not result.change.pending
            assert self.whole() == before, "a refused acknowledgement changed state"
            return
        if not self.complete(result.change, commit, before):
            return
        for first, last, types in batches:
            for offset in range(max(first, self.spso), last + 1):
                ack = types[0] if len(types) == 1 else types[offset - first]
                _state, count, owner, _deadline = self.model[offset]
                if ack == AcknowledgeType.ACCEPT:
                    self.model[offset] = (K, count, None, None)
                elif ack == AcknowledgeType.REJECT:
                    self.give_up(offset, DeadLetterReason.REJECTED)
                elif ack == AcknowledgeType.GAP:
                    self.model[offset] = (X, count, None, None)
                elif ack == AcknowledgeType.RELEASE:
                    self.release_model(offset)
                else:
                    self.model[offset] = (Q, count, owner, self.now + LOCK_MS)
        self.advance_model()
        self.record(result.state_update, spso_before)

    def expected_ack_error(
        self, member: str, batches: list[tuple[int, int, tuple[int, ...]]]
    ) -> ErrorCode:
        previous = -1
        for first, last, types in batches:
            if first > last or first <= previous or len(types) not in (1, last - first + 1):
                return ErrorCode.invalid_request
            if any(t not in range(5) for t in types):
                return ErrorCode.invalid_request
            previous = last
        for first, last, _types in batches:
            first = max(first, self.spso)
            if first > last:
                continue
            if last >= self.speo:
                return ErrorCode.invalid_request
            for offset in range(first, last + 1):
                state, _count, owner, _deadline = self.model[offset]
                if state is not Q or owner != member:
                    return ErrorCode.invalid_record_state
        return ErrorCode.none

    @rule(
        member=st.sampled_from(MEMBERS),
        other=st.sampled_from(MEMBERS),
        data=st.data(),
        max_batches=st.integers(1, 4),
        max_records=st.integers(1, 20),
        mode=st.sampled_from(ShareAcquireMode),
        commit=st.booleans(),
    )
    def acknowledge_with_a_fetch_beside(
        self,
        member: str,
        other: str,
        data: st.DataObject,
        max_batches: int,
        max_records: int,
        mode: ShareAcquireMode,
        commit: bool,
    ) -> None:
        """An acknowledgement pending (its write in flight) while another member's fetch
        acquires new records beside it; then the write succeeds or fails."""
        sp = self.sp
        held = sorted(o for o, v in self.model.items() if v[0] is Q and v[2] == member)
        if not held:
            return
        first = data.draw(st.sampled_from(held))
        last = first
        while (
            last + 1 in self.model
            and self.model[last + 1][0] is Q
            and self.model[last + 1][2] == member
        ):
            last += 1
        ack_type = data.draw(st.sampled_from([1, 2, 3]))  # ACCEPT, RELEASE, REJECT
        spso_before = sp.spso
        result = sp.acknowledge(member, [(first, last, (ack_type,))], now_ms=self.now)
        assert result.error_code == ErrorCode.none
        change = result.change
        batches = self.read_log(sp.speo, max_batches)
        in_gap = {o for lo, hi in self.gaps for o in range(lo, hi + 1)}
        touches_gap = any(o in in_gap for lo, hi in batches for o in range(lo, hi + 1))
        got: tuple[AcquiredRange, ...] = ()
        if change.pending and sp.can_acquire_beside() and not touches_gap:
            got = sp.acquire_beside(
                other, batches, max_records=max_records, batch_size=5, now_ms=self.now, mode=mode
            )
            for r in got:
                assert r.delivery_count == 1
                for o in range(r.first_offset, r.last_offset + 1):
                    assert o not in in_gap
            if got:
                assert sp.speo - min(sp.spso, spso_before) <= sp.config.max_in_flight_records
        if commit and change.pending:
            change.commit()
        elif change.pending:
            change.rollback()
        for r in got:
            for o in range(r.first_offset, r.last_offset + 1):
                self.model[o] = (Q, 1, other, self.now + LOCK_MS)
        self.speo = sp.speo
        if not commit:
            return
        for offset in range(max(first, self.spso), last + 1):
            _state, count, _owner, _deadline = self.model[offset]
            if ack_type == 1:
                self.model[offset] = (K, count, None, None)
            elif ack_type == 3:
                self.give_up(offset, DeadLetterReason.REJECTED)
            else:
                self.release_model(offset)
        self.advance_model()
        self.record(result.state_update, spso_before)

    @rule(commit=st.booleans())
    def expire_locks(self, commit: bool) -> None:
        spso_before = self.sp.spso
        before = self.whole()
        result = self.sp.expire_locks(self.now)
        if not self.complete(result.change, commit, before):
            return
        for offset, (state, _count, _member, deadline) in list(self.model.items()):
            if state is Q and deadline is not None and deadline <= self.now:
                self.release_model(offset)
        self.advance_model()
        self.record(result.state_update, spso_before)
        assert all(
            r.lock_deadline_ms is not None and r.lock_deadline_ms > self.now
            for r in self.sp.in_flight_ranges()
            if r.state is Q
        ), "an expired lock is still held"

    @rule(member=st.sampled_from(MEMBERS), commit=st.booleans())
    def release_member(self, member: str, commit: bool) -> None:
        spso_before = self.sp.spso
        before = self.whole()
        result = self.sp.release_member(member, now_ms=self.now)
        if not self.complete(result.change, commit, before):
            return
        for offset, (state, _count, owner, _deadline) in list(self.model.items()):
            if state is Q and owner == member:
                self.release_model(offset)
        self.advance_model()
        self.record(result.state_update, spso_before)

    @precondition(lambda self: self.log_start < self.log[-1][1])
    @rule(data=st.data(), commit=st.booleans())
    def move_log_start(self, data: st.DataObject, commit: bool) -> None:
        self.log_start = data.draw(st.integers(self.log_start + 1, self.log[-1][1]))
        spso_before = self.sp.spso
        before = self.whole()
        change = self.sp.update_log_start_offset(self.log_start)
        if not self.complete(change, commit, before):
            return  # retried by the next move: the log start stays where it went
        update = change.state_update
        if self.log_start > self.spso:
            self.model = {o: v for o, v in self.model.items() if o >= self.log_start}
            self.spso = self.log_start
            self.speo = max(self.speo, self.log_start)
            self.advance_model()
        self.record(update, spso_before)

    @rule(on=st.booleans())
    def switch_dead_letter_topic(self, on: bool) -> None:
        """The group's dead-letter topic set or removed: runs already ARCHIVING drain."""
        self.dead_letter = on
        self.sp.config = replace(self.sp.config, dead_letter=on)

    @rule(data=st.data(), commit=st.booleans())
    def take_and_archive_dead_letters(self, data: st.DataObject, commit: bool) -> None:
        """The dead-letter writer: takes the runs not handed out yet, then archives one
        handed-out span (its copy durable), the write succeeding or failing."""
        sp = self.sp
        letters = sp.take_dead_letters()
        archiving = {o for o, v in self.model.items() if v[0] is G}
        taken: set[int] = set()
        for letter in letters:
            assert (letter.group_id, letter.topic_id, letter.partition) == (
                "g",
                sp.topic_id,
                0,
            )
            for offset in range(letter.first_offset, letter.last_offset + 1):
                assert offset not in taken
                taken.add(offset)
                assert self.model[offset][1] == letter.delivery_count
                assert self.reasons[offset] is letter.reason
        assert taken == archiving - self.handed, "not every ARCHIVING record handed out once"
        self.handed = set(archiving)
        assert sp.take_dead_letters() == []
        if not archiving:
            return
        first = data.draw(st.sampled_from(sorted(archiving)))
        last = data.draw(st.integers(first, max(archiving) + 2))
        spso_before = sp.spso
        before = self.whole()
        change = sp.archive_dead_letter(first, last)
        if not self.complete(change, commit, before):
            return
        for offset in range(first, last + 1):
            if offset in archiving:
                self.model[offset] = (X, self.model[offset][1], None, None)
                self.handed.discard(offset)
        self.advance_model()
        self.record(change.state_update, spso_before)

    @rule()
    def reload(self) -> None:
        """A crash and a new leader: the durable state read back. ACQUIRED records come back
        AVAILABLE with the count before their delivery, ARCHIVING runs are handed out again
        with their reasons inferred."""
        start, batches = self.sp.snapshot_state()
        self.sp = SharePartition(
            "g",
            self.sp.topic_id,
            0,
            config=self.sp.config,
            state_epoch=0,
            start_offset=start,
            state_batches=batches,
        )
        expected = {
            offset: (RecordState(state), count, None, None)
            for offset, (state, count) in kip_durable(self.model).items()
        }
        end = max(expected, default=start - 1) + 1
        for offset in range(start, end):
            expected.setdefault(offset, (A, 0, None, None))
        assert expand(self.sp) == expected
        self.model = expected
        self.spso, self.speo = self.sp.spso, self.sp.speo
        self.last_speo = self.speo
        self.durable = durable_of(start, batches)
        self.handed = set()
        self.infer_reasons()

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def ranges_cover_the_window_exactly_once(self) -> None:
        sp = self.sp
        cursor = sp.spso
        for r in sp.in_flight_ranges():
            assert r.first_offset == cursor <= r.last_offset
            cursor = r.last_offset + 1
        assert cursor == sp.speo
        assert sp.spso <= sp.speo

    @invariant()
    def spso_and_speo_only_move_forward(self) -> None:
        assert self.sp.spso >= self.last_spso
        assert self.sp.speo >= self.last_speo
        self.last_spso, self.last_speo = self.sp.spso, self.sp.speo

    @invariant()
    def machine_matches_model(self) -> None:
        assert (self.sp.spso, self.sp.speo) == (self.spso, self.speo)
        assert expand(self.sp) == self.model

    @invariant()
    def leading_record_is_not_done(self) -> None:
        ranges = self.sp.in_flight_ranges()
        assert not ranges or ranges[0].state not in DONE

    @invariant()
    def delivery_counts_within_limit_and_locks_only_on_acquired(self) -> None:
        acquired = 0
        for r in self.sp.in_flight_ranges():
            assert 0 <= r.delivery_count <= self.limit
            if r.state is Q:
                assert r.member_id is not None and r.lock_deadline_ms is not None
                assert r.delivery_count >= 1
                acquired += r.record_count
            else:
                assert r.member_id is None and r.lock_deadline_ms is None
        assert acquired == self.sp.acquired_count
        deadlines = [r.lock_deadline_ms for r in self.sp.in_flight_ranges() if r.state is Q]
        assert self.sp.next_lock_deadline() == (
            min(d for d in deadlines if d is not None) if deadlines else None
        )

    @invariant()
    def dead_letter_reasons_and_complete_count(self) -> None:
        done = 0
        for r in self.sp.in_flight_ranges():
            if r.state is G:
                for offset in range(r.first_offset, r.last_offset + 1):
                    assert r.reason is self.reasons[offset]
            else:
                assert r.reason is None
            if r.state in DONE:
                done += r.record_count
        assert self.sp.delivery_complete_count == done
        assert self.sp.has_dead_letters == any(v[0] is G for v in self.model.values())

    @invariant()
    def next_fetch_offset_is_first_available(self) -> None:
        available = [o for o, v in sorted(self.model.items()) if v[0] is A]
        assert self.sp.next_fetch_offset() == (available[0] if available else self.sp.speo)

    @invariant()
    def replayed_updates_equal_snapshot(self) -> None:
        start, batches = self.sp.snapshot_state()
        assert durable_of(start, batches) == self.durable
        assert min(self.durable, default=start) >= start

    @invariant()
    def replayed_updates_are_the_kip_932_durable_view_of_the_model(self) -> None:
        # Independent of the machine's own durable view: an acquisition that wrote its
        # ACQUIRED records, or a release that did not write the delivery made, shows here.
        assert self.durable == kip_durable(self.model)


SharePartitionMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSharePartitionMachine = SharePartitionMachine.TestCase
