"""The share session cache (Kafka's `ShareSessionCache` / `ShareSession`, KIP-932).

A share session belongs to one (group id, member id) and holds the partitions that
member fetches from this broker, so that each ShareFetch need only name what
changed. Every rule about share session epochs lives here:

    ShareSessionEpoch  ShareFetch                           ShareAcknowledge
    0                  open (replacing any session of the   INVALID_SHARE_SESSION_EPOCH
                       member); acks present: INVALID_REQUEST;
                       cache full: SHARE_SESSION_LIMIT_REACHED
    -1                 close: the session must exist        the session must exist;
                       (SHARE_SESSION_NOT_FOUND); the        nothing changes
                       handler applies acks, then `remove`s
    n > 0              the session must exist and n must     same
                       be its next epoch, else
                       INVALID_SHARE_SESSION_EPOCH; the
                       epoch then advances (wrapping from
                       2^31 - 1 to 1, like Kafka's nextEpoch)

The cache is sans-IO: the caller passes the current time, which is only recorded
(creation and last use) for describing and for metrics.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, KafkaError

__all__ = [
    "DEFAULT_MAX_SHARE_SESSIONS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INT32_MAX",
    "ShareSession",
    "ShareSessionCache",
    "ShareSessionContext",
    "ShareSessionKey",
    "TopicIdPartition",
    "next_epoch",
]

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1

# Kafka's `group.share.max.share.sessions` default.
DEFAULT_MAX_SHARE_SESSIONS = 2000

TopicIdPartition = tuple[uuid.UUID, int]
ShareSessionKey = tuple[str, str]  # (group id, member id)


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`: FINAL stays FINAL and 2^31 - 1 wraps to 1 (never 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == INT32_MAX:
        return 1
    return epoch + 1


@dataclass(slots=True)
class ShareSession:
    """One member's session: the partitions it fetches and the epoch expected next."""

    group_id: str
    member_id: str
    epoch: int
    creation_ms: int
    last_used_ms: int
    connection_id: str | None = None
    # Insertion-ordered set: fetch order follows the order partitions were added.
    _partitions: dict[TopicIdPartition, None] = field(default_factory=dict)

    @property
    def key(self) -> ShareSessionKey:
        return (self.group_id, self.member_id)

    @property
    def partitions(self) -> list[TopicIdPartition]:
        """The session's (topic id, partition)s, in the order they were added."""
        return list(self._partitions)

    def __contains__(self, tp: object) -> bool:
        return tp in self._partitions

    def __len__(self) -> int:
        return len(self._partitions)

    def _update(
        self, added: Iterable[TopicIdPartition], forgotten: Iterable[TopicIdPartition]
    ) -> tuple[list[TopicIdPartition], list[TopicIdPartition]]:
        # Kafka's ShareSession.update: add the request's partitions, then drop the
        # forgotten ones (so a partition named in both ends up removed).
        new = []
        for tp in added:
            if tp not in self._partitions:
                self._partitions[tp] = None
                new.append(tp)
        removed = []
        for tp in forgotten:
            if tp in self._partitions:
                del self._partitions[tp]
                removed.append(tp)
        return new, removed


@dataclass(frozen=True, slots=True)
class ShareSessionContext:
    """What a ShareFetch request means for the session, for the handler to act on.

    For a final request (epoch -1) the session is still in the cache: the handler
    applies the acknowledgements, then removes the session and releases the member's
    records on `session.partitions` (Kafka's releaseSession). `partitions` is what to
    fetch: empty when final, which is not what a final request releases.
    """

    epoch: int
    session: ShareSession
    is_new: bool
    is_final: bool
    added: tuple[TopicIdPartition, ...] = ()
    removed: tuple[TopicIdPartition, ...] = ()

    @property
    def partitions(self) -> list[TopicIdPartition]:
        return [] if self.is_final else self.session.partitions


