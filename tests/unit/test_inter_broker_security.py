"""The inter-broker client: which listener brokers reach each other on, and the TLS and
SASL settings this broker connects with, built from Kafka's broker keys
(`inter.broker.listener.name` / `security.inter.broker.protocol`,
`sasl.mechanism.inter.broker.protocol`, the listener's JAAS entry and ssl.* keys), and
each refusal at start. No sockets: BrokerConnections is driven with a fake connect.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.config import BrokerConfig
from broker.listeners import InterBrokerClient, inter_broker_client, listeners_from_config
from broker.share import remote_persister
from broker.share.remote_persister import (
    BrokerConnections,
    Target,
    TransportError,
    not_authorized_hint,
)
from protocol.client import AuthenticationError, ClientSecurity, SecurityConfigError
from protocol.errors import ErrorCode, KafkaError

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
SECRET = "broker-secret-7"
BROKER_JAAS = (
    f'{PLAIN_MODULE} required username="broker" password="{SECRET}" '
    f'user_broker="{SECRET}" user_alice="alice-secret";'
)
TLS = {
    "ssl.keystore.type": "PEM",
    "ssl.keystore.location": "/certs/broker.pem",
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": "/certs/ca.pem",
}
SASL_SSL_ONLY = {
    "listeners": "SASL_SSL://127.0.0.1:0",
    **TLS,
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_ssl.plain.sasl.jaas.config": BROKER_JAAS,
}


def client(settings: dict[str, str], clustered: bool = True) -> InterBrokerClient:
    config = BrokerConfig(settings)
    return inter_broker_client(config, listeners_from_config(config), clustered)


def refused(settings: dict[str, str], *words: str) -> str:
    with pytest.raises(KafkaError) as raised:
        client(settings)
    assert raised.value.code == ErrorCode.invalid_config
    message = str(raised.value)
    for word in words:
        assert word in message, message
    assert SECRET not in message and "alice-secret" not in message
    return message


# --- which listener ----------------------------------------------------------------------


def test_plaintext_by_default_needs_no_client_security() -> None:
    found = client({"listeners": "PLAINTEXT://127.0.0.1:0"})
    assert found == InterBrokerClient("PLAINTEXT")
    assert found.security is None and found.principal == "User:ANONYMOUS"


def test_security_inter_broker_protocol_names_the_listener() -> None:
    found = client(
        {
            **SASL_SSL_ONLY,
            "security.inter.broker.protocol": "SASL_SSL",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
        }
    )
    assert (found.listener, found.protocol) == ("SASL_SSL", "SASL_SSL")


def test_both_keys_naming_the_listener_are_refused_as_kafka_does() -> None:
    refused(
        {
            **SASL_SSL_ONLY,
            "inter.broker.listener.name": "SASL_SSL",
            "security.inter.broker.protocol": "SASL_SSL",
        },
        "Only one of inter.broker.listener.name and security.inter.broker.protocol",
    )


def test_a_missing_inter_broker_listener_says_which_key_named_it() -> None:
    refused(
        {**SASL_SSL_ONLY, "sasl.mechanism.inter.broker.protocol": "PLAIN"},
        "security.inter.broker.protocol=PLAINTEXT, the default",
        "not one of the listeners (SASL_SSL)",
        "set inter.broker.listener.name",
    )
    refused(
        {**SASL_SSL_ONLY, "inter.broker.listener.name": "internal"},
        "inter.broker.listener.name INTERNAL is not one of the listeners",
    )


def test_a_lone_broker_checks_only_the_keys_naming_the_listener() -> None:
    # The file engine: no other broker to reach, so no SASL mechanism is needed.
    assert client(SASL_SSL_ONLY, clustered=False) == InterBrokerClient("PLAINTEXT")
    with pytest.raises(KafkaError, match="Only one of"):
        client(
            {
                **SASL_SSL_ONLY,
                "inter.broker.listener.name": "SASL_SSL",
                "security.inter.broker.protocol": "SSL",
            },
            clustered=False,
        )


# --- SASL ----------------------------------------------------------------------------------

SASL_INTER = {**SASL_SSL_ONLY, "inter.broker.listener.name": "sasl_ssl"}


def test_plain_credentials_come_from_the_listeners_jaas_entry() -> None:
    found = client({**SASL_INTER, "sasl.mechanism.inter.broker.protocol": "PLAIN"})
    assert found.principal == "User:broker"
    assert found.security == ClientSecurity(
        protocol="SASL_SSL",
        mechanism="PLAIN",
        username="broker",
        password=SECRET,
        ssl_ca_location="/certs/ca.pem",
        ssl_endpoint_identification="https",
    )
    # No certificate: the listener does not ask clients for one (ssl.client.auth none).
    assert found.security.ssl_certificate_location is None
    assert SECRET not in repr(found)


def test_kafkas_default_mechanism_gssapi_is_refused_with_what_to_set() -> None:
    refused(
        SASL_INTER,
        "sasl.mechanism.inter.broker.protocol is 'GSSAPI' (the default)",
        "not supported by spool",
        "one of the listener's sasl.enabled.mechanisms (PLAIN)",
    )
    refused(
        {**SASL_INTER, "sasl.mechanism.inter.broker.protocol": "MD5"},
        "'MD5', which is unknown",
    )


def test_a_mechanism_the_listener_does_not_enable_is_refused() -> None:
    refused(
        {**SASL_INTER, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256"},
        "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms",
        "SCRAM-SHA-256 is not enabled on the inter-broker listener SASL_SSL (PLAIN)",
    )


def test_a_jaas_entry_without_the_brokers_own_credentials_is_refused() -> None:
    users_only = f'{PLAIN_MODULE} required user_broker="{SECRET}";'
    message = refused(
        {
            **SASL_INTER,
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": users_only,
        },
        "has no username and password options",
        "listener.name.sasl_ssl.plain.sasl.jaas.config='" + PLAIN_MODULE,
        'username="<broker user>" password="<password>" user_<broker user>="<password>";',
    )
    assert "user_broker" not in message


def test_a_plain_username_the_listener_would_refuse_is_refused() -> None:
    for jaas in (
        f'{PLAIN_MODULE} required username="broker" password="{SECRET}" user_alice="x";',
        f'{PLAIN_MODULE} required username="broker" password="{SECRET}" user_broker="other";',
    ):
        refused(
            {
                **SASL_INTER,
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
            },
            "logs in to the other brokers as 'broker'",
            'declare user_broker="<the same password>"',
        )


def test_scram_credentials_come_from_the_scram_login_modules_options() -> None:
    settings = {
        **SASL_INTER,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            f'{SCRAM_MODULE} required username="broker" password="{SECRET}";'
        ),
    }
    found = client(settings)
    assert found.security is not None
    assert (found.security.mechanism, found.security.username) == ("SCRAM-SHA-512", "broker")
    assert found.security.password == SECRET
    # The entry is optional for serving SCRAM, but the inter-broker client needs it.
    del settings["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    refused(
        {**settings, "sasl.jaas.config": f'{SCRAM_MODULE} required username="b" password="p";'},
        "no JAAS entry gives this broker's own credentials",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config='" + SCRAM_MODULE,
        "a bare sasl.jaas.config is not read by brokers",
    )


def test_a_jaas_entry_of_another_login_module_is_refused() -> None:
    refused(
        {
            **SASL_INTER,
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": BROKER_JAAS,
        },
        f"names login module {PLAIN_MODULE}; SCRAM-SHA-256 takes {SCRAM_MODULE}",
    )


def test_credentials_from_the_jaas_files_listener_section(tmp_path: Path) -> None:
    jaas_file = tmp_path / "jaas.conf"
    jaas_file.write_text(
        "KafkaServer {\n"
        f'  {PLAIN_MODULE} required username="other" password="x" user_other="x";\n'
        "};\n"
        "sasl_plaintext.KafkaServer {\n"
        f'  {PLAIN_MODULE} required username="broker" password="{SECRET}" '
        f'user_broker="{SECRET}";\n'
        "};\n"
    )
    found = client(
        {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN",
            "java.security.auth.login.config": str(jaas_file),
            "security.inter.broker.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
        }
    )
    assert found.security == ClientSecurity(
        protocol="SASL_PLAINTEXT", mechanism="PLAIN", username="broker", password=SECRET
    )


# --- TLS -----------------------------------------------------------------------------------

SSL_INTER = {"listeners": "SSL://127.0.0.1:0", **TLS, "security.inter.broker.protocol": "SSL"}


def test_ssl_trusts_the_truststore_and_checks_host_names_by_default() -> None:
    found = client(SSL_INTER)
    assert found.security == ClientSecurity(protocol="SSL", ssl_ca_location="/certs/ca.pem")
    assert found.principal == "User:ANONYMOUS"


def test_the_keystore_is_presented_when_the_listener_asks_for_a_certificate() -> None:
    for auth in ("required", "requested"):
        found = client({**SSL_INTER, "ssl.client.auth": auth, "ssl.key.password": SECRET})
        assert found.security is not None
        assert found.security.ssl_certificate_location == "/certs/broker.pem"
        assert found.security.ssl_key_location is None  # the key is in the same PEM file
        assert found.security.ssl_key_password == SECRET
        assert found.principal.startswith("User:<the subject DN")
        assert SECRET not in repr(found)


def test_an_inline_keystore_and_truststore_become_pem_text() -> None:
    settings = {
        "listeners": "SSL://127.0.0.1:0",
        "security.inter.broker.protocol": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "CHAIN",
        "ssl.keystore.key": "KEY",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": "CAS",
        "listener.name.ssl.ssl.client.auth": "required",
    }
    security = client(settings).security
    assert security is not None
    assert (security.ssl_ca_pem, security.ssl_certificate_pem, security.ssl_key_pem) == (
        "CAS",
        "CHAIN",
        "KEY",
    )
    assert "KEY" not in repr(security) and "CAS" not in repr(security)


def test_endpoint_identification_follows_the_listeners_key() -> None:
    for value, expected in (("", "none"), ("HTTPS", "https"), ("none", "none")):
        security = client(
            {**SSL_INTER, "listener.name.ssl.ssl.endpoint.identification.algorithm": value}
        ).security
        assert security is not None and security.ssl_endpoint_identification == expected
    refused(
        {**SSL_INTER, "ssl.endpoint.identification.algorithm": "ldaps"},
        "ssl.endpoint.identification.algorithm 'ldaps' is not supported",
        "https (the default",
    )


def _pem_pair() -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem


def test_pem_text_loads_into_the_client_context() -> None:
    chain, key = _pem_pair()
    ClientSecurity(
        protocol="SSL", ssl_ca_pem=chain, ssl_certificate_pem=chain, ssl_key_pem=key
    ).validate()
    with pytest.raises(SecurityConfigError, match=r"ssl\.ca\.pem: not PEM text"):
        ClientSecurity(protocol="SSL", ssl_ca_pem="garbage").validate()
    with pytest.raises(SecurityConfigError, match="go together"):
        ClientSecurity(protocol="SSL", ssl_certificate_pem=chain).validate()


def test_check_says_when_a_store_does_not_load(tmp_path: Path) -> None:
    found = client({**SSL_INTER, "ssl.truststore.location": str(tmp_path / "missing.pem")})
    with pytest.raises(KafkaError) as raised:
        found.check()
    assert raised.value.code == ErrorCode.invalid_config
    assert "Inter-broker listener SSL" in str(raised.value)
    assert "missing.pem: no such file" in str(raised.value)
    client({"listeners": "PLAINTEXT://127.0.0.1:0"}).check()  # nothing to load


# --- the connections and the hints -----------------------------------------------------


async def test_broker_connections_connect_with_the_security(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    security = client({**SASL_INTER, "sasl.mechanism.inter.broker.protocol": "PLAIN"}).security
    seen: list[Any] = []
    logged: list[tuple[str, dict[str, Any]]] = []

    async def connect(host: str, port: int, client_id: str, security: Any = None) -> Any:
        seen.append((host, port, client_id, security))
        raise AuthenticationError("SASL_AUTHENTICATION_FAILED", "Invalid username or password")

    monkeypatch.setattr(remote_persister.KafkaClient, "connect", connect)
    monkeypatch.setattr(
        remote_persister.log, "error", lambda event, **kw: logged.append((event, kw))
    )
    connections = BrokerConnections("spool-broker-1", security=security)
    with pytest.raises(TransportError) as raised:
        await connections.send(Target(2, "broker-2", 9094), 18, 3, {})
    assert raised.value.code == ErrorCode.network_exception
    assert "SASL_AUTHENTICATION_FAILED" in raised.value.message
    assert seen == [("broker-2", 9094, "spool-broker-1", security)]
    [(event, fields)] = logged
    assert event == "inter_broker_connection_refused"
    assert "sasl.mechanism.inter.broker.protocol" in fields["hint"]
    assert SECRET not in repr(fields)


async def test_a_store_unreadable_at_connect_time_is_a_failed_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trust or key store that cannot be read when a connection is opened (a certificate
    rotation half done) fails that connection as a TransportError, which every sender
    retries, instead of escaping as a ValueError."""

    async def connect(host: str, port: int, client_id: str, security: Any = None) -> Any:
        raise SecurityConfigError("ssl.truststore.location /etc/ca.pem: no such file")

    monkeypatch.setattr(remote_persister.KafkaClient, "connect", connect)
    monkeypatch.setattr(remote_persister.log, "error", lambda event, **kw: None)
    connections = BrokerConnections("spool-broker-1", security=ClientSecurity(protocol="SSL"))
    with pytest.raises(TransportError) as raised:
        await connections.send(Target(2, "broker-2", 9094), 18, 3, {})
    assert raised.value.code == ErrorCode.network_exception
    assert "no such file" in raised.value.message


def test_the_authorization_hint_names_the_principal_and_the_fix() -> None:
    hint = not_authorized_hint("User:broker")
    assert "User:broker" in hint and "super.users" in hint
    assert "--allow-principal User:broker --operation ClusterAction --cluster" in hint


def test_spool_serve_refuses_a_sasl_inter_broker_listener_without_a_mechanism(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker import cli

    settings = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": BROKER_JAAS,
        "security.inter.broker.protocol": "SASL_PLAINTEXT",
        "storage": "postgresql://spool@db.invalid/spool",
    }
    argv = ["serve", "--data-dir", str(tmp_path / "d")]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    assert cli.serve(cli.build_parser().parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert "sasl.mechanism.inter.broker.protocol is 'GSSAPI' (the default)" in err
    assert SECRET not in err
    assert not (tmp_path / "d").exists()  # refused before anything started
