"""Bedrock ConverseStream: AWS event-stream frames into a Turn and a Verdict.

Each frame's ``:event-type`` header names the event (``messageStart``,
``contentBlockStart/Delta/Stop``, ``messageStop``, ``metadata``) and its payload is the
event's JSON (plus a ``p`` padding field). ``ConverseBuilder`` holds the event logic so
Bedrock InvokeModel reuses it for Amazon Nova, whose chunks carry the same events.

Choices this module makes where the provider is silent:
- Text and reasoning blocks often have no ``contentBlockStart`` in real captures: a
  block is created by its first delta, its kind taken from that delta.
- The turn ends with ``messageStop`` and ``metadata`` (usage), in either order (live
  streams send ``messageStop`` first; an edited capture has it the other way). A stream
  that stops after ``messageStop`` but before ``metadata`` was still cut: ``truncated``,
  with ``content_complete`` in the evidence, so a cut is never mistaken for a finish.
- ``malformed_model_output`` / ``malformed_tool_use`` are ``errored``: the model failed
  to produce something the provider could parse.
- A block left open at ``messageStop`` is corrupt, except after ``max_tokens`` /
  ``model_context_window_exceeded`` when it is the last block started (a limit cuts the
  block being generated); an open block with a later one started after it lost its stop.
- Several messages back to back behave as in the Anthropic module: blocks appended,
  the last message's stop reason and usage kept, a ``messageStart`` inside an open
  message is a splice (corrupt), and so is one after a ``messageStop`` whose ``metadata``
  never came (the answer before it was cut).
- ConverseStream sends blocks in ``contentBlockIndex`` order (provider-streams.md §4.3): a
  block whose index skips one means blocks are missing, corrupt. Nova chunks (Bedrock
  InvokeModel) share this logic but keep the lenient reading (``ordered=False``). An event
  before any ``messageStart`` is only noted: edited captures (the AI SDK's) lack it.
- Payloads, unions and blobs are read as botocore reads them: the json module's reading where
  orjson refuses (``judge.sdk_loads``), a union's null members dropped before it must hold exactly
  one, base64 decoded leniently (``blob_bytes``). A ConverseStream event botocore's parser raises on
  (a union, nested ones included, without exactly one member, an object given another JSON type, a
  blob that is not base64: ``EVENT_SHAPES``) is corrupt. A redacted reasoning block keeps the base64
  of its pieces' bytes joined, up to the turn's text cap; a tool result's content is a bounded list
  (``Judge.listed``).
- Tool input is read as apps read the string boto3 hands them, with json.loads: a lone surrogate
  escape is not invalid (``parse_arguments``).
- Closed units (``Judge.reopened``): ``contentBlockStop`` closes its block and
  ``messageStop`` the message; a delta, start or stop for a closed block, or a content
  event after ``messageStop`` (before another ``messageStart``), or an event of a type this
  module does not know after both ``messageStop`` and ``metadata``, is corrupt, naming both events.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from streamtap.wire import EventStreamMessage, WireEvent

from .fastpath import CONVERSE, ContentDeltas
from .judge import (THINKING_AFTER_SIGNATURE, Fragments, Judge, Pieces, as_text, decode_event_json, earlier_outcome,
                    holds_tool_call, sdk_loads, stop_verdict)
from .turn import Block, BlockKind, Dialect, StreamEnd, Turn, Usage, Verdict, VerdictKind

STOP_REASONS: dict[str, tuple[VerdictKind, str]] = {
    "end_turn": (VerdictKind.COMPLETE, "end_turn"),
    "tool_use": (VerdictKind.COMPLETE, "tool_use"),
    "stop_sequence": (VerdictKind.COMPLETE, "stop_sequence"),
    "max_tokens": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
    "model_context_window_exceeded": (VerdictKind.STOPPED_BY_LIMIT, "context_window"),
    "guardrail_intervened": (VerdictKind.FILTERED, "filtered"),
    "content_filtered": (VerdictKind.FILTERED, "filtered"),
    "malformed_model_output": (VerdictKind.ERRORED, "malformed_output"),
    "malformed_tool_use": (VerdictKind.ERRORED, "malformed_output"),
}

# the kind of block each delta member builds or grows
_DELTA_KIND = {
    "text": BlockKind.TEXT,
    "reasoningContent": BlockKind.THINKING,
    "toolUse": BlockKind.TOOL_CALL,
    "citation": BlockKind.TEXT,
    "toolResult": BlockKind.SERVER_TOOL,
}


def blob_bytes(text: str, judge: Judge, what: str, seq: int | None) -> bytes:
    """A blob member's bytes as botocore decodes them (``base64.b64decode``, which skips characters
    outside the alphabet, a line break say: noted); ValueError where it raises (bad padding, a
    character past ASCII)."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # (binascii.Error is one)
        blob = base64.b64decode(text)
    judge.note(f"{what} at seq {seq} holds characters outside base64, which botocore skips")
    return blob


