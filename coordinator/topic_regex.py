"""Regex subscriptions of KIP-848 consumer groups, with Kafka 4.2's RE2J semantics.

A consumer may subscribe with `SubscribedTopicRegex` instead of topic names. Kafka
4.2 compiles it with RE2J (Google's RE2 syntax) and a topic is subscribed when the
whole name matches (`Pattern.matcher(topic).matches()`); an expression RE2J cannot
compile is refused with INVALID_REGULAR_EXPRESSION ("SubscribedTopicRegex `r` is
not a valid regular expression: ..."), and the coordinator resolves the group's
expressions against the topic names in the background.

spool matches with Python's `re.fullmatch`, after translating the RE2 syntax, so
that the same expressions are accepted and refused as by RE2J and match the same
topic names:

- refused, as RE2J refuses them: backreferences (`\\1`, `(?P=n)`), lookahead and
  lookbehind, atomic groups, conditionals, comments (`(?#...)`), possessive and
  stacked repetition (`a*+`, `a**`), repeat counts above 1000, escapes RE2 does not
  know (`\\Z`, `\\G`, `\\e`, `\\u...`, `\\N`, `\\C` ...) and flags other than
  `i`, `m`, `s` and `U`;
- translated, as RE2J accepts them: `\\z`, `\\Q...\\E`, `\\x{...}`, octal escapes
  such as `\\12`, `(?<name>...)`, flag groups anywhere in the expression (`a(?i)b`
  applies to the rest of its group, across `|`), `{` that does not start a repeat
  count (`a{,5}` is literal), POSIX classes (`[[:alpha:]]`, `[[:^digit:]]`) and
  Unicode classes (`\\pL`, `\\p{Lu}`, `\\P{N}`, general categories and the `Latin`,
  `Common` and `Any` names); `U` (ungreedy) is dropped, since greediness cannot
  change whether a whole name matches.

Legal topic names are ASCII (`[a-zA-Z0-9._-]`), so negated POSIX and Unicode
classes are expanded over those characters. Unicode script names other than
`Latin` and `Common` are refused (RE2J knows them; spool does not, and no legal
topic name has such a character): a documented deviation.

Kafka's internal topics (`__consumer_offsets`, `__transaction_state`,
`__share_group_state`) never match: spool does not serve them as topics, so a
subscription such as `.*` must not pick them up.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable

from protocol.errors import ErrorCode, KafkaError

__all__ = ["INTERNAL_TOPICS", "compile_regex", "resolve", "validate"]

# Kafka's Topic.INTERNAL_TOPICS plus the share-state topic (Topic.isInternal).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

_MAX_REPEAT = 1000  # RE2's limit on a repeat count
_TOPIC_CHARS = string.ascii_letters + string.digits + "._-"
_WORD_ASCII = frozenset(string.ascii_letters + string.digits + "_")
_ALNUM_ASCII = frozenset(string.ascii_letters + string.digits)
_OCTAL = frozenset("01234567")
_HEX = frozenset(string.hexdigits)
_SIMPLE_ESCAPES = {"a": "\a", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_PERL_CLASSES = frozenset("dDsSwW")
_REPEAT_RE = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")

# The Unicode general categories RE2 knows (one letter: the major class).
_MAJOR_CATEGORIES = frozenset("CLMNPSZ")
_CATEGORIES = frozenset(
    [
        *("Cc", "Cf", "Co", "Cs", "Ll", "Lm", "Lo", "Lt", "Lu", "Mc", "Me", "Mn", "Nd", "Nl"),
        *("No", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "Sc", "Sk", "Sm", "So", "Zl", "Zp"),
        "Zs",
    ]
)

_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}


class _Invalid(Exception):
    """RE2J's description of why an expression does not compile."""


def validate(regex: str) -> None:
    """Raise INVALID_REGULAR_EXPRESSION if RE2J (Kafka 4.2) would refuse `regex`."""
    compile_regex(regex)


