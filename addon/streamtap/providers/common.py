"""Pieces every dialect assembler shares: findings, stop reasons, tool-call arguments.

A dialect module subclasses ``AssemblerBase`` and, per decoded event, calls:

- ``self.seen(event, name)`` first (counts the event, remembers where it was and what
  it was called, for reasons);
- ``self.payload(event, text)`` for SSE/event-stream JSON payloads (unparseable JSON is
  recorded as corrupt and ``None`` is returned);
- ``self.append(choice, kind, text, t, key=None)`` to grow a text/thinking/refusal block
  (a new block starts whenever the last block of the choice is a different one, so a
  tool call between two texts leaves two text blocks);
- ``self.tool_block(choice, key, ...)`` to open a tool call, then
  ``self.grow(block, "arguments_raw", fragment)`` for its argument fragments (``+=`` on the
  attribute would copy the whole string per fragment); ``flush_text()`` before reading
  a grown block's ``text`` or ``arguments_raw`` mid-stream;
- ``self.corrupt(reason, event)`` / ``self.errored(reason, event, error)`` for findings,
  ``self.terminal(event, stop_raw, normalized)`` when the provider's end signal arrives;
- and implements ``finish(end)`` as ``return self.judge(end, expected="...")``.

``judge`` applies the precedence every dialect shares: in-band error, then in-stream
corruption, then "no terminal signal" (truncated), then trouble found only at close
(tool arguments that do not parse, blocks never stopped), then the stop reason.
The session adds framing trouble, HTTP status and the sentinel on top.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamtap.wire import IncrementalJSON, WireEvent

from .turn import Block, BlockKind, Choice, Dialect, StreamEnd, Turn, Verdict, VerdictKind

MAX_CHOICES = 128  # a bound, so a hostile index cannot make a huge list
TEXT_BATCH = 64  # text fragments joined at a time while a block grows (bounds the objects held)
MAX_NOTES = 50  # notes kept per turn

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

END_WORDS = {
    StreamEnd.FINISHED: "the body ended cleanly",
    StreamEnd.UPSTREAM_RESET: "the upstream connection was reset or timed out",
    StreamEnd.CLIENT_ABORTED: "the client went away first (not the provider's fault)",
}


def worst_stop(normalized: list[str]) -> str:
    """The normalized stop reason that decides a multi-choice turn."""
    return max(normalized, key=lambda n: _SEVERITY.index(STOP_VERDICT.get(n, VerdictKind.UNKNOWN)))


def loads(text: str | bytes) -> Any:
    """JSON or raise ValueError (orjson's error is a ValueError)."""
    return orjson.loads(text)


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def finalize_arguments(block: Block) -> str | None:
    """Parse a closed tool call's ``arguments_raw`` once; return the parse error, if any.

    Empty arguments mean ``{}`` (providers send nothing for a tool with no parameters).
    """
    document = IncrementalJSON()
    document.feed(block.arguments_raw or "")
    try:
        block.arguments = document.value()
    except ValueError as exc:
        block.arguments = None
        block.arguments_error = str(exc).split("\n")[0]
        return block.arguments_error
    block.arguments_error = None
    return None


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


def as_dict(value: Any) -> dict[str, Any]:
    """The value if it is an object, else {}: providers (and faults) can put anything anywhere."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


class AssemblerBase:
    """State and verdict precedence shared by the dialect assemblers."""

    dialect: Dialect = Dialect.UNKNOWN
    wire: str = "sse"

    def __init__(self, wire: str | None = None) -> None:
        if wire:
            self.wire = wire
        self.turn = Turn(self.dialect)
        self._error: Verdict | None = None
        self._corrupt: Verdict | None = None
        self._stop: tuple[int, int, str | None, str] | None = None  # seq, offset, raw, normalized
        self._after_terminal = 0
        self.last_seq: int | None = None
        self.last_offset: int | None = None
        self.last_name: str | None = None  # what the last event was, for reasons
        self._keys: dict[tuple[int, Any], Block] = {}  # (choice, key) -> block
        # the block growing now (see grow) and its fragments not yet in it
        self._growing: Block | None = None
        self._growing_field = "text"
        self._pieces: list[str] = []
        self._joined: list[str] = []  # every TEXT_BATCH pieces, joined once

    # -- per-event bookkeeping ------------------------------------------------------
    def seen(self, event: WireEvent, name: str | None = None) -> None:
        self.turn.events += 1
        self.last_seq, self.last_offset = event.seq, event.start
        if name is not None:
            self.last_name = name
        if self._stop is not None and self._error is None:
            self._after_terminal += 1
            if self._after_terminal == 1:
                self.corrupt(
                    f"event after the terminal signal ({self._stop[2] or 'end'}): "
                    "a second response in one body, or a confused upstream",
                    event,
                )

    def payload(self, event: WireEvent, text: str | bytes) -> Any:
        try:
            return loads(text)
        except ValueError as exc:
            self.corrupt(f"event data is not JSON ({one_line(str(exc), 80)})", event)
            return None

    def content(self, t: float | None) -> None:
        if t is not None and self.turn.timing.first_content is None:
            self.turn.timing.first_content = t

    # -- findings ---------------------------------------------------------------------
    def corrupt(self, reason: str, event: WireEvent | None = None, **evidence: Any) -> None:
        if self._corrupt is None:
            self._corrupt = self._verdict(VerdictKind.CORRUPT, reason, event, evidence)

    def errored(self, reason: str, event: WireEvent | None, error: dict[str, Any] | None = None) -> None:
        if self._error is None:
            self._error = self._verdict(VerdictKind.ERRORED, reason, event, {})
            self.turn.error = error or {"source": "stream", "message": reason}
            self.turn.stop_reason = "error"

    def terminal(self, event: WireEvent, raw: str | None, normalized: str) -> None:
        if self._stop is None:
            self._stop = (event.seq, event.start, raw, normalized)
        if self._error is None:  # an in-band error stays the turn's stop reason
            self.turn.stop_reason = normalized
        self.turn.stop_reason_raw = raw

    def note(self, text: str) -> None:
        if text not in self.turn.notes and len(self.turn.notes) < MAX_NOTES:
            self.turn.notes.append(text)

    @property
    def terminal_seen(self) -> bool:
        return self._stop is not None

    def _verdict(self, kind: VerdictKind, reason: str, event: WireEvent | None, evidence: dict) -> Verdict:
        seq = event.seq if event is not None else self.last_seq
        offset = event.start if event is not None else self.last_offset
        return Verdict(kind, reason, seq, offset, dict(evidence))

    # -- blocks -----------------------------------------------------------------------
    def choice(self, index: int) -> Choice:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_CHOICES:
            self.note(f"choice index {str(index)[:20]} is not usable; counted as 0")
            index = 0
        choices = self.turn.choices
        while len(choices) <= index:
            choices.append(Choice(len(choices)))
        return choices[index]

    def new_block(self, choice: int, kind: BlockKind, key: Any = None, **fields: Any) -> Block:
        choice = self.choice(choice).index
        blocks = self.turn.choices[choice].blocks
        block = Block(kind, len(blocks), **fields)
        blocks.append(block)
        if key is not None:
            self._keys[(choice, _hashable(key))] = block
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
                    if block is self._growing and block.kind is kind and not block.closed and self._growing_field == "text":
                        pieces = self._pieces
                        pieces.append(text)
                        if len(pieces) >= TEXT_BATCH:
                            self._joined.append("".join(pieces))
                            pieces.clear()
                        if t is not None and self.turn.timing.first_content is None:
                            self.turn.timing.first_content = t
                        return block
        choice = self.choice(choice).index
        if key is not None:
            block = self.block(choice, key)
            if block is None:
                block = self.new_block(choice, kind, key)
        else:
            blocks = self.turn.choices[choice].blocks
            block = blocks[-1] if blocks and blocks[-1].kind is kind and not blocks[-1].closed else None
            if block is None:
                block = self.new_block(choice, kind)
        if text:
            self.grow(block, "text", text)
            self.content(t)
        return block

    def grow(self, block: Block, field: str, text: str) -> None:
        """Add ``text`` to a block's ``text`` or ``arguments_raw``, joined lazily: a str attribute
        grown with += is copied whole every time (quadratic in the answer's length)."""
        if block is not self._growing or field != self._growing_field:
            self.flush_text()
            self._growing, self._growing_field = block, field
        pieces = self._pieces
        pieces.append(text)
        if len(pieces) >= TEXT_BATCH:
            self._joined.append("".join(pieces))
            pieces.clear()

    def flush_text(self) -> None:
        """Write the fragments ``grow`` holds into their block.

        ``judge`` and ``close_blocks`` call it; a dialect that reads ``text`` or ``arguments_raw``
        of a block grown by ``append``/``grow`` before the end must call it first."""
        block = self._growing
        if block is None:
            return
        self._growing = None
        if self._joined:
            self._pieces[:0] = self._joined
            self._joined = []
        if self._pieces:
            field = self._growing_field
            setattr(block, field, (getattr(block, field) or "") + "".join(self._pieces))
            self._pieces = []

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
                        finalize_arguments(block)
                block.closed = True

    def judge(self, end: StreamEnd, expected: str) -> tuple[Turn, Verdict]:
        """The verdict from the events alone. ``expected`` names the missing terminal signal."""
        self.flush_text()
        if self._error is not None:
            return self.turn, self._error
        if self._corrupt is not None:
            return self.turn, self._corrupt
        if self._stop is None:
            reason = f"no terminal signal ({expected}): {END_WORDS[end]}"
            if self.last_name:
                reason += f"; last event {self.last_name} (seq {self.last_seq})"
            return self.turn, Verdict(
                VerdictKind.TRUNCATED, reason, self.last_seq, self.last_offset, {"end": end.value}
            )
        seq, offset, raw, normalized = self._stop
        kind = STOP_VERDICT.get(normalized, VerdictKind.UNKNOWN)
        evidence: dict[str, Any] = {"end": end.value}
        for choice in self.turn.choices:
            for block in choice.blocks:
                if block.kind is BlockKind.TOOL_CALL and block.arguments_error:
                    if kind is not VerdictKind.COMPLETE:  # a limit or a filter may cut a call short
                        evidence.setdefault("cut_tool_calls", []).append([choice.index, block.index])
                        continue
                    return self.turn, Verdict(
                        VerdictKind.CORRUPT,
                        f"tool call {block.name or block.id or block.index} has invalid argument JSON "
                        f"({one_line(block.arguments_error, 80)})",
                        seq,
                        offset,
                        {"choice": choice.index, "block": block.index},
                    )
        words = {
            VerdictKind.COMPLETE: "the model finished",
            VerdictKind.STOPPED_BY_LIMIT: "the model was stopped by a limit",
            VerdictKind.FILTERED: "the output was filtered or refused",
            VerdictKind.ERRORED: "the provider reported a failed generation",
            VerdictKind.UNKNOWN: "the provider gave a stop reason streamtap does not know",
        }[kind]
        return self.turn, Verdict(kind, f"{words} (stop reason {raw!s})", seq, offset, evidence)
