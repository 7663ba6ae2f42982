"""OpenAI Responses API streams: typed events with a gap-free ``sequence_number``.

Blocks are keyed by ``output_index`` (item ids rotate behind some gateways) and the
part's own index; a delta for an item or part that was never announced is corrupt,
as is a gap or step back in ``sequence_number``, or numbering that begins, after events
without one, anywhere but at their count. An event without one among numbered ones (noted) is read
by the SDK as any other: it may stand in a number skipped, so only a gap wider than such events
between is loss. The terminal event decides:
``response.completed`` / ``response.incomplete`` (by ``incomplete_details.reason``) /
``response.failed``; an ``error`` event makes the turn errored, as does any payload with a
truthy top-level ``error`` (the openai SDK raises ``APIError`` on it, whatever the event).
Every lifecycle and terminal event names the same response id (§2.4): a second
``response.created`` / ``.queued`` / ``.in_progress`` under another id, or a terminal event
under another id, means two responses in one body (a cut stream followed by another): corrupt.
GitHub Copilot rewrites every id on every event; once a stream shows that (its first
``.in_progress`` or an item event under another id), only a repeated start event tells, or an id seen
before: one that goes back to the first after a change is another response's event spliced in (the
raw loop hands the app both). Rotating response ids are noted: the SDK's stream helper raises on them.

Tool calls: what the app runs and answers. A ``function_call`` or ``custom_tool_call`` streams its
arguments; a local shell, shell, computer or apply_patch call, a tool search the client runs and an MCP
approval request come whole in their finished item, whose input (an action, an operation) is the call's
arguments. The app answers each by its ``call_id`` (an approval by the item id), so the turn waits on it:
``tool_use``. Any other item (a web search, a tool search the server ran) is a server tool. An item done
under another id, or with another ``call_id``, than its ``output_item.added`` gave is two items in one
slot, which the SDK refuses: corrupt, unless the stream's ids rotate. So is an item under the id of
another output index's item (unless ids rotate), or a call under the ``call_id`` of another call of its
type: one item sent twice, or another answer's stitched on ("conflicting output identities" to the SDK).

Closed units: ``output_text.done`` / ``content_part.done`` (and their refusal, reasoning
and summary kin) close a part, ``function_call_arguments.done`` a call's arguments,
``output_item.done`` the whole item, the terminal event the response. Any event for a
closed unit is corrupt. Each ``.done`` that gives a part's whole text (``output_text.done``,
``content_part.done``, ``reasoning_summary_part.done`` and their kin) must be what its deltas grew.

The final snapshot: the terminal event's ``response.output`` (and each
``output_item.done``'s item) is what the SDK hands the app. It is compared with what the
deltas assembled; where they disagree the stream is corrupt ("the deltas disagree with the
final response at block N, byte B", or on a part's kind: output_text against refusal, whether
or not the finished part gives its text), so a delta lost, repeated or reordered in flight shows
even without ``sequence_number``. Where neither the deltas nor an event that gives a part whole (a
``.done``, a finished item) gave its text, the snapshot fills the block (servers that send only the
finished item); once one did, even as empty text, a later one that differs is corrupt. A reasoning item's
``encrypted_content`` (the thinking signature) is the snapshot's. A terminal ``output``
list that leaves out an item the stream finished is corrupt too (the app gets that list;
the ChatGPT Codex backend sends ``[]``); found by item id, or by position and type where
ids rotate. So is a list that names one item twice (a streamed item, an item id unless ids rotate, or
a call's ``call_id``): the SDK hands the app both copies, the text twice or one call to run twice.
A null or absent ``output`` is no contradiction: the SDK rebuilds it from the ``output_item.done`` items,
or from a later start event's copy of one (``response.in_progress`` with ``output``), which it swaps in:
such a copy is compared as the finished item is.

The head: a stream starts with ``response.created`` (sequence_number 0). Only a replay
(``GET /v1/responses/{id}?stream=true&starting_after=N``) starts later, and it keeps the
numbering: its first event says sequence_number N+1 >= 1. A stream that starts with another
event and no such number lost its head (the items announced there, and with an absent
``output`` their text, are gone unseen): such a turn is ``unknown``, never complete, as is one that
starts later where the request is known to have created the response (``POST /v1/responses``, which no
replay answers: ``may_resume`` false). A replay
may start inside an item (one: the item open when it starts, before the body starts or adds any):
the body holds the end of its text (of its one part open then), which its ``.done`` events and
its finished item must end with, and they then give it whole. Its events must say one kind of
item, the one its done names; otherwise they are checked as any item's. A turn whose item no
event gives whole holds only its end, and one whose item id changes, or is never given (rotating
ids, or another answer's events: the end of a text cannot tell which), cannot be vouched for: both
are ``unknown``, whether the answer completed, stopped at a limit or was filtered.

A UTF-8 BOM at byte 0 right before a ``data:`` line is corrupt: the SSE rules drop it, the SDK keeps
it and ignores that line, so the app never gets the first event. Before an ``event:`` line (as OpenAI
frames its events) it costs nothing: the SDK reads every event's data, whatever its name.
"""

from __future__ import annotations

from typing import Any

from streamtap.wire import SSEEvent, WireEvent

from .common import (
    RESPONSE, AssemblerBase, as_dict, as_int, as_list, as_str, common_prefix, dumps, error_fields, error_fields_of_text,
    not_a_json_object,
)
from .judge import arguments_not_kept, dropped_key, parse_arguments
from .turn import Block, BlockKind, Dialect, StreamEnd, Turn, Verdict, VerdictKind

INCOMPLETE = {
    "max_output_tokens": "max_tokens",
    "content_filter": "filtered",
    "max_messages": "max_tokens",
}

# item types the client executes: tool calls with arguments
CLIENT_CALLS = {"function_call", "custom_tool_call"}
# item types the app must run (or, an MCP approval request, answer) whose input comes whole in the item, not in
# deltas: by the field that holds it. The app answers with the call_id (an approval with the item id), so the
# turn waits on it as on a function call. A tool search the server ran and a shell call in OpenAI's hosted
# container are not the app's (``_client_item``).
CLIENT_ITEMS = {
    "local_shell_call": "action", "shell_call": "action", "computer_call": "action", "apply_patch_call": "operation",
    "tool_search_call": "arguments", "mcp_approval_request": "arguments",
}
# what the events of an item say it is, by the item type its done gives (any other type: "tool")
FAMILIES = {"message": "message", "reasoning": "reasoning", "function_call": "call", "custom_tool_call": "call"}
# verdicts that say what the turn is (whole, or stopped or filtered whole): a replay must vouch for its item
VOUCHED = (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED)
ROTATED = ": ids that rotate and another answer's events both look so, and the end of its text that the body holds cannot tell which"
# a content part's type, by its kind: output_text and refusal parts are a message's, reasoning_text a reasoning item's
PART_TYPES = {BlockKind.TEXT: "output_text", BlockKind.REFUSAL: "refusal", BlockKind.THINKING: "reasoning_text"}
ITEM_OF_PART = {"output_text": "message", "refusal": "message", "reasoning_text": "reasoning"}
KIND_OF_PART = {part_type: kind for kind, part_type in PART_TYPES.items()}


def _listed(parts: Any) -> int | None:
    """How many parts a finished item lists; None when it does not carry the list at all."""
    return len(parts) if isinstance(parts, list) else None


def _part_kind(part: Any) -> BlockKind:
    return _final_kind(as_dict(part), BlockKind.TEXT)


def _final_kind(part: dict[str, Any], usual: BlockKind) -> BlockKind:
    """The kind a finished content part gives itself; ``usual``, its item's, where its type is none of PART_TYPES."""
    return KIND_OF_PART.get(as_str(part.get("type")) or "", usual)


def _client_item(item: dict[str, Any]) -> bool:
    """Whether an item of CLIENT_ITEMS is the app's to run: a tool search says who runs it (``execution``); a
    shell call in a hosted container (``container_reference``) runs there, its output following in the response."""
    kind = as_str(item.get("type"))
    if kind == "tool_search_call":
        return item.get("execution") == "client"
    if kind == "shell_call":
        return as_str(as_dict(item.get("environment")).get("type")) != "container_reference"
    return kind in CLIENT_ITEMS


def _slot(item: dict[str, Any]) -> dict[str, Any]:
    """What later events read of an output item: its type, its ids, and a call's name and who runs it
    (``_identity_changed``). Kept instead of the item, which may carry anything, in any size."""
    return {field: item.get(field) for field in ("type", "id", "call_id", "name", "execution")}