def compile_regex(regex: str) -> re.Pattern[str]:
    """The Python pattern that full-matches the names `regex` matches under RE2J.

    Raises KafkaError(INVALID_REGULAR_EXPRESSION) with Kafka's message when RE2J
    would refuse the expression."""
    compiled = _compile(regex)
    if isinstance(compiled, str):
        raise KafkaError(
            ErrorCode.invalid_regular_expression,
            f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {compiled}.",
        )
    return compiled


def why_invalid(regex: str) -> str | None:
    """RE2J's description of why it refuses `regex`, or None when it accepts it."""
    compiled = _compile(regex)
    return compiled if isinstance(compiled, str) else None


def _compile(regex: str) -> re.Pattern[str] | str:
    """The translated pattern, or why RE2J refuses `regex`."""
    try:
        translated = _Translator(regex).translate()
        return re.compile(translated, re.ASCII)
    except _Invalid as exc:
        return str(exc)
    except re.error as exc:
        return exc.msg


def resolve(regexes: Iterable[str], topic_names: Iterable[str]) -> dict[str, frozenset[str]]:
    """Each regex -> the topic names it fully matches (Kafka's refreshRegularExpressions).

    Internal topics never match. An invalid regex resolves to no topics (Kafka logs
    and ignores it: regexes are validated when a member sends them)."""
    names = [n for n in topic_names if n not in INTERNAL_TOPICS]
    result: dict[str, frozenset[str]] = {}
    for regex in regexes:
        if regex in result:
            continue
        try:
            pattern = compile_regex(regex)
        except KafkaError:
            result[regex] = frozenset()
            continue
        result[regex] = frozenset(n for n in names if pattern.fullmatch(n) is not None)
    return result


def _literal(ch: str) -> str:
    """One character as a Python regex literal (in or out of a class)."""
    if ch in _ALNUM_ASCII or ord(ch) > 0x7F:
        return ch
    if ch.isprintable() and ch != " ":
        return "\\" + ch
    return f"\\x{ord(ch):02x}"


def _chars_class(chars: Iterable[str]) -> str:
    """The legal topic characters among `chars`, as class items (never empty: a class
    that can match no topic character matches a control character instead)."""
    picked = "".join(_literal(c) for c in sorted(set(chars)))
    return picked or "\\x00"


def _category_chars(name: str) -> set[str] | None:
    """The legal topic characters in Unicode class `name`, None when spool does not know it."""
    if name == "Any":
        return set(_TOPIC_CHARS)
    if name == "Latin":
        return set(string.ascii_letters)
    if name == "Common":
        return set(string.digits + "._-")
    if len(name) == 1 and name in _MAJOR_CATEGORIES:
        return {c for c in _TOPIC_CHARS if unicodedata.category(c)[0] == name}
    if name in _CATEGORIES:
        return {c for c in _TOPIC_CHARS if unicodedata.category(c) == name}
    return None


