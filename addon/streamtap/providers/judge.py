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

from typing import Any

import orjson

from streamtap.wire import IncrementalJSON, WireEvent

from .turn import Block, BlockKind, Turn, StreamEnd, Verdict, VerdictKind

TEXT_BATCH = 64  # text fragments joined at a time while a block grows (bounds the objects held)
MAX_NOTES = 50  # notes kept per turn

END_WORDS = {
    StreamEnd.FINISHED: "the body ended cleanly",
    StreamEnd.UPSTREAM_RESET: "the upstream connection was reset or timed out",
    StreamEnd.CLIENT_ABORTED: "the client went away first (not the provider's fault)",
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


class Judge:
    """Collects what decides a verdict while events arrive; gives the verdict at the end."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
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

    def errored(self, error: dict[str, Any], seq: int | None, offset: int | None) -> None:
        """The provider's own word that it failed: ``error`` is {source, type, code, message, ...}."""
        if self.error_at is None:
            self.turn.error = error
            self.turn.stop_reason = "error"
            self.error_at = (seq, offset)

    def note(self, text: str) -> None:
        notes = self.turn.notes
        if text in notes:
            return
        if len(notes) < MAX_NOTES:
            notes.append(text)
        elif len(notes) == MAX_NOTES:
            notes.append("more notes dropped")

    def terminal(self, name: str, seq: int | None, offset: int | None) -> None:
        """The provider's end signal arrived (the first one counts)."""
        if self.terminal_at is None:
            self.terminal_at, self.terminal_name = (seq, offset), name

    # -- closed units: the general rule -----------------------------------------------
    def close(self, unit: str, by: str, seq: int | None, offset: int | None) -> None:
        """The provider closed ``unit`` (e.g. "block 2", "choice 0", "output item 1") with event ``by``."""
        self.closed_units.setdefault(unit, (by, seq, offset))

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

    def close_arguments(self, block: Block, raw: str, start_input: Any, seq: int | None, offset: int | None) -> None:
        """The provider stopped a tool block: its joined arguments must parse, else the stream is corrupt."""
        if parse_arguments(block, raw, start_input) is not None:
            self.corrupt(invalid_arguments(block), seq, offset, block=block.index, tool=block.name,
                         arguments_raw=raw[:200])

    # -- the verdict ------------------------------------------------------------------
    def early_verdict(self) -> Verdict | None:
        """An in-band error (the provider's own word wins), else the first corruption; None when neither."""
        if self.error_at is not None:
            err = self.turn.error or {}
            evidence = {k: v for k, v in err.items() if v is not None}
            return Verdict(VerdictKind.ERRORED, error_reason(err), self.error_at[0], self.error_at[1], evidence)
        if self.problem is not None:
            problem = self.problem
            return Verdict(problem.kind, problem.reason, problem.seq, problem.offset, dict(problem.evidence))
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
        seq, offset = self.terminal_at or (self.last_seq, self.last_offset)
        evidence = {k: v for k, v in evidence.items() if v is not None}
        evidence.setdefault("stop_reason", raw)
        if raw is None:
            return Verdict(VerdictKind.UNKNOWN, f"{terminal} arrived without a stop reason", seq, offset, evidence)
        cut = self.cut_tool_calls(kind, seq, offset)
        if isinstance(cut, Verdict):
            return cut
        if cut:
            evidence["cut_tool_calls"] = cut
        return Verdict(kind, f"{FINISHED_WORDS[kind]}: {terminal} after stop reason {raw}", seq, offset, evidence)

    def cut_tool_calls(self, kind: VerdictKind, seq: int | None, offset: int | None) -> Verdict | list[list[int]]:
        """Tool calls whose arguments do not parse: corrupt after a normal stop, else cut by the stop."""
        cut: list[list[int]] = []
        for choice in self.turn.choices:
            for block in choice.blocks:
                if block.kind is BlockKind.TOOL_CALL and block.arguments_error:
                    if kind in CUTTING_KINDS:
                        cut.append([choice.index, block.index])
                        continue
                    return Verdict(VerdictKind.CORRUPT, invalid_arguments(block), seq, offset,
                                   {"choice": choice.index, "block": block.index,
                                    "arguments_raw": (block.arguments_raw or "")[:200]})
        return cut


def error_reason(error: dict[str, Any]) -> str:
    """One wording for every in-band error: where it came from, its type or code, its message."""
    what = error.get("type") or error.get("code") or error.get("status") or "error"
    message = error.get("message")
    return f"{error.get('source', 'stream')} error {what}" + (f": {message}" if message else "")


def invalid_arguments(block: Block) -> str:
    return f"tool call {block.name or block.id or block.index} has invalid argument JSON ({block.arguments_error})"


def parse_arguments(block: Block, raw: str | None, start_input: Any = None) -> str | None:
    """Parse a finished tool call's joined argument fragments into ``block.arguments``.

    Empty arguments mean the start input (normally ``{}``): providers send no fragment for
    a tool without parameters. Returns the parse error (also kept in ``arguments_error``)."""
    block.arguments_raw = raw
    if raw is None or not raw.strip():
        block.arguments = start_input if isinstance(start_input, dict) else {}
        block.arguments_error = None
        return None
    document = IncrementalJSON()
    document.feed(raw)
    try:
        block.arguments = document.value()
    except ValueError as exc:
        block.arguments = None
        block.arguments_error = str(exc).split("\n")[0]
        return block.arguments_error
    block.arguments_error = None
    return None


class Pieces:
    """Text fragments per block, joined once: growing a str attribute with += copies it every time.

    Every TEXT_BATCH fragments of a block are joined on the way, so a long block holds a
    few strings rather than one object per event."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[Block, list[str], list[str]]] = {}  # id -> block, fragments, joined batches

    def add(self, block: Block, text: str) -> None:
        entry = self._parts.get(id(block))
        if entry is None:
            self._parts[id(block)] = (block, [text], [])
            return
        fragments = entry[1]
        fragments.append(text)
        if len(fragments) >= TEXT_BATCH:
            entry[2].append("".join(fragments))
            fragments.clear()

    def flush(self, block: Block | None = None) -> None:
        """Write the joined text into one block (or into every block)."""
        entries = [self._parts.pop(id(block), None)] if block is not None else list(self._parts.values())
        if block is None:
            self._parts.clear()
        for entry in entries:
            if entry is not None:
                entry[0].text += "".join(entry[2]) + "".join(entry[1])


def as_text(value: Any) -> str | None:
    """A provider value used as a key (stop reason, type): a string, or None when absent."""
    return value if value is None or isinstance(value, str) else repr(value)


def earlier_outcome(outcomes: list[tuple[str | None, int | None, int | None]],
                    table: dict[str, tuple[VerdictKind, str]], field: str, messages: int) -> Verdict | None:
    """An earlier message of a back-to-back stream that did not finish decides the turn; None when all did.

    ``outcomes`` holds each earlier message's raw stop reason and where the next one started;
    ``field`` is the provider's name for the stop reason, for the reason text."""
    for raw, seq, offset in outcomes:
        kind = table.get(raw, (VerdictKind.UNKNOWN,))[0] if raw else VerdictKind.UNKNOWN
        if kind is not VerdictKind.COMPLETE:
            return Verdict(kind, f"an earlier message in this stream ended with {field} {raw}", seq, offset,
                           {"stop_reason": raw, "messages": messages})
    return None


def stop_verdict(turn: Turn, judge: Judge, terminal: str, table: dict[str, tuple[VerdictKind, str]],
                 **evidence: Any) -> Verdict:
    """The verdict once the terminal signal arrived, from a raw stop reason table."""
    raw = turn.stop_reason_raw
    if evidence.get("messages") == 1:
        del evidence["messages"]
    kind = table.get(raw, (VerdictKind.UNKNOWN,))[0] if raw is not None else VerdictKind.UNKNOWN
    return judge.finished(kind, terminal, raw, **evidence)


def decode_event_json(data: str | bytes, judge: Judge, seq: int, offset: int, what: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        judge.corrupt(f"{what} is not valid JSON ({str(exc).splitlines()[0]})", seq, offset, data=str(data[:200]))
        return None
    if not isinstance(value, dict):
        judge.corrupt(f"{what} is JSON but not an object", seq, offset, data=str(data[:200]))
        return None
    return value
