"""The `storage` key and `spool serve --storage`: which engine the broker runs on, where
its password comes from, and that the URL's password is never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import storage_engine
from broker.config import BROKER_KEYS, BrokerConfig, load_static
from persister.pg_storage import PgStorage
from persister.storage import FILE_STORAGE
from protocol.errors import KafkaError


def test_without_the_key_the_broker_runs_on_files() -> None:
    assert storage_engine(BrokerConfig(load_static(None, [], {}))) is FILE_STORAGE


def test_a_postgresql_url_from_the_environment_and_a_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    static = load_static(
        None,
        [f"storage.password.file={secret}"],
        {"SPOOL_STORAGE": "postgresql://spool@db:5432/spool"},
    )
    engine = storage_engine(BrokerConfig(static))
    assert isinstance(engine, PgStorage)
    assert engine.url == "postgresql://spool@db:5432/spool"
    assert engine._password == "s3cret"
    assert "s3cret" not in repr(engine)


def test_the_url_is_sensitive_and_must_be_postgresql() -> None:
    assert BROKER_KEYS["storage"].sensitive
    with pytest.raises(KafkaError, match="postgresql"):
        BrokerConfig(load_static(None, ["storage=mysql://x"], {}))


def test_an_unreadable_password_file_is_a_config_error(tmp_path: Path) -> None:
    static = load_static(
        None, ["storage=postgresql://a@b/c", f"storage.password.file={tmp_path / 'none'}"], {}
    )
    with pytest.raises(KafkaError, match=r"storage\.password\.file"):
        storage_engine(BrokerConfig(static))
