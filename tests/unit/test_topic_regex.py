"""Regex subscriptions with RE2J semantics (coordinator/topic_regex.py)."""

from __future__ import annotations

import pytest

from coordinator.topic_regex import INTERNAL_TOPICS, compile_regex, resolve, validate
from protocol.errors import ErrorCode, KafkaError

TOPICS = ["orders", "orders-eu", "orders.us", "payments", "Orders2", "__consumer_offsets", "a_b"]


def matches(regex: str, topics: list[str] = TOPICS) -> set[str]:
    return set(resolve([regex], topics)[regex])


def test_full_match_not_search() -> None:
    assert matches("orders") == {"orders"}
    assert matches("orders.*") == {"orders", "orders-eu", "orders.us"}
    assert matches("rders") == set()
    assert matches("pay") == set()


def test_internal_topics_never_match() -> None:
    assert "__consumer_offsets" not in matches(".*")
    assert matches("__consumer_offsets") == set()
    assert matches("__.*", [*INTERNAL_TOPICS, "__mine"]) == {"__mine"}


def test_resolve_several_and_invalid() -> None:
    result = resolve(["orders.*", "pay.*", "(?=x)", "orders.*"], TOPICS)
    assert result == {
        "orders.*": frozenset({"orders", "orders-eu", "orders.us"}),
        "pay.*": frozenset({"payments"}),
        "(?=x)": frozenset(),  # Kafka logs and ignores a regex that does not compile
    }
    assert resolve([], TOPICS) == {}
    assert resolve(["x"], []) == {"x": frozenset()}


@pytest.mark.parametrize(
    ("regex", "expected"),
    [
        # Flags anywhere, scoped to the rest of the group and across `|`.
        ("(?i)orders", {"orders"}),
        ("(?i)orders2", {"Orders2"}),
        ("x|(?i)ORDERS", {"orders"}),
        ("(?i)ORDERS|PAYMENTS", {"orders", "payments"}),
        ("(O(?i)RDERS2|z)", {"Orders2"}),
        ("(?i:ORDERS)-eu", {"orders-eu"}),
        ("(?U)orders.+", {"orders-eu", "orders.us"}),
        # RE2 escapes Python spells differently.
        (r"orders\z", {"orders"}),
        (r"\Qorders.us\E", {"orders.us"}),
        (r"orders\x{2E}us", {"orders.us"}),
        (r"orders\056us", {"orders.us"}),
        (r"a\_b", {"a_b"}),
        # Named groups in both spellings, names Python would refuse.
        (r"(?P<n>orders)(?<m>-eu)", {"orders-eu"}),
        (r"(?P<1st>orders)", {"orders"}),
        # `{` that is not a repeat count is a literal in RE2.
        ("orders{,5}", set()),
        ("o{1}rders", {"orders"}),
        # POSIX and Unicode classes.
        ("[[:alpha:]]+", {"orders", "payments"}),
        ("[[:lower:]]+[[:^alpha:]][[:alpha:]]+", {"orders-eu", "orders.us", "a_b"}),
        (r"\pL+", {"orders", "payments"}),
        (r"\p{Ll}+\P{L}\p{Latin}+", {"orders-eu", "orders.us", "a_b"}),
        (r"\p{^Lu}+", {"orders", "orders-eu", "orders.us", "payments", "a_b"}),
        (r"[\p{Lu}\d]+rders\d", {"Orders2"}),
        (r"\p{Any}+", {"orders", "orders-eu", "orders.us", "payments", "Orders2", "a_b"}),
        # Classes RE2 parses differently.
        ("[]a_b]+", {"a_b"}),
        ("orders[-.]..", {"orders-eu", "orders.us"}),
        (r"[\w.\-]+s", {"orders", "orders.us", "payments"}),
    ],
)
def test_re2_syntax(regex: str, expected: set[str]) -> None:
    validate(regex)
    assert matches(regex) == expected


@pytest.mark.parametrize(
    ("regex", "reason"),
    [
        (r"(orders)\1", "invalid escape sequence"),  # backreference
        (r"(?P<n>a)(?P=n)", "invalid or unsupported Perl syntax"),
        ("(?=orders)orders", "invalid or unsupported Perl syntax"),  # lookahead
        ("(?!x)orders", "invalid or unsupported Perl syntax"),
        ("(?<=o)rders", "invalid or unsupported Perl syntax"),  # lookbehind
        ("(?<!x)orders", "invalid or unsupported Perl syntax"),
        ("(?>orders)", "invalid or unsupported Perl syntax"),  # atomic group
        ("(a)?(?(1)b|c)", "invalid or unsupported Perl syntax"),  # conditional
        ("(?#comment)orders", "invalid or unsupported Perl syntax"),
        ("(?x)orders", "invalid or unsupported Perl syntax"),
        ("(?i-)orders", "invalid or unsupported Perl syntax"),
        ("orders*+", "invalid nested repetition operator"),  # possessive
        ("orders**", "invalid nested repetition operator"),
        ("orders{2}{3}", "invalid nested repetition operator"),
        ("o{1001}", "invalid repeat count"),
        ("o{3,2}", "invalid repeat count"),
        (r"orders\Z", "invalid escape sequence"),
        (r"\Gorders", "invalid escape sequence"),
        (r"\u006f", "invalid escape sequence"),
        (r"\N{DIGIT ONE}", "invalid escape sequence"),
        (r"\8", "invalid escape sequence"),
        (r"\x4", "invalid escape sequence"),
        (r"[\b]", "invalid escape sequence"),
        ("orders\\", "trailing backslash"),
        ("[z-a]", "invalid character class range"),
        ("[[:nope:]]", "invalid character class range"),
        (r"\p{Nope}", "invalid character class range"),
        ("(orders", "missing closing )"),
        ("orders)", "unexpected )"),
        ("[orders", "missing closing ]"),
        ("(?P<a>x)(?P<a>y)", "duplicate capture group name"),
        ("(?P<>x)", "invalid named capture"),
        ("*orders", "nothing to repeat"),  # Python's words for RE2's missing argument
    ],
)
def test_refused_like_re2j(regex: str, reason: str) -> None:
    with pytest.raises(KafkaError) as info:
        validate(regex)
    assert info.value.code == ErrorCode.invalid_regular_expression
    assert info.value.message is not None
    assert info.value.message.startswith(
        f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
    )
    assert reason in info.value.message


def test_compiled_pattern_is_reusable() -> None:
    pattern = compile_regex("orders-(eu|us)")
    assert pattern.fullmatch("orders-eu") and not pattern.fullmatch("orders-eux")
