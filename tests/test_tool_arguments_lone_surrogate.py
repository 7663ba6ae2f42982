"""A tool call's arguments with a lone surrogate escape (the model's text cut inside an emoji's
escaped pair): valid where apps read the arguments with json.loads, which reads it (OpenAI's SDKs
hand them over as a string), invalid where the SDK parses them itself and refuses it (the anthropic
SDK's jiter). No UTF-8 text can hold the surrogate, so parsed arguments hold U+FFFD, and say so."""

from __future__ import annotations

import json

import httpx
import openai
import orjson
import pytest

from provider_streams import anthropic_tool_use, read_with_anthropic_sdk

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

ARGUMENTS = '{"city":"Paris \\ud83d"}'  # the escape as it travels: six ASCII characters


def sse(*events: dict, named: bool = True) -> bytes:
    return b"".join((f"event: {e['type']}\n".encode() if named else b"") + b"data: " + orjson.dumps(e) + b"\n\n"
                    for e in events)


def transport(body: bytes, http=httpx):
    return http.Client(transport=http.MockTransport(
        lambda request: http.Response(200, headers={"content-type": "text/event-stream"}, content=body)))


def test_a_responses_function_call_holds_u_fffd_as_json_loads_reads_it():
    item = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "weather",
            "arguments": ARGUMENTS}
    response = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "status": "in_progress", "output": []}
    body = sse({"type": "response.created", "response": response},
               {"type": "response.output_item.added", "output_index": 0, "item": {**item, "arguments": ""}},
               {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": ARGUMENTS},
               {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 0, "arguments": ARGUMENTS},
               {"type": "response.output_item.done", "output_index": 0, "item": item},
               {"type": "response.completed", "response": {**response, "status": "completed", "output": [item]}})
    client = openai.OpenAI(api_key="x", base_url="http://t/v1", max_retries=0, http_client=transport(body))
    with client.responses.stream(model="m", input="x") as stream:
        for _ in stream:
            pass
        arguments = stream.get_final_response().output[0].arguments
    assert json.loads(arguments) == {"city": "Paris \ud83d"}  # what the app reads
    analysis = analyze_bytes(body, Dialect.OPENAI_RESPONSES)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    call = analysis.turn.tool_calls()[0]
    assert (call.arguments, call.arguments_raw) == ({"city": "Paris \ufffd"}, ARGUMENTS)
    assert any("weather's arguments hold a lone surrogate escape" in note for note in analysis.turn.notes)


def test_an_anthropic_tool_use_with_one_stays_corrupt_as_the_sdk_refuses_it():
    """The anthropic SDK parses the input itself (jiter), and raises on the escape."""
    body = anthropic_tool_use(ARGUMENTS)
    with pytest.raises(ValueError, match="tool parameter JSON"):
        read_with_anthropic_sdk(body)
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "invalid argument JSON" in verdict.reason, verdict
