"""One InvokeModel chunk is one model event. A Nova chunk holding two ConverseStream members
(``messageStart`` and ``contentBlockDelta``) had the second dropped, and the turn judged complete
while the app, which reads the member it looks for, showed text streamtap never saw. A Mistral
chunk's outputs beyond the first were dropped without a word."""

from __future__ import annotations

import base64
import json

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import encode_message


def chunk(event: dict) -> bytes:
    inner = base64.b64encode(json.dumps(event).encode()).decode()
    return encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({"bytes": inner, "p": "abc"}).encode())


NOVA_END = [{"contentBlockDelta": {"delta": {"text": "Hi"}, "contentBlockIndex": 0}},
            {"contentBlockStop": {"contentBlockIndex": 0}},
            {"messageStop": {"stopReason": "end_turn"}},
            {"metadata": {"usage": {"inputTokens": 1, "outputTokens": 3}}}]


def test_a_nova_chunk_with_two_members_is_corrupt():
    body = b"".join(map(chunk, [{"messageStart": {"role": "assistant"},
                                 "contentBlockDelta": {"delta": {"text": "Unseen "}, "contentBlockIndex": 0}},
                                *NOVA_END]))
    analysis = analyze_bytes(body, Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "messageStart and contentBlockDelta" in analysis.verdict.reason


def test_a_nova_stream_of_one_member_chunks_is_still_complete():
    body = b"".join(map(chunk, [{"messageStart": {"role": "assistant"}}, *NOVA_END]))
    analysis = analyze_bytes(body, Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.COMPLETE and analysis.turn.text() == "Hi", analysis.verdict


def test_a_mistral_chunk_with_two_outputs_is_unknown_with_a_note():
    body = chunk({"outputs": [{"text": "Hi", "stop_reason": None}, {"text": "Other", "stop_reason": None}]}) + chunk(
        {"outputs": [{"text": "!", "stop_reason": "stop"}, {"text": " cut", "stop_reason": "length"}]})
    analysis = analyze_bytes(body, Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.UNKNOWN, analysis.verdict
    assert "2 outputs" in analysis.verdict.reason and analysis.verdict.evidence["was"] == "complete"
    assert analysis.turn.text() == "Hi!" and any("2 outputs" in note for note in analysis.turn.notes)


def test_a_mistral_stream_of_one_output_each_is_complete():
    body = chunk({"outputs": [{"text": "Hi", "stop_reason": None}]}) + chunk({"outputs": [{"text": "!", "stop_reason": "stop"}]})
    analysis = analyze_bytes(body, Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.COMPLETE and analysis.turn.text() == "Hi!", analysis.verdict
