"""mitmproxy contentviews that show LLM streams frame by frame (mitmweb, mitmproxy, mitmdump).

``application/vnd.amazon.eventstream`` bodies (Bedrock) are binary: without this view
mitmweb shows a hex dump. With it each message is listed with its place in the body,
its headers and its payload as indented JSON; a Bedrock InvokeModel ``chunk`` also shows
the model's own event, base64-decoded from the payload's ``bytes`` field.
``text/event-stream`` bodies are listed event by event with ``data`` as indented JSON,
NDJSON bodies (Ollama's ``application/x-ndjson``, and every other content type the tap reads as
NDJSON) value by value. Bytes that break the framing and a cut last frame are shown where they
occur.

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
import re
from collections.abc import Iterable
from typing import Any

import orjson
from mitmproxy import contentviews
from mitmproxy.contentviews import Contentview, Metadata, SyntaxHighlight

from streamtap.cli import C1_AND_REORDERING
from streamtap.providers.detect import STREAM_CONTENT_TYPES, wire_from_content_type
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


def _content_types(wire: str) -> tuple[str, ...]:
    """The content types the tap reads as ``wire``: a view is chosen for every answer it taps."""
    return tuple(mime for mime in STREAM_CONTENT_TYPES if wire_from_content_type(mime) == wire)


EVENTSTREAM_TYPES = _content_types("eventstream")
SSE_TYPES = _content_types("sse")
NDJSON_TYPES = _content_types("ndjson")
EVENTSTREAM_TYPE, SSE_TYPE = EVENTSTREAM_TYPES[0], SSE_TYPES[0]
MAX_FRAMES_SHOWN = 5000  # past this a body is a bulk transfer, not something to read
# mitmweb renders a view on the event loop that carries the traffic: a body is decoded this much
# at a time, and no further than the frames shown, nor past this many bytes (a body of few frames,
# or of one frame that never ends, would be decoded whole however long), nor past this many lines
# of a line-framed body (a line that makes no frame, such as an unknown SSE field, costs the
# decoder a microsecond: 4 MiB of them took 2.4 s; SSE events take 2 to 4 lines)
DECODE_STEP = 1 << 16
MAX_DECODED = 4 << 20
MAX_LINES_DECODED = 16 * MAX_FRAMES_SHOWN
# The text a view writes, laid out and then escaped whole by mitmproxy on that loop: 0.6-0.75 s
# for 4 Mi characters, half that for 2 Mi (the escaping is slow on text that is not all ASCII).
# Indented JSON is 3 to 18 times its body: the frames shown stop here, well before MAX_DECODED
# (a typical frame lays out to ~500 characters: ~4,000 of them fit)
MAX_TEXT_SHOWN = 2 << 20
# A frame longer than this is shown as it came, and only this much of it: laid out, one such
# frame would make many times its size in text
MAX_LAID_OUT_BYTES = 1 << 20
# Each level of nesting indents every line below it: a value nested deeper is shown as it came,
# so that a frame laid out stays within a small multiple of its bytes (400 levels made 400x, 16 make
# up to 18x); MAX_TEXT_SHOWN bounds the whole
MAX_LAID_OUT_DEPTH = 16
_LAYOUT = json.JSONEncoder(indent=2, ensure_ascii=False)  # json.dumps(value, indent=2, ensure_ascii=False), piece by piece
# Written raw, a JSON escape of one of these (``\u202e`` on the wire) would reorder or hide the
# text around it in mitmweb: they stay escaped, as streamtap's own outputs write them. Only a
# JSON string holds them, so the JSON stays valid
_KEPT_ESCAPED = re.compile(f"[{C1_AND_REORDERING}]")


class _PastTheText(Exception):
    """A frame laid out would take the view's text past MAX_TEXT_SHOWN."""


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


def _laid_out(value: Any, room: int) -> str | None:
    """``value`` as indented JSON; None when nested too deep to lay out. Raises _PastTheText
    when longer than ``room`` characters, having laid out no more than that."""
    if _nested_deeper_than(value, MAX_LAID_OUT_DEPTH):
        return None
    pieces, length = [], 0
    for piece in _LAYOUT.iterencode(value):
        length += len(piece)
        if length > room:
            raise _PastTheText
        pieces.append(piece)
    text = _KEPT_ESCAPED.sub(lambda match: f"\\u{ord(match[0]):04x}", "".join(pieces))
    if len(text) > room:
        raise _PastTheText
    return text


def _pretty_json(text: str | bytes, room: int) -> str | None:
    """JSON text laid out, parsed as the judge parses it (orjson: a lone surrogate escape is no
    JSON there, so the view and ``streamtap show`` agree, and the view's text can be encoded),
    integers past 64 bits exact, as they are in the body."""
    try:
        return _laid_out(exact_loads(text), room)
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


def _decoded(decoder: Any, data: bytes, by_lines: bool) -> tuple[list[WireEvent], int]:
    """The frames of ``data`` up to one past those shown, or in its first ``MAX_DECODED`` bytes
    (and, ``by_lines``, its first ``MAX_LINES_DECODED`` lines), and how many bytes that took."""
    events: list[WireEvent] = []
    decoded = lines = 0
    while decoded < min(len(data), MAX_DECODED) and len(events) <= MAX_FRAMES_SHOWN and lines <= MAX_LINES_DECODED:
        step = data[decoded : decoded + DECODE_STEP]
        events += decoder.feed(step)
        decoded = min(decoded + DECODE_STEP, len(data))
        if by_lines:  # a line ends in LF, CRLF or CR
            lines += max(step.count(b"\n"), step.count(b"\r"))
    if decoded == len(data):
        events += decoder.close()
    return events, decoded


