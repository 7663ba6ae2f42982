"""Gemini ``streamGenerateContent``: SSE (``alt=sse``) or one streamed JSON array.

There is no end sentinel: the turn is finished when the last chunk that carries
candidates gives every candidate a ``finishReason`` (older models stamped one on every
chunk, so only the last chunk counts), or when the prompt was blocked. The JSON-array
form must also close its ``]`` (the session sees a missing one as a cut). A blocked prompt
gets no answer, so candidate content in the same stream as a ``blockReason`` means two
responses stitched together: corrupt.

Closed units: a ``finishReason`` closes its candidate once the stream has shown that it
does not stamp one on every chunk (an earlier chunk of that candidate came without one),
and a finishReason other than ``STOP`` always closes it (the legacy stamping was ``STOP``
only). Content for a closed candidate, or another finishReason, is a second generation:
corrupt. Content after a ``STOP`` that came on the candidate's first chunks is either a
model of early 2024 stamping ``STOP`` on every chunk or a second generation appended after
the first finished: the bytes cannot tell, so such a turn is ``unknown``, never complete.
A ``STOP`` on a chunk without content (gateways stamp early empty chunks) closes nothing.

``responseId`` is the same on every chunk (provider-streams.md §5.5): a chunk with another one
is a second generation stitched on (a retry after a cut), so the stream is corrupt. Chunks
without a ``responseId`` (older captures) are not compared.

``usageMetadata`` is a cumulative snapshot (§5.3), so a ``candidatesTokenCount`` that falls says
a second generation or chunks out of order, where no ``responseId`` tells: such a turn is
``unknown``, never complete. Not corrupt: Gemini's other counts are not always cumulative (a real
capture's ``promptTokenCount`` falls from 169 to 79), so a server counting its candidates
otherwise is not ruled out. For the same reason a chunk with content that repeats the one before
it byte for byte, its count too, is one chunk sent twice: ``unknown``.

A streamed function call (Vertex ``partialArgs``, §5.3) ends with a part without
``willContinue``. A ``STOP`` while the call's last part still said ``willContinue`` contradicts
it: corrupt, as other dialects judge a normal stop with a tool call never finished.

google-genai reads each chunk into its pydantic ``GenerateContentResponse`` and raises where a field
it reads has a JSON type the model refuses (a fractional token count, a numeric ``text``, a ``thought``
of ``[]``, a ``thoughtSignature`` that is not base64, ``functionCall.args`` that is no object, a
``parts`` that is no list): the app gets no answer past that chunk, so the stream is corrupt.
Values pydantic's lax mode takes (``"5"`` or ``5.0`` or ``true`` for a count, ``"yes"`` for a
flag) pass.

A part carries one kind of data: ``Part.data`` is a protobuf oneof (``text``, ``inlineData``,
``fileData``, ``functionCall``, ``functionResponse``, ``executableCode``,
``codeExecutionResult``), and the API's JSON holds one member of it per part (``thought`` and
``thoughtSignature`` sit beside it). A part that sets two (a non-empty ``text`` and a
``functionCall``, say) cannot come from the API and cannot be read as one thing: corrupt.

Google's REST client libraries ask for ``$alt=json;enum-encoding=int``: ``finishReason`` and
``blockReason`` then come as numbers. A number the Gemini API and Vertex AI name alike reads as
its name; any other is a stop reason streamtap does not know (``unknown``, saying why).

An ``alt=sse`` event whose JSON spans several ``data:`` lines is read as the SSE rules join them,
but google-genai before 1.74.0 parses each line alone and fails: an answer that ended is then
``unknown``, not complete. So is one whose JSON holds a raw U+0085, U+2028 or U+2029 (JSON allows
them in a string): google-genai before 3.4.0 reads lines with httpx's ``iter_lines``, which breaks
them there as ``str.splitlines`` does, and fails on the pieces; later versions, and its aiohttp
transport, break lines only at CR and LF. A UTF-8 BOM, which the SSE rules drop, every
google-genai keeps on its first line (it decodes as ``utf-8``), which then is no ``data: `` line
and does not parse: corrupt, as any such line is, but for a line of only blanks, which its
aiohttp transport strips and skips and its httpx one parses and fails on: unknown.
"""

from __future__ import annotations

import re
from typing import Any

from streamtap.wire import JSONValue, SSEEvent, Tail, WireEvent
from streamtap.wire.jsonlines import loads as read_json_line

from .common import (
    STOP_VERDICT, AssemblerBase, StartOver, as_dict, as_int, as_list, as_str, dumps, error_fields, loads, one_line,
    worst_stop,
)
from .judge import arguments_not_kept
from .turn import Block, BlockKind, Dialect, StreamEnd, Turn, Verdict, VerdictKind

POLICY = {
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "LANGUAGE",
    "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
}
MALFORMED = {"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"}
_FUNCTION_CALL = '"functionCall"'  # a chunk that may carry arguments, whose integers are read exactly
_OUTPUT_COUNT = '"candidatesTokenCount"'  # a chunk that counts its content cumulatively
_BOM = b"\xef\xbb\xbf"
# what else ends a line for str.splitlines (httpx's iter_lines) that JSON may hold raw, inside a string;
# its other line breaks (\x0b, \x0c, \x1c-\x1e) JSON never holds raw, so such data is malformed already
_SPLITLINES_BREAK = re.compile(rb"\xc2\x85|\xe2\x80[\xa8\xa9]")
_BREAK_NAMES = {b"\xc2\x85": "U+0085 (NEL)", b"\xe2\x80\xa8": "U+2028 (line separator)",
                b"\xe2\x80\xa9": "U+2029 (paragraph separator)"}
