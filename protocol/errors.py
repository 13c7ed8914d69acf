"""Kafka error codes and the exception that carries one.

The codes themselves are kio's `ErrorCode` (generated from Kafka's own list); this
module only adds an exception type so that any layer can fail with a code and a
message a person can act on, and the broker turns it into a response field.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["CorruptRecordError", "ErrorCode", "KafkaError"]


class KafkaError(Exception):
    """A failure that maps to one Kafka error code, with a human-readable message."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"KafkaError({self.code.name}, {self.message!r})"


class CorruptRecordError(KafkaError):
    """A batch that fails structural or CRC validation (CORRUPT_MESSAGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.corrupt_message, message)
