"""A small asyncio Kafka client: one connection, requests built from plain mappings.

spool's admin CLI and its wire tests use it to speak any API kio has a schema for.
Requests may be pipelined; responses are matched by correlation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import Mapping
from typing import Any

from protocol import api


class ClientError(Exception):
    """The connection failed or the broker closed it."""


class KafkaClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.client_id = client_id
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, asyncio.Future[Any]]] = {}
        self._receiver = asyncio.create_task(self._receive())

    @classmethod
    async def connect(cls, host: str, port: int, client_id: str = "spool") -> KafkaClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, client_id)

    async def request(
        self, api_key: int, version: int, body: Mapping[str, Any] | Any, timeout_s: float = 30
    ) -> Any:
        """Send one request and return the decoded response entity."""
        if isinstance(body, Mapping):
            body = api.build(api.request_class(api_key, version), body)
        correlation_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (api_key, version, future)
        self._writer.write(
            api.encode_request(api_key, version, correlation_id, self.client_id, body)
        )
        await self._writer.drain()
        return await asyncio.wait_for(future, timeout_s)

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
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            error = ClientError(f"connection closed: {exc}")
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
