"""Streams of no known dialect: the framing is judged, the content is not.

Complete framing (every byte formed an event) still cannot say whether a model
finished, so the verdict is ``unknown``; a cut (a ``Tail``) or broken framing is judged
by the session as truncated or corrupt. An error in the shapes every dialect shares is
the provider's own word whatever the dialect, so it is judged: an SSE ``event: error``, an
event-stream ``exception`` or ``error`` frame, a JSON value or an SSE event's data with a
top-level ``error`` (a body that holds only the provider's error, as from an overloaded or
throttled call, shows no dialect of its own: OpenAI, vLLM and Gemini's ``alt=sse`` send theirs as
``data: {"error": ...}``).
"""

from __future__ import annotations

from streamtap.wire import EventStreamMessage, JSONValue, SSEEvent, WireEvent

from .bedrock_converse import exception_error
from .common import AssemblerBase, error_fields, error_fields_of_text, loads
from .turn import Dialect, StreamEnd, Turn, Verdict, VerdictKind


class Assembler(AssemblerBase):
    dialect = Dialect.UNKNOWN

    def feed(self, event: WireEvent, t: float | None) -> None:
        self.seen(event)
        kind = type(event)
        if kind is SSEEvent and event.event == "error":
            self.errored(event, error_fields_of_text(event.data))
        elif kind is EventStreamMessage and event.headers.get(":message-type") in ("exception", "error"):
            exception_error(event, self.judge)
        elif kind is JSONValue and isinstance(event.value, dict) and event.value.get("error"):
            self.errored(event, error_fields(event.value))
        elif kind is SSEEvent and '"error"' in event.data:  # only data that can hold one is parsed
            value = _json_object(event.data)
            if value is not None and value.get("error"):
                self.errored(event, error_fields(value))

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        errored = self.judge.early_verdict() if self.judge.error_at is not None else None
        if errored is not None:
            errored.evidence["end"] = end.value
            return self.turn, errored
        if self.turn.events == 0:
            reason = "no complete event in the body"
            kind = VerdictKind.TRUNCATED if end is not StreamEnd.FINISHED else VerdictKind.UNKNOWN
        else:
            reason = f"framing complete ({self.turn.events} {self.wire} events); the dialect is unknown, so whether the model finished cannot be judged"
            kind = VerdictKind.UNKNOWN
        return self.turn, Verdict(kind, reason, self.last_seq, self.last_offset, {"end": end.value})


def _json_object(text: str) -> dict | None:
    try:
        value = loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