def _render(events: list[WireEvent], data: bytes, noun: str, frame: Any, decoded: int | None = None) -> str:
    decoded = len(data) if decoded is None else decoded
    out = [_summary(events, data, noun, decoded)]
    room = MAX_TEXT_SHOWN  # characters left to write
    for shown, event in enumerate(events):
        if shown == MAX_FRAMES_SHOWN:
            rest = f"{len(events) - shown} more" if decoded == len(data) else \
                f"{len(events) - shown} more, and the {len(data) - decoded} bytes after them not decoded,"
            out.append(f"\n# ... {rest} not shown")
            break
        if room <= 0:
            shown_to = events[shown - 1].end
            out.append(f"\n# ... the text stopped at offset {shown_to} (this view writes at most {MAX_TEXT_SHOWN} "
                       f"characters of a body): the {len(data) - shown_to} bytes from offset {shown_to} on not shown")
            break
        if event.end - event.start > MAX_LAID_OUT_BYTES and not isinstance(event, (Malformed, Tail)):
            lines = _as_it_came(event, f"longer than {MAX_LAID_OUT_BYTES} bytes, not laid out")
        else:
            try:
                lines = _problem(event) or frame(event, room)
            except RecursionError:  # JSON nested past what Python's printer reads: the frame as it came
                lines = _as_it_came(event, "nested too deep to lay out")
            except _PastTheText:  # the last frame shown
                lines, room = _as_it_came(event, f"laid out, past the {MAX_TEXT_SHOWN} characters this view writes"), 0
        out += ["", *lines]
        room -= sum(map(len, lines)) + len(lines) + 1
    else:
        if decoded < len(data):  # stopped by MAX_DECODED or MAX_LINES_DECODED, not by the frames shown
            shown_to = events[-1].end if events else 0
            cap = f"{MAX_DECODED} bytes" if decoded == MAX_DECODED else f"{MAX_LINES_DECODED} lines"
            out.append(f"\n# ... decoding stopped at byte {decoded} (this view decodes at most {cap} "
                       f"of a body): the {len(data) - shown_to} bytes from offset {shown_to} on not shown")
    return "\n".join(out) + "\n"


def _as_it_came(event: WireEvent, why: str) -> list[str]:
    """The frame's bytes as text, no more than ``MAX_LAID_OUT_BYTES`` of them."""
    cut = len(event.raw) - MAX_LAID_OUT_BYTES
    told = f" · {why}, as it came" + (f" (its last {cut} bytes not shown)" if cut > 0 else "") + ":"
    return [_place("frame", event) + told, _indent(event.raw[:MAX_LAID_OUT_BYTES].decode("utf-8", "replace"))]


def eventstream_lines(message: EventStreamMessage, room: int = MAX_TEXT_SHOWN) -> list[str]:
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
            inner = _pretty_json(decoded, room) or repr(decoded)
            payload = {**payload, "bytes": f"<{len(decoded)} bytes, decoded below>"}
    laid_out = _laid_out(payload, room - len(inner or ""))
    if laid_out is None:
        lines += ["payload: |  # nested too deep to lay out, as it came", _indent(message.payload.decode("utf-8"))]
    else:
        lines += ["payload:", _indent(laid_out)]
    if inner is not None:
        lines += ["bytes (base64-decoded):", _indent(inner)]
    return lines


def sse_lines(event: SSEEvent, room: int = MAX_TEXT_SHOWN) -> list[str]:
    lines = [_place("event", event), f"event: {event.event}"]
    if event.id:
        lines.append(f"id: {event.id}")
    if event.retry is not None:
        lines.append(f"retry: {event.retry}")
    if event.invalid_utf8:
        lines.append(f"# {event.invalid_utf8} invalid UTF-8 sequence(s) replaced")
    pretty = _pretty_json(event.data, room) if event.data.lstrip()[:1] in ("{", "[") else None
    if pretty is not None:
        lines += ["data:", _indent(pretty)]
    elif "\n" in event.data:
        lines += ["data: |", _indent(event.data)]
    else:
        lines.append(f"data: {event.data}")
    return lines


def ndjson_lines(value: JSONValue, room: int = MAX_TEXT_SHOWN) -> list[str]:
    parsed = value.value
    if may_hold_long_integer(value.raw):  # the decoder read it with orjson: such an integer came back a double
        try:
            parsed = exact_loads(value.raw)
        except ValueError:
            pass
    laid_out = _laid_out(parsed, room)
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
    by_lines = True  # the decoder's cost is by the line as much as by the byte

    @property
    def name(self) -> str:
        return self.title

    @property
    def syntax_highlight(self) -> SyntaxHighlight:
        return "yaml"

    def frame_lines(self, event: Any, room: int) -> list[str]:
        raise NotImplementedError

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        events, decoded = _decoded(self.decoder(), data, self.by_lines)
        return _render(events, data, self.noun, self.frame_lines, decoded)

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        return 2 if data and metadata.content_type in self.content_types else -1


class EventStreamContentview(_FrameView):
    """AWS event-stream (Bedrock): messages, headers, JSON payloads, InvokeModel chunks decoded."""

    title = "AWS event-stream"
    decoder = EventStreamDecoder
    noun = "message"
    content_types = EVENTSTREAM_TYPES
    by_lines = False  # binary: a newline byte is no line
    frame_lines = staticmethod(eventstream_lines)


class SSEContentview(_FrameView):
    """Server-Sent Events: one block per event, ``data`` as indented JSON where it is JSON."""

    title = "LLM stream SSE"
    decoder = SSEDecoder
    noun = "event"
    content_types = SSE_TYPES
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
