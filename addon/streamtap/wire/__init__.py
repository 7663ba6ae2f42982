"""Sans-IO wire decoders: bytes in, events out, identical for any chunking.

Each decoder has ``feed(data) -> list[event]`` and ``close() -> list[event]``. They do no
I/O and know nothing of mitmproxy; bad input is reported as ``Malformed``/``Tail``
events carrying typed ``FramingError``s, never raised.
"""

from .errors import (
    DuplicateHeader,
    FramingError,
    InvalidHeaders,
    InvalidJSON,
    InvalidMessageLength,
    LongIdleRun,
    MessageCRCMismatch,
    OversizeError,
    PreludeCRCMismatch,
)
from .events import DEFAULT_MAX_EVENT, EventStreamMessage, JSONValue, Malformed, SSEEvent, Tail, WireEvent
from .eventstream import EventStreamDecoder, Int8, Int16, Int32, Int64, Timestamp, encode_message
from .jsonlines import JSONArrayDecoder, NDJSONDecoder
from .partial_json import IncrementalJSON, JSONIncomplete
from .sse import SSEDecoder

__all__ = [
    "DEFAULT_MAX_EVENT",
    "DuplicateHeader",
    "EventStreamDecoder",
    "EventStreamMessage",
    "FramingError",
    "IncrementalJSON",
    "Int16",
    "Int32",
    "Int64",
    "Int8",
    "InvalidHeaders",
    "InvalidJSON",
    "InvalidMessageLength",
    "JSONArrayDecoder",
    "JSONIncomplete",
    "JSONValue",
    "LongIdleRun",
    "Malformed",
    "MessageCRCMismatch",
    "NDJSONDecoder",
    "OversizeError",
    "PreludeCRCMismatch",
    "SSEDecoder",
    "SSEEvent",
    "Tail",
    "Timestamp",
    "WireEvent",
    "encode_message",
]