class ShareSessionCache:
    """Share sessions keyed by (group id, member id), at most `max_entries` of them."""

    def __init__(self, max_entries: int = DEFAULT_MAX_SHARE_SESSIONS) -> None:
        if max_entries < 1:
            raise ValueError("group.share.max.share.sessions must be at least 1")
        self.max_entries = max_entries
        self._sessions: dict[ShareSessionKey, ShareSession] = {}
        self._by_connection: dict[str, set[ShareSessionKey]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[ShareSession]:
        return iter(list(self._sessions.values()))

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def total_partitions(self) -> int:
        """Partitions over all sessions (Kafka's SharePartitionsCount gauge)."""
        return sum(len(s) for s in self._sessions.values())

    def sessions_of_group(self, group_id: str) -> list[ShareSession]:
        return [s for s in self._sessions.values() if s.group_id == group_id]

    # -- ShareFetch / ShareAcknowledge ------------------------------------------

    def share_fetch(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        partitions: Iterable[TopicIdPartition],
        forgotten: Iterable[TopicIdPartition],
        now_ms: int,
        *,
        has_acknowledgements: bool = False,
        connection_id: str | None = None,
    ) -> ShareSessionContext:
        """Validate a ShareFetch's session epoch and apply its partition changes.

        Epoch 0 opens a session (replacing the member's old one), -1 returns a final
        context and leaves removal to the caller (after acknowledgements are
        applied), anything else must be the session's next epoch and advances it.
        Raises KafkaError with Kafka's code when the epoch is not acceptable.
        """
        key = (group_id, member_id)
        if epoch == INITIAL_EPOCH:
            if has_acknowledgements:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    "Acknowledgements are not allowed in a ShareFetch that opens a share "
                    "session (ShareSessionEpoch 0).",
                )
            self.remove(group_id, member_id)
            if len(self._sessions) >= self.max_entries:
                raise KafkaError(
                    ErrorCode.share_session_limit_reached,
                    f"The broker already holds {self.max_entries} share sessions "
                    "(group.share.max.share.sessions).",
                )
            session = ShareSession(
                group_id,
                member_id,
                next_epoch(INITIAL_EPOCH),
                creation_ms=now_ms,
                last_used_ms=now_ms,
                connection_id=connection_id,
            )
            added, _ = session._update(partitions, ())
            self._sessions[key] = session
            if connection_id is not None:
                self._by_connection.setdefault(connection_id, set()).add(key)
            return ShareSessionContext(
                epoch, session, is_new=True, is_final=False, added=tuple(added)
            )

        session = self._require(key)
        if epoch == FINAL_EPOCH:
            session.last_used_ms = now_ms
            return ShareSessionContext(epoch, session, is_new=False, is_final=True)
        self._check_epoch(session, epoch)
        added, removed = session._update(partitions, forgotten)
        session.epoch = next_epoch(session.epoch)
        session.last_used_ms = now_ms
        return ShareSessionContext(
            epoch,
            session,
            is_new=False,
            is_final=False,
            added=tuple(added),
            removed=tuple(removed),
        )

    def share_acknowledge(
        self, group_id: str, member_id: str, epoch: int, now_ms: int
    ) -> ShareSession:
        """Validate a ShareAcknowledge's session epoch and advance it (Kafka's
        acknowledgeSessionUpdate). Epoch -1 is accepted without changing the session;
        the caller removes the session once the acknowledgements are applied."""
        if epoch == INITIAL_EPOCH:
            raise KafkaError(
                ErrorCode.invalid_share_session_epoch,
                "ShareAcknowledge cannot open a share session (ShareSessionEpoch 0).",
            )
        session = self._require((group_id, member_id))
        session.last_used_ms = now_ms
        if epoch == FINAL_EPOCH:
            return session
        self._check_epoch(session, epoch)
        session.epoch = next_epoch(session.epoch)
        return session

    # -- removal -----------------------------------------------------------------

    def remove(self, group_id: str, member_id: str) -> ShareSession | None:
        """Remove a member's session (close, member left or expired); returns it if any."""
        key = (group_id, member_id)
        session = self._sessions.pop(key, None)
        if session is not None and session.connection_id is not None:
            keys = self._by_connection.get(session.connection_id)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_connection[session.connection_id]
        return session

    def remove_member(self, group_id: str, member_id: str) -> ShareSession | None:
        """All sessions of a member: one per (group, member), so the same as `remove`."""
        return self.remove(group_id, member_id)

    def remove_group(self, group_id: str) -> list[ShareSession]:
        """Remove every session of a group (group deleted)."""
        return [
            removed
            for s in self.sessions_of_group(group_id)
            if (removed := self.remove(s.group_id, s.member_id)) is not None
        ]

    def remove_connection(self, connection_id: str) -> list[ShareSession]:
        """Remove the sessions opened over a connection that has closed, as Kafka does
        on disconnect; the caller releases their members' acquired records."""
        keys = sorted(self._by_connection.get(connection_id, ()))
        return [s for k in keys if (s := self.remove(*k)) is not None]

    # -- rules -------------------------------------------------------------------

    def _require(self, key: ShareSessionKey) -> ShareSession:
        session = self._sessions.get(key)
        if session is None:
            raise KafkaError(
                ErrorCode.share_session_not_found,
                f"No share session for member {key[1]} of group {key[0]}; open one with "
                "ShareSessionEpoch 0.",
            )
        return session

    @staticmethod
    def _check_epoch(session: ShareSession, epoch: int) -> None:
        if epoch != session.epoch:
            raise KafkaError(
                ErrorCode.invalid_share_session_epoch,
                f"Expected ShareSessionEpoch {session.epoch} for member {session.member_id} "
                f"of group {session.group_id}, got {epoch}.",
            )
