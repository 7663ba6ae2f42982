"""The verdict helpers the Anthropic and Bedrock modules share.

They assemble several messages into one turn (see anthropic.py), so they keep their own
precedence rather than ``common.AssemblerBase``'s: ``Judge`` collects the first error,
the first corruption and notes while events arrive; ``stop_verdict`` reads the verdict off
the stop reason once the terminal signal came; ``Pieces`` joins a block's text fragments once.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamtap.wire import WireEvent

from .common import END_WORDS, MAX_NOTES, TEXT_BATCH
from .turn import Block, Turn, StreamEnd, Verdict, VerdictKind


class Judge:
    """Collects what decides a verdict while events arrive: first corruption, first error, notes."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.problem: tuple[str, int | None, int | None, dict[str, Any]] | None = None
        self.error_at: tuple[int | None, int | None] | None = None
        self.last_seq: int | None = None
        self.last_end: int | None = None
        self.terminal_at: tuple[int | None, int | None] | None = None  # the terminal event: seq, offset

    def seen(self, event: WireEvent) -> None:
        """Count an event of the dialect's wire and remember where the stream has got to."""
        self.turn.events += 1
        self.last_seq = event.seq
        self.last_end = event.end

    def corrupt(self, reason: str, seq: int | None, offset: int | None, **evidence: Any) -> None:
        if self.problem is None:
            self.problem = (reason, seq, offset, evidence)

    def errored(self, error: dict[str, Any], seq: int | None, offset: int | None) -> None:
        if self.error_at is None:
            self.turn.error = error
            self.turn.stop_reason = "error"
            self.error_at = (seq, offset)

    def note(self, text: str) -> None:
        notes = self.turn.notes
        if len(notes) < MAX_NOTES:
            notes.append(text)
        elif len(notes) == MAX_NOTES:
            notes.append("more notes dropped")

    def early_verdict(self) -> Verdict | None:
        """An in-band error (the provider's own word wins), else the first corruption; None when neither."""
        if self.error_at is not None:
            err = self.turn.error or {}
            what = err.get("type") or err.get("code") or "error"
            message = err.get("message")
            reason = f"{err.get('source', 'stream')} error {what}" + (f": {message}" if message else "")
            evidence = {k: v for k, v in err.items() if v is not None}
            return Verdict(VerdictKind.ERRORED, reason, self.error_at[0], self.error_at[1], evidence)
        if self.problem is not None:
            reason, seq, offset, evidence = self.problem
            return Verdict(VerdictKind.CORRUPT, reason, seq, offset, dict(evidence))
        return None

    def truncated(self, reason: str, end: StreamEnd, **evidence: Any) -> Verdict:
        evidence["end"] = end.value
        return Verdict(VerdictKind.TRUNCATED, f"{reason}: {END_WORDS[end]}", self.last_seq, self.last_end, evidence)


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


def parse_arguments(raw: str, start_input: Any) -> tuple[Any, str | None]:
    """Parse a closed tool block's argument string: empty means the start input (normally {})."""
    if not raw.strip():
        return (start_input if isinstance(start_input, dict) else {}), None
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError as exc:
        return None, str(exc).split("\n")[0]


def close_arguments(block: Block, raw: str, start_input: Any, judge: Judge, seq: int | None, offset: int | None,
                    index: int) -> None:
    """Parse a stopped tool block's joined argument fragments; arguments that do not parse are corrupt."""
    block.arguments_raw = raw
    block.arguments, block.arguments_error = parse_arguments(raw, start_input)
    if block.arguments_error is not None:
        judge.corrupt(f"tool call {block.name!r} arguments are not valid JSON ({block.arguments_error})",
                      seq, offset, index=index, tool=block.name, arguments_raw=raw[:200])


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
    """The verdict once the terminal signal arrived: read off the stop reason."""
    raw = turn.stop_reason_raw
    seq, offset = judge.terminal_at or (judge.last_seq, judge.last_end)
    evidence = {"stop_reason": raw, **{k: v for k, v in evidence.items() if v is not None}}
    if evidence.get("messages") == 1:
        del evidence["messages"]
    if raw is None:
        return Verdict(VerdictKind.UNKNOWN, f"{terminal} arrived without a stop reason", seq, offset, evidence)
    kind = table.get(raw, (VerdictKind.UNKNOWN,))[0]
    if kind is VerdictKind.UNKNOWN:
        return Verdict(kind, f"{terminal} after an unknown stop reason {raw!r}", seq, offset, evidence)
    words = {
        VerdictKind.COMPLETE: "the model finished",
        VerdictKind.STOPPED_BY_LIMIT: "the model was stopped by a limit",
        VerdictKind.FILTERED: "the output was stopped by a policy",
        VerdictKind.ERRORED: "the model failed",
    }[kind]
    return Verdict(kind, f"{words}: {terminal} after stop reason {raw}", seq, offset, evidence)


def decode_event_json(data: str | bytes, judge: Judge, seq: int, offset: int, what: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        judge.corrupt(f"{what} is not valid JSON ({exc})", seq, offset, data=str(data[:200]))
        return None
    if not isinstance(value, dict):
        judge.corrupt(f"{what} is JSON but not an object", seq, offset, data=str(data[:200]))
        return None
    return value
