"""JSON that arrives in fragments spread over several events.

Tool-call arguments (OpenAI ``function.arguments``, Bedrock ``toolUse.input``) and
Anthropic ``input_json_delta.partial_json`` are one JSON document cut into pieces.
``IncrementalJSON`` keeps the exact concatenation and parses it only when asked: a
prefix that happens to parse proves nothing (``1`` then ``2`` is ``12``), so only the
caller knows when the document is finished (at the block's stop event).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


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
        self.truncated = position >= len(raw.rstrip())


def lenient_loads(data: str | bytes | bytearray, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """One JSON value, also where orjson refuses what the SDKs' parsers take (a number past a
    double, ``1e400``, is infinity to them), as they read it, when the value can be written back
    as JSON; else orjson's error. A lone surrogate escape stays refused: no UTF-8 text can hold
    it. ``parse_constant`` as for ``json.loads`` (``NaN``, ``Infinity``)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as refused:
        try:
            # as text, strictly UTF-8: given bytes, json.loads would guess UTF-16 or UTF-32 from
            # NULs and drop a BOM, which the clients, reading decoded lines, never do
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            value = json.loads(text, parse_constant=parse_constant)
            orjson.dumps(value)
        except (ValueError, TypeError, RecursionError):
            raise refused from None
        return value


class IncrementalJSON:
    """Collect fragments with ``feed``; ``value()`` parses the whole text on demand.

    Empty text (no fragments, or only ``""`` and whitespace) means ``{}``: that is how
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
            if not raw.strip():
                self._result = {}
            else:
                try:
                    self._result = lenient_loads(raw)
                except orjson.JSONDecodeError as error:
                    self._result = JSONIncomplete(error.msg, error.pos, raw)
        return self._result
