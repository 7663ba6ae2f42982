"""Ollama native NDJSON (``/api/chat`` and ``/api/generate``).

One JSON object per line; the last one says ``"done": true`` with ``done_reason``
(``stop`` or ``length``) and the token counts. Tool calls arrive whole. A line holding
only ``{"error": ...}`` is an in-band error (the HTTP status stays 200). The done line
closes the response: any line after it is corrupt. Every line of one answer names the same
model and has the same shape (``message`` for chat, ``response`` for generate): a line
that does not is another answer's, stitched on.

The ollama Python client reads the body with httpx's ``iter_lines``, which breaks lines as
``str.splitlines`` does, and parses every line as JSON. A blank line, and a line that JSON allows
to hold a raw U+0085, U+2028 or U+2029 (or a CR other than before the LF), which that reader
breaks in two, make it raise where the decoder reads on: corrupt. Since 0.4 the client also
validates every line (pydantic): it builds a ``ChatResponse`` of each line of an /api/chat
stream, which requires a ``message`` object with a string ``role``, and a ``GenerateResponse`` of
each line of an /api/generate stream, which requires nothing. Both refuse a ``model``,
``created_at`` or ``done_reason`` (and the message's ``content``, ``thinking`` or ``tool_name``, or
generate's ``response`` or ``thinking``) that is neither a string nor null, and a count or duration
that is no integer (an array, an object, a fraction). So once a line shows the stream is a chat's,
a line without such a message (a final line of only ``done`` and the counts, as Ollama's API docs
draw it, or ``{"error": ""}``) makes the client raise: corrupt, as is a line it refuses for a
field. A count written as a string, which pydantic reads as a number only where it spells one,
leaves an answer that ended ``unknown``. A tool call needs a ``function`` object with a string
``name`` and an object of ``arguments``, and a line whose calls lack them makes it raise: corrupt.
A call whose name is empty it takes, but the app cannot dispatch it: corrupt too, as a nameless
call is in the other dialects.

The client's line reader gives the last line even without its newline: a done line that arrived
whole, in a body that ended cleanly, reached the app (``sdk_reads_an_unended_last_line``).

A response replayed from its start after a cut and stitched on (a retrying proxy) names the same
model and shape, so only its lines tell: they come back byte for byte (``StartOver``), and the
client hands the app the text twice: ``unknown``. So is a line that repeats the one before it
byte for byte (its ``created_at`` too: one line sent twice), and a line whose ``created_at`` is
earlier than the one before's (lines out of order, or the server's clock stepped back).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from streamtap.wire import JSONValue, Tail, WireEvent
from streamtap.wire.jsonlines import loads as read_json_line

from .common import AssemblerBase, StartOver, as_dict, as_int, as_list, as_str, dumps, error_fields
from .turn import BlockKind, Dialect, StreamEnd, Turn, Verdict

DONE = {"stop": "end_turn", "length": "max_tokens"}

# what else ends a line for str.splitlines (httpx's iter_lines) inside a line the decoder reads whole;
# its other line breaks (\x0b, \x0c, \x1c-\x1e) JSON never holds raw, so such lines are malformed already
_CLIENT_BREAK = re.compile(rb"\r(?!\n)|\xc2\x85|\xe2\x80[\xa8\xa9]")
_JSON_SPACE = frozenset(b" \t\r\n")
_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}
_BREAK_NAMES = {b"\r": "CR not before the LF", b"\xc2\x85": "U+0085 (NEL)", b"\xe2\x80\xa8": "U+2028 (line separator)",
                b"\xe2\x80\xa9": "U+2029 (paragraph separator)"}
# what the ollama client's response models (ollama/_types.py) want of a line: a string or null ...
_LINE_STRINGS = frozenset({"model", "created_at", "done_reason"})  # BaseGenerateResponse, every line
_MESSAGE_STRINGS = ("content", "thinking", "tool_name")  # ChatResponse's message (role: a string, required)
_GENERATE_LINE_STRINGS = _LINE_STRINGS | {"response", "thinking"}  # GenerateResponse
# ... or an integer or null (BaseGenerateResponse)
_COUNTS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration")
_MODELS = {"chat": "ChatResponse", "generate": "GenerateResponse"}


class Assembler(AssemblerBase):
    dialect = Dialect.OLLAMA
    wire = "ndjson"
    # httpx's iter_lines, which the client reads with, gives the last line without its newline too
    sdk_reads_an_unended_last_line = True

    def __init__(self, wire: str | None = None) -> None:
        super().__init__(wire)
        self._calls = 0
        self._lines = self.wire == "ndjson"  # the client's line reading is judged on NDJSON only
        # the first line's model, its shape (chat or generate) once a line shows one, and that line
        self._first: tuple[str | None, str | None, WireEvent] | None = None
        self._shape: str | None = None  # which response model the client builds of every line, once shown
        # the first line that showed no shape before any line did: (it, what it holds for a message,
        # whether it carries an empty error); judged once the stream shows its shape
        self._waiting: tuple[WireEvent, str, bool] | None = None
        self._string_count = False  # a count written as a string was doubted (the first one is told)
        # every line carries the server's created_at, to the nanosecond where its clock has them, so the
        # lines of one answer differ and a repeat counts from the second line on, as in Gemini. A coarse
        # clock (Go's on Windows ticks every 0.5-15.6 ms) can stamp a first token sent twice alike: the
        # doubt says the bytes cannot tell that from a replay
        self._start_over = StartOver(self)
        self._previous: bytes | None = None  # the line before, which the next must not repeat
        self._created: tuple[int, str, WireEvent] | None = None  # the last created_at: as nanoseconds, as sent, its line
        self._went_back: tuple[str, int, int] | None = None  # the first created_at earlier than the line before's, said at the end

    def feed(self, event: WireEvent, t: float | None) -> None:
        self.seen(event, f"line {event.seq}")
        if not isinstance(event, JSONValue):
            self.corrupt(f"unexpected {type(event).__name__} for Ollama NDJSON", event)
            return
        start_over = self._start_over
        if start_over.busy or event.raw == start_over.first:
            start_over.see(event.raw, event)
        if event.raw == self._previous and b'"created_at"' in event.raw:
            self.sent_twice(event, "its created_at", "line", "a coarse clock stamped one token twice within a tick")
        self._previous = event.raw
        if self._lines:
            self._client_lines(event)
        # the decoder reads integers past 64 bits as doubles: a line with calls is read again, exactly
        obj = read_json_line(event.raw, exact_integers=True) if b'"tool_calls"' in event.raw else event.value
        if not isinstance(obj, dict):
            self.corrupt("line is JSON but not an object", event)
            return
        if obj.get("error"):
            self.errored(event, error_fields(obj))
            return
        self._in_order(obj.get("created_at"), event)
        turn = self.turn
        turn.model = turn.model or as_str(obj.get("model"))
        chat = isinstance(obj.get("message"), dict)
        message = obj["message"] if chat else obj
        # a line with neither message nor response (an empty error, say) shows no shape
        shape = "chat" if chat else "generate" if "response" in obj else None
        if shape is not None and self._shape is None:
            self._shape_shown(shape, event)
        self._same_answer(obj, shape, event)
        self._client_takes(obj, event)
        thinking = message.get("thinking")
        if isinstance(thinking, str) and thinking:
            self.append(0, BlockKind.THINKING, thinking, t)
        text = message.get("content") if message is not obj else obj.get("response")
        if isinstance(text, str) and text:
            self.append(0, BlockKind.TEXT, text, t)
        calls = message.get("tool_calls")
        if chat and calls is not None:
            self._client_calls(calls, event)
        for call in as_list(calls):
            if isinstance(call, dict):
                self._tool_call(call, t)
        if obj.get("done") is True:
            self._usage(obj)
            # no done_reason (servers before it existed, or "" for a connection the server saw close)
            # cannot tell a finish from a length cut: the verdict says so rather than guess "stop"
            reason = as_str(obj.get("done_reason")) or None
            calls = any(b.kind is BlockKind.TOOL_CALL for b in turn.blocks)
            normalized = DONE.get(reason, "other")
            if normalized == "end_turn" and calls:
                normalized = "tool_use"
            self.terminal(event, reason, normalized, 'the "done": true line')

    def tail(self, event: Tail) -> bool:
        """Blank lines after the last line: the client parses them too, and fails."""
        if event.cut or not self._lines:
            return False
        self.corrupt(f"a blank line at byte {event.start}, after the last line: the ollama client parses every "
                     "line as JSON and fails on a blank one", event)
        return True

    def _client_lines(self, event: JSONValue) -> None:
        """Does the ollama client read this line as the decoder did? Cheap tests first: this runs
        once per line (an int test is a plain memchr)."""
        raw = event.raw
        if raw[0] in _JSON_SPACE and raw.find(b"\n", 0, -1) >= 0:  # the decoder gives a line the blank lines before it
            self.corrupt(f"a blank line at byte {event.start}, before line {event.seq}: the ollama client parses "
                         "every line as JSON and fails on a blank one", event)
        elif (13 in raw or not raw.isascii()) and (found := _CLIENT_BREAK.search(raw)):
            name = _BREAK_NAMES[found.group()]
            self.corrupt(f"line {event.seq} holds a raw {name} at byte {event.start + found.start()}: the ollama "
                         "client's line reader (httpx iter_lines, as str.splitlines) breaks the line there and fails "
                         "to parse the pieces as JSON", event)

    def _client_takes(self, obj: dict[str, Any], event: JSONValue) -> None:
        """Does the ollama client (0.4 and later) take this line? It builds the stream's response model
        of every line and raises where pydantic refuses it. A line that shows no shape before any line
        did waits for the stream to show which model that is."""
        shape = self._shape
        refused, string_count = _refused_line(obj, shape)
        if refused:
            self._refused(event, refused, shape)
            return
        empty_error = "error" in obj  # the clients raise only on a non-empty error
        if shape is None:
            if self._waiting is None:
                self._waiting = (event, _held(obj, "message"), empty_error)
        elif empty_error:
            self._read_on(event)
        if string_count is not None and not self._string_count:
            self._string_count = True
            self.judge.doubt(f"line {event.seq} (byte {event.start}) has a string for its {string_count}: the ollama client "
                             "reads it as an integer only where pydantic's lax rules parse it, so whether it took the "
                             "line is not told", event.seq, event.start)

    def _shape_shown(self, shape: str, event: WireEvent) -> None:
        """The stream shows its shape for the first time: the line that waited for it is judged."""
        self._shape = shape
        if self._waiting is None:
            return
        waited, held, empty_error = self._waiting
        self._waiting = None
        if shape == "chat":
            self._refused(waited, f"has {held} for its message, not an object (line {event.seq} shows an /api/chat "
                                  "stream)", shape)
        elif empty_error:
            self._read_on(waited)

    def _refused(self, event: WireEvent, why: str, shape: str | None) -> None:
        model = f"a {_MODELS[shape]}" if shape else "a ChatResponse or a GenerateResponse"
        self.corrupt(f"line {event.seq} (byte {event.start}) {why}: the ollama client (0.4 and later) builds {model} "
                     "of every line, so it refuses this line and raises", event)

    def _read_on(self, event: WireEvent) -> None:
        self.judge.note(f"line {event.seq} carries an empty error: the ollama client raises only on a non-empty one "
                        "and reads on")

    def _client_calls(self, calls: Any, event: JSONValue) -> None:
        """Does the ollama client take this chat line's tool calls? It builds a ChatResponse of every
        line, whose Message.ToolCall requires a function with ``name: str`` and ``arguments: Mapping``."""
        if isinstance(calls, list):
            refused = next((f"tool call {n} {why}" for n, call in enumerate(calls) if (why := _refused_call(call))), None)
        else:
            refused = f"tool_calls is {_JSON_KINDS.get(type(calls), 'a value')}, not an array"
        if refused:
            self.corrupt(f"line {event.seq} (byte {event.start}): {refused}: the ollama client (0.4 and later) "
                         "validates every line, and a tool call needs a function with a string name and an object "
                         "of arguments, so it refuses this line and raises", event)
            return
        nameless = next((n for n, call in enumerate(calls) if not call["function"]["name"]), None)
        if nameless is not None:
            self.corrupt(f"line {event.seq} (byte {event.start}): tool call {nameless} names no function (an empty "
                         "name): the ollama client hands the app a call it cannot dispatch", event)

    def _same_answer(self, obj: dict[str, Any], shape: str | None, event: WireEvent) -> None:
        """Every line of one generation names its model and has its shape; a line naming neither
        (only done and the counts, or an empty error) says nothing either way."""
        model = as_str(obj.get("model"))
        if self._first is None:
            self._first = (model, shape, event)
            return
        first_model, first_shape, first_event = self._first
        if first_model is None or first_shape is None:
            first_model, first_shape = first_model or model, first_shape or shape
            self._first = (first_model, first_shape, first_event)
        if (model or first_model) != first_model or (shape or first_shape) != first_shape:
            self.second_generation("the model and shape", (f"{first_model} ({first_shape})", first_event),
                                   f"{model or first_model} ({shape or first_shape})", event)

    def _in_order(self, created_at: Any, event: WireEvent) -> None:
        """Each line's created_at is the server's clock when it wrote the line: one earlier than the
        line before's says lines out of order (the app reads the text scrambled), unless the
        server's clock stepped back; the bytes cannot tell, so it is a doubt. Said at the end: a
        replay from the start goes back too, and its own doubt says more."""
        at = _nanoseconds(created_at)
        if at is None:
            return
        before = self._created
        self._created = (at, created_at, event)
        if before is not None and at < before[0] and self._went_back is None:
            self._went_back = (f"created_at goes back from {before[1]} (seq {before[2].seq}) to {created_at} at seq {event.seq} "
                               f"(byte {event.start}): lines out of order, or the server's clock stepped back; the bytes "
                               "cannot tell", event.seq, event.start)

    def _tool_call(self, call: dict[str, Any], t: float | None) -> None:
        function = as_dict(call.get("function"))
        self._calls += 1
        call_id = as_str(call.get("id")) or f"ollama-call-{self._calls}"
        block = self.tool_block(0, None, id=call_id, name=as_str(function.get("name")), t=t)
        args = function.get("arguments")
        if isinstance(args, str):  # not what Ollama sends (the client refuses it), but parse it like a fragment stream
            block.arguments_raw = args
        else:
            block.arguments = args if args is not None else {}
            block.arguments_raw = dumps(block.arguments)
            block.closed = True

    def _usage(self, obj: dict[str, Any]) -> None:
        usage = self.turn.usage
        usage.raw = {k: v for k, v in obj.items() if k.endswith(("_count", "_duration"))}
        usage.input = as_int(obj.get("prompt_eval_count"))
        usage.output = as_int(obj.get("eval_count"))
        if usage.input is not None or usage.output is not None:
            usage.total = (usage.input or 0) + (usage.output or 0)

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        if self._waiting is not None and self._waiting[2]:  # no line showed a shape: either client reads on
            self._read_on(self._waiting[0])
        self.close_blocks()
        if self._went_back is not None:
            self.judge.doubt(*self._went_back)
        return self.verdict(end, expected='a line with "done": true')


# Go's RFC 3339 with nanoseconds, as Ollama writes created_at (trailing zeros of the fraction dropped)
_CREATED_AT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def _nanoseconds(created_at: Any) -> int | None:
    """``created_at`` as nanoseconds since the epoch; None where it is not Go's RFC 3339."""
    if type(created_at) is not str:
        return None
    match = _CREATED_AT.fullmatch(created_at)
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    try:
        seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    except ValueError:
        return None
    return int(seconds) * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


