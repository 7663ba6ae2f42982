"""The block bookkeeping the openai, gemini and ollama assemblers share.

A dialect module subclasses ``AssemblerBase`` and, per decoded event, calls:

- ``self.seen(event, name)`` first (counts the event, remembers where it was and what
  it was called, for reasons; any event after the terminal signal contradicts the closed
  response);
- ``self.payload(event, text)`` for SSE/event-stream JSON payloads (unparseable JSON is
  recorded as corrupt and ``None`` is returned);
- ``self.append(choice, kind, text, t, key=None)`` to grow a text/thinking/refusal block
  (a new block starts whenever the last block of the choice is a different one, so a
  tool call between two texts leaves two text blocks);
- ``self.tool_block(choice, key, ...)`` to open a tool call, then
  ``self.grow(block, "arguments_raw", fragment)`` for its argument fragments (``+=`` on the
  attribute would copy the whole string per fragment); ``flush_text()`` before reading
  a grown block's ``text`` or ``arguments_raw`` mid-stream;
- ``self.corrupt(reason, event)`` / ``self.errored(event, error)`` for findings,
  ``self.close_unit(unit, by, event)`` when the provider closes a unit and
  ``self.reopened(unit, what, event)`` before using one,
  ``self.terminal(event, stop_raw, normalized, name)`` when the provider's end signal arrives;
- and implements ``finish(end)`` as ``return self.verdict(end, expected="...")``.

Findings, closed units and the verdict are the one mechanism in ``judge.py`` (``Judge``),
which the Anthropic and Bedrock modules use directly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import orjson

from streamtap.wire import SSEEvent, WireEvent
from streamtap.wire.partial_json import exact_loads

from .judge import Fragments, Judge, bounded_error_value, error_text, parse_arguments, sdk_loads

from .turn import Block, BlockKind, Choice, Dialect, StreamEnd, Turn, Verdict, VerdictKind

MAX_CHOICES = 128  # a bound, so a hostile index cannot make a huge list
RESPONSE = "the response"  # the unit every terminal signal closes

# normalized stop reason -> verdict kind
STOP_VERDICT: dict[str, VerdictKind] = {
    "end_turn": VerdictKind.COMPLETE,
    "stop_sequence": VerdictKind.COMPLETE,
    "tool_use": VerdictKind.COMPLETE,
    "max_tokens": VerdictKind.STOPPED_BY_LIMIT,
    "context_window": VerdictKind.STOPPED_BY_LIMIT,
    "paused": VerdictKind.STOPPED_BY_LIMIT,  # Anthropic pause_turn: the caller must continue the turn
    "filtered": VerdictKind.FILTERED,
    "refusal": VerdictKind.FILTERED,
    "malformed_output": VerdictKind.ERRORED,  # the model emitted a call the provider could not parse
    "error": VerdictKind.ERRORED,
    "other": VerdictKind.UNKNOWN,
}

# when several choices end differently, the turn is judged by the worst one
_SEVERITY = [
    VerdictKind.COMPLETE,
    VerdictKind.UNKNOWN,
    VerdictKind.STOPPED_BY_LIMIT,
    VerdictKind.FILTERED,
    VerdictKind.ERRORED,
]

def worst_stop(normalized: list[str]) -> str:
    """The normalized stop reason that decides a multi-choice turn."""
    return max(normalized, key=lambda n: _SEVERITY.index(STOP_VERDICT.get(n, VerdictKind.UNKNOWN)))


def loads(text: str | bytes, exact_integers: bool = False) -> Any:
    """JSON or raise ValueError (orjson's error is a ValueError). With ``exact_integers``, an
    integer past 64 bits is read exactly, as the SDKs read it, not as orjson's double: asked
    for the events that carry tool arguments, as every event pays for the check."""
    return exact_loads(text) if exact_integers else orjson.loads(text)


def dumps(value: Any) -> str:
    """Compact JSON text, as orjson writes it; also for values nested deeper, or integers
    longer, than orjson writes."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as error:
        return _dumps_past_orjson(value, error)


# orjson reads 1024 levels but writes only 254; it writes no integer past 64 bits, which exact reads give
_PAST_ORJSON = ("Recursion limit reached", "Integer exceeds 64-bit range")


def _dumps_past_orjson(value: Any, error: TypeError) -> str:
    """The same compact text through the json module, which writes any depth and any integer a
    parse gave; any other orjson error (a type it cannot write, a lone surrogate) is raised as before."""
    if str(error) not in _PAST_ORJSON:
        raise error
    return json.dumps(json_ready(value), ensure_ascii=False, separators=(",", ":"))


def json_ready(value: Any, text: Callable[[str], str] | None = None) -> Any:
    """``value`` for the json module to write as orjson would: a NaN or an infinity (which the SDKs'
    parsers read) as null, where the json module writes ``NaN``, no JSON; every text, keys too,
    through ``text`` if given. Containers are copied, the caller's value stays as it was. With an
    explicit stack: the values that come here are nested deeper than orjson writes."""
    root: list[Any] = [value]
    todo: list[tuple[Any, Any]] = [(root, 0)]
    while todo:
        into, key = todo.pop()
        item = into[key]
        if isinstance(item, str):
            if text is not None:
                into[key] = text(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                into[key] = None
        elif isinstance(item, dict):
            into[key] = node = {text(k) if text is not None and isinstance(k, str) else k: v for k, v in item.items()}
            todo.extend((node, k) for k in node)
        elif isinstance(item, (list, tuple)):
            into[key] = node = list(item)
            todo.extend((node, i) for i in range(len(node)))
    return root[0]


_BOM = b"\xef\xbb\xbf"
_FIRST_LINE = re.compile(rb"[^\r\n]*")
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")


def first_line_lost_to_bom(event: SSEEvent, fields: frozenset[bytes]) -> str | None:
    """The field of the stream's first line when the openai and anthropic SDKs lose it to a UTF-8 BOM
    at byte 0, it is one of ``fields`` (those the dialect's SDK reads) and it belongs to ``event``;
    else None. The SSE rules drop the BOM; the decoder both SDKs share decodes each line as utf-8 and
    keeps it, so it reads the first line's field as '\\ufeff' + its name, one it ignores."""
    raw = event.raw
    if event.start != 0 or not raw.startswith(_BOM):
        return None
    rest = raw[len(_BOM):]
    field = _FIRST_LINE.match(rest).group().partition(b":")[0]  # type: ignore[union-attr]
    # a blank line before the event's own lines: the first line was in a block never dispatched
    if field not in fields or _BLANK_LINE.search(rest.rstrip(b"\r\n")):
        return None
    return field.decode()


_DATA_FIELD = frozenset({b"data"})


def error_message(obj: Any) -> str:
    """A one-line message from the error shapes providers use."""
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, str):
            return inner
        if isinstance(inner, dict):
            for key in ("message", "Message", "msg", "detail"):
                if isinstance(inner.get(key), str):
                    kind = inner.get("type") or inner.get("code") or inner.get("status")
                    return f"{kind}: {inner[key]}" if kind else inner[key]
        for key in ("message", "Message"):
            if isinstance(obj.get(key), str):
                return obj[key]
    if isinstance(obj, list) and obj:
        return error_message(obj[0])
    return str(obj)[:200]


def error_fields(obj: Any) -> dict[str, Any]:
    """{type, code, status, message} from the error shapes providers use (for ``Judge.errored``)."""
    inner = obj.get("error", obj) if isinstance(obj, dict) else obj
    if not isinstance(inner, dict):
        return {"message": error_text(inner) if isinstance(inner, str) else one_line(str(inner)[:200])}
    message = next((inner[k] for k in ("message", "Message", "msg", "detail") if isinstance(inner.get(k), str)), None)
    if message is None and isinstance(obj, dict):
        message = next((obj[k] for k in ("message", "Message") if isinstance(obj.get(k), str)), None)
    fields = {"type": inner.get("type"), "code": inner.get("code"), "status": inner.get("status"),
              "message": error_text(message) if message is not None else one_line(str(inner)[:200])}
    # (bounded here too: the session keeps these fields without the judge, for an SSE error: line)
    return {k: bounded_error_value(v) for k, v in fields.items() if v is not None}


def not_a_json_object(text: str) -> bool:
    """Whether event data is empty or no JSON object: an SSE ``event: error`` so is still the
    provider saying it failed (the SDKs raise on it either way), errored, not corrupt."""
    try:
        return type(loads(text)) is not dict if text.strip() else True
    except ValueError:
        return True


def error_fields_of_text(text: str) -> dict[str, Any]:
    """``error_fields`` of an error sent as text: its JSON, or the text itself when it is none."""
    try:
        return error_fields(loads(text))
    except ValueError:
        return error_fields(text)


def as_dict(value: Any) -> dict[str, Any]:
    """The value if it is an object, else {}: providers (and faults) can put anything anywhere."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def common_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share: the index of their first difference."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


class StartOver:
    """Watches a stream whose every chunk is a whole object (Chat Completions, Gemini SSE and JSON array, Ollama
    NDJSON: a chunk's data as text, or a line's raw bytes) for the
    response starting over: replayed from its start after a cut and stitched on, it brings back the
    chunks it began with, byte for byte and in order, after the answer had begun.

    A replay that begins again at the body's p-th chunk brings back all p chunks before it, so a
    repeat counts only when every one of them comes back in a row (the first ``RECALLED`` of them,
    when p is larger). The body's first chunks (up to ``KEPT`` of them) must also all differ, so a
    server that sends one empty chunk many times, or a token that recurs, is not taken for a replay.
    A server whose chunks carry nothing that changes from one to the next (Ollama's /v1 names the
    role on every chunk, and its time in whole seconds) sends a refrain's chunks byte for byte
    again: there a repeat counts from the ``least``-th chunk on only, and an answer that only opens
    the same way twice (a second code fence in the same language) is not taken for a replay. The
    bytes still cannot tell a replay from chunks sent twice, so this is a doubt (the answer is
    ``unknown``), not a corruption.

    Per chunk the assembler calls ``see`` only when ``busy`` or the data is ``first``: the rest
    of a long answer costs one comparison each."""

    KEPT = 3  # the body's first chunks kept whole, which must all differ
    RECALLED = 64  # the body's first chunks kept as hashes, so memory stays bounded in a long answer

    def __init__(self, assembler: AssemblerBase, least: int = 1) -> None:
        self._assembler = assembler
        self._least = least  # the first chunk's earliest place to come back at
        self.first: str | bytes | None = None  # the data of the body's first chunk (None: nothing more to watch)
        self.busy = True  # keeping the first chunks, or watching them come back
        self._opening: list[str | bytes] = []  # the data of the body's first chunks, at most KEPT
        # the hashes of the body's first chunks, at most RECALLED: a repeat starts only where the first
        # chunk comes back whole, so a chance equality of two hashes (2**-64) can only raise a doubt
        self._digests: list[int] = []
        # (where, how many must come back, how many did so far) for each place the first chunk came
        # back at whose run is still whole: runs may overlap, and a failed one must not hide the next
        self._runs: list[tuple[WireEvent, int, int]] = []

    def see(self, data: str | bytes, event: WireEvent) -> None:
        digests = self._digests
        digest = hash(data)
        if self._runs:
            runs = []
            for at, needed, matched in self._runs:
                if digest == digests[matched]:
                    if matched + 1 == needed:
                        self._doubt(at, needed)
                        return
                    runs.append((at, needed, matched + 1))
            self._runs = runs
        place = len(digests)  # this chunk's place (RECALLED: that place or any later one)
        if place < self.RECALLED:
            digests.append(digest)
            if place < self.KEPT:
                self._opening.append(data)
                self.first = self._opening[0]
        if place >= self._least and data == self.first and self._began():
            opening = self._opening[:place]
            if len(set(opening)) == len(opening):
                if place == 1:
                    self._doubt(event, 1)
                    return
                self._runs.append((event, place, 1))
        self.busy = bool(self._runs) or len(digests) < self.RECALLED

    def _began(self) -> bool:
        return any(choice.blocks for choice in self._assembler.turn.choices)

    def _doubt(self, at: WireEvent, needed: int) -> None:
        # the judge tells the first doubt only: nothing more to watch
        self._runs, self.busy, self.first = [], False, None
        self._assembler.judge.doubt(
            f"the stream's first {needed} chunk(s) come again, byte for byte, from seq {at.seq} (byte {at.start}) "
            "after the answer began: the response replayed from its start after a cut and stitched on, or chunks "
            "sent twice; the bytes cannot tell which", at.seq, at.start)


class AssemblerBase:
    """State shared by the dialect assemblers; every finding and verdict goes through ``Judge``."""

    dialect: Dialect = Dialect.UNKNOWN
    wire: str = "sse"
    # The dialect's SDK reads SSE with the decoder the openai and anthropic SDKs share, which also
    # dispatches blocks that have no data line: the session then offers those as empty events.
    sdk_dispatches_empty_events = False
    choice_word = "choice"  # what the dialect calls one of several answers, for reasons

    def __init__(self, wire: str | None = None) -> None:
        if wire:
            self.wire = wire
        self.turn = Turn(self.dialect)
        self.judge = Judge(self.turn)
        self._stop: tuple[str | None, str] | None = None  # raw, normalized stop reason
        self._keys: dict[tuple[int, Any], Block] = {}  # (choice, key) -> block
        self._growing: Fragments | None = None  # the block field growing now (see grow), not yet in it

    @property
    def last_seq(self) -> int | None:
        return self.judge.last_seq

    @property
    def last_offset(self) -> int | None:
        return self.judge.last_offset

    # -- per-event bookkeeping ------------------------------------------------------
    def seen(self, event: WireEvent, name: str | None = None) -> None:
        """Count an event; any event after the response was closed contradicts it."""
        judge = self.judge
        self.turn.events += 1  # Judge.seen, inlined: once per event
        judge.last_seq, judge.last_offset, judge.last_end = event.seq, event.start, event.end
        if name is not None:
            judge.last_name = name
        if RESPONSE in judge.closed_units:
            judge.reopened(RESPONSE, f"event {name or type(event).__name__}", event.seq, event.start)

    def empty_data(self, event: SSEEvent, sdk: str) -> None:
        """An event whose data is empty or blank, where the ``sdk`` parses every event's data as JSON."""
        if event.start == event.end:  # offered by the session: a block the HTML rules do not dispatch
            self.corrupt(f"the block at byte {event.start} has no data line: the HTML rules drop it, but the {sdk} "
                         f"SDK dispatches it (as event {event.event!r}) and fails to parse its empty data as JSON", event)
        else:
            self.corrupt(f"event {event.event!r} at seq {event.seq} (byte {event.start}) has empty data: the {sdk} "
                         f"SDK parses it as JSON and fails", event)

    def first_event_lost_to_bom(self, event: SSEEvent) -> None:
        """The stream's first event (at byte 0), which the openai SDK loses when a UTF-8 BOM hides its
        data line (``first_line_lost_to_bom``). A hidden event line costs nothing: the SDK parses every
        event's data, whatever its name."""
        if first_line_lost_to_bom(event, _DATA_FIELD) is not None:
            self.corrupt("a UTF-8 BOM at byte 0: the SSE rules drop it, but the openai SDK keeps it, so the stream's "
                         "first line, the first event's data line, is a field it ignores: the app never gets that "
                         "event", event)

    def payload(self, event: WireEvent, text: str | bytes, exact_integers: bool = False) -> Any:
        """The event's JSON as the dialect's SDK reads it (the json module: ``sdk_loads``), or None
        once it was judged corrupt."""
        try:
            return sdk_loads(text, exact_integers, self.judge)
        except ValueError as exc:
            self.corrupt(f"event data is not JSON ({one_line(str(exc), 80)})", event)
            return None

    def content(self, t: float | None) -> None:
        if t is not None and self.turn.timing.first_content is None:
            self.turn.timing.first_content = t

    # -- findings ---------------------------------------------------------------------
    def corrupt(self, reason: str, event: WireEvent | None = None, **evidence: Any) -> None:
        seq, offset = self._where(event)
        self.judge.corrupt(reason, seq, offset, **evidence)

    def second_generation(self, what: str, first: tuple[str, WireEvent], value: str, event: WireEvent,
                          **evidence: Any) -> None:
        """``what``, an id every event of one generation repeats, is ``value`` at ``event`` where it
        was ``first`` (the value and its event): another generation was stitched on (a retry after
        a cut, say). Corrupt, naming both."""
        first_value, at = first
        self.corrupt(f"{what} changed from {first_value} (seq {at.seq}, byte {at.start}) to {value} at seq {event.seq} "
                     f"(byte {event.start}): two generations in one stream", event, first_seq=at.seq,
                     first_offset=at.start, **evidence)

    def sent_twice(self, event: WireEvent, changing: str, unit: str = "chunk", unless: str = "") -> None:
        """``event`` repeats the chunk before it byte for byte, though ``changing`` differs from one
        chunk of an answer to the next: the app reads its content twice. A doubt, not a corruption:
        ``unless`` says how a server could still have meant it."""
        self.judge.doubt(f"the {unit} at seq {event.seq} (byte {event.start}) repeats the one before it byte for byte, "
                         f"{changing} too: a {unit} sent twice, whose content the app reads twice"
                         f"{f', unless {unless}' if unless else ''}; the bytes cannot tell", event.seq, event.start)

    def errored(self, event: WireEvent | None, error: dict[str, Any]) -> None:
        seq, offset = self._where(event)
        self.judge.errored({"source": "stream", **error}, seq, offset)


    def close_unit(self, unit: str, by: str, event: WireEvent) -> None:
        self.judge.close(unit, by, event.seq, event.start)

    def reopened(self, unit: str, what: str, event: WireEvent, **evidence: Any) -> bool:
        return self.judge.reopened(unit, what, event.seq, event.start, **evidence)

    def terminal(self, event: WireEvent, raw: str | None, normalized: str, name: str = "the terminal event") -> None:
        """The provider's end signal: it closes the response."""
        if self._stop is None:
            self._stop = (raw, normalized)
            self.judge.terminal(name, event.seq, event.start)
            self.judge.close(RESPONSE, name, event.seq, event.start)
        self.judge.stop_reason(raw, normalized)

    def choice_stops(self, normalized: dict[int, str]) -> None:
        """Each choice's normalized stop reason, where a turn has several: each choice is judged by its own."""
        if len(normalized) > 1:
            self.judge.choice_stops = {index: (n, STOP_VERDICT.get(n, VerdictKind.UNKNOWN)) for index, n in normalized.items()}

    def note(self, text: str) -> None:
        self.judge.note(text)

    @property
    def terminal_seen(self) -> bool:
        return self._stop is not None

    @property
    def troubled(self) -> bool:
        """An in-band error or a corruption was found already."""
        return self.judge.error_at is not None or self.judge.problem is not None

    def _where(self, event: WireEvent | None) -> tuple[int | None, int | None]:
        if event is None:
            return self.judge.last_seq, self.judge.last_offset
        return event.seq, event.start

    # -- blocks -----------------------------------------------------------------------
    def choice(self, index: int) -> Choice:
        """The turn's choice ``index``, made when new. An index beyond MAX_CHOICES halts the assembly
        (the dialect must read no more once ``halted``) and gets a choice outside the turn, so the
        event being read cannot fold another choice's content into one the turn keeps."""
        if type(index) is int and index >= MAX_CHOICES:
            self._beyond_choices(index)
            return Choice(index)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            self._unusable_choice(index)
            index = 0
        choices = self.turn.choices
        while len(choices) <= index:
            choices.append(Choice(len(choices)))
        return choices[index]

    def _beyond_choices(self, index: int) -> None:
        judge = self.judge
        judge.halt(f"{self.choice_word} index {index} is beyond the {MAX_CHOICES} {self.choice_word}s streamtap "
                   f"assembles; streamtap stopped assembling the answer at event {judge.last_seq} (byte "
                   f"{judge.last_offset}) to bound its memory", judge.last_seq, judge.last_offset,
                   max_choices=MAX_CHOICES, index=index)

    def _unusable_choice(self, index: Any) -> None:
        """An index that is no whole number from 0 (a bool, a negative or a string) is read as choice 0,
        where a client puts it elsewhere (a list indexed with True or -1) or fails: content may have
        been joined to another choice's, so an answer that ended is unknown, not complete."""
        shown = repr(index)[:20]  # repr: a string from the wire must not put control characters in a log line
        self.note(f"{self.choice_word} index {shown} is not usable; counted as 0")
        judge = self.judge
        judge.doubt(f"{self.choice_word} index {shown} at seq {judge.last_seq} (byte {judge.last_offset}) is not a "
                    f"{self.choice_word} index: its content was counted as {self.choice_word} 0's, where a client "
                    f"puts it elsewhere or fails, so the answer may join two {self.choice_word}s",
                    judge.last_seq, judge.last_offset)

    @property
    def halted(self) -> bool:
        """The answer passed a bound (``Judge.halt``): the dialect reads no more events."""
        return self.judge.halted

    def new_block(self, choice: int, kind: BlockKind, key: Any = None, **fields: Any) -> Block:
        target = self.choice(choice)
        blocks = target.blocks
        block = Block(kind, len(blocks), **fields)
        blocks.append(block)
        if key is not None:
            self._keys[(target.index, _hashable(key))] = block
        return block

    def block(self, choice: int, key: Any) -> Block | None:
        return self._keys.get((choice, _hashable(key)))

    def append(self, choice: int, kind: BlockKind, text: str, t: float | None, key: Any = None) -> Block:
        """Grow a text-like block: by key when the provider names blocks, else the last one."""
        if key is None and text and type(choice) is int and choice >= 0:
            # the common case, once per event: the same block grows again
            choices = self.turn.choices
            if choice < len(choices):
                blocks = choices[choice].blocks
                if blocks:
                    block = blocks[-1]
                    growing = self._growing
                    if growing is not None and block is growing.block and block.kind is kind and not block.closed \
                            and growing.field == "text":
                        growing.append(text)
                        if t is not None and self.turn.timing.first_content is None:
                            self.turn.timing.first_content = t
                        return block
        target = self.choice(choice)
        choice = target.index
        if key is not None:
            block = self.block(choice, key)
            if block is None:
                block = self.new_block(choice, kind, key)
        else:
            blocks = target.blocks
            block = blocks[-1] if blocks and blocks[-1].kind is kind and not blocks[-1].closed else None
            if block is None:
                block = self.new_block(choice, kind)
        if text:
            self.grow(block, "text", text)
            self.content(t)
        return block

    def grow(self, block: Block, field: str, text: str) -> None:
        """Add ``text`` to a block's ``text`` or ``arguments_raw``, joined lazily (a str attribute
        grown with += is copied whole every time) and kept up to the turn's cap (``Judge.kept``)."""
        growing = self._growing
        if growing is None or block is not growing.block or field != growing.field:
            self.flush_text()
            growing = self._growing = Fragments(self.judge, block, field)
        growing.append(text)

    def flush_text(self) -> None:
        """Write the fragments ``grow`` holds into their block.

        ``judge`` and ``close_blocks`` call it; a dialect that reads ``text`` or ``arguments_raw``
        of a block grown by ``append``/``grow`` before the end must call it first."""
        growing = self._growing
        if growing is not None:
            self._growing = None
            growing.write()

    def tool_block(self, choice: int, key: Any, *, id: str | None, name: str | None, t: float | None) -> Block:
        self.content(t)
        return self.new_block(choice, BlockKind.TOOL_CALL, key, id=id, name=name, arguments_raw="")

    # -- the verdict ------------------------------------------------------------------
    def close_blocks(self) -> None:
        """Parse arguments of every tool call; dialects whose blocks have no stop event call this."""
        self.flush_text()
        for choice in self.turn.choices:
            for block in choice.blocks:
                if block.kind is BlockKind.TOOL_CALL and block.arguments is None and block.arguments_error is None:
                    if block.arguments_raw is not None:
                        parse_arguments(block, block.arguments_raw, lone_surrogates=self.judge)
                block.closed = True

    def verdict(self, end: StreamEnd, expected: str) -> tuple[Turn, Verdict]:
        """The verdict from the events alone. ``expected`` names the missing terminal signal."""
        self.flush_text()
        judge = self.judge
        early = judge.early_verdict()
        if early is not None:
            return self.turn, early
        if self._stop is None:
            return self.turn, judge.truncated(f"no terminal signal ({expected})", end)
        raw, normalized = self._stop
        kind = STOP_VERDICT.get(normalized, VerdictKind.UNKNOWN)
        return self.turn, judge.finished(kind, judge.terminal_name or "the terminal event", raw, end=end.value)
