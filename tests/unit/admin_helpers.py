"""What the admin-handler unit tests share (test_acl_handlers, test_users_handlers): a
request context for a SASL principal, the broker the handlers see (a real
`MetadataStore` and an `Authorizer`) and the `commit` fixture their stores write through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from broker.authorizer import Authorizer
from broker.security import KafkaPrincipal, SecurityContext
from coordinator.metadata import MetadataStore
from persister.commit import GroupCommit


@dataclass(frozen=True)
class Ctx:
    security: SecurityContext
    client_host: str = "127.0.0.1"


def ctx(name: str = "admin") -> Any:
    return Ctx(SecurityContext("SASL_PLAINTEXT", "SASL_PLAINTEXT", KafkaPrincipal("User", name)))


@dataclass
class Broker:
    metadata: MetadataStore
    authorizer: Authorizer


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()
