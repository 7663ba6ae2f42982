"""What a provider dialect module provides.

A dialect module turns wire events into a Turn and a Verdict. It sees only events
that decoded cleanly; framing trouble (``Malformed``, ``Tail``), HTTP status, the
end-of-stream kind and the sentinel are judged once, by the session that drives it.

One optional hook: ``tail(event: Tail) -> bool``. The session offers it the leftover
bytes at close; a dialect that can read meaning into them (an error written as raw JSON
without SSE framing) takes them and returns True, and the session then does not judge
them as a cut. A terminal signal in the leftover bytes is never taken: that event was
not dispatched, so the stream is ``truncated`` (the session says the terminal event
arrived but was never ended), unless the SDK reads it (``sdk_reads_an_unended_last_line``,
below). Findings and verdicts go through ``judge.Judge``.

One optional flag: ``sdk_dispatches_empty_events``. A dialect whose SDK reads SSE with the
decoder the openai and anthropic SDKs share sets it; the session then feeds it, in stream
order, an ``SSEEvent`` with empty data and an empty span (``start == end``, at the blank
line) for each blank line where that decoder dispatches and the HTML rules do not
(``SSEDecoder.empty_dispatches``), so the dialect judges what its SDK would have seen.

One optional fact, asked once ``finish`` has judged an answer that ended: ``sdk_stopped_reading``.
True where the dialect's SDK stopped reading the body at an event that arrived (Chat Completions'
``[DONE]``), so the app never saw how the body ended after it. Without it the SDK reads the body to
its end, and a body cut before its HTTP end (``upstream_reset``, ``proxy_ended``) makes it raise:
the session judges that answer ``truncated`` (``content_complete`` in the evidence). One more,
``sdk_ignores_content_length``: True where the SDK takes a body that stops short of its
Content-Length for its end (botocore reads with urllib3's ``enforce_content_length`` off), so
such a cut after the end signal cost the app nothing (``StreamSession.close(length_framed=)``).

One optional method, ``asked(body)``: the request's JSON body, given before the answer is fed
where it is known (live, on import, from a recording's header), for a dialect that reads the answer
against what the request asked for (Chat Completions notes a usage chunk or choices it asked for
and did not get).

One optional fact, asked at close of an SSE or NDJSON stream: ``sdk_reads_an_unended_last_line``.
True where the dialect's SDK, at the end of the body, reads the last line even without its line end
(and, on SSE, dispatches the data it gathered without the blank line): google-genai on ``alt=sse``,
the ollama client (httpx ``iter_lines``). Where that last event would have finished the turn and the
body ended cleanly (``finished``), the session then feeds it to the assembler, and the answer keeps
its verdict with a note (``body_ended_without_line_end`` in the evidence); a body cut before its end
is still ``truncated``. The openai and anthropic SDKs drop an event never ended by a blank line.
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
