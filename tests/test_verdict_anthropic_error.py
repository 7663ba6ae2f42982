"""An SSE event named ``error`` fails an Anthropic stream by its name, whatever its data holds.

provider-streams.md §3.4: ``event: error`` means ERRORED, and the anthropic SDK raises on the
SSE event name (``if sse.event == "error"``), before it reads any JSON type. A stream that goes
on to message_delta/message_stop after such an event is not complete.
"""

from __future__ import annotations

import base64
import json

import anthropic
import pytest
from test_providers_anthropic import START, LoopbackServer, end, loopback, sdk_final_message, sse, text_block  # noqa: F401 (loopback: a fixture)

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import encode_message

HEAD = sse(START, *text_block(0, "Hi"))
TAIL = sse(*end("end_turn"))
OVERLOADED = {"type": "overloaded_error", "message": "Overloaded"}



def error_event(data: str) -> bytes:
    return f"event: error\ndata: {data}\n\n".encode()


def test_error_event_without_json_type_is_errored(loopback: LoopbackServer) -> None:
    """The audit's body: no "type":"error" in the data, then a clean end."""
    body = HEAD + error_event(json.dumps({"error": OVERLOADED})) + TAIL
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert analysis.verdict.reason == "stream error overloaded_error: Overloaded"
    assert analysis.verdict.offset == len(HEAD)
    assert analysis.turn.error["type"] == "overloaded_error"
    assert analysis.turn.text() == "Hi"
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):  # the SDK fails it too
        sdk_final_message(loopback, body)


@pytest.mark.parametrize("data, message", [
    ("upstream overloaded, try again", "upstream overloaded, try again"),
    ("", None),
    (json.dumps({"error": "Overloaded"}), "Overloaded"),
    (json.dumps({"type": "message_stop"}), '{"type": "message_stop"}'),
], ids=["not-json", "empty", "error-string", "other-type"])
def test_error_event_with_any_data_is_errored(data: str, message: str | None, loopback: LoopbackServer) -> None:
    body = HEAD + error_event(data) + TAIL
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.ERRORED, analysis.verdict
    assert analysis.verdict.offset == len(HEAD)
    assert analysis.turn.error.get("message") == message
    if message:
        assert message in analysis.verdict.reason
    with pytest.raises(anthropic.APIStatusError):
        sdk_final_message(loopback, body)


@pytest.mark.parametrize("name", ["error", "message", "ping"])
def test_typed_error_event_keeps_its_reason(name: str) -> None:
    """A normal ``type: error`` event is judged as before, whatever it is named."""
    event = {"type": "error", "error": OVERLOADED}
    body = HEAD + f"event: {name}\ndata: {json.dumps(event)}\n\n".encode() + TAIL
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert analysis.verdict.reason == "stream error overloaded_error: Overloaded"
    assert analysis.turn.error == {"source": "stream", "type": "overloaded_error", "code": None,
                                   "message": "Overloaded"}


def test_bedrock_invoke_typed_error_chunk_still_errored() -> None:
    """Bedrock Invoke shares the Anthropic event logic but has no SSE names; its typed error still fails."""
    def chunk(event: dict) -> bytes:
        payload = {"bytes": base64.b64encode(json.dumps(event).encode()).decode()}
        return encode_message({":event-type": "chunk", ":content-type": "application/json",
                               ":message-type": "event"}, json.dumps(payload).encode())

    events = [START, *text_block(0, "Hi"), {"type": "error", "error": OVERLOADED}, *end("end_turn")]
    analysis = analyze_bytes(b"".join(chunk(e) for e in events), Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert analysis.verdict.reason == "stream error overloaded_error: Overloaded"


def test_the_turn_stopped_by_an_in_band_error_keeps_that_stop_reason() -> None:
    """The end events after an error do not make the turn say it ended on end_turn: the error
    stopped it (as every other dialect keeps it); the provider's raw reason is still kept."""
    body = HEAD + error_event(json.dumps({"type": "error", "error": OVERLOADED})) + TAIL
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert (analysis.turn.stop_reason, analysis.turn.stop_reason_raw) == ("error", "end_turn")
    assert analyze_bytes(HEAD + TAIL, Dialect.ANTHROPIC).turn.stop_reason == "end_turn"