def union(value: dict[str, Any]) -> dict[str, Any]:
    """A union's members as botocore counts them: it drops null ones (and ``__type``) before it
    requires exactly one."""
    return {key: member for key, member in value.items() if member is not None and key != "__type"}


class _Union(dict):
    """A union shape in ``EVENT_SHAPES``: its members' shapes by name."""


BLOB = "blob"  # a blob shape: base64 text, which botocore decodes

# What botocore's bedrock-runtime model (2023-09-30) says ConverseStream events hold, as far as its
# parser can raise on them: a dict is a structure (an object; members not named here are strings,
# numbers or documents, passed on as they come), a ``_Union`` a union (exactly one non-null member),
# a one-item list a list, ``BLOB`` a blob, None anything. The trace's guardrail assessment is checked
# as an object only: the model goes on for dozens of shapes below it.
_OBJECT: dict[str, Any] = {}
EVENT_SHAPES: dict[str, dict[str, Any]] = {
    "messageStart": _OBJECT,
    "contentBlockStart": {"start": _Union(toolUse=_OBJECT, toolResult=_OBJECT, image=_OBJECT)},
    "contentBlockDelta": {"delta": _Union(
        text=None,
        toolUse=_OBJECT,
        toolResult=[_Union(text=None, json=None)],
        reasoningContent=_Union(text=None, redactedContent=BLOB, signature=None),
        citation={"sourceContent": [_OBJECT],
                  "location": _Union(web=_OBJECT, documentChar=_OBJECT, documentPage=_OBJECT,
                                     documentChunk=_OBJECT, searchResultLocation=_OBJECT)},
        image={"source": _Union(bytes=BLOB, s3Location=_OBJECT), "error": _OBJECT},
    )},
    "contentBlockStop": _OBJECT,
    "messageStop": _OBJECT,
    "metadata": {"usage": {"cacheDetails": [_OBJECT]}, "metrics": _OBJECT,
                 "trace": {"guardrail": _OBJECT, "promptRouter": _OBJECT},
                 "performanceConfig": _OBJECT, "serviceTier": _OBJECT},
}


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def misfit(value: Any, shape: Any) -> str | None:
    """Why botocore's parser raises on ``value`` read as ``shape`` (an ``EVENT_SHAPES`` entry), or None
    when it does not: the path below ``value`` (``.name``, ``[i]``) and what is wrong there. It passes
    null on as null wherever it sits. Run on every event: a path is spelt out only for a refusal."""
    if value is None or shape is None:
        return None
    if shape is BLOB:
        try:
            base64.b64decode(value)
        except (TypeError, ValueError):
            return " is not base64 text"
        return None
    if isinstance(shape, list):
        if isinstance(value, list):
            for at, item in enumerate(value):
                why = misfit(item, shape[0])
                if why is not None:
                    return f"[{at}]{why}"
            return None
        # botocore iterates a string's characters or an object's keys as the items, which are strings
        # where every list here holds objects: only an empty one passes
        if isinstance(value, (str, dict)) and not value:
            return None
        return f" is {_json_type(value)} where botocore's model has a list"
    if not isinstance(value, dict):
        return f" is {_json_type(value)} where botocore's model has an object"
    if isinstance(shape, _Union):
        members = union(value)
        if len(members) != 1:
            return f" has {len(members)} members {sorted(members)[:4]} where botocore's model takes exactly one"
        (name, member), = members.items()
        # a member the model does not know botocore hands on by name only, unread
        member_shape = shape.get(name)
        why = misfit(member, member_shape) if member_shape is not None else None
        return f".{name}{why}" if why is not None else None
    for name, member_shape in shape.items():
        item = value.get(name)
        if item is not None and member_shape is not None:
            why = misfit(item, member_shape)
            if why is not None:
                return f".{name}{why}"
    return None


