"""Protocol positions: the places in a response body where a cut hurts most (sans-IO).

Fault injection (``cut:at=NAME``) and the cut sweep ask for them; they are read off what
the dialect's own assembler makes of the stream, never off per-dialect shapes, so a
dialect added later has them as soon as its assembler builds blocks and verdicts:

- ``tool-args``: one byte into the first tool-call argument fragment: the first event, from
  the one that opened a tool call on, that carries a non-empty beginning of the call's
  arguments as a JSON string (or the whole arguments as a JSON object). In an event-stream
  message (whose payload may be wrapped, e.g. base64) the cut falls mid-payload instead.
- ``escaped-quote``: right after the first escaped quote (``\\"`` inside a JSON string) of
  any event, in its JSON (an SSE event's data, an event-stream message's payload).
- ``between-blocks``: before the event that opens the turn's second block (it may carry more of
  the first block too, as a Gemini event may: the stream up to it holds one block). None when one
  event opens the first two blocks: no event boundary lies between them.
- ``before-terminal``: before the event that ends the turn (the stream up to it is judged
  ``truncated``; with it, complete or stopped, filtered, errored: no position where the stream
  is judged corrupt before its end), or before the bytes after the last event that do (a JSON
  array's closing ``]``). None once the session stops reading the turn before its end (past
  ``MAX_BLOCKS`` blocks or ``MAX_CHOICES`` choices): what it judges after that says nothing of the end.
- ``prelude`` / ``crc`` (event-stream only): inside the length prelude or the message CRC of
  one message.

``PositionFinder`` takes the events in order (live traffic or a recording) and says where
each position is as soon as that is known; ``find_positions`` runs it over a whole body.
Knowing the turn mid-stream means judging the stream so far: a copy of the session is
closed after each event while a position that needs it is still open.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import pickle
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

from .session import StreamSession
from .turn import NOT_JUDGED, Dialect, Verdict, VerdictKind

POSITION_NAMES = ("tool-args", "escaped-quote", "between-blocks", "before-terminal", "prelude", "crc")
NEEDS_THE_TURN = frozenset({"tool-args", "between-blocks", "before-terminal"})
EVENTSTREAM_ONLY = frozenset({"prelude", "crc"})

_PRELUDE_CUT = 6  # bytes into the 12-byte prelude (inside the headers-length field)
_CRC_CUT = 2  # bytes before the end of the message (inside its 4-byte CRC)


@dataclass(frozen=True, slots=True)
class Position:
    name: str
    event: int  # which event (counting events only, from 0, as served)
    offset: int  # byte offset into the body
    inside: int  # byte offset inside that event
    what: str  # for logs: where, in words


@dataclass(slots=True)
class _Candidate:
    """An event that may carry the first tool-call argument fragment (kept until the arguments are known)."""

    event: int
    start: int
    raw: bytes


class PositionFinder:
    """Feed the body in order: ``event(raw)`` for each event, ``other(raw)`` for bytes that are no
    event (a tail: a JSON array's ``]``). Each call returns the positions that became known, possibly inside an
    earlier event (tool-call arguments are known once the call's block has them); ``holding``
    names the first such earlier event still undecided (a live adapter holds it back meanwhile).

    ``wanted``: the names to look for (default all); ``pick``: the event whose prelude and CRC
    are named (default 0); ``judging``: the StreamSession options the stream was judged with
    (a recording's sentinel, event size limit, status, whether it streamed), so that the turn
    read here is the one its verdict speaks of. The body is one HTTP response (``one_response``)."""

    def __init__(self, dialect: Dialect | str, wire: str, wanted: Iterable[str] = POSITION_NAMES, pick: int = 0,
                 judging: Mapping[str, Any] | None = None) -> None:
        self.wire = wire
        self.wanted = frozenset(wanted) - (frozenset() if wire == "eventstream" else EVENTSTREAM_ONLY)
        self.pick = pick
        self.found: dict[str, Position] = {}
        self.missing: dict[str, str] = {}  # a position looked for that this stream cannot have: why not
        self._session: StreamSession | None = None
        self._events = 0
        self._offset = 0
        self._blocks = 0  # blocks in the turn so far
        self._tools = 0  # blocks with tool-call arguments so far
        self._ended = False
        self._watched: int | None = None  # the first tool block whose arguments are awaited
        self._candidates: list[_Candidate] = []  # events since that call opened
        if self.wanted & NEEDS_THE_TURN:
            try:
                self._session = StreamSession(dialect, wire, keep_arrivals=False, one_response=True, **(judging or {}))
            except ValueError:  # an unknown dialect or wire: no turn to read positions from
                self.wanted -= NEEDS_THE_TURN
            else:  # a dialect that never judges a stream truncated has no terminal event to cut before
                self._ended = _ended(_copy(self._session).close().verdict.kind)
                # said now, not found never: a live cut that can never apply is refused at the flow's start
                if self._ended:
                    self.wanted -= {"before-terminal"}
                if str(dialect) == Dialect.UNKNOWN:  # its assembler builds no blocks: no tool call, no second block
                    self.wanted -= {"tool-args", "between-blocks"}
                if not self.wanted & NEEDS_THE_TURN:
                    self._session = None

    @property
    def holding(self) -> int | None:
        """The first event that may still hold the position (a live adapter holds it and those after
        it back); None when no earlier event is undecided."""
        if not self._candidates or "tool-args" in self.found:
            return None
        return self._candidates[0].event

    def other(self, raw: bytes) -> list[Position]:
        """Bytes that are no event. A JSON array's closing bracket is one: when they end the turn
        (the stream before them truncated, with them complete), before them is ``before-terminal``."""
        n, start = self._events, self._offset
        self._offset += len(raw)
        if self._session is None:
            return []
        self._session.feed(raw)
        if not self._open("before-terminal"):
            return []
        try:
            verdict = _copy(self._session).close().verdict
        except Exception:  # as in _read_turn: a session that cannot be copied has no turn positions
            self._stop_reading("the stream so far could not be copied to judge it")
            return []
        unread = _unread(verdict)
        if unread is not None:
            self._stop_reading(unread)
            return []
        kind, new = verdict.kind, []
        if _ended(kind) and not self._ended:
            what = f"just before the bytes that close the stream after event {n - 1} (with them the stream is {kind})"
            new.append(self._found("before-terminal", n, start, 0, what))
        self._ended = _ended(kind)
        return new

    def event(self, raw: bytes) -> list[Position]:
        n, start = self._events, self._offset
        self._events += 1
        self._offset += len(raw)
        new: list[Position] = []
        if self._open("escaped-quote"):
            k = _escaped_quote_end(raw, self.wire)
            if k is not None:
                new.append(self._found("escaped-quote", n, start, k, f"right after an escaped quote in event {n}"))
        if n == self.pick and self._open("prelude") and len(raw) > _PRELUDE_CUT:
            new.append(self._found("prelude", n, start, _PRELUDE_CUT, f"inside the prelude of event {n}"))
        if n == self.pick and self._open("crc") and len(raw) > _CRC_CUT:
            new.append(self._found("crc", n, start, len(raw) - _CRC_CUT, f"inside the message CRC of event {n}"))
        if self._session is not None:
            self._session.feed(raw)
            if any(self._open(name) for name in NEEDS_THE_TURN):
                new += self._read_turn(n, start, raw)
        return new

    def _open(self, name: str) -> bool:
        return name in self.wanted and name not in self.found

    def _found(self, name: str, n: int, start: int, inside: int, what: str) -> Position:
        position = Position(name, n, start + inside, inside, what)
        self.found[name] = position
        return position

    def _read_turn(self, n: int, start: int, raw: bytes) -> list[Position]:
        """What the stream so far is judged to be, compared with the stream before this event."""
        try:
            analysis = _copy(self._session).close()
        except Exception:  # a session that cannot be copied: no turn positions, and nothing held for them
            self._stop_reading("the stream so far could not be copied to judge it")
            return []
        unread = _unread(analysis.verdict)
        if unread is not None:  # the turn is no longer read: a block or an end seen from here on would be made up
            self._stop_reading(unread)
            return []
        new = []
        blocks = [block for choice in analysis.turn.choices for block in choice.blocks]
        if self._open("between-blocks") and len(blocks) > 1:
            if self._blocks == 1:  # it may carry more of the first block too (Gemini): the cut keeps one block
                new.append(self._found("between-blocks", n, start, 0, f"before event {n}, which opens the turn's second block"))
            else:  # no event boundary lies between the first two blocks: never found, said now
                self._give_up({"between-blocks"}, f"event {n} opens the turn's first two blocks together")
        ended = _ended(analysis.verdict.kind)
        if self._open("before-terminal") and ended and not self._ended:
            what = f"just before the terminal event {n} (with it the stream is {analysis.verdict.kind})"
            new.append(self._found("before-terminal", n, start, 0, what))
        if self._open("tool-args"):
            new += self._watch_tool_calls(n, start, raw, blocks, ended)
        self._blocks, self._ended = len(blocks), ended
        return new

    def _give_up(self, names: frozenset[str] | set[str], why: str) -> None:
        """Stop looking for ``names`` (those not found yet): this stream cannot have them, ``why``."""
        lost = names & self.wanted - self.found.keys()
        self.missing |= dict.fromkeys(lost, why)
        self.wanted -= lost

    def _stop_reading(self, why: str) -> None:
        """No turn position can be read any more: none is found later, and nothing is held for them."""
        self._give_up(NEEDS_THE_TURN, why)
        self._session, self._watched, self._candidates = None, None, []

    def _watch_tool_calls(self, n: int, start: int, raw: bytes, blocks: list, ended: bool) -> list[Position]:
        """Keep the events since a tool call opened until its arguments are known, then find the
        first of them that carries their beginning. A call that never gets arguments (a tool
        without parameters) is given up when another block opens or the turn ends."""
        tools = [block for block in blocks if block.arguments_raw is not None]  # client and server tool calls
        opened = len(tools) > self._tools
        if self._watched is not None and not any(t.arguments_raw for t in tools[self._watched :]):
            if opened or len(blocks) > self._blocks or ended:
                self._watched, self._candidates = None, []
        # a call that opens in the event that ends the turn (Gemini sends its last call with the finishReason)
        # is watched; one that opens after the turn ended is content after the end, no position of this turn
        if opened and self._watched is None and not self._ended:
            self._watched = self._tools
        self._tools = len(tools)
        if self._watched is None:
            return []
        self._candidates.append(_Candidate(n, start, raw))
        known = [t.arguments_raw for t in tools[self._watched :] if t.arguments_raw]
        if not known:
            return []
        position = self._first_fragment(known)
        call = tools[self._watched]
        if position is None and not call.closed and not ended and blocks[-1] is call:
            return []  # the call is still open and its arguments may still grow (Gemini fills `{}` value by value)
        self._watched, self._candidates = None, []  # found, or this call carried no fragment: wait for the next
        return [position] if position is not None else []

    def _first_fragment(self, arguments: list[str]) -> Position | None:
        """The first event that carries the beginning of the arguments; else (Gemini's ``partialArgs``
        stream each value apart, by its JSON path) the first that carries one of their string values."""
        objects = [value for value in map(_json_or_none, arguments) if isinstance(value, dict | list) and value]
        for within in (False, True):
            for candidate in self._candidates:
                inside = self._fragment_at(candidate.raw, arguments, objects, within)
                if inside is not None:
                    n = candidate.event
                    return self._found("tool-args", n, candidate.start, inside,
                                       f"inside the tool-call arguments of event {n}")
        return None

    def _fragment_at(self, raw: bytes, arguments: list[str], objects: list[Any], within: bool = False) -> int | None:
        """Where, inside this event, a cut lands one byte into the argument fragment it carries
        (``within``: a string value of the arguments)."""
        if self.wire == "eventstream":
            payload = _eventstream_payload(raw)
            if payload is None:
                return None
            start, end = payload
            texts = [raw[start:end].decode("utf-8", "surrogateescape")]
            texts += [t for t in map(_base64_json, _string_values(texts[0])) if t is not None]
            if any(_carries(text, arguments, objects, within) is not None for text in texts):
                return (start + end) // 2  # the payload's framing (or base64) hides where the value sits
            return None
        text = raw.decode("utf-8", "surrogateescape")
        at = _carries(text, arguments, objects, within)
        if at is None:
            return None
        # keep exactly the first character of the arguments: past the quote and one byte of a
        # string's text, past the bracket of an object
        return len(text[:at].encode("utf-8", "surrogateescape")) + (2 if text[at] == '"' else 1)


def find_positions(pieces: Iterable[tuple[bytes, bool]], dialect: Dialect | str, wire: str, **options: Any) -> list[Position]:
    """Every protocol position of a body given as (raw, is_event) pieces that tile it, in
    ``POSITION_NAMES`` order; ``options`` as ``scan_positions`` takes them."""
    found = scan_positions(pieces, dialect, wire, **options).found
    return sorted(found.values(), key=lambda p: POSITION_NAMES.index(p.name))


def scan_positions(
    pieces: Iterable[tuple[bytes, bool]],
    dialect: Dialect | str,
    wire: str,
    *,
    only: str | None = None,
    pick: int | None = None,
    judging: Mapping[str, Any] | None = None,
) -> PositionFinder:
    """A finder that read a whole body (as ``find_positions`` takes it): its ``found`` positions,
    and in ``missing`` why a position looked for cannot be in this stream, where that is known.
    ``only``: the one name to look for; ``pick``: the event-stream message for prelude/crc
    (default the middle one); ``judging``: as ``PositionFinder`` takes it."""
    pieces = list(pieces)
    events = sum(1 for _raw, is_event in pieces if is_event)
    if pick is None or not 0 <= pick < events:
        pick = events // 2
    finder = PositionFinder(dialect, wire, frozenset([only] if only else POSITION_NAMES), pick, judging)
    for raw, is_event in pieces:
        if is_event:
            finder.event(raw)
        else:
            finder.other(raw)
        if len(finder.found) == len(finder.wanted):
            break
    return finder


def _copy(session: StreamSession) -> StreamSession:
    """An independent copy to close: a pickle round trip costs about half a deepcopy of the same
    session (measured over the captures: 0.95-1.36 s against 2.17-2.59 s)."""
    try:
        return pickle.loads(pickle.dumps(session, pickle.HIGHEST_PROTOCOL))
    except Exception:  # something in it does not pickle
        return copy.deepcopy(session)


def _unread(verdict: Verdict) -> str | None:
    """Why the stream so far is no longer read (its ``unknown`` verdict says), or None. Past that
    event the turn stops growing: no block opens, and nothing ends it, whatever the stream holds."""
    if verdict.kind is VerdictKind.UNKNOWN and verdict.reason.startswith(NOT_JUDGED):
        return verdict.reason.removeprefix(NOT_JUDGED).lstrip(": ")
    return None


def _ended(kind: VerdictKind) -> bool:
    """The stream so far has its end: neither cut short nor (where a fault or a splice made it
    so) beyond judging by its terminal event."""
    return kind not in (VerdictKind.TRUNCATED, VerdictKind.CORRUPT)


# --- reading JSON inside an event, with byte positions ----------------------------------------


def _carries(text: str, arguments: list[str], objects: list[Any], within: bool = False) -> int | None:
    """The index of the first JSON value in ``text`` that is a non-empty beginning of one of the
    ``arguments`` (a string) or one of the argument ``objects`` itself; ``within``: the first
    non-empty string that is a string value in one of the ``arguments``. None when there is none."""
    decoder = json.JSONDecoder()
    for kind, at, value in _values(text):
        if kind == "string":
            if value and within:
                literals = (json.dumps(value), json.dumps(value, ensure_ascii=False))
                if any(literal in a for a in arguments for literal in literals):
                    return at
            elif value and any(a.startswith(value) for a in arguments):
                return at
        elif objects:
            try:
                parsed, _end = decoder.raw_decode(text, at)
            except ValueError:
                continue
            if parsed in objects:
                return at
    return None


def _values(text: str) -> Iterable[tuple[str, int, Any]]:
    """("string", index of its opening quote, value) for each JSON string that is not an object
    key, and ("object", index, None) for each ``{`` or ``[`` outside strings, in text order."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            try:
                value, end = scanstring(text, i + 1)
            except ValueError:  # not JSON here (an SSE field, a stray quote): go on after it
                i += 1
                continue
            after = end
            while after < n and text[after] in " \t\r\n":
                after += 1
            if after >= n or text[after] != ":":
                yield "string", i, value
            i = end
        elif c in "{[":
            yield "object", i, None
            i += 1
        else:
            i += 1


def _string_values(text: str) -> list[str]:
    return [value for kind, _at, value in _values(text) if kind == "string"]


def _base64_json(value: str) -> str | None:
    """A string that is base64 of a JSON document (a payload wrapped inside a payload), decoded."""
    if len(value) < 8 or value[:1] not in "eW":  # base64 of "{" or "[" starts with e or W
        return None
    try:
        inner = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return inner if _json_or_none(inner) is not None else None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


_SSE_DATA = re.compile(rb"(?:^|(?<=[\r\n]))data:([^\r\n]*)")


def _escaped_quote_end(raw: bytes, wire: str) -> int | None:
    """Just past the first escaped quote (``\\"`` inside a JSON string) of an event: in its
    JSON only (an SSE event's data lines, an event-stream message's payload: never its
    prelude, headers or CRC, whose bytes may spell it by chance)."""
    if wire == "eventstream":
        payload = _eventstream_payload(raw)
        spans = [payload] if payload is not None else []
    elif wire == "sse":
        spans = [match.span(1) for match in _SSE_DATA.finditer(raw)]
    else:  # NDJSON, a JSON array's element: the event is JSON
        spans = [(0, len(raw))]
    for begin, end in spans:
        k = raw.find(b'\\"', begin, end)
        while k >= 0:
            backslashes = 1
            while k - backslashes >= begin and raw[k - backslashes] == 0x5C:
                backslashes += 1
            # an even run of backslashes is escaped backslashes, and the quote after it closes the string
            if backslashes % 2:
                return k + 2
            k = raw.find(b'\\"', k + 1, end)
    return None


def _eventstream_payload(raw: bytes) -> tuple[int, int] | None:
    """(start, end) of an event-stream message's payload inside it."""
    if len(raw) < 16:
        return None
    total, headers_length = struct.unpack(">II", raw[:8])
    start, end = 12 + headers_length, min(total, len(raw)) - 4
    return (start, end) if start <= end else None
