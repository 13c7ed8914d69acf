"""Config definitions: one type for every config key spool knows, broker, topic and group.

A key has Kafka's name, its DescribeConfigs type (KIP-569), default and documentation,
and the rules a value must follow: fixed bounds, a set of choices, or a check of its own.
Group configs also name the broker key they default to and the broker keys that bound
them (KIP-932's `share.*` group configs and `group.share.*` broker configs).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ConfigType(enum.IntEnum):
    """DescribeConfigs ConfigType (KIP-569)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9  # sensitive: DescribeConfigs never returns its value


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One config key: Kafka's name, type, default, documentation and value rules."""

    name: str
    type: ConfigType
    default: Any
    doc: str
    # A check of the parsed value beyond the bounds: a reason it is wrong, or None.
    validator: Callable[[Any], str | None] | None = None
    # The broker key this (topic or group) config takes its default from.
    broker_synonym: str | None = None
    read_only: bool = False
    min: int | None = None
    max: int | None = None
    # For a group config: the broker keys that bound its value.
    broker_min: str | None = None
    broker_max: str | None = None

    @property
    def sensitive(self) -> bool:
        return self.type == ConfigType.PASSWORD

    def problem(self, value: Any) -> str | None:
        """Why a parsed value breaks this key's fixed rules, or None if it keeps them."""
        if self.min is not None and value < self.min:
            return f"must be at least {self.min}"
        if self.max is not None and value > self.max:
            return f"must be at most {self.max}"
        if self.validator is not None:
            return self.validator(value)
        return None


def one_of(*choices: str) -> Callable[[Any], str | None]:
    """A validator accepting exactly `choices`."""
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"
