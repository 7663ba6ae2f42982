"""JSON that arrives in fragments spread over several events.

Tool-call arguments (OpenAI ``function.arguments``, Bedrock ``toolUse.input``) and
Anthropic ``input_json_delta.partial_json`` are one JSON document cut into pieces.
``IncrementalJSON`` keeps the exact concatenation and parses it only when asked: a
prefix that happens to parse proves nothing (``1`` then ``2`` is ``12``), so only the
caller knows when the document is finished (at the block's stop event).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson


# what JSON skips between values; str.strip() also strips U+00A0, U+2028, U+3000, \x1c..., which
# json.loads and jiter refuse
JSON_WHITESPACE = " \t\r\n"


def is_blank(text: str) -> bool:
    """Whether ``text`` holds no JSON at all: nothing but JSON's whitespace."""
    return not text.strip(JSON_WHITESPACE)


class JSONIncomplete(ValueError):
    """The concatenated fragments are not one JSON document.

    ``position`` is the character index in ``raw`` where parsing failed; ``truncated``
    says the text is a cut-off prefix (the failure is at its end), as opposed to text
    that no continuation could repair.
    """

    def __init__(self, reason: str, position: int, raw: str) -> None:
        super().__init__(f"{reason} (at character {position} of {len(raw)})")
        self.reason = reason
        self.position = position
        self.truncated = position >= len(raw.rstrip(JSON_WHITESPACE))


# orjson reads an integer past 64 bits (2**64 has 20 digits, -2**63 19) as a double, where the
# SDKs' json module reads it exactly. A run this long that is not such an integer (a string of
# digits, a long fraction) only costs a second parse.
_LONG_DIGIT_RUN = re.compile("[0-9]{19}")
_LONG_DIGIT_RUN_BYTES = re.compile(b"[0-9]{19}")
_DIGITS = b"0123456789"


def may_hold_long_integer(data: str | bytes | bytearray) -> bool:
    """Might orjson read a number in this JSON text less exactly than the json module?"""
    if isinstance(data, str):
        return _LONG_DIGIT_RUN.search(data) is not None
    # most texts hold fewer than 19 digits in all: counting them is ten times cheaper than the search
    return len(data) - len(data.translate(None, _DIGITS)) >= 19 and _LONG_DIGIT_RUN_BYTES.search(data) is not None


def exact_loads(data: str | bytes | bytearray) -> Any:
    """What orjson reads, but integers past 64 bits exact, as the SDKs' json module reads them."""
    value = orjson.loads(data)
    if may_hold_long_integer(data):
        return json.loads(data if isinstance(data, str) else bytes(data).decode("utf-8"))
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a decoded text: half a UTF-16 pair


def lenient_loads(
    data: str | bytes | bytearray, parse_constant: Callable[[str], Any] | None = None, exact_integers: bool = True,
    on_lone_surrogate: Callable[[], None] | None = None,
) -> Any:
    """One JSON value, also where orjson refuses what the SDKs' parsers take (a number past a
    double, ``1e400``, is infinity to them), as they read it, when the value can be written back
    as JSON; else orjson's error. A lone surrogate escape is refused (no UTF-8 text can hold it)
    unless ``on_lone_surrogate`` is given: the value then holds U+FFFD in its place, and it is
    called (the providers' ``judge.sdk_loads``: the json module reads one).
    ``parse_constant`` as for ``json.loads`` (``NaN``, ``Infinity``). With ``exact_integers``
    false, an integer past 64 bits may come back as a double (orjson's reading), which is cheaper."""
    try:
        return exact_loads(data) if exact_integers else orjson.loads(data)
    except orjson.JSONDecodeError as refused:
        try:
            # as text, strictly UTF-8: given bytes, json.loads would guess UTF-16 or UTF-32 from
            # NULs and drop a BOM, which the clients, reading decoded lines, never do
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            value = json.loads(text, parse_constant=parse_constant)
            # written back as the json module writes: any integer, any depth, but no lone surrogate
            written = json.dumps(value, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError):
            raise refused from None
        if not _LONE_SURROGATE.search(written):
            return value
        if on_lone_surrogate is None:
            raise refused from None
        on_lone_surrogate()
        return json.loads(_LONE_SURROGATE.sub("\ufffd", written))


class IncrementalJSON:
    """Collect fragments with ``feed``; ``value()`` parses the whole text on demand.

    Empty text (no fragments, or only ``""`` and JSON's whitespace) means ``{}``: that is how
    providers send a tool call without arguments.
    """

    __slots__ = ("_parts", "_raw", "_parsed_length", "_result")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._raw = ""
        self._parsed_length = -1  # len(raw) when _result was computed
        self._result: Any = None

    def feed(self, fragment: str) -> None:
        if fragment:
            self._parts.append(fragment)

    @property
    def raw(self) -> str:
        """Every fragment fed so far, concatenated exactly."""
        if self._parts:
            self._raw += "".join(self._parts)
            self._parts.clear()
        return self._raw

    def value(self) -> Any:
        """The parsed document; raises ``JSONIncomplete`` when it does not parse."""
        result = self._parse()
        if isinstance(result, JSONIncomplete):
            raise result
        return result

    def complete(self) -> bool:
        """Whether the text so far is exactly one JSON document."""
        return not isinstance(self._parse(), JSONIncomplete)

    def _parse(self) -> Any:
        raw = self.raw
        if len(raw) != self._parsed_length:
            self._parsed_length = len(raw)
            if is_blank(raw):
                self._result = {}
            else:
                try:
                    self._result = lenient_loads(raw)
                except orjson.JSONDecodeError as error:
                    self._result = JSONIncomplete(error.msg, error.pos, raw)
        return self._result
