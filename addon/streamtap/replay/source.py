"""What replay serves: one recorded exchange, reduced to the parts a server needs.

A ``Source`` is built from a recording file (``load_source``) or directly from bytes
(``Source.from_frames``, used by tests and the fault catalog). It keeps the request that
was answered (for matching), the response status and headers, the body as a list of
frames that tile it, and the network reads (offset, length, arrival) that give the
original chunking and timing.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from streamtap.recording import check_recording, read_recording
from streamtap.recording.catalog import is_partial
from streamtap.recording.content import WireBodyCheck, content_encoded, decoded_body
from streamtap.wire.errors import FramingError
from streamtap.wire.eventstream import parse_headers


@dataclass(slots=True, frozen=True)
class Frame:
    seq: int | None  # None for tail bytes that never formed an event
    raw: bytes
    t_ms: float


@dataclass(slots=True)
class Source:
    path: str
    method: str
    url: str
    request_body: Any  # the decoded JSON request body, or None
    status: int
    headers: list[tuple[str, str]]
    frames: list[Frame]
    reads: list[tuple[int, int, float]] = field(default_factory=list)
    wire: str = "sse"
    dialect: str = "unknown"
    request_headers: dict[str, str] = field(default_factory=dict)  # lower-case names, as recorded (redacted)
    # "abort" when the recorded upstream was reset, or when the file has no end line (a killed
    # proxy's leftover: its client got no clean end either): replay reproduces it
    end_style: str = "clean"
    # what ``streamtap verify`` finds wrong with the file it came from (empty: nothing), when it
    # was loaded with ``check=True``; None when not checked
    problems: list[str] | None = None
    whole: bool = True  # its end line is there and it was renamed: no killed proxy's leftover
    # when the recorded body ended (the end line's duration_ms): it may come well after the last
    # read (a late chunked terminator, FIN or reset), and replay's timed modes keep that wait.
    # None when the file does not say (a leftover without an end line, or a constructed source)
    duration_ms: float | None = None
    # how the proxy judged the answer, from the recording's header: a verdict on the body served
    # (the sweep's) must judge with them, as `streamtap verify` does
    sentinel: str | None = None
    max_event_size: int | None = None  # None: the default
    streamed: bool = True  # false: a plain JSON answer a filter tapped
    # the names the recorder redacted besides its patterns, and those it left alone (its
    # streamtap_redact options): a request is masked and shown as it was recorded
    redact: tuple[str, ...] = ()
    redact_allow: tuple[str, ...] = ()
    _body: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def body(self) -> bytes:
        if self._body is None:
            self._body = b"".join(f.raw for f in self.frames)
        return self._body

    @property
    def path_and_query(self) -> str:
        parts = split_target(self.url)
        return parts.path + (f"?{parts.query}" if parts.query else "") or "/"

    @classmethod
    def from_frames(
        cls,
        raws: list[bytes],
        *,
        wire: str = "sse",
        dialect: str = "unknown",
        gap_ms: float = 0.0,
        method: str = "POST",
        url: str = "http://127.0.0.1/",
        request_body: Any = None,
        status: int = 200,
        headers: list[tuple[str, str]] | None = None,
        path: str = "<constructed>",
    ) -> Source:
        frames = [Frame(i, raw, i * gap_ms) for i, raw in enumerate(raws)]
        if headers is None:
            headers = [("content-type", CONTENT_TYPES.get(wire, "application/octet-stream"))]
        return cls(path, method, url, request_body, status, headers, frames, [], wire, dialect)


CONTENT_TYPES = {
    "sse": "text/event-stream",
    "eventstream": "application/vnd.amazon.eventstream",
    "ndjson": "application/x-ndjson",
    "json-array": "application/json",
}


class RecordingError(ValueError):
    """A file that cannot be served: not a recording, or unreadable."""


def load_source(path: str | Path, *, check: bool = False) -> Source:
    """Read a streamtap recording (JSONL) into a Source; with ``check``, also what verify finds
    wrong with the file (``Source.problems``), from the same reading."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(mode):
        raise RecordingError(f"{path}: a folder; give one recording")
    if not stat.S_ISREG(mode):  # refused before opening: a fifo would wait for a writer, a device never end
        raise RecordingError(f"{path}: not a regular file (a fifo, device or socket holds no recording)")
    try:
        rec = read_recording(path)
        problems = check_recording(rec) if check else None
    except IsADirectoryError:
        raise RecordingError(f"{path}: a folder; give one recording") from None
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # a damaged file breaks the reader in several ways (RecordingError, base64)
        message = str(exc)
        raise RecordingError(message if message.startswith(str(path)) else f"{path}: {message}") from exc
    unservable = _coding_not_undone(rec)
    if unservable:
        raise RecordingError(f"{path}: cannot be served: {unservable} (replay serves the decoded body, without "
                             "Content-Encoding: it would be an answer the client never got)")
    frames = []
    last_t = 0.0
    for segment in rec.segments:
        last_t = float(segment.t_ms) if segment.t_ms is not None else last_t
        frames.append(Frame(segment.seq if segment.kind == "frame" else None, segment.raw, last_t))
    reads = [(o, n, float(t) if t is not None else 0.0) for o, n, t in rec.reads]
    source = _source_from_header(path, rec.header, frames, reads)
    source.problems = problems
    # a file cut after its end line (a zstd frame cut in its checksum) is a killed proxy's leftover too
    cut = rec.end is None or rec.problem is not None
    source.whole = not cut and not is_partial(path)
    source.duration_ms = _recorded_duration(rec.end)
    if cut or rec.end.get("stream_end") in CUT_ENDS:
        source.end_style = "abort"
    return source


