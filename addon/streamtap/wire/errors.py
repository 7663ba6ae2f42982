"""Typed framing errors. Every error names the absolute byte offset where it was found."""

from __future__ import annotations


class FramingError(ValueError):
    """The bytes do not follow the wire format."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} (at byte {offset})")
        self.message = message
        self.offset = offset

    # Equal by value, so events carrying errors compare equal across decodes (the
    # chunking-invariance tests compare whole event lists).
    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return (self.message, self.offset) == (other.message, other.offset)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.message, self.offset))

    # Rebuilt from both fields: a session is copied mid-stream (fault positions), events and all
    def __reduce__(self) -> tuple:
        return type(self), (self.message, self.offset)


class OversizeError(FramingError):
    """A line, event or message is larger than the decoder's per-event limit."""


class LongIdleRun(FramingError):
    """Not an error of the stream: SSE comments or blank lines alone (keep-alives) that run on past
    the per-event limit between two events. The SSE rules skip them; they are reported apart,
    their bytes not kept, so the event after them is judged as it came."""


# AWS event-stream
class PreludeCRCMismatch(FramingError):
    """The prelude CRC does not match the first 8 bytes of the message."""


class MessageCRCMismatch(FramingError):
    """The message CRC does not match the message bytes."""


class InvalidMessageLength(FramingError):
    """The total or headers length in the prelude is impossible."""


class InvalidHeaders(FramingError):
    """A header name, type or value does not fit the header block."""


class DuplicateHeader(InvalidHeaders):
    """The same header name appears twice in one message."""


# JSON framings (NDJSON, JSON array)
class InvalidJSON(FramingError):
    """A line or array element is not valid JSON."""
