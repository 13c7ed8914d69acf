"""SASL PLAIN: the JAAS entry, the listener's keys and the exchange, sans-IO.

Kafka's behaviour these follow: JaasConfig (one login module, `key="value"` options),
PlainSaslServer (RFC 4616 messages and its error messages), PlainServerCallbackHandler
(`user_<name>` options) and SaslServerAuthenticator (what may be sent before
authentication). The socket side is tests/integration/test_sasl_plain.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import sasl
from broker.config import BROKER_KEYS, BrokerConfig, load_static
from broker.handlers.configs import _Detail, _entry
from broker.listeners import listeners_from_config
from broker.security import KafkaPrincipal
from protocol.errors import ErrorCode, KafkaError

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
KEY = "listener.name.sasl_plaintext.plain.sasl.jaas.config"
SASL_PLAIN = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:9093",
    "sasl.enabled.mechanisms": "PLAIN",
    KEY: JAAS,
}
USERS = {"admin": "admin-secret", "alice": "alice-secret"}


# -- JAAS ------------------------------------------------------------------------------


def test_jaas_entry_is_parsed_as_kafka_writes_it() -> None:
    entry = sasl.parse_jaas(JAAS)
    assert entry.login_module == sasl.PLAIN_LOGIN_MODULE
    assert entry.flag == "required"
    assert entry.options["username"] == "admin"
    assert sasl.plain_users(entry) == USERS
    assert "secret" not in repr(entry)


def test_jaas_values_may_be_bare_words_or_quoted_with_escapes() -> None:
    entry = sasl.parse_jaas(
        'Mod  Optional\n  user_bob=plainword user_eve="a \\"quoted\\" p;w=x" ;  '
    )
    assert entry.flag == "optional"
    assert sasl.plain_users(entry) == {"bob": "plainword", "eve": 'a "quoted" p;w=x'}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "0 login modules"),
        ('Mod required user_a="x"', "must end with ';'"),
        ('Mod mandatory user_a="x";', "invalid control flag after Mod"),
        ('Mod required user_a "x";', "key=value"),
        ('Mod required user_a="x', "unterminated quote"),
        ("A required; B required;", "2 login modules"),
        ("required;", "at the start of an entry"),
    ],
)
def test_malformed_jaas_is_refused_without_quoting_it(text: str, words: str) -> None:
    with pytest.raises(sasl.JaasError) as info:
        sasl.parse_jaas(text)
    assert words in str(info.value)
    assert '"x"' not in str(info.value)


def test_a_word_in_the_control_flag_place_is_not_quoted() -> None:
    # A password typed where the flag goes must not end up in the startup error.
    with pytest.raises(sasl.JaasError) as info:
        sasl.parse_jaas("Mod s3cret-pw;")
    assert "s3cret" not in str(info.value)


# -- PLAIN -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message", [b"\x00alice\x00alice-secret", b"alice\x00alice\x00alice-secret"]
)
def test_plain_accepts_the_right_password_with_or_without_authzid(message: bytes) -> None:
    assert sasl.plain_authenticate(message, USERS) == "alice"


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"\x00alice\x00wrong", "Authentication failed: Invalid username or password"),
        (b"\x00mallory\x00alice-secret", "Authentication failed: Invalid username or password"),
        (b"\x00alice\x00alice-secre", "Authentication failed: Invalid username or password"),
        (b"\x00alice\x00", "Authentication failed: password not specified"),
        (b"\x00\x00alice-secret", "Authentication failed: username not specified"),
        (b"alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"\x00alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        (b"\x00a\x00b\x00c", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"\x00alice\x00\xff\xfe", "Invalid SASL/PLAIN response: not UTF-8"),
        (
            b"admin\x00alice\x00alice-secret",
            "Authentication failed: Client requested an authorization id that is different "
            "from username",
        ),
    ],
)
def test_plain_refuses_with_kafkas_messages(message: bytes, error: str) -> None:
    with pytest.raises(sasl.SaslAuthenticationFailed) as info:
        sasl.plain_authenticate(message, USERS)
    assert str(info.value) == error


# -- the exchange (SaslServerAuthenticator's states) ------------------------------------


def authenticator(mechanisms: tuple[str, ...] = ("PLAIN",)) -> sasl.SaslAuthenticator:
    return sasl.SaslAuthenticator(sasl.SaslSettings("SASL_PLAINTEXT", mechanisms, USERS))


def test_versions_handshake_authenticate_sets_the_principal() -> None:
    auth = authenticator()
    assert auth.check_request(sasl.API_VERSIONS_KEY) is None
    auth.api_versions()
    assert auth.check_request(sasl.SASL_HANDSHAKE_KEY) is None
    assert auth.handshake("PLAIN", 1).error == ErrorCode.none
    assert auth.check_request(sasl.SASL_AUTHENTICATE_KEY) is None
    outcome = auth.authenticate(b"\x00alice\x00alice-secret")
    assert (outcome.error, outcome.close) == (ErrorCode.none, False)
    assert outcome.principal == auth.principal == KafkaPrincipal("User", "alice")
    assert str(auth.principal) == "User:alice"
    assert auth.complete


def test_handshake_v0_takes_a_bare_token_next() -> None:
    auth = authenticator()
    auth.handshake("PLAIN", 0)
    assert auth.expects_raw_token
    assert auth.authenticate(b"\x00admin\x00admin-secret").principal == KafkaPrincipal(
        "User", "admin"
    )
    assert auth.complete and not auth.expects_raw_token


def test_wrong_password_fails_and_closes() -> None:
    auth = authenticator()
    auth.handshake("PLAIN", 1)
    outcome = auth.authenticate(b"\x00alice\x00nope")
    assert outcome.error == ErrorCode.sasl_authentication_failed
    assert outcome.message == "Authentication failed: Invalid username or password"
    assert outcome.close and not auth.complete and auth.principal is None


def test_unsupported_mechanism_fails_and_closes() -> None:
    auth = authenticator()
    outcome = auth.handshake("SCRAM-SHA-256", 1)  # enabled are PLAIN only here
    assert outcome.error == ErrorCode.unsupported_sasl_mechanism
    assert outcome.close and not auth.complete


@pytest.mark.parametrize("api_key", [0, 3, 1, 36])
def test_any_other_request_before_the_handshake_closes(api_key: int) -> None:
    assert authenticator().check_request(api_key) is not None


def test_only_one_api_versions_and_then_only_the_handshake() -> None:
    auth = authenticator()
    auth.api_versions()
    assert auth.check_request(sasl.API_VERSIONS_KEY) is not None
    auth = authenticator()
    auth.handshake("PLAIN", 1)
    assert auth.check_request(sasl.SASL_HANDSHAKE_KEY) is not None
    assert auth.check_request(3) is not None


# -- the listener's keys ----------------------------------------------------------------


def test_sasl_plaintext_listener_with_plain_users() -> None:
    [listener] = listeners_from_config(BrokerConfig(SASL_PLAIN))
    assert listener.security_protocol == "SASL_PLAINTEXT"
    assert listener.tls is None
    assert listener.sasl is not None
    assert listener.sasl.mechanisms == ("PLAIN",)
    assert dict(listener.sasl.plain_users) == USERS
    assert "secret" not in repr(listener)


def test_keys_come_from_the_file_and_spool_variables_too(tmp_path: Path) -> None:
    path = tmp_path / "spool.toml"
    jaas_toml = JAAS.replace('"', '\\"')
    path.write_text(
        'listeners = "SASL_PLAINTEXT://127.0.0.1:9093"\n'
        'sasl.enabled.mechanisms = "PLAIN"\n'
        f'"{KEY}" = "{jaas_toml}"\n'
    )
    [listener] = listeners_from_config(BrokerConfig(load_static(path, [])))
    assert listener.sasl is not None and dict(listener.sasl.plain_users) == USERS
    env = {
        "SPOOL_LISTENERS": "SASL_PLAINTEXT://127.0.0.1:9093",
        "SPOOL_LISTENER_NAME_SASL_PLAINTEXT_SASL_ENABLED_MECHANISMS": "PLAIN",
        "SPOOL_LISTENER_NAME_SASL_PLAINTEXT_PLAIN_SASL_JAAS_CONFIG": JAAS,
    }
    static = load_static(None, [], env)
    assert static[KEY] == JAAS
    [listener] = listeners_from_config(BrokerConfig(static))
    assert listener.sasl is not None and listener.sasl.mechanisms == ("PLAIN",)


def test_sasl_ssl_listener_takes_tls_and_sasl_keys() -> None:
    settings = {
        "listeners": "SASL_SSL://127.0.0.1:9094",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/certs/broker.pem",
    }
    [listener] = listeners_from_config(BrokerConfig(settings))
    assert listener.is_tls and listener.tls is not None and listener.sasl is not None


def refused(settings: dict[str, str], *words: str) -> str:
    with pytest.raises(KafkaError) as info:
        listeners_from_config(BrokerConfig(settings))
    assert info.value.code == ErrorCode.invalid_config
    message = info.value.message or ""
    for word in words:
        assert word in message, message
    assert "secret" not in message
    return message


@pytest.mark.parametrize("mechanism", ["GSSAPI", "OAUTHBEARER"])
def test_gssapi_and_oauthbearer_are_refused(mechanism: str) -> None:
    refused({**SASL_PLAIN, "sasl.enabled.mechanisms": mechanism}, mechanism, "not supported")


def test_unknown_mechanism_is_refused() -> None:
    refused({**SASL_PLAIN, "sasl.enabled.mechanisms": "PLAINISH"}, "unknown SASL mechanism")


def test_plain_without_a_listener_jaas_entry_names_the_key() -> None:
    settings = {k: v for k, v in SASL_PLAIN.items() if k != KEY}
    refused(settings, KEY, "no JAAS entry")
    refused({**settings, "sasl.jaas.config": JAAS}, KEY, "listener prefix")


@pytest.mark.parametrize(
    ("jaas", "words"),
    [
        ('org.apache.kafka.common.security.plain.PlainLoginModule required user_a="secret"', "';'"),
        (
            'org.apache.kafka.common.security.scram.ScramLoginModule required user_a="secret";',
            "ScramLoginModule",
        ),
        (
            'org.apache.kafka.common.security.plain.PlainLoginModule required username="secret";',
            "no users",
        ),
    ],
)
def test_bad_jaas_entries_are_refused_without_their_passwords(jaas: str, words: str) -> None:
    refused({**SASL_PLAIN, KEY: jaas}, KEY, words)


def test_per_listener_mechanisms_override_the_broker_wide_list() -> None:
    settings = {
        **SASL_PLAIN,
        "sasl.enabled.mechanisms": "GSSAPI",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
    }
    [listener] = listeners_from_config(BrokerConfig(settings))
    assert listener.sasl is not None and listener.sasl.mechanisms == ("PLAIN",)


def test_jaas_config_is_a_password_describe_configs_hides() -> None:
    key = BROKER_KEYS["sasl.jaas.config"]
    assert key.sensitive
    entry = _entry(key, JAAS, 4, [], _Detail(synonyms=True, documentation=False))
    assert entry.value is None and entry.is_sensitive
