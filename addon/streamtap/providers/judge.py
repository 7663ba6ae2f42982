"""The one judging mechanism every dialect uses.

A dialect module reads its own events; everything that turns what it read into a verdict
lives here, written once, so a rule holds in every dialect and is worded the same way:

- ``Judge.seen`` counts an event and remembers where the stream has got to;
- ``Judge.corrupt`` / ``Judge.errored`` record the first corruption and the first in-band error;
- ``Judge.close`` records that the provider closed a unit (a block, a choice, an output
  item, a message, the response) and with which event; ``Judge.reopened`` is the general
  rule: an event that contradicts a closed unit is ``corrupt``, and the verdict names both
  events (seq and byte of the closing one and of the contradicting one);
- ``parse_arguments`` parses a finished tool call's joined argument fragments (one parser,
  one wording for arguments that do not parse);
- ``Judge.early_verdict``, ``Judge.truncated`` and ``Judge.finished`` give the verdict, in
  one precedence: in-band error, then corruption, then no terminal signal (truncated),
  then the stop reason.

The session adds on top what no dialect can see: framing trouble, bytes that are not
UTF-8, HTTP status, cut tails (a terminal event in a cut tail was never dispatched: the
stream is truncated) and the sentinel.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import orjson

from streamtap.wire import IncrementalJSON, WireEvent
from streamtap.wire.partial_json import is_blank, lenient_loads

from .turn import NOT_JUDGED, Block, BlockKind, Choice, Turn, StreamEnd, Verdict, VerdictKind

TEXT_BATCH = 64  # text fragments joined at a time while a block grows (bounds the objects held)
# What one turn keeps in memory, so that the proxy's memory per stream does not grow with the
# answer's length. Beyond a cap the characters are counted, not kept: the recording holds every byte.
TEXT_CAP = 4 * 1024 * 1024  # characters of text, thinking, refusal and 'other' blocks, across the turn
ARGUMENTS_CAP = 4 * 1024 * 1024  # characters of tool-call arguments, across the turn (kept whole: parsed, then
# written twice into the end line, raw and parsed, so each kept character costs about five)
DROPPED = {"text": "text_dropped_chars", "arguments_raw": "arguments_dropped_chars"}  # block.extra keys
# characters of the end of each choice's answer kept beyond TEXT_CAP (``TextEnds``): its last line is the sentinel's
TEXT_END = 1024
MAX_LISTED = 4096  # items a block keeps in one list that grows per event (citations, unmodelled deltas)
MAX_NOTES = 50  # notes kept per turn
# A provider's usage object, merged into the turn event after event (Anthropic's message_delta adds to
# message_start's): each event may name new fields, which the turn would keep to its end and write into the
# end line. The names a dialect knows are kept, and MAX_USAGE_FIELDS others; a name or a value (as JSON)
# longer than its bound is counted, not kept (the SDKs' usage is counts, a few small objects and a list of
# iterations of ~200 characters each).
MAX_USAGE_FIELDS = 64
MAX_USAGE_NAME = 256
MAX_USAGE_VALUE = 16 * 1024
USAGE_DROPPED = "usage_fields_dropped"  # turn.extra key
# characters of each field of an in-band error the turn keeps: its message goes whole into the verdict's
# reason, and from there into the log line, the flow's comment and the recording's end line
MAX_ERROR_TEXT = 1000
_SCALARS = frozenset((int, float, bool, type(None)))  # JSON values of a bounded size

END_WORDS = {
    StreamEnd.FINISHED: "the body ended cleanly",
    StreamEnd.UPSTREAM_RESET: "the upstream connection was reset, closed early or timed out",
    StreamEnd.CLIENT_ABORTED: "the client went away first (not the provider's fault)",
    StreamEnd.PROXY_ENDED: "mitmproxy or one of its addons ended it (not the provider's fault)",
}

FINISHED_WORDS = {
    VerdictKind.COMPLETE: "the model finished",
    VerdictKind.STOPPED_BY_LIMIT: "the model was stopped by a limit",
    VerdictKind.FILTERED: "the output was filtered or refused",
    VerdictKind.ERRORED: "the provider reported a failed generation",
    VerdictKind.UNKNOWN: "the provider gave a stop reason streamtap does not know",
}

# kinds whose stop explains a tool call cut short (its arguments may not parse)
CUTTING_KINDS = (VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED, VerdictKind.ERRORED)
# normalized stop reasons of a cutting kind that stop between blocks, never inside one: Anthropic's
# pause_turn pauses a server-tool loop, and the caller resends the content as it is to continue
UNCUT_STOPS = frozenset({"paused"})
ENDING_KINDS = (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED)  # an answer that ended


class Judge:
    """Collects what decides a verdict while events arrive; gives the verdict at the end."""

    def __init__(self, turn: Turn, text_cap: int | None = TEXT_CAP, arguments_cap: int | None = ARGUMENTS_CAP) -> None:
        self.turn = turn
        self.limit(text_cap, arguments_cap)
        self.problem: Verdict | None = None  # the first corruption
        self.error_at: tuple[int | None, int | None] | None = None  # the first in-band error
        self.error_reason: str | None = None
        self.last_seq: int | None = None
        self.last_offset: int | None = None  # where the last event started
        self.last_end: int | None = None  # where it ended
        self.last_name: str | None = None  # what the last event was, for reasons
        self.terminal_at: tuple[int | None, int | None] | None = None  # the terminal event: seq, offset
        self.terminal_name: str | None = None
        self.closed_units: dict[str, tuple[str, int | None, int | None]] = {}  # unit -> closing event, seq, offset
        # each choice's own normalized stop reason and its verdict kind, where a turn has several (n > 1)
        self.choice_stops: dict[int, tuple[str, VerdictKind]] = {}
        # tool blocks the provider stopped with arguments that do not parse, and where: corrupt, unless the
        # stop reason that follows says a limit or a filter cut them (fine-grained tool streaming does that)
        self.unparsed_at: dict[int, tuple[int | None, int | None]] = {}
        # the first sign that the answer may not be one whole answer, which the bytes cannot settle
        # (reason, seq, offset): an ended answer is then unknown
        self.doubt_at: tuple[str, int | None, int | None] | None = None
        # the answer passed a bound streamtap assembles within, so the rest of it was not read: unknown
        self.halt_verdict: Verdict | None = None
        self.text_ends = TextEnds(turn)  # the end of each answer beyond the text cap

    # -- while events arrive ----------------------------------------------------------
    def seen(self, event: WireEvent, name: str | None = None) -> None:
        """Count an event of the dialect's wire and remember where the stream has got to."""
        self.turn.events += 1
        self.last_seq, self.last_offset, self.last_end = event.seq, event.start, event.end
        if name is not None:
            self.last_name = name

    def corrupt(self, reason: str, seq: int | None, offset: int | None, **evidence: Any) -> None:
        if self.problem is None:
            self.problem = Verdict(VerdictKind.CORRUPT, reason, seq, offset, evidence)

    def block_cut_by_limit(self, open_blocks: list[int], started: Iterable[int], stop_reason: str, stop_event: str,
                           seq: int | None, offset: int | None) -> int | None:
        """At a stop by a limit with ``open_blocks`` (sorted) never stopped: the one the limit cut.
        A limit cuts the block being generated, the last one started; an open block that another
        of ``started`` began after lost its ``stop_event``, which the limit does not explain:
        corrupt, and None."""
        index = open_blocks[0]
        later = min((i for i in started if i > index), default=None)
        if later is None:
            return index
        self.corrupt(f"block {index} never stopped, but block {later} started after it: its {stop_event} was lost "
                     f"({stop_reason} cuts only the last block)", seq, offset,
                     open_blocks=open_blocks, block=index, started_after=later, stop_reason=stop_reason)
        return None

    def errored(self, error: dict[str, Any], seq: int | None, offset: int | None) -> None:
        """The provider's own word that it failed: ``error`` is {source, type, code, message, ...}."""
        if self.error_at is None:
            self.turn.error = {key: bounded_error_value(value) for key, value in error.items()}
            self.turn.stop_reason = "error"
            self.error_at = (seq, offset)

    def doubt(self, reason: str, seq: int | None, offset: int | None) -> None:
        """The stream may hold more than one answer (or less than one), and its bytes cannot say
        which: an answer that would be complete, limited or filtered is judged unknown instead."""
        if self.doubt_at is None:
            self.doubt_at = (reason, seq, offset)

    def halt(self, reason: str, seq: int | None, offset: int | None, **evidence: Any) -> None:
        """The answer passed a bound (``reason`` says which): the dialect reads no more of it, so
        nothing after this event is judged and the verdict is unknown (what was found before stays)."""
        if self.halt_verdict is None:
            self.halt_verdict = Verdict(VerdictKind.UNKNOWN, f"{NOT_JUDGED}: {reason}",
                                        seq, offset, evidence)

    @property
    def halted(self) -> bool:
        return self.halt_verdict is not None

    def note(self, text: str) -> None:
        notes = self.turn.notes
        if text in notes:
            return
        if len(notes) < MAX_NOTES:
            notes.append(text)
        elif len(notes) == MAX_NOTES:
            notes.append("more notes dropped")

    def usage(self, fields: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
        """Merge ``fields``, a provider's usage object, into the turn's ``usage.raw`` (present fields
        overwrite: the counts are cumulative) within the MAX_USAGE_* bounds, names in ``known`` always
        kept; the fields kept are returned (``fields`` itself when all are). Those not kept are counted
        in ``turn.extra["usage_fields_dropped"]`` and said once in a note, and leave ``usage.raw``."""
        raw = self.turn.usage.raw
        dropped: set[str] | None = None  # (no set made per event while every field is kept)
        for key, value in fields.items():
            if (type(value) in _SCALARS or _json_size(value) <= MAX_USAGE_VALUE) and \
                    (key in raw or key in known or (len(raw) < MAX_USAGE_FIELDS and len(key) <= MAX_USAGE_NAME)):
                raw[key] = value
                continue
            raw.pop(key, None)  # a value kept before is superseded: the turn never shows it for a field said not kept
            if dropped is None:
                dropped = {key}
            else:
                dropped.add(key)
        if dropped is None:
            return fields
        extra = self.turn.extra
        if USAGE_DROPPED not in extra:
            self.note(f"usage fields past {MAX_USAGE_FIELDS} names, or with a name longer than {MAX_USAGE_NAME} or a "
                      f"value longer than {MAX_USAGE_VALUE} characters, not kept in memory (counted in "
                      f"{USAGE_DROPPED}); the recording holds every byte")
        extra[USAGE_DROPPED] = extra.get(USAGE_DROPPED, 0) + len(dropped)
        return {key: value for key, value in fields.items() if key not in dropped}

    def stop_reason(self, raw: str | None, normalized: str | None) -> None:
        """The provider's stop reason (raw and normalized); after an in-band error the turn's
        normalized stop reason stays "error", whatever the stream says later."""
        self.turn.stop_reason_raw = raw
        if self.error_at is None:
            self.turn.stop_reason = normalized

    def terminal(self, name: str, seq: int | None, offset: int | None) -> None:
        """The provider's end signal arrived (the first one counts)."""
        if self.terminal_at is None:
            self.terminal_at, self.terminal_name = (seq, offset), name

    # -- what the turn keeps in memory -------------------------------------------------
    def limit(self, text_cap: int | None, arguments_cap: int | None) -> None:
        """Keep at most ``text_cap`` characters of text and ``arguments_cap`` of tool-call arguments
        in this turn (None: everything). Set before the first event."""
        self.text_cap, self.arguments_cap = text_cap, arguments_cap
        self.text_left = sys.maxsize if text_cap is None else text_cap
        self.arguments_left = sys.maxsize if arguments_cap is None else arguments_cap

    def kept(self, block: Block, field: str, text: str) -> str:
        """The part of ``text`` (growing ``block.text`` or ``block.arguments_raw``) the turn keeps;
        what is beyond the cap is counted in ``block.extra`` and said once in a note."""
        if field != "text" or block.kind is not BlockKind.TEXT:
            return text[: self.take(block, field, len(text))]
        first = DROPPED["text"] not in block.extra  # (a block given its whole text anew counts from 0 again)
        keep = self.take(block, field, len(text))
        if keep < len(text):  # the answer's end, where its last line is (the sentinel's)
            self.text_ends.dropped(block, text[keep:], first)
        return text[:keep]

    def take(self, block: Block, field: str, size: int) -> int:
        """How many of ``size`` more characters of ``field`` the turn keeps (``kept`` for a value that
        is no text, such as the arguments Gemini's partialArgs build path by path)."""
        if field == "arguments_raw":
            left = self.arguments_left
            if size <= left:
                self.arguments_left = left - size
                return size
            self.arguments_left = 0
        else:
            left = self.text_left
            if size <= left:
                self.text_left = left - size
                return size
            self.text_left = 0
        key = dropped_key(field)
        dropped = block.extra.get(key)
        block.extra[key] = (dropped or 0) + size - left
        if dropped is not None:  # said already for this block
            return left
        what, cap = ("tool-call arguments", self.arguments_cap) if field == "arguments_raw" else ("text", self.text_cap)
        self.note(f"{what} beyond {_size(cap)} not kept in memory (block {block.index} on); "
                  "the recording holds every byte")
        return left

    def listed(self, block: Block, name: str, item: Any) -> None:
        """Add ``item`` to the block's list ``name`` (``citations``, or a list in ``extra``), up to
        MAX_LISTED items and within the turn's text cap (an item costs its JSON's length: an image
        delta can hold megabytes); the first item past either bound and every later one are
        counted in ``extra[name + "_dropped"]``, so the list kept is the list's beginning."""
        items = block.citations if name == "citations" else block.extra.setdefault(name, [])
        dropped = name + "_dropped"
        if dropped not in block.extra:
            if len(items) >= MAX_LISTED:
                self._listed_beyond(block, name, f"{MAX_LISTED} per block")
            else:
                size = _json_size(item)
                if size <= self.text_left:
                    self.text_left -= size
                    items.append(item)
                    return
                self._listed_beyond(block, name, f"the {_size(self.text_cap)} of text a turn keeps")
        block.extra[dropped] = block.extra.get(dropped, 0) + 1

    def listed_whole(self, block: Block, name: str, items: list[Any]) -> None:
        """Replace the block's list ``name`` with ``items``, a provider's whole list (a part's final
        annotations), kept as ``listed`` keeps one: the count beyond the bounds replaces the one the
        deltas made, since the whole list holds what they held, and so does its cost."""
        previous = block.citations if name == "citations" else block.extra.get(name)
        if isinstance(previous, list):
            self.give_back("text", sum(map(_json_size, previous)))
        kept: list[Any] = []
        for item in items[:MAX_LISTED]:
            size = _json_size(item)
            if size > self.text_left:
                break
            self.text_left -= size
            kept.append(item)
        if name == "citations":
            block.citations = kept
        else:
            block.extra[name] = kept
        beyond = len(items) - len(kept)
        if beyond:
            block.extra[name + "_dropped"] = beyond
            self._listed_beyond(block, name, f"{MAX_LISTED} per block" if len(kept) == MAX_LISTED
                                else f"the {_size(self.text_cap)} of text a turn keeps")
        else:
            block.extra.pop(name + "_dropped", None)

    def _listed_beyond(self, block: Block, name: str, bound: str) -> None:
        self.note(f"{name} beyond {bound} not kept in memory (block {block.index} on); "
                  "the recording holds every byte")

    def give_back(self, field: str, size: int) -> None:
        """``size`` characters ``kept`` counted are no longer kept (the caller replaces them)."""
        if field == "arguments_raw":
            self.arguments_left = min(self.arguments_left + size, sys.maxsize if self.arguments_cap is None else self.arguments_cap)
        else:
            self.text_left = min(self.text_left + size, sys.maxsize if self.text_cap is None else self.text_cap)

    def whole(self, block: Block, field: str, final: str) -> bool:
        """Whether ``final`` (a provider's whole value) is what the deltas grew, dropped part included."""
        kept = getattr(block, field) or ""
        dropped = block.extra.get(dropped_key(field), 0)
        if not dropped:
            return final == kept
        return len(final) == len(kept) + dropped and final.startswith(kept)

    # -- closed units: the general rule -----------------------------------------------
    # Closed units one turn remembers. A turn closes a few per block and output item (each bounded to
    # 4,096), so only a stream past those bounds, or one closing parts it never had, closes this many.
    MAX_CLOSED_UNITS = 4 * 4096

    def close(self, unit: str, by: str, seq: int | None, offset: int | None) -> None:
        """The provider closed ``unit`` (e.g. "block 2", "choice 0", "output item 1") with event ``by``.
        Past MAX_CLOSED_UNITS the answer is not judged (``halt``): each unit costs memory."""
        units = self.closed_units
        if unit in units:
            return
        if len(units) >= self.MAX_CLOSED_UNITS:
            self.halt(f"the answer closed more than {self.MAX_CLOSED_UNITS} units (blocks, parts, items); streamtap "
                      f"stopped assembling it at event {seq} (byte {offset}) to bound its memory", seq, offset,
                      max_closed_units=self.MAX_CLOSED_UNITS)
            return
        units[unit] = (by, seq, offset)

    def is_closed(self, unit: str) -> bool:
        return unit in self.closed_units

    def reopened(self, unit: str, what: str, seq: int | None, offset: int | None, **evidence: Any) -> bool:
        """True (and the stream is corrupt) when ``unit`` was closed: ``what`` contradicts it."""
        closing = self.closed_units.get(unit)
        if closing is None:
            return False
        by, closed_seq, closed_offset = closing
        self.corrupt(
            f"{what} at seq {seq} (byte {offset}) after {unit} was closed by {by} at seq {closed_seq} "
            f"(byte {closed_offset})",
            seq, offset, unit=unit, closed_by=by, closed_seq=closed_seq, closed_offset=closed_offset, **evidence)
        return True

    def forget(self, prefix: str) -> None:
        """Units named from ``prefix`` on are new again (a new message numbers its blocks from 0)."""
        for unit in [u for u in self.closed_units if u.startswith(prefix)]:
            del self.closed_units[unit]

    def close_arguments(self, block: Block, raw: str, start_input: Any, seq: int | None, offset: int | None,
                        lone_surrogates: bool = False) -> None:
        """The provider stopped a tool block: its joined arguments must parse, else the stream is corrupt,
        unless the stop reason says a limit or a filter cut them (decided with the verdict, ``cut_tool_calls``).
        ``lone_surrogates`` where apps read the arguments with json.loads (``parse_arguments``)."""
        if parse_arguments(block, raw, start_input, self if lone_surrogates else None) is not None \
                and not arguments_not_kept(block):
            self.unparsed_at[id(block)] = (seq, offset)

    # -- the verdict ------------------------------------------------------------------
    def early_verdict(self) -> Verdict | None:
        """An in-band error (the provider's own word wins), else the first corruption, else a bound
        passed (``halt``: nothing after it was read); None when none of them."""
        if self.error_at is not None:
            err = self.turn.error or {}
            evidence = {k: v for k, v in err.items() if v is not None}
            return Verdict(VerdictKind.ERRORED, error_reason(err), self.error_at[0], self.error_at[1], evidence)
        if self.problem is not None:
            problem = self.problem
            return Verdict(problem.kind, problem.reason, problem.seq, problem.offset, dict(problem.evidence))
        halted = self.halt_verdict
        if halted is not None:
            return Verdict(halted.kind, halted.reason, halted.seq, halted.offset, dict(halted.evidence))
        return None

    def truncated(self, reason: str, end: StreamEnd, **evidence: Any) -> Verdict:
        """No terminal signal: ``reason`` says what was missing."""
        evidence["end"] = end.value
        reason = f"{reason}: {END_WORDS[end]}"
        if self.last_name:
            reason += f"; last event {self.last_name} (seq {self.last_seq})"
        return Verdict(VerdictKind.TRUNCATED, reason, self.last_seq, self.last_offset, evidence)

    def finished(self, kind: VerdictKind, terminal: str, raw: str | None, **evidence: Any) -> Verdict:
        """The verdict once the terminal signal arrived, read off the stop reason ``raw``."""
        verdict = self._finished(kind, terminal, raw, **evidence)
        if self.doubt_at is not None and verdict.kind in ENDING_KINDS:
            reason, seq, offset = self.doubt_at
            return Verdict(VerdictKind.UNKNOWN, reason, seq, offset, {**verdict.evidence, "was": verdict.kind.value})
        return verdict

    def _finished(self, kind: VerdictKind, terminal: str, raw: str | None, **evidence: Any) -> Verdict:
        seq, offset = self.terminal_at or (self.last_seq, self.last_offset)
        evidence = {k: v for k, v in evidence.items() if v is not None}
        evidence.setdefault("stop_reason", raw)
        if raw is None:
            return Verdict(VerdictKind.UNKNOWN, f"{terminal} arrived without a stop reason", seq, offset, evidence)
        if self.choice_stops and kind in ENDING_KINDS:
            for choice in self.turn.choices:
                if self.choice_stops.get(choice.index, ("",))[0] == "tool_use" and not holds_tool_call(choice):
                    return Verdict(VerdictKind.CORRUPT, f"{terminal} after choice {choice.index}'s stop reason "
                                   f"{choice.stop_reason}, which says the model called a tool, but that choice holds "
                                   "no tool call", seq, offset, {**evidence, "choice": choice.index})
        elif kind is VerdictKind.COMPLETE and self.turn.stop_reason == "tool_use" and not any(
            holds_tool_call(choice, evidence.get("messages")) for choice in self.turn.choices
        ):  # the tool call's events were lost, or the stop belongs to another answer
            where = f" in the last of {evidence['messages']} messages" if evidence.get("messages") else ""
            return Verdict(VerdictKind.CORRUPT, f"{terminal} after stop reason {raw}, which says the model called a "
                           f"tool, but no tool call arrived{where}", seq, offset, evidence)
        repeated = repeated_call_id(self.turn) if kind in ENDING_KINDS else None
        if repeated is not None:
            call_id, choice, first, second = repeated
            return Verdict(VerdictKind.CORRUPT, f"{terminal}, but tool calls {first} and {second} of choice {choice} carry "
                           f"one id, {call_id}: one call sent twice, or another answer's stitched on (the app would "
                           "answer both under that id)", seq, offset,
                           {**evidence, "call_id": call_id, "choice": choice, "blocks": [first, second]})
        unparsed = self.unparsed_tool_call() if kind is VerdictKind.COMPLETE else None
        if unparsed is not None:
            evidence["arguments_not_kept"] = True
            return Verdict(VerdictKind.UNKNOWN, unparsed, seq, offset, evidence)
        cut = self.cut_tool_calls(kind, seq, offset, evidence.get("messages"))
        if isinstance(cut, Verdict):
            return cut
        if cut:
            evidence["cut_tool_calls"] = cut
        return Verdict(kind, f"{FINISHED_WORDS[kind]}: {terminal} after stop reason {raw}", seq, offset, evidence)

    def unparsed_tool_call(self) -> str | None:
        """Why the verdict cannot be complete: a tool call longer than the cap was not parsed."""
        for choice in self.turn.choices:
            for block in choice.blocks:
                if block.kind in ARGUMENT_KINDS and arguments_not_kept(block):
                    size = len(block.arguments_raw or "") + block.extra[DROPPED["arguments_raw"]]
                    return (f"{FINISHED_WORDS[VerdictKind.COMPLETE]}, but tool call {block.name or block.id or block.index} "
                            f"has {size} characters of arguments, beyond the {_size(self.arguments_cap)} kept in memory, "
                            "so they were not parsed: run `streamtap verify` on the recording to judge them")
        return None

    def cut_tool_calls(self, kind: VerdictKind, seq: int | None, offset: int | None,
                       messages: int | None = None) -> Verdict | list[list[int]]:
        """Tool calls whose arguments do not parse: corrupt after a normal stop, else cut by the stop
        (the stop of the call's own choice: another choice's limit does not explain it; of
        ``messages`` back to back, the last one's stop explains only that message's calls). A limit
        or a filter cuts the block being generated, the choice's last: an earlier one was not cut."""
        cut: list[list[int]] = []
        for choice in self.turn.choices:
            stop, stopped = self.choice_stops.get(choice.index, (self.turn.stop_reason, kind))
            last = choice.blocks[-1] if choice.blocks else None
            for block in choice.blocks:
                if block.kind in ARGUMENT_KINDS and block.arguments_error:
                    cutting = stopped in CUTTING_KINDS and stop not in UNCUT_STOPS and _in_last(block, messages)
                    if cutting and block is last:
                        cut.append([choice.index, block.index])
                        continue
                    at_seq, at_offset = self.unparsed_at.get(id(block), (seq, offset))  # its stop, where it had one
                    reason = invalid_arguments(block)
                    if cutting:
                        reason += (f", and block {last.index} came after it: a "
                                   f"{'filter' if stopped is VerdictKind.FILTERED else 'limit'} cuts only the last block")
                    return Verdict(VerdictKind.CORRUPT, reason, at_seq, at_offset,
                                   {"choice": choice.index, "block": block.index, "tool": block.name,
                                    "arguments_raw": (block.arguments_raw or "")[:200]})
        return cut


class TextEnds:
    """The end of the text each text block did not keep (beyond the cap), so that an answer's last
    line (the sentinel's) is read whatever the answer's length. Per choice it holds the ends of the
    blocks that can still reach the last TEXT_END characters of its text: a few TEXT_END at most."""

    __slots__ = ("turn", "_ends", "_last")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        # choice -> block index -> [block, the last pieces of its dropped text, their length]
        self._ends: dict[int, dict[int, list[Any]]] = {}
        self._last: tuple[Block, list[Any]] | None = None  # the block dropped into last (the common case: it grows)

    def dropped(self, block: Block, text: str, first: bool) -> None:
        """``text`` went beyond the cap in ``block`` (``first``: the block's dropped text begins with it)."""
        last = self._last
        entry = last[1] if last is not None and last[0] is block and not first else self._entry(block, first)
        if entry is None:
            return
        pieces = entry[1]
        pieces.append(text[-TEXT_END:])
        entry[2] += len(pieces[-1])
        if entry[2] > 2 * TEXT_END:  # joined now and then, so a run of small pieces costs little
            pieces[:] = ["".join(pieces)[-TEXT_END:]]
            entry[2] = TEXT_END

    def _entry(self, block: Block, first: bool) -> list[Any] | None:
        self._last = None
        choice = next((c.index for c in self.turn.choices
                       if block.index < len(c.blocks) and c.blocks[block.index] is block), None)
        if choice is None:  # no choice holds it: end() finds its dropped text unaccounted for
            return None
        ends = self._ends.setdefault(choice, {})
        entry = ends.get(block.index)
        if first or entry is None or entry[0] is not block:
            entry = ends[block.index] = [block, [], 0]
            size = 0  # blocks before the choice's last TEXT_END characters no longer reach its end
            for index in sorted(ends, reverse=True):
                if size >= TEXT_END:
                    del ends[index]
                else:
                    size += ends[index][2]
        self._last = (block, entry)
        return entry

    def end(self, choice: Choice) -> tuple[str, bool] | None:
        """The end of the choice's text, its dropped part included, and whether it is all of it (at
        least TEXT_END characters where it is not); None when the choice kept all its text."""
        if not any(block.kind is BlockKind.TEXT and block.extra.get(DROPPED["text"]) for block in choice.blocks):
            return None
        ends = self._ends.get(choice.index, {})
        parts: list[str] = []
        size = 0
        for block in reversed(choice.blocks):
            if block.kind is not BlockKind.TEXT:
                continue
            dropped = block.extra.get(DROPPED["text"], 0)
            if dropped:
                entry = ends.get(block.index)
                end = "".join(entry[1])[-TEXT_END:] if entry is not None and entry[0] is block else ""
                if len(end) != min(dropped, TEXT_END):  # its end is not held: what comes before is not known
                    return "".join(reversed(parts)), False
                parts.append(end)
                size += len(end)
                if len(end) < dropped:
                    return "".join(reversed(parts)), False
            parts.append(block.text[-TEXT_END:])
            size += len(parts[-1])
            if size >= TEXT_END or len(block.text) > TEXT_END:
                return "".join(reversed(parts)), False
        return "".join(reversed(parts)), True


# blocks whose arguments are JSON the app (or the provider's own tool) reads: a client's tool call,
# and a server tool's use (web search, code execution), whose input arrives the same way
ARGUMENT_KINDS = frozenset({BlockKind.TOOL_CALL, BlockKind.SERVER_TOOL})


def _in_last(block: Block, messages: int | None) -> bool:
    """Whether ``block`` is in the last of ``messages`` back to back (the dialect numbers the blocks
    of the second and later in ``extra["message"]``)."""
    return not messages or block.extra.get("message", 0) == messages - 1


# A thinking block's signature covers the thinking before it and comes last in its block
# (provider-streams.md §3.3; Anthropic, and Claude on ConverseStream): thinking after it was reordered
# or stitched on, and the API refuses the block when the app sends it back.
THINKING_AFTER_SIGNATURE = ("{delta} for block {index} after its signature: the signature covers only the thinking "
                            "before it, so events were reordered or another block's stitched on, and the API refuses "
                            "the block when the app sends it back")


def repeated_call_id(turn: Turn) -> tuple[str, int, int, int] | None:
    """The first tool call id that two calls of one choice carry in one message: (the id, the
    choice, both blocks' indexes). A provider gives every call its own id, which the app's answer
    names. (Of messages back to back, a multi-step recording, each is compared with itself.)"""
    for choice in turn.choices:
        seen: dict[tuple[int, str], int] = {}
        for block in choice.blocks:
            if block.kind is BlockKind.TOOL_CALL and block.id:
                first = seen.setdefault((block.extra.get("message", 0), block.id), block.index)
                if first != block.index:
                    return block.id, choice.index, first, block.index
    return None


def holds_tool_call(choice: Choice, messages: int | None = None) -> bool:
    """Whether ``choice`` holds a tool call; of ``messages`` back to back, in the last one, whose stop
    reason is the turn's (the dialect numbers the blocks of the second and later in ``extra["message"]``)."""
    return any(block.kind is BlockKind.TOOL_CALL and _in_last(block, messages) for block in choice.blocks)


def error_reason(error: dict[str, Any]) -> str:
    """One wording for every in-band error: where it came from, its type or code, its message."""
    what = error.get("type") or error.get("code") or error.get("status") or "error"
    message = error.get("message")
    return f"{error.get('source', 'stream')} error {what}" + (f": {message}" if message else "")


def shortened(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``text`` in at most ``limit`` characters: where it is longer, its beginning and its whole length
    (so a text shortened once is kept as it is the next time)."""
    return text if len(text) <= limit else _cut(text, limit, len(text))


def error_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """An error's message for a verdict's reason: on one line, in at most ``limit`` characters (its
    beginning and its whole length where it is longer). Only a prefix is read into the line: splitting
    megabytes of words would make a list of them."""
    line = " ".join(text[: 4 * limit].split())
    if len(line) <= limit and len(text) <= 4 * limit:
        return line
    return _cut(line, limit, len(text))


def _cut(text: str, limit: int, length: int) -> str:
    note = f"… ({length:,} characters)"
    return text[: limit - len(note)] + note


def bounded_error_value(value: Any) -> Any:
    """A field of an in-band error as the turn keeps it: text shortened, an object or a list as long
    as its JSON is short."""
    if isinstance(value, str):
        return shortened(value)
    if type(value) in _SCALARS or _json_size(value) <= MAX_ERROR_TEXT:
        return value
    return f"{type(value).__name__} longer than {MAX_ERROR_TEXT} characters of JSON, not kept"


def invalid_arguments(block: Block) -> str:
    return f"tool call {block.name or block.id or block.index} has invalid argument JSON ({block.arguments_error})"


def dropped_key(field: str) -> str:
    """The ``block.extra`` key counting what the turn did not keep of ``field``."""
    return DROPPED.get(field) or field.removeprefix("extra.") + "_dropped_chars"


def arguments_not_kept(block: Block) -> bool:
    return DROPPED["arguments_raw"] in block.extra


def _size(cap: int | None) -> str:
    if cap is None:
        return "no limit"
    return f"{cap // (1024 * 1024)} MiB" if cap % (1024 * 1024) == 0 else f"{cap} characters"


def parse_arguments(block: Block, raw: str | None, start_input: Any = None,
                    lone_surrogates: Judge | None = None) -> str | None:
    """Parse a finished tool call's joined argument fragments into ``block.arguments``.

    Empty arguments mean the start input (normally ``{}``): providers send no fragment for
    a tool without parameters. Arguments of only JSON whitespace are no JSON value, and invalid:
    the anthropic SDK keeps the start input only when the joined fragments are empty, and an app
    that calls json.loads on OpenAI's arguments (skipping empty ones) fails on them too.
    Returns the parse error (also kept in ``arguments_error``).
    Arguments longer than the judge's cap are not parsed (only their start was kept): the
    verdict says so (``Judge.unparsed_tool_call``). A lone surrogate escape (an emoji cut in half)
    is invalid, as the anthropic SDK's parser (jiter) finds it; where apps read the arguments with
    json.loads, which reads it (OpenAI's SDKs hand them over as a string), ``lone_surrogates`` is the
    judge, and the parsed arguments hold U+FFFD in its place, said in its notes (``arguments_raw``
    keeps the escape)."""
    block.arguments_raw = raw
    if arguments_not_kept(block):
        block.arguments = block.arguments_error = None
        return None
    if not raw:
        if start_input is not None and not isinstance(start_input, dict):  # the SDK hands the app this value
            block.arguments = start_input
            block.arguments_error = f"the tool call's input is {type(start_input).__name__}, not a JSON object"
            return block.arguments_error
        block.arguments = start_input if start_input is not None else {}
        block.arguments_error = None
        return None
    if is_blank(raw):  # IncrementalJSON reads it as no arguments yet, as it reads ""
        block.arguments = None
        block.arguments_error = "no JSON value: the arguments are only whitespace"
        return block.arguments_error
    document = IncrementalJSON()
    document.feed(raw)
    try:
        block.arguments = document.value()
    except ValueError as exc:
        if lone_surrogates is None or not _read_by_json_loads(block, raw, lone_surrogates):
            block.arguments = None
            block.arguments_error = str(exc).split("\n")[0]
            return block.arguments_error
    block.arguments_error = None
    return None


def _read_by_json_loads(block: Block, raw: str, judge: Judge) -> bool:
    """Whether json.loads reads the arguments ``IncrementalJSON`` refused (of what it refuses, it reads
    only a lone surrogate escape): then they hold U+FFFD in its place, said in the ``judge``'s notes."""
    try:
        block.arguments = sdk_loads(raw, True, judge, f"tool call {block.name or block.id or block.index}'s arguments "
                                    "hold a lone surrogate escape (half a UTF-16 pair), which json.loads (as apps read "
                                    "arguments) reads: the parsed arguments hold U+FFFD in its place; the raw arguments "
                                    "and the recording hold the escape")
    except ValueError:
        return False
    return True


class Fragments:
    """One growing field of a block (``text``, ``arguments_raw`` or ``extra.KEY``, a string in
    ``block.extra``): fragments joined in batches,
    kept up to the judge's cap (``Judge.kept``), written into the block once.

    Growing a str attribute with += copies it every time; here every TEXT_BATCH fragments
    are joined on the way, so a long block holds a few strings rather than one per event,
    and writing joins once (no transient copy larger than what the turn keeps)."""

    __slots__ = ("block", "field", "_judge", "_parts", "_batches")

    def __init__(self, judge: Judge, block: Block, field: str = "text") -> None:
        self.block, self.field, self._judge = block, field, judge
        self._parts: list[str] = []
        self._batches: list[str] = []

    def append(self, text: str) -> None:
        judge = self._judge
        left = judge.arguments_left if self.field == "arguments_raw" else judge.text_left
        if len(text) > left:
            text = judge.kept(self.block, self.field, text)
            if not text:
                return
        elif self.field == "arguments_raw":
            judge.arguments_left = left - len(text)
        else:
            judge.text_left = left - len(text)
        parts = self._parts
        parts.append(text)
        if len(parts) >= TEXT_BATCH:
            self._batches.append("".join(parts))
            parts.clear()

    def joined(self) -> str:
        """Every kept fragment, joined (and forgotten here)."""
        text = "".join([*self._batches, *self._parts])
        self._batches, self._parts = [], []
        return text

    def write(self) -> None:
        """Add the kept fragments to the block's field."""
        if self._parts or self._batches:
            block, field = self.block, self.field
            if field.startswith("extra."):
                previous = block.extra.get(field[6:])
                block.extra[field[6:]] = "".join([previous if isinstance(previous, str) else "", *self._batches, *self._parts])
            else:
                setattr(block, field, "".join([getattr(block, field) or "", *self._batches, *self._parts]))
            self._batches, self._parts = [], []


class Pieces:
    """The growing text of several blocks at once (``Fragments`` per block), for dialects that
    name their blocks and interleave them."""

    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self._parts: dict[tuple[int, str], Fragments] = {}  # (id(block), field) -> its fragments

    def add(self, block: Block, text: str, field: str = "text") -> None:
        entry = self._parts.get((id(block), field))
        if entry is None:
            entry = self._parts[(id(block), field)] = Fragments(self._judge, block, field)
        entry.append(text)

    def content(self, block: Block, text: str, t: float | None) -> None:
        """A piece of the answer's text or thinking, arrived at ``t``: the first that is not
        empty, in any block, times the turn's first content."""
        self.add(block, text)
        timing = self._judge.turn.timing
        if text and timing.first_content is None:
            timing.first_content = t

    def flush(self, block: Block | None = None) -> None:
        """Write the joined text into one block (or into every block)."""
        if block is not None:
            for key in [key for key in self._parts if key[0] == id(block)]:
                self._parts.pop(key).write()
            return
        for entry in self._parts.values():
            entry.write()
        self._parts.clear()


def as_text(value: Any) -> str | None:
    """A provider value used as a key (stop reason, type): a string, or None when absent."""
    return value if value is None or isinstance(value, str) else repr(value)


def earlier_outcome(outcomes: list[tuple[str | None, int | None, int | None, bool]],
                    table: dict[str, tuple[VerdictKind, str]], field: str, messages: int) -> Verdict | None:
    """An earlier message of a back-to-back stream that did not finish, or whose stop reason its own
    content contradicts (a tool call stop without a tool call), decides the turn; None when all
    finished as they say.

    ``outcomes`` holds each earlier message's raw stop reason, where the next one started and
    whether the message held a tool call; ``field`` is the provider's name for the stop reason,
    for the reason text."""
    for raw, seq, offset, called in outcomes:
        kind, stop = table.get(raw, (VerdictKind.UNKNOWN, None)) if raw else (VerdictKind.UNKNOWN, None)
        evidence = {"stop_reason": raw, "messages": messages}
        if kind is not VerdictKind.COMPLETE:
            return Verdict(kind, f"an earlier message in this stream ended with {field} {raw}", seq, offset, evidence)
        if stop == "tool_use" and not called:  # as the last message's own check (Judge.finished) says it
            return Verdict(VerdictKind.CORRUPT, f"an earlier message in this stream ended with {field} {raw}, which "
                           "says the model called a tool, but that message holds no tool call", seq, offset, evidence)
    return None


def stop_verdict(turn: Turn, judge: Judge, terminal: str, table: dict[str, tuple[VerdictKind, str]],
                 **evidence: Any) -> Verdict:
    """The verdict once the terminal signal arrived, from a raw stop reason table."""
    raw = turn.stop_reason_raw
    if evidence.get("messages") == 1:
        del evidence["messages"]
    kind = table.get(raw, (VerdictKind.UNKNOWN,))[0] if raw is not None else VerdictKind.UNKNOWN
    return judge.finished(kind, terminal, raw, **evidence)


def _json_size(item: Any) -> int:
    """What a listed item costs the turn: the length of its JSON (orjson's, else the json module's,
    which writes integers past 64 bits and deeper nesting); one that cannot be written is not kept."""
    try:
        return len(orjson.dumps(item))
    except TypeError:
        try:
            return len(json.dumps(item, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            return sys.maxsize




LONE_SURROGATE_NOTE = ("event JSON holds a lone surrogate escape (half a UTF-16 pair), which the SDK's json module "
                       "reads: the turn holds U+FFFD in its place; the recording holds the bytes")


def sdk_loads(data: str | bytes, exact_integers: bool = False, judge: Judge | None = None,
              note: str = LONE_SURROGATE_NOTE) -> Any:
    """An event's JSON as the providers' Python SDKs read it (botocore, anthropic: the json module):
    orjson's reading, and where orjson refuses, ``json.loads``'s (``NaN``, ``Infinity``, ``1e400``,
    a lone surrogate escape; ``lenient_loads``). A lone surrogate becomes U+FFFD, said once (``note``)
    in the ``judge``'s notes: no UTF-8 text (the recording's end line, a report) can hold it, and the
    recording keeps the bytes. Raises orjson's error where the json module refuses too.
    ``exact_integers`` as for ``common.loads``."""
    return lenient_loads(data, exact_integers=exact_integers,
                         on_lone_surrogate=(lambda: judge.note(note)) if judge is not None else _nothing)


def _nothing() -> None:
    pass


def decode_event_json(
    data: str | bytes, judge: Judge, seq: int, offset: int, what: str, exact_integers: bool = False
) -> dict[str, Any] | None:
    """The event's JSON object as the SDKs read it (``sdk_loads``), or None once the judge was told
    why not; ``exact_integers`` as for ``common.loads``."""
    try:
        value = sdk_loads(data, exact_integers, judge)
    except orjson.JSONDecodeError as exc:
        judge.corrupt(f"{what} is not valid JSON ({str(exc).splitlines()[0]})", seq, offset, data=str(data[:200]))
        return None
    if not isinstance(value, dict):
        judge.corrupt(f"{what} is JSON but not an object", seq, offset, data=str(data[:200]))
        return None
    return value
