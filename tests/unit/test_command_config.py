"""`--command-config`: Kafka client properties (librdkafka's and the Java client's names)
to the admin client's `ClientSecurity`, and what is refused, with the key named and no
password ever printed. No sockets: nothing here connects."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from broker.cli import build_parser
from broker.tools.common import UsageError, connection_settings, security_settings
from protocol.client import ClientSecurity, SecurityConfigError

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="alice" password="alice-secret";'
)
SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="bob" password="b\\"ob-secret";'
)


def settings(tmp_path: Path, text: str, *extra: str) -> tuple[argparse.Namespace, Path]:
    path = tmp_path / "client.properties"
    path.write_text(text)
    args = build_parser().parse_args(
        [
            "topics",
            "--bootstrap-server",
            "127.0.0.1:1",
            "--list",
            "--command-config",
            str(path),
            *extra,
        ]
    )
    return args, path


def test_plaintext_by_default() -> None:
    security = security_settings({})
    assert security == ClientSecurity()
    assert not security.uses_tls and not security.uses_sasl
    security.validate()


def test_librdkafka_names(tmp_path: Path) -> None:
    args, _ = settings(
        tmp_path,
        "security.protocol=sasl_ssl\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=alice\nsasl.password=alice-secret\nssl.ca.location=/etc/ca.pem\n"
        "ssl.endpoint.identification.algorithm=none\nclient.id=ops\n",
    )
    conn = connection_settings(args)
    assert conn.client_id == "ops"
    s = conn.security
    assert (s.protocol, s.mechanism, s.username, s.password) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "alice",
        "alice-secret",
    )
    assert s.ssl_ca_location == "/etc/ca.pem"
    assert s.ssl_endpoint_identification == "none"
    assert s.uses_tls and s.uses_sasl


@pytest.mark.parametrize(
    ("jaas", "mechanism", "user", "password"),
    [
        (PLAIN_JAAS, "PLAIN", "alice", "alice-secret"),
        (SCRAM_JAAS, "SCRAM-SHA-256", "bob", 'b"ob-secret'),
    ],
)
def test_java_jaas_config(jaas: str, mechanism: str, user: str, password: str) -> None:
    s = security_settings(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.jaas.config": jaas,
            "ssl.truststore.location": "/ca.pem",
            "ssl.truststore.type": "PEM",
        }
    )
    assert (s.mechanism, s.username, s.password) == (mechanism, user, password)
    assert s.ssl_ca_location == "/ca.pem"


def test_java_pem_keystore_holds_certificate_and_key() -> None:
    s = security_settings(
        {
            "security.protocol": "SSL",
            "ssl.keystore.location": "/client.pem",
            "ssl.keystore.type": "PEM",
            "ssl.key.password": "k",
            "ssl.endpoint.identification.algorithm": "",
        }
    )
    assert (s.ssl_certificate_location, s.ssl_key_location, s.ssl_key_password) == (
        "/client.pem",
        "/client.pem",
        "k",
    )
    assert s.ssl_endpoint_identification == "none"


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"security.protocol": "SASL_TLS"}, "security.protocol 'SASL_TLS' is not one of"),
        ({"security.protocol": "SASL_SSL"}, "needs sasl.mechanism (Kafka's default, GSSAPI"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"},
            "sasl.mechanism GSSAPI is not supported",
        ),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "a",
            },
            "needs sasl.username and sasl.password",
        ),
        ({"sasl.jaas.config": 'x required password="hunter2";'}, "login module x is not supported"),
        ({"sasl.jaas.config": 'Plain required password="hunter2'}, "cannot be parsed"),
        (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                'required password="hunter2";'
            },
            'needs username="..." and password="..."',
        ),
        ({"ssl.truststore.type": "JKS"}, "ssl.truststore.type=JKS: spool's tools read PEM"),
        ({"ssl.endpoint.identification.algorithm": "ldap"}, "expected https or none"),
    ],
)
def test_refused_with_the_key_named(props: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as exc:
        security_settings(props)
    assert message in str(exc.value)
    assert "hunter2" not in str(exc.value)


def test_unknown_keys_are_named_never_their_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, _ = settings(
        tmp_path,
        "sasl.password=hunter2\nsasl.username=u\nbasic.auth.user.info=u:hunter3\n"
        "ssl.keystore.password=hunter4\n",
    )
    conn = connection_settings(args)
    err = capsys.readouterr().err
    assert "basic.auth.user.info" in err
    assert "hunter" not in err
    assert "hunter" not in repr(conn)


def test_repr_hides_passwords() -> None:
    s = ClientSecurity("SASL_SSL", "PLAIN", "alice", "alice-secret", ssl_key_password="key-pw")
    assert "alice-secret" not in repr(s) and "key-pw" not in repr(s)


def test_ssl_ca_location_is_checked(tmp_path: Path) -> None:
    missing = ClientSecurity("SSL", ssl_ca_location=str(tmp_path / "nope.pem"))
    with pytest.raises(SecurityConfigError, match=r"ssl.ca.location .*nope.pem: no such file"):
        missing.validate()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(SecurityConfigError, match="not a PEM file of CA certificates"):
        ClientSecurity("SSL", ssl_ca_location=str(garbage)).validate()
    # Only TLS protocols read the files.
    ClientSecurity("PLAINTEXT", ssl_ca_location=str(garbage)).validate()


def test_client_key_without_certificate_is_refused() -> None:
    with pytest.raises(SecurityConfigError, match=r"ssl\.key\.location needs ssl\.certificate"):
        ClientSecurity("SSL", ssl_key_location="/k.pem").validate()
