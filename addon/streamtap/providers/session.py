"""One response stream, judged once: wire decoder + dialect assembler + the verdict rules.

Sans-IO: the adapter feeds bytes (with their arrival time) and closes with how the
bytes stopped; the session never raises on bad input or on a bug in an assembler
(fail open: the problem becomes the verdict's evidence).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamtap.wire import (
    DEFAULT_MAX_EVENT,
    EventStreamDecoder,
    EventStreamMessage,
    JSONArrayDecoder,
    JSONValue,
    LongIdleRun,
    Malformed,
    NDJSONDecoder,
    SSEDecoder,
    SSEEvent,
    Tail,
    WireEvent,
)

from .common import error_fields, error_fields_of_text, error_message, loads, one_line
from .judge import ARGUMENTS_CAP, END_WORDS, ENDING_KINDS, TEXT_CAP, TEXT_END
from .request import takes_a_short_body_whole, user_agent
from .turn import NOT_JUDGED, BlockKind, Choice, Dialect, StreamEnd, Turn, Verdict, VerdictKind

DEFAULT_WIRE = {
    Dialect.OPENAI_CHAT: "sse",
    Dialect.OPENAI_RESPONSES: "sse",
    Dialect.ANTHROPIC: "sse",
    Dialect.BEDROCK_INVOKE: "eventstream",
    Dialect.BEDROCK_CONVERSE: "eventstream",
    Dialect.GEMINI: "sse",
    Dialect.OLLAMA: "ndjson",
    Dialect.UNKNOWN: "sse",
}

MODULES = {
    Dialect.OPENAI_CHAT: "streamtap.providers.openai_chat",
    Dialect.OPENAI_RESPONSES: "streamtap.providers.openai_responses",
    Dialect.ANTHROPIC: "streamtap.providers.anthropic",
    Dialect.BEDROCK_INVOKE: "streamtap.providers.bedrock_invoke",
    Dialect.BEDROCK_CONVERSE: "streamtap.providers.bedrock_converse",
    Dialect.GEMINI: "streamtap.providers.gemini",
    Dialect.OLLAMA: "streamtap.providers.ollama",
    Dialect.UNKNOWN: "streamtap.providers.unknown",
}

_DECODERS = {
    "sse": SSEDecoder,
    "eventstream": EventStreamDecoder,
    "ndjson": NDJSONDecoder,
    "json-array": JSONArrayDecoder,
}

_PLAIN_EVENTS = frozenset({SSEEvent, EventStreamMessage, JSONValue})  # events that go straight to the assembler
# verdicts of a turn that ended: a cut last event that would give one of them was the terminal signal
_FINISHED = frozenset({VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED, VerdictKind.ERRORED})
# ends that cut the HTTP body before its end, on the client's side too (a client abort is the client's own)
_BODY_CUT = frozenset({StreamEnd.UPSTREAM_RESET, StreamEnd.PROXY_ENDED})

ERROR_BODY_LIMIT = 64 * 1024  # an HTTP error body is kept for its message, not forever
MAX_BLOCKS = 4096  # blocks one turn keeps over all its choices; past them the turn is not assembled
BODY_SLICE = 64 * 1024  # analyze_bytes feeds a whole body in pieces of this size, as a live read would come


def make_assembler(dialect: Dialect, wire: str, one_response: bool = False, may_resume: bool = True):
    """The dialect module's ``Assembler``, given the wire, ``one_response`` and ``may_resume`` (see
    StreamSession) where its constructor takes them."""
    cls, takes = _assembler_class(dialect)
    given = {"wire": wire, "one_response": one_response, "may_resume": may_resume}
    return cls(**{name: value for name, value in given.items() if name in takes})


@functools.cache
def _assembler_class(dialect: Dialect) -> tuple[type, frozenset[str]]:
    cls = importlib.import_module(MODULES[dialect]).Assembler
    try:
        takes = frozenset(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        takes = frozenset()
    return cls, takes


@dataclass(slots=True)
class Analysis:
    events: list[WireEvent]  # the wire events close() produced (e.g. a Tail)
    turn: Turn
    verdict: Verdict
    wire: str = "sse"
    bytes: int = 0
    wire_events: int = 0  # every event the decoder produced, Malformed and Tail included
    findings: list[str] = field(default_factory=list)  # framing trouble beyond the verdict's


class StreamSession:
    def __init__(
        self,
        dialect: Dialect | str,
        wire: str | None = None,
        *,
        http_status: int = 200,
        sentinel: str | None = None,
        max_event_size: int = DEFAULT_MAX_EVENT,
        keep_arrivals: bool = True,
        text_cap: int | None = TEXT_CAP,
        arguments_cap: int | None = ARGUMENTS_CAP,
        streamed: bool = True,
        one_response: bool = False,
        may_resume: bool = True,
    ) -> None:
        """``text_cap`` and ``arguments_cap`` bound the characters of text and of tool-call arguments
        the turn keeps (None: all of them), so memory does not grow with the answer; beyond them the
        turn notes what it dropped and a tool call not kept whole is not judged ``complete``.
        ``streamed`` false: the request asked for a plain JSON answer (``answers_a_stream``), which
        is judged ``unknown``, not read as a stream that never ended. ``one_response``: the body is one
        HTTP response's (the proxy's, a recording's), where one call answers once: an Anthropic or
        ConverseStream message after the first ended was stitched on (corrupt). Without it, a file of
        several messages back to back (multi-step test recordings) is one turn. ``may_resume`` false: the
        request cannot be a replay that starts after its answer's first events (``may_resume`` in
        request.py: an OpenAI Responses create), so a body that lacks them lost them. What else the
        request says is given by ``asked``."""
        self.dialect = Dialect(dialect)
        self.streamed = streamed
        self.wire = wire or DEFAULT_WIRE[self.dialect]
        if self.wire not in _DECODERS:
            raise ValueError(f"unknown wire {self.wire!r}; expected one of {', '.join(_DECODERS)}")
        self.http_status = http_status
        self.sentinel = sentinel
        self._assembler = make_assembler(self.dialect, self.wire, one_response, may_resume)
        self._one_response = one_response
        # a dialect whose client reads only "data: " lines as SSE is shown every other line
        self._reads_other_lines = self.wire == "sse" and hasattr(self._assembler, "other_lines")
        # blank lines where the dialect's SDK dispatches an event with empty data and the HTML
        # rules dispatch none (SSEDecoder.empty_dispatches): the assembler is offered them as events
        takes_empty = self.wire == "sse" and getattr(self._assembler, "sdk_dispatches_empty_events", False)
        if self._reads_other_lines or takes_empty:
            # every empty dispatch counts (an `event: error` after any number of others is the SDK's
            # error), and each feed empties their list, so it holds one read's notes at most
            self._decoder = SSEDecoder(max_event_size=max_event_size, note_other_lines=self._reads_other_lines,
                                       keep_all_empty_dispatches=takes_empty)
        else:
            self._decoder = _DECODERS[self.wire](max_event_size=max_event_size)
        judge = getattr(self._assembler, "judge", None)
        if judge is not None:
            judge.limit(text_cap, arguments_cap)
        self._bytes = 0
        self._events = 0
        self._first_byte: float | None = None
        self._last_byte: float | None = None
        # one time per event: a live adapter that records each frame's time elsewhere turns
        # this off, so a long stream does not grow a list in memory
        self._arrivals: list[float] | None = [] if keep_arrivals else None
        self._malformed: Malformed | None = None
        self._damaged: SSEEvent | None = None  # the first event whose bytes were not UTF-8
        self._damaged_after_events = False  # those bytes came after the last event (comments), in no event
        self._malformed_count = 0
        self._idle_run: Malformed | None = None  # the first run of keep-alives alone longer than max_event_size
        self._tail: Tail | None = None
        self._unended: Tail | None = None  # a last event without its line end that the SDK read (see _terminal_in_tail)
        self._halted: str | None = None  # why the assembler is no longer fed: a bug in it, or a bound passed
        self._over_bound = False  # the turn outgrew MAX_BLOCKS (not a bug)
        # the turn's choices, watched for MAX_BLOCKS after every event (a list the turn keeps and grows)
        turn = getattr(self._assembler, "turn", None)
        self._choices: list = turn.choices if turn is not None else [Choice(0)]
        self._error_body = bytearray()
        self._closed: Analysis | None = None
        self._length_framed = False  # set by close()
        self._user_agent: str | None = None  # the request's (set by asked): does its client check a Content-Length
        self._empty_notes: list | None = self._decoder.empty_dispatches if takes_empty else None
        self._empty_fed = 0  # notes of the list offered so far

    @property
    def wire_events(self) -> int:
        """Wire events decoded so far (as ``Analysis.wire_events`` counts them)."""
        return self._events

    def feed(self, chunk: bytes, t: float | None = None) -> list[WireEvent]:
        if self._closed is not None or not chunk:
            return []
        if len(chunk) > BODY_SLICE:
            # a recorded frame or a large read (up to 16 MiB), decoded a slice at a time: what one
            # decode holds besides its events (lines, noted blank lines) stays within a slice's worth
            events = []
            for at in range(0, len(chunk), BODY_SLICE):
                events += self.feed(chunk[at : at + BODY_SLICE], t)
            return events
        self._arrived(chunk, t)
        events = self._decoder.feed(chunk)
        take, waiting = self._take, self._empty_waiting()
        for event in events:
            if waiting:
                waiting = self._feed_empty(event.seq)
            take(event, t)
        if self._empty_notes:
            self._feed_empty(None)
        return events

    def feed_reads(self, chunks: Sequence[bytes], times: Sequence[float | None]) -> tuple[list[WireEvent], list[int]]:
        """Several reads at once (``times[i]`` is when ``chunks[i]`` arrived), decoded in one pass.

        The same events and turn as feeding the chunks one by one (decoders give identical
        results for any chunking), for a fraction of the per-call cost. Returns the events and,
        for each, the index of the read that brought its last byte: its time is the event's time.
        (Read by read, an event gets the time of the read that completed it: the same read,
        except where a decoder must see a byte past an event to end it, e.g. a CR line end.)"""
        if self._closed is not None:
            return [], []
        if len(chunks) == 1:
            events = self.feed(chunks[0], times[0])
            return events, [0] * len(events)
        ends = []
        for chunk, t in zip(chunks, times):
            if chunk:
                self._arrived(chunk, t)
            ends.append(self._bytes)
        joined = b"".join(chunks)
        # decoded a slice at a time, as feed() does with a large chunk
        pieces = (joined,) if len(joined) <= BODY_SLICE else (
            joined[at : at + BODY_SLICE] for at in range(0, len(joined), BODY_SLICE))
        events: list[WireEvent] = []
        reads: list[int] = []
        take, last_read, i = self._take, len(chunks) - 1, 0
        end = ends[0]
        assemble, arrivals, plain, choices = self._assembler.feed, self._arrivals, _PLAIN_EVENTS, self._choices
        for piece in pieces:
            decoded = self._decoder.feed(piece)
            if events:
                events += decoded
            else:
                events = decoded
            waiting = self._empty_waiting()
            for event in decoded:
                if waiting:
                    waiting = self._feed_empty(event.seq)
                last_byte = event.end - 1
                while last_byte >= end and i < last_read:
                    i += 1
                    end = ends[i]
                t = times[i]
                reads.append(i)
                if type(event) in plain and self._halted is None:  # _take's common case, without the call
                    self._events += 1
                    if type(event) is SSEEvent and event.invalid_utf8 and self._damaged is None:
                        self._damaged = event
                    if t is not None and arrivals is not None:
                        arrivals.append(t)
                    try:
                        assemble(event, t)
                        if len(choices[0].blocks) > MAX_BLOCKS or len(choices) > 1:
                            self._check_bound(event)
                    except Exception as exc:  # fail open, as in _take
                        self._halted = f"{type(exc).__name__}: {exc} (at event {event.seq})"
                else:
                    take(event, t)
            if self._empty_notes:
                self._feed_empty(None)
        return events, reads

    def _arrived(self, chunk: bytes, t: float | None) -> None:
        if t is not None:
            if self._first_byte is None:
                self._first_byte = t
            self._last_byte = t
        self._bytes += len(chunk)
        if self.http_status >= 400 and len(self._error_body) < ERROR_BODY_LIMIT:
            self._error_body += chunk[: ERROR_BODY_LIMIT - len(self._error_body)]

    def asked(self, request: Any) -> None:
        """The request, as a recording's header keeps it (``headers`` as [name, value] pairs,
        ``body`` its JSON): its client (``User-Agent``), and what it asked of its answer, for a
        dialect that reads the answer against it (``asked`` in assembler.py)."""
        if not isinstance(request, dict):
            return
        self._user_agent = user_agent(request)
        asked, body = getattr(self._assembler, "asked", None), request.get("body")
        if asked is not None and isinstance(body, dict):
            asked(body)

    def close(self, end: StreamEnd | str = StreamEnd.FINISHED, *, length_framed: bool = False) -> Analysis:
        """``length_framed``: the HTTP body was delimited by its Content-Length (not chunked, not
        by the connection's close), which decides what a cut after the end signal did to the app."""
        if self._closed is not None:
            return self._closed
        end = StreamEnd(end)  # its value too ("upstream_reset"), as a dialect may be given
        self._length_framed = length_framed
        events = self._decoder.close()
        waiting = self._empty_waiting()
        for event in events:
            if waiting:
                waiting = self._feed_empty(event.seq)
            self._take(event, self._last_byte)
            if type(event) is Tail and self._damaged is None and getattr(self._decoder, "invalid_utf8", 0):
                # bytes that are not UTF-8 after the last event (a comment): no event carries them, the
                # decoder counted them, and the SDKs' decoders fail on them as on any other line they read
                self._damaged_after_events = True
                self._damaged = SSEEvent(event.seq, event.start, event.end, event.raw, "", "", "", None,
                                         self._decoder.invalid_utf8)
        if self._empty_notes:
            self._feed_empty(None)
        if self._reads_other_lines and self._decoder.other_lines and self._halted is None:
            try:
                self._assembler.other_lines(self._decoder.other_lines, self._decoder.other_line_count)
            except Exception as exc:  # fail open, as in _take
                self._halted = f"{type(exc).__name__}: {exc} (at the lines that are not data lines)"
        terminal_tail = self._terminal_in_tail(end)
        try:
            turn, verdict = self._assembler.finish(end)
        except Exception as exc:  # fail open: a bug in streamtap is evidence, not a crash
            self._halted = self._halted or f"{type(exc).__name__}: {exc}"
            # what was assembled before the failure (text, usage) is still the best account of the turn
            turn = getattr(self._assembler, "turn", None)
            if not isinstance(turn, Turn):
                turn = Turn(self.dialect)
            verdict = Verdict(VerdictKind.UNKNOWN, "")
        # the tail held the terminal signal when it alone would have turned a cut stream into a finished one
        verdict = self._judge(turn, verdict, end, terminal_tail and verdict.kind is VerdictKind.TRUNCATED)
        timing = turn.timing
        timing.first_byte, timing.last_byte = self._first_byte, self._last_byte
        if self._arrivals is not None:
            timing.arrivals = self._arrivals
        if self._idle_run is not None:
            run = self._idle_run
            turn.notes.append(f"{run.error.message}, at byte {run.start} (seq {run.seq}): their bytes are recorded unframed")
        findings = []
        if self._malformed_count > 1:
            findings.append(f"{self._malformed_count} malformed wire units")
        self._closed = Analysis(events, turn, verdict, self.wire, self._bytes, self._events, findings)
        return self._closed

    # -------------------------------------------------------------------------------
    def _take(self, event: WireEvent, t: float | None) -> None:
        self._events += 1
        if t is not None and self._arrivals is not None:
            self._arrivals.append(t)
        if isinstance(event, Malformed):
            if isinstance(event.error, LongIdleRun):  # keep-alives the SSE rules skip: nothing wrong with the stream
                if self._idle_run is None:
                    self._idle_run = event
                return
            self._malformed_count += 1
            if self._malformed is None:
                self._malformed = event
            return
        if type(event) is SSEEvent and event.invalid_utf8 and self._damaged is None:
            self._damaged = event
        if self._halted is not None:
            if isinstance(event, Tail):
                self._tail = event
            return
        try:
            if isinstance(event, Tail):
                accept = getattr(self._assembler, "tail", None)  # optional: a dialect may read meaning into a tail
                if accept is None or not accept(event):
                    self._tail = event
            else:
                self._assembler.feed(event, t)
                choices = self._choices
                if len(choices[0].blocks) > MAX_BLOCKS or len(choices) > 1:
                    self._check_bound(event)
        except Exception as exc:  # fail open: the events still go back to the adapter; the bug becomes evidence
            self._halted = f"{type(exc).__name__}: {exc} (at event {event.seq})"

    def _empty_waiting(self) -> bool:
        """Are noted blank lines waiting to be offered to the assembler?"""
        return self._empty_notes is not None and self._empty_fed < len(self._empty_notes)

    def _feed_empty(self, before: int | None) -> bool:
        """Offer the assembler, as events with empty data, the noted blank lines that come before
        the event with seq ``before`` (None: all of them, and the decoder's list is emptied), as the
        dialect's SDK would have dispatched them. Returns whether later ones are still waiting.

        Every feed ends with None: every event before a noted blank line came in that feed or an
        earlier one, so the notes left come before every event still to come. The list then
        holds one read's notes at most (one slice's: see feed), and none is dropped however the
        stream was read. A note is a run of blank lines (see SSEDecoder.empty_dispatches): each
        is offered on its own, at its own offset."""
        notes = self._empty_notes
        while self._empty_fed < len(notes):
            seq, first, name, count, step = notes[self._empty_fed]
            if before is not None and seq > before:
                return True
            self._empty_fed += 1
            name = name or "message"
            for offset in range(first, first + count * step, step) if count > 1 else (first,):
                if self._halted is not None:
                    break
                event = SSEEvent(seq, offset, offset, b"", name, "", "", None)
                try:
                    self._assembler.feed(event, self._last_byte)
                except Exception as exc:  # fail open, as in _take
                    self._halted = f"{type(exc).__name__}: {exc} (at an empty event before seq {seq})"
        if before is None:
            notes.clear()  # in place: the decoder appends to this very list
            self._empty_fed = 0
        return False

    def _check_bound(self, event: WireEvent) -> None:
        """A turn that opened more than MAX_BLOCKS blocks is no longer assembled: every block
        costs memory, and a hostile or broken stream can open one per event."""
        if sum(len(choice.blocks) for choice in self._choices) > MAX_BLOCKS:
            self._halted = (
                f"the answer opened more than {MAX_BLOCKS} blocks; streamtap stopped assembling it "
                f"at event {event.seq} (byte {event.start}) to bound its memory"
            )
            self._over_bound = True

    def _terminal_in_tail(self, end: StreamEnd) -> bool:
        """Would the undispatched last event have ended the stream (``data: [DONE]`` with no blank line
        after it, a ``message_stop`` cut after its data line, a done line with no newline)?

        Asked of a copy of the assembler fed that event as if it had been dispatched, so every dialect
        answers by its own rules; the copy is thrown away: the event was never dispatched. Except where
        the dialect's SDK reads a last line that lacks its line end (``sdk_reads_an_unended_last_line``,
        see assembler.py) and the body ended cleanly: the SDK gave the app that event, so the assembler
        is fed it too, and the tail is no cut (False)."""
        tail = self._tail
        if tail is None or not tail.cut or self._halted is not None or self.wire not in ("sse", "ndjson"):
            return False
        ending = b"\n\n" if self.wire == "sse" else b"\n"
        # Mid-stream, a BOM is not one: a comment line first keeps a fresh SSE decoder from dropping it.
        lead = b":\n" if self.wire == "sse" and tail.start else b""
        decoder = _DECODERS[self.wire]()
        completed = [e for e in decoder.feed(lead + tail.raw + ending) + decoder.close() if type(e) in _PLAIN_EVENTS]
        if not completed:
            return False
        completed = [event._replace(seq=tail.seq, start=tail.start + max(0, event.start - len(lead)),
                                    end=tail.start + event.end - len(lead)) for event in completed]
        try:
            probe = copy.deepcopy(self._assembler)
            for event in completed:
                probe.feed(event, self._last_byte)
            _, would = probe.finish(end)
        except Exception:  # fail open: the tail is then judged as any other cut
            return False
        # it would have finished the turn; a cut event the assembler cannot read (half its JSON) is no terminal
        if would.kind not in _FINISHED:
            return False
        if end is not StreamEnd.FINISHED or not getattr(self._assembler, "sdk_reads_an_unended_last_line", False):
            return True
        try:
            for event in completed:
                self._assembler.feed(event, self._last_byte)
        except Exception as exc:  # fail open, as in _take
            self._halted = f"{type(exc).__name__}: {exc} (at event {tail.seq})"
        self._tail, self._unended = None, tail
        return False

    def _judge(self, turn: Turn, verdict: Verdict, end: StreamEnd, terminal_tail: bool = False) -> Verdict:
        verdict.evidence.setdefault("end", end.value)
        verdict.evidence["bytes"] = self._bytes
        if self.http_status >= 400:
            return self._http_error(turn, end)
        if not self.streamed:
            return Verdict(
                VerdictKind.UNKNOWN, NOT_A_STREAM, 0, 0, {"streamed": False, "end": end.value, "bytes": self._bytes}
            )
        if self._over_bound:
            return Verdict(
                VerdictKind.UNKNOWN, f"{NOT_JUDGED}: {self._halted}", verdict.seq, verdict.offset,
                {"max_blocks": MAX_BLOCKS, "end": end.value, "bytes": self._bytes},
            )
        if self._halted is not None:
            return Verdict(
                VerdictKind.UNKNOWN,
                f"{NOT_JUDGED}: internal error in the {self.dialect} assembler",
                verdict.seq,
                verdict.offset,
                {"bug": self._halted, "end": end.value, "bytes": self._bytes},
            )
        tail = self._tail
        if tail is not None and tail.start == 0 and self.wire_events == 1 and verdict.kind is not VerdictKind.ERRORED:
            # the whole body, which framed no event: a provider's error document sent with a 200 (as
            # `streamtap verify` reads a body file of one)
            found = _error_document(tail.raw)
            if found is not None:
                return _errored_by_document(turn, *found, end, self._bytes)
        unknown_field = self._decoder.first_unknown_field if self.wire == "sse" else None
        if unknown_field is not None and unknown_field[2] == "error" and verdict.kind is not VerdictKind.ERRORED:
            return self._error_field(turn, unknown_field, end)
        if verdict.kind is VerdictKind.ERRORED:  # the provider's own word beats any framing trouble after it
            return verdict
        bad = self._malformed
        if bad is not None and not (verdict.kind is VerdictKind.CORRUPT and (verdict.seq or 0) < bad.seq):
            what = "decoding stopped" if bad.fatal else "the unit was skipped"
            return Verdict(
                VerdictKind.CORRUPT,
                f"{bad.error.message} at byte {bad.error.offset}; {what}",
                bad.seq,
                bad.start,
                {"error": type(bad.error).__name__, "fatal": bad.fatal, "end": end.value, "bytes": self._bytes},
            )
        # the SDK stopped reading at the answer's end signal (the openai SDK at [DONE]): what came after
        # it never reached the app
        past_sdk = verdict.kind in ENDING_KINDS and getattr(self._assembler, "sdk_stopped_reading", False)
        damaged = self._damaged
        if damaged is not None and self._damaged_after_events and past_sdk:  # these bytes were never decoded
            verdict.reason += (f"; {damaged.invalid_utf8} sequence(s) that are not UTF-8 came after it, from byte "
                               f"{damaged.start}, where the SDK had stopped reading")
            verdict.evidence["not_utf8_after_end_signal"] = damaged.invalid_utf8
            damaged = None
        if damaged is not None and not (verdict.kind is VerdictKind.CORRUPT and (verdict.seq or 0) < damaged.seq):
            # SSE is UTF-8 by definition and every provider sends it: bytes that are not were damaged in flight
            return Verdict(
                VerdictKind.CORRUPT,
                f"event at seq {damaged.seq} (byte {damaged.start}) is not valid UTF-8 "
                f"({damaged.invalid_utf8} invalid sequence(s)): its bytes were damaged",
                damaged.seq,
                damaged.start,
                {"invalid_utf8": damaged.invalid_utf8, "end": end.value, "bytes": self._bytes, "was": verdict.kind.value},
            )
        if verdict.kind in (VerdictKind.ERRORED, VerdictKind.CORRUPT):
            return verdict
        if tail is not None and tail.cut and past_sdk and _comments_only(tail.raw, self.wire):
            # a comment after the end signal, whole or cut: the body is judged as one that ended at the cut
            verdict.reason += (f"; {len(tail.raw)} bytes of a comment after it were cut at byte {tail.end}, where the SDK "
                               "had stopped reading")
            verdict.evidence["comment_cut_after_end_signal"] = len(tail.raw)
            tail = None
        if tail is not None and tail.cut and tail.raw.strip():
            evidence = {
                "end": end.value,
                "bytes": self._bytes,
                "tail_bytes": len(tail.raw),
                "tail_reason": tail.reason,
                "tail_head": tail.raw[:80].decode("utf-8", "replace"),
            }
            if terminal_tail:
                return Verdict(
                    VerdictKind.TRUNCATED,
                    f"the terminal event ({_head(tail.raw)}) arrived but was never ended: {tail.reason}; "
                    f"{END_WORDS[end]}",
                    tail.seq,
                    tail.start,
                    evidence | {"terminal_not_dispatched": True, "was": verdict.kind.value},
                )
            if self._one_response and end is StreamEnd.FINISHED and verdict.kind in ENDING_KINDS and not _comments_only(tail.raw, self.wire):
                # the answer had ended, and the app got it (boto3 and the openai and anthropic SDKs drop an
                # unfinished last event): these bytes were appended after its end, as a whole event would be
                return Verdict(
                    VerdictKind.CORRUPT,
                    f"{len(tail.raw)} bytes began another event at byte {tail.start} after the answer had ended "
                    f"({verdict.kind.value}), and the body ended inside it ({tail.reason}): nothing follows an answer's end",
                    tail.seq,
                    tail.start,
                    evidence | {"was": verdict.kind.value, "after_end": True},
                )
            if verdict.kind is VerdictKind.TRUNCATED:
                verdict.evidence.update(evidence)
                verdict.reason += f"; {len(tail.raw)} bytes of an unfinished event at byte {tail.start}"
                verdict.seq, verdict.offset = tail.seq, tail.start
                return verdict
            return Verdict(
                VerdictKind.TRUNCATED,
                f"the stream was cut inside an event at byte {tail.start} ({tail.reason}): {END_WORDS[end]}",
                tail.seq,
                tail.start,
                evidence | {"was": verdict.kind.value},
            )
        unended = self._unended
        if unended is not None and verdict.kind in ENDING_KINDS:
            verdict.reason += (f"; the body ended cleanly right after the last event (byte {unended.start}), without "
                               "the line end after it, and the SDK reads such a last line at the end of the body")
            verdict.evidence["body_ended_without_line_end"] = True
        if self.wire == "json-array" and not self._decoder.finished and verdict.kind is not VerdictKind.TRUNCATED:
            return Verdict(
                VerdictKind.TRUNCATED,
                f"the JSON array never closed (no ']'): {END_WORDS[end]}",
                verdict.seq,
                self._bytes,
                {"end": end.value, "bytes": self._bytes, "was": verdict.kind.value},
            )
        fused_comment = self._decoder.first_fused_comment if self.wire == "sse" else None
        if verdict.kind in ENDING_KINDS and fused_comment is not None and (
            unknown_field is None or fused_comment[1] < unknown_field[1]
        ):
            seq, offset, name = fused_comment
            return self._joined_by_a_cut(
                verdict, end, seq, offset, "fused_comments", self._decoder.fused_comment_count,
                f"a comment line holds a {name!r} field at byte {offset}, which the SSE rules and the SDK skip with "
                "the comment and no keep-alive comment holds: a cut inside a comment, its bytes joined to the line "
                "after them, looks like this",
            )
        if verdict.kind in ENDING_KINDS and unknown_field is not None:
            seq, offset, name, _ = unknown_field
            return self._joined_by_a_cut(
                verdict, end, seq, offset, "unknown_fields", self._decoder.unknown_field_count,
                f"a line of field {name!r} at byte {offset}, which the SSE rules and the SDK skip and no provider "
                "sends: a cut event's first bytes joined to the line after them look like this",
            )
        if verdict.kind is VerdictKind.TRUNCATED:
            verdict.evidence["last_event_offset"] = verdict.offset
            verdict.offset = self._bytes  # where the bytes stopped
            if end in (StreamEnd.CLIENT_ABORTED, StreamEnd.PROXY_ENDED):
                verdict.evidence["provider_fault"] = False
            return verdict
        # an answer that ended, limited and filtered ones too (the SDK raises before the app sees the stop
        # reason); errored returned above: the SDK raises the provider's error at its event, before the cut
        if verdict.kind in ENDING_KINDS and end in _BODY_CUT:
            verdict = self._body_cut(verdict, end)
        elif verdict.kind in ENDING_KINDS and end is StreamEnd.CLIENT_ABORTED:
            verdict = self._left_before_the_body_ended(verdict)
        if verdict.kind is VerdictKind.COMPLETE and self.sentinel:
            return self._sentinel(turn, verdict, end)
        return verdict

    def _joined_by_a_cut(self, verdict: Verdict, end: StreamEnd, seq, offset: int, counted: str, count: int,
                         what: str) -> Verdict:
        """An answer that ended, judged unknown: ``what`` (a line the SDK skips) is what a cut's bytes
        joined to the line after them look like, so a replay after a cut may hide behind it."""
        return Verdict(
            VerdictKind.UNKNOWN,
            f"{what} (a stream replayed after a cut, say), so whether the app got one whole answer cannot be told",
            seq,
            offset,
            {"end": end.value, "bytes": self._bytes, counted: count, "was": verdict.kind.value},
        )

    def _sentinel(self, turn: Turn, verdict: Verdict, end: StreamEnd) -> Verdict:
        """A complete answer must end with the sentinel line, in each choice but one that stopped to
        call a tool (its text is no whole answer). Beyond the text cap the line is read off the end
        the judge keeps (``TextEnds``); where that end cannot tell, the verdict is unknown."""
        judge = getattr(self._assembler, "judge", None)
        stops = getattr(judge, "choice_stops", None) or {}
        ends = getattr(judge, "text_ends", None)
        missing: list[int] = []
        unsure: list[int] = []
        first_missing: tuple[str, bool] | None = None
        for position, choice in enumerate(turn.choices):
            if _stopped_to_call(turn, choice, stops):
                continue
            text = ends.end(choice) if ends is not None else None
            if text is None:  # all its text was kept
                text = (turn.text(position), True)
            found = _ends_with_line(*text, self.sentinel)
            if found is None:
                unsure.append(choice.index)
            elif not found:
                missing.append(choice.index)
                first_missing = first_missing or text
        evidence = {"sentinel": self.sentinel, "end": end.value, "bytes": self._bytes}
        if first_missing is not None:
            return Verdict(
                VerdictKind.TRUNCATED,
                "sentinel missing",
                verdict.seq,
                verdict.offset,
                evidence | {"choices": missing, "last_line": _shown(*_last_line(*first_missing))},
            )
        if unsure:
            return Verdict(
                VerdictKind.UNKNOWN,
                f"the sentinel could not be checked: choice {unsure[0]}'s text goes beyond what a turn keeps in memory, "
                f"and the {TEXT_END} characters kept of its end do not hold the start of its last line "
                "(`streamtap show` keeps all the text)",
                verdict.seq,
                verdict.offset,
                evidence | {"choices": unsure, "was": verdict.kind.value},
            )
        return verdict

    def _body_cut(self, verdict: Verdict, end: StreamEnd) -> Verdict:
        """An answer whose end signal arrived in a body that was cut before its HTTP end (a reset
        before the chunked terminator, a Content-Length not reached). An SDK that reads the body to
        its end raises on the cut, so the app gets an exception, not the answer nor its stop reason:
        truncated, as a Chat Completions stream whose [DONE] is missing. A dialect whose SDK had
        stopped reading before the cut (``sdk_stopped_reading``, see assembler.py) keeps its word."""
        if getattr(self._assembler, "sdk_stopped_reading", False):
            terminal = getattr(getattr(self._assembler, "judge", None), "terminal_name", None) or "the end signal"
            verdict.reason += f"; the HTTP body was cut after {terminal}, where the SDK stops reading: {END_WORDS[end]}"
            verdict.evidence["body_cut_after_end_signal"] = True
            return verdict
        if self._length_framed and getattr(self._assembler, "sdk_ignores_content_length", False):
            whole = takes_a_short_body_whole(self._user_agent)
            if whole:
                verdict.reason += ("; the HTTP body stopped short of its Content-Length after the end signal, which the "
                                   f"SDK does not check: {END_WORDS[end]}")
                verdict.evidence["body_cut_after_end_signal"] = True
                verdict.evidence["content_length_short"] = True
                return verdict
            if whole is None:
                return Verdict(
                    VerdictKind.UNKNOWN,
                    f"the HTTP body stopped short of its Content-Length after the end signal ({END_WORDS[end]}): boto3 "
                    f"takes that for the end, an SDK that checks the length (httpx: the anthropic SDK's Bedrock client) "
                    f"raises, and this client ({one_line(self._user_agent or 'no User-Agent', 80)}) is neither known; by the "
                    f"events alone, {verdict.reason}",
                    verdict.seq,
                    verdict.offset,
                    verdict.evidence | {"content_complete": True, "was": verdict.kind.value, "content_length_short": True},
                )
        evidence = verdict.evidence | {"content_complete": True, "was": verdict.kind.value,
                                       "last_event_offset": verdict.offset}
        if end is StreamEnd.PROXY_ENDED:
            evidence["provider_fault"] = False
        return Verdict(
            VerdictKind.TRUNCATED,
            f"the end signal arrived but the HTTP body was cut before its end: {END_WORDS[end]}; an SDK that reads "
            f"the body to its end raises there, so the app got an exception, not the answer; by the events alone, "
            f"{verdict.reason}",
            verdict.seq,
            self._bytes,  # where the bytes stopped, as for any truncated turn
            evidence,
        )

    def _left_before_the_body_ended(self, verdict: Verdict) -> Verdict:
        """An answer whose end signal arrived, whose client went away before the HTTP body ended.
        Where the SDK stops reading at that signal (``sdk_stopped_reading``), leaving is what it
        does. Elsewhere the SDK reads the body to its end: a client that gave up waiting for it (a
        read timeout, as the anthropic SDK and boto3 raise) got an exception, while an app that
        broke out of its loop at the end signal has the whole answer. The proxy cannot tell them
        apart: unknown, saying both."""
        if getattr(self._assembler, "sdk_stopped_reading", False):
            return verdict
        return Verdict(
            VerdictKind.UNKNOWN,
            f"the end signal arrived, but the client went away before the HTTP body ended: this dialect's SDK reads "
            f"the body to its end, so a client that gave up waiting for it (a read timeout) got an exception, and "
            f"one that stopped reading at the end signal got the answer; by the events alone, {verdict.reason}",
            verdict.seq,
            verdict.offset,
            verdict.evidence | {"content_complete": True, "was": verdict.kind.value, "left_before_body_end": True},
        )

    def _error_field(self, turn: Turn, field: tuple[int, int, str, str], end: StreamEnd) -> Verdict:
        """An SSE ``error:`` line: llama.cpp's server sent its errors so through most of 2025. The
        SSE rules and the SDK skip the line, so the app sees the answer just stop; it is still the
        server's own word that it failed."""
        seq, offset, _, value = field
        fields = error_fields_of_text(value)
        turn.error = {"source": "stream", **fields}
        turn.stop_reason = "error"
        return Verdict(
            VerdictKind.ERRORED,
            f"an SSE error: line at byte {offset}, which the SDK skips: {fields.get('message')}",
            seq,
            offset,
            {"end": end.value, "bytes": self._bytes, "field": "error"},
        )

    def _http_error(self, turn: Turn, end: StreamEnd) -> Verdict:
        body = bytes(self._error_body)
        message = one_line(body.decode("utf-8", "replace")) if body.strip() else "no body"
        try:
            message = one_line(error_message(loads(body)))
        except ValueError:
            pass
        turn.error = {"source": "http", "status": self.http_status, "message": message}
        turn.stop_reason = "error"
        return Verdict(
            VerdictKind.ERRORED,
            f"HTTP {self.http_status}: {message}",
            0,
            0,
            {"status": self.http_status, "end": end.value, "bytes": self._bytes},
        )


NOT_A_STREAM = "not a stream: the request asked for a plain JSON answer, and streamtap judges streamed answers"


def _comments_only(raw: bytes, wire: str) -> bool:
    """SSE comment lines (and blank ones) alone, which begin no event."""
    return wire == "sse" and all(line.startswith(b":") for line in raw.replace(b"\r", b"\n").split(b"\n") if line)


def _head(raw: bytes, limit: int = 60) -> str:
    text = " ".join(raw.decode("utf-8", "replace").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


SHOWN_LINE = 200  # characters of the answer's last line a verdict's evidence shows (its end)


def _stopped_to_call(turn: Turn, choice: Choice, stops: dict[int, tuple[str, VerdictKind]]) -> bool:
    """Whether ``choice`` stopped to call a tool: by its own stop reason where the dialect gives each
    choice one (``Judge.choice_stops``), else by the turn's, for a choice holding a call when there are several."""
    if choice.index in stops:
        return stops[choice.index][0] == "tool_use"
    if turn.stop_reason != "tool_use":
        return False
    return len(turn.choices) == 1 or any(b.kind is BlockKind.TOOL_CALL for b in choice.blocks)


def _last_line(text: str, whole: bool = True) -> tuple[str, bool]:
    """The final non-blank line of ``text``, stripped, and whether it may begin before ``text`` does
    (``whole`` false: ``text`` is only the end of the answer); ("", not whole) when there is none."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line:
            return line, i == 0 and not whole
    return "", not whole


def _shown(line: str, cut: bool) -> str:
    """The end of a line for the evidence, an ellipsis where its start is left out."""
    if not cut and len(line) <= SHOWN_LINE:
        return line
    return "…" + line[-(SHOWN_LINE - 1):]


def sentinel_problem(sentinel: str | None) -> str | None:
    """Why no answer could ever end with ``sentinel`` (None: it can). Judged with such a one,
    every turn would be truncated and the cause hidden, so it is refused where it is given."""
    if not sentinel:
        return None
    if not sentinel.strip():
        return "only whitespace; no answer could ever end with it"
    if "\n" in sentinel.strip() or "\r" in sentinel.strip():
        return f"{sentinel!r} spans lines; the sentinel is the answer's last line"
    try:
        sentinel.encode("utf-8")
    except UnicodeEncodeError:  # bytes of no UTF-8 text, given in a command line (surrogate-escaped)
        shown = sentinel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return f"'{shown}' is not UTF-8 text; an answer's text is, so no answer could ever end with it"
    return None


def _ends_with_line(text: str, whole: bool, sentinel: str) -> bool | None:
    """The final non-blank line is exactly the sentinel (surrounding whitespace aside); None when
    ``text``, only the end of the answer (``whole`` false), cannot tell."""
    line, cut = _last_line(text, whole)
    wanted = sentinel.strip()
    if not cut:
        return line == wanted
    # the whole line, stripped, ends with what is seen of it: only a line seen as the sentinel's end may be it
    return None if wanted.endswith(line) else False


def analyze_error_document(body: bytes, dialect: Dialect | str = Dialect.UNKNOWN) -> Analysis | None:
    """A body that is one JSON document holding only the provider's error, judged ``errored``
    with the provider's message; None for any other body.

    It is what an HTTP error response leaves when saved without its status: OpenAI and Gemini
    pretty-print theirs over many lines, which no stream framing reads, Gemini's JSON-array
    endpoint wraps its error in an array of one, and Bedrock's is ``{"message": ...}`` alone (its
    type goes in the ``x-amzn-ErrorType`` header, or in ``__type``)."""
    found = _error_document(body)
    if found is None:
        return None
    analysis = StreamSession(dialect, "ndjson").close(StreamEnd.FINISHED)
    analysis.verdict = _errored_by_document(analysis.turn, *found, StreamEnd.FINISHED, len(body))
    analysis.bytes = len(body)
    return analysis


def _error_document(body: bytes) -> tuple[dict[str, Any], str] | None:
    """The error's fields and message where ``body`` is one JSON document holding only the
    provider's error; None for any other body."""
    try:
        document = loads(body)
    except ValueError:
        return None
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    if not isinstance(document, dict):
        return None
    if document.get("error"):
        fields = error_fields(document)
        message = one_line(error_message(document))
    elif (aws_error := _aws_error(document)) is not None:
        fields, message = aws_error
    else:
        return None
    return fields, message


def _errored_by_document(turn: Turn, fields: dict[str, Any], message: str, end: StreamEnd, size: int) -> Verdict:
    turn.error = {"source": "body", **fields}
    turn.stop_reason = "error"
    return Verdict(VerdictKind.ERRORED, f"the body is one JSON document holding the provider's error: {message}",
                   0, 0, {"end": end.value, "bytes": size})


def _aws_error(document: dict) -> tuple[dict[str, Any], str] | None:
    """The fields and message of an AWS REST-JSON error body: a message and at most its type,
    nothing else (with any member more it may be anything's JSON); None for any other document."""
    members = set(document) - {"__type"}
    if len(members) != 1 or not members <= {"message", "Message"}:
        return None
    text, kind = document[members.pop()], document.get("__type", "")
    if not isinstance(text, str) or not isinstance(kind, str):
        return None
    message = one_line(text)
    kind = kind.rsplit("#", 1)[-1]  # "com.amazon.coral.validate#ValidationException" names it after its namespace
    if not kind:
        return {"message": message}, message
    return {"type": kind, "message": message}, f"{kind}: {message}"


def analyze_bytes(
    body: bytes,
    dialect: Dialect | str,
    *,
    chunk_size: int | None = None,
    http_status: int = 200,
    sentinel: str | None = None,
    wire: str | None = None,
    end: StreamEnd | str = StreamEnd.FINISHED,
    one_response: bool = False,
    may_resume: bool = True,
) -> Analysis:
    """Judge a whole body at once (or fed in ``chunk_size`` pieces).

    The analysis is the same for any ``chunk_size`` (decoders give identical results for any
    chunking), so a body given whole is fed in ``BODY_SLICE`` pieces: the events each feed returns
    (dropped here) are never more than one slice holds, however many the body has."""
    # no times are given, so there are no arrivals to keep
    session = StreamSession(dialect, wire, http_status=http_status, sentinel=sentinel, keep_arrivals=False,
                            one_response=one_response, may_resume=may_resume)
    step = chunk_size or BODY_SLICE
    for i in range(0, len(body), step):
        session.feed(body[i : i + step])
    return session.close(end)

