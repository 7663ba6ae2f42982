"""Events the wire decoders return.

Every event knows its place in the byte stream: ``seq`` counts events from 0 in the
order a decoder returns them, ``start``/``end`` are absolute byte offsets and ``raw``
is exactly ``stream[start:end]``.  Spans of successive events tile the stream: an
event's span starts where the previous event's span ended, so bytes that carry no
event of their own (SSE comments and keep-alives, blank JSON lines, a BOM) belong to
the event that follows them.  Concatenating every ``raw`` of one decode, the
``Tail`` included, gives back the input byte for byte, except where a decoder bounds
its memory: a ``Malformed`` oversize event's ``raw`` is empty, and the ``Tail`` after a
fatal error keeps only the first ``max_event_size`` bytes of what followed it (its span
covers them all; its reason says so).

Events are named tuples, not frozen dataclasses: equally immutable, but a decoder can
build one without running Python code (``tuple.__new__(SSEEvent, fields)``, or a whole
batch with ``map`` over zipped columns), and building events is most of the cost of
decoding a typical stream. ``event._replace(...)`` gives a changed copy.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import FramingError

DEFAULT_MAX_EVENT = 16 * 1024 * 1024  # the per-event size limit every decoder applies unless told otherwise


class SSEEvent(NamedTuple):
    """One dispatched Server-Sent Event (WHATWG rules)."""

    seq: int
    start: int
    end: int
    raw: bytes
    event: str  # the type; "message" when the stream named none
    data: str
    id: str  # the last event ID in force at dispatch ("" when none was ever set)
    retry: int | None  # reconnection time set inside this event, if any
    invalid_utf8: int = 0  # sequences that are not UTF-8 in its span's lines (comments and ignored fields too; in values they became U+FFFD)


class EventStreamMessage(NamedTuple):
    """One verified AWS event-stream message (both CRCs checked)."""

    seq: int
    start: int
    end: int
    raw: bytes
    headers: dict[str, Any]
    payload: bytes


class JSONValue(NamedTuple):
    """One complete JSON value: an NDJSON line or a JSON-array element."""

    seq: int
    start: int
    end: int
    raw: bytes
    value: Any


class Malformed(NamedTuple):
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


class Tail(NamedTuple):
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
