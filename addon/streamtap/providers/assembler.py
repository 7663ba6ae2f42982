"""What a provider dialect module provides.

A dialect module turns wire events into a Turn and a Verdict. It sees only events
that decoded cleanly; framing trouble (``Malformed``, ``Tail``), HTTP status, the
end-of-stream kind and the sentinel are judged once, by the session that drives it.

One optional hook: ``tail(event: Tail) -> bool``. The session offers it the leftover
bytes at close; a dialect that can read meaning into them (a final ``data: [DONE]``
without its blank line, an error written as raw JSON) takes them and returns True, and
the session then does not judge them as a cut.
"""

from __future__ import annotations

from typing import Protocol

from streamtap.wire import WireEvent

from .turn import Dialect, StreamEnd, Turn, Verdict


class Assembler(Protocol):
    dialect: Dialect
    wire: str  # the decoder it reads: "sse", "eventstream", "ndjson" or "json-array"

    def feed(self, event: WireEvent, t: float | None) -> None:
        """Take one decoded event (SSEEvent, EventStreamMessage or JSONValue)."""

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        """The turn so far and the verdict from the events alone."""
