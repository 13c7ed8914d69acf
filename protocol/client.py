"""A small asyncio Kafka client: one connection, requests built from plain mappings.

spool's admin CLI and its wire tests use it to speak any API kio has a schema for.
Requests may be pipelined; responses are matched by correlation id.

A connection may use TLS and SASL as a Kafka client does (`ClientSecurity`, configured
with librdkafka's and the Java client's property names): TLS from Python's `ssl`, with
the broker's certificate checked against `ssl.ca.location` and, unless
`ssl.endpoint.identification.algorithm` is `none`, its host name; then, on SASL
listeners, Kafka's order: ApiVersions, SaslHandshake v1 naming the mechanism, and the
mechanism's tokens in SaslAuthenticate requests (KIP-152). PLAIN sends one token
(RFC 4616); SCRAM-SHA-256 and SCRAM-SHA-512 run RFC 5802's exchange with scramp's
ScramClient, which also checks the server's signature.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import ssl
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import scramp

from protocol import api
from protocol.errors import ErrorCode

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
PLAIN, SCRAM_SHA_256, SCRAM_SHA_512 = "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"
SASL_MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
ENDPOINT_IDENTIFICATION = ("https", "none")

SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36
SASL_HANDSHAKE_VERSION = 1  # v1: the tokens travel in SaslAuthenticate requests
SASL_AUTHENTICATE_VERSIONS = (0, 2)
API_VERSIONS_VERSION = 3


class ClientError(Exception):
    """The connection failed or the broker closed it."""


class SecurityConfigError(ValueError):
    """A client security setting that cannot work (a missing file, an unknown value);
    the message names the property, never a password."""


class AuthenticationError(ClientError):
    """The broker refused the SASL exchange: Kafka's error name and its message."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message


