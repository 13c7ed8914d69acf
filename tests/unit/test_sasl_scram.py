"""SASL/SCRAM (KIP-84) and re-authentication (KIP-368), sans-IO.

The client side is scramp's ScramClient; the server is broker.sasl's authenticator over
credentials made as the metadata stores them (coordinator.scram). Kafka's behaviour
followed: ScramSaslServer (one generic message for any failure, the authzid check,
the minimum iterations), SaslServerAuthenticator.ReauthInfo (session lifetime, same
principal and mechanism on re-authentication) and KafkaChannel (expiry, at most one
re-authentication a second). The socket side is tests/integration/test_sasl_scram.py.
"""

from __future__ import annotations

import base64
import dataclasses
import os

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import sasl
from broker.config import BrokerConfig, load_static
from broker.listeners import listeners_from_config
from broker.security import KafkaPrincipal
from coordinator.scram import ScramCredential, credential_from_password, salted_password
from persister.clock import ManualClock
from protocol.errors import ErrorCode, KafkaError

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}


def store(iterations: int = 4096) -> dict[tuple[str, str], ScramCredential]:
    return {
        (user, mech): credential_from_password(mech, pw, os.urandom(16), iterations)
        for user, pw in PASSWORDS.items()
        for mech in sasl.SCRAM
    }


_STORE = store()


def authenticator(
    creds: dict[tuple[str, str], ScramCredential] | None = None,
    reauth_ms: int = 0,
    mechanisms: tuple[str, ...] = (*sasl.SCRAM, "PLAIN"),
) -> sasl.SaslAuthenticator:
    found = _STORE if creds is None else creds
    settings = sasl.SaslSettings(
        "SASL_PLAINTEXT", mechanisms, {"carol": "carol-secret"}, reauth_ms=reauth_ms
    )
    return sasl.SaslAuthenticator(settings, lambda user, mech: found.get((user, mech)))


def login(
    auth: sasl.SaslAuthenticator,
    mechanism: str,
    user: str,
    password: str,
    now_ms: int = 0,
    version: int = 1,
) -> sasl.Outcome:
    """A whole SCRAM exchange; the outcome of the last step."""
    assert auth.handshake(mechanism, version).error == ErrorCode.none
    client = scramp.ScramClient([mechanism], user, password)
    first = auth.authenticate(client.get_client_first().encode(), now_ms)
    if first.close:
        return first
    assert first.principal is None and first.token
    client.set_server_first(first.token.decode())
    final = auth.authenticate(client.get_client_final().encode(), now_ms)
    if not final.close:
        client.set_server_final(final.token.decode())  # the server proved it knows the key
    return final


def failure(mechanism: str, during: str = "authentication") -> str:
    return (
        f"Authentication failed during {during} due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


@pytest.mark.parametrize("mechanism", sasl.SCRAM)
@pytest.mark.parametrize("version", [0, 1])
def test_scram_login_with_the_stored_credential(mechanism: str, version: int) -> None:
    auth = authenticator()
    outcome = login(auth, mechanism, "alice", "alice-secret", version=version)
    assert (outcome.error, outcome.close) == (ErrorCode.none, False)
    assert outcome.principal == auth.principal == KafkaPrincipal("User", "alice")
    assert outcome.token.startswith(b"v=")
    assert auth.complete and outcome.session_lifetime_ms == 0


@pytest.mark.parametrize("mechanism", sasl.SCRAM)
def test_wrong_password_and_unknown_user_fail_alike(mechanism: str) -> None:
    wrong = login(authenticator(), mechanism, "alice", "nope")
    unknown = login(authenticator(), mechanism, "mallory", "alice-secret")
    for outcome in (wrong, unknown):
        assert outcome.error == ErrorCode.sasl_authentication_failed
        assert outcome.message == failure(mechanism)
        assert outcome.close and outcome.principal is None
        assert "secret" not in repr(outcome)
    assert unknown.reason == "unknown user"


def test_an_unknown_user_is_answered_a_stable_salt() -> None:
    """The server-first message of an unknown user looks like anyone's, and a second
    try sees the same salt (a fresh one each time would tell the user is unknown)."""

    def salt_of(user: str) -> str:
        auth = authenticator()
        auth.handshake("SCRAM-SHA-256", 1)
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, "x")
        first = auth.authenticate(client.get_client_first().encode())
        assert not first.close
        fields = dict(p.split("=", 1) for p in first.token.decode().split(","))
        assert fields["i"] == "4096"
        return fields["s"]

    assert salt_of("mallory") == salt_of("mallory")
    assert salt_of("mallory") != salt_of("trudy")
    assert len(base64.b64decode(salt_of("mallory"))) >= 16