# the members of the Part.data oneof: a part sets one of them
PART_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult")
# Google's REST client libraries ask for `$alt=json;enum-encoding=int`, and enums then come as numbers. The
# Gemini API (google.ai.generativelanguage) and Vertex AI (google.cloud.aiplatform) number
# Candidate.FinishReason alike only up to OTHER = 5 (6 is LANGUAGE in one, BLOCKLIST in the other), and
# PromptFeedback's block reason up to PROHIBITED_CONTENT = 4. The assembler is not told which host
# answered, so only the numbers both APIs share are read as names.
FINISH_REASON_NUMBERS = {1: "STOP", 2: "MAX_TOKENS", 3: "SAFETY", 4: "RECITATION", 5: "OTHER"}
BLOCK_REASON_NUMBERS = {1: "SAFETY", 2: "OTHER", 3: "BLOCKLIST", 4: "PROHIBITED_CONTENT"}

# What google-genai (3.6.1, Gemini API and Vertex AI alike) hands its pydantic models, as far as they
# refuse what streamtap reads: a dict is an object of these members, a one-item list a list of that
# shape, OBJECT and LIST any object or list. Null passes anywhere, and members not named here are
# dropped or passed on unread. ``candidates`` is not here: google-genai iterates it before validating
# (a string or an object passes as so many empty candidates), so only the candidates that are
# objects are checked, each as CANDIDATE_SHAPE.
INT, STR, BOOL, BYTES, OBJECT, LIST = "int", "str", "bool", "bytes", "object", "list"
CHUNK_SHAPE: dict[str, Any] = {
    "modelVersion": STR, "responseId": STR, "promptFeedback": OBJECT,
    "usageMetadata": {name: INT for name in ("promptTokenCount", "candidatesTokenCount", "totalTokenCount",
                                            "thoughtsTokenCount", "cachedContentTokenCount")},
}
PART_SHAPE: dict[str, Any] = {
    "text": STR, "thought": BOOL, "thoughtSignature": BYTES,
    "functionCall": {"id": STR, "name": STR, "args": OBJECT, "willContinue": BOOL, "partialArgs": LIST},
    "inlineData": {"mimeType": STR, "data": BYTES},
}
CANDIDATE_SHAPE: dict[str, Any] = {"index": INT, "content": {"role": STR, "parts": [PART_SHAPE]}}
# the strings pydantic reads as a bool (compared lowercased, not stripped), and the value each reads as
_BOOL_WORDS = {"0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
               "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True}
# pydantic decodes bytes as base64 in either alphabet; a character outside both always fails (padding and
# trailing bits it also judges, more strictly than the stdlib: those are left alone)
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/_=-]")
_SHAPE_WORDS = {INT: "an integer", STR: "a string", BOOL: "a boolean", BYTES: "base64 text", OBJECT: "an object",
                LIST: "a list"}


def normalize(reason: str, has_calls: bool) -> str:
    if reason == "STOP":
        return "tool_use" if has_calls else "end_turn"
    if reason == "MAX_TOKENS":
        return "max_tokens"
    if reason in POLICY:
        return "filtered"
    if reason in MALFORMED:
        return "malformed_output"
    return "other"


def _enum_name(value: Any, names: dict[int, str]) -> str:
    """An enum as its name, whether written as the name or as its number; a number whose name
    both APIs do not share stays as its digits (no known name, so normalize reads it as "other")."""
    if type(value) is int:
        return names.get(value, str(value))
    return str(value)


def _raw_error(obj: dict[str, Any]) -> dict[str, Any]:
    """An error Gemini wrote as raw JSON, without ``data:`` lines (the client reads it too)."""
    return {**error_fields(obj), "framing": "raw JSON, no data: line"}


def _lax_bool(value: Any) -> bool | None:
    """``value`` as pydantic's lax mode reads a bool field; None where it refuses it: a JSON boolean,
    0 or 1 as an integer or a float (1.0 is true), or one of ``_BOOL_WORDS`` in any case, unstripped."""
    if isinstance(value, str):
        return _BOOL_WORDS.get(value.lower())
    if isinstance(value, (int, float)) and value in (0, 1):  # (a bool is an int)
        return bool(value)
    return None


def _is_thought(value: Any) -> bool:
    """A part's ``thought`` flag as google-genai reads it (a bool field: "false" or 0 is false)."""
    return value is True or (value is not None and _lax_bool(value) is True)