def _refused_line(obj: dict[str, Any], shape: str | None) -> tuple[str | None, str | None]:
    """Why the ollama client's response model for ``shape`` (``ChatResponse``, ``GenerateResponse``,
    or None: what both want) refuses the line ``obj`` (None where it takes it), and the first count
    written as a string, which is pydantic's to parse and is not judged here. Run on every line: the
    members the line holds are walked once."""
    if shape == "chat":
        message = obj.get("message")
        if not isinstance(message, dict):
            return f"has {_held(obj, 'message')} for its message, not an object", None
        if not isinstance(message.get("role"), str):
            return f"has {_held(message, 'role')} for its message's role, not a string", None
        for key in _MESSAGE_STRINGS:
            value = message.get(key)
            if value is not None and not isinstance(value, str):
                return f"has {_held(message, key)} for its message's {key}, not a string", None
    strings = _GENERATE_LINE_STRINGS if shape == "generate" else _LINE_STRINGS
    string_count = None
    for key, value in obj.items():
        if value is None:
            continue
        kind = type(value)
        if key in strings:
            if kind is not str:
                return f"has {_held(obj, key)} for its {key}, not a string", None
        elif key in _COUNTS and kind is not int:
            # a float the decoder read may be an integer past 64 bits (the client reads those exactly),
            # so only a fraction is surely refused
            fraction = kind is float and math.isfinite(value) and not value.is_integer()
            if kind is list or kind is dict or fraction:
                return f"has {'a fraction' if fraction else _held(obj, key)} for its {key}, not an integer", None
            if kind is str and string_count is None:
                string_count = key
    return None, string_count


def _refused_call(call: Any) -> str | None:
    """Why the ollama client's Message.ToolCall refuses ``call``; None where it takes it."""
    if not isinstance(call, dict):
        return f"is {_JSON_KINDS.get(type(call), 'a value')}, not an object"
    function = call.get("function")
    if not isinstance(function, dict):
        return f"has {_held(call, 'function')} for its function, not an object"
    if not isinstance(function.get("name"), str):
        return f"has {_held(function, 'name')} for its function's name, not a string"
    if not isinstance(function.get("arguments"), dict):
        return f"has {_held(function, 'arguments')} for its function's arguments, not an object"
    return None


def _held(owner: dict[str, Any], key: str) -> str:
    """What ``owner`` holds under ``key``, in JSON's words."""
    return _JSON_KINDS.get(type(owner[key]), "a value") if key in owner else "nothing"