class _Translator:
    """One pass over an RE2 expression, emitting the Python equivalent."""

    def __init__(self, regex: str) -> None:
        self.src = regex
        self.i = 0
        self.out: list[str] = []
        # Per open group: the flag groups `(?flags)` opened in it, to close at `)` and
        # to close and reopen around `|`.
        self.frames: list[list[str]] = [[]]
        self.after_repeat = False
        self.names: set[str] = set()

    def fail(self, what: str, fragment: str) -> _Invalid:
        return _Invalid(f"{what}: `{fragment}`")

    def translate(self) -> str:
        src = self.src
        while self.i < len(src):
            c = src[self.i]
            if c in "*+?" or (c == "{" and _REPEAT_RE.match(src, self.i)):
                self._repeat()
                continue
            self.after_repeat = False
            if c == "\\":
                self._escape_outside()
            elif c == "[":
                self._class()
            elif c == "(":
                self._open()
            elif c == ")":
                if len(self.frames) == 1:
                    raise _Invalid(f"unexpected ): `{src}`")
                self.out.append(")" * len(self.frames.pop()) + ")")
                self.i += 1
            elif c == "|":
                flags = self.frames[-1]
                self.out.append(")" * len(flags) + "|" + "".join(f"(?{f}:" for f in flags))
                self.i += 1
            elif c in ".^$":
                self.out.append(c)
                self.i += 1
            else:
                self.out.append(_literal(c))
                self.i += 1
        if len(self.frames) > 1:
            raise _Invalid(f"missing closing ): `{src}`")
        self.out.append(")" * len(self.frames[0]))
        return "".join(self.out)

    def _repeat(self) -> None:
        src, start = self.src, self.i
        if self.after_repeat:
            raise self.fail("invalid nested repetition operator", src[start - 1 : start + 1])
        c = src[self.i]
        if c == "{":
            m = _REPEAT_RE.match(src, self.i)
            assert m is not None
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else -1)
            if low > _MAX_REPEAT or high > _MAX_REPEAT or (high != -1 and high < low):
                raise self.fail("invalid repeat count", m.group(0))
            self.out.append(m.group(0))
            self.i = m.end()
        else:
            self.out.append(c)
            self.i += 1
        if self.i < len(src) and src[self.i] == "?":  # non-greedy
            self.out.append("?")
            self.i += 1
        self.after_repeat = True

    def _open(self) -> None:
        src, start = self.src, self.i
        if not src.startswith("(?", start):
            self.out.append("(")
            self.frames.append([])
            self.i += 1
            return
        named = src.startswith("(?P<", start) or (
            src.startswith("(?<", start) and not src.startswith(("(?<=", "(?<!"), start)
        )
        if named:
            begin = src.index("<", start) + 1
            end = src.find(">", begin)
            name = src[begin:end] if end >= 0 else ""
            if end < 0 or not _NAME_RE.fullmatch(name):
                raise self.fail("invalid named capture", src[start : end + 1 if end >= 0 else None])
            if name in self.names:
                raise self.fail("duplicate capture group name", name)
            self.names.add(name)
            # Names do not change what matches; a plain group avoids Python's rules
            # for names (RE2 allows a leading digit).
            self.out.append("(")
            self.frames.append([])
            self.i = end + 1
            return
        # Flags: (?flags) or (?flags:re); anything else is not RE2.
        j = start + 2
        on: list[str] = []
        off: list[str] = []
        sign = 1
        saw = False
        while j < len(src):
            c = src[j]
            if c in "imsU":
                (on if sign > 0 else off).append(c)
                saw = True
            elif c == "-" and sign > 0:
                sign = -1
                saw = False
            elif c in ":)":
                if sign < 0 and not saw:
                    break
                flags = "".join(f for f in on if f != "U")
                if negative := "".join(f for f in off if f != "U"):
                    flags += "-" + negative
                self.i = j + 1
                if c == ":":
                    self.out.append(f"(?{flags}:" if flags else "(?:")
                    self.frames.append([])
                elif flags:
                    # Applies to the rest of the enclosing group: open a scoped group
                    # there, closed with it (and around each `|`).
                    self.out.append(f"(?{flags}:")
                    self.frames[-1].append(flags)
                return
            else:
                break
            j += 1
        raise self.fail("invalid or unsupported Perl syntax", src[start : j + 1])

    def _escape_outside(self) -> None:
        src, start = self.src, self.i
        if start + 1 >= len(src):
            raise _Invalid("trailing backslash at end of expression")
        c = src[start + 1]
        if c in "AbB":
            self.out.append("\\" + c)
            self.i = start + 2
        elif c == "z":
            self.out.append("\\Z")
            self.i = start + 2
        elif c == "Q":
            end = src.find("\\E", start + 2)
            text = src[start + 2 :] if end < 0 else src[start + 2 : end]
            self.out.append("".join(_literal(ch) for ch in text))
            self.i = len(src) if end < 0 else end + 2
        elif c in "pP":
            self.out.append("[" + self._unicode_class() + "]")
        elif c in _PERL_CLASSES:
            self.out.append("\\" + c)
            self.i = start + 2
        else:
            self.out.append(_literal(self._escape_char()))

    def _escape_char(self) -> str:
        """RE2's parseEscape: the character a `\\...` escape stands for."""
        src, start = self.src, self.i
        j = start + 1
        if j >= len(src):
            raise _Invalid("trailing backslash at end of expression")
        c = src[j]
        j += 1
        if c in "1234567" and (j >= len(src) or src[j] not in _OCTAL):
            raise self.fail("invalid escape sequence", src[start:j])
        if c in _OCTAL:
            value = int(c)
            for _ in range(2):
                if j < len(src) and src[j] in _OCTAL:
                    value = value * 8 + int(src[j])
                    j += 1
            self.i = j
            return chr(value)
        if c == "x":
            if j < len(src) and src[j] == "{":
                end = src.find("}", j)
                digits = src[j + 1 : end] if end >= 0 else ""
                if end < 0 or not digits or not set(digits) <= _HEX or int(digits, 16) > 0x10FFFF:
                    raise self.fail(
                        "invalid escape sequence", src[start : end + 1 if end >= 0 else None]
                    )
                self.i = end + 1
                return chr(int(digits, 16))
            digits = src[j : j + 2]
            if len(digits) != 2 or not set(digits) <= _HEX:
                raise self.fail("invalid escape sequence", src[start : j + 2])
            self.i = j + 2
            return chr(int(digits, 16))
        if c in _SIMPLE_ESCAPES:
            self.i = j
            return _SIMPLE_ESCAPES[c]
        if ord(c) < 0x80 and c not in _ALNUM_ASCII:
            self.i = j
            return c
        raise self.fail("invalid escape sequence", src[start:j])

    def _unicode_class(self) -> str:
        """`\\pX`, `\\p{Name}`, `\\PX`, `\\p{^Name}` as class items (without brackets)."""
        src, start = self.src, self.i
        negate = src[start + 1] == "P"
        j = start + 2
        if j >= len(src):
            raise self.fail("invalid character class range", src[start:])
        if src[j] == "{":
            end = src.find("}", j)
            if end < 0:
                raise self.fail("invalid character class range", src[start:])
            name = src[j + 1 : end]
            self.i = end + 1
        else:
            name = src[j]
            self.i = j + 1
        if name.startswith("^"):
            negate = not negate
            name = name[1:]
        chars = _category_chars(name)
        if chars is None:
            raise self.fail("invalid character class range", src[start : self.i])
        if negate:
            chars = set(_TOPIC_CHARS) - chars
        return _chars_class(chars)

    def _class(self) -> None:
        """RE2's parseClass: `[...]`, rebuilt item by item for Python."""
        src, start = self.src, self.i
        j = start + 1
        negated = j < len(src) and src[j] == "^"
        if negated:
            j += 1
        items: list[str] = []
        first = True
        while True:
            if j >= len(src):
                raise self.fail("missing closing ]", src[start:])
            c = src[j]
            if c == "]" and not first:
                j += 1
                break
            first = False
            if src.startswith("[:", j):
                end = src.find(":]", j + 2)
                if end >= 0:
                    name = src[j + 2 : end]
                    neg = name.startswith("^")
                    posix = _POSIX.get(name[1:] if neg else name)
                    if posix is None:
                        raise self.fail("invalid character class range", src[j : end + 2])
                    if neg:
                        inside = re.compile(f"[{posix}]")
                        items.append(
                            _chars_class(ch for ch in _TOPIC_CHARS if not inside.match(ch))
                        )
                    else:
                        items.append(posix)
                    j = end + 2
                    continue
            if c == "\\" and j + 1 < len(src) and src[j + 1] in "pP":
                self.i = j
                items.append(self._unicode_class())
                j = self.i
                continue
            if c == "\\" and j + 1 < len(src) and src[j + 1] in _PERL_CLASSES:
                items.append(src[j : j + 2])
                j += 2
                continue
            low, j = self._class_char(j)
            if j + 1 < len(src) and src[j] == "-" and src[j + 1] != "]":
                high, j = self._class_char(j + 1)
                if high < low:
                    raise self.fail("invalid character class range", f"{low}-{high}")
                items.append(f"{_literal(low)}-{_literal(high)}")
            else:
                items.append(_literal(low))
        self.out.append("[" + ("^" if negated else "") + "".join(items) + "]")
        self.i = j

    def _class_char(self, j: int) -> tuple[str, int]:
        src = self.src
        if src[j] != "\\":
            return src[j], j + 1
        self.i = j
        return self._escape_char(), self.i
