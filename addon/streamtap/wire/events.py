"""Events the wire decoders return.

Every event knows its place in the byte stream: ``seq`` counts events from 0 in the
order a decoder returns them, ``start``/``end`` are absolute byte offsets and ``raw``
is exactly ``stream[start:end]``.  Spans of successive events tile the stream: an
event's span starts where the previous event's span ended, so bytes that carry no
event of their own (SSE comments and keep-alives, blank JSON lines, a BOM) belong to
the event that follows them.  Concatenating every ``raw`` of one decode, the
``Tail`` included, gives back the input byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import FramingError

DEFAULT_MAX_EVENT = 16 * 1024 * 1024  # the per-event size limit every decoder applies unless told otherwise


@dataclass(slots=True, frozen=True)
class SSEEvent:
    """One dispatched Server-Sent Event (WHATWG rules)."""

    seq: int
    start: int
    end: int
    raw: bytes
    event: str  # the type; "message" when the stream named none
    data: str
    id: str  # the last event ID in force at dispatch ("" when none was ever set)
    retry: int | None  # reconnection time set inside this event, if any
    invalid_utf8: int = 0  # how many replacement characters decoding had to insert


@dataclass(slots=True, frozen=True)
class EventStreamMessage:
    """One verified AWS event-stream message (both CRCs checked)."""

    seq: int
    start: int
    end: int
    raw: bytes
    headers: dict[str, Any]
    payload: bytes


@dataclass(slots=True, frozen=True)
class JSONValue:
    """One complete JSON value: an NDJSON line or a JSON-array element."""

    seq: int
    start: int
    end: int
    raw: bytes
    value: Any


@dataclass(slots=True, frozen=True)
class Malformed:
    """Bytes that break the framing rules.

    ``fatal`` says whether the decoder stopped here (event-stream, JSON array) or
    skipped the bad unit and carried on (an SSE or NDJSON line over the size limit,
    an NDJSON line that is not JSON).
    """

    seq: int
    start: int
    end: int
    raw: bytes
    error: FramingError
    fatal: bool


@dataclass(slots=True, frozen=True)
class Tail:
    """Bytes left over at ``close()``: an event that the stream never finished.

    ``reason`` says what was missing (e.g. "no blank line after the last event",
    "message needs 412 bytes, 97 arrived", "decoder stopped at an error").
    """

    seq: int
    start: int
    end: int
    raw: bytes
    reason: str
    # False when the leftover bytes could never have formed an event (trailing SSE
    # comments or data-less events, blank lines, whitespace after a JSON array's
    # closing bracket): the stream was not cut, it merely had padding at the end.
    cut: bool = True


WireEvent = SSEEvent | EventStreamMessage | JSONValue | Malformed | Tail
