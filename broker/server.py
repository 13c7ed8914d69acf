"""The TCP listener and per-connection request loop.

Each connection reads size-prefixed frames, decodes the header, and starts one task
per request so that pipelined requests overlap (a produce waiting for its fsync does
not stall the next one), while responses are written strictly in request order.
Bad frames are answered with a Kafka error when the stream is still in sync and the
connection is closed when it is not; either way other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from protocol import api
from protocol.errors import ErrorCode

log = structlog.get_logger("spool.server")

# Requests a single connection may have in flight before the broker stops reading
# from it (back-pressure instead of unbounded memory).
MAX_IN_FLIGHT_PER_CONNECTION = 32

_connection_ids = itertools.count(1)


@dataclass(slots=True, frozen=True)
class RequestContext:
    header: api.RequestHeader
    client_host: str
    connection_id: int

    @property
    def api_version(self) -> int:
        return self.header.api_version


Dispatch = Callable[[RequestContext, bytes, int], Awaitable[bytes | None]]


class Server:
    def __init__(self, host: str, port: int, dispatch: Dispatch, *, max_request_bytes: int) -> None:
        self.host = host
        self.port = port
        self.dispatch = dispatch
        self.max_request_bytes = max_request_bytes
        self._server: asyncio.base_events.Server | None = None
        # Called with the connection id when a client connection closes.
        self.on_disconnect: Callable[[int], None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connect, self.host, self.port, reuse_address=True, backlog=1024
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("listening", host=self.host, port=self.port)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish, then close connections."""
        if self._server is not None:
            self._server.close()
        for conn in list(_live_connections):
            conn.stop_reading()
        tasks = list(self._connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await conn.run()
        finally:
            self._connections.discard(task)


_live_connections: set[Connection] = set()


class Connection:
    def __init__(
        self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.client_host = peer[0] if peer else "unknown"
        self.id = next(_connection_ids)
        self.log = log.bind(connection=self.id, client=self.client_host)
        # Responses in request order: each entry resolves to the frame to send (or None).
        self._responses: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(
            MAX_IN_FLIGHT_PER_CONNECTION
        )
        self._stopping = False
        self._read_task: asyncio.Task[None] | None = None

    def stop_reading(self) -> None:
        """Shutdown: read no further requests; those in flight still get answers."""
        self._stopping = True
        if self._read_task is not None:
            self._read_task.cancel()

    async def run(self) -> None:
        _live_connections.add(self)
        sender = asyncio.create_task(self._send_loop())
        self._read_task = asyncio.create_task(self._read_loop())
        try:
            await asyncio.wait([self._read_task])
            if not self._read_task.cancelled():
                exc = self._read_task.exception()
                if exc is not None and not isinstance(exc, ConnectionError):
                    self.log.error("connection_failed", error=repr(exc))
            await self._responses.put(None)
            await sender
        except asyncio.CancelledError:
            self._read_task.cancel()
            sender.cancel()
            raise
        except ConnectionError:
            pass
        finally:
            _live_connections.discard(self)
            self.writer.close()
            if self.server.on_disconnect is not None:
                self.server.on_disconnect(self.id)

    async def _read_loop(self) -> None:
        while not self._stopping:
            try:
                size_bytes = await self.reader.readexactly(4)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self.log.warning("truncated_frame", received=len(exc.partial))
                return
            (size,) = struct.unpack(">i", size_bytes)
            if size < 8 or size > self.server.max_request_bytes:
                # The stream cannot be resynchronised after a bad size, as in Kafka's
                # InvalidReceiveException: log and close.
                self.log.warning(
                    "invalid_frame_size",
                    size=size,
                    max_bytes=self.server.max_request_bytes,
                    hint="size prefix is below a request header or above socket.request.max.bytes",
                )
                return
            try:
                frame = await self.reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                self.log.warning("truncated_frame", expected=size, received=len(exc.partial))
                return
            task = asyncio.create_task(self._handle(frame))
            await self._responses.put(task)

    async def _handle(self, frame: bytes) -> bytes | None:
        api_key, api_version, correlation_id = api.peek_header(frame)
        try:
            header, body_offset = api.decode_request_header(frame)
        except Exception as exc:
            self.log.warning(
                "bad_request_header", api_key=api_key, api_version=api_version, error=str(exc)
            )
            return _bare_error(correlation_id, ErrorCode.invalid_request)
        ctx = RequestContext(header, self.client_host, self.id)
        try:
            return await self.server.dispatch(ctx, frame, body_offset)
        except Exception:
            self.log.exception("request_failed", api=api.api_name(api_key), api_version=api_version)
            return error_frame(api_key, api_version, correlation_id, ErrorCode.unknown_server_error)

    async def _send_loop(self) -> None:
        while True:
            task = await self._responses.get()
            if task is None:
                return
            try:
                frame = await task
            except asyncio.CancelledError:
                return
            if frame is None:
                continue
            if self.writer.is_closing():
                continue
            self.writer.write(frame)
            if self.writer.transport.get_write_buffer_size() > 1 << 20:
                await self.writer.drain()


def _bare_error(correlation_id: int, code: ErrorCode) -> bytes:
    """Correlation id plus an error code: the only answer possible without a schema."""
    return struct.pack(">iih", 6, correlation_id, int(code))


def error_frame(
    api_key: int, api_version: int, correlation_id: int, code: ErrorCode, message: str | None = None
) -> bytes:
    """An encoded error response for a request; a bare code if the api has no schema."""
    try:
        body = api.error_response(api_key, api_version, code, message)
        return api.encode_response(api_key, api_version, correlation_id, body)
    except Exception:
        return _bare_error(correlation_id, code)
