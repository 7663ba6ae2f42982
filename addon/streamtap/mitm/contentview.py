"""mitmproxy contentviews that show LLM streams frame by frame (mitmweb, mitmproxy, mitmdump).

``application/vnd.amazon.eventstream`` bodies (Bedrock) are binary: without this view
mitmweb shows a hex dump. With it each message is listed with its place in the body,
its headers and its payload as indented JSON; a Bedrock InvokeModel ``chunk`` also shows
the model's own event, base64-decoded from the payload's ``bytes`` field.
``text/event-stream`` bodies are listed event by event with ``data`` as indented JSON,
``application/x-ndjson`` bodies (Ollama) value by value. Bytes that break the framing
and a cut last frame are shown where they occur.

Wiring (addon/tap.py): ``addons = [Tap(), *(cls() for cls in contentview.ADDONS), ...]``. The addon in
``ADDONS`` registers the three views when mitmproxy loads it; ``register()`` does the same
for other scripts. Both views are chosen automatically by content type and can be
picked by name ("AWS event-stream", "LLM stream SSE", "LLM stream NDJSON"). The names
hold only letters, digits, spaces and hyphens: mitmweb puts the name in a URL path whose
pattern refuses other characters such as parentheses (a 404 when picked).

mitmproxy keeps no body for a streamed response unless ``--set
store_streamed_bodies=true``; start mitmweb with it to see live streams here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import orjson
from mitmproxy import contentviews
from mitmproxy.contentviews import Contentview, Metadata, SyntaxHighlight

from streamtap.wire import (
    EventStreamDecoder,
    EventStreamMessage,
    JSONValue,
    Malformed,
    NDJSONDecoder,
    SSEDecoder,
    SSEEvent,
    Tail,
    WireEvent,
)
from streamtap.wire.partial_json import exact_loads, may_hold_long_integer

EVENTSTREAM_TYPE = "application/vnd.amazon.eventstream"
SSE_TYPE = "text/event-stream"
NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl")
MAX_FRAMES_SHOWN = 5000  # past this a body is a bulk transfer, not something to read
# mitmweb renders a view on the event loop that carries the traffic: a body is decoded this much
# at a time, and no further than the frames shown, nor past this many bytes (a body of few frames,
# or of one frame that never ends, would be decoded whole however long)
DECODE_STEP = 1 << 16
MAX_DECODED = 4 << 20
# A frame longer than this is shown as it came, and only this much of it: laid out, one such
# frame would make many times its size in text
MAX_LAID_OUT_BYTES = 1 << 20
# Each level of nesting indents every line below it: a value nested deeper is shown as it came,
# so that the text laid out stays within a small multiple of the body (400 levels made 400x)
MAX_LAID_OUT_DEPTH = 16


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _nested_deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        members = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if members is None:
            continue
        if depth > limit:
            return True
        stack.extend((member, depth + 1) for member in members)
    return False


def _laid_out(value: Any) -> str | None:
    """``value`` as indented JSON; None when nested too deep to lay out."""
    if _nested_deeper_than(value, MAX_LAID_OUT_DEPTH):
        return None
    return json.dumps(value, indent=2, ensure_ascii=False)


def _pretty_json(text: str | bytes) -> str | None:
    """JSON text laid out, parsed as the judge parses it (orjson: a lone surrogate escape is no
    JSON there, so the view and ``streamtap show`` agree, and the view's text can be encoded),
    integers past 64 bits exact, as they are in the body."""
    try:
        return _laid_out(exact_loads(text))
    except (orjson.JSONDecodeError, ValueError):
        return None


def _header_value(value: Any) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes> {base64.b64encode(value).decode('ascii')}"
    return str(value)


def _place(kind: str, event: WireEvent) -> str:
    return f"# {kind} {event.seq} · offset {event.start} · {event.end - event.start} bytes"


def _problem(event: WireEvent) -> list[str]:
    if isinstance(event, Malformed):
        stop = "decoding stopped here" if event.fatal else "skipped"
        return [
            f"# !! malformed at offset {event.start} ({len(event.raw)} bytes): {event.error.message} "
            f"at byte {event.error.offset}, {stop}",
            f"#    {event.raw[:80]!r}{' ...' if len(event.raw) > 80 else ''}",
        ]
    if isinstance(event, Tail):
        return [
            f"# !! the body ends inside a frame: {len(event.raw)} bytes at offset {event.start} "
            f"formed no frame ({event.reason})",
            f"#    {event.raw[:80]!r}{' ...' if len(event.raw) > 80 else ''}",
        ]
    return []


def _summary(events: list[WireEvent], data: bytes, noun: str, decoded: int) -> str:
    frames = sum(1 for e in events if not isinstance(e, (Malformed, Tail)))
    problems = sum(1 for e in events if isinstance(e, (Malformed, Tail)))
    line = f"# {frames} {noun}{'s' if frames != 1 else ''}, {len(data)} bytes"
    if decoded < len(data):
        line = f"# {frames} {noun}{'s' if frames != 1 else ''} in the first {decoded} of {len(data)} bytes"
    if problems:
        line += f", {problems} framing problem{'s' if problems != 1 else ''} (marked !!)"
    return line


def _decoded(decoder: Any, data: bytes) -> tuple[list[WireEvent], int]:
    """The frames of ``data`` up to one past those shown, or in its first ``MAX_DECODED`` bytes,
    and how many bytes that took."""
    events: list[WireEvent] = []
    decoded = 0
    while decoded < min(len(data), MAX_DECODED) and len(events) <= MAX_FRAMES_SHOWN:
        events += decoder.feed(data[decoded : decoded + DECODE_STEP])
        decoded = min(decoded + DECODE_STEP, len(data))
    if decoded == len(data):
        events += decoder.close()
    return events, decoded


def _render(events: list[WireEvent], data: bytes, noun: str, frame: Any, decoded: int | None = None) -> str:
    decoded = len(data) if decoded is None else decoded
    out = [_summary(events, data, noun, decoded)]
    for shown, event in enumerate(events):
        if shown == MAX_FRAMES_SHOWN:
            rest = f"{len(events) - shown} more" if decoded == len(data) else \
                f"{len(events) - shown} more, and the {len(data) - decoded} bytes after them not decoded,"
            out.append(f"\n# ... {rest} not shown")
            break
        out.append("")
        if event.end - event.start > MAX_LAID_OUT_BYTES and not isinstance(event, (Malformed, Tail)):
            out += _as_it_came(event, f"longer than {MAX_LAID_OUT_BYTES} bytes, not laid out")
            continue
        try:
            out.extend(_problem(event) or frame(event))
        except RecursionError:  # JSON nested past what Python's printer reads: the frame as it came
            out += _as_it_came(event, "nested too deep to lay out")
    else:
        if decoded < len(data):  # stopped by MAX_DECODED, not by the frames shown
            shown_to = events[-1].end if events else 0
            out.append(f"\n# ... decoding stopped at byte {decoded} (this view decodes at most {MAX_DECODED} "
                       f"bytes of a body): the {len(data) - shown_to} bytes from offset {shown_to} on not shown")
    return "\n".join(out) + "\n"


def _as_it_came(event: WireEvent, why: str) -> list[str]:
    """The frame's bytes as text, no more than ``MAX_LAID_OUT_BYTES`` of them."""
    cut = len(event.raw) - MAX_LAID_OUT_BYTES
    told = f" · {why}, as it came" + (f" (its last {cut} bytes not shown)" if cut > 0 else "") + ":"
    return [_place("frame", event) + told, _indent(event.raw[:MAX_LAID_OUT_BYTES].decode("utf-8", "replace"))]


def eventstream_lines(message: EventStreamMessage) -> list[str]:
    lines = [_place("message", message)]
    lines += [f"{name}: {_header_value(value)}" for name, value in message.headers.items()]
    if not message.payload:
        return lines
    try:
        payload = orjson.loads(message.payload)
    except orjson.JSONDecodeError:
        try:
            text = message.payload.decode("utf-8")
        except UnicodeDecodeError:
            text = repr(message.payload)
        lines += ["payload: |", _indent(text)]
        return lines
    inner = None
    if isinstance(payload, dict) and isinstance(payload.get("bytes"), str):
        # Bedrock InvokeModel: the model's own event travels base64-encoded in "bytes".
        try:
            decoded = base64.b64decode(payload["bytes"], validate=True)
        except ValueError:
            decoded = None
        if decoded is not None:
            inner = _pretty_json(decoded) or repr(decoded)
            payload = {**payload, "bytes": f"<{len(decoded)} bytes, decoded below>"}
    laid_out = _laid_out(payload)
    if laid_out is None:
        lines += ["payload: |  # nested too deep to lay out, as it came", _indent(message.payload.decode("utf-8"))]
    else:
        lines += ["payload:", _indent(laid_out)]
    if inner is not None:
        lines += ["bytes (base64-decoded):", _indent(inner)]
    return lines


def sse_lines(event: SSEEvent) -> list[str]:
    lines = [_place("event", event), f"event: {event.event}"]
    if event.id:
        lines.append(f"id: {event.id}")
    if event.retry is not None:
        lines.append(f"retry: {event.retry}")
    if event.invalid_utf8:
        lines.append(f"# {event.invalid_utf8} invalid UTF-8 sequence(s) replaced")
    pretty = _pretty_json(event.data) if event.data.lstrip()[:1] in ("{", "[") else None
    if pretty is not None:
        lines += ["data:", _indent(pretty)]
    elif "\n" in event.data:
        lines += ["data: |", _indent(event.data)]
    else:
        lines.append(f"data: {event.data}")
    return lines


def ndjson_lines(value: JSONValue) -> list[str]:
    parsed = value.value
    if may_hold_long_integer(value.raw):  # the decoder read it with orjson: such an integer came back a double
        try:
            parsed = exact_loads(value.raw)
        except ValueError:
            pass
    laid_out = _laid_out(parsed)
    if laid_out is None:
        return [_place("line", value) + " · nested too deep to lay out, as it came",
                value.raw.decode("utf-8", "replace").rstrip("\r\n")]
    return [_place("line", value), laid_out]


class _FrameView(Contentview):
    """A stream body listed frame by frame: the subclass names the decoder, the frame's noun,
    how one frame is shown and the content types it is chosen for."""

    title: str
    decoder: type[EventStreamDecoder | SSEDecoder | NDJSONDecoder]
    noun: str
    content_types: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.title

    @property
    def syntax_highlight(self) -> SyntaxHighlight:
        return "yaml"

    def frame_lines(self, event: Any) -> list[str]:
        raise NotImplementedError

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        events, decoded = _decoded(self.decoder(), data)
        return _render(events, data, self.noun, self.frame_lines, decoded)

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        return 2 if data and metadata.content_type in self.content_types else -1


class EventStreamContentview(_FrameView):
    """AWS event-stream (Bedrock): messages, headers, JSON payloads, InvokeModel chunks decoded."""

    title = "AWS event-stream"
    decoder = EventStreamDecoder
    noun = "message"
    content_types = (EVENTSTREAM_TYPE,)
    frame_lines = staticmethod(eventstream_lines)


class SSEContentview(_FrameView):
    """Server-Sent Events: one block per event, ``data`` as indented JSON where it is JSON."""

    title = "LLM stream SSE"
    decoder = SSEDecoder
    noun = "event"
    content_types = (SSE_TYPE,)
    frame_lines = staticmethod(sse_lines)


class NDJSONContentview(_FrameView):
    """Newline-delimited JSON (Ollama): one indented value per line."""

    title = "LLM stream NDJSON"
    decoder = NDJSONDecoder
    noun = "value"
    content_types = NDJSON_TYPES
    frame_lines = staticmethod(ndjson_lines)


VIEWS: tuple[Contentview, ...] = (EventStreamContentview(), SSEContentview(), NDJSONContentview())


def register(views: Iterable[Contentview] = VIEWS) -> None:
    """Add the views to mitmproxy's registry (idempotent: a view replaces its namesake)."""
    for view in views:
        contentviews.add(view)


class StreamContentviews:
    """The addon form of ``register()``, for an ``addons`` list."""

    def load(self, loader: Any) -> None:
        register()


ADDONS = [StreamContentviews]  # classes: addon/tap.py instantiates them