class Assembler(AssemblerBase):
    dialect = Dialect.GEMINI
    wire = "sse"
    choice_word = "candidate"

    def __init__(self, wire: str | None = None) -> None:
        super().__init__(wire)
        self._finish: dict[int, str] = {}
        self._last_chunk_finished = False
        self._last_candidates_event: WireEvent | None = None
        self._blocked: tuple[WireEvent, str] | None = None
        self._streaming_call: dict[int, Block] = {}  # candidate -> call whose partialArgs are still arriving
        self._calls = 0
        self._unstamped: set[int] = set()  # candidates that had a chunk without a finishReason
        self._stamped: dict[int, WireEvent] = {}  # candidate -> a chunk with content and STOP before any without
        self._ambiguous: tuple[WireEvent, WireEvent] | None = None  # (that chunk, content after it)
        self._output_count: tuple[int, WireEvent] | None = None  # the last candidatesTokenCount, and its chunk
        self._count_fell: tuple[int, WireEvent, int, WireEvent] | None = None  # the first fall: (from, at, to, at)
        self._first_identity: dict[str, tuple[str, WireEvent]] = {}  # responseId and modelVersion, as first named
        self._start_over = StartOver(self)
        self._previous: str | None = None  # the chunk before, which the next must not repeat
        self._unread_numbers: set[int] = set()  # candidates whose finishReason is a number without a shared name
        self._line_split = False  # a chunk google-genai's httpx reader splits was found (the first one is told)
        self._blank_last_line: tuple[int, int, bytes] | None = None  # (seq, offset, line): see tail()

    @property
    def sdk_reads_an_unended_last_line(self) -> bool:
        """google-genai gives the app the ``data: `` lines it gathered when the body ends, a last line
        without its line end included (before 3.4.0 it gave each such line at once)."""
        return self.wire == "sse"

    def feed(self, event: WireEvent, t: float | None) -> None:
        if self.judge.halt_verdict is not None:  # a bound passed: the rest is not read (see AssemblerBase.choice)
            return
        if isinstance(event, SSEEvent):
            self.seen(event, f"chunk {event.seq}")
            if not event.raw.isascii():  # only a BOM or a non-ASCII line break reads otherwise in google-genai
                self._client_lines(event)
            if not event.data.strip():  # google-genai parses every data: line's text as JSON, an empty one too
                self.empty_data(event, "google-genai")
                return
            if "\n" in event.data:  # a data line holds no line end: only joined data lines put one there
                alone = self._chunks_line_by_line(event)
                if alone is not None:
                    for obj in alone:
                        self._chunk(obj, event, t)
                    return
                self._split_data(event)
            self._watch_start_over(event.data, event)
            obj = self.payload(event, event.data, exact_integers=_FUNCTION_CALL in event.data)
        elif isinstance(event, JSONValue):
            self.seen(event, f"element {event.seq}")
            # a gateway that re-requests after a cut can keep writing into the array it opened: the
            # replay then comes as more elements, not as a second [, so the array needs the same watch
            element = _element_text(event.raw)
            self._watch_start_over(element, event)
            # the array's decoder reads integers past 64 bits as doubles: a call's arguments are read again, exactly
            obj = read_json_line(element, exact_integers=True) if _FUNCTION_CALL in element else event.value
        else:
            self.seen(event, type(event).__name__)
            self.corrupt(f"unexpected {type(event).__name__} for Gemini", event)
            return
        if obj is None:
            return
        self._chunk(obj, event, t)

    def _chunk(self, obj: Any, event: WireEvent, t: float | None) -> None:
        if not isinstance(obj, dict):
            self.corrupt("chunk is JSON but not an object", event)
            return
        if "error" in obj:
            self.errored(event, error_fields(obj))
            return
        reason = refused(obj)
        if reason is not None:
            self.corrupt(f"{reason}: google-genai refuses this chunk (its model raises)", event)
            return
        turn = self.turn
        self._response_id(obj, event)
        turn.model = turn.model or as_str(obj.get("modelVersion"))
        turn.response_id = turn.response_id or as_str(obj.get("responseId"))
        if isinstance(obj.get("usageMetadata"), dict):
            self._usage(obj["usageMetadata"], event)
        feedback = as_dict(obj.get("promptFeedback"))
        if feedback.get("blockReason"):
            self._blocked = (event, _enum_name(feedback["blockReason"], BLOCK_REASON_NUMBERS))
        candidates = [c for c in as_list(obj.get("candidates")) if isinstance(c, dict)]
        if candidates:
            self._last_candidates_event = event
            self._last_chunk_finished = all(c.get("finishReason") for c in candidates)
        for candidate in candidates:
            self._candidate(candidate, event, t)
            if self.halted:
                return

    def _watch_start_over(self, data: str, event: WireEvent) -> None:
        start_over = self._start_over
        if start_over.busy or data == start_over.first:
            start_over.see(data, event)
        if data == self._previous and _OUTPUT_COUNT in data and _adds_content(data):  # content adds to a cumulative count
            self.sent_twice(event, "its usageMetadata.candidatesTokenCount")
        self._previous = data

    def _response_id(self, obj: dict[str, Any], event: WireEvent) -> None:
        """Every chunk of one response names the same response and model where it names them."""
        for key in ("responseId", "modelVersion"):
            value = as_str(obj.get(key))
            if not value:
                continue
            first = self._first_identity.setdefault(key, (value, event))
            if value != first[0]:
                self.second_generation(key, first, value, event)
                return

    def _chunks_line_by_line(self, event: SSEEvent) -> list[Any] | None:
        """The chunks of an event whose data lines each hold one, while joined they are no JSON (the
        blank line between two events lost): google-genai before 1.74.0 reads each line as a chunk,
        later ones join them and fail. None for any other event."""
        lines = event.data.split("\n")
        try:
            read_json_line(event.data)
            return None  # JSON joined: the rules' reading (_split_data says what older clients make of it)
        except ValueError:
            pass
        try:
            chunks = [read_json_line(line, exact_integers=_FUNCTION_CALL in line) for line in lines]
        except ValueError:
            return None
        self.judge.doubt(f"chunk {event.seq} (byte {event.start}) holds {len(lines)} data lines that are each a chunk, "
                         "and no JSON joined (the blank line between them lost): google-genai before 1.74.0 reads "
                         "each line as a chunk, later ones join them as the SSE rules do and fail, so whether the app "
                         "read this answer depends on its version", event.seq, event.start)
        return chunks

    def _split_data(self, event: SSEEvent) -> None:
        """An event whose data spans several ``data:`` lines, which the SSE rules join. google-genai
        before 1.74.0 parses each ``data: `` line alone and raises on the first part; 1.74.0 joins
        them as the rules do. Which one the app runs, the bytes cannot tell."""
        lines = event.data.count("\n") + 1
        self.judge.doubt(f"chunk {event.seq} (byte {event.start}) spreads its JSON over {lines} data lines: "
                         "google-genai before 1.74.0 parses each data line alone and fails on it, later ones join "
                         "them as the SSE rules do, so whether the app read this answer depends on its version",
                         event.seq, event.start)

    def _client_lines(self, event: SSEEvent) -> None:
        """Does google-genai read this event's lines as the SSE rules do?"""
        raw = event.raw
        if event.start == 0 and raw.startswith(_BOM):  # the decoder drops it from the data, not from the span
            self.corrupt("a UTF-8 BOM at byte 0: the SSE rules drop it, but google-genai decodes lines as utf-8 "
                         "and keeps it, so its first line is not a 'data: ' line, and it parses that line as JSON "
                         "and fails", event)
        found = None if self._line_split else _SPLITLINES_BREAK.search(raw)
        if found is None:
            return
        self._line_split = True
        offset = event.start + found.start()
        reason = (f"chunk {event.seq} holds a raw {_BREAK_NAMES[found.group()]} at byte {offset}: google-genai "
                  "before 3.4.0 reading through httpx (its sync client, and its async one without aiohttp) breaks "
                  "the line there, as str.splitlines does, and fails to parse the pieces; later versions, and its "
                  "aiohttp transport, break lines only at CR and LF, so whether the app read this answer depends "
                  "on its version and transport")
        self.judge.doubt(reason, event.seq, offset)
        self.note(reason)  # a verdict the doubt leaves alone (a cut, an error) still says so

    def other_lines(self, lines: list[tuple[int, int, bytes]], count: int) -> None:
        """Lines that are neither blank nor ``data: `` lines. google-genai reads no other SSE: it
        gathers such lines until their braces balance and parses them as JSON, raising on an error
        object and on anything that does not parse, and taking any other object as a chunk. The
        first such object is read here, as the client gathers it; any of them makes the answer not
        complete. Lines of only blanks alone leave it unknown: the client's transports disagree on them."""
        seq, offset, _ = lines[0]
        if not any(line.strip() for _, _, line in lines) and count == len(lines):
            self._blank_line(*lines[0])
            return
        run: list[bytes] = []
        depth = 0
        for _, _, line in lines:  # as the client gathers them: until the braces balance
            run.append(line)
            depth += line.count(b"{") - line.count(b"}")
            if depth <= 0:
                break
        try:
            obj = loads(b"\n".join(run))
        except ValueError:
            obj = None
        where = f"byte {offset}" + (f" ({count} such lines)" if count > 1 else "")
        judge = self.judge
        if isinstance(obj, dict) and "error" in obj:
            judge.errored({"source": "stream", **_raw_error(obj)}, seq, offset)
        elif isinstance(obj, dict):
            judge.corrupt(f"a chunk without its 'data: ' at {where}: google-genai reads it, the SSE rules skip it, "
                          f"so this turn lacks it", seq, offset)
        else:
            line = one_line(run[0].decode("utf-8", "replace"), 60)
            judge.corrupt(f"a line that is not a 'data: ' line at {where} ({line}): google-genai parses every "
                          f"other line as JSON and fails on it", seq, offset)

    def tail(self, event: Tail) -> bool:
        """An error the server wrote as raw (multi-line) JSON without ``data:`` lines; the
        official SDK reads these too. Anything else is left to the session as a cut.

        A last line of only blanks is no cut the session sees (no event could begin there), but
        google-genai reads a last line without its line end when the body ends cleanly, as it reads
        every line: through aiohttp it strips the line's end of blanks and skips what is left empty;
        through httpx it skips only an empty line and parses any other that is not a ``data: `` line
        as JSON. ``finish`` judges it, as ``other_lines`` judges such a line with its line end."""
        raw = event.raw
        line = raw[max(raw.rfind(b"\n"), raw.rfind(b"\r")) + 1 :]
        if self.wire == "sse" and line and not line.strip():
            self._blank_last_line = (event.seq, event.end - len(line), line)
        try:
            obj = loads(event.raw)
        except ValueError:
            return False
        if not isinstance(obj, dict) or "error" not in obj:
            return False
        self.seen(event, "raw error JSON")
        self.errored(event, _raw_error(obj))
        return True

    def _blank_line(self, seq: int, offset: int, line: bytes, last: bool = False) -> None:
        """A line of only blanks: google-genai's transports disagree on it (see tail())."""
        shown = line.decode("utf-8", "replace").encode("unicode_escape").decode()
        where = "the body's last line, of only blanks and without its line end," if last else "a line of only blanks"
        self.judge.doubt(f"{where} at byte {offset} ('{shown}'): google-genai reading through aiohttp strips the "
                         "line and skips it; reading through httpx (its sync client, and its async one without "
                         "aiohttp) it parses the line as JSON and fails on it, unless, before 3.4.0, the line holds "
                         "only breaks that httpx splits it at, so whether the app read this answer depends on its "
                         "transport and version", seq, offset)

    def _candidate(self, candidate: dict[str, Any], event: WireEvent, t: float | None) -> None:
        choice = self.choice(candidate.get("index") or 0)
        if self.halted:
            return
        index = choice.index
        finish = candidate.get("finishReason")
        unread = type(finish) is int and finish not in FINISH_REASON_NUMBERS
        if finish:
            finish = _enum_name(finish, FINISH_REASON_NUMBERS)
        unit = f"candidate {index}"
        carries = [_part_kind(p) for p in as_list(as_dict(candidate.get("content")).get("parts")) if _part_kind(p)]
        if self.judge.is_closed(unit):
            if carries or (finish and finish != self._finish.get(index)):
                what = f"a chunk with {', '.join(carries)}" if carries else f"finishReason {finish}"
                self.reopened(unit, f"{what} (a second generation)", event)
                return
        if index in self._stamped and carries and self._ambiguous is None:
            self._ambiguous = (self._stamped[index], event)
        if not finish:
            self._unstamped.add(index)
        elif finish != "STOP" or index in self._unstamped:
            self.close_unit(unit, f"finishReason {finish}", event)
        elif carries:
            self._stamped.setdefault(index, event)
        for part in as_list(as_dict(candidate.get("content")).get("parts")):
            if isinstance(part, dict):
                self._part(index, part, event, t)
        for citation in as_list(as_dict(candidate.get("citationMetadata")).get("citations")):
            if choice.blocks:
                self.judge.listed(choice.blocks[-1], "citations", citation)
        if finish:
            self._finish[index] = choice.stop_reason = finish
            if unread:
                self._unread_numbers.add(index)
            else:
                self._unread_numbers.discard(index)

    def _part(self, index: int, part: dict[str, Any], event: WireEvent, t: float | None) -> None:
        if len(part) > 1:
            data = [k for k in PART_DATA if part.get(k) is not None and part[k] != ""]
            if len(data) > 1:
                self.corrupt(f"a part of candidate {index} at seq {event.seq} (byte {event.start}) sets "
                             f"{' and '.join(data)}: Part.data is a oneof, so the API sends one of them per part",
                             event, candidate=index, fields=data)
        signature = as_str(part.get("thoughtSignature"))
        call = part.get("functionCall")
        if isinstance(call, dict):
            block = self._function_call(index, call, event, t)
        elif isinstance(part.get("text"), str):
            kind = BlockKind.THINKING if _is_thought(part.get("thought")) else BlockKind.TEXT
            if part["text"]:
                block = self.append(index, kind, part["text"], t)
            elif signature is None:
                return  # an empty part: nothing to keep
            else:  # an empty part that only carries a signature: it belongs to what came before
                blocks = self.choice(index).blocks
                block = blocks[-1] if blocks else self.new_block(index, kind)
        elif any(k in part for k in ("executableCode", "codeExecutionResult", "inlineData", "fileData")):
            name = next(k for k in ("executableCode", "codeExecutionResult", "inlineData", "fileData") if k in part)
            block = self.new_block(index, BlockKind.SERVER_TOOL, name=name, extra={name: part[name]}, closed=True)
            self.content(t)
        else:
            return
        if signature is not None and block is not None:
            if block.signature is None:
                block.signature = signature
            else:
                self.judge.listed(block, "signatures", signature)

    def _function_call(self, index: int, call: dict[str, Any], event: WireEvent, t: float | None) -> Block | None:
        streaming = self._streaming_call.get(index)
        if streaming is not None:
            name = as_str(call.get("name"))
            if name and streaming.name:  # later parts of a streamed call never repeat its name: a call begins again
                again = "again " if name == streaming.name else ""
                self.corrupt(f"function call {name} starts {again}on candidate {index} while streamed call "
                             f"{streaming.name} is still open (its last part said willContinue)", event,
                             candidate=index, open_call=streaming.name, new_call=name)
                return streaming
            for partial in as_list(call.get("partialArgs")):
                if isinstance(partial, dict):
                    self._merge_partial(streaming, partial, event)
            if name and not streaming.name:
                streaming.name = name
            if not call.get("willContinue"):
                unfinished = streaming.extra.get("continued")
                if unfinished:  # a value cut short still parses: the call's arguments are not whole
                    path = next(iter(unfinished))
                    self.corrupt(f"function call {streaming.name} closes on candidate {index} while its argument "
                                 f"{path} still said willContinue", event, candidate=index, call=streaming.name,
                                 json_path=path)
                self._close_streaming(index)
            return streaming
        if not as_str(call.get("name")):
            # only the part that opens a call names it: a nameless one with no call open continues a call
            # whose opening part was lost, or repeats a closing part; read as a call, the app gets one it
            # cannot dispatch
            self.corrupt(f"functionCall part without a name on candidate {index} at seq {event.seq} (byte "
                         f"{event.start}) while no streamed call is open: its call's opening part is missing, "
                         "or a closing part came twice", event, candidate=index)
            return None
        self._calls += 1
        call_id = as_str(call.get("id"))
        block = self.tool_block(index, None, id=call_id or f"gemini-call-{self._calls}", name=as_str(call.get("name")), t=t)
        if call_id is None:
            block.extra["generated_id"] = True
        if call.get("willContinue"):  # Vertex streamed arguments: partialArgs follow
            block.extra["partial"] = {}
            self._streaming_call[index] = block
            for partial in as_list(call.get("partialArgs")):
                if isinstance(partial, dict):
                    self._merge_partial(block, partial, event)
            return block
        args = call.get("args") if call.get("args") is not None else {}
        block.arguments = args
        block.arguments_raw = dumps(args)
        block.closed = True
        return block

    def _merge_partial(self, block: Block, partial: dict[str, Any], event: WireEvent) -> None:
        json_path = as_str(partial.get("jsonPath")) or ""
        path = _parse_path(json_path)
        if path is None:
            self.corrupt(f"unparseable partialArgs jsonPath {partial.get('jsonPath')!r}", event)
            return
        if len(path) > MAX_PATH_STEPS:
            self.judge.halt(f"a partialArgs jsonPath of function call {block.name or block.id} at seq {event.seq} "
                            f"(byte {event.start}) has {len(path)} steps, deeper than the {MAX_PATH_STEPS} levels "
                            "streamtap assembles (and JSON readers such as orjson read)", event.seq, event.start,
                            json_path_steps=len(path), limit=MAX_PATH_STEPS)
            return
        if arguments_not_kept(block):  # over the cap already: counted, not built
            self.judge.take(block, "arguments_raw", len(json_path) + len(as_str(partial.get("stringValue")) or ""))
            return
        root = block.extra.setdefault("partial", {})
        # what this part costs the turn, charged to the arguments' cap: its path, its text, the slots an
        # array index makes (each part may name a new array), its value, and each object its path makes
        cost = PART_COST * (1 + _objects_made(root, path)) + len(json_path) + len(
            as_str(partial.get("stringValue")) or "") + sum(step for step in path if isinstance(step, int))
        if self.judge.take(block, "arguments_raw", cost) < cost:
            return
        continued = block.extra.setdefault("continued", {})  # jsonPaths whose last part said more follows
        if partial.get("willContinue"):
            continued[json_path] = True
        else:
            continued.pop(json_path, None)
        if "stringValue" in partial:
            current = _get(root, path)
            value = (current if isinstance(current, str) else "") + (as_str(partial["stringValue"]) or "")
        elif "numberValue" in partial:
            value = partial["numberValue"]
        elif "boolValue" in partial:
            value = partial["boolValue"]
        else:
            value = None
        try:
            _set(root, path, value)
        except (TypeError, AttributeError, IndexError, KeyError, ValueError):
            self.corrupt(f"partialArgs path {partial.get('jsonPath')!r} conflicts with the arguments so far", event)

    def _close_streaming(self, index: int, closed: bool = True) -> Block:
        block = self._streaming_call.pop(index)
        block.extra.pop("continued", None)
        args = block.extra.pop("partial", {})
        block.arguments = args
        block.arguments_raw = dumps(args)
        block.closed = closed
        return block

    def _usage(self, raw: dict[str, Any], event: WireEvent) -> None:
        usage = self.turn.usage  # cumulative snapshots: overwrite, never sum
        usage.raw = raw
        usage.input = as_int(raw.get("promptTokenCount"))
        usage.output = as_int(raw.get("candidatesTokenCount"))
        if usage.output is not None:
            last = self._output_count
            if last is not None and usage.output < last[0] and self._count_fell is None:
                self._count_fell = (last[0], last[1], usage.output, event)
            self._output_count = (usage.output, event)
        usage.reasoning = as_int(raw.get("thoughtsTokenCount"))
        usage.cache_read = as_int(raw.get("cachedContentTokenCount"))
        usage.total = as_int(raw.get("totalTokenCount"))

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        unfinished = {index: self._close_streaming(index, closed=False) for index in list(self._streaming_call)}
        for index, block in unfinished.items():
            self.note(f"candidate {index}: streamed function call never got its closing part")
            # its arguments are whatever parts came: a stop that cuts lists it among the cut calls
            block.arguments_error = "never finished: its last part said willContinue"
        for choice in self.turn.choices:  # text and thought parts have no end of their own: the candidate's is theirs
            if choice.index in self._finish:
                for block in choice.blocks:
                    if block.kind is not BlockKind.TOOL_CALL:
                        block.closed = True
        if self._blocked is not None:
            event, reason = self._blocked
            answered = [c.index for c in self.turn.choices if c.blocks]
            if answered:  # a blocked prompt gets no answer: a second response was stitched on
                self.corrupt(f"promptFeedback.blockReason {reason} says the prompt was blocked, but candidate(s) "
                             f"{answered} carry content", event, candidates=answered)
            self.terminal(event, f"blockReason:{reason}", "filtered", "promptFeedback.blockReason")
        elif self._last_chunk_finished and self._last_candidates_event is not None:
            if all(c.index in self._finish for c in self.turn.choices):
                calls = any(b.kind is BlockKind.TOOL_CALL for c in self.turn.choices for b in c.blocks)
                normalized = [normalize(self._finish[c.index], calls) for c in self.turn.choices]
                worst = worst_stop(normalized)
                index = next(c.index for c, n in zip(self.turn.choices, normalized) if n == worst)
                name = "the last chunk's finishReason"
                if index in self._unread_numbers:
                    name += (" (written as a number, `enum-encoding=int`: the Gemini API and Vertex AI name the same "
                             "numbers alike only from 1 to 5, STOP to OTHER, and which one answered is not known here)")
                self.terminal(self._last_candidates_event, self._finish[index], worst, name)
        if self.terminal_seen:
            self._judge_unfinished(unfinished)
        if self._blank_last_line is not None and end is StreamEnd.FINISHED:
            self._blank_line(*self._blank_last_line, last=True)
        expected = "a finishReason on the last chunk" + (" and the closing ]" if self.wire == "json-array" else "")
        turn, verdict = self.verdict(end, expected=expected)
        if verdict.kind not in (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED):
            return turn, verdict
        if self._ambiguous is not None:
            stamped, after = self._ambiguous
            verdict = Verdict(
                VerdictKind.UNKNOWN,
                f"content at seq {after.seq} (byte {after.start}) after finishReason STOP at seq {stamped.seq} "
                f"(byte {stamped.start}): a model stamping STOP on every chunk, or a second generation appended "
                "after the first finished; the bytes cannot tell",
                after.seq, after.start,
                {"stamped_seq": stamped.seq, "stamped_offset": stamped.start, "was": verdict.kind.value,
                 "end": end.value})
        elif self._count_fell is not None:
            before, counted, after, fell = self._count_fell
            verdict = Verdict(
                VerdictKind.UNKNOWN,
                f"usageMetadata.candidatesTokenCount falls from {before} (seq {counted.seq}) to {after} at seq "
                f"{fell.seq} (byte {fell.start}): a second generation or chunks out of order, unless this server "
                "does not count cumulatively; the bytes cannot tell",
                fell.seq, fell.start,
                {"counts": [before, after], "counted_seq": counted.seq, "was": verdict.kind.value, "end": end.value})
        return turn, verdict

    def _judge_unfinished(self, unfinished: dict[int, Block]) -> None:
        """A normal finishReason with a streamed call still open is a contradiction; a limit or a
        filter explains the cut, so those keep their verdict (the note says the call is unfinished)."""
        for index, block in unfinished.items():
            raw = self._finish.get(index)
            if raw is not None and STOP_VERDICT.get(normalize(raw, True)) is VerdictKind.COMPLETE:
                self.corrupt(f"finishReason {raw} on candidate {index}, but function call "
                             f"{block.name or block.id} was never finished (its last part said willContinue)",
                             self._last_candidates_event, candidate=index, block=block.index, tool=block.name)
                return


