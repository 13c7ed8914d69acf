"""PLAIN users from a JAAS file named by `java.security.auth.login.config`, as a Kafka
broker started with -Djava.security.auth.login.config=FILE reads them
(JaasContext.loadServerContext): the listener's `<listener>.KafkaServer` section, else
`KafkaServer`; a listener-prefixed sasl.jaas.config wins over the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import sasl
from broker.config import BrokerConfig, load_static
from broker.listeners import listeners_from_config
from protocol.errors import KafkaError

JAAS_FILE = """
// the brokers' users
KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin"
        password="admin-secret"
        user_admin="admin-secret"
        user_alice="alice-secret";
    org.apache.kafka.common.security.scram.ScramLoginModule required;
};

/* only for the EXTERNAL listener */
external.KafkaServer {
    org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="bob-secret";
};

KafkaClient { org.apache.kafka.common.security.plain.PlainLoginModule required
    username="admin" password="admin-secret"; };
"""


def settings(path: Path, **more: str) -> dict[str, str]:
    return {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:9093,EXTERNAL://127.0.0.1:9094",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "java.security.auth.login.config": str(path),
        **more,
    }


def test_sections_per_listener_with_kafkaserver_as_the_fallback(tmp_path: Path) -> None:
    path = tmp_path / "kafka_server_jaas.conf"
    path.write_text(JAAS_FILE)
    internal, external = listeners_from_config(BrokerConfig(settings(path)))
    assert internal.sasl is not None and external.sasl is not None
    assert dict(internal.sasl.plain_users) == {"admin": "admin-secret", "alice": "alice-secret"}
    assert dict(external.sasl.plain_users) == {"bob": "bob-secret"}
    assert "secret" not in repr(internal)


def test_the_listener_key_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(JAAS_FILE)
    key = "listener.name.external.plain.sasl.jaas.config"
    entry = f'{sasl.PLAIN_LOGIN_MODULE} required user_carol="carol-secret";'
    _, external = listeners_from_config(BrokerConfig(settings(path, **{key: entry})))
    assert external.sasl is not None and dict(external.sasl.plain_users) == {
        "carol": "carol-secret"
    }


def test_the_file_is_named_by_a_spool_variable_too(tmp_path: Path) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(JAAS_FILE)
    static = load_static(None, [], {"SPOOL_JAVA_SECURITY_AUTH_LOGIN_CONFIG": str(path)})
    assert static["java.security.auth.login.config"] == str(path)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Other { x required; };", "Could not find a 'KafkaServer' or"),
        ('KafkaServer { Mod required user_a="a-secret" };', "must end with ';'"),
        ('KafkaServer { Mod required user_a="a-secret"; }', "must end with '};'"),
        ('KafkaServer { Mod required user_a="a-secret"; ', "must end with '}'"),
        ("KafkaServer { org.apache.kafka.common.security.scram.ScramLoginModule required; };",
         "declares no PLAIN users"),
    ],
)  # fmt: skip
def test_bad_files_are_refused_at_startup_without_their_passwords(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(text)
    with pytest.raises(KafkaError) as exc:
        listeners_from_config(BrokerConfig(settings(path)))
    assert words in (exc.value.message or "")
    assert "a-secret" not in (exc.value.message or "")


def test_a_missing_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(KafkaError) as exc:
        listeners_from_config(BrokerConfig(settings(tmp_path / "absent.conf")))
    assert "cannot read java.security.auth.login.config" in (exc.value.message or "")
