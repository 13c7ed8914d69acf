"""Handler failures `python -m tests.fuzz` found that a single wire request cannot
reproduce (they need two connections racing), pinned with fakes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from broker.handlers.topics import create_topic


class _Logs:
    def __init__(self) -> None:
        self.opened: list[str] = []

    def ensure_file_headroom(self, topic: str, partitions: int) -> None:
        pass

    def open_topic(self, name: str, *_: Any) -> None:
        self.opened.append(name)


class _DeletedWhileWriting:
    """The creation record is written, and another request's deletion of the topic is
    applied before the creating request resumes."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(topics={})
        self.records: list[dict[str, Any]] = []

    async def commit(self, records: list[dict[str, Any]]) -> None:
        self.records += records  # created, then deleted: nothing left in the state


async def test_topic_deleted_while_its_creation_is_written_is_created_but_not_opened() -> None:
    logs = _Logs()
    changed: list[str] = []
    broker: Any = SimpleNamespace(
        logs=logs, metadata=_DeletedWhileWriting(), topic_changed_hooks=[changed.append]
    )
    topic = await create_topic(broker, "racing", 3, {})
    assert (topic.name, topic.partitions) == ("racing", 3)
    assert [r["type"] for r in broker.metadata.records] == ["topic"]
    assert logs.opened == [] and changed == []
