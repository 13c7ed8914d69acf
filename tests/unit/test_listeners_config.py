"""Listeners and TLS settings from Kafka's keys: parsing and the checks Kafka makes.

No sockets: these read configs only (an SSL listener's PEM files are read only by
TlsSettings.context(), which the integration tests cover).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import cli
from broker.config import BROKER_KEYS, BrokerConfig, load_static
from broker.handlers.configs import _Detail, _entry
from broker.listeners import ListenerConfig, TlsSettings, listeners_from_config
from broker.security import ANONYMOUS, KafkaPrincipal, principal_of_peer_cert, subject_dn
from protocol.errors import ErrorCode, KafkaError

PEM_SSL = {"ssl.keystore.type": "PEM", "ssl.keystore.location": "/certs/broker.pem"}


def listeners(settings: dict[str, str]) -> list[ListenerConfig]:
    return listeners_from_config(BrokerConfig(settings))


def refused(settings: dict[str, str], *words: str) -> str:
    with pytest.raises(KafkaError) as info:
        listeners(settings)
    assert info.value.code == ErrorCode.invalid_config
    for word in words:
        assert word in info.value.message, info.value.message
    return info.value.message


def test_default_is_one_plaintext_listener_on_loopback() -> None:
    [only] = listeners({})
    assert (only.name, only.security_protocol, only.host, only.port) == (
        "PLAINTEXT",
        "PLAINTEXT",
        "127.0.0.1",
        9092,
    )
    assert (only.advertised_host, only.advertised_port, only.tls) == ("127.0.0.1", 9092, None)


def test_several_listeners_with_their_own_names_and_advertised_addresses() -> None:
    found = listeners(
        {
            "listeners": "internal://0.0.0.0:9092, EXTERNAL://[::1]:9093,LOCAL://:0",
            "advertised.listeners": "INTERNAL://broker-0.svc:19092,EXTERNAL://kafka.example:443",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SSL,LOCAL:PLAINTEXT",
            **PEM_SSL,
        }
    )
    assert [(lc.name, lc.security_protocol, lc.host, lc.port) for lc in found] == [
        ("INTERNAL", "PLAINTEXT", "0.0.0.0", 9092),
        ("EXTERNAL", "SSL", "::1", 9093),
        ("LOCAL", "PLAINTEXT", "", 0),
    ]
    assert [(lc.advertised_host, lc.advertised_port) for lc in found] == [
        ("broker-0.svc", 19092),
        ("kafka.example", 443),
        ("127.0.0.1", 0),  # a wildcard host, the bound port
    ]
    assert found[1].tls is not None and found[1].tls.keystore_location == "/certs/broker.pem"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (
            {"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9093"},
            ("different name", "PLAINTEXT"),
        ),
        (
            {"listeners": "PLAINTEXT://:9092,plaintext://:9093"},
            ("different name", "PLAINTEXT"),
        ),
        (
            {"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.2:9092", **PEM_SSL},
            ("different port", "PLAINTEXT, SSL", "9092"),
        ),
        ({"listeners": "CLIENT://:9092"}, ("No security protocol", "CLIENT")),
        (
            {"listeners": "PLAINTEXT://:9092", "advertised.listeners": "SSL://a:9093"},
            ("advertised.listeners", "SSL", "subset"),
        ),
        (
            {"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"},
            ("non-routable", "0.0.0.0"),
        ),
        ({"listeners": "localhost:9092"}, ("NAME://host:port",)),
        ({"listeners": "PLAINTEXT://:99999"}, ("0-65535",)),
        ({"listeners": ""}, ("listeners is empty",)),
        (
            {"listener.security.protocol.map": "PLAINTEXT:TLS"},
            ("security protocol must be one of",),
        ),
    ],
)
def test_kafka_refuses_these_listener_settings(
    settings: dict[str, str], words: tuple[str, ...]
) -> None:
    refused(settings, *words)


def test_port_zero_and_an_ipv4_ipv6_pair_may_share_a_port() -> None:
    listeners(
        {
            "listeners": "A://127.0.0.1:9092,B://[::1]:9092,C://:0,D://:0",
            "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT,C:PLAINTEXT,D:PLAINTEXT",
        }
    )


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_listeners_without_mechanisms_are_refused_not_served_as_plain(protocol: str) -> None:
    # Kafka's default sasl.enabled.mechanisms is GSSAPI, which spool does not have.
    settings = {"listeners": f"{protocol}://:9094", **PEM_SSL}
    message = refused(settings, "GSSAPI", "not supported", "sasl.enabled.mechanisms=PLAIN")
    assert f"Listener {protocol}" in message
    refused(
        {
            "listeners": "AUTH://:9094",
            "listener.security.protocol.map": f"AUTH:{protocol}",
            **PEM_SSL,
        },
        "Listener AUTH",
        "GSSAPI",
    )


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"ssl.keystore.location": "/k.pem"}, ("ssl.keystore.type is JKS", "PEM")),
        ({"ssl.keystore.type": "PEM"}, ("no key store", "ssl.keystore.location")),
        (
            {**PEM_SSL, "ssl.keystore.key": "-----BEGIN PRIVATE KEY-----"},
            ("not both",),
        ),
        ({**PEM_SSL, "ssl.keystore.password": "secret"}, ("ssl.keystore.password", "PEM")),
        (
            {**PEM_SSL, "ssl.truststore.location": "/ca.pem"},
            ("ssl.truststore.type is JKS",),
        ),
        (
            {**PEM_SSL, "ssl.principal.mapping.rules": "RULE:^CN=(.*?),.*$/$1/"},
            ("ssl.principal.mapping.rules", "DEFAULT"),
        ),
        ({**PEM_SSL, "ssl.enabled.protocols": "TLSv1.1"}, ("ssl.enabled.protocols",)),
    ],
)
def test_ssl_listener_settings_are_checked_at_startup(
    settings: dict[str, str], words: tuple[str, ...]
) -> None:
    message = refused({"listeners": "SSL://:9093", **settings}, *words)
    assert "Listener SSL" in message


def test_ssl_client_auth_takes_kafkas_values_only() -> None:
    with pytest.raises(KafkaError, match="none, requested, required"):
        BrokerConfig({"ssl.client.auth": "optional"})
    with pytest.raises(KafkaError, match="none, requested, required"):
        BrokerConfig({"listener.name.ssl.ssl.client.auth": "optional"})


def test_listener_name_keys_override_the_broker_wide_ones() -> None:
    config = BrokerConfig(
        {
            "listeners": "INTERNAL://:9093,EXTERNAL://:9094",
            "listener.security.protocol.map": "INTERNAL:SSL,EXTERNAL:SSL",
            **PEM_SSL,
            "ssl.client.auth": "requested",
            "listener.name.external.ssl.client.auth": "required",
            "listener.name.external.ssl.keystore.location": "/certs/external.pem",
        }
    )
    internal, external = listeners_from_config(config)
    assert isinstance(internal.tls, TlsSettings) and isinstance(external.tls, TlsSettings)
    assert (internal.tls.client_auth, internal.tls.keystore_location) == (
        "requested",
        "/certs/broker.pem",
    )
    assert (external.tls.client_auth, external.tls.keystore_location) == (
        "required",
        "/certs/external.pem",
    )


def test_unknown_listener_name_keys_are_unknown_configs() -> None:
    with pytest.raises(KafkaError, match="Unknown broker config"):
        BrokerConfig({"listener.name.external.ssl.no.such.key": "x"})
    with pytest.raises(KafkaError, match="Unknown broker config"):
        BrokerConfig({"listener.name.external.num.partitions": "3"})


def test_listener_keys_from_file_environment_and_set(tmp_path: Path) -> None:
    f = tmp_path / "spool.toml"
    f.write_text(
        'listeners = "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093"\n'
        '"ssl.keystore.type" = "PEM"\n'
        "[listener.name.ssl]\n"
        '"ssl.keystore.location" = "/from/file.pem"\n'
        '"ssl.client.auth" = "requested"\n'
    )
    env = {
        "SPOOL_ADVERTISED_LISTENERS": "SSL://kafka.example:443",
        "SPOOL_LISTENER_NAME_SSL_SSL_CLIENT_AUTH": "required",
        "SPOOL_LISTENER_NAME_SSL_SSL_TRUSTSTORE_LOCATION": "/from/env.pem",
        "SPOOL_LISTENER_NAME_SSL_SSL_TRUSTSTORE_TYPE": "PEM",
    }
    merged = load_static(f, ["listener.name.ssl.ssl.keystore.location=/from/set.pem"], env)
    plain, tls = listeners_from_config(BrokerConfig(merged))
    assert (plain.advertised_host, plain.advertised_port) == ("127.0.0.1", 9092)
    assert (tls.advertised_host, tls.advertised_port) == ("kafka.example", 443)
    assert tls.tls is not None
    assert tls.tls.keystore_location == "/from/set.pem"  # --set beats the file
    assert tls.tls.client_auth == "required"  # the environment beats the file
    assert tls.tls.truststore_location == "/from/env.pem"


def test_listen_and_advertise_are_shorthands_for_one_plaintext_listener() -> None:
    static: dict[str, object] = {}
    cli.apply_listen_shorthands(static, ("0.0.0.0", 19092), ("kafka.example", 9092))
    [only] = listeners_from_config(BrokerConfig(static))
    assert (only.name, only.host, only.port) == ("PLAINTEXT", "0.0.0.0", 19092)
    assert (only.advertised_host, only.advertised_port) == ("kafka.example", 9092)
    static = {}
    cli.apply_listen_shorthands(static, ("::1", 9092), None)
    assert static == {"listeners": "PLAINTEXT://[::1]:9092"}


def test_listen_beside_listeners_is_refused() -> None:
    with pytest.raises(KafkaError, match="--listen is short for listeners"):
        cli.apply_listen_shorthands({"listeners": "SSL://:9093"}, ("127.0.0.1", 9092), None)


def test_serve_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve(), not main(): main would point structlog at this test's captured stderr.
    args = cli.build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path / "d"), "--set", "listeners=SASL_SSL://:9094"]
    )
    code = cli.serve(args)
    assert code == 2
    assert "Listener SASL_SSL" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_passwords_are_sensitive_in_describe_configs() -> None:
    for name in ("ssl.key.password", "ssl.keystore.key", "ssl.truststore.certificates"):
        key = BROKER_KEYS[name]
        described = _entry(key, "s3cret", 4, [], _Detail(True, False))
        assert described.is_sensitive and described.value is None
    assert not BROKER_KEYS["ssl.keystore.location"].sensitive


def test_a_wildcard_listener_advertising_loopback_is_flagged_for_a_warning() -> None:
    # Kafka refuses to advertise 0.0.0.0; spool advertises 127.0.0.1 and warns at start.
    flagged = {
        lc.name: lc.advertises_loopback_for_every_interface
        for lc in listeners(
            {
                "listeners": "A://0.0.0.0:9092,B://:9093,C://127.0.0.1:9094,D://0.0.0.0:9095",
                "listener.security.protocol.map": "A:PLAINTEXT,B:PLAINTEXT,C:PLAINTEXT,D:PLAINTEXT",
                "advertised.listeners": "D://broker.example.com:9095",
            }
        )
    }
    assert flagged == {"A": True, "B": True, "C": False, "D": False}
    assert ListenerConfig.plaintext("0.0.0.0", 9092).advertises_loopback_for_every_interface


def test_a_listeners_repr_holds_no_private_key_nor_its_password() -> None:
    (listener,) = listeners(
        {
            "listeners": "SSL://127.0.0.1:9093",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----chain",
            "ssl.keystore.key": "-----BEGIN ENCRYPTED PRIVATE KEY-----k3y",
            "ssl.key.password": "s3cret",
        }
    )
    assert listener.tls is not None and listener.tls.key_password == "s3cret"
    text = repr(listener)
    assert "k3y" not in text and "s3cret" not in text
    assert "chain" in text  # the certificate is no secret


def test_principal_is_the_subject_dn_in_rfc2253_order() -> None:
    subject = (
        (("countryName", "US"),),
        (("organizationName", "Acme, Inc."),),
        (("organizationalUnitName", "eng"), ("userId", "42")),
        (("commonName", "alice"),),
    )
    assert subject_dn(subject) == r"CN=alice,OU=eng+UID=42,O=Acme\, Inc.,C=US"
    peer = {"subject": subject}
    assert principal_of_peer_cert(peer) == KafkaPrincipal("User", subject_dn(subject))
    assert str(principal_of_peer_cert(peer)).startswith("User:CN=alice,")
    assert principal_of_peer_cert(None) == ANONYMOUS
    assert principal_of_peer_cert({}) == ANONYMOUS
    assert str(ANONYMOUS) == "User:ANONYMOUS"


def test_dn_values_are_escaped() -> None:
    assert subject_dn(((("commonName", "#a+b<c> "),),)) == r"CN=\#a\+b\<c\>\ "
