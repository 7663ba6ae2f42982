"""An SSE `event: error` is the provider saying the answer failed, whatever its data: the SDKs
raise on it, JSON or not. The OpenAI dialects judge it errored, as the others do, not corrupt."""

from __future__ import annotations

import pytest

from streamtap.providers import analyze_bytes

CHAT = (b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}\n\n')
RESPONSES = (b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":'
             b'{"id":"r1","object":"response","status":"in_progress","output":[],"model":"gpt-4o"}}\n\n')


@pytest.mark.parametrize("dialect, opening", [("openai-chat", CHAT), ("openai-responses", RESPONSES)])
@pytest.mark.parametrize("data", [b"upstream overloaded", b"", b"42", b'"overloaded"'])
def test_an_error_event_whose_data_is_no_json_object_is_errored(dialect, opening, data):
    body = opening + b"event: error\ndata: " + data + b"\n\n"
    verdict = analyze_bytes(body, dialect).verdict
    assert verdict.kind.value == "errored", verdict.reason
    if data == b"upstream overloaded":
        assert "upstream overloaded" in verdict.reason


@pytest.mark.parametrize("dialect, opening", [("openai-chat", CHAT), ("openai-responses", RESPONSES)])
def test_other_events_with_data_that_is_no_json_stay_corrupt(dialect, opening):
    body = opening + b"data: upstream overloaded\n\n"
    assert analyze_bytes(body, dialect).verdict.kind.value == "corrupt"