# The recorded ends whose client got a cut body: the upstream's reset, or mitmproxy's own end (a
# kill, a body over body_size_limit). A body the client itself left ends as recorded.
CUT_ENDS = ("upstream_reset", "proxy_ended")


def _recorded_duration(end: dict | None) -> float | None:
    """The end line's ``duration_ms`` when it is a usable time (a finite number, not negative),
    else None: replay holds the body's end until it, and only a time can be waited for."""
    value = (end or {}).get("duration_ms")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _coding_not_undone(rec: Any) -> str | None:
    """Why a content-encoded recording's body is not its wire bytes decoded (the coding could
    not be undone, or the body differs), as ``streamtap verify`` finds it; None when it is, or
    when the body was not content-encoded. A file cut short keeps its body and wire apart by a
    few lines, so only a failed decoding counts there."""
    if not rec.encoded:
        return None
    check = WireBodyCheck(rec.content_encoding)
    wire, at = rec.wire, 0
    for _, length, _ in rec.reads:  # read by read, as the Tap decoded them
        check.wire(wire[at : at + length])
        at += length
    check.body(rec.body)
    problem = check.problem()
    return problem if problem and (check.undo.failure or rec.complete_file) else None


def _source_from_header(path: Path, header: dict, frames: list[Frame], reads: list) -> Source:
    request = header.get("request") or {}
    response = header.get("response") or {}
    redaction = header.get("redaction") if isinstance(header.get("redaction"), dict) else {}
    body = request.get("body")
    if body is None and "body_b64" in request:  # a request body that is not JSON
        body = _recorded_body_as_read(request)
    headers = response.get("headers") or []
    if isinstance(headers, dict):
        headers = list(headers.items())
    headers = [(str(k), str(v)) for k, v in headers]
    for name, value in headers:
        if _LINE_BREAKING.search(name + value):
            # served as recorded, it would end the header line early: a header of its own, a body
            raise RecordingError(f"{path}: line 1 is damaged: the response header {name!r}: {value[:40]!r} "
                                 "holds a CR, LF or NUL, which no HTTP header carries")
    return Source(
        path=str(path),
        method=str(request.get("method", "POST")).upper(),
        url=str(request.get("url", "/")),
        request_body=body,
        status=_recorded_status(path, response),
        headers=headers,
        frames=frames,
        reads=reads,
        wire=_wire_format(header.get("wire")),
        dialect=str(header.get("dialect") or "unknown"),
        request_headers=_header_dict(request.get("headers")),
        sentinel=header.get("sentinel"),  # (the reader checked these fields' types)
        max_event_size=header.get("max_event_size") or None,
        streamed=header.get("streamed") is not False,
        redact=_names(redaction.get("redact")),
        redact_allow=_names(redaction.get("redact_allow")),
    )


def _names(value: Any) -> tuple[str, ...]:
    return tuple(name for name in value if isinstance(name, str)) if isinstance(value, list) else ()


def _recorded_body_as_read(request: dict) -> bytes:
    """A recorded ``body_b64`` as its server read it, decoded from its Content-Encoding, which is how
    a live request is compared (replay/server.py, mitm/replay.py). A recording written before the
    recorder decoded such bodies (no ``body_decoded_from``) holds them compressed, as sent: they are
    decoded here; bytes whose coding cannot be undone stay as they are."""
    raw = base64.b64decode(request["body_b64"])
    if "body_decoded_from" in request:
        return raw
    encoding = _content_encoding(request.get("headers"))
    if not content_encoded(encoding):
        return raw
    decoded = decoded_body(raw, encoding)
    return raw if decoded is None else decoded