class TlsError(ClientError):
    """The TLS handshake failed (the broker's certificate, a plaintext port, ...)."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a client connection is secured, as Kafka's client properties say it:
    `security.protocol`, `sasl.mechanism` with a user and password, and the `ssl.*`
    files (PEM), or their PEM text as librdkafka's `ssl.ca.pem`, `ssl.certificate.pem`
    and `ssl.key.pem` take it (a broker's inter-broker client, from its
    ssl.truststore.certificates / ssl.keystore.certificate.chain / ssl.keystore.key).
    `password`, `ssl_key_password` and `ssl_key_pem` never appear in a repr."""

    protocol: str = PLAINTEXT
    mechanism: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_endpoint_identification: str = "https"
    ssl_ca_pem: str | None = dataclasses.field(default=None, repr=False)
    ssl_certificate_pem: str | None = dataclasses.field(default=None, repr=False)
    ssl_key_pem: str | None = dataclasses.field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    def validate(self) -> None:
        """SecurityConfigError naming the property when these settings cannot work."""
        if self.protocol not in SECURITY_PROTOCOLS:
            raise SecurityConfigError(
                f"security.protocol {self.protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if self.uses_sasl:
            if self.mechanism is None:
                raise SecurityConfigError(
                    f"security.protocol {self.protocol} needs sasl.mechanism (Kafka's default, "
                    f"GSSAPI, is not supported here): one of {', '.join(SASL_MECHANISMS)}"
                )
            if self.mechanism not in SASL_MECHANISMS:
                raise SecurityConfigError(
                    f"sasl.mechanism {self.mechanism!r} is not supported: "
                    f"use one of {', '.join(SASL_MECHANISMS)}"
                )
            if not self.username or self.password is None:
                raise SecurityConfigError(
                    f"sasl.mechanism {self.mechanism} needs a user and a password: "
                    "sasl.username and sasl.password, or sasl.jaas.config"
                )
        if self.ssl_endpoint_identification not in ENDPOINT_IDENTIFICATION:
            raise SecurityConfigError(
                "ssl.endpoint.identification.algorithm must be https or none, not "
                f"{self.ssl_endpoint_identification!r}"
            )
        if self.ssl_key_location is not None and self.ssl_certificate_location is None:
            raise SecurityConfigError("ssl.key.location needs ssl.certificate.location")
        if (self.ssl_certificate_pem is None) != (self.ssl_key_pem is None):
            raise SecurityConfigError("ssl.certificate.pem and ssl.key.pem go together")
        if self.ssl_certificate_pem is not None and self.ssl_certificate_location is not None:
            raise SecurityConfigError(
                "set ssl.certificate.location or ssl.certificate.pem, not both"
            )
        if self.uses_tls:
            self.ssl_context()

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: the CA from ssl.ca.location (else the system's), the client
        certificate if one is given, host name checks unless the algorithm is none."""
        try:
            context = ssl.create_default_context(
                cafile=self.ssl_ca_location, cadata=self.ssl_ca_pem
            )
        except FileNotFoundError:
            raise SecurityConfigError(
                f"ssl.ca.location {self.ssl_ca_location}: no such file"
            ) from None
        except (ssl.SSLError, OSError, ValueError) as exc:
            where = (
                f"ssl.ca.location {self.ssl_ca_location}: not a PEM file"
                if self.ssl_ca_location is not None
                else "ssl.ca.pem: not PEM text"
            )
            raise SecurityConfigError(f"{where} of CA certificates ({_reason(exc)})") from None
        if self.ssl_certificate_pem is not None and self.ssl_key_pem is not None:
            try:
                _load_pem_chain(
                    context, self.ssl_certificate_pem, self.ssl_key_pem, self.ssl_key_password
                )
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise SecurityConfigError(
                    "ssl.certificate.pem/ssl.key.pem: cannot load the client certificate "
                    f"and key (a wrong ssl.key.password?): {_reason(exc)}"
                ) from None
        if self.ssl_certificate_location is not None:
            try:
                context.load_cert_chain(
                    self.ssl_certificate_location,
                    self.ssl_key_location,
                    password=self.ssl_key_password,
                )
            except FileNotFoundError as exc:
                raise SecurityConfigError(
                    f"ssl.certificate.location/ssl.key.location: {exc.filename}: no such file"
                ) from None
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise SecurityConfigError(
                    "ssl.certificate.location/ssl.key.location: cannot load the client "
                    f"certificate and key (PEM; a wrong ssl.key.password?): {_reason(exc)}"
                ) from None
        if self.ssl_endpoint_identification == "none":
            context.check_hostname = False
        return context


def _load_pem_chain(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """Python's ssl loads a certificate chain and key from files only: write the PEM
    text to a private temporary directory, load it, and remove it."""
    with tempfile.TemporaryDirectory(prefix="spool-client-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "chain.pem"), os.path.join(tmp, "key.pem")
        for path, text in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
        context.load_cert_chain(cert_path, key_path, password=password)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).replace("_", " ").lower()
    return str(exc.args[-1] if exc.args else exc)


class KafkaClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.client_id = client_id
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, asyncio.Future[Any]]] = {}
        self.versions: dict[int, tuple[int, int]] = {}  # from api_versions()
        self._receiver = asyncio.create_task(self._receive())

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        client_id: str = "spool",
        security: ClientSecurity | None = None,
    ) -> KafkaClient:
        """Open a connection; with `security`, the TLS handshake (TlsError when it
        fails) and, on SASL, ApiVersions and the SASL exchange (AuthenticationError
        when the broker refuses), so the client returned is ready for any request."""
        if security is None or not security.uses_tls:
            reader, writer = await asyncio.open_connection(host, port)
        else:
            context = security.ssl_context()
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=context, server_hostname=host
                )
            except ssl.SSLCertVerificationError as exc:
                raise TlsError(
                    f"TLS handshake with {host}:{port} failed: the broker's certificate was "
                    f"refused ({exc.verify_message}); check ssl.ca.location"
                    + (
                        " or ssl.endpoint.identification.algorithm"
                        if "hostname" in (exc.verify_message or "").lower()
                        or "ip address" in (exc.verify_message or "").lower()
                        else ""
                    )
                ) from None
            except (ssl.SSLError, ConnectionResetError, ConnectionAbortedError) as exc:
                raise TlsError(
                    f"TLS handshake with {host}:{port} failed ({_reason(exc)}): is it a "
                    "SSL or SASL_SSL listener? security.protocol must match the listener"
                ) from None
        client = cls(reader, writer, client_id)
        if security is not None and security.uses_sasl:
            try:
                versions = await client.api_versions()
                await client.authenticate(security, versions)
            except BaseException:
                await client.close()
                raise
        return client

    async def api_versions(self, timeout_s: float = 30) -> dict[int, tuple[int, int]]:
        """ApiVersions v3: the broker's (min, max) version per api key."""
        resp = await self.request(
            api.API_VERSIONS_KEY,
            API_VERSIONS_VERSION,
            {"client_software_name": "spool", "client_software_version": "0.1.0"},
            timeout_s,
        )
        if resp.error_code != ErrorCode.none:
            raise ClientError(f"ApiVersions refused: {ErrorCode(resp.error_code).name.upper()}")
        self.versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys
        }
        return self.versions

    async def authenticate(
        self,
        security: ClientSecurity,
        versions: Mapping[int, tuple[int, int]],
        timeout_s: float = 30,
    ) -> None:
        """SaslHandshake v1 and SaslAuthenticate, as Kafka's clients send them after
        ApiVersions. AuthenticationError carries the broker's error and message."""
        mechanism, username, password = security.mechanism, security.username, security.password
        assert mechanism is not None and username is not None and password is not None
        if SASL_HANDSHAKE_KEY not in versions or SASL_AUTHENTICATE_KEY not in versions:
            raise AuthenticationError(
                "ILLEGAL_SASL_STATE",
                "the listener does not offer SASL: is it a SASL_PLAINTEXT or SASL_SSL "
                "listener? security.protocol must match the listener",
            )
        low, high = versions[SASL_AUTHENTICATE_KEY]
        version = min(high, SASL_AUTHENTICATE_VERSIONS[1])
        if version < max(low, SASL_AUTHENTICATE_VERSIONS[0]):
            raise AuthenticationError(
                "UNSUPPORTED_VERSION", f"the broker supports SaslAuthenticate v{low}-v{high}"
            )
        try:
            handshake = await self.request(
                SASL_HANDSHAKE_KEY, SASL_HANDSHAKE_VERSION, {"mechanism": mechanism}, timeout_s
            )
        except ClientError as exc:
            raise AuthenticationError(
                "ILLEGAL_SASL_STATE",
                f"the broker closed the connection at SaslHandshake ({exc}): is it a SASL "
                "listener? security.protocol must match the listener",
            ) from None
        code = ErrorCode(handshake.error_code)
        if code == ErrorCode.unsupported_sasl_mechanism:
            raise AuthenticationError(
                "UNSUPPORTED_SASL_MECHANISM",
                f"the listener does not enable sasl.mechanism {mechanism}; it enables "
                f"{', '.join(handshake.mechanisms) or 'none'}",
            )
        if code != ErrorCode.none:
            raise AuthenticationError(code.name.upper(), f"SaslHandshake({mechanism}) refused")
        if mechanism == PLAIN:
            await self._sasl_token(f"\x00{username}\x00{password}".encode(), version, timeout_s)
            return
        scram = scramp.ScramClient([mechanism], username, password)
        server_first = await self._sasl_token(scram.get_client_first().encode(), version, timeout_s)
        try:
            scram.set_server_first(server_first.decode("utf-8"))
            client_final = scram.get_client_final()
        except (scramp.ScramException, UnicodeDecodeError, ValueError) as exc:
            raise AuthenticationError(
                "SASL_AUTHENTICATION_FAILED", f"bad SCRAM server-first message: {exc}"
            ) from None
        server_final = await self._sasl_token(client_final.encode(), version, timeout_s)
        try:
            scram.set_server_final(server_final.decode("utf-8"))
        except (scramp.ScramException, UnicodeDecodeError, ValueError) as exc:
            raise AuthenticationError(
                "SASL_AUTHENTICATION_FAILED",
                f"the broker's SCRAM signature did not verify: {exc}",
            ) from None

    async def _sasl_token(self, token: bytes, version: int, timeout_s: float) -> bytes:
        try:
            resp = await self.request(
                SASL_AUTHENTICATE_KEY, version, {"auth_bytes": token}, timeout_s
            )
        except ClientError as exc:
            raise AuthenticationError(
                "SASL_AUTHENTICATION_FAILED",
                f"the broker closed the connection during SaslAuthenticate ({exc})",
            ) from None
        code = ErrorCode(resp.error_code)
        if code != ErrorCode.none:
            raise AuthenticationError(
                code.name.upper(), resp.error_message or f"SaslAuthenticate refused ({code.name})"
            )
        return bytes(resp.auth_bytes)

    @property
    def closed(self) -> bool:
        """The connection has ended (the broker closed it, it failed, or `close`)."""
        return self._receiver.done()

    async def request(
        self, api_key: int, version: int, body: Mapping[str, Any] | Any, timeout_s: float = 30
    ) -> Any:
        """Send one request and return the decoded response entity. ClientError when the
        connection has ended (before or while waiting); TimeoutError after `timeout_s`."""
        if isinstance(body, Mapping):
            body = api.build(api.request_class(api_key, version), body)
        if self.closed:
            raise ClientError("connection closed")
        correlation_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (api_key, version, future)
        try:
            self._writer.write(
                api.encode_request(api_key, version, correlation_id, self.client_id, body)
            )
            await self._writer.drain()
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            # Answered, failed or timed out: a late answer is dropped by the receiver.
            self._pending.pop(correlation_id, None)

    async def _receive(self) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await self._reader.readexactly(4))
                frame = await self._reader.readexactly(size)
                (correlation_id,) = struct.unpack_from(">i", frame, 0)
                pending = self._pending.pop(correlation_id, None)
                if pending is None:
                    continue
                api_key, version, future = pending
                try:
                    _, body = api.decode_response(api_key, version, frame)
                    if not future.done():
                        future.set_result(body)
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
        except (asyncio.IncompleteReadError, OSError) as exc:  # OSError: ssl.SSLError too
            error = ClientError(f"connection closed: {_reason(exc) or exc}")
        except asyncio.CancelledError:
            error = ClientError("client closed")
        for _, _, future in self._pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # the waiter re-raises it; nobody else must
        self._pending.clear()

    async def close(self) -> None:
        self._receiver.cancel()
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