# item types the openai SDK tells apart by their call_id alone (``_output_identity``); any other by its id too
CALL_IDENTITY = {"function_call", "custom_tool_call", "shell_call", "shell_call_output"}


def _sdk_identity(item: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """How the openai SDK's stream helper tells finished output items apart, to swap in a copy a later
    lifecycle event lists."""
    kind, call_id = as_str(item.get("type")), as_str(item.get("call_id"))
    return (kind, None, call_id) if kind in CALL_IDENTITY else (kind, as_str(item.get("id")), call_id)


def _item_input_field(item: dict[str, Any]) -> str:
    """The field of a CLIENT_ITEMS item that holds what the app runs (a computer call may batch ``actions``)."""
    field = CLIENT_ITEMS[as_str(item.get("type")) or ""]
    return "actions" if field == "action" and item.get("action") is None and "actions" in item else field


def _family(kind: BlockKind, sub: str) -> str:
    """What a part's events say its item is (FAMILIES)."""
    return "reasoning" if sub == "summary" or kind is BlockKind.THINKING else "message"


# lifecycle events a response sends once, before its output
STARTS = ("response.created", "response.queued", "response.in_progress")
# events that only report progress
PROGRESS_SUFFIXES = (".in_progress", ".searching", ".interpreting", ".generating", ".completed", ".failed", ".partial_image")


OTHER_IDS_KEPT = 1024
# output items one turn keeps (as MAX_BLOCKS blocks): each costs memory, and a stream can add one per
# event, so past them the answer is not assembled and its verdict is unknown
MAX_ITEMS = 4096


class Assembler(AssemblerBase):
    dialect = Dialect.OPENAI_RESPONSES
    wire = "sse"
    sdk_dispatches_empty_events = True

    def __init__(self, wire: str | None = None, may_resume: bool = True) -> None:
        """``may_resume`` false: the request created the response (``POST /v1/responses``), so its body
        is no ``starting_after`` replay and starts with ``response.created`` (``_head``)."""
        super().__init__(wire)
        self._may_resume = may_resume
        self._sequence: int | None = None
        self._unnumbered = 0  # events before the first sequence_number: the number it must then say
        self._counted = 0  # events without sequence_number since the last numbered one
        # id() of each block some event gave whole (a .done, a finished item), and the first that did: a block
        # still empty then is empty, and a later final text is a contradiction, not the text it lacked
        self._given: dict[int, str] = {}
        self._unnumbered_noted = False
        self._items: dict[int, dict[str, Any]] = {}  # output_index -> item from output_item.added/done
        self._item_index: dict[str, int] = {}  # item id -> output_index
        self._done_seen = False  # a compatible server's [DONE], where the openai SDK stops reading
        self._call_index: dict[tuple[str, str], int] = {}  # (item type, call_id) -> output_index
        self._done_at: dict[tuple[str | None, str | None, str | None], int] = {}  # _sdk_identity -> done item's index
        self._open_items: set[int] = set()  # added, not yet done
        self._incomplete_item: tuple[int, WireEvent] | None = None  # the first item done with status incomplete
        self._part_events: set[tuple[int, str]] = set()  # (output index, "content" or "summary") part events came for
        self._first_response: tuple[str, WireEvent] | None = None  # the first response id and its event
        self._changed_response: tuple[str, WireEvent] | None = None  # the latest other response id and its event
        self._starts_seen: set[str] = set()
        self._ids_rotate = False  # the gateway rewrites ids per event: another id proves nothing alone
        # ids that differed from the ones first given: a gateway that rewrites ids gives a new one on
        # every event, so one of them seen twice is another answer's events (stitched), not a rewrite.
        # The first OTHER_IDS_KEPT are kept: a stitch repeats its ids at once, and memory stays bounded.
        self._other_ids: set[str] = set()
        self._opening: tuple[str, int | None, WireEvent] | None = None  # the first event: type, sequence_number
        # A starting_after replay may start inside an output item: the one item open when it starts.
        # Its blocks then hold only the end of their text, until a .done or the finished item gives
        # the whole, which must end with it. The body's first start or output_item.added closes the
        # chance: no item after it can have begun before the body.
        self._partial: int | None = None
        self._partial_blocks: set[int] = set()  # id() of blocks holding only the end of their text
        self._partial_made = False  # its one part open when the replay started is made (or a part began in the body)
        self._partial_family: str | None = None  # what its events say it is (FAMILIES), for its done to agree with
        self._partial_id_change: str | None = None  # its item id changed: rotation or another answer, which an end cannot tell
        self._body_started = False

    def feed(self, event: WireEvent, t: float | None) -> None:
        if self.judge.halt_verdict is not None:  # a bound passed: the rest is not read (see _room_for_item)
            return
        if not isinstance(event, SSEEvent):
            self.seen(event, type(event).__name__)
            self.corrupt(f"unexpected {type(event).__name__} in an SSE dialect", event)
            return
        if event.data.startswith("[DONE]"):  # not sent by OpenAI; some compatible servers do, last
            self._done_seen = True
            closed = self.judge.closed_units.get(RESPONSE)
            if closed is not None and closed[0] != "data: [DONE]":
                self.judge.seen(event, "[DONE]")  # the transport's end after the response's own: fine
                return
            # the SDK stops reading here: what follows never reaches the app, and without
            # response.completed before it the SDK raises
            self.seen(event, "[DONE]")
            self.close_unit(RESPONSE, "data: [DONE]", event)
            return
        if event.event == "error" and not_a_json_object(event.data):
            self.seen(event, "error")
            self.errored(event, error_fields_of_text(event.data))
            return
        obj = self.payload(event, event.data) if event.data.strip() else None
        kind = as_str(obj.get("type")) if isinstance(obj, dict) else None
        self.seen(event, kind or (f"{event.event} (no type in its data)" if isinstance(obj, dict) else event.event))
        if event.start == 0:
            self.first_event_lost_to_bom(event)
        if not event.data.strip():
            self.empty_data(event, "openai")
            return
        if not isinstance(obj, dict):
            if obj is not None:
                self.corrupt("event data is JSON but not an object", event)
            return
        if kind is None and event.event == "error":  # the provider's word that it failed, whatever the data lacks
            kind = "error"
        if self._opening is None:
            self._opening = (kind or "an event without type", as_int(obj.get("sequence_number")), event)
        self._check_sequence(obj, event)
        if obj.get("error") and kind != "error":
            # the SDK raises on it: the app sees an error, not this event
            self.errored(event, {**error_fields(obj), "event": kind or event.event})
            return
        if kind is None:
            # the SDK takes an event's kind from its data alone: the app gets an event of no kind, which
            # says nothing to it, whatever the event line says (a response.completed so sent never arrives)
            self.note(f"event {event.event!r} at seq {event.seq} has no string type in its data: the SDK hands the "
                      "app an event of no kind, so it is skipped")
            return
        handler = getattr(self, "_on_" + kind.replace(".", "_"), None)
        if handler is not None:
            handler(obj, event, t)
        elif kind.endswith(PROGRESS_SUFFIXES) or kind.endswith(".delta") or kind.endswith(".done"):
            self.note(f"unhandled event {kind}")
        else:
            self.note(f"unknown event {kind}")

    def _check_sequence(self, obj: dict[str, Any], event: WireEvent) -> None:
        number = as_int(obj.get("sequence_number"))
        if number is None:
            if self._sequence is None:
                self._unnumbered += 1
            else:
                self._counted += 1
                self._note_unnumbered(event)
            return
        previous, self._sequence = self._sequence, number
        if previous is None and self._unnumbered and number != self._unnumbered:
            # a server numbers every event or none: numbering that begins after unnumbered ones
            # says where this event stands, and events between are lost or another answer's
            self.corrupt(f"sequence_number begins at {number} after {self._unnumbered} event(s) without one: "
                         "the events between are lost, or these are another answer's", event, unnumbered=self._unnumbered)
            return
        # events without sequence_number since the last numbered one may stand in the numbers skipped (each
        # an event the server numbered and the number lost) or be extra: loss is sure only beyond them
        counted, self._counted = self._counted, 0
        if previous is None or previous < number <= previous + 1 + counted:
            return
        if number <= previous:
            self.corrupt(f"sequence_number went back from {previous} to {number}", event, previous=previous)
        else:
            between = f" (counting the {counted} event(s) between without sequence_number)" if counted else ""
            lost = number - previous - 1 - counted
            self.corrupt(f"sequence_number jumped from {previous} to {number}: {lost} events lost{between}", event,
                         previous=previous, unnumbered=counted)

    def _note_unnumbered(self, event: WireEvent) -> None:
        """An event without sequence_number after numbered ones: the openai SDK reads it as any other (only its
        stream helper resuming with ``starting_after`` compares the numbers, and fails on it), so it loses nothing
        by itself (``_check_sequence`` counts it). Noted once."""
        if not self._unnumbered_noted:
            self._unnumbered_noted = True
            self.note(f"event without sequence_number in a numbered stream at seq {event.seq} (byte {event.start}): the "
                      "openai SDK reads it as any other, but its stream helper resuming with starting_after fails on it")

    # -- lifecycle ----------------------------------------------------------------------
    def _lifecycle(self, obj: dict[str, Any], event: WireEvent) -> dict[str, Any]:
        response = as_dict(obj.get("response"))
        name = as_str(obj.get("type")) or getattr(event, "event", "")
        repeated = name in self._starts_seen
        if name in STARTS:
            self._starts_seen.add(name)
            self._body_started = True
        if response:
            self._response_id(as_str(response.get("id")), name, repeated, event)
            if name in STARTS and isinstance(response.get("output"), list) and self._done_at:
                self._lifecycle_output(response["output"], event, name)
            self.turn.model = self.turn.model or as_str(response.get("model"))
            if isinstance(response.get("usage"), dict):
                self._usage(response["usage"])
        return response

    def _response_id(self, new: str | None, name: str, repeated: bool, event: WireEvent) -> None:
        if not new:
            return
        if self._first_response is None:
            self._first_response = (new, event)
            self.turn.response_id = new
            return
        first_id = self._first_response[0]
        if new == first_id:
            if self._changed_response is not None:
                # ids that rotate are new on every event: going back to the first is another response's
                # event spliced in between this one's (the raw loop hands the app both)
                self.second_generation(f"response id ({name}, the first one again)", self._changed_response, new, event,
                                       first_response_id=first_id, response_id=new)
            return
        if repeated or new in self._other_ids or (name not in STARTS and not self._ids_rotate):
            self.second_generation(f"response id ({name})", self._first_response, new, event,
                                   first_response_id=first_id, response_id=new)
            return
        self._ids_rotate = True
        self._changed_response = (new, event)
        self._other_id(new)
        self.note(f"response id changed from {first_id} to {new}: the openai SDK's raw loop reads on, its stream "
                  "helper (responses.stream) raises \"Lifecycle response identity changed\"")

    def _lifecycle_output(self, output: list[Any], event: WireEvent, name: str) -> None:
        """A start event, after items were done, whose ``output`` lists one of them: the openai SDK swaps
        that copy in for the finished item (and hands it to the app where the terminal event lists no
        output), so a copy that differs from what the stream gave is corrupt (``_agree``)."""
        for item in output:
            item = as_dict(item)
            index = self._done_at.get(_sdk_identity(item)) if item.get("type") else None
            if index is not None:
                self._agree(index, item, event, name)

    def _other_id(self, new: str) -> None:
        if len(self._other_ids) < OTHER_IDS_KEPT:
            self._other_ids.add(new)

    def _on_response_created(self, obj, event, t):
        self._lifecycle(obj, event)

    _on_response_queued = _on_response_in_progress = _on_response_created

    def _on_response_completed(self, obj, event, t):
        response = self._lifecycle(obj, event)
        if self._open_items:
            index = min(self._open_items)
            kind = self._items[index].get("type")
            added = "began before this replay's first event and was" if index == self._partial else f"({kind}) was added and"
            self.corrupt(f"response.completed, but output item {index} {added} never done", event)
        self._final_output(response.get("output"), event, t)
        kinds = {b.kind for b in self.turn.blocks}
        status = as_str(response.get("status")) or "completed"
        if status == "completed":
            self._no_incomplete_item(response.get("output"), event)
            # an error or a cut said inside a response called completed: the app's final response
            # carries them, the event says it finished; not a finished turn either
            contradicted = [name for name in ("error", "incomplete_details") if response.get(name)]
            if contradicted:
                status = f"completed with {' and '.join(contradicted)}"
        # a response.completed whose response says another status is not a finished turn; a
        # refusal is filtered, as on Chat Completions
        finished = "tool_use" if BlockKind.TOOL_CALL in kinds else "refusal" if BlockKind.REFUSAL in kinds else "end_turn"
        normalized = finished if status == "completed" else "other"
        self.terminal(event, status, normalized, "response.completed")

    def _no_incomplete_item(self, output: Any, event: WireEvent) -> None:
        """A completed response holds no item that says it was cut (status ``incomplete``, which
        belongs with ``response.incomplete``, §2.3): that the app would run or show as whole."""
        incomplete = self._incomplete_item
        if incomplete is None:
            listed = [i for i, item in enumerate(as_list(output)) if as_dict(item).get("status") == "incomplete"]
            incomplete = (listed[0], event) if listed else None
        if incomplete is not None:
            index, said = incomplete
            self.corrupt(f"response.completed, but output item {index} is done with status incomplete (seq {said.seq}): "
                         "the item says it was cut, the response that it finished", said, output_index=index)

    def _on_response_incomplete(self, obj, event, t):
        response = self._lifecycle(obj, event)
        self._final_output(response.get("output"), event, t)
        reason = as_str(as_dict(response.get("incomplete_details")).get("reason"))
        self.terminal(event, f"incomplete:{reason}", INCOMPLETE.get(reason, "other"), "response.incomplete")

    def _on_response_failed(self, obj, event, t):
        response = self._lifecycle(obj, event)
        error = response.get("error") or {"message": "response.failed"}
        self.errored(event, {**error_fields({"error": error}), "event": "response.failed"})
        self.terminal(event, "failed", "error", "response.failed")

    def _on_error(self, obj, event, t):
        inner = as_dict(obj.get("error")) or {k: v for k, v in obj.items() if k not in ("type", "sequence_number")}
        self.errored(event, {**error_fields({"error": inner}), "event": "error"})

    @property
    def sdk_stopped_reading(self) -> bool:
        """The openai SDK stops at [DONE] (``Stream.__stream__``), which OpenAI never sends for
        Responses but some compatible servers do: a body cut after it never reaches the app."""
        return self._done_seen

    # -- items ----------------------------------------------------------------------------
    def _replay(self) -> bool:
        """Does this body start after its response's first events (``starting_after``)? See ``_head``."""
        opening = self._opening
        return (self._may_resume and opening is not None and opening[0] != "response.created"
                and opening[1] is not None and opening[1] >= 1)

    def _begun_earlier(self, index: int | None, item_id: str | None, event: WireEvent) -> bool:
        """An event for output item ``index``, never added in this body: in a replay that has not
        started an item yet, the item open when it started (noted). It is taken as added, with
        no type, and its blocks as holding only the end of their text. Any other is corrupt."""
        if index is None or self._partial is not None or self._body_started or not self._replay():
            return False
        self._partial = index
        self._items[index] = {"type": None, "id": item_id}
        self._open_items.add(index)
        if item_id:
            self._item_index[item_id] = index
        kind, number, _ = self._opening
        self.note(f"output item {index} was added before this replay's first event ({kind}, sequence_number "
                  f"{number}): the body holds the end of its text, which its .done events and finished item must end with")
        return True

    def _partial_block(self, block: Block) -> Block:
        self._partial_blocks.add(id(block))
        return block

    def _whole(self, block: Block, field: str, final: str) -> bool:
        """Whether ``final`` is what the block's deltas grew: for a block of the item a replay
        started in, whether it ends with them, and then the block takes it whole."""
        if id(block) not in self._partial_blocks:
            return self.judge.whole(block, field, final)
        ours = getattr(block, field) or ""
        dropped = block.extra.get(dropped_key(field), 0)  # the kept start of the end, then what the cap left out
        if len(final) < len(ours) + dropped or not final[len(final) - len(ours) - dropped:].startswith(ours):
            return False
        block.extra.pop(dropped_key(field), None)
        self._partial_blocks.discard(id(block))
        self.judge.give_back(field, len(ours))  # the whole is kept in its place
        setattr(block, field, self.judge.kept(block, field, final))
        return True

    def _partial_id(self, final_id: str | None, event: WireEvent) -> None:
        """The id a done or final item gives the item a replay started in, against its events' id."""
        streamed_id = as_str(self._items[self._partial].get("id"))
        if not final_id or final_id == streamed_id or self._partial_id_change is not None:
            return
        where = f"at seq {event.seq} (byte {event.start})"
        self._partial_id_change = (f"its item id changed from {streamed_id} to {final_id} {where}{ROTATED}" if streamed_id
                                   else f"its events carry no item id, so the item {final_id} {where} cannot be tied to them "
                                        "by the end of its text alone")

    def _of_partial(self, index: int, family: str, event: WireEvent) -> bool:
        """A block of ``family`` for the item a replay started in: False (corrupt) when its events
        said another family before, as an item added as one type and streaming another is."""
        if self._partial_family is None:
            self._partial_family = family
        elif family != self._partial_family:
            self.corrupt(f"output item {index}, begun before this replay's first event, streams {family} events after "
                         f"{self._partial_family} ones: two items in one slot", event, output_index=index)
            return False
        return True

    def _index(self, obj: dict[str, Any], event: WireEvent) -> int | None:
        index = as_int(obj.get("output_index"))
        if index is None:
            index = self._item_index.get(as_str(obj.get("item_id")) or "")
        if (index is None or index not in self._items) and not self._begun_earlier(index, as_str(obj.get("item_id")), event):
            self.corrupt(f"{obj.get('type')} for output item {index if index is not None else obj.get('item_id')} that was never added", event)
            return None
        added_id, item_id = as_str(self._items[index].get("id")), as_str(obj.get("item_id"))
        if index == self._partial and not added_id and item_id:  # its first event gave none: the first that does counts
            self._items[index]["id"] = added_id = item_id
            self._item_index.setdefault(item_id, index)
        if added_id and item_id and item_id != added_id:
            if item_id in self._other_ids:
                self.corrupt(f"output item {index} was added as {added_id}, and item {item_id} carries on in it at "
                             f"seq {event.seq} (byte {event.start}): another answer's events", event,
                             output_index=index, item_id=item_id)
                return None
            self._other_id(item_id)
            self._ids_rotate = True
            if index == self._partial and self._partial_id_change is None:
                self._partial_id_change = f"its item id changed from {added_id} to {item_id} at seq {event.seq} (byte {event.start}){ROTATED}"
        if self.reopened(f"output item {index}", str(obj.get("type")), event):
            return None
        return index

    def _on_response_output_item_added(self, obj, event, t):
        self._body_started = True
        if obj.get("item") is None:
            # some compatible providers send an empty added event; the SDK skips it, leaving a gap in
            # the output indexes (``accumulate_event``): an item that never came, not one left open
            self.note(f"response.output_item.added without an item at seq {event.seq} (output index "
                      f"{obj.get('output_index')}): skipped, as the SDK skips it")
            return
        item = as_dict(obj.get("item"))
        index = as_int(obj.get("output_index"))
        if index is None:
            index = len(self._items)
        if self.reopened(f"output item {index}", "response.output_item.added", event):
            return
        if index in self._open_items:
            self.corrupt(f"output item {index} was added twice", event, output_index=index)
            return
        if not self._room_for_item(index, event) or self._held_by_another(index, item, event, "response.output_item.added"):
            return
        self._items[index] = _slot(item)
        self._open_items.add(index)
        if as_str(item.get("id")):
            self._item_index[item["id"]] = index
        kind = as_str(item.get("type"))
        if kind in CLIENT_CALLS:
            call_id = as_str(item.get("call_id")) or as_str(item.get("id"))
            block = self.tool_block(0, (index, "args"), id=call_id, name=as_str(item.get("name")), t=t)
            block.arguments_raw = as_str(item.get("arguments")) or as_str(item.get("input")) or ""
            block.extra["item_id"] = item.get("id")
            if kind == "custom_tool_call":
                block.extra["freeform"] = True
        elif _client_item(item):
            self._client_item_block(index, item, t)
        elif kind not in ("message", "reasoning", None):
            self.content(t)
            self.new_block(0, BlockKind.SERVER_TOOL, (index, "tool"), id=item.get("id"), name=kind, extra={"item": item})

    def _on_response_output_item_done(self, obj, event, t):
        self.flush_text()  # reads and closes blocks that deltas grew
        item = as_dict(obj.get("item"))
        index = as_int(obj.get("output_index"))
        if (index is None or index not in self._items) and not self._begun_earlier(index, as_str(item.get("id")), event):
            self.corrupt(f"output_item.done for output item {index} that was never added", event)
            return
        if self.reopened(f"output item {index}", "response.output_item.done", event):
            return
        self.close_unit(f"output item {index}", "response.output_item.done", event)
        added_kind, done_kind = as_str(self._items[index].get("type")), as_str(item.get("type"))
        if index == self._partial and done_kind and self._partial_family not in (None, FAMILIES.get(done_kind, "tool")):
            self.corrupt(f"output item {index}, begun before this replay's first event, streamed {self._partial_family} "
                         f"events and is done as a {done_kind}: two items in one slot", event, output_index=index)
            self._open_items.discard(index)
            return
        if index == self._partial:
            self._partial_id(as_str(item.get("id")), event)
        if added_kind and done_kind and added_kind != done_kind:
            self.corrupt(f"output item {index} was added as a {added_kind} and is done as a {done_kind}: two items in "
                         f"one slot", event, output_index=index)
            self._open_items.discard(index)
            return
        added = self._items[index]
        added_id = added.get("id")
        if (index != self._partial and not self._same_item_id(index, as_str(added_id), as_str(item.get("id")), event)) \
                or self._held_by_another(index, item, event, "response.output_item.done"):
            self._open_items.discard(index)
            return
        # only its type and id are read later (the item holds the whole text); an id that changed
        # since output_item.added (ids that rotate) cannot find the item in the final response
        self._items[index] = {**added, "type": item.get("type"), "id": added_id if item.get("id") == added_id else None}
        self._open_items.discard(index)
        if item.get("status") == "incomplete" and self._incomplete_item is None:
            self._incomplete_item = (index, event)
        self._done_at[_sdk_identity(item)] = index
        kind = as_str(item.get("type"))
        self._agree(index, item, event, "response.output_item.done")
        if kind in CLIENT_CALLS:
            block = self.block(0, (index, "args"))
            if block is None and index == self._partial:  # a replay that started at its done
                self._fill_item(index, item, t, "response.output_item.done")
            elif block is not None:
                if index == self._partial:  # what its output_item.added, before the body, said
                    block.id = block.id or as_str(item.get("call_id")) or as_str(item.get("id"))
                    block.name = block.name or as_str(item.get("name"))
                    block.extra["freeform"] = kind == "custom_tool_call"
                self._close_call(block)
        elif kind == "message":
            if not any(k[0] == index for (c, k) in self._keys if c == 0):
                self._fill_message(index, item, t, "response.output_item.done")
        elif _client_item(item):
            block = self.block(0, (index, "tool")) or self._client_item_block(index, item, t)  # None: a replay from here
            self._take_client_item(block, item)
        elif kind not in ("reasoning", None):
            block = self.block(0, (index, "tool"))
            if block is not None:
                block.extra["item"] = item
        for (c, key), block in self._keys.items():
            if c == 0 and key[0] == index:
                block.closed = True

    def _room_for_item(self, index: int, event: WireEvent) -> bool:
        """Whether the turn may keep one more output item; past MAX_ITEMS it halts (``Judge.halt``)."""
        if len(self._items) < MAX_ITEMS:
            return True
        self.judge.halt(f"the answer added more than {MAX_ITEMS} output items; streamtap stopped assembling it at "
                        f"event {event.seq} (byte {event.start}) to bound its memory", event.seq, event.start,
                        max_items=MAX_ITEMS, output_index=index)
        return False

    def _same_item_id(self, index: int, added_id: str | None, done_id: str | None, event: WireEvent) -> bool:
        """An item done under another id than it was added with is another item in its slot (the openai SDK
        raises "Completed output item identity changed"): corrupt, unless the stream's ids rotate (GitHub
        Copilot gives every event new ids) and the new id is not one seen before (another answer's)."""
        if not added_id or not done_id or done_id == added_id:
            return True
        if self._ids_rotate and done_id not in self._other_ids:
            self._other_id(done_id)
            return True
        rotated = " (ids rotate in this stream, but that id was seen before: another answer's item)" if self._ids_rotate else ""
        self.corrupt(f"output item {index} was added with id {added_id} and response.output_item.done gives {done_id}"
                     f"{rotated}: two items in one slot", event, output_index=index, streamed=added_id, final=done_id)
        return False

    def _held_by_another(self, index: int, item: dict[str, Any], event: WireEvent, source: str) -> bool:
        """An item under the id of another output index's item, or a call under the ``call_id`` of another
        call of its type: one item sent twice, or another answer's stitched on (its text would count
        twice); the openai SDK refuses the response ("conflicting output identities"). Ids are not
        compared where they rotate (a rewrite gives every event new ones, so they prove nothing). True
        when so (corrupt)."""
        kind, item_id, call_id = as_str(item.get("type")), as_str(item.get("id")), as_str(item.get("call_id"))
        other = self._item_index.get(item_id) if item_id and not self._ids_rotate else None
        if other is not None and other != index:
            self.corrupt(f"output item {index} ({source} at seq {event.seq}, byte {event.start}) has id {item_id}, "
                         f"which output item {other} has: one item sent twice, or another answer's stitched on (the "
                         "openai SDK refuses the response: conflicting output identities)", event,
                         output_index=index, other_index=other, item_id=item_id)
            return True
        other = self._call_index.setdefault((kind, call_id), index) if kind and call_id else None
        if other is not None and other != index:
            self.corrupt(f"output item {index} ({source} at seq {event.seq}, byte {event.start}) is a {kind} with "
                         f"call_id {call_id}, which output item {other} has: two calls the app would answer under one id "
                         "(the openai SDK refuses the response: conflicting output identities)", event,
                         output_index=index, other_index=other, call_id=call_id)
            return True
        if item_id:
            self._item_index.setdefault(item_id, index)
        return False

    def _client_item_block(self, index: int, item: dict[str, Any], t: float | None) -> Block:
        block = self.tool_block(0, (index, "tool"), id=None, name=None, t=t)
        self._name_client_item(block, item)
        return block

    def _name_client_item(self, block: Block, item: dict[str, Any]) -> None:
        """A CLIENT_ITEMS item's block: a tool call under the id the app answers with, named as the item
        names its tool (an MCP approval request does), else by the item type (a shell call has no name).
        The item, its input aside, stays in ``extra``."""
        field = _item_input_field(item)
        block.kind = BlockKind.TOOL_CALL  # added by a tool search that did not say who runs it: a server tool
        block.id = as_str(item.get("call_id")) or as_str(item.get("id")) or block.id
        block.name = as_str(item.get("name")) or as_str(item.get("type"))
        block.extra["item_id"] = item.get("id")
        block.extra["item"] = {key: value for key, value in item.items() if key != field}

    def _take_client_item(self, block: Block, item: dict[str, Any]) -> None:
        """A finished CLIENT_ITEMS item: its input (a shell action, a patch operation) becomes the call's
        arguments, an object kept as it is, with its compact JSON as the raw arguments. The input that
        output_item.added gives is still being written (a shell action without its command): only the
        finished item's counts."""
        self._name_client_item(block, item)
        field = _item_input_field(item)
        self.judge.give_back("arguments_raw", len(block.arguments_raw or ""))  # the new input replaces it
        block.extra.pop(dropped_key("arguments_raw"), None)
        self._partial_blocks.discard(id(block))
        value = item.get(field)
        if value is None or isinstance(value, str):  # an approval request's arguments: a JSON string
            parse_arguments(block, self.judge.kept(block, "arguments_raw", value or ""), lone_surrogates=self.judge)
            return
        block.arguments_raw = self.judge.kept(block, "arguments_raw", dumps(value))
        block.arguments, block.arguments_error = (None if arguments_not_kept(block) else value), None

    def _close_call(self, block: Block) -> None:
        block.closed = True
        if block.extra.get("freeform"):
            block.arguments, block.arguments_error = block.arguments_raw, None
        else:
            parse_arguments(block, block.arguments_raw, lone_surrogates=self.judge)

    def _fill_message(self, index: int, item: dict[str, Any], t: float | None, source: str) -> None:
        for ci, part in enumerate(as_list(item.get("content"))):
            if not isinstance(part, dict):
                continue
            kind = BlockKind.REFUSAL if part.get("type") == "refusal" else BlockKind.TEXT
            text = as_str(part.get("refusal") if kind is BlockKind.REFUSAL else part.get("text"))
            block = self.new_block(0, kind, (index, "content", ci), text=text or "")
            if text is not None:
                self._given.setdefault(id(block), source)
            self.judge.listed_whole(block, "citations", as_list(part.get("annotations")))
            self.content(t)

    def _streamed(self, output: list[Any]) -> list[tuple[int, int | None, dict[str, Any]]]:
        """Each item of the final response's list, with its place in the list and the output_index
        the stream gave it (None: the stream never announced it). Found by id: output indexes may
        have gaps (a provider's empty added event), so an item's place in the list need not be its
        index. An item no id finds (it has none, or its id changed) is the streamed item of its
        place, if no other took it."""
        by_id = {item.get("id"): index for index, item in self._items.items() if item.get("id")}
        items = [(position, item) for position, item in enumerate(output) if isinstance(item, dict)]
        found = [by_id.get(as_str(item.get("id"))) for _, item in items]
        taken = set(found)
        for n, (position, _) in enumerate(items):
            if found[n] is None and position in self._items and position not in taken:
                found[n] = position
                taken.add(position)
        return [(position, index, item) for index, (position, item) in zip(found, items)]

    def _fill_from_output(self, output: Any, event: WireEvent, t: float | None) -> None:
        """Items the terminal event lists but the stream never announced (SDK does the same)."""
        if not isinstance(output, list):
            return
        for position, index, item in self._streamed(output):
            if index is not None:
                continue
            index = position if position not in self._items else max(self._items) + 1
            if not self._room_for_item(index, event):
                return
            self._items[index] = _slot(item)
            self._fill_item(index, item, t, "the terminal event")
            self.note(f"output item {index} came only with the terminal event")

    def _fill_item(self, index: int, item: dict[str, Any], t: float | None, source: str) -> None:
        """The blocks of a finished item whose deltas this body did not carry."""
        if item.get("type") == "message":
            self._fill_message(index, item, t, source)
        elif item.get("type") in CLIENT_CALLS:
            block = self.tool_block(0, (index, "args"), id=as_str(item.get("call_id")), name=as_str(item.get("name")), t=t)
            block.arguments_raw = as_str(item.get("arguments")) or as_str(item.get("input")) or ""
            if item.get("type") == "custom_tool_call":
                block.extra["freeform"] = True
            self._close_call(block)
        elif _client_item(item):
            block = self._client_item_block(index, item, t)
            self._take_client_item(block, item)
            block.closed = True
        elif item.get("type") == "reasoning":
            self._agree(index, item, None, source)

    def _final_output(self, output: Any, event: WireEvent, t: float | None) -> None:
        """The terminal event's output: compared with what the deltas assembled, then what the stream lacked."""
        if isinstance(output, list):
            self._left_out(output, event)
            streamed = self._streamed(output)
            if self._listed_twice(streamed, event) or self._other_kind_or_order(streamed, event):
                return
            for _, index, item in streamed:
                if index is not None:
                    if index == self._partial and index in self._open_items:  # never done: the final item names it
                        self._partial_id(as_str(item.get("id")), event)
                    self._agree(index, item, event, "the final response")
        self._fill_from_output(output, event, t)

    def _listed_twice(self, streamed: list[tuple[int, int | None, dict[str, Any]]], event: WireEvent) -> bool:
        """The SDK hands the app the final response's list as it is: one item listed twice there (a streamed
        item, an item id, or a call's ``call_id``) gives the app its text twice, or one call it runs twice.
        Ids are not compared where they rotate (they prove nothing then); a streamed item is found by its
        own. True when so (corrupt)."""
        first: dict[str, int] = {}  # what names an item -> its first place in the list
        for position, index, item in streamed:
            kind, item_id, call_id = as_str(item.get("type")), as_str(item.get("id")), as_str(item.get("call_id"))
            names = [f"output item {index}"] if index is not None else []
            names += [f"item id {item_id}"] if item_id and not self._ids_rotate else []
            names += [f"{kind} call_id {call_id}"] if kind and call_id else []
            for name in names:
                place = first.setdefault(name, position)
                if place == position:
                    continue
                # two calls under one call_id and two ids are one to the SDK: it keeps the last for the check
                # against the finished item, and refuses the response where that is the other id
                refuses = ", or refuses the response" if name.startswith(f"{kind} call_id") else ""
                self.corrupt(f"the deltas disagree with the final response: it lists {name} twice (places {place} "
                             f"and {position}): the openai SDK hands the app both{refuses}", event,
                             output_index=index, first_place=place, final_place=position)
                return True
        return False

    def _other_kind_or_order(self, streamed: list[tuple[int, int | None, dict[str, Any]]], event: WireEvent) -> bool:
        """The SDK hands the app the final response's list: an item there of another type than the one
        streamed in its place (a message that ends up a function call), or the streamed items in another
        order, is an answer the stream did not show. True when so (corrupt)."""
        before: tuple[int, int] | None = None  # (output_index, place in the list) of the last streamed item listed
        for position, index, item in streamed:
            if index is None:
                continue
            kind, final_kind = as_str(self._items[index].get("type")), as_str(item.get("type"))
            if kind and final_kind and kind != final_kind:
                self.corrupt(f"the deltas disagree with the final response: output item {index} streamed as a {kind} "
                             f"and the final response gives it as a {final_kind}", event, output_index=index,
                             streamed_type=kind, final_type=final_kind)
                return True
            if before is not None and index < before[0]:
                self.corrupt(f"the deltas disagree with the final response: it lists output item {index} (place "
                             f"{position}) after output item {before[0]} (place {before[1]}), in another order than "
                             f"the stream", event, output_index=index, final_place=position)
                return True
            before = (index, position)
        return False

    def _left_out(self, output: list[Any], event: WireEvent) -> None:
        """An item the stream delivered (output_item.done) that the final response's list lacks: the SDK
        hands the app that list (``get_final_response``), so the app loses what the stream showed. An
        item still open was cut: response.incomplete says why, after response.completed it is corrupt already."""
        final_ids = {as_str(item.get("id")) for item in output if isinstance(item, dict)}
        for index in sorted(self._items.keys() - self._open_items):
            kind, item_id = as_str(self._items[index].get("type")), as_str(self._items[index].get("id"))
            if kind is None or (item_id is not None and item_id in final_ids):
                continue
            if self._ids_rotate or item_id is None:
                # ids rotate (GitHub Copilot) or the server sent none: the item's position and type tell
                final = as_dict(output[index]) if index < len(output) else {}
                if final.get("type") == kind:
                    continue
            named = f"{kind} {item_id}" if item_id else kind
            self.corrupt(f"the deltas disagree with the final response: it leaves out output item {index} ({named})",
                         event, output_index=index, item_id=item_id, item_type=kind, final_items=len(output))
            return

    def _agree(self, index: int, item: dict[str, Any], event: WireEvent | None, source: str) -> None:
        """Compare a finished item with the blocks its deltas grew: a difference is corrupt.

        A block the deltas left empty takes the item's value where no event gave it whole before (servers
        that send only the finished item); a reasoning item's ``encrypted_content`` becomes the thinking
        signature."""
        self.flush_text()
        kind = as_str(item.get("type"))
        # block key, field, final value (None: the part names its kind but gives no text), kind of the part
        pairs: list[tuple[Any, str, str | None, BlockKind]] = []
        if kind == "message":
            for ci, part in enumerate(as_list(item.get("content"))):
                part = as_dict(part)
                final = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
                if isinstance(final, str) or part.get("type") in KIND_OF_PART:
                    pairs.append(((index, "content", ci), "text", as_str(final), _final_kind(part, BlockKind.TEXT)))
        elif kind == "reasoning":
            for si, part in enumerate(as_list(item.get("summary"))):
                if isinstance(as_dict(part).get("text"), str):
                    pairs.append(((index, "summary", si), "text", part["text"], BlockKind.THINKING))
            for ci, part in enumerate(as_list(item.get("content"))):
                part = as_dict(part)
                if isinstance(part.get("text"), str) or part.get("type") in KIND_OF_PART:
                    pairs.append(((index, "content", ci), "text", as_str(part.get("text")),
                                  _final_kind(part, BlockKind.THINKING)))
            signature = as_str(item.get("encrypted_content"))
            if signature is not None:
                blocks = [b for (c, k), b in self._keys.items() if c == 0 and k[0] == index]
                if not blocks:
                    blocks = [self.new_block(0, BlockKind.THINKING, (index, "summary", 0))]
                for block in blocks:
                    if block.signature is not None and block.signature != signature:
                        # re-encrypted between output_item.done and the final response: the final one is
                        # what the SDK keeps; the earlier one names the same thinking (see compare_strands)
                        block.extra.setdefault("earlier_signatures", []).append(block.signature)
                    block.signature = signature
        if self._identity_changed(index, item, kind, event, source):
            return
        if kind in CLIENT_CALLS:
            final = item.get("arguments") if kind == "function_call" else item.get("input")
            if isinstance(final, str):
                pairs.append(((index, "args"), "arguments_raw", final, BlockKind.TOOL_CALL))
        if index != self._partial and self._left_out_parts(index, item, kind, event, source):
            return  # (an item begun before a replay's first event has its own rule: only its end is here)
        for key, field, final, new_kind in pairs:
            block = self.block(0, key)
            if block is None:
                if final and new_kind is not BlockKind.TOOL_CALL and (index, key[1]) in self._part_events:
                    # its item's other parts of this kind were streamed: a part only a later copy holds is
                    # that copy saying more than the stream did (the SDK shows it, an event reader never)
                    self.corrupt(f"output item {index} part {key[1]} {key[2]} came only with {source}, though the "
                                 f"item's other {key[1]} parts were streamed", event, output_index=index)
                    return
                if final and new_kind is not BlockKind.TOOL_CALL:
                    # a part only the finished item carries: the SDK shows it, so the turn has it
                    self._given.setdefault(id(self.new_block(0, new_kind, key, text=final)), source)
                    self.note(f"output item {index} part {key[1]} {key[2]} came only with {source}")
                continue
            # the kind first, whatever the value: a refusal part without its string is still a refusal to the SDK
            if self._part_kind_differs(block, new_kind, index, event, source) or final is None:
                continue
            ours, given = getattr(block, field) or "", self._given.get(id(block))
            self._given.setdefault(id(block), source)
            if self._whole(block, field, final):
                continue
            if not ours and given is None:  # nothing gave it whole before: a server that sends only the finished item
                setattr(block, field, self.judge.kept(block, field, final))
                continue
            at = common_prefix(ours, final)
            byte = len(ours[:at].encode("utf-8", "surrogatepass"))
            closed_empty = f": {given} gave it empty" if not ours else ""
            self.corrupt(f"the deltas disagree with {source} at block {block.index}, byte {byte}{closed_empty}", event,
                         block=block.index, output_index=index, byte=byte, streamed=ours[at:at + 40],
                         final=final[at:at + 40])

    def _identity_changed(self, index: int, item: dict[str, Any], kind: str | None, event: WireEvent | None,
                          source: str) -> bool:
        """A finished item whose ``call_id`` differs from its output_item.added's: the SDK fails on it
        ("Completed output item identity changed"), and for a call the app answers it cannot tell which id to
        answer. For a call, a changed ``name`` calls another tool, a changed ``execution`` moves who runs it.
        True when so (corrupt)."""
        added = as_dict(self._items.get(index))
        call = kind in CLIENT_CALLS or kind in CLIENT_ITEMS
        for field in ("call_id", "name", "execution") if call else ("call_id",):
            streamed, finished = as_str(added.get(field)), as_str(item.get(field))
            if streamed and finished and streamed != finished:
                self.corrupt(f"output item {index} ({kind}) was added with {field} {streamed} and {source} gives "
                             f"{finished}: two {'calls' if call else 'items'} in one slot", event, output_index=index,
                             streamed=streamed, final=finished)
                return True
        return False

    def _part_kind_differs(self, block: Block, final_kind: BlockKind, index: int, event: WireEvent | None,
                           source: str) -> bool:
        """A part streamed as one kind (output_text, refusal, reasoning_text) and finished as another: the
        SDK hands the app the finished part, so the app gets a refusal where the stream showed an answer,
        or reasoning where it showed the answer, whatever the text. True when so (corrupt)."""
        if block.kind is final_kind or block.kind not in PART_TYPES or final_kind not in PART_TYPES:
            return False
        streamed, finished = PART_TYPES[block.kind], PART_TYPES[final_kind]
        self.corrupt(f"the deltas disagree with {source} at block {block.index}: the part streamed as {streamed} "
                     f"and {source} gives it as {finished}", event, block=block.index, output_index=index,
                     streamed_type=streamed, final_type=finished)
        return True

    def _left_out_parts(self, index: int, item: dict[str, Any], kind: str | None, event: WireEvent | None,
                        source: str) -> bool:
        """A part whose deltas carried text but that the finished item does not list: the SDK hands the
        app the finished item, so the app never sees that text. True when one was found (corrupt)."""
        listed: dict[str, int | None] = {}  # part family -> how many the item lists; None: it does not say
        if kind == "message":
            listed = {"content": _listed(item.get("content")), "summary": 0}
        elif kind == "reasoning":
            listed = {"content": _listed(item.get("content")), "summary": _listed(item.get("summary"))}
        for (choice, key), block in self._keys.items():
            if choice != 0 or key[0] != index or len(key) != 3 or not block.text:
                continue
            count = listed.get(key[1])
            if count is None or (type(key[2]) is int and 0 <= key[2] < count):
                continue
            part = "summary part" if key[1] == "summary" else "content part"
            self.corrupt(f"the deltas disagree with {source}: it leaves out {part} {key[2]} of output item {index} "
                         f"({kind}), whose deltas carried text", event, output_index=index, part=key[2],
                         streamed=block.text[:40])
            return True
        return False

    # -- content parts ------------------------------------------------------------------
    def _on_response_content_part_added(self, obj, event, t):
        index = self._index(obj, event)
        if index is None or self.reopened(self._part_unit(obj, "content"), "response.content_part.added", event):
            return
        part = as_dict(obj.get("part"))
        kind = _part_kind(part)
        part_type, item_type = as_str(part.get("type")), as_str(as_dict(self._items.get(index)).get("type"))
        if item_type in ("message", "reasoning") and ITEM_OF_PART.get(part_type or "", item_type) != item_type:
            self.corrupt(f"content part {obj.get('content_index', 0)} of output item {index} was added as {part_type}, "
                         f"which a {item_type} item does not hold", event, output_index=index, part_type=part_type,
                         item_type=item_type)
            return
        if index == self._partial:
            if not self._of_partial(index, _family(kind, "content"), event):
                return
            self._partial_made = True
        if self.block(0, (index, "content", obj.get("content_index", 0))) is not None:
            self.corrupt(f"content part {obj.get('content_index', 0)} of output item {index} was added twice", event)
            return
        text = as_str(part.get("text")) or as_str(part.get("refusal")) or ""
        self.new_block(0, kind, (index, "content", obj.get("content_index", 0)), text=text)

    def _part(self, obj, event, kind: BlockKind, sub: str = "content", begins: bool = False) -> Block | None:
        """The block of the event's part; ``begins``: the event adds the part (its text starts here)."""
        index = self._index(obj, event)
        if index is None:
            return None
        self._part_events.add((index, sub))
        number = obj.get("summary_index" if sub == "summary" else "content_index", 0)
        block = self.block(0, (index, sub, number))
        if block is None and index == self._partial:
            if not self._of_partial(index, _family(kind, sub), event):
                return None
            if not self._partial_made and not begins and not self.judge.is_closed(f"output item {index}"):
                self._partial_made = True  # the one part open when the replay started: only its end is here
                return self._partial_block(self.new_block(0, kind, (index, sub, number)))
            self._partial_made = True
        if block is not None and block.kind is not kind and sub == "content" and block.kind in PART_TYPES:
            self.corrupt(f"{obj.get('type')} for content part {number} of output item {index}, which was added as "
                         f"{PART_TYPES[block.kind]}", event, output_index=index, part_type=PART_TYPES[block.kind])
            return None
        if block is None:
            if sub == "summary" or kind is BlockKind.THINKING:
                item_kind = as_str(as_dict(self._items.get(index)).get("type"))
                if item_kind not in (None, "reasoning"):
                    self.corrupt(f"{obj.get('type')} for output item {index}, which was added as a {item_kind}, not a "
                                 "reasoning item", event, output_index=index, item_type=item_kind)
                    return None
                return self.new_block(0, kind, (index, sub, number))  # summaries need no part.added
            self.corrupt(f"{obj.get('type')} for content part {number} of item {index} that was never added", event)
        return block

    def _item_of(self, obj) -> Any:
        """The event's output item: its output_index, else the index its item_id was added at."""
        index = as_int(obj.get("output_index"))
        if index is None:
            index = self._item_index.get(as_str(obj.get("item_id")) or "")
        return index if index is not None else obj.get("item_id")

    def _part_unit(self, obj, sub: str) -> str:
        number = obj.get("summary_index" if sub == "summary" else "content_index", 0)
        what = "summary part" if sub == "summary" else "content part"
        return f"{what} {number} of output item {self._item_of(obj)}"

    def _delta(self, obj, event, t, kind: BlockKind, sub: str = "content") -> None:
        # the widest closed unit is named: the item, else the part, else its text
        item, part, what = f"output item {self._item_of(obj)}", self._part_unit(obj, sub), str(obj.get("type"))
        if self.reopened(item, what, event) or self.reopened(part, what, event) or \
                self.reopened(f"the text of {part}", what, event):
            return
        block = self._part(obj, event, kind, sub)
        if block is not None and isinstance(obj.get("delta"), str):
            if obj["delta"]:
                self.grow(block, "text", obj["delta"])
                self.content(t)

    def _done(self, obj, event, kind: BlockKind, field: str, sub: str = "content") -> None:
        self.flush_text()  # compares with the text the deltas grew
        text_unit = f"the text of {self._part_unit(obj, sub)}"
        if self.reopened(text_unit, str(obj.get("type")), event):
            return
        block = self._part(obj, event, kind, sub)
        self.close_unit(text_unit, str(obj.get("type")), event)
        self._done_text(block, obj.get(field), event, str(obj.get("type")))

    def _done_text(self, block: Block | None, final: Any, event: WireEvent, what: str) -> None:
        """A part's whole text, as a ``.done`` event gives it, against what its deltas grew: a difference
        is corrupt; a block the deltas left empty takes it (some compatible servers send only the .done),
        unless an earlier ``.done`` gave it empty."""
        if block is None or not isinstance(final, str):
            return
        given = self._given.setdefault(id(block), what)
        if self._whole(block, "text", final):
            return
        if block.text or given != what:
            at = common_prefix(block.text, final)
            byte = len(block.text[:at].encode("utf-8", "surrogatepass"))
            closed_empty = f": {given} gave it empty" if not block.text else ""
            self.corrupt(f"the deltas disagree with {what} at block {block.index}, byte {byte}{closed_empty}", event,
                         block=block.index, byte=byte)
        else:
            block.text = self.judge.kept(block, "text", final)

    def _on_response_output_text_delta(self, obj, event, t):
        self._delta(obj, event, t, BlockKind.TEXT)

    def _on_response_output_text_done(self, obj, event, t):
        self._done(obj, event, BlockKind.TEXT, "text")

    def _on_response_refusal_delta(self, obj, event, t):
        self._delta(obj, event, t, BlockKind.REFUSAL)

    def _on_response_refusal_done(self, obj, event, t):
        self._done(obj, event, BlockKind.REFUSAL, "refusal")

    def _on_response_reasoning_text_delta(self, obj, event, t):
        self._delta(obj, event, t, BlockKind.THINKING)

    def _on_response_reasoning_text_done(self, obj, event, t):
        self._done(obj, event, BlockKind.THINKING, "text")

    def _on_response_reasoning_summary_part_added(self, obj, event, t):
        self._part(obj, event, BlockKind.THINKING, "summary", begins=True)

    def _on_response_reasoning_summary_text_delta(self, obj, event, t):
        self._delta(obj, event, t, BlockKind.THINKING, "summary")

    def _on_response_reasoning_summary_text_done(self, obj, event, t):
        self._done(obj, event, BlockKind.THINKING, "text", "summary")

    def _on_response_reasoning_summary_part_done(self, obj, event, t):
        self.flush_text()  # compares with the text the deltas grew
        if self.reopened(self._part_unit(obj, "summary"), "response.reasoning_summary_part.done", event):
            return
        block = self._part(obj, event, BlockKind.THINKING, "summary")
        self.close_unit(self._part_unit(obj, "summary"), "response.reasoning_summary_part.done", event)
        self._done_text(block, as_dict(obj.get("part")).get("text"), event, "response.reasoning_summary_part.done")

    def _on_response_content_part_done(self, obj, event, t):
        self.flush_text()  # compares with the text the deltas grew
        if self.reopened(self._part_unit(obj, "content"), "response.content_part.done", event):
            return
        part = as_dict(obj.get("part"))
        block = self._part(obj, event, _part_kind(part))  # a part made here, in a replay, is of this kind
        self.close_unit(self._part_unit(obj, "content"), "response.content_part.done", event)
        self._done_text(block, part.get("refusal") if part.get("type") == "refusal" else part.get("text"), event,
                        "response.content_part.done")
        annotations = part.get("annotations")
        if block is None or not isinstance(annotations, list):  # (a compatible server may send none)
            return
        streamed, beyond = block.citations, block.extra.get("citations_dropped", 0)  # (what the added events gave)
        if streamed and (len(streamed) + beyond != len(annotations) or annotations[: len(streamed)] != streamed):
            # the final response the app gets is built from the finished part: the added events are not its list
            self.corrupt(f"response.content_part.done lists {len(annotations)} annotation(s) for block {block.index}, "
                         f"not the {len(streamed) + beyond} the annotation.added events gave", event, block=block.index)
        if annotations or streamed:  # the part's whole list, which the added events grew
            self.judge.listed_whole(block, "citations", annotations)

    def _on_response_output_text_annotation_added(self, obj, event, t):
        block = self._part(obj, event, BlockKind.TEXT)
        if block is not None and obj.get("annotation") is not None:
            self.judge.listed(block, "citations", obj["annotation"])

    # -- arguments ------------------------------------------------------------------------
    def _call(self, obj, event, sub: str = "args") -> Block | None:
        index = self._index(obj, event)
        if index is None:
            return None
        block = self.block(0, (index, sub))
        if block is None and index == self._partial and not self.judge.is_closed(f"output item {index}"):  # added before the body
            if not self._of_partial(index, "call" if sub == "args" else "tool", event):
                return None
            self._partial_made = True
            if sub == "args":
                return self._partial_block(self.tool_block(0, (index, sub), id=None, name=None, t=None))
            return self._partial_block(self.new_block(0, BlockKind.SERVER_TOOL, (index, sub), arguments_raw=""))
        if block is None:
            self.corrupt(f"{obj.get('type')} for item {index}, which is not a tool call", event)
        return block

    def _arguments_of(self, obj) -> str:
        """The unit a call's ``.done`` closes: its item's arguments (a custom tool call's input too)."""
        return f"arguments of output item {self._item_of(obj)}"

    def _done_arguments(self, obj, event, sub: str = "args") -> Block | None:
        """The call a ``.done`` of its arguments names, its arguments closed now; None when there is
        no such call, or they were closed already (both said)."""
        self.flush_text()  # the .done is compared with the arguments the deltas grew
        if self.reopened(self._arguments_of(obj), str(obj.get("type")), event):
            return None
        block = self._call(obj, event, sub)
        self.close_unit(self._arguments_of(obj), str(obj.get("type")), event)
        return block

    def _on_response_function_call_arguments_delta(self, obj, event, t):
        if self.reopened(self._arguments_of(obj), str(obj.get("type")), event):
            return
        block = self._call(obj, event)
        if block is not None and isinstance(obj.get("delta"), str):
            self.grow(block, "arguments_raw", obj["delta"])
            self.content(t)

    def _on_response_function_call_arguments_done(self, obj, event, t):
        self._client_call_done(obj, event, obj.get("arguments"))

    _on_response_custom_tool_call_input_delta = _on_response_function_call_arguments_delta

    def _on_response_custom_tool_call_input_done(self, obj, event, t):
        self._client_call_done(obj, event, obj.get("input"))

    def _client_call_done(self, obj, event, final: Any) -> None:
        """A function call's arguments, or a custom tool call's input, given whole by its ``.done``:
        what the deltas grew must be all of it (none at all, as LM Studio sends: the .done gives it)."""
        block = self._done_arguments(obj, event)
        if block is None:
            return
        if isinstance(final, str):
            self._given.setdefault(id(block), str(obj.get("type")))
            if not self._whole(block, "arguments_raw", final):
                if block.arguments_raw:
                    at = common_prefix(block.arguments_raw, final)
                    byte = len(block.arguments_raw[:at].encode("utf-8", "surrogatepass"))
                    self.corrupt(f"the deltas disagree with {str(obj.get('type')).removeprefix('response.')} at block "
                                 f"{block.index}, byte {byte}", event, block=block.index, byte=byte, tool=block.name)
                else:
                    block.arguments_raw = self.judge.kept(block, "arguments_raw", final)
        self._close_call(block)

    def _on_response_mcp_call_arguments_delta(self, obj, event, t):
        if self.reopened(self._arguments_of(obj), str(obj.get("type")), event):
            return
        block = self._call(obj, event, "tool")
        if block is not None and isinstance(obj.get("delta"), str):
            self.grow(block, "arguments_raw", obj["delta"])

    def _on_response_mcp_call_arguments_done(self, obj, event, t):
        block = self._done_arguments(obj, event, "tool")
        if block is not None and isinstance(obj.get("arguments"), str):
            # deltas that grew other arguments: as for a function call's (none at all: the .done gives them)
            if (block.arguments_raw or id(block) in self._partial_blocks) \
                    and not self._whole(block, "arguments_raw", obj["arguments"]):
                self.corrupt(f"the deltas disagree with {obj.get('type')} at block {block.index}", event, block=block.index)
                return
            block.arguments_raw = obj["arguments"]

    # -- usage and verdict ----------------------------------------------------------------
    def _usage(self, raw: dict[str, Any]) -> None:
        usage = self.turn.usage
        usage.raw = raw
        usage.input = as_int(raw.get("input_tokens"))
        usage.output = as_int(raw.get("output_tokens"))
        usage.total = as_int(raw.get("total_tokens"))
        usage.cache_read = as_int(as_dict(raw.get("input_tokens_details")).get("cached_tokens"))
        usage.reasoning = as_int(as_dict(raw.get("output_tokens_details")).get("reasoning_tokens"))

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        self.flush_text()
        if self.terminal_seen and self.judge.error_at is None and self.turn.stop_reason in ("end_turn", "tool_use"):
            for block in self.turn.blocks:
                if block.kind is BlockKind.TOOL_CALL and not block.closed:
                    self.corrupt(f"tool call {block.name} was never finished (no arguments.done / output_item.done)")
                    break
        for block in self.turn.blocks:
            if block.kind is BlockKind.TOOL_CALL and not block.closed and block.arguments is None:
                if block.extra.get("freeform"):
                    block.arguments = block.arguments_raw
                else:
                    parse_arguments(block, block.arguments_raw, lone_surrogates=self.judge)
        turn, verdict = self.verdict(end, expected="response.completed / response.incomplete / response.failed")
        return turn, self._partial_end(self._head(verdict, end), end)

    def _partial_end(self, verdict: Verdict, end: StreamEnd) -> Verdict:
        """A complete (or stopped, or filtered) verdict for a replay that started inside an item is unknown where the body
        cannot vouch for that item: no .done nor finished item gave its text whole (the turn holds
        only its end), or its item id changed, which rotating ids and another answer's events both
        do, and the end of a text cannot tell them apart."""
        if verdict.kind not in VOUCHED:
            return verdict
        if self._partial_blocks:
            why = "nothing in the body gives its text whole: the turn holds only its end"
        elif self._partial_id_change is not None:
            why = self._partial_id_change
        else:
            return verdict
        return Verdict(VerdictKind.UNKNOWN, f"output item {self._partial} began before this replay's first event, and {why}",
                       None, None, {"was": verdict.kind.value, "output_index": self._partial, "end": end.value})

    def _head(self, verdict: Verdict, end: StreamEnd) -> Verdict:
        """A complete verdict for a stream that lacks its ``response.created`` becomes unknown,
        unless the first event's sequence_number (>= 1) shows a ``starting_after`` replay, which
        a request that created the response is not (``may_resume``)."""
        if self._opening is None or self._opening[0] == "response.created":
            return verdict
        kind, number, event = self._opening
        if self._replay():
            self.note(f"the stream starts at sequence_number {number} ({kind}), without response.created: a replay "
                      f"after starting_after={number - 1}, whose earlier events are not in this body")
            return verdict
        if verdict.kind is not VerdictKind.COMPLETE:
            return verdict
        numbered = "without a sequence_number" if number is None else f"at sequence_number {number}"
        why = ("only a starting_after replay starts later, and it numbers its first event 1 or more" if self._may_resume
               else "the request created the response (POST), and only a retrieve (GET, starting_after) replays "
               "from a later event")
        return Verdict(
            VerdictKind.UNKNOWN,
            f"the stream starts with {kind} at seq {event.seq} (byte {event.start}) {numbered}, not with "
            f"response.created: {why}; the events before it may be lost",
            event.seq, event.start,
            {"was": verdict.kind.value, "first_event": kind, "first_sequence_number": number, "end": end.value})

