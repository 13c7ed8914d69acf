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
from `listener.name.<listener>.plain.sasl.jaas.config`, or, for a listener without it,
from the JAAS file `java.security.auth.login.config` names (`parse_jaas_file`: its
`<listener>.KafkaServer` section, else `KafkaServer`, as Kafka's JaasContext reads the
file the JVM property names). Passwords are compared in constant time and never logged.

SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, KIP-84; Kafka's ScramSaslServer), run by
`scramp` over the credentials in the cluster metadata (coordinator.scram), read at each
login, so a credential created or deleted while the broker runs counts for the next one.
Any failure (unknown user, wrong password, a malformed message, a credential with fewer
than 4096 iterations) answers Kafka's one message, "Authentication failed during
authentication due to invalid credentials with SASL mechanism ...", which tells nothing
of the cause; the log says it (never a secret). An unknown user is answered a
server-first message like anyone else's, with a salt derived from the name under a
per-process key (the same each time for that name), and fails at the proof as a wrong
password does (RFC 5802 section 9). Differences from Kafka: an authzid in the GS2
header equal to the user name is refused too (scramp takes none; clients send none),
and SCRAM extensions such as delegation tokens' `tokenauth` are not supported.

Re-authentication (KIP-368): with `connections.max.reauth.ms` above 0, a successful
SaslAuthenticate answers that as the session lifetime, and the session expires then. A
client re-authenticates on the same connection with SaslHandshake + SaslAuthenticate
(`begin_reauthentication`), with the same mechanism and ending as the same principal,
else the connection closes, as Kafka's SaslServerAuthenticator.ReauthInfo; a connection
whose session expired and sends any other request is closed (Kafka's SocketServer).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import scramp

from broker.security import KafkaPrincipal
from coordinator.scram import MECHANISMS, MIN_ITERATIONS, SCRAM_SHA_256, SCRAM_SHA_512
from coordinator.scram import ScramCredential as ScramCredential
from protocol.api import API_VERSIONS_KEY
from protocol.errors import ErrorCode

PLAIN = "PLAIN"
# Kafka's mechanisms spool does not have yet: startup refuses them by name.
NOT_YET_SUPPORTED = ("GSSAPI", "OAUTHBEARER")
SCRAM = (SCRAM_SHA_256, SCRAM_SHA_512)
SUPPORTED = (PLAIN, *SCRAM)

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
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


# A token of Kafka's JaasConfig grammar: a comment (skipped), a quoted string, `=`, `;`,
# a brace (JAAS files only) or a bare word.
_TOKEN = re.compile(
    r'\s*(?://[^\n]*|/\*.*?\*/|"((?:[^"\\]|\\.)*)"|(=)|(;)|([{}])|([^\s=;"{}]+))', re.DOTALL
)
Token = tuple[str, str]  # (kind, value): kind is "word", "str", "=", ";", "{" or "}"


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise JaasError(f"unexpected character at offset {pos} (an unterminated quote?)")
        quoted, eq, semi, brace, word = match.groups()
        if quoted is not None:
            tokens.append(("str", re.sub(r"\\(.)", r"\1", quoted)))
        elif eq:
            tokens.append(("=", eq))
        elif semi:
            tokens.append((";", semi))
        elif brace:
            tokens.append((brace, brace))
        elif word is not None:
            tokens.append(("word", word))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


def _modules(tokens: list[Token], i: int, end: str | None) -> tuple[list[JaasEntry], int]:
    """Login module entries from `tokens[i]` up to a token of kind `end` (None: the
    end); returns them and the index of that token."""
    modules: list[JaasEntry] = []
    while i < len(tokens) and tokens[i][0] != end:
        if i + 1 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "word":
            raise JaasError(
                "expected `<LoginModule class> <control flag>` at the start of an entry"
            )
        module, flag = tokens[i][1], tokens[i + 1][1].lower()
        if flag not in _JAAS_FLAGS:
            raise JaasError(
                # The word is not quoted: a misplaced password could stand there.
                f"invalid control flag after {module}: expected one of {_JAAS_FLAGS}"
            )
        i += 2
        options: dict[str, str] = {}
        while i < len(tokens) and tokens[i][0] not in (";", end):
            if (
                i + 2 >= len(tokens)
                or tokens[i][0] != "word"
                or tokens[i + 1][0] != "="
                or tokens[i + 2][0] not in ("word", "str")
            ):
                raise JaasError(f"expected key=value options in the entry of {module}")
            options[tokens[i][1]] = tokens[i + 2][1]
            i += 3
        if i >= len(tokens) or tokens[i][0] != ";":
            raise JaasError(f"the entry of {module} must end with ';'")
        i += 1
        modules.append(JaasEntry(module, flag, options))
    if end is not None and i >= len(tokens):
        raise JaasError(f"a section must end with '{end}'")
    return modules, i


def parse_jaas(text: str) -> JaasEntry:
    """`<LoginModule> <flag> key="value" ... ;` (Kafka's JaasConfig), exactly one module
    as Kafka requires of a sasl.jaas.config value."""
    modules, _ = _modules(_tokens(text), 0, None)
    if len(modules) != 1:
        raise JaasError(f"it contains {len(modules)} login modules, should be 1 module")
    return modules[0]


def parse_jaas_file(text: str) -> dict[str, list[JaasEntry]]:
    """A JAAS configuration file, as the JVM's `java.security.auth.login.config` names
    it for Kafka: `Name { <entries> };` sections (`KafkaServer`, or
    `<listener>.KafkaServer` for one listener), `//` and `/* */` comments."""
    tokens = _tokens(text)
    sections: dict[str, list[JaasEntry]] = {}
    i = 0
    while i < len(tokens):
        if i + 1 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "{":
            raise JaasError("expected `<Name> {` at the start of a section")
        name = tokens[i][1]
        modules, i = _modules(tokens, i + 2, "}")
        i += 1  # the brace
        if i < len(tokens) and tokens[i][0] == ";":
            i += 1
        else:
            raise JaasError(f"the section {name} must end with '}};'")
        sections[name] = sections.get(name, []) + modules
    return sections


def plain_users(entry: JaasEntry) -> dict[str, str]:
    """The PLAIN users of a JAAS entry: its `user_<name>` options."""
    return {
        name[len(_JAAS_USER_PREFIX) :]: value
        for name, value in entry.options.items()
        if name.startswith(_JAAS_USER_PREFIX)
    }


class SaslAuthenticationFailed(Exception):
    """SASL_AUTHENTICATION_FAILED, with the message the client is sent; `reason` is
    what the log says when the client is told less."""

    reason: str | None = None


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
    # connections.max.reauth.ms (KIP-368): 0 means sessions never expire; per mechanism
    # from listener.name.<listener>.<mechanism>.connections.max.reauth.ms.
    reauth_ms: int = 0
    reauth_ms_by_mechanism: Mapping[str, int] = field(default_factory=dict)

    def reauth_ms_for(self, mechanism: str) -> int:
        return self.reauth_ms_by_mechanism.get(mechanism, self.reauth_ms)

    def __repr__(self) -> str:  # never the passwords
        return (
            f"SaslSettings({self.listener!r}, {self.mechanisms!r}, "
            f"<{len(self.plain_users)} PLAIN users>, reauth_ms={self.reauth_ms})"
        )


# (user, mechanism) -> the stored SCRAM credential, or None.
ScramLookup = Callable[[str, str], ScramCredential | None]
NO_SCRAM_USERS: ScramLookup = lambda user, mechanism: None  # noqa: E731

# Unknown users get a salt derived from their name under this key: the same for a name
# while the broker runs (a second try does not show a new salt), and unguessable.
_FAKE_SALT_KEY = os.urandom(32)


def scram_failure_message(mechanism: str, reauthenticating: bool = False) -> str:
    """What Kafka's SaslServerAuthenticator answers for any SaslException."""
    during = "re-authentication" if reauthenticating else "authentication"
    return (
        f"Authentication failed during {during} due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


class _ScramError(Exception):
    """Why a SCRAM exchange failed, for the log (never a secret); the client gets
    Kafka's generic message."""


class ScramExchange:
    """One SCRAM exchange, server side: client-first -> server-first, client-final ->
    server-final (Kafka's ScramSaslServer states), over scramp's ScramServer."""

    def __init__(self, mechanism: str, lookup: ScramLookup) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._server = scramp.ScramMechanism(mechanism).make_server(self._credential)
        self.user: str | None = None
        self._known = False
        self.complete = False
        self._step = 0

    def __repr__(self) -> str:
        return f"ScramExchange({self.mechanism!r}, user={self.user!r}, step={self._step})"

    def _credential(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = username
        credential = self._lookup(username, self.mechanism)
        if credential is not None and credential.iterations < MIN_ITERATIONS:
            raise _ScramError(
                f"Iterations {credential.iterations} is less than the minimum "
                f"{MIN_ITERATIONS} for {self.mechanism}"
            )
        if credential is None:
            name = MECHANISMS[self.mechanism][1]
            salt = hmac.new(
                _FAKE_SALT_KEY, f"{self.mechanism}\x00{username}".encode(), hashlib.sha256
            ).digest()
            size = hashlib.new(name).digest_size
            return salt, os.urandom(size), os.urandom(size), MIN_ITERATIONS
        self._known = True
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> bytes:
        """The answer to the client's next message; SaslAuthenticationFailed with the
        client's message (`args[0]`) and the reason for the log (`reason`)."""
        try:
            return self._step_or_raise(token)
        except SaslAuthenticationFailed:
            raise
        except _ScramError as exc:
            raise _failed(self.mechanism, str(exc)) from None
        except scramp.ScramException as exc:
            # scramp wraps what the credential lookup raised.
            cause = exc.__cause__ if isinstance(exc.__cause__, _ScramError) else exc
            raise _failed(self.mechanism, str(cause.args[0]) if cause.args else "invalid") from None
        except (ValueError, TypeError) as exc:
            raise _failed(self.mechanism, f"malformed message: {exc}") from None

    def _step_or_raise(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise _ScramError("the message is not UTF-8") from None
        self._step += 1
        if self._step == 1:
            _check_authzid(text)
            self._server.set_client_first(text)
            # An unknown user is answered as a known one; the proof fails at step 2.
            return str(self._server.get_server_first()).encode("utf-8")
        if self._step == 2:
            try:
                self._server.set_client_final(text)
            except scramp.ScramException:
                if self._known:
                    raise
                raise _ScramError("unknown user") from None
            if not self._known:
                raise _ScramError("unknown user")
            self.complete = True
            return str(self._server.get_server_final()).encode("utf-8")
        raise _ScramError("a message after the exchange completed")


def _failed(mechanism: str, reason: str) -> SaslAuthenticationFailed:
    exc = SaslAuthenticationFailed(scram_failure_message(mechanism))
    exc.reason = reason
    return exc


def _check_authzid(client_first: str) -> None:
    """Kafka's ScramSaslServer: an authzid other than the user name is refused with its
    own message (the only SCRAM failure Kafka tells the client about)."""
    parts = client_first.split(",", 3)
    if len(parts) < 3 or not parts[1].startswith("a="):
        return
    authzid = parts[1][2:]
    user = next((p[2:] for p in parts[2:] if p.startswith("n=")), None)
    if user is not None and authzid != user.replace("=2C", ",").replace("=3D", "="):
        raise SaslAuthenticationFailed(
            "Authentication failed: Client requested an authorization id that is "
            "different from username"
        )


class State(enum.Enum):
    """Kafka's SaslServerAuthenticator.SaslState, as far as spool needs it."""

    HANDSHAKE_OR_VERSIONS = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"  # SaslAuthenticate requests (handshake v1)
    RAW_TOKEN = "RAW_TOKEN"  # a bare token frame (handshake v0)
    REAUTH_BAD_MECHANISM = "REAUTH_BAD_MECHANISM"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclass(slots=True)
class Outcome:
    """What the connection does with a request during authentication: answer with
    `error` (and `message`) and `token`, and close afterwards if `close`. `principal`
    is set once authentication completes, with `session_lifetime_ms` (KIP-368)."""

    error: ErrorCode = ErrorCode.none
    message: str | None = None
    close: bool = False
    principal: KafkaPrincipal | None = None
    token: bytes = b""
    session_lifetime_ms: int = 0
    # For the log when the client is told less than the cause (never a secret).
    reason: str | None = None
    reauthenticated: bool = False


# Kafka's KafkaChannel: a client may start re-authenticating at most once a second.
MIN_REAUTH_INTERVAL_MS = 1000


class SaslAuthenticator:
    """One connection's SASL exchange (Kafka's SaslServerAuthenticator), sans-IO.
    Times are the caller's clock's milliseconds."""

    def __init__(self, settings: SaslSettings, scram_lookup: ScramLookup = NO_SCRAM_USERS) -> None:
        self.settings = settings
        self.scram_lookup = scram_lookup
        self.state = State.HANDSHAKE_OR_VERSIONS
        self.mechanism: str | None = None
        self.principal: KafkaPrincipal | None = None
        self._scram: ScramExchange | None = None
        # KIP-368: when the session ends (None: never), and what a re-authentication
        # must keep (the principal and mechanism before it).
        self.session_expires_ms: int | None = None
        self._previous: tuple[KafkaPrincipal, str] | None = None
        self._last_reauth_start_ms: int | None = None
        self._bad_mechanism_message = ""

    @property
    def complete(self) -> bool:
        return self.state is State.COMPLETE

    @property
    def reauthenticating(self) -> bool:
        return self._previous is not None

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
        if self.state is State.REAUTH_BAD_MECHANISM:
            self.state = State.FAILED
            return self._bad_mechanism_message
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
        enabled on the listener. Re-authenticating with another mechanism is answered
        as usual, and the next request closes the connection (Kafka's
        REAUTH_BAD_MECHANISM)."""
        if mechanism not in self.settings.mechanisms:
            self.state = State.FAILED
            return Outcome(
                ErrorCode.unsupported_sasl_mechanism,
                f"Unsupported SASL mechanism {mechanism}",
                close=True,
            )
        if self._previous is not None and mechanism != self._previous[1]:
            self._bad_mechanism_message = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for "
                f"re-authentication of mechanism '{self._previous[1]}'"
            )
            self.state = State.REAUTH_BAD_MECHANISM
            return Outcome()
        self.mechanism = mechanism
        self._scram = ScramExchange(mechanism, self.scram_lookup) if mechanism in SCRAM else None
        self.state = State.AUTHENTICATE if version >= 1 else State.RAW_TOKEN
        return Outcome()

    def authenticate(self, token: bytes, now_ms: int = 0) -> Outcome:
        """A token of the chosen mechanism: PLAIN takes one and completes, SCRAM two
        (the first is answered with the server-first message)."""
        assert self.mechanism is not None
        try:
            if self._scram is not None:
                answer = self._scram.step(token)
                if not self._scram.complete:
                    return Outcome(token=answer)
                assert self._scram.user is not None
                username = self._scram.user
            else:
                username = plain_authenticate(token, self.settings.plain_users)
                answer = b""
            principal = KafkaPrincipal("User", username)
            if self._previous is not None and principal != self._previous[0]:
                before = self._previous[0]
                raise SaslAuthenticationFailed(
                    "Cannot change principals during re-authentication from "
                    f"{before.principal_type}.{before.name}: "
                    f"{principal.principal_type}.{principal.name}"
                )
        except SaslAuthenticationFailed as exc:
            self.state = State.FAILED
            message = str(exc)
            if self._previous is not None and message == scram_failure_message(self.mechanism):
                message = scram_failure_message(self.mechanism, reauthenticating=True)
            return Outcome(
                ErrorCode.sasl_authentication_failed, message, close=True, reason=exc.reason
            )
        self.principal = principal
        self.state = State.COMPLETE
        reauthenticated = self._previous is not None
        self._previous = None
        self._scram = None
        lifetime = max(self.settings.reauth_ms_for(self.mechanism), 0)
        self.session_expires_ms = now_ms + lifetime if lifetime > 0 else None
        return Outcome(
            principal=principal,
            token=answer,
            session_lifetime_ms=lifetime,
            reauthenticated=reauthenticated,
        )

    # -- KIP-368 ------------------------------------------------------------------------

    def session_expired(self, now_ms: int) -> bool:
        """Has the authenticated session outlived its lifetime (Kafka's
        KafkaChannel.serverAuthenticationSessionExpired)?"""
        return self.session_expires_ms is not None and now_ms > self.session_expires_ms

    def begin_reauthentication(self, now_ms: int) -> bool:
        """A SaslHandshake on an authenticated connection: start re-authenticating
        (True), unless sessions do not expire or the last re-authentication began less
        than a second ago (False: the handshake is answered ILLEGAL_SASL_STATE by its
        handler, as Kafka's KafkaChannel.maybeBeginServerReauthentication)."""
        if not self.complete or self.session_expires_ms is None:
            return False
        last = self._last_reauth_start_ms
        if last is not None and now_ms - last < MIN_REAUTH_INTERVAL_MS:
            return False
        assert self.principal is not None and self.mechanism is not None
        self._last_reauth_start_ms = now_ms
        self._previous = (self.principal, self.mechanism)
        self.state = State.HANDSHAKE
        return True
