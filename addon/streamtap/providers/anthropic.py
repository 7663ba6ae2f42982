"""Anthropic Messages streaming: SSE events into a Turn and a Verdict.

The event logic (``MessageBuilder``) works on decoded event objects, so Bedrock's
InvokeModelWithResponseStream reuses it on the base64 ``chunk`` payloads.

Choices this module makes where the provider is silent:
- ``pause_turn`` is ``stopped_by_limit``: the server paused a long server-tool turn and
  the caller has to resend to continue, so the turn is not finished, and nothing failed.
  It pauses between blocks, cutting none: a block left open or tool JSON that does not
  parse is corrupt after it, as after ``end_turn``.
- A block left open at ``message_stop`` is corrupt, except after ``max_tokens`` /
  ``model_context_window_exceeded``: a real capture shows the provider leaving the
  cut tool block open there, so the turn is ``stopped_by_limit`` and the open block
  keeps its raw arguments unparsed. Only the last block started can be the cut one: an
  open block with a later one started after it lost its ``content_block_stop``, corrupt.
- Several messages back to back (``message_start`` again after ``message_stop``, as in
  multi-step test recordings) are assembled into one turn: blocks are appended in
  order (``extra["message"]`` numbers the second and later messages from 1), model/id/usage/stop reason come
  from the last message, and an earlier message that did not end cleanly decides the
  verdict; the last message's stop reason ``tool_use`` needs a tool call in that message.
  A ``message_start`` while a message is still open is a splice: corrupt.
  The same ``message_start`` repeated before any content is tolerated and noted.
  A message after ``message_stop`` with the id of an earlier message in the body is that
  response again (replayed whole after a cut that fell just after ``message_stop``), not a
  next step, whose id is always new: corrupt.
- Thinking and answer text are routed by their block type only. Server tool uses and
  their ``*_tool_result`` blocks are ``server_tool`` (the result kept whole in ``extra``);
  block types this version does not know are ``other``, kept whole, their deltas' text
  joined into ``text``.
- An ``error`` event makes the turn ``errored`` whatever follows it; so does an SSE event
  named ``error`` whatever its data holds (another JSON type, or no JSON at all), since the
  SDK raises on the event name. The SDK skips an event named ``ping`` before reading its data:
  one carrying an event of the message is corrupt (the app lost it), and so is one whose data
  lines hold one (a blank line lost ran a message event into the ping); any other data is a ping.
- A UTF-8 BOM at byte 0, which the SSE rules drop, the SDK keeps: the stream's first line is then
  a field it ignores, so where that line is the first event's ``event`` or ``data`` line the app
  loses that event (message_start): corrupt.
- Closed units (``Judge.reopened``): ``content_block_stop`` closes its block (a block that
  arrived whole in ``message_start`` is closed there), a ``message_delta`` with a stop
  reason the message's content (no block starts or grows after it) and ``message_stop``
  the message; any event for a closed block, or inside a
  stopped message before the next ``message_start``, is corrupt, naming both events.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from streamtap.wire import SSEEvent, WireEvent
from streamtap.wire.partial_json import exact_loads

from .common import as_int, as_str, dumps, first_line_lost_to_bom
from .fastpath import ANTHROPIC, ContentDeltas
from .judge import (MAX_NOTES, THINKING_AFTER_SIGNATURE, Fragments, Judge, Pieces, as_text, decode_event_json, earlier_outcome,
                    error_text, holds_tool_call, sdk_loads, stop_verdict)
from .turn import Block, BlockKind, Dialect, StreamEnd, Turn, Usage, Verdict, VerdictKind

# raw stop_reason -> (verdict, normalized stop reason)
STOP_REASONS: dict[str, tuple[VerdictKind, str]] = {
    "end_turn": (VerdictKind.COMPLETE, "end_turn"),
    "stop_sequence": (VerdictKind.COMPLETE, "stop_sequence"),
    "tool_use": (VerdictKind.COMPLETE, "tool_use"),
    "max_tokens": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
    "model_context_window_exceeded": (VerdictKind.STOPPED_BY_LIMIT, "context_window"),
    "pause_turn": (VerdictKind.STOPPED_BY_LIMIT, "paused"),
    "refusal": (VerdictKind.FILTERED, "refusal"),
}
# the stop reasons that cut the block being generated (a real capture leaves it open); pause_turn,
# a limit too, pauses between blocks: the caller resends the content as it is to continue
CUTTING_STOP_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})



def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _block_from(content_block: dict[str, Any], index: int) -> Block:
    kind = content_block.get("type")
    if kind == "text":
        citations = content_block.get("citations")
        return Block(BlockKind.TEXT, index, text=_text(content_block.get("text")),
                     citations=list(citations) if isinstance(citations, list) else [])
    if kind == "thinking":
        return Block(BlockKind.THINKING, index, text=_text(content_block.get("thinking")),
                     signature=content_block.get("signature"))
    if kind == "redacted_thinking":
        return Block(BlockKind.REDACTED_THINKING, index, data=content_block.get("data"))
    if kind == "tool_use":
        extra = {k: v for k, v in content_block.items() if k not in ("type", "id", "name", "input")}
        extra["start_input"] = content_block.get("input")
        return Block(BlockKind.TOOL_CALL, index, id=content_block.get("id"), name=content_block.get("name"),
                     arguments_raw="", extra=extra)
    if kind in ("server_tool_use", "mcp_tool_use"):
        extra = {k: v for k, v in content_block.items() if k not in ("id", "name", "input")}
        extra["start_input"] = content_block.get("input")
        return Block(BlockKind.SERVER_TOOL, index, id=content_block.get("id"), name=content_block.get("name"),
                     arguments_raw="", extra=extra)
    if isinstance(kind, str) and kind.endswith("_tool_result"):
        return Block(BlockKind.SERVER_TOOL, index, id=content_block.get("tool_use_id"), extra=dict(content_block))
    return Block(BlockKind.OTHER, index, extra=dict(content_block))


def _block_index(event: dict[str, Any]) -> Any:
    """A block event's ``index`` as the anthropic SDK hands it on: it builds each event leniently
    (``construct_type``) and reads ``"0"``, ``" 0"``, ``0.0`` or ``true`` as a whole number, which
    its stream helper then looks the block up by. Asked of the SDK itself, as a copy of its rules
    would drift; only for an index sent as no int, which no Anthropic stream does."""
    index = event.get("index")
    if type(index) is int:
        return index
    from anthropic._models import construct_type
    from anthropic.types import RawMessageStreamEvent

    try:
        return getattr(construct_type(type_=RawMessageStreamEvent, value=event), "index", index)
    except Exception:  # not an event it builds: read as sent
        return index


def _has_event_name(raw: bytes) -> bool:
    """Does the event's own block name it in an ``event:`` line? The decoder names "message" an
    event without the line, one with an empty ``event:`` (both skipped by the SDK, which reads an
    empty name as none) and one with ``event: message`` (which the SDK reads)."""
    own = _BLANK_LINE.split(raw.rstrip(b"\r\n"))[-1]  # the span's last block: the event's own
    named = False
    for line in own.splitlines():
        if line.startswith(b"event:"):  # the last one counts
            named = bool(line[7:] if line[6:7] == b" " else line[6:])
    return named


_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n){2}")

# block kinds whose arguments stream as input_json_delta fragments
_TOOLISH = (BlockKind.TOOL_CALL, BlockKind.SERVER_TOOL)

# message ids remembered per body to spot a response sent again; multi-step recordings hold
# tens of messages, so a few hundred bounds the memory without missing a real replay
MAX_MESSAGE_IDS = 256
# the fields of a delta this version does not model that are an 'other' block's text; the rest
# (a compaction's encrypted_content) is kept beside it
OTHER_TEXT_FIELDS = ("content", "text")
MAX_DELTA_FIELDS = 64  # fields of unmodelled deltas a block keeps apart; more are counted (each costs objects, not text)
# the usage fields the SDK models (Usage, MessageDeltaUsage), Bedrock's metrics and the iterations real captures
# hold: always kept; other names only up to judge.MAX_USAGE_FIELDS (``Judge.usage``)
USAGE_FIELDS = frozenset({
    "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation",
    "inference_geo", "output_tokens_details", "server_tool_use", "service_tier", "speed", "iterations",
    "amazon-bedrock-invocationMetrics"})


class MessageBuilder:
    """Anthropic Messages event logic on decoded event objects (dicts)."""

    def __init__(self, turn: Turn, judge: Judge, one_response: bool = False) -> None:
        self.turn = turn
        self.judge = judge
        # the body answers one call (Bedrock's InvokeModel): a message after message_stop is stitched on
        self.one_response = one_response
        self.messages = 0  # message_start seen (not counting a tolerated duplicate)
        self.open_message = False
        self.stopped = False  # message_stop seen for the current message
        self.message_start: dict[str, Any] | None = None
        self.blocks: dict[int, Block] = {}  # provider index -> block, current message only
        self.open_blocks: set[int] = set()
        self.fragments: dict[int, Fragments] = {}  # index -> a tool block's argument fragments
        self.saw_delta = False  # any message_delta for the current message
        self.content_stopped = False  # a message_delta gave the stop reason: the content is closed
        # the first earlier message that did not end cleanly (its raw stop reason, where the next began,
        # whether it held a tool call): the only one earlier_outcome() reports, so a body of any number
        # of messages keeps one entry
        self.outcomes: list[tuple[str | None, int | None, int | None, bool]] = []
        self.noted_deltas: set[Any] = set()
        self.delta_fields: dict[Any, set[str]] = {}  # block index -> the fields of unmodelled deltas it keeps
        self.pieces = Pieces(self.judge)
        self.message_ids: dict[str, tuple[int | None, int | None]] = {}  # id -> (seq, offset) of its message_start

    # -- events ---------------------------------------------------------------------------------
    def apply(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        kind = event.get("type")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            if not self.ended(f"event type {kind!r}", seq, offset):
                self.judge.note(f"unknown event type {kind!r} at seq {seq}")
            return
        handler(self, event, seq, offset, t)

    def ended(self, what: str, seq: int | None, offset: int | None) -> bool:
        """True (and the stream is corrupt) when ``what``, an event the builder does not use, came
        after message_stop and before any next message_start."""
        return self.judge.reopened("the message", what, seq, offset)

    def _message_start(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        message = event.get("message")
        if not isinstance(message, dict):
            self.judge.corrupt("message_start without a message object", seq, offset)
            return
        if self.open_message:
            if not self.blocks and not self.saw_delta and message == self.message_start:
                self.judge.note(f"message_start repeated unchanged at seq {seq}: ignored")
                return
            self.judge.corrupt(
                "a second message_start arrived while the message was still open (spliced stream)",
                seq, offset, first_id=self.turn.response_id, second_id=message.get("id"),
                open_blocks=sorted(self.open_blocks))
            return
        message_id = message.get("id")
        if self.stopped:
            if self.one_response:
                self.judge.corrupt(
                    f"a second message ({message.get('id')}) starts at seq {seq} after message_stop: one call "
                    "answers once, so a second answer was stitched on", seq, offset,
                    first_id=self.turn.response_id, second_id=message.get("id"))
                return
            first = self.message_ids.get(message_id) if isinstance(message_id, str) else None
            if first is not None:
                self.judge.corrupt(
                    f"message {message_id} starts again at seq {seq} (byte {offset}) after message_stop; it first "
                    f"started at seq {first[0]} (byte {first[1]}): the same response twice in one body (replayed "
                    "after a cut and stitched on), not a next step, whose id would be new", seq, offset,
                    message_id=message_id, first_seq=first[0], first_offset=first[1])
                return
            self._remember_outcome(seq, offset)
            self.judge.note(f"message {self.messages + 1} ({message.get('id')}) starts at seq {seq} after "
                            "message_stop: several responses back to back")
        if isinstance(message_id, str) and len(self.message_ids) < MAX_MESSAGE_IDS:
            self.message_ids.setdefault(message_id, (seq, offset))
        self.judge.forget("block ")
        self.judge.forget("the message")
        self.content_stopped = False
        self.messages += 1
        self.open_message = True
        self.stopped = False
        self.saw_delta = False
        self.message_start = message
        self.blocks = {}
        self.delta_fields = {}
        self.open_blocks = set()
        self.fragments = {}
        turn = self.turn
        # a value other than a string is no name: shown and counted, it would break the log line
        turn.model = as_str(message.get("model")) or turn.model
        turn.response_id = as_str(message.get("id")) or turn.response_id
        self.judge.stop_reason(None, None)
        turn.usage = Usage()
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        prefilled = message.get("content")
        prefilled = prefilled if isinstance(prefilled, list) else []
        for i, content_block in enumerate(prefilled):
            if isinstance(content_block, dict):
                block = self._add_block(i, content_block)
                self._close(block, i, seq, offset, prefilled=True)
                # whole already: a later start, delta or stop for it contradicts message_start
                self.judge.close(f"block {i}", "message_start (content arrived whole)", seq, offset)
        raw = as_text(message.get("stop_reason"))
        if raw is not None:
            self.judge.stop_reason(raw, STOP_REASONS.get(raw, (None, raw))[1])

    def _remember_outcome(self, seq: int | None, offset: int | None) -> None:
        """The message just stopped is followed by another (starting at ``seq``): keep its stop reason
        when it is the first that did not finish as it says."""
        outcome = (self.turn.stop_reason_raw, seq, offset, holds_tool_call(self.turn.choices[0], self.messages))
        if not self.outcomes and earlier_outcome([outcome], STOP_REASONS, "stop_reason", self.messages) is not None:
            self.outcomes.append(outcome)

    def _add_block(self, index: int, content_block: dict[str, Any]) -> Block:
        blocks = self.turn.choices[0].blocks
        block = _block_from(content_block, len(blocks))
        if self.messages > 1:
            block.extra["message"] = self.messages - 1
        blocks.append(block)
        self.blocks[index] = block
        if block.kind in _TOOLISH and block.arguments_raw is not None:
            self.fragments[index] = Fragments(self.judge, block, "arguments_raw")
        return block

    def _content_block_start(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        index = _block_index(event)
        content_block = event.get("content_block")
        if not self._in_message("content_block_start", seq, offset) or \
                self.judge.reopened("the message's content", "content_block_start", seq, offset):
            return
        if as_int(index) is None or not isinstance(content_block, dict):
            self.judge.corrupt("content_block_start without an index or content_block", seq, offset)
            return
        if self.judge.reopened(f"block {index}", "content_block_start", seq, offset, index=index):
            return
        if index in self.blocks:
            self.judge.corrupt(f"content_block_start for index {index}, which already started", seq, offset,
                               index=index)
            return
        if index != len(self.blocks):
            self.judge.corrupt(f"content_block_start for index {index} while {len(self.blocks)} blocks exist",
                               seq, offset, index=index)
            return
        # shapes the SDK's stream helper fails on: it appends each block to message_start's content and
        # adds each text or thinking delta to the string the block started with
        if not isinstance((self.message_start or {}).get("content"), list):
            self.judge.corrupt(f"content_block_start for index {index} in a message whose message_start has no "
                               "content list: the SDK's stream helper appends each block to it and raises", seq, offset,
                               index=index)
        kind = content_block.get("type")
        if kind == "tool_use" and (missing := [key for key in ("name", "id")
                                               if not (isinstance(content_block.get(key), str) and content_block[key])]):
            self.judge.corrupt(f"tool_use content_block_start for index {index} without its {' or '.join(missing)}: the "
                               "app cannot run a call that names no tool, nor answer one it cannot name in its "
                               "tool_result", seq, offset, index=index)
        if kind in ("text", "thinking") and not isinstance(content_block.get(kind), str):
            self.judge.corrupt(f"{kind} content_block_start for index {index} without its '{kind}' string: the "
                               f"SDK's stream helper adds each delta to it and raises, and the app's block lacks it",
                               seq, offset, index=index)
        block = self._add_block(index, content_block)
        self.open_blocks.add(index)
        if block.kind is BlockKind.OTHER:
            self.judge.note(f"block type {content_block.get('type')!r} kept as 'other' (index {index})")
        # first content: text or thinking, or a tool call as it opens (its input may be empty), as
        # every dialect counts it
        if (block.text or index in self.fragments) and self.turn.timing.first_content is None:
            self.turn.timing.first_content = t

    def _content_block_delta(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self.open_message:
            self._in_message("content_block_delta", seq, offset)
            return
        if self.content_stopped and self.judge.reopened("the message's content", "content_block_delta", seq, offset):
            return
        index = _block_index(event)
        block = self.blocks.get(index) if as_int(index) is not None else None
        if block is None:
            self.judge.corrupt(f"content_block_delta for unknown index {index}", seq, offset, index=index)
            return
        if index not in self.open_blocks and \
                self.judge.reopened(f"block {index}", "content_block_delta", seq, offset, index=index):
            return
        delta = event.get("delta")
        if not isinstance(delta, dict):
            self.judge.corrupt("content_block_delta without a delta object", seq, offset, index=index)
            return
        kind = delta.get("type")
        value: Any
        if kind == "text_delta" and block.kind is BlockKind.TEXT:
            value = delta.get("text")
            if isinstance(value, str):
                self.pieces.content(block, value, t)
                return
        elif kind == "input_json_delta" and index in self.fragments:  # a tool's use, not its result
            value = delta.get("partial_json")
            if isinstance(value, str):
                self.fragments[index].append(value)  # type: ignore[index]  # first content: counted at its start
                return
        elif kind == "thinking_delta" and block.kind is BlockKind.THINKING:
            value = delta.get("thinking")
            if isinstance(value, str):
                if block.signature and value:
                    self.judge.corrupt(THINKING_AFTER_SIGNATURE.format(index=index, delta="thinking_delta"), seq, offset,
                                       index=index)
                    return
                self.pieces.content(block, value, t)
                return
        elif kind == "signature_delta" and block.kind is BlockKind.THINKING:
            value = delta.get("signature")
            if isinstance(value, str):
                block.signature = value  # replaces: the signature arrives whole
                return
        elif kind == "citations_delta" and block.kind is BlockKind.TEXT:
            self.judge.listed(block, "citations", delta.get("citation"))
            return
        elif kind not in ("text_delta", "input_json_delta", "thinking_delta", "signature_delta", "citations_delta"):
            # a delta this version does not model: keep its string payload, its content or text as
            # the text of an 'other' block (a compaction summary, say), every other field (the
            # summary's encrypted_content) beside the block's own content, as the SDK keeps them apart
            kept = set()
            fields = self.delta_fields.setdefault(index, set())
            for key, value in delta.items():
                if key != "type" and isinstance(value, str):
                    field = "text" if block.kind is BlockKind.OTHER and key in OTHER_TEXT_FIELDS else f"extra.{key}"
                    if field not in fields and len(fields) >= MAX_DELTA_FIELDS:
                        block.extra["delta_fields_dropped"] = block.extra.get("delta_fields_dropped", 0) + 1
                        continue
                    fields.add(field)
                    self.pieces.add(block, value, field)
                    kept.add(field)
            if repr(kind) not in self.noted_deltas and len(self.noted_deltas) < MAX_NOTES:  # (notes stop there)
                self.noted_deltas.add(repr(kind))
                where = ", ".join(sorted(kept)) or "nothing (no string field)"
                self.judge.note(f"delta type {kind!r} not modelled: kept as the block's {where} (index {index})")
            return
        self.judge.corrupt(f"{kind} does not fit a {block.kind.value} block (index {index})", seq, offset,
                           index=index, delta_type=kind, block_kind=block.kind.value)

    def _content_block_stop(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message("content_block_stop", seq, offset):
            return
        index = _block_index(event)
        block = self.blocks.get(index) if as_int(index) is not None else None
        if self.judge.reopened(f"block {index}", "content_block_stop", seq, offset, index=index):
            return
        if block is None or index not in self.open_blocks:
            self.judge.corrupt(f"content_block_stop for unknown index ({index})", seq, offset, index=index)
            return
        self.open_blocks.discard(index)  # type: ignore[arg-type]
        self.judge.close(f"block {index}", "content_block_stop", seq, offset)
        self._close(block, index, seq, offset)  # type: ignore[arg-type]

    def _close(self, block: Block, index: int, seq: int | None, offset: int | None, prefilled: bool = False) -> None:
        block.closed = True
        self.pieces.flush(block)
        if block.kind is BlockKind.THINKING and block.text and not block.signature:
            # the API refuses a thinking block sent back without its signature (in a tool-use loop)
            self.judge.note(f"thinking block {index} closed without a signature: the API refuses it when the app "
                            "sends it back (a signature_delta lost, or a server that sends none)")
        if block.kind not in _TOOLISH or block.arguments_raw is None:
            return
        start_input = block.extra.pop("start_input", None)
        fragments = self.fragments.pop(index, None)
        if prefilled:  # arrived whole inside message_start: no fragments to join
            block.arguments = start_input if start_input is not None else {}
            try:
                block.arguments_raw = dumps(block.arguments)
            except TypeError:  # text orjson cannot write (a lone surrogate)
                block.arguments_raw = None
            return
        self.judge.close_arguments(block, fragments.joined() if fragments else "", start_input, seq, offset)

    def _message_delta(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message("message_delta", seq, offset):
            return
        self.saw_delta = True
        delta = event.get("delta")
        if isinstance(delta, dict):
            raw = as_text(delta.get("stop_reason"))
            # message_delta may come more than once (cumulative usage), but a stop reason is given once
            earlier = self.turn.stop_reason_raw
            if raw is not None and earlier not in (None, raw):
                what = f"message_delta (stop_reason {raw})"
                if not self.judge.reopened("the message's content", what, seq, offset):
                    self.judge.corrupt(f"{what} contradicts message_start's stop_reason {earlier}", seq, offset,
                                       stop_reasons=[earlier, raw])
                return
            if raw is None and earlier is not None:  # given by message_start or an earlier message_delta
                # the SDK copies every message_delta's stop_reason, an absent one as None: its message ends with none
                given = "null" if "stop_reason" in delta else "absent"
                self.judge.corrupt(f"message_delta with stop_reason {given} after stop_reason {earlier}: the SDK's "
                                   f"message ends with no stop reason", seq, offset, stop_reasons=[earlier, None])
                return
            if raw is not None:
                self.judge.stop_reason(raw, STOP_REASONS.get(raw, (None, raw))[1])
                # the stop reason ends the message's content: no block may start or grow after it
                self.content_stopped = True
                self.judge.close("the message's content", f"message_delta (stop_reason {raw})", seq, offset)
            for key in ("stop_sequence", "stop_details", "container"):
                if delta.get(key) is not None:
                    self.turn.extra[key] = delta[key]
        usage = event.get("usage")
        if isinstance(usage, dict):
            if not isinstance((self.message_start or {}).get("usage"), dict):
                # the SDK's stream helper copies this usage onto message_start's, and there is none
                self.judge.corrupt("message_delta's usage, after a message_start without usage: the SDK's stream "
                                   "helper copies it onto message_start's and raises", seq, offset)
            self._usage(usage)
            if usage.get("output_tokens") is None:
                # the SDK copies message_delta's output_tokens whatever it is (the other counts only when
                # given): a null or missing one leaves its message no output count
                self.turn.usage.output = None
        else:  # a required field the SDK reads without a check: it raises on this event
            self.judge.corrupt("message_delta without usage", seq, offset)

    def _message_stop(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message("message_stop", seq, offset):
            return
        self.open_message = False
        self.stopped = True
        self.judge.terminal_at = (seq, offset)
        self.judge.close("the message", "message_stop", seq, offset)
        metrics = event.get("amazon-bedrock-invocationMetrics")
        if isinstance(metrics, dict) and self.judge.usage({"amazon-bedrock-invocationMetrics": metrics}, USAGE_FIELDS):
            self._one_invocation(metrics, seq, offset)
        if self.open_blocks:
            raw = self.turn.stop_reason_raw
            open_indexes = sorted(self.open_blocks)
            if raw not in CUTTING_STOP_REASONS:
                self.judge.corrupt(f"message_stop with block(s) {open_indexes} started but never stopped",
                                   seq, offset, open_blocks=open_indexes)
                return
            index = self.judge.block_cut_by_limit(open_indexes, self.blocks, raw, "content_block_stop", seq, offset)
            if index is None:
                return
            block = self.blocks[index]
            if block.kind in _TOOLISH:
                fragments = self.fragments.get(index)
                block.arguments_raw = fragments.joined() if fragments else ""
                block.extra.pop("start_input", None)
                block.arguments_error = f"block never closed: the turn was cut by {raw}"
            self.judge.note(f"block {index} left open by {raw}")

    def _keep_open_arguments(self) -> None:
        """The arguments a tool block still open got before the stream stopped, as they came (not
        parsed: they are cut), so the turn, show and the recording hold them."""
        for index in sorted(self.open_blocks):
            block, fragments = self.blocks.get(index), self.fragments.get(index)
            if block is None or fragments is None or block.arguments_error is not None:
                continue
            block.arguments_raw = fragments.joined()
            block.extra.pop("start_input", None)
            block.arguments_error = "block never closed: the stream stopped inside it"

    def _ping(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if self.stopped and not self.open_message:  # keep-alive for a message already stopped
            self.judge.reopened("the message", "ping", seq, offset)

    def _error(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        error = event.get("error")
        error = error if isinstance(error, dict) else {}
        self.judge.errored({"source": "stream", "type": error.get("type"), "code": None,
                            "message": error.get("message")}, seq, offset)

    def _in_message(self, what: str, seq: int | None, offset: int | None) -> bool:
        if self.open_message:
            return True
        if not self.judge.reopened("the message", what, seq, offset):
            self.judge.corrupt(f"{what} before message_start", seq, offset)
        return False

    def _one_invocation(self, metrics: dict[str, Any], seq: int | None, offset: int | None) -> None:
        """Bedrock counts the invocation's input tokens on its last chunk, the model counted them in
        message_start, first. Two counts that differ (cached tokens counted in or not) may come from
        two invocations whose chunks were joined, but examples published for Bedrock pair counts that
        differ in one answer: a note, not a verdict. Output counts differ in real answers."""
        usage = (self.message_start or {}).get("usage")
        if not isinstance(usage, dict):
            return
        counted, started = as_int(metrics.get("inputTokenCount")), as_int(usage.get("input_tokens"))
        if counted is None or started is None:
            return
        cached = sum(as_int(usage.get(key)) or 0 for key in ("cache_read_input_tokens", "cache_creation_input_tokens"))
        if counted not in (started, started + cached):
            self.judge.note(f"Bedrock's invocation metrics at seq {seq} count {counted} input tokens, message_start "
                            f"{started}: if not a quirk of the provider, the chunks come from two invocations")

    def _usage(self, usage: dict[str, Any]) -> None:
        """Cumulative counts: overwrite the ones present, never sum (each message_delta may name new
        fields, so the turn keeps them within bounds: ``Judge.usage``)."""
        usage = self.judge.usage(usage, USAGE_FIELDS)
        target = self.turn.usage
        if usage.get("input_tokens") is not None:
            target.input = usage["input_tokens"]
        if usage.get("output_tokens") is not None:
            target.output = usage["output_tokens"]
        if usage.get("cache_read_input_tokens") is not None:
            target.cache_read = usage["cache_read_input_tokens"]
        if usage.get("cache_creation_input_tokens") is not None:
            target.cache_write = usage["cache_creation_input_tokens"]

    _handlers = {
        "message_start": _message_start,
        "content_block_start": _content_block_start,
        "content_block_delta": _content_block_delta,
        "content_block_stop": _content_block_stop,
        "message_delta": _message_delta,
        "message_stop": _message_stop,
        "ping": _ping,
        "error": _error,
    }

    # -- verdict --------------------------------------------------------------------------------
    def verdict(self, end: StreamEnd) -> Verdict:
        self.pieces.flush()
        self._keep_open_arguments()
        judge = self.judge
        early = judge.early_verdict()
        if early is not None:
            return early
        if self.messages == 0:
            return judge.truncated("no message_start arrived", end)
        if not self.stopped:
            open_blocks = sorted(self.open_blocks)
            if self.saw_delta:
                return judge.truncated("message_delta arrived but message_stop did not", end,
                                       open_blocks=open_blocks)
            return judge.truncated("the stream ended before message_stop", end, open_blocks=open_blocks)
        earlier = earlier_outcome(self.outcomes, STOP_REASONS, "stop_reason", self.messages)
        if earlier is not None:
            return earlier
        if self.turn.stop_reason_raw in ("end_turn", "stop_sequence"):
            self._doubt_unpaired_server_tools()
        return stop_verdict(self.turn, judge, "message_stop", STOP_REASONS, messages=self.messages)

    def _doubt_unpaired_server_tools(self) -> None:
        """A server tool's result follows its use before the model goes on; only a message that
        pauses (pause_turn) or stops for a client tool may leave a use open, its result then coming
        in a later response (programmatic tool calling). Under a stop of the model's own, a use
        without its result in the body says a block was lost: unknown, as no capture shows a server
        doing otherwise. (A result whose use the body lacks proves nothing: the use may have come in
        the response before.)"""
        blocks = [block for block in self.turn.choices[0].blocks if block.kind is BlockKind.SERVER_TOOL]
        answered = {block.id for block in blocks if _is_result(block)}
        unanswered = next((block for block in blocks if not _is_result(block) and block.id not in answered), None)
        if unanswered is not None:
            self.judge.doubt(f"server tool use {unanswered.id} ({unanswered.name}, block {unanswered.index}) has no "
                             f"result, and the message ended with {self.turn.stop_reason_raw}: a server tool's result "
                             "follows its use before the model goes on, so a block may have been lost", None, None)


def _is_result(block: Block) -> bool:
    """A server tool's result block (``web_search_tool_result``, ``mcp_tool_result``), not its use."""
    return str(block.extra.get("type", "")).endswith("_tool_result")