def test_a_credential_is_per_mechanism() -> None:
    creds = store()
    del creds[("alice", "SCRAM-SHA-512")]
    assert not login(authenticator(creds), "SCRAM-SHA-256", "alice", "alice-secret").close
    assert login(authenticator(creds), "SCRAM-SHA-512", "alice", "alice-secret").close


def test_credentials_are_read_at_each_login() -> None:
    creds: dict[tuple[str, str], ScramCredential] = {}
    auth = authenticator(creds)
    assert login(auth, "SCRAM-SHA-256", "dave", "pw").close
    creds.update(
        {
            ("dave", "SCRAM-SHA-256"): credential_from_password(
                "SCRAM-SHA-256", "pw", b"s" * 16, 4096
            )
        }
    )
    assert not login(authenticator(creds), "SCRAM-SHA-256", "dave", "pw").close


def test_too_few_iterations_in_a_stored_credential_fail() -> None:
    cred = credential_from_password("SCRAM-SHA-256", "pw", b"s" * 16, 1000)
    outcome = login(authenticator({("eve", "SCRAM-SHA-256"): cred}), "SCRAM-SHA-256", "eve", "pw")
    assert outcome.close and outcome.message == failure("SCRAM-SHA-256")
    assert "less than the minimum 4096" in (outcome.reason or "")


@pytest.mark.parametrize(
    "first",
    [
        b"",
        b"\xff\xfe",
        b"garbage",
        b"n,,",
        b"n,,n=alice",
        b"x,,n=alice,r=abc",
        b"n,,n=alice,r=abc,m=ext",
        b"p=tls-unique,,n=alice,r=abc",
    ],
)
def test_a_malformed_client_first_message_fails_and_closes(first: bytes) -> None:
    auth = authenticator()
    auth.handshake("SCRAM-SHA-512", 1)
    outcome = auth.authenticate(first)
    assert outcome.error == ErrorCode.sasl_authentication_failed
    assert outcome.message == failure("SCRAM-SHA-512")
    assert outcome.close and auth.state is sasl.State.FAILED


@pytest.mark.parametrize(
    "final", [b"", b"c=biws", b"c=biws,r=bad,p=AAAA", b"\x00\x01", b"c=eSws,r={nonce},p=AAAA"]
)
def test_a_malformed_client_final_message_fails_and_closes(final: bytes) -> None:
    auth = authenticator()
    auth.handshake("SCRAM-SHA-256", 1)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
    first = auth.authenticate(client.get_client_first().encode())
    nonce = dict(p.split("=", 1) for p in first.token.decode().split(","))["r"]
    outcome = auth.authenticate(final.replace(b"{nonce}", nonce.encode()))
    assert outcome.close and outcome.message == failure("SCRAM-SHA-256")


def test_an_authzid_other_than_the_user_gets_kafkas_own_message() -> None:
    auth = authenticator()
    auth.handshake("SCRAM-SHA-256", 1)
    outcome = auth.authenticate(b"n,a=admin,n=alice,r=abcdefgh")
    assert outcome.close
    assert outcome.message == (
        "Authentication failed: Client requested an authorization id that is different "
        "from username"
    )


