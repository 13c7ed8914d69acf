"""Share-state writes: a share partition's pending change made durable, or undone.

Every change of a share partition is two-phase: the core applies it in memory, the
`StateWriter` writes its StateUpdate through the share coordinator's persister, then
commits it, or rolls it back when the write fails, so memory is never ahead of the share
coordinator. Several partitions' changes go as one write (`write_many`: one append, one
fsync). A failure is logged with its context and becomes the Kafka error the client gets
(`persister_error`); a partition whose state was fenced is dropped (`on_dropped`), to be
read afresh on next use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import structlog

from broker import trace
from broker.share.partition import PendingChange, SharePartition
from coordinator.share_persister import StateWrite, write_states
from coordinator.share_state import Persister, ShareStateKey
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.share")

# The leader epoch of a topic partition whose leader has no epoch to give (a broker
# alone: broker.cluster.SingleNode leads every partition at epoch 0). Writes carry the
# epoch the share partition was read with (`SharePartition.leader_epoch`).
LEADER_EPOCH = 0

# Share coordinator errors after which the leader's view of the partition cannot be trusted:
# it is dropped and read afresh on next use (Kafka's fencedSharePartitionHandler).
_FENCED = frozenset({ErrorCode.fenced_state_epoch, ErrorCode.fenced_leader_epoch})
_DROP_STATE = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.group_id_not_found,
        ErrorCode.unknown_topic_or_partition,
    }
)
_PASSED_ON = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.group_id_not_found,
        ErrorCode.unknown_topic_or_partition,
    }
)
# A share-state log write that failed (a failed fsync, the storage database down or
# refusing writes) is one of these too: Kafka's ShareCoordinatorService answers a write
# failing with KAFKA_STORAGE_ERROR as NOT_COORDINATOR (CoordinatorOperationExceptionHelper
# .handleOperationException), PersisterStateManager retries that and, out of attempts,
# hands it to SharePartition.fetchPersisterError: COORDINATOR_NOT_AVAILABLE.
_COORDINATOR_UNAVAILABLE = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.kafka_storage_error,
    }
)


def persister_error(exc: Exception) -> KafkaError:
    """What a share client is told when the share coordinator failed a call.

    As Kafka's SharePartition.fetchPersisterError: a fenced state or leader epoch becomes
    NOT_LEADER_OR_FOLLOWER (the client refreshes metadata and retries), coordinator errors
    COORDINATOR_NOT_AVAILABLE, GROUP_ID_NOT_FOUND and UNKNOWN_TOPIC_OR_PARTITION stay, and
    any other code is UNKNOWN_SERVER_ERROR (it is no fault of the client's request). A failed
    durable write (KAFKA_STORAGE_ERROR, or an OSError reaching us raw) is
    COORDINATOR_NOT_AVAILABLE, as Kafka's share coordinator failing its log append ends
    (see `_COORDINATOR_UNAVAILABLE`): retriable, the records stay acquired.
    """
    if isinstance(exc, KafkaError):
        if exc.code in _FENCED:
            return KafkaError(
                ErrorCode.not_leader_or_follower,
                f"share-partition state was fenced ({exc.code.name}): {exc.message or ''}",
            )
        if exc.code == ErrorCode.kafka_storage_error:
            return KafkaError(
                ErrorCode.coordinator_not_available,
                f"share-state write failed: {exc.message or 'storage error'}",
            )
        if exc.code in _COORDINATOR_UNAVAILABLE:
            return KafkaError(ErrorCode.coordinator_not_available, exc.message)
        if exc.code in _PASSED_ON:
            return exc
        return KafkaError(
            ErrorCode.unknown_server_error,
            f"share coordinator failed with {exc.code.name}: {exc.message or ''}",
        )
    if isinstance(exc, OSError):
        return KafkaError(
            ErrorCode.coordinator_not_available,
            f"share-state write failed: {exc.strerror or exc}",
        )
    return KafkaError(ErrorCode.unknown_server_error, "share-state write failed: server error")


def reraise_as(error: KafkaError, cause: Exception) -> NoReturn:
    if error is cause:
        raise error
    raise error from cause


@dataclass(slots=True, eq=False)
class PendingWrite:
    """A share partition's pending change, to persist with others (`write_many`)."""

    key: ShareStateKey
    sp: SharePartition
    change: PendingChange
    operation: str
    context: dict[str, object]


class StateWriter:
    """Writes share partitions' changes through `persister`; the caller holds each
    partition's lock from the change until this returns."""

    def __init__(
        self,
        persister: Persister,
        topic_name: Callable[[ShareStateKey], str | None],
        on_dropped: Callable[[ShareStateKey, SharePartition | None], None],
        on_committed: Callable[[ShareStateKey, SharePartition], None] | None = None,
    ) -> None:
        self.persister = persister
        self.topic_name = topic_name
        self.on_dropped = on_dropped
        # Called after each change a write made durable (the dead-letter writer looks for
        # new ARCHIVING runs there).
        self.on_committed = on_committed

    async def write(
        self,
        key: ShareStateKey,
        sp: SharePartition,
        change: PendingChange,
        operation: str,
        **context: object,
    ) -> None:
        """Persist `change` and commit it; on failure roll it back and raise the KafkaError
        the client gets (the partition is dropped when its state was fenced)."""
        update = change.state_update
        if update is None:
            change.commit()
            return
        if trace.ENABLED:
            trace.event("state_write", partitions=1, operation=operation)
        try:
            await self.persister.write_state(
                key,
                sp.state_epoch,
                sp.leader_epoch,
                update.start_offset,
                update.state_batches,
                delivery_complete_count=update.delivery_complete_count,
            )
        except BaseException as exc:
            # Memory must not run ahead of the share coordinator: undo, whatever went wrong
            # (a cancelled caller included, or the partition would stay locked forever).
            change.rollback()
            if not isinstance(exc, Exception):
                raise
            reraise_as(self.failed(key, sp, operation, exc, context), exc)
        change.commit()
        if self.on_committed is not None:
            self.on_committed(key, sp)

    async def write_many(self, writes: list[PendingWrite]) -> list[KafkaError | None]:
        """Persist several partitions' changes as one share-state write (one append, one
        fsync) and commit each; on failure roll each back. Per change, the KafkaError the
        client gets or None. The caller holds every partition's lock."""
        todo = [w for w in writes if w.change.state_update is not None]
        for w in writes:
            if w.change.state_update is None:
                w.change.commit()
        if not todo:
            return [None] * len(writes)
        if len(todo) == 1:
            # One partition: the plain path (and any persister double's write_state).
            w = todo[0]
            try:
                await self.write(w.key, w.sp, w.change, w.operation, **w.context)
            except KafkaError as exc:
                return [exc if x is w else None for x in writes]
            return [None] * len(writes)
        state_writes = []
        for w in todo:
            update = w.change.state_update
            assert update is not None
            state_writes.append(
                StateWrite(
                    w.key,
                    w.sp.state_epoch,
                    w.sp.leader_epoch,
                    update.start_offset,
                    update.state_batches,
                    update.delivery_complete_count,
                )
            )
        if trace.ENABLED:
            trace.event("state_write", partitions=len(state_writes))
        try:
            outcomes = await write_states(self.persister, state_writes)
        except BaseException:
            # Memory must not run ahead of the share coordinator (a cancelled caller too).
            for w in todo:
                w.change.rollback()
            raise
        errors: dict[int, KafkaError] = {}
        for w, outcome in zip(todo, outcomes, strict=True):
            if outcome is None:
                w.change.commit()
                if self.on_committed is not None:
                    self.on_committed(w.key, w.sp)
                continue
            w.change.rollback()
            errors[id(w)] = self.failed(w.key, w.sp, w.operation, outcome, w.context)
        return [errors.get(id(w)) for w in writes]

    def failed(
        self,
        key: ShareStateKey,
        sp: SharePartition | None,
        operation: str,
        exc: Exception,
        context: dict[str, object],
        event: str = "share_state_write_failed",
    ) -> KafkaError:
        """Log a failed share coordinator call with its context; the error for the client."""
        error = persister_error(exc)
        # A fenced epoch is the share coordinator doing its job; anything else is a failure.
        emit = log.warning if error.code in _DROP_STATE else log.error
        emit(
            event,
            group=key.group_id,
            topic=self.topic_name(key),
            topic_id=str(key.topic_id),
            partition=key.partition,
            operation=operation,
            error=error.code.name,
            reason=error.message,
            **context,
            exc_info=None if isinstance(exc, KafkaError | OSError) else exc,
        )
        if error.code in _DROP_STATE:
            self.on_dropped(key, sp)
        return error