# the events that build the message: one the SDK skips by its name (ping, or none) is lost to the app
SKIPPED_CONTENT = frozenset(MessageBuilder._handlers) - {"ping", "error"}


# the fields of an event the SDK reads (it names the event, then parses its data)
_SDK_FIELDS = frozenset({b"event", b"data"})


def _skipped_by(name: str) -> str:
    return "without a name" if name == "message" else "named ping"


def _merged_content(data: str) -> str | None:
    """The type of an event of the message among ``data``'s lines, data that is no one JSON value:
    events whose blank line was lost run together into one, each event's data a line of it."""
    for line in data.split("\n"):
        try:
            obj = sdk_loads(line)
        except orjson.JSONDecodeError:
            continue
        kind = as_text(obj.get("type")) if type(obj) is dict else None
        if kind in SKIPPED_CONTENT:
            return kind
    return None


class Assembler:
    """Anthropic Messages over SSE: ``event: <type>`` + ``data: <json>``."""

    dialect = Dialect.ANTHROPIC
    wire = "sse"
    sdk_dispatches_empty_events = True  # see AssemblerBase

    def __init__(self, one_response: bool = False) -> None:
        self.turn = Turn(Dialect.ANTHROPIC)
        self.judge = Judge(self.turn)
        self.builder = MessageBuilder(self.turn, self.judge, one_response=one_response)
        self.renamed: set[tuple[str, Any]] = set()  # (event name, type) pairs already noted
        # text, tool-argument and thinking deltas without a JSON parse, by delta type
        self._deltas = {delta_type: ContentDeltas(shape) for delta_type, shape in ANTHROPIC.items()}

    def feed(self, event: WireEvent, t: float | None) -> None:
        judge = self.judge
        if not isinstance(event, SSEEvent):
            # a body of another framing (a Bedrock frame, a JSON line): dropped, its events would leave
            # a whole body judged cut before its message_start
            judge.seen(event, type(event).__name__)
            judge.corrupt(f"unexpected {type(event).__name__} in an SSE dialect: Anthropic Messages streams SSE only",
                          event.seq, event.start)
            return
        judge.seen(event, event.event)
        # (a BOM that costs the SDK an event can only stand before the first, parsed: no layout is learnt yet)
        delta = event.event == "content_block_delta"
        if delta and self._delta(event.data, t):
            return
        try:
            # a tool_use block may come with its input whole: its integers are read exactly
            obj = (exact_loads(event.data) if '"input"' in event.data else orjson.loads(event.data)) if event.data else None
        except orjson.JSONDecodeError:
            try:  # what the SDK's json module still reads (NaN, a lone surrogate escape)
                obj = sdk_loads(event.data, '"input"' in event.data, judge)
            except orjson.JSONDecodeError:
                obj = None
        if event.event == "error" and (type(obj) is not dict or obj.get("type") != "error"):
            # the SDK raises on the event name, whatever the data holds (provider-streams.md §3.4)
            self._error_event(obj, event)
            return
        if not event.data:
            if not self.builder.ended(f"event {event.event!r} without data", event.seq, event.start):
                judge.note(f"event {event.event!r} without data at seq {event.seq}")
            return
        name = event.event
        kind = as_text(obj.get("type")) if type(obj) is dict else None
        unnamed = name == "message" and not _has_event_name(event.raw)
        if (name == "ping" or unnamed) and obj is None and "\n" in event.data:
            merged = _merged_content(event.data)
            if merged is not None:
                judge.corrupt(f"{merged} merged into event {name!r} at seq {event.seq} (the blank line between two "
                              f"events lost): the SDK skips events {_skipped_by(name)}, so the app never sees it",
                              event.seq, event.start)
                return
        if (name == "ping" or unnamed) and kind not in SKIPPED_CONTENT and kind != "error":
            # the SDK skips an event named ping, or without a name, before it reads the data ({}, null,
            # keep-alive text): it loses the app nothing, as a ping
            self.builder.apply({"type": "ping"}, event.seq, event.start, t)
            return
        if type(obj) is not dict:  # the error path says why
            decode_event_json(event.data, judge, event.seq, event.start, f"{event.event} event data")
            return
        if (name == "ping" or unnamed) and kind != "error":
            # content the message is built of, sent without an event line (decoded as "message") or as
            # "ping": the SDK skips the event, whatever its data (a typed error is still the provider's
            # word that it failed: judged errored below)
            judge.corrupt(f"{kind} sent as event {name!r} at seq {event.seq}: the SDK skips "
                          f"events {_skipped_by(name)}, so the app never sees it", event.seq, event.start)
            return
        lost = first_line_lost_to_bom(event, _SDK_FIELDS)
        if lost is not None:
            judge.corrupt(f"a UTF-8 BOM at byte 0: the SSE rules drop it, but the anthropic SDK keeps it, so the "
                          f"stream's first line, the {lost} line of {kind}, is a field it ignores: the app never "
                          f"gets that event", event.seq, event.start)
        if name != obj.get("type"):
            pair = (name, repr(obj.get("type")))
            if pair not in self.renamed and len(self.renamed) < MAX_NOTES:  # the JSON type decides; said once per pair
                self.renamed.add(pair)
                judge.note(f"event name {name!r} differs from its type {obj.get('type')!r} (first at seq {event.seq})")
        self.builder.apply(obj, event.seq, event.start, t)
        if delta:
            # a layout fixes the JSON, not the state: ``_delta`` checks the state each time
            delta_type = obj["delta"].get("type") if type(obj.get("delta")) is dict else None
            deltas = self._deltas.get(delta_type) if type(delta_type) is str else None
            if deltas is not None:
                deltas.learn(event.data, obj)

    def _delta(self, data: str, t: float | None) -> bool:
        """Take a text, tool-argument or thinking delta in a layout learnt from a parsed one,
        without parsing it.

        True when done. It declines (False, and the event is parsed) in every state where
        ``_content_block_delta`` would do more than append the fragment: outside a message or
        after its stop reason, for an index that is not an open block, and for a block of
        another kind than the delta's (or a tool result's block, for arguments). A layout is
        learnt only from an event whose name is its type and that holds the type, the index
        and a delta of its type and fragment alone, so the full path would note nothing else."""
        for delta_type, deltas in self._deltas.items():
            hit = deltas.content(data)
            if hit is not None:
                break
        else:
            return False
        builder = self.builder
        index, fragment = hit
        if not builder.open_message or builder.content_stopped or index not in builder.open_blocks:
            return False
        block = builder.blocks.get(index)
        if block is None:
            return False
        if delta_type == "input_json_delta":
            fragments = builder.fragments.get(index)
            if fragments is None:
                return False
            fragments.append(fragment)
            return True
        if block.kind is not (BlockKind.TEXT if delta_type == "text_delta" else BlockKind.THINKING) \
                or block.signature:  # (thinking after a signature is judged on the full path)
            return False
        builder.pieces.content(block, fragment, t)
        return True

    def _error_event(self, obj: Any, event: SSEEvent) -> None:
        """An ``event: error`` whose data is not an Anthropic error event: its type and message where
        the data has them, else the data itself as the message."""
        error = obj.get("error") if type(obj) is dict else None
        if isinstance(error, dict):
            kind, message = as_text(error.get("type")), error.get("message")
        elif isinstance(error, str):
            kind, message = None, error
        else:
            kind, message = None, event.data
        message = error_text(message) if isinstance(message, str) and message.strip() else None
        self.judge.errored({"source": "stream", "type": kind, "code": None, "message": message},
                           event.seq, event.start)

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        return self.turn, self.builder.verdict(end)