def exception_error(message: EventStreamMessage, judge: Judge) -> None:
    """An ``exception`` or ``error`` frame: the provider's own word that the stream failed."""
    headers = message.headers
    if headers.get(":message-type") == "exception":
        try:
            body = sdk_loads(message.payload, judge=judge) if message.payload else {}
        except orjson.JSONDecodeError:
            body = {"message": message.payload[:200].decode("utf-8", "replace")}
        if not isinstance(body, dict):
            body = {}
        error = {"source": "stream", "type": headers.get(":exception-type"), "code": body.get("originalStatusCode"),
                 "message": body.get("message") or body.get("Message")}
        if body.get("originalMessage"):
            error["original_message"] = body["originalMessage"]
    else:
        error = {"source": "stream", "type": headers.get(":error-code"), "code": None,
                 "message": headers.get(":error-message")}
    judge.errored(error, message.seq, message.start)


def foreign_event(event: WireEvent, judge: Judge) -> None:
    """An event of another framing than AWS event-stream (an SSE event, a JSON line): corrupt, as
    dropping it would leave a whole body judged cut before its first frame."""
    judge.seen(event, type(event).__name__)
    judge.corrupt(f"unexpected {type(event).__name__} in an AWS event-stream dialect: Bedrock streams event-stream "
                  "frames only", event.seq, event.start)


def event_frame(message: EventStreamMessage, judge: Judge) -> bool:
    """Count a frame; False for an ``exception`` or ``error`` frame, which is recorded as the
    stream's error. botocore reads a frame of any other ``:message-type`` as an event, so it is one."""
    judge.seen(message, message.headers.get(":event-type") or message.headers.get(":exception-type"))
    message_type = message.headers.get(":message-type", "event")
    if message_type in ("exception", "error"):
        exception_error(message, judge)
        return False
    if message_type != "event":
        judge.note(f"frame with :message-type {message_type!r} at seq {message.seq}: boto3 reads it as an event")
    return True