def test_plain_still_works_next_to_scram() -> None:
    auth = authenticator()
    auth.handshake("PLAIN", 1)
    assert auth.authenticate(b"\x00carol\x00carol-secret").principal == KafkaPrincipal(
        "User", "carol"
    )


# -- re-authentication (KIP-368) ----------------------------------------------------------


def test_session_lifetime_is_connections_max_reauth_ms_and_expires_by_the_clock() -> None:
    clock = ManualClock()
    auth = authenticator(reauth_ms=2000)
    outcome = login(auth, "SCRAM-SHA-256", "alice", "alice-secret", clock.now_ms())
    assert outcome.session_lifetime_ms == 2000
    assert not auth.session_expired(clock.now_ms())
    clock.advance(2000)
    assert not auth.session_expired(clock.now_ms())
    clock.advance(1)
    assert auth.session_expired(clock.now_ms())


def test_sessions_never_expire_without_connections_max_reauth_ms() -> None:
    auth = authenticator()
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 0)
    assert not auth.session_expired(10**12)
    assert not auth.begin_reauthentication(10**12)  # the handler answers ILLEGAL_SASL_STATE


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_reauthentication_renews_the_session(mechanism: str) -> None:
    clock = ManualClock()
    auth = authenticator(reauth_ms=2000)
    if mechanism == "PLAIN":
        auth.handshake("PLAIN", 1)
        auth.authenticate(b"\x00carol\x00carol-secret", clock.now_ms())
    else:
        login(auth, mechanism, "alice", "alice-secret", clock.now_ms())
    for _ in range(3):
        clock.advance(1500)
        assert auth.begin_reauthentication(clock.now_ms())
        assert not auth.complete and auth.check_request(sasl.SASL_HANDSHAKE_KEY) is None
        if mechanism == "PLAIN":
            auth.handshake("PLAIN", 1)
            outcome = auth.authenticate(b"\x00carol\x00carol-secret", clock.now_ms())
        else:
            outcome = login(auth, mechanism, "alice", "alice-secret", clock.now_ms())
        assert outcome.reauthenticated and not outcome.close
        assert outcome.session_lifetime_ms == 2000
        clock.advance(1000)
        assert auth.complete and not auth.session_expired(clock.now_ms())


def test_reauthentication_as_another_principal_fails() -> None:
    auth = authenticator(reauth_ms=2000)
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 0)
    assert auth.begin_reauthentication(1500)
    outcome = login(auth, "SCRAM-SHA-256", "bob", "bob-secret", 1500)
    assert outcome.close and outcome.error == ErrorCode.sasl_authentication_failed
    assert outcome.message == (
        "Cannot change principals during re-authentication from User.alice: User.bob"
    )


def test_reauthentication_with_a_wrong_password_says_re_authentication() -> None:
    auth = authenticator(reauth_ms=2000)
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 0)
    assert auth.begin_reauthentication(1500)
    outcome = login(auth, "SCRAM-SHA-256", "alice", "wrong", 1500)
    assert outcome.close
    assert outcome.message == failure("SCRAM-SHA-256", "re-authentication")


def test_reauthentication_with_another_mechanism_closes_at_the_next_request() -> None:
    auth = authenticator(reauth_ms=2000)
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 0)
    assert auth.begin_reauthentication(1500)
    assert auth.handshake("SCRAM-SHA-512", 1).error == ErrorCode.none
    reason = auth.check_request(sasl.SASL_AUTHENTICATE_KEY)
    assert reason == (
        "SASL mechanism 'SCRAM-SHA-512' requested by client is not supported for "
        "re-authentication of mechanism 'SCRAM-SHA-256'"
    )


def test_at_most_one_reauthentication_a_second() -> None:
    auth = authenticator(reauth_ms=60_000)
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 0)
    assert auth.begin_reauthentication(10_000)
    login(auth, "SCRAM-SHA-256", "alice", "alice-secret", 10_000)
    assert not auth.begin_reauthentication(10_999)
    assert auth.begin_reauthentication(11_000)


