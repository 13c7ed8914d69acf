"""SCRAM credentials in the cluster metadata (KIP-554): Kafka's ScramControlManager checks,
one metadata operation per request, durable across a reopen of the log, compacted by
(user, mechanism)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coordinator.metadata import ClusterState, MetadataStore
from coordinator.scram import (
    ScramDeletion,
    ScramUpsertion,
    credential_from_password,
    salted_password,
)
from persister.commit import GroupCommit
from protocol.errors import ErrorCode

SHA256, SHA512 = 1, 2
SALT = b"0123456789abcdef"


def upsert(user: str, mech: int = SHA256, iterations: int = 4096, pw: str = "pw") -> ScramUpsertion:
    name = {SHA256: "SCRAM-SHA-256", SHA512: "SCRAM-SHA-512"}.get(mech, "SCRAM-SHA-256")
    return ScramUpsertion(user, mech, iterations, SALT, salted_password(name, pw, SALT, iterations))


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


def apply(
    state: ClusterState, deletions: list[ScramDeletion], ups: list[ScramUpsertion]
) -> dict[str, tuple[ErrorCode, str | None]]:
    records, results = state.alter_scram_records(deletions, ups)
    for record in records:
        state.replay(record)
    return {user: (code, message) for user, code, message in results}


def test_upsertion_stores_the_keys_derived_from_the_salted_password() -> None:
    state = ClusterState()
    assert apply(state, [], [upsert("alice", pw="alice-secret")]) == {
        "alice": (ErrorCode.none, None)
    }
    stored = state.scram_credential("alice", "SCRAM-SHA-256")
    assert stored == credential_from_password("SCRAM-SHA-256", "alice-secret", SALT, 4096)
    assert state.scram_credential("alice", "SCRAM-SHA-512") is None
    record = json.dumps(state.scram_credentials[("alice", "SCRAM-SHA-256")])
    assert "alice-secret" not in record


def test_kafkas_per_user_errors() -> None:
    state = ClusterState()
    apply(state, [], [upsert("alice")])
    results = apply(
        state,
        [
            ScramDeletion("nobody", SHA256),
            ScramDeletion("alice", SHA512),  # alice has no SHA-512 credential
            ScramDeletion("bad-mech", 7),
            ScramDeletion("", SHA256),
        ],
        [
            upsert("few", iterations=4095),
            upsert("many", iterations=16385),
            upsert("unknown-mech", mech=0),
            upsert("edge", iterations=16384),
            ScramUpsertion("short-salt", SHA256, 4096, b"s" * 11, b"x" * 32),
        ],
    )
    assert results == {
        "nobody": (
            ErrorCode.resource_not_found,
            "Attempt to delete a user credential that does not exist",
        ),
        "alice": (
            ErrorCode.resource_not_found,
            "Attempt to delete a user credential that does not exist",
        ),
        "bad-mech": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
        "few": (ErrorCode.unacceptable_credential, "Too few iterations"),
        "many": (ErrorCode.unacceptable_credential, "Too many iterations"),
        "unknown-mech": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "edge": (ErrorCode.none, None),
        "short-salt": (ErrorCode.unacceptable_credential, "Salt must be at least 12 bytes"),
    }
    assert state.scram_credential("alice", "SCRAM-SHA-256") is not None


def test_a_user_altered_twice_in_one_request_is_a_duplicate_and_left_alone() -> None:
    state = ClusterState()
    apply(state, [], [upsert("alice"), upsert("bob")])
    duplicate = (
        ErrorCode.duplicate_resource,
        "A user credential cannot be altered twice in the same request",
    )
    results = apply(
        state,
        [ScramDeletion("alice", SHA256)],
        [upsert("alice", SHA512), upsert("bob", SHA256), upsert("bob", SHA512), upsert("carol")],
    )
    assert results == {"alice": duplicate, "bob": duplicate, "carol": (ErrorCode.none, None)}
    assert state.scram_credential("alice", "SCRAM-SHA-256") is not None
    assert state.scram_credential("alice", "SCRAM-SHA-512") is None
    assert state.scram_credential("bob", "SCRAM-SHA-512") is None


def test_results_come_deletions_then_upsertions_then_errors() -> None:
    state = ClusterState()
    apply(state, [], [upsert("a")])
    _, results = state.alter_scram_records(
        [ScramDeletion("x", SHA256), ScramDeletion("a", SHA256)], [upsert("b")]
    )
    assert [user for user, _, _ in results] == ["a", "b", "x"]


async def test_credentials_survive_a_reopen_and_compaction(
    tmp_path: Path, commit: GroupCommit
) -> None:
    store = MetadataStore(tmp_path / "meta", commit, segment_bytes=1024)
    for i in range(20):
        await store.alter_scram_credentials([], [upsert("alice", iterations=4096 + i)])
    await store.alter_scram_credentials([], [upsert("bob"), upsert("bob-512", SHA512)])
    await store.alter_scram_credentials([ScramDeletion("bob", SHA256)], [])
    await store.compact()
    store.close()
    reopened = MetadataStore(tmp_path / "meta", commit)
    alice = reopened.state.scram_credential("alice", "SCRAM-SHA-256")
    assert alice is not None and alice.iterations == 4096 + 19
    assert reopened.state.scram_credential("bob", "SCRAM-SHA-256") is None
    assert reopened.state.scram_credential("bob-512", "SCRAM-SHA-512") is not None
    reopened.close()


async def test_concurrent_requests_are_checked_in_turn(tmp_path: Path, commit: GroupCommit) -> None:
    """Two deletions of one credential at once: the second sees the first's record."""
    store = MetadataStore(tmp_path / "meta", commit)
    await store.alter_scram_credentials([], [upsert("alice")])
    first, second = await asyncio.gather(
        store.alter_scram_credentials([ScramDeletion("alice", SHA256)], []),
        store.alter_scram_credentials([ScramDeletion("alice", SHA256)], []),
    )
    assert [first[0][1], second[0][1]] == [ErrorCode.none, ErrorCode.resource_not_found]
    store.close()