def refused(chunk: dict[str, Any]) -> str | None:
    """Why google-genai's model raises on ``chunk``, or None when it takes it (as far as CHUNK_SHAPE goes).
    Run on every chunk: the members it holds are walked, and a path is spelt out only for a refusal."""
    why = _misfit(chunk, CHUNK_SHAPE)
    if why is not None:
        return why[1:] if why[0] == "." else why
    for at, candidate in enumerate(as_list(chunk.get("candidates"))):
        if isinstance(candidate, dict):
            why = _misfit(candidate, CANDIDATE_SHAPE)
            if why is not None:
                return f"candidates[{at}]{why}"
    return None


def _misfit(value: Any, shape: Any) -> str | None:
    """Why pydantic's lax mode refuses ``value`` (not null) read as ``shape``, or None when it takes it
    (or may): the path below ``value`` (``.name``, ``[i]``) and what it is, where the model has another type."""
    if isinstance(shape, dict):
        if type(value) is not dict:
            return f" is {_json_type(value)} where google-genai's model has an object"
        for name, item in value.items():
            member = shape.get(name)
            if member is None or item is None:
                continue
            if (member is STR and type(item) is str) or (member is INT and type(item) is int):
                continue  # (the common cases, without a call)
            why = _misfit(item, member)
            if why is not None:
                return f".{name}{why}"
        return None
    if isinstance(shape, list):
        if type(value) is not list:
            return f" is {_json_type(value)} where google-genai's model has a list"
        for at, item in enumerate(value):
            if item is not None:
                why = _misfit(item, shape[0])
                if why is not None:
                    return f"[{at}]{why}"
        return None
    if _takes(shape, value):
        return None
    return f" is {_json_type(value)} where google-genai's model has {_SHAPE_WORDS[shape]}"