# -- the listener's keys -------------------------------------------------------------------

SCRAM_LISTENER = {
    "listeners": "SASL_PLAINTEXT://127.0.0.1:9093",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
}


def test_a_scram_listener_needs_no_jaas_entry_and_takes_reauth_ms() -> None:
    [listener] = listeners_from_config(
        BrokerConfig({**SCRAM_LISTENER, "connections.max.reauth.ms": "2000"})
    )
    assert listener.sasl is not None
    assert listener.sasl.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert listener.sasl.reauth_ms == 2000
    settings = {
        **SCRAM_LISTENER,
        "listener.name.sasl_plaintext.connections.max.reauth.ms": "500",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
    }
    [listener] = listeners_from_config(BrokerConfig(settings))
    assert listener.sasl is not None and listener.sasl.reauth_ms == 500


def test_reauth_ms_per_mechanism_as_kafka_prefixes_it() -> None:
    """listener.name.<listener>.<mechanism>.connections.max.reauth.ms, from --set and
    from SPOOL_ variables, over the listener's and the broker's values."""
    static = load_static(
        None,
        ["listener.name.sasl_plaintext.SCRAM-SHA-512.connections.max.reauth.ms=700"],
        {
            "SPOOL_CONNECTIONS_MAX_REAUTH_MS": "5000",
            "SPOOL_LISTENER_NAME_SASL_PLAINTEXT_SCRAM_SHA_256_CONNECTIONS_MAX_REAUTH_MS": "900",
        },
    )
    [listener] = listeners_from_config(BrokerConfig({**SCRAM_LISTENER, **static}))
    assert listener.sasl is not None
    assert listener.sasl.reauth_ms_for("SCRAM-SHA-512") == 700
    assert listener.sasl.reauth_ms_for("SCRAM-SHA-256") == 900
    auth = sasl.SaslAuthenticator(listener.sasl, lambda u, m: _STORE.get((u, m)))
    assert login(auth, "SCRAM-SHA-512", "alice", "alice-secret").session_lifetime_ms == 700
    auth = sasl.SaslAuthenticator(
        dataclasses.replace(listener.sasl, reauth_ms_by_mechanism={}),
        lambda u, m: _STORE.get((u, m)),
    )
    assert login(auth, "SCRAM-SHA-512", "alice", "alice-secret").session_lifetime_ms == 5000


def test_a_scram_jaas_entry_must_name_the_scram_login_module() -> None:
    settings = {
        **SCRAM_LISTENER,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="secret";'
        ),
    }
    with pytest.raises(KafkaError) as info:
        listeners_from_config(BrokerConfig(settings))
    assert "ScramLoginModule" in (info.value.message or "")
    assert "secret" not in (info.value.message or "")


def test_credential_derivation_matches_scramp() -> None:
    """coordinator.scram's RFC 5802 formulas give what scramp computes from the password."""
    salt = os.urandom(16)
    for mech in sasl.SCRAM:
        ours = credential_from_password(mech, "pässword", salt, 4096)
        _, stored, server, _ = scramp.ScramMechanism(mech).make_auth_info(
            "pässword", iteration_count=4096, salt=salt
        )
        assert (ours.stored_key, ours.server_key) == (stored, server)
        assert len(salted_password(mech, "x", salt, 4096)) in (32, 64)
        assert "hidden" in repr(ours) and repr(salt) not in repr(ours)


# -- fuzzing the exchange ------------------------------------------------------------------


def _valid_messages() -> tuple[bytes, bytes]:
    """A real client-first and the client-final that answers the server's first."""
    auth = authenticator()
    auth.handshake("SCRAM-SHA-256", 1)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
    first = client.get_client_first().encode()
    client.set_server_first(auth.authenticate(first).token.decode())
    return first, client.get_client_final().encode()