class ConverseBuilder:
    """ConverseStream event logic on (event type, payload dict)."""

    def __init__(self, turn: Turn, judge: Judge, converse_api: bool = False, one_response: bool = False) -> None:
        self.turn = turn
        self.judge = judge
        # the body answers one call (Nova in Bedrock's InvokeModel): a message after messageStop is stitched on
        self.one_response = one_response
        # the ConverseStream API, which boto3 parses (not a model's native chunks inside invoke):
        # blocks come in index order, and each event fits botocore's model (``EVENT_SHAPES``)
        self.converse_api = converse_api
        self.indexes = 0  # block indexes seen in this message: the next block's index
        self.messages = 0
        self.open_message = False
        self.stopped = False
        self.blocks: dict[int, Block] = {}
        self.open_blocks: set[int] = set()
        self.fragments: dict[int, Fragments] = {}  # index -> a tool block's argument fragments
        self.announced: set[int] = set()  # started with an empty start, no delta yet
        self.opened_by_unknown: set[int] = set()  # blocks a delta member this version does not model opened
        self.metadata_seen = False
        # the first earlier message that did not end cleanly (its raw stop reason, where the next began,
        # whether it held a tool call): the only one earlier_outcome() reports, so a body of any number
        # of messages keeps one entry
        self.outcomes: list[tuple[str | None, int | None, int | None, bool]] = []
        self.pieces = Pieces(self.judge)
        # a redacted block's blob bytes not yet a whole base64 group (0 to 2 bytes), by id(block)
        self.blob_tails: dict[int, tuple[Block, bytes]] = {}

    def knows(self, kind: Any) -> bool:
        """Whether ``kind`` is an event type the builder reads (boto3's model has it)."""
        return isinstance(kind, str) and kind in self._handlers

    def apply(self, kind: str, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            if not self.ended(f"event type {kind!r}", seq, offset):
                self.judge.note(f"unknown event type {kind!r} at seq {seq}")
            return
        if self.converse_api:  # boto3 parses the event by its model: where it raises, the app gets no more
            why = misfit(body, EVENT_SHAPES[kind])
            if why is not None:
                index = body.get("contentBlockIndex")
                self.judge.corrupt(f"{kind}{why}: boto3 raises on this event", seq, offset,
                                   **({"index": index} if isinstance(index, int) else {}))
                return
        handler(self, body, seq, offset, t)

    def ended(self, what: str, seq: int | None, offset: int | None) -> bool:
        """True (and the stream is corrupt) when ``what``, an event the builder does not use, came
        after the message's messageStop and metadata, and before any next message."""
        return self.stopped and self.metadata_seen and self.judge.reopened("the message", what, seq, offset)

    def _begin(self, seq: int | None, offset: int | None, missing_start: str | None = None) -> None:
        """A message begins: at ``messageStart``, or at ``missing_start``, an event that came without one."""
        if self.stopped:
            if not self.metadata_seen:
                self.judge.corrupt(
                    f"message {self.messages + 1} starts at seq {seq} before the metadata (usage) of message "
                    f"{self.messages}: a cut answer with another appended (spliced stream)",
                    seq, offset, stop_reason=self.turn.stop_reason_raw)
            self._remember_outcome(seq, offset)
            self.judge.note(f"message {self.messages + 1} starts at seq {seq} after messageStop: "
                            "several responses back to back")
        elif missing_start is not None:
            self.judge.note(f"no messageStart before seq {seq}")
        self.judge.forget("block ")
        self.judge.forget("the message")
        self.judge.forget("the metadata")
        self.messages += 1
        self.open_message = True
        self.stopped = False
        self.blocks = {}
        self.open_blocks = set()
        self.fragments = {}
        self.announced = set()
        self.opened_by_unknown = set()
        self.indexes = 0
        self.metadata_seen = False
        self.judge.stop_reason(None, None)
        self.turn.usage = Usage()

    def _remember_outcome(self, seq: int | None, offset: int | None) -> None:
        """The message just stopped is followed by another (starting at ``seq``): keep its stop reason
        when it is the first that did not finish as it says."""
        outcome = (self.turn.stop_reason_raw, seq, offset, holds_tool_call(self.turn.choices[0], self.messages))
        if not self.outcomes and earlier_outcome([outcome], STOP_REASONS, "stopReason", self.messages) is not None:
            self.outcomes.append(outcome)

    def _in_message(self, seq: int | None, offset: int | None, what: str) -> bool:
        if self.open_message:
            return True
        if self.stopped:
            self.judge.reopened("the message", what, seq, offset)
            return False
        self._begin(seq, offset, missing_start=what)
        return True

    def _message_start(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if self.open_message:
            self.judge.corrupt("a second messageStart arrived while the message was still open (spliced stream)",
                               seq, offset, open_blocks=sorted(self.open_blocks))
            return
        if self.stopped and self.metadata_seen and self.one_response:  # (before the metadata: _begin names the splice)
            self.judge.corrupt(f"a second messageStart at seq {seq} after messageStop: one call answers once, so a "
                               "second answer was stitched on", seq, offset)
            return
        self._begin(seq, offset)

    def _next_index(self, index: int, what: str, seq: int | None, offset: int | None) -> None:
        """A block index seen for the first time in this message: it must be the next one."""
        if self.converse_api and index != self.indexes:
            self.judge.corrupt(f"{what} for index {index} while {self.indexes} blocks exist", seq, offset,
                               index=index)
        self.indexes += 1

    def _new_block(self, index: int, kind: BlockKind, **fields: Any) -> Block:
        blocks = self.turn.choices[0].blocks
        block = Block(kind, len(blocks), **fields)
        if self.messages > 1:
            block.extra["message"] = self.messages - 1
        blocks.append(block)
        self.blocks[index] = block
        self.open_blocks.add(index)
        return block

    def _text_goes_on(self, index: int, kind: BlockKind) -> Block | None:
        """Nova's native stream (InvokeModel) puts each text delta in a block of its own, announced by
        no contentBlockStart: the text the app joins goes on in the block before, so a long answer
        does not open thousands of blocks (``MAX_BLOCKS``). ConverseStream's blocks stay as sent."""
        if self.converse_api or kind is not BlockKind.TEXT:
            return None
        previous = self.blocks.get(index - 1)
        if previous is None or previous.kind is not BlockKind.TEXT or not previous.closed or previous.citations:
            return None
        previous.closed = False
        self.blocks[index] = previous
        self.open_blocks.add(index)
        return previous

    def _content_after_metadata(self, what: str, seq: int | None, offset: int | None) -> bool:
        """True (and the stream is corrupt) when ``what`` came after the open message's metadata:
        the usage report follows the message's content, so content after it is another answer's."""
        return self.metadata_seen and self.judge.reopened("the message's content", what, seq, offset)

    def _block_start(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message(seq, offset, "contentBlockStart") or \
                self._content_after_metadata("contentBlockStart", seq, offset):
            return
        index = body.get("contentBlockIndex")
        start = body.get("start")
        if not isinstance(index, int) or not isinstance(start, dict):
            self.judge.corrupt("contentBlockStart without contentBlockIndex or start", seq, offset)
            return
        start = union(start)
        if self.judge.reopened(f"block {index}", "contentBlockStart", seq, offset, index=index):
            return
        if index in self.blocks or index in self.announced:
            self.judge.corrupt(f"contentBlockStart for index {index}, which already started", seq, offset,
                               index=index)
            return
        self._next_index(index, "contentBlockStart", seq, offset)
        tool = start.get("toolUse")
        if isinstance(tool, dict):
            server = tool.get("type") == "server_tool_use"
            extra = {k: v for k, v in tool.items() if k not in ("toolUseId", "name")}
            block = self._new_block(index, BlockKind.SERVER_TOOL if server else BlockKind.TOOL_CALL,
                                    id=tool.get("toolUseId"), name=tool.get("name"), arguments_raw="", extra=extra)
            self.fragments[index] = Fragments(self.judge, block, "arguments_raw")
            if not server:
                missing = [key for key in ("name", "toolUseId") if not (isinstance(tool.get(key), str) and tool[key])]
                if missing:  # botocore's model requires both: the app cannot run the call, or answer it
                    self.judge.corrupt(f"contentBlockStart of tool call {index} without its {' or '.join(missing)}: "
                                       "the app cannot run a call that names no tool, nor answer one it cannot name in "
                                       "its toolResult", seq, offset, index=index)
            # a tool call is first content as it opens (its input may be empty), as every dialect counts it
            if self.turn.timing.first_content is None:
                self.turn.timing.first_content = t
        elif isinstance(start.get("toolResult"), dict):
            result = start["toolResult"]
            self._new_block(index, BlockKind.SERVER_TOOL, id=result.get("toolUseId"),
                            extra={"toolResult": dict(result), "content": []})
        elif not start:
            self.announced.add(index)  # an empty start: the first delta says what the block is
        else:
            self._new_block(index, BlockKind.OTHER, extra={"start": dict(start)})
            self.judge.note(f"contentBlockStart {sorted(start)} kept as 'other' (index {index})")

    def _block_delta(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self.open_message and not self._in_message(seq, offset, "contentBlockDelta") or \
                self._content_after_metadata("contentBlockDelta", seq, offset):
            return
        index = body.get("contentBlockIndex")
        delta = body.get("delta")
        if isinstance(delta, dict) and len(delta) != 1:
            delta = union(delta)
        if not isinstance(index, int) or not isinstance(delta, dict) or len(delta) != 1:
            self.judge.corrupt("contentBlockDelta without contentBlockIndex or a single delta member", seq, offset)
            return
        (member, value), = delta.items()
        if member == "reasoningContent" and isinstance(value, dict) and len(value) != 1:
            value = union(value)
        if index not in self.open_blocks and \
                self.judge.reopened(f"block {index}", f"contentBlockDelta ({member})", seq, offset, index=index):
            return
        block = self.blocks.get(index)
        known = _DELTA_KIND.get(member)
        if block is not None and index in self.opened_by_unknown and known in (BlockKind.TEXT, BlockKind.THINKING):
            block.kind = known  # a block a member this version does not model opened: the first it knows says what it is
            self.opened_by_unknown.discard(index)
        if block is None:
            kind = known
            if kind in (BlockKind.TOOL_CALL, BlockKind.SERVER_TOOL):
                # tool blocks always announce their id and name with contentBlockStart
                self.judge.corrupt(f"contentBlockDelta ({member}) for unknown index {index}", seq, offset,
                                   index=index)
                return
            if kind is None:  # boto3 reads a member its model lacks (SDK_UNKNOWN_MEMBER): kept, as in a known block
                kind = BlockKind.OTHER
            if member == "reasoningContent" and isinstance(value, dict) and "redactedContent" in value:
                kind = BlockKind.REDACTED_THINKING
            if index in self.announced:
                self.announced.discard(index)
                block = self._new_block(index, kind)
            else:
                self._next_index(index, f"contentBlockDelta ({member})", seq, offset)
                block = self._text_goes_on(index, kind) or self._new_block(index, kind)
            if known is None:
                self.opened_by_unknown.add(index)
        kind = block.kind
        if member == "text" and kind is BlockKind.TEXT and isinstance(value, str):
            self.pieces.content(block, value, t)
        elif member == "reasoningContent" and kind in (BlockKind.THINKING, BlockKind.REDACTED_THINKING) \
                and isinstance(value, dict):
            if kind is BlockKind.THINKING and isinstance(value.get("text"), str):
                if block.signature and value["text"]:
                    self.judge.corrupt(THINKING_AFTER_SIGNATURE.format(index=index, delta="reasoningContent text"),
                                       seq, offset, index=index)
                    return
                self.pieces.content(block, value["text"], t)
            elif kind is BlockKind.THINKING and isinstance(value.get("signature"), str):
                block.signature = value["signature"]
            elif kind is BlockKind.REDACTED_THINKING and isinstance(value.get("redactedContent"), str):
                try:
                    self._blob(block, blob_bytes(value["redactedContent"], self.judge, "redactedContent", seq))
                except ValueError:  # boto3 decodes every piece, and fails on a bad one
                    self.judge.corrupt(f"redactedContent of block {index} is not base64", seq, offset, index=index)
            else:
                self.judge.corrupt(f"reasoningContent {sorted(value)} does not fit a {kind.value} block "
                                   f"(index {index})", seq, offset, index=index)
        elif member == "toolUse" and index in self.fragments and isinstance(value, dict) \
                and isinstance(value.get("input"), str):
            self.fragments[index].append(value["input"])  # (first content: counted when the call opened)
        elif member == "citation" and kind is BlockKind.TEXT:
            self.judge.listed(block, "citations", value)
        elif member == "toolResult" and "toolResult" in block.extra and isinstance(value, list):
            for item in value:
                self.judge.listed(block, "content", item)
        elif member not in _DELTA_KIND:
            self.judge.listed(block, "deltas", {member: value})
            self.judge.note(f"delta member {member!r} kept in block extra (index {index})")
        else:
            self.judge.corrupt(f"{member} delta does not fit a {kind.value} block (index {index})", seq, offset,
                               index=index, delta=member, block_kind=kind.value)

    def _blob(self, block: Block, blob: bytes) -> None:
        """Grow a redacted block by a piece of its blob. The app joins the pieces' bytes, so the block
        keeps the base64 of the bytes joined (not the texts: a padded piece ends mid-group), written a
        whole group at a time, as text grows (charged to the text cap), never re-encoded whole."""
        if block.data is None:
            block.data = ""  # (an empty piece is an empty blob)
        _, tail = self.blob_tails.pop(id(block), (block, b""))
        if tail:
            blob = tail + blob
        whole = len(blob) - len(blob) % 3
        if whole:
            self.pieces.add(block, base64.b64encode(blob[:whole]).decode("ascii"), "data")
        if whole < len(blob):
            self.blob_tails[id(block)] = block, blob[whole:]

    def _flush(self, block: Block | None = None) -> None:
        """Write the kept text (and blob, its last group padded) of one block, or of every block."""
        if block is None:
            tails = list(self.blob_tails.values())
            self.blob_tails.clear()
        else:
            tail = self.blob_tails.pop(id(block), None)
            tails = [tail] if tail is not None else []
        for owner, rest in tails:
            self.pieces.add(owner, base64.b64encode(rest).decode("ascii"), "data")
        self.pieces.flush(block)

    def _block_stop(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message(seq, offset, "contentBlockStop") or \
                self._content_after_metadata("contentBlockStop", seq, offset):
            return
        index = body.get("contentBlockIndex")
        if not isinstance(index, int):
            self.judge.corrupt("contentBlockStop without contentBlockIndex", seq, offset)
            return
        if self.judge.reopened(f"block {index}", "contentBlockStop", seq, offset, index=index):
            return
        self.judge.close(f"block {index}", "contentBlockStop", seq, offset)
        if index in self.announced:  # started empty and stopped without a delta: nothing to keep
            self.announced.discard(index)
            return
        block = self.blocks.get(index)
        if block is None or index not in self.open_blocks:
            self.judge.corrupt(f"contentBlockStop for unknown index ({index})", seq, offset, index=index)
            return
        self.open_blocks.discard(index)  # type: ignore[arg-type]
        block.closed = True
        self._flush(block)
        if index in self.fragments:
            # boto3 (and Nova's chunk JSON) hands the input over as a string, which apps read with json.loads
            self.judge.close_arguments(block, self.fragments.pop(index).joined(), {}, seq, offset, lone_surrogates=True)

    def _message_stop(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self._in_message(seq, offset, "messageStop"):
            return
        self.open_message = False
        self.stopped = True
        self.judge.terminal_at = (seq, offset)
        self.judge.close("the message", "messageStop", seq, offset)
        raw = as_text(body.get("stopReason"))
        self.judge.stop_reason(raw, STOP_REASONS.get(raw, (None, raw))[1] if raw is not None else None)
        if body.get("additionalModelResponseFields") is not None:
            self.turn.extra["additionalModelResponseFields"] = body["additionalModelResponseFields"]
        if self.open_blocks or self.announced:
            open_indexes = sorted(self.open_blocks | self.announced)
            if raw is None or STOP_REASONS.get(raw, (None,))[0] is not VerdictKind.STOPPED_BY_LIMIT:
                self.judge.corrupt(f"messageStop with block(s) {open_indexes} started but never stopped",
                                   seq, offset, open_blocks=open_indexes)
                return
            index = self.judge.block_cut_by_limit(
                open_indexes, set(self.blocks) | self.announced, raw, "contentBlockStop", seq, offset)
            if index is None:
                return
            if index in self.fragments:
                block = self.blocks[index]
                block.arguments_raw = self.fragments.pop(index).joined()
                block.arguments_error = f"block never closed: the turn was cut by {raw}"
            self.judge.note(f"block {index} left open by {raw}")

    def _metadata(self, body: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if not self.open_message and not self.stopped:
            self._begin(seq, offset, missing_start="metadata")
        if self.judge.reopened("the metadata", "metadata", seq, offset):
            return
        self.judge.close("the metadata", "metadata", seq, offset)  # one usage report per message
        if self.open_message:  # (before messageStop: only messageStop may follow)
            self.judge.close("the message's content", "metadata", seq, offset)
        self.metadata_seen = True
        usage = body.get("usage")
        if isinstance(usage, dict):
            target = self.turn.usage
            target.raw = dict(usage)
            target.input = usage.get("inputTokens")
            target.output = usage.get("outputTokens")
            target.total = usage.get("totalTokens")
            target.cache_read = usage.get("cacheReadInputTokens", usage.get("cacheReadInputTokenCount"))
            target.cache_write = usage.get("cacheWriteInputTokens", usage.get("cacheWriteInputTokenCount"))
        for key in ("metrics", "trace", "performanceConfig", "serviceTier"):
            if body.get(key):
                self.turn.extra[key] = body[key]

    _handlers = {
        "messageStart": _message_start,
        "contentBlockStart": _block_start,
        "contentBlockDelta": _block_delta,
        "contentBlockStop": _block_stop,
        "messageStop": _message_stop,
        "metadata": _metadata,
    }

    def verdict(self, end: StreamEnd) -> Verdict:
        self._flush()
        for index, fragments in self.fragments.items():  # a tool block still open: its arguments as they came
            block = self.blocks.get(index)
            if block is not None and block.arguments_error is None:
                block.arguments_raw = fragments.joined()
                block.arguments_error = "block never closed: the stream stopped inside it"
        judge = self.judge
        early = judge.early_verdict()
        if early is not None:
            return early
        if self.messages == 0:
            return judge.truncated("no event arrived", end)
        if not self.stopped:
            return judge.truncated("the stream ended before messageStop", end, open_blocks=sorted(self.open_blocks))
        earlier = earlier_outcome(self.outcomes, STOP_REASONS, "stopReason", self.messages)
        if earlier is not None:
            return earlier
        if not self.metadata_seen:
            return judge.truncated("messageStop arrived but metadata (usage) did not", end, content_complete=True,
                                   stop_reason=self.turn.stop_reason_raw)
        return stop_verdict(self.turn, judge, "messageStop", STOP_REASONS, messages=self.messages)


class Assembler:
    """Bedrock ConverseStream over AWS event-stream frames."""

    # boto3 takes a body that stops short of its Content-Length for its end (botocore's urllib3
    # responses have enforce_content_length off): a cut there after the end signal costs the app nothing
    sdk_ignores_content_length = True

    dialect = Dialect.BEDROCK_CONVERSE
    wire = "eventstream"

    def __init__(self, one_response: bool = False) -> None:
        self.turn = Turn(Dialect.BEDROCK_CONVERSE)
        self.judge = Judge(self.turn)
        self.builder = ConverseBuilder(self.turn, self.judge, converse_api=True, one_response=one_response)
        self._deltas = ContentDeltas(CONVERSE)  # plain text deltas without a JSON parse

    def feed(self, event: WireEvent, t: float | None) -> None:
        judge = self.judge
        if not isinstance(event, EventStreamMessage):
            foreign_event(event, judge)
            return
        if not event_frame(event, judge):
            return
        headers = event.headers
        kind = headers.get(":event-type")
        data = None
        if kind == "contentBlockDelta":
            try:
                data = event.payload.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                if self._text_delta(data, t):
                    return
        if not self.builder.knows(kind):  # boto3 skips a type its model lacks without reading its payload
            self.builder.apply(kind, {}, event.seq, event.start, t)
            return
        try:
            body = orjson.loads(event.payload)
        except orjson.JSONDecodeError:
            body = None
        if type(body) is not dict:  # what only the SDK's json module reads (NaN, a lone surrogate), or why not
            body = decode_event_json(event.payload, judge, event.seq, event.start, f"{kind} payload")
            if body is None:
                return
        self.builder.apply(kind, body, event.seq, event.start, t)  # type: ignore[arg-type]
        if data is not None:
            # a layout fixes the JSON, not the state: ``_text_delta`` checks the state each time
            self._deltas.learn(data, body)

    def _text_delta(self, data: str, t: float | None) -> bool:
        """Take a text delta in the layout learnt from a parsed one, without parsing it.

        True when done. It declines (False, and the event is parsed) in every state where
        ``_block_delta`` would do more than append the text: outside a message or after its
        metadata, and for an index that is not an open text block. A layout is learnt only from
        a plain text delta, which fits botocore's model; an event in its layout differs only in
        two strings the model takes as they come (the text and the padding), so it fits too."""
        hit = self._deltas.content(data)
        if hit is None:
            return False
        builder = self.builder
        index = hit[0]
        if not builder.open_message or builder.metadata_seen or index not in builder.open_blocks:
            return False
        block = builder.blocks.get(index)
        if block is None or block.kind is not BlockKind.TEXT:
            return False
        text = hit[1]
        builder.pieces.content(block, text, t)
        return True

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        return self.turn, self.builder.verdict(end)