def _content_encoding(headers: Any) -> str | None:
    """The recorded request's Content-Encoding, its codings in the order applied, also when they
    were sent on several header lines (all of them apply, RFC 9110 §5.3)."""
    if isinstance(headers, dict):
        headers = headers.items()
    codings = [str(v) for k, v in (headers or []) if str(k).lower() == "content-encoding"]
    return ", ".join(codings) or None


_LINE_BREAKING = re.compile(r"[\r\n\0]")


def _recorded_status(path: Path, response: dict) -> int:
    """The status to serve: ``status``, else ``status_code``, the first that is not null (the
    reader takes null as absent); 200 when neither is given. One that no HTTP response carries
    cannot be served: the file is damaged."""
    for name in ("status", "status_code"):
        value = response.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
            raise RecordingError(f"{path}: line 1 is damaged: {name!r} is {json.dumps(value)[:40]}, not an HTTP status")
        return value
    return 200


def _wire_format(wire: Any) -> str:
    if isinstance(wire, dict):
        wire = wire.get("format")
    return str(wire or "sse")


def _header_dict(headers: Any) -> dict[str, str]:
    if isinstance(headers, dict):
        headers = headers.items()
    return {str(k).lower(): str(v) for k, v in (headers or [])}


# --- looking inside one frame (where corrupt:field=payload flips a byte) -----------------------
# (what the payload means, e.g. for protocol-aware cut positions, is the providers layer's business)


@dataclass(slots=True)
class FrameView:
    """What one frame says: its name (SSE event / event-stream event type / JSON "type")
    and its JSON payload, if any."""

    name: str
    data: Any
    payload_start: int  # where the payload sits inside raw (for corrupt/cut positions)
    payload_end: int
    headers_length: int = 0  # event-stream only


def view_frame(raw: bytes, wire: str) -> FrameView:
    if wire == "eventstream":
        return _view_eventstream(raw)
    if wire == "sse":
        return _view_sse(raw)
    start = len(raw) - len(raw.lstrip())
    if wire == "json-array" and raw[start : start + 1] in (b"[", b","):  # the element after its opener
        start += 1
        start += len(raw[start:]) - len(raw[start:].lstrip())
    text = raw[start:].rstrip()
    data = _json_or_none(text)
    name = data.get("type", "") if isinstance(data, dict) else ""
    return FrameView(str(name), data, start, start + len(text))


def _view_sse(raw: bytes) -> FrameView:
    name = ""
    data_lines = []
    payload_start = payload_end = None
    for found in _SSE_LINE.finditer(raw):  # each line where it is in the frame (a search could find its text earlier)
        line, at = found.group(), found.start()
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            value, at = line[5:], at + 5
            if value.startswith(b" "):
                value, at = value[1:], at + 1
            data_lines.append(value)
            if payload_start is None:
                payload_start = at
            payload_end = at + len(value)
    text = b"\n".join(data_lines)
    data = _json_or_none(text)
    if text.strip() == b"[DONE]":
        data = "[DONE]"
        name = name or "[DONE]"
    if not name and isinstance(data, dict):
        name = str(data.get("type", "") or "")
    if payload_start is None:
        payload_start = payload_end = 0
    return FrameView(name, data, payload_start, payload_end)


_SSE_LINE = re.compile(rb"[^\r\n]+")  # (empty lines carry nothing a view names)


def _view_eventstream(raw: bytes) -> FrameView:
    if len(raw) < 16:
        return FrameView("", None, 0, len(raw))
    total, headers_length = struct.unpack(">II", raw[:8])
    headers = _eventstream_headers(raw[12 : 12 + headers_length])
    payload_start, payload_end = 12 + headers_length, min(total, len(raw)) - 4
    payload = raw[payload_start:payload_end]
    name = headers.get(":event-type") or headers.get(":exception-type") or headers.get(":error-code") or ""
    data = _json_or_none(payload)
    return FrameView(str(name), data, payload_start, payload_end, headers_length)


def _eventstream_headers(block: bytes) -> dict[str, Any]:
    try:
        return parse_headers(block)
    except FramingError:  # a damaged header block names nothing
        return {}


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def split_target(target: str) -> SplitResult:
    """A request target (or a recorded URL) split as urlsplit does, also one whose host has an
    unbalanced ``[`` or ``]``, which urlsplit refuses: h11 takes such a target, and the Tap records
    such a URL as the client's ``Host`` header gave it. The host plays no part in matching, and a
    bracket in the path or query is read back by the unquoting that follows."""
    try:
        return urlsplit(target)
    except ValueError:
        return urlsplit(target.replace("[", "%5B").replace("]", "%5D"))