_FIRST, _FINAL = _valid_messages()


def _mutate(data: bytes, cuts: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(data)
    for position, insert in cuts:
        i = position % (len(out) + 1)
        out[i : i + len(insert)] = insert
    return bytes(out)


_cuts = st.lists(
    st.tuples(
        st.integers(0, 200),
        st.sampled_from([b"", b",", b"=", b"=2C", b"\x00", b"\xff", b"a=", b"r=", b"p=AAAA"])
        | st.binary(max_size=4),
    ),
    max_size=4,
)


@settings(max_examples=400, deadline=None)
@given(first=st.one_of(st.binary(max_size=64), _cuts.map(lambda c: _mutate(_FIRST, c))))
def test_any_client_first_is_answered_without_raising(first: bytes) -> None:
    auth = authenticator()
    auth.handshake("SCRAM-SHA-256", 1)
    outcome = auth.authenticate(first)
    assert outcome.principal is None and not auth.complete
    if outcome.close:
        assert outcome.error == ErrorCode.sasl_authentication_failed
    else:
        assert outcome.token.startswith(b"r=")


def _same_proof_spelled_otherwise(final: bytes, mutated: bytes) -> bool:
    """`mutated` is `final` with the proof's base64 written differently but decoding to the
    same bytes: the last character of a 32-byte proof carries 2 bits the decoder ignores
    (RFC 4648 section 3.5), so 3 other characters there give the same proof. The server
    decodes as scramp does (strict alphabet, `validate=True`); the proof is right."""
    head, _, proof = final.rpartition(b",p=")
    mutated_head, sep, mutated_proof = mutated.rpartition(b",p=")
    if not sep or mutated_head != head:
        return False
    try:
        return base64.b64decode(mutated_proof, validate=True) == base64.b64decode(proof)
    except ValueError:
        return False


def _exchange() -> tuple[sasl.SaslAuthenticator, bytes]:
    """A server past alice's client-first, and the client-final that answers it."""
    auth = authenticator()
    auth.handshake("SCRAM-SHA-256", 1)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
    client.set_server_first(auth.authenticate(client.get_client_first().encode()).token.decode())
    return auth, client.get_client_final().encode()


def test_a_proof_spelled_with_other_ignored_bits_is_the_same_proof() -> None:
    """What the property test below allows, shown on a real exchange: the proof's last
    base64 character, changed in its 2 ignored bits only, is accepted; changed in a bit
    that counts, refused."""
    auth, final = _exchange()
    assert final.endswith(b"=") and not final.endswith(b"==")
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(final[-2])
    same = bytes([alphabet[last ^ 1]])  # one of the 2 ignored low bits
    other = bytes([alphabet[last ^ 4]])  # a bit of the proof's last byte
    spelled_otherwise = final[:-2] + same + b"="
    assert _same_proof_spelled_otherwise(final, spelled_otherwise)
    assert not _same_proof_spelled_otherwise(final, final[:-2] + other + b"=")
    outcome = auth.authenticate(spelled_otherwise)
    assert outcome.principal is not None and auth.complete

    refused, final = _exchange()
    last = alphabet.index(final[-2])
    outcome = refused.authenticate(final[:-2] + bytes([alphabet[last ^ 4]]) + b"=")
    assert outcome.close and outcome.error == ErrorCode.sasl_authentication_failed


@settings(max_examples=400, deadline=None)
@given(cuts=_cuts)
def test_any_client_final_is_answered_without_raising(cuts: list[tuple[int, bytes]]) -> None:
    auth, final = _exchange()
    mutated = _mutate(final, cuts)
    outcome = auth.authenticate(mutated)
    if mutated == final or _same_proof_spelled_otherwise(final, mutated):
        assert outcome.principal is not None and auth.complete
    else:
        assert outcome.close and outcome.error == ErrorCode.sasl_authentication_failed
        assert outcome.principal is None and not auth.complete