def _takes(shape: str, value: Any) -> bool:
    """Whether pydantic's lax mode may take ``value`` (not null) as ``shape``."""
    if shape == OBJECT:
        return isinstance(value, dict)
    if shape == LIST:
        return isinstance(value, list)
    if shape == STR:
        return isinstance(value, str)
    if shape == BYTES:
        return isinstance(value, str) and _NOT_BASE64.search(value) is None
    if isinstance(value, (dict, list)):
        return False
    if shape == BOOL:
        return _lax_bool(value) is not None
    # INT: a bool or a whole number; a string float() reads may be one (" 5", "5.0"), one it refuses never is
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
    return True


def _json_type(value: Any) -> str:
    """The value's JSON type, and the value itself where short to show (a string's first characters)."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    kind = "a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool) else "a number"
    return f"{kind} ({one_line(dumps(value[:40] if isinstance(value, str) else value), 40)})"


_JSON_SPACE = b" \t\r\n"


def _adds_content(data: str) -> bool:
    """Whether the chunk ``data`` gives the app content: a part with text or data of another kind."""
    try:
        obj = loads(data)
    except ValueError:
        return False
    for candidate in as_list(as_dict(obj).get("candidates")):
        for part in as_list(as_dict(as_dict(candidate).get("content")).get("parts")):
            if type(part) is dict and (part.get("text") or any(k not in _PART_MARKS for k in part)):
                return True
    return False


_PART_MARKS = frozenset({"text", "thought", "thoughtSignature"})  # what a part may hold beside its data


def _element_text(raw: bytes) -> str:
    """A JSON-array element's own bytes, as text: ``raw`` begins with the framing before it (``[`` for
    the first element, ``,`` for the rest), which would make a replayed first element differ. The
    element parsed, so it is valid UTF-8."""
    element = raw.lstrip(_JSON_SPACE)
    if element[:1] in (b"[", b","):
        element = element[1:].lstrip(_JSON_SPACE)
    return element.decode("utf-8")


def _part_kind(part: Any) -> str | None:
    """What content a part carries (None for an empty or signature-only part)."""
    if not isinstance(part, dict):
        return None
    if isinstance(part.get("functionCall"), dict):
        return "a functionCall"
    if isinstance(part.get("text"), str) and part["text"]:
        return "thought text" if _is_thought(part.get("thought")) else "text"
    return next((k for k in ("executableCode", "codeExecutionResult", "inlineData", "fileData") if k in part), None)


_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")


def _parse_path(text: str) -> list[str | int] | None:
    if not text.startswith("$"):
        return None
    steps: list[str | int] = []
    pos = 1
    while pos < len(text):
        match = _STEP.match(text, pos)
        if match is None:
            return None
        name, number, q1, q2 = match.groups()
        steps.append(int(number) if number is not None else next(s for s in (name, q1, q2) if s is not None))
        pos = match.end()
    return steps


def _child(node: Any, step: str | int) -> Any:
    """What ``step`` leads to from ``node`` (None where nothing is)."""
    if isinstance(step, int):
        return node[step] if isinstance(node, list) and step < len(node) else None
    return node.get(step) if isinstance(node, dict) else None


def _get(root: Any, path: list[str | int]) -> Any:
    node = root
    for step in path:
        node = _child(node, step)
        if node is None:
            return None
    return node


def _objects_made(root: dict, path: list[str | int]) -> int:
    """How many objects and arrays ``_set`` makes for ``path``: one per step below the deepest that exists."""
    node: Any = root
    for depth, step in enumerate(path[:-1]):
        node = _child(node, step)
        if not isinstance(node, (dict, list)):
            return len(path) - 1 - depth
    return 0


MAX_ARRAY_INDEX = 10_000  # partialArgs indexes beyond this are refused, not allocated
# a jsonPath makes one level of the arguments per step: orjson reads no JSON nested deeper than this, so
# arguments that come whole (``args``) are never deeper either
MAX_PATH_STEPS = 1024
# characters of the arguments' cap a partialArgs part costs for its value, and again for each object or
# array its path makes (one holding a key takes about 190 bytes): without the second, one part of a long
# new path made thousands of objects for the price of its text
PART_COST = 64


def _set(root: dict, path: list[str | int], value: Any) -> None:
    """Put ``value`` at ``path``, creating containers; raises on a path that conflicts with them."""
    if not path:
        return
    if any(isinstance(step, int) and step > MAX_ARRAY_INDEX for step in path):
        raise ValueError("array index too large")
    node: Any = root
    for step, following in zip(path, path[1:]):
        _make_room(node, step)
        child = node[step] if isinstance(step, int) else node.get(step)
        if not isinstance(child, (dict, list)):
            child = node[step] = [] if isinstance(following, int) else {}
        node = child
    _make_room(node, path[-1])
    node[path[-1]] = value


def _make_room(node: Any, step: str | int) -> None:
    """An index steps into an array, a name into an object: a path that steps otherwise conflicts."""
    if isinstance(step, int):
        if not isinstance(node, list):
            raise TypeError(f"index [{step}] into an object")
        while len(node) <= step:
            node.append(None)
    elif not isinstance(node, dict):
        raise TypeError(f"name {step!r} into an array")
