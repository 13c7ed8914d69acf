"""The TCP listener and per-connection request loop.

Each connection reads size-prefixed frames, decodes the header, and starts one task
per request so that pipelined requests overlap (a produce waiting for its fsync does
not stall the next one), while responses are written strictly in request order.

No client can exhaust the broker, with Kafka's socket-server settings:
- `socket.request.max.bytes` is checked on the size prefix, before any body byte.
- `queued.max.request.bytes` bounds the bytes of requests being read or waiting to be
  handled across all connections (Kafka's memory pool): a frame's size is reserved when
  its prefix is read, in arrival order, and a connection whose frame does not fit is not
  read until bytes are released (its handler finished).
- `connections.max.idle.ms` closes connections with no complete request received and
  nothing in flight for that long: a frame trickled in a byte at a time is idle.
- `max.connections` / `max.connections.per.ip` (and its overrides) close a new
  connection over a limit right after accept, sending nothing.
- A request whose header cannot be parsed, or whose body `dispatch` reports as
  malformed, closes its connection: Kafka does not answer what it cannot parse.
- A handler raising `CloseConnection` (a Produce with acks=0 that failed) closes its
  connection once the answers to the requests before it are sent.
Listeners (Kafka's `listeners`, broker.listeners): the server listens on each at once,
with the limits above shared by all. A connection carries a `SecurityContext` (the
listener, its security protocol and the principal, broker.security) into every request.
On an SSL listener the server accepts the socket itself, peeks at its first byte (a TLS
record starts with 0x16) and then runs the handshake, bounded by the handshake timeout:
plaintext sent to an SSL port, a TLS client hello sent to a PLAINTEXT port, or a failed
handshake (e.g. no client certificate with `ssl.client.auth=required`) closes that
connection with one log line, and everyone else is served as before.
On a SASL listener (SASL_PLAINTEXT, or SASL_SSL after the TLS handshake) the connection
authenticates first (broker.sasl, Kafka's SaslServerAuthenticator): it answers
SaslHandshake and SaslAuthenticate itself, passes ApiVersions on, and closes on any other
request; once authenticated its principal is the SASL user, and requests are served.
With `connections.max.reauth.ms` (KIP-368) a SaslHandshake on an authenticated
connection starts re-authenticating it, and a connection whose session expired is closed
at its next other request (Kafka's SocketServer), by the server's clock. SCRAM
credentials are read through `Server.scram_lookup` (the broker's metadata).
Running out of file descriptors: a connection whose descriptor is among the last
hundredth of the open-file limit (at least 16) is closed at once, keeping those for
the broker's own files; past that, uvloop (libuv) accepts and closes connections it has
no descriptor for (it keeps a spare one for that), so they are refused, not left
hanging in the backlog. `raise_open_file_limit` lifts the soft limit at startup.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import ipaddress
import itertools
import resource
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog

from broker import sasl, trace
from broker.listeners import ListenerConfig
from broker.security import PLAINTEXT_CONTEXT, SecurityContext, principal_of_peer_cert
from persister.clock import SYSTEM_CLOCK, Clock, Timer, ms_of, wait_all
from protocol import api, request_check
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.config import BrokerConfig

log = structlog.get_logger("spool.server")

# Requests a single connection may have in flight before the broker stops reading
# from it (back-pressure instead of unbounded memory).
MAX_IN_FLIGHT_PER_CONNECTION = 32

INT_MAX = 2**31 - 1

# Descriptors new connections may not take, so the broker itself can still open files
# (a segment roll, a clean close, importing a schema module on first use) once clients
# have taken the rest; partition creation keeps more free (broker.partitions).
MIN_FREE_FILES_FOR_CONNECTIONS = 16

_connection_ids = itertools.count(1)

# The first byte of a TLS record carrying a handshake (a client hello), and the record
# version's first byte (3 for SSLv3 through TLS 1.3).
TLS_HANDSHAKE_RECORD = 0x16
TLS_RECORD_MAJOR_VERSION = 0x03
# The longest a new SSL connection may take to send its first byte and finish its
# handshake (asyncio's default); connections.max.idle.ms shortens it when lower.
TLS_HANDSHAKE_TIMEOUT_MS = 60000


@dataclass(slots=True, frozen=True)
class Endpoint:
    """A host and port: where the listener binds, or what the broker advertises."""

    host: str
    port: int


class CloseConnection(Exception):
    """Raised by a handler whose request has no answer but must not be ignored: the
    connection closes after the answers before it, as Kafka's
    RequestChannel.closeConnection (a Produce with acks=0 that failed, so that the
    producer notices and refreshes its metadata). `response` is what would have been
    answered, for the metrics."""

    def __init__(self, reason: str, response: object = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response


@dataclass(slots=True, frozen=True)
class RequestContext:
    header: api.RequestHeader
    client_host: str
    connection_id: int
    # The listener the connection came in on and who is on the other end.
    security: SecurityContext = PLAINTEXT_CONTEXT

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def listener(self) -> str:
        return self.security.listener


Dispatch = Callable[[RequestContext, bytes, int], Awaitable[bytes | None]]


# -- limits and counters ----------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ServerLimits:
    """Kafka's socket-server settings, checked against each other (KafkaConfig does)."""

    max_request_bytes: int = 104857600
    queued_max_request_bytes: int = -1
    connections_max_idle_ms: int = 600000
    max_connections: int = INT_MAX
    max_connections_per_ip: int = INT_MAX
    max_connections_per_ip_overrides: dict[str, int] = field(default_factory=dict)
    # sasl.server.max.receive.size: the largest frame read before SASL authentication.
    sasl_max_receive_bytes: int = 524288

    def __post_init__(self) -> None:
        if 0 < self.queued_max_request_bytes < self.max_request_bytes:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"queued.max.request.bytes ({self.queued_max_request_bytes}) must be at least "
                f"socket.request.max.bytes ({self.max_request_bytes}) so that any request "
                "fits, or -1 for no limit",
            )
        if self.max_connections_per_ip == 0 and not self.max_connections_per_ip_overrides:
            raise KafkaError(
                ErrorCode.invalid_config,
                "max.connections.per.ip can be 0 only if max.connections.per.ip.overrides "
                "names the addresses allowed to connect",
            )

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ServerLimits:
        """The limits in `config`; KafkaError(INVALID_CONFIG) saying what is wrong."""
        return cls(
            max_request_bytes=config.get("socket.request.max.bytes"),
            queued_max_request_bytes=config.get("queued.max.request.bytes"),
            connections_max_idle_ms=config.get("connections.max.idle.ms"),
            max_connections=config.get("max.connections"),
            max_connections_per_ip=config.get("max.connections.per.ip"),
            max_connections_per_ip_overrides=parse_ip_overrides(
                config.get("max.connections.per.ip.overrides") or ""
            ),
            sasl_max_receive_bytes=config.get("sasl.server.max.receive.size"),
        )

    def max_connections_for(self, host: str) -> int:
        return self.max_connections_per_ip_overrides.get(host, self.max_connections_per_ip)


