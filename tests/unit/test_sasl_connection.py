"""KIP-368 on a connection, without sockets: a `Connection` over an in-memory stream and
the server's ManualClock. A session that expired closes the connection at its next
request (Kafka's SocketServer), a SaslHandshake re-authenticates it instead, and the
clock alone decides."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from broker import sasl
from broker.security import SecurityContext
from broker.server import Connection, RequestContext, Server
from persister.clock import ManualClock
from protocol import api
from protocol.errors import ErrorCode

REAUTH_MS = 2000
PLAIN_TOKEN = b"\x00alice\x00alice-secret"


class Transport:
    def get_write_buffer_size(self) -> int:
        return 0


class Writer:
    """What the connection writes, and whether it closed."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.transport = Transport()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    async def drain(self) -> None:
        pass

    def frames(self) -> list[bytes]:
        out, pos = [], 0
        while pos + 4 <= len(self.data):
            (size,) = struct.unpack_from(">i", self.data, pos)
            out.append(bytes(self.data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        return out


def frame(api_key: int, version: int, correlation_id: int, data: dict[str, Any]) -> bytes:
    body = api.build(api.request_class(api_key, version), data)
    return api.encode_request(api_key, version, correlation_id, "test", body)


METADATA = 3


async def served(ctx: RequestContext, frame: bytes, offset: int) -> bytes:
    """Every request that reaches the handlers is answered with its correlation id."""
    return struct.pack(">ii", 4, ctx.header.correlation_id)


class Client:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.server = Server("127.0.0.1", 0, served, clock=self.clock)
        self.reader = asyncio.StreamReader()
        self.writer = Writer()
        settings = sasl.SaslSettings(
            "SASL_PLAINTEXT", ("PLAIN",), {"alice": "alice-secret"}, reauth_ms=REAUTH_MS
        )
        self.conn = Connection(
            self.server,
            self.reader,
            self.writer,  # type: ignore[arg-type]
            "127.0.0.1",
            SecurityContext("SASL_PLAINTEXT", "SASL_PLAINTEXT"),
            settings,
        )
        self.task = asyncio.create_task(self.conn.run())
        self.correlation = 0

    async def send(self, api_key: int, version: int, data: dict[str, Any]) -> None:
        self.correlation += 1
        self.reader.feed_data(frame(api_key, version, self.correlation, data))
        for _ in range(20):
            await asyncio.sleep(0)

    async def login(self) -> Any:
        await self.send(17, 1, {"mechanism": "PLAIN"})
        await self.send(36, 2, {"auth_bytes": PLAIN_TOKEN})
        return api.decode_response(36, 2, self.writer.frames()[-1])[1]

    async def finish(self) -> None:
        self.reader.feed_eof()
        await asyncio.wait_for(self.task, 5)


async def test_a_request_after_the_session_expired_closes_the_connection() -> None:
    client = Client()
    answer = await client.login()
    assert answer.error_code == ErrorCode.none
    assert answer.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    client.clock.advance(REAUTH_MS)
    await client.send(METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})
    assert len(client.writer.frames()) == 3 and not client.writer.closed  # served
    client.clock.advance(1)
    await client.send(METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})
    await asyncio.wait_for(client.task, 5)
    assert client.writer.closed and len(client.writer.frames()) == 3  # no answer
    assert client.server.stats.expired_connections_killed == 1


async def test_a_handshake_re_authenticates_and_renews_the_session() -> None:
    client = Client()
    await client.login()
    for _ in range(3):
        client.clock.advance(REAUTH_MS - 100)
        answer = await client.login()
        assert answer.error_code == ErrorCode.none
        client.clock.advance(REAUTH_MS - 100)  # past the first session's end
        await client.send(METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})
        assert struct.unpack(">i", client.writer.frames()[-1])[0] == client.correlation
    assert client.server.stats.sasl_reauthentications == 3
    assert client.server.stats.expired_connections_killed == 0
    assert str(client.conn.security.principal) == "User:alice"
    await client.finish()


async def test_without_a_session_lifetime_a_second_handshake_is_out_of_place() -> None:
    client = Client()
    client.conn.sasl = sasl.SaslAuthenticator(
        sasl.SaslSettings("SASL_PLAINTEXT", ("PLAIN",), {"alice": "alice-secret"})
    )
    await client.login()
    client.clock.advance(10**9)
    # Handed to the handlers (the stub answers it): not a re-authentication, no close.
    await client.send(17, 1, {"mechanism": "PLAIN"})
    assert struct.unpack(">i", client.writer.frames()[-1])[0] == client.correlation
    assert not client.writer.closed
    await client.finish()


async def test_before_authentication_frames_are_bounded_by_sasl_server_max_receive_size() -> None:
    # Kafka's sasl.server.max.receive.size (512 KiB): whoever has not logged in cannot
    # make the broker buffer a frame up to socket.request.max.bytes (100 MB).
    client = Client()
    limit = client.server.limits.sasl_max_receive_bytes
    assert limit == 524288
    client.reader.feed_data(struct.pack(">i", limit + 1) + b"\x00" * 64)
    await asyncio.wait_for(client.task, 5)
    assert client.writer.closed and client.writer.frames() == []
    assert client.server.stats.oversized_closed == 1
    # Once authenticated, socket.request.max.bytes is the bound again.
    client = Client()
    await client.login()
    frames = len(client.writer.frames())
    big = frame(METADATA, 4, 99, {"topics": None, "allow_auto_topic_creation": False})
    padding = limit + 1 - (len(big) - 4)
    client.reader.feed_data(struct.pack(">i", len(big) - 4 + padding) + big[4:] + b"\x00" * padding)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not client.writer.closed
    assert len(client.writer.frames()) == frames + 1
    await client.finish()
