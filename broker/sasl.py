"""SASL authentication on SASL_PLAINTEXT and SASL_SSL listeners, sans-IO.

`SaslAuthenticator` is one connection's state, following Kafka's SaslServerAuthenticator:
a client may send ApiVersions, then SaslHandshake naming a mechanism, then the
mechanism's tokens in SaslAuthenticate requests (SaslHandshake v1) or as bare
size-prefixed frames (v0). Until authentication completes nothing else is served: any
other request closes the connection. An unsupported mechanism is answered
UNSUPPORTED_SASL_MECHANISM with the enabled ones, a failed authentication
SASL_AUTHENTICATION_FAILED with Kafka's message; both then close the connection.

Mechanisms: PLAIN (RFC 4616, Kafka's PlainSaslServer), with the users declared in the
listener's JAAS entry as `user_<name>="<password>"` (Kafka's PlainServerCallbackHandler),
from `listener.name.<listener>.plain.sasl.jaas.config`. Passwords are compared in
constant time and never logged.
"""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.security import KafkaPrincipal
from protocol.api import API_VERSIONS_KEY
from protocol.errors import ErrorCode

PLAIN = "PLAIN"
# Kafka's mechanisms spool does not have yet: startup refuses them by name.
NOT_YET_SUPPORTED = ("GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SUPPORTED = (PLAIN,)

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")
_JAAS_USER_PREFIX = "user_"

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36


class JaasError(ValueError):
    """A sasl.jaas.config value that cannot be parsed (the message never quotes it)."""


@dataclass(frozen=True, slots=True)
class JaasEntry:
    """One login module of a JAAS configuration: class, control flag and options."""

    login_module: str
    flag: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # options hold passwords
        return f"JaasEntry({self.login_module!r}, {self.flag!r}, <{len(self.options)} options>)"


# A token of Kafka's JaasConfig grammar: a quoted string, `=`, `;` or a bare word.
_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|(=)|(;)|([^\s=;"]+))')


def parse_jaas(text: str) -> JaasEntry:
    """`<LoginModule> <flag> key="value" ... ;` (Kafka's JaasConfig), exactly one module
    as Kafka requires of a sasl.jaas.config value."""
    tokens: list[tuple[str, str]] = []  # (kind, value): kind is "word", "str", "=", ";"
    pos, text = 0, text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise JaasError(f"unexpected character at offset {pos} (an unterminated quote?)")
        quoted, eq, semi, word = match.groups()
        if quoted is not None:
            tokens.append(("str", re.sub(r"\\(.)", r"\1", quoted)))
        elif eq:
            tokens.append(("=", eq))
        elif semi:
            tokens.append((";", semi))
        elif word is not None:
            tokens.append(("word", word))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    modules: list[JaasEntry] = []
    i = 0
    while i < len(tokens):
        if i + 1 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "word":
            raise JaasError(
                "expected `<LoginModule class> <control flag>` at the start of an entry"
            )
        module, flag = tokens[i][1], tokens[i + 1][1].lower()
        if flag not in _JAAS_FLAGS:
            raise JaasError(
                f"invalid control flag {tokens[i + 1][1]!r}: expected one of {_JAAS_FLAGS}"
            )
        i += 2
        options: dict[str, str] = {}
        while i < len(tokens) and tokens[i][0] != ";":
            if (
                i + 2 >= len(tokens)
                or tokens[i][0] != "word"
                or tokens[i + 1][0] != "="
                or tokens[i + 2][0] not in ("word", "str")
            ):
                raise JaasError(f"expected key=value options in the entry of {module}")
            options[tokens[i][1]] = tokens[i + 2][1]
            i += 3
        if i >= len(tokens):
            raise JaasError(f"the entry of {module} must end with ';'")
        i += 1
        modules.append(JaasEntry(module, flag, options))
    if len(modules) != 1:
        raise JaasError(f"it contains {len(modules)} login modules, should be 1 module")
    return modules[0]


def plain_users(entry: JaasEntry) -> dict[str, str]:
    """The PLAIN users of a JAAS entry: its `user_<name>` options."""
    return {
        name[len(_JAAS_USER_PREFIX) :]: value
        for name, value in entry.options.items()
        if name.startswith(_JAAS_USER_PREFIX)
    }


class SaslAuthenticationFailed(Exception):
    """SASL_AUTHENTICATION_FAILED, with the message the client is sent."""


def plain_authenticate(message: bytes, users: Mapping[str, str]) -> str:
    """The user a PLAIN message (`[authzid] NUL authcid NUL passwd`) authenticates;
    SaslAuthenticationFailed with Kafka's PlainSaslServer messages otherwise."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
    tokens = text.split("\x00")
    if len(tokens) != 3:
        raise SaslAuthenticationFailed(
            f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}"
        )
    authzid, username, password = tokens
    if not username:
        raise SaslAuthenticationFailed("Authentication failed: username not specified")
    if not password:
        raise SaslAuthenticationFailed("Authentication failed: password not specified")
    expected = users.get(username)
    # Compared whether or not the user exists, so timing tells nothing about either.
    ok = hmac.compare_digest(
        password.encode("utf-8"), (expected if expected is not None else "\x00").encode("utf-8")
    )
    if expected is None or not ok:
        raise SaslAuthenticationFailed("Authentication failed: Invalid username or password")
    if authzid and authzid != username:
        raise SaslAuthenticationFailed(
            "Authentication failed: Client requested an authorization id that is different "
            "from username"
        )
    return username


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """A SASL listener's mechanisms and, for PLAIN, its users."""

    listener: str
    mechanisms: tuple[str, ...]
    plain_users: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the passwords
        return (
            f"SaslSettings({self.listener!r}, {self.mechanisms!r}, "
            f"<{len(self.plain_users)} PLAIN users>)"
        )


class State(enum.Enum):
    """Kafka's SaslServerAuthenticator.SaslState, as far as spool needs it."""

    HANDSHAKE_OR_VERSIONS = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"  # SaslAuthenticate requests (handshake v1)
    RAW_TOKEN = "RAW_TOKEN"  # a bare token frame (handshake v0)
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclass(slots=True)
class Outcome:
    """What the connection does with a request during authentication: answer with
    `error` (and `message`), and close afterwards if `close`."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    close: bool = False
    principal: KafkaPrincipal | None = None


class SaslAuthenticator:
    """One connection's SASL exchange (Kafka's SaslServerAuthenticator), sans-IO."""

    def __init__(self, settings: SaslSettings) -> None:
        self.settings = settings
        self.state = State.HANDSHAKE_OR_VERSIONS
        self.mechanism: str | None = None
        self.principal: KafkaPrincipal | None = None

    @property
    def complete(self) -> bool:
        return self.state is State.COMPLETE

    @property
    def expects_raw_token(self) -> bool:
        return self.state is State.RAW_TOKEN

    def check_request(self, api_key: int) -> str | None:
        """None if a request with `api_key` may come now, else why it closes the
        connection (Kafka: "Unexpected Kafka request of type ... during SASL ...")."""
        if self.state is State.HANDSHAKE_OR_VERSIONS and api_key in (
            API_VERSIONS_KEY,
            SASL_HANDSHAKE_KEY,
        ):
            return None
        if self.state is State.HANDSHAKE and api_key == SASL_HANDSHAKE_KEY:
            return None
        if self.state is State.AUTHENTICATE and api_key == SASL_AUTHENTICATE_KEY:
            return None
        during = (
            "handshake"
            if self.state in (State.HANDSHAKE_OR_VERSIONS, State.HANDSHAKE)
            else "authentication"
        )
        self.state = State.FAILED
        return f"Unexpected Kafka request of api key {api_key} during SASL {during}"

    def api_versions(self) -> None:
        """An ApiVersions request was answered: a handshake must come next."""
        self.state = State.HANDSHAKE

    def handshake(self, mechanism: str, version: int) -> Outcome:
        """SaslHandshake: UNSUPPORTED_SASL_MECHANISM (then close) for a mechanism not
        enabled on the listener."""
        if mechanism not in self.settings.mechanisms:
            self.state = State.FAILED
            return Outcome(
                ErrorCode.unsupported_sasl_mechanism,
                f"Unsupported SASL mechanism {mechanism}",
                close=True,
            )
        self.mechanism = mechanism
        self.state = State.AUTHENTICATE if version >= 1 else State.RAW_TOKEN
        return Outcome()

    def authenticate(self, token: bytes) -> Outcome:
        """A token of the chosen mechanism (PLAIN takes one and completes)."""
        assert self.mechanism == PLAIN
        try:
            username = plain_authenticate(token, self.settings.plain_users)
        except SaslAuthenticationFailed as exc:
            self.state = State.FAILED
            return Outcome(ErrorCode.sasl_authentication_failed, str(exc), close=True)
        self.principal = KafkaPrincipal("User", username)
        self.state = State.COMPLETE
        return Outcome(principal=self.principal)