def parse_ip_overrides(text: str) -> dict[str, int]:
    """`host:count,...` (Kafka's max.connections.per.ip.overrides): address -> count.

    Host names are resolved once, here, to every address they have (as Kafka resolves
    them when the config is read).
    """
    out: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, count = entry.rpartition(":")
        host = host.strip().strip("[]")
        if not sep or not host or not count.strip().isdigit():
            raise KafkaError(
                ErrorCode.invalid_config,
                f"max.connections.per.ip.overrides: expected host:count, got {entry!r}",
            )
        try:
            addresses = {_normal_address(host)}
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except OSError as exc:
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"max.connections.per.ip.overrides: cannot resolve {host!r}: {exc}",
                ) from None
            addresses = {_normal_address(str(info[4][0])) for info in infos}
        for address in addresses:
            out[address] = int(count)
    return out


def _normal_address(host: str) -> str:
    """An IP literal in one spelling (IPv4-mapped IPv6 as IPv4); ValueError otherwise."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _peer_host(peer: Any) -> str:
    if not peer:
        return "unknown"
    host = str(peer[0])
    try:
        return _normal_address(host)
    except ValueError:
        return host


@dataclass(slots=True)
class ServerStats:
    """Counters for operators (exported by the metrics endpoint later)."""

    connections_open: int = 0
    connections_accepted: int = 0
    # reason ("max.connections", "max.connections.per.ip", "open.files") -> connections
    # closed at accept
    connections_refused: collections.Counter[str] = field(default_factory=collections.Counter)
    idle_closed: int = 0
    malformed_closed: int = 0  # header or body could not be parsed, or has no schema
    oversized_closed: int = 0  # size prefix above socket.request.max.bytes (or below 8)
    # TLS sent to a PLAINTEXT listener, or plaintext to an SSL one
    security_mismatch_closed: int = 0
    # SASL: failed authentications (bad credentials or mechanism, malformed tokens) and
    # requests sent before authenticating; each closed its connection.
    sasl_authentication_failed: int = 0
    sasl_unexpected_request_closed: int = 0
    # KIP-368: re-authentications completed, and connections closed for sending a
    # request after their session expired (Kafka's expired-connections-killed-count).
    sasl_reauthentications: int = 0
    expired_connections_killed: int = 0
    tls_handshake_failed: int = 0  # includes handshakes that timed out
    queued_bytes: int = 0
    queued_bytes_max: int = 0


# -- the request byte budget (queued.max.request.bytes) ------------------------------------

W = TypeVar("W")


class ByteBudget(Generic[W]):
    """Bytes reserved by requests being read or waiting to be handled; sans-IO.

    A reservation is granted at once if it fits and nobody is waiting, else it waits in
    arrival order (no overtaking, so a large request is not starved by small ones).
    Reserving a frame's whole size before reading it means a frame once started can
    always be finished: connections never deadlock holding halves of frames. A
    reservation larger than the limit is granted when nothing else is reserved.
    `limit` <= 0 means no limit (Kafka's default, -1).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit if limit > 0 else None
        self.reserved = 0
        self.max_reserved = 0
        self._waiting: collections.deque[tuple[int, W]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Reservations waiting: while any are, their connections are not read."""
        return len(self._waiting)

    def try_acquire(self, n: int) -> bool:
        if self._waiting or not self._fits(n):
            return False
        self._take(n)
        return True

    def wait(self, n: int, waiter: W) -> None:
        """Queue a reservation `try_acquire` refused; `release` hands back its waiter."""
        self._waiting.append((n, waiter))

    def cancel(self, waiter: W) -> bool:
        """Withdraw a queued reservation; False if it was already granted (release it)."""
        for item in self._waiting:
            if item[1] is waiter:
                self._waiting.remove(item)
                return True
        return False

    def release(self, n: int) -> list[W]:
        """Return `n` bytes; the waiters now granted, in arrival order."""
        self.reserved -= n
        granted: list[W] = []
        while self._waiting and self._fits(self._waiting[0][0]):
            size, waiter = self._waiting.popleft()
            self._take(size)
            granted.append(waiter)
        return granted

    def _fits(self, n: int) -> bool:
        return self.limit is None or self.reserved + n <= self.limit or self.reserved == 0

    def _take(self, n: int) -> None:
        self.reserved += n
        self.max_reserved = max(self.max_reserved, self.reserved)


# -- idle connections (connections.max.idle.ms) ------------------------------------------


class IdleTracker:
    """Finds connections idle for `max_idle_ms` and hands them to `on_idle`.

    Activity is a complete request received or a request finished (its response
    sent); a connection with a request in flight, such as a long-poll Fetch parked for
    its MaxWaitMs, is never idle. Bytes of a frame that never completes are not
    activity, so a slowloris connection ages like a silent one. Connections with
    nothing in flight are kept oldest activity first (Kafka's Selector keeps an LRU map
    the same way), so a sweep looks only at the ones due. A negative `max_idle_ms`
    disables the check, as in Kafka.
    """

    def __init__(self, clock: Clock, max_idle_ms: int, on_idle: Callable[[int, int], None]) -> None:
        self.clock = clock
        self.max_idle_ms = max_idle_ms
        self.on_idle = on_idle  # (connection id, idle ms)
        self._idle: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._in_flight: dict[int, int] = {}
        self._timer: Timer | None = None

    @property
    def enabled(self) -> bool:
        return self.max_idle_ms >= 0

    def start(self) -> None:
        if self.enabled and self._timer is None:
            self._arm(self.clock.now_ms() + self.max_idle_ms)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def opened(self, conn: int) -> None:
        self._idle[conn] = self.clock.now_ms()

    def request_received(self, conn: int) -> None:
        if conn in self._in_flight:
            self._in_flight[conn] += 1
        elif self._idle.pop(conn, None) is not None:
            self._in_flight[conn] = 1

    def request_done(self, conn: int) -> None:
        count = self._in_flight.get(conn)
        if count is None:
            return
        if count > 1:
            self._in_flight[conn] = count - 1
        else:
            del self._in_flight[conn]
            self._idle[conn] = self.clock.now_ms()

    def closed(self, conn: int) -> None:
        self._idle.pop(conn, None)
        self._in_flight.pop(conn, None)

    def _arm(self, at_ms: int) -> None:
        self._timer = self.clock.call_at(at_ms, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = self.clock.now_ms()
        while self._idle:
            conn, last = next(iter(self._idle.items()))
            if now - last < self.max_idle_ms:
                break
            del self._idle[conn]
            self.on_idle(conn, now - last)
        # Anything that becomes idle later is due no sooner than now + max_idle_ms.
        oldest = next(iter(self._idle.values()), now)
        self._arm(oldest + self.max_idle_ms)


# -- the open-file limit -------------------------------------------------------------------


def raise_open_file_limit() -> tuple[int, int]:
    """Lift RLIMIT_NOFILE's soft limit to the hard limit; returns (soft, hard) after.

    Each partition holds open files and each connection a socket; the soft limit that
    shells hand out (often 1024) is far below what a broker needs.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # NOFILE cannot be infinite: the kernel caps it at fs.nr_open.
        try:
            with open("/proc/sys/fs/nr_open") as fh:
                target = int(fh.read())
        except (OSError, ValueError):
            target = soft
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("open_file_limit_not_raised", soft=soft, hard=hard, error=str(exc))
            return soft, hard
        log.info("open_file_limit_raised", previous=soft, now=target, hard=hard)
        return target, hard
    log.info("open_file_limit", soft=soft, hard=hard)
    return soft, hard


# -- the server ------------------------------------------------------------------------------


class Server:
    def __init__(
        self,
        host: str,
        port: int,
        dispatch: Dispatch,
        *,
        limits: ServerLimits | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Sequence[ListenerConfig] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        # `host` and `port` are one PLAINTEXT listener unless `listeners` are given.
        self.listeners: tuple[ListenerConfig, ...] = tuple(
            listeners or (ListenerConfig.plaintext(host, port),)
        )
        # Listener name -> the port it is bound to, once started.
        self.bound_ports: dict[str, int] = {}
        self.dispatch = dispatch
        self.limits = limits or ServerLimits()
        self.clock = clock
        self.stats = ServerStats()
        self.budget: ByteBudget[asyncio.Future[None]] = ByteBudget(
            self.limits.queued_max_request_bytes
        )
        self.idle = IdleTracker(clock, self.limits.connections_max_idle_ms, self._close_idle)
        self._servers: list[asyncio.base_events.Server] = []
        self._accept_sockets: list[socket.socket] = []
        self._handshakes: set[asyncio.Task[None]] = set()
        # Called with the connection id when a client connection closes.
        self.on_disconnect: Callable[[int], None] | None = None
        # (user, mechanism) -> SCRAM credential, for SASL/SCRAM (the broker's metadata).
        self.scram_lookup: sasl.ScramLookup = sasl.NO_SCRAM_USERS
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[int, Connection] = {}
        self._per_ip: collections.Counter[str] = collections.Counter()
        self.open_file_limit = INT_MAX  # RLIMIT_NOFILE's soft limit, read at start

    @property
    def max_request_bytes(self) -> int:
        return self.limits.max_request_bytes

    @property
    def handshake_timeout_s(self) -> float:
        idle_ms = self.limits.connections_max_idle_ms
        limit = TLS_HANDSHAKE_TIMEOUT_MS if idle_ms < 0 else min(idle_ms, TLS_HANDSHAKE_TIMEOUT_MS)
        return max(limit, 1) / 1000

    async def start(self) -> None:
        """Bind every listener (all or none: a failure closes those already bound)."""
        try:
            for listener in self.listeners:
                await self._start_listener(listener)
        except BaseException:
            self._close_listeners()
            raise
        self.port = self.bound_ports[self.listeners[0].name]
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            self.open_file_limit = soft
        self.idle.start()
        limits = self.limits
        log.info(
            "listening",
            listeners=[
                f"{lc.name}://{lc.host}:{self.bound_ports[lc.name]} ({lc.security_protocol})"
                for lc in self.listeners
            ],
            socket_request_max_bytes=limits.max_request_bytes,
            queued_max_request_bytes=limits.queued_max_request_bytes,
            connections_max_idle_ms=limits.connections_max_idle_ms,
            max_connections=limits.max_connections,
            max_connections_per_ip=limits.max_connections_per_ip,
        )

    async def _start_listener(self, listener: ListenerConfig) -> None:
        host = listener.host or None  # an empty host binds every interface
        if listener.tls is None:
            server = await asyncio.start_server(
                functools.partial(self._on_connect, listener),
                host,
                listener.port,
                reuse_address=True,
                backlog=1024,
            )
            self._servers.append(server)
            self.bound_ports[listener.name] = server.sockets[0].getsockname()[1]
            return
        context = listener.tls.context()
        family = socket.AF_INET6 if host is not None and ":" in host else socket.AF_INET
        sock = socket.create_server((host or "", listener.port), family=family, backlog=1024)
        sock.setblocking(False)
        self._accept_sockets.append(sock)
        self.bound_ports[listener.name] = sock.getsockname()[1]
        task = asyncio.create_task(self._accept_loop(listener, sock, context))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    def _close_listeners(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._handshakes):
            task.cancel()
        for sock in self._accept_sockets:
            sock.close()
        self._accept_sockets.clear()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (for up to `grace_s` on the
        clock; those still running then are cancelled), then close connections."""
        self._close_listeners()
        self.idle.stop()
        for conn in list(self._live.values()):
            conn.stop_reading()
        # Both bounds are on the server's clock (the broker's), so a ManualClock drives
        # them in tests.
        pending = await wait_all(self.clock, list(self._tasks), ms_of(grace_s))
        for task in pending:
            task.cancel()
        if pending:
            await wait_all(self.clock, pending, 1000)

    # -- accept ---------------------------------------------------------------------

    def refusal(self, host: str, fd: int) -> tuple[str, int] | None:
        """The limit a new connection from `host` on descriptor `fd` exceeds, if any."""
        # Descriptors are allocated lowest first, so a number this high means nearly
        # all below it are open.
        reserve = max(MIN_FREE_FILES_FOR_CONNECTIONS, self.open_file_limit // 100)
        if fd >= self.open_file_limit - reserve:
            return "open.files", self.open_file_limit
        limits = self.limits
        if self.stats.connections_open >= limits.max_connections:
            return "max.connections", limits.max_connections
        per_ip = limits.max_connections_for(host)
        if self._per_ip[host] >= per_ip:
            return "max.connections.per.ip", per_ip
        return None

    def _admit(self, host: str, fd: int) -> bool:
        """Whether a new connection is within the limits; counts and logs a refusal."""
        refused = self.refusal(host, fd)
        if refused is None:
            return True
        # Kafka closes such a connection without a word (Kafka's acceptor waits for a
        # slot at the broker-wide limit instead; an asyncio server cannot pause
        # accepting, so every limit closes).
        reason, limit = refused
        self.stats.connections_refused[reason] += 1
        log.warning("connection_refused", client=host, reason=reason, limit=limit)
        return False

    async def _on_connect(
        self,
        listener: ListenerConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host = _peer_host(writer.get_extra_info("peername"))
        sock = writer.get_extra_info("socket")
        if not self._admit(host, sock.fileno() if sock is not None else -1):
            writer.transport.abort()
            return
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Responses are written whole: Nagle would hold a small one back until the
            # client's delayed ACK (up to 40 ms). asyncio and uvloop set this too; being
            # explicit keeps it whatever the loop.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        security = SecurityContext(listener.name, listener.security_protocol)
        self._opened(host)
        try:
            await self._serve(reader, writer, host, security, listener.sasl)
        finally:
            self._closed(host)

    # -- SSL listeners --------------------------------------------------------------

    async def _accept_loop(
        self, listener: ListenerConfig, sock: socket.socket, context: ssl.SSLContext
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, peer = await loop.sock_accept(sock)
            except OSError as exc:
                # Out of descriptors (EMFILE) or a connection reset before accept:
                # back off a little rather than spin.
                log.warning("accept_failed", listener=listener.name, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._on_tls_connect(listener, context, client, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _on_tls_connect(
        self,
        listener: ListenerConfig,
        context: ssl.SSLContext,
        client: socket.socket,
        peer: Any,
    ) -> None:
        host = _peer_host(peer)
        if not self._admit(host, client.fileno()):
            client.close()
            return
        self._opened(host)
        try:
            await self._tls_handshake_and_serve(listener, context, client, host)
        finally:
            self._closed(host)

    async def _tls_handshake_and_serve(
        self,
        listener: ListenerConfig,
        context: ssl.SSLContext,
        client: socket.socket,
        host: str,
    ) -> None:
        client.setblocking(False)
        if client.family in (socket.AF_INET, socket.AF_INET6):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        timeout_s = self.handshake_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                first = await _peek_first_byte(client)
        except asyncio.CancelledError:  # the server is stopping
            client.close()
            raise
        except (TimeoutError, OSError) as exc:
            self.stats.tls_handshake_failed += 1
            log.warning(
                "tls_handshake_failed",
                listener=listener.name,
                client=host,
                error=str(exc) or "no data within the handshake timeout",
            )
            client.close()
            return
        if first != TLS_HANDSHAKE_RECORD:
            if first is not None:
                self.stats.security_mismatch_closed += 1
                log.warning(
                    "plaintext_on_ssl_listener",
                    listener=listener.name,
                    client=host,
                    first_byte=first,
                    hint="the client did not start a TLS handshake: set "
                    "security.protocol=SSL on the client, or use a PLAINTEXT listener",
                )
            client.close()
            return
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, client, ssl=context, ssl_handshake_timeout=timeout_s
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            # The transport closed the socket.
            self.stats.tls_handshake_failed += 1
            log.warning(
                "tls_handshake_failed",
                listener=listener.name,
                client=host,
                error=str(exc) or type(exc).__name__,
            )
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        cipher = transport.get_extra_info("cipher")
        security = SecurityContext(
            listener.name,
            listener.security_protocol,
            principal_of_peer_cert(transport.get_extra_info("peercert")),
            tls_version=cipher[1] if cipher else None,
            cipher=cipher[0] if cipher else None,
        )
        task = asyncio.current_task()
        assert task is not None
        self._handshakes.discard(task)
        await self._serve(reader, writer, host, security, listener.sasl)

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        security: SecurityContext,
        sasl_settings: sasl.SaslSettings | None = None,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = Connection(self, reader, writer, host, security, sasl_settings)
        conn.log.debug(
            "connection_opened",
            listener=security.listener,
            security_protocol=security.security_protocol,
            principal=str(security.principal),
            tls_version=security.tls_version,
            cipher=security.cipher,
        )
        self._live[conn.id] = conn
        self._tasks.add(task)
        self.idle.opened(conn.id)
        try:
            await conn.run()
        finally:
            self._tasks.discard(task)
            self._live.pop(conn.id, None)
            self.idle.closed(conn.id)

    def _opened(self, host: str) -> None:
        """Count a connection admitted (on an SSL listener, from before its handshake,
        so handshakes in progress count against the connection limits too)."""
        self.stats.connections_accepted += 1
        self.stats.connections_open += 1
        self._per_ip[host] += 1

    def _closed(self, host: str) -> None:
        self.stats.connections_open -= 1
        self._per_ip[host] -= 1
        if self._per_ip[host] <= 0:
            del self._per_ip[host]

    def _close_idle(self, connection_id: int, idle_ms: int) -> None:
        conn = self._live.get(connection_id)
        if conn is None:
            return
        self.stats.idle_closed += 1
        conn.log.info(
            "idle_connection_closed",
            idle_ms=idle_ms,
            max_idle_ms=self.limits.connections_max_idle_ms,
        )
        conn.close()

    # -- the byte budget ----------------------------------------------------------

    async def reserve(self, n: int) -> None:
        """Reserve `n` request bytes, waiting (not reading) while the budget is full."""
        budget = self.budget
        if budget.try_acquire(n):
            self._note_queued()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not budget.waiting:
            log.warning(
                "request_reading_paused",
                queued_bytes=budget.reserved,
                queued_max_request_bytes=budget.limit,
                hint="queued.max.request.bytes is reached; reading resumes as requests finish",
            )
        budget.wait(n, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if not budget.cancel(waiter):
                self.release(n)
            raise

    def release(self, n: int) -> None:
        budget = self.budget
        was_waiting = budget.waiting
        for waiter in budget.release(n):
            if not waiter.done():
                waiter.set_result(None)
        if was_waiting and not budget.waiting:
            log.info("request_reading_resumed", queued_bytes=budget.reserved)
        self._note_queued()

    def _note_queued(self) -> None:
        self.stats.queued_bytes = self.budget.reserved
        self.stats.queued_bytes_max = self.budget.max_reserved


class Connection:
    def __init__(
        self,
        server: Server,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_host: str,
        security: SecurityContext = PLAINTEXT_CONTEXT,
        sasl_settings: sasl.SaslSettings | None = None,
    ) -> None:
        self.server = server
        # Set until the client has authenticated on a SASL listener.
        self.sasl: sasl.SaslAuthenticator | None = (
            None
            if sasl_settings is None
            else sasl.SaslAuthenticator(sasl_settings, server.scram_lookup)
        )
        self.reader = reader
        self.writer = writer
        self.client_host = client_host
        self.security = security
        self._first_frame = True
        self.id = next(_connection_ids)
        self.log = log.bind(connection=self.id, client=self.client_host)
        # Responses in request order: each entry resolves to the frame to send (or None).
        self._responses: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT_PER_CONNECTION)
        self._stopping = False
        self._read_task: asyncio.Task[None] | None = None
        # The request task whose handler raised CloseConnection: the last one answered.
        self._close_after: asyncio.Task[bytes | None] | None = None

    def stop_reading(self) -> None:
        """Shutdown: read no further requests; those in flight still get answers."""
        self._stopping = True
        if self._read_task is not None:
            self._read_task.cancel()

    def close(self) -> None:
        """Close now: read nothing more, send nothing more."""
        self.stop_reading()
        self.writer.close()

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_loop())
        sender.add_done_callback(self._sender_done)
        self._read_task = asyncio.create_task(self._read_loop())
        try:
            await asyncio.wait([self._read_task])
            if not self._read_task.cancelled():
                exc = self._read_task.exception()
                if exc is not None and not isinstance(exc, ConnectionError):
                    self.log.error("connection_failed", error=repr(exc))
            self._responses.put_nowait(None)
            await sender
        except asyncio.CancelledError:
            self._read_task.cancel()
            sender.cancel()
            raise
        except ConnectionError:
            pass
        finally:
            self.writer.close()
            if self.server.on_disconnect is not None:
                self.server.on_disconnect(self.id)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        # A failed write (peer gone) ends the connection: stop reading requests whose
        # answers could not be sent anyway.
        if not task.cancelled() and task.exception() is not None:
            self.close()

    async def _read_loop(self) -> None:
        while not self._stopping:
            await self._slots.acquire()
            queued = False
            try:
                queued = await self._read_request()
            finally:
                if not queued:
                    self._slots.release()
            if not queued:
                return

    async def _read_request(self) -> bool:
        """Read one request and start its handler; False when the connection is done."""
        server = self.server
        try:
            size_bytes = await self.reader.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.log.warning("truncated_frame", received=len(exc.partial))
            return False
        if self._first_frame:
            self._first_frame = False
            if (
                size_bytes[0] == TLS_HANDSHAKE_RECORD
                and size_bytes[1] == TLS_RECORD_MAJOR_VERSION
                and self.security.tls_version is None
            ):
                # A TLS client hello: as a size this is over 369 MB, and no Kafka
                # client opens with such a request.
                server.stats.security_mismatch_closed += 1
                self.log.warning(
                    "tls_on_plaintext_listener",
                    listener=self.security.listener,
                    hint="the client started a TLS handshake on a PLAINTEXT listener: use "
                    "the SSL listener's port, or security.protocol=PLAINTEXT on the client",
                )
                self.close()
                return False
        (size,) = struct.unpack(">i", size_bytes)
        # After a SaslHandshake v0 the next frame is a bare SASL token, not a request.
        raw_token = self.sasl is not None and self.sasl.expects_raw_token
        # Before authentication (Kafka's SaslServerAuthenticator): frames up to
        # sasl.server.max.receive.size only.
        authenticating = self.sasl is not None and not self.sasl.complete
        max_bytes = (
            min(server.max_request_bytes, server.limits.sasl_max_receive_bytes)
            if authenticating
            else server.max_request_bytes
        )
        if size < (0 if raw_token else 8) or size > max_bytes:
            # The stream cannot be resynchronised after a bad size, as in Kafka's
            # InvalidReceiveException: log and close before reading any of the body.
            server.stats.oversized_closed += 1
            self.log.warning(
                "invalid_frame_size",
                size=size,
                max_bytes=max_bytes,
                hint="size prefix is below a request header or above "
                + (
                    "sasl.server.max.receive.size (the client has not authenticated)"
                    if authenticating
                    else "socket.request.max.bytes"
                ),
            )
            self.close()
            return False
        await server.reserve(size)
        handed_off = False
        try:
            frame = await self._read_body(size)
            if frame is None:
                return False
            if raw_token:
                return self._sasl_raw_token(frame)
            parsed = self._parse_header(frame)
            if parsed is None:
                self.close()
                return False
            header, body_offset = parsed
            if self.sasl is not None and self.sasl.complete and not self._session_live(header):
                return False
            if self.sasl is not None and not self.sasl.complete:
                answered = self._sasl_request(header, frame, body_offset)
                if answered is not None:
                    return answered
            server.idle.request_received(self.id)
            received_ns = trace.now_ns() if trace.ENABLED else 0
            task = asyncio.create_task(self._handle(header, frame, body_offset, received_ns))
            task.add_done_callback(lambda _: server.release(size))
            handed_off = True
            self._responses.put_nowait(task)
            return True
        finally:
            if not handed_off:
                server.release(size)

    # -- SASL (before authentication) ----------------------------------------------

    def _queue_answer(self, frame: bytes | None) -> None:
        """Queue an answer made at read time, in order with the requests before it."""
        self.server.idle.request_received(self.id)
        self._responses.put_nowait(asyncio.create_task(_ready(frame)))

    def _finish_after_answer(self) -> None:
        """Read nothing more: the answers queued are sent, then the connection closes."""
        self._stopping = True

    def _session_live(self, header: api.RequestHeader) -> bool:
        """KIP-368 on an authenticated connection: a SaslHandshake may start
        re-authentication; any other request after the session expired closes the
        connection (False), as Kafka's SocketServer does."""
        auth = self.sasl
        assert auth is not None
        now = self.server.clock.now_ms()
        if header.api_key == sasl.SASL_HANDSHAKE_KEY and auth.begin_reauthentication(now):
            self.log.debug("sasl_reauthentication_started", principal=str(auth.principal))
            return True
        if not auth.session_expired(now):
            return True
        self.server.stats.expired_connections_killed += 1
        self.log.info(
            "sasl_session_expired",
            listener=self.security.listener,
            principal=str(self.security.principal),
            api=api.api_name(header.api_key),
            hint="the client did not re-authenticate within connections.max.reauth.ms "
            f"({auth.settings.reauth_ms_for(auth.mechanism or '')} ms); clients "
            "re-authenticate on their own "
            "(librdkafka, Java 2.2+)",
        )
        self.close()
        return False

    def _sasl_request(
        self, header: api.RequestHeader, frame: bytes, body_offset: int
    ) -> bool | None:
        """A request before authentication: None to serve it as usual (ApiVersions),
        else whether the read loop goes on (True: answered here and queued)."""
        auth = self.sasl
        assert auth is not None
        key, version = header.api_key, header.api_version
        authenticating = auth.state is sasl.State.AUTHENTICATE
        reason = auth.check_request(key)
        if reason is not None:
            # Kafka's SaslServerAuthenticator closes the connection: without an answer
            # during the handshake, with an ILLEGAL_SASL_STATE one once a SaslHandshake
            # v1 has chosen the mechanism and only SaslAuthenticate may come.
            self.server.stats.sasl_unexpected_request_closed += 1
            self.log.warning(
                "sasl_unexpected_request_closed",
                listener=self.security.listener,
                api=api.api_name(key),
                api_version=version,
                reason=reason,
                hint="authenticate first: the client needs security.protocol="
                f"{self.security.security_protocol} and sasl.mechanism",
            )
            if authenticating:
                try:
                    answer = error_frame(
                        key, version, header.correlation_id, ErrorCode.illegal_sasl_state, reason
                    )
                except api.UnknownApi:
                    pass
                else:
                    self._queue_answer(answer)
                    self._finish_after_answer()
                    return True
            self.close()
            return False
        if key == api.API_VERSIONS_KEY:
            auth.api_versions()
            return None
        versions = api.schema_versions(key)
        if versions is None or not versions[0] <= version <= min(versions[1], _SASL_MAX[key]):
            self._close_unparseable(key, version, "unsupported version during SASL")
            return False
        try:
            checked = request_check.check_request(key, version, frame, body_offset)
            request = api.decode_request(key, version, checked, body_offset)
        except Exception as exc:
            self._close_unparseable(key, version, str(exc) or type(exc).__name__)
            return False
        if key == sasl.SASL_HANDSHAKE_KEY:
            mechanism = str(request.mechanism)
            outcome = auth.handshake(mechanism, version)
            body = api.build_response(
                key,
                version,
                {"error_code": outcome.error, "mechanisms": auth.settings.mechanisms},
            )
            if outcome.close:
                self.server.stats.sasl_authentication_failed += 1
                self.log.warning(
                    "sasl_unsupported_mechanism",
                    listener=self.security.listener,
                    mechanism=mechanism,
                    enabled=list(auth.settings.mechanisms),
                )
        else:
            outcome = auth.authenticate(bytes(request.auth_bytes), self.server.clock.now_ms())
            body = api.build_response(
                key,
                version,
                {
                    "error_code": outcome.error,
                    "error_message": outcome.message,
                    "auth_bytes": outcome.token,
                    # KIP-368: connections.max.reauth.ms once complete (v1+), else 0.
                    "session_lifetime": outcome.session_lifetime_ms,
                },
            )
            self._sasl_outcome(outcome)
        self._queue_answer(api.encode_response(key, version, header.correlation_id, body))
        if outcome.close:
            self._finish_after_answer()
        return True

    def _sasl_raw_token(self, token: bytes) -> bool:
        """The token after a SaslHandshake v0: answered with a bare (size-prefixed)
        token on success; on failure Kafka closes without an answer."""
        auth = self.sasl
        assert auth is not None
        outcome = auth.authenticate(token, self.server.clock.now_ms())
        self._sasl_outcome(outcome)
        if outcome.close:
            self.close()
            return False
        self._queue_answer(struct.pack(">i", len(outcome.token)) + outcome.token)
        return True

    def _sasl_outcome(self, outcome: sasl.Outcome) -> None:
        """Log a failed authentication once (never the token: it holds the password),
        or make the authenticated user the connection's principal."""
        if outcome.close:
            self.server.stats.sasl_authentication_failed += 1
            self.log.warning(
                "sasl_authentication_failed",
                listener=self.security.listener,
                mechanism=self.sasl.mechanism if self.sasl else None,
                error=outcome.message,
                reason=outcome.reason,
            )
            return
        if outcome.principal is not None:
            if outcome.reauthenticated:
                # KIP-368: the principal is unchanged (checked by the authenticator).
                self.server.stats.sasl_reauthentications += 1
                self.log.debug(
                    "sasl_reauthenticated",
                    principal=str(outcome.principal),
                    session_lifetime_ms=outcome.session_lifetime_ms,
                )
                return
            self.security = dataclasses.replace(self.security, principal=outcome.principal)
            self.log.info(
                "sasl_authenticated",
                listener=self.security.listener,
                mechanism=self.sasl.mechanism if self.sasl else None,
                principal=str(outcome.principal),
                session_lifetime_ms=outcome.session_lifetime_ms,
            )

    async def _read_body(self, size: int) -> bytes | None:
        """The frame body, or None if the client closed part way through.

        Its size is already reserved, so the stream buffer holding what has arrived
        of it stays within the budget.
        """
        try:
            return await self.reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            self.log.warning("truncated_frame", expected=size, received=len(exc.partial))
            return None

    def _parse_header(self, frame: bytes) -> tuple[api.RequestHeader, int] | None:
        """The request header, or None (logged) when it cannot be read: Kafka closes
        the connection then, since no response the client could parse exists."""
        api_key, api_version, _ = api.peek_header(frame)
        if api.schema_versions(api_key) is None:
            self.server.stats.malformed_closed += 1
            self.log.warning("unknown_api_key_closed", api_key=api_key, api_version=api_version)
            return None
        try:
            return request_check.decode_request_header(frame)
        except OSError as exc:
            # The broker's failure, not the client's: e.g. no descriptor left to import
            # the schema module of an api version seen for the first time.
            self.log.error(
                "request_header_failed",
                api_key=api_key,
                api=api.api_name(api_key),
                api_version=api_version,
                error=str(exc),
            )
            return None
        except Exception as exc:
            self.server.stats.malformed_closed += 1
            self.log.warning(
                "bad_request_header_closed",
                api_key=api_key,
                api=api.api_name(api_key),
                api_version=api_version,
                error=str(exc),
            )
            return None

    async def _handle(
        self, header: api.RequestHeader, frame: bytes, body_offset: int, received_ns: int = 0
    ) -> bytes | None:
        ctx = RequestContext(header, self.client_host, self.id, self.security)
        try:
            if trace.ENABLED:
                trace.request_started(self.id, header.correlation_id, header.api_key, received_ns)
                response = await self.server.dispatch(ctx, frame, body_offset)
                trace.event("encoded")
                return response
            return await self.server.dispatch(ctx, frame, body_offset)
        except CloseConnection as exc:
            self.log.info(
                "request_closed_connection",
                api=api.api_name(header.api_key),
                api_version=header.api_version,
                correlation_id=header.correlation_id,
                client_id=header.client_id,
                reason=exc.reason,
            )
            self._close_after = asyncio.current_task()
            self.stop_reading()
        except api.MalformedRequest as exc:
            self._close_unparseable(exc.api_key, exc.api_version, exc.reason)
        except api.UnknownApi as exc:
            # No schema for this version, so no response a client could read.
            self._close_unparseable(header.api_key, header.api_version, str(exc))
        except Exception:
            self.log.exception(
                "request_failed", api=api.api_name(header.api_key), api_version=header.api_version
            )
            try:
                return error_frame(
                    header.api_key,
                    header.api_version,
                    header.correlation_id,
                    ErrorCode.unknown_server_error,
                )
            except api.UnknownApi as exc:
                self._close_unparseable(header.api_key, header.api_version, str(exc))
        return None

    def _close_unparseable(self, api_key: int, api_version: int, reason: str) -> None:
        self.server.stats.malformed_closed += 1
        self.log.warning(
            "malformed_request_closed",
            api=api.api_name(api_key),
            api_version=api_version,
            reason=reason,
        )
        self.close()

    async def _send_loop(self) -> None:
        idle = self.server.idle
        while True:
            task = await self._responses.get()
            if task is None:
                return
            try:
                frame = await task
            except asyncio.CancelledError:
                return
            if task is self._close_after:
                # Nothing after this request is answered (CloseConnection).
                self.writer.close()
                return
            if frame is not None and not self.writer.is_closing():
                self.writer.write(frame)
                if trace.ENABLED:
                    (correlation_id,) = struct.unpack_from(">i", frame, 4)
                    trace.event("written", request=(self.id, correlation_id, -1))
                if self.writer.transport.get_write_buffer_size() > 1 << 20:
                    await self.writer.drain()
            idle.request_done(self.id)
            self._slots.release()


# The newest SaslHandshake / SaslAuthenticate versions Kafka 4.2 serves.
_SASL_MAX = {sasl.SASL_HANDSHAKE_KEY: 1, sasl.SASL_AUTHENTICATE_KEY: 2}


async def _ready(frame: bytes | None) -> bytes | None:
    return frame


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _peek_first_byte(sock: socket.socket) -> int | None:
    """The first byte the peer sends, left in the socket; None if it closed first."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            pass
        else:
            return data[0] if data else None
        ready: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _set_once, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def error_frame(
    api_key: int, api_version: int, correlation_id: int, code: ErrorCode, message: str | None = None
) -> bytes:
    """An encoded error response for a request of an api version kio has a schema for.

    Raises `api.UnknownApi` when there is none: nothing a client could parse can be
    sent then, and the server closes the connection (as Kafka does).
    """
    body = api.error_response(api_key, api_version, code, message)
    return api.encode_response(api_key, api_version, correlation_id, body)
