"""Paths that look like an LLM API's but are not its stream: a plain JSON answer at Ollama's paths
(another app's, or Ollama's own answer to a call that only loads the model), a /responses/<segment>
of another app, api.anthropic.com's legacy /v1/complete; and tool results check_request cannot
call orphans (after a Responses item_reference, an Ollama tool message naming no call)."""

from __future__ import annotations

import orjson
import pytest

from streamtap.providers import (
    Dialect,
    RequestInfo,
    StreamSession,
    VerdictKind,
    answers_a_stream,
    check_request,
    detect_dialect,
)
from streamtap.providers.detect import is_llm_stream
from streamtap.providers.session import NOT_A_STREAM


def judged_as_the_tap_does(request: RequestInfo, content_type: str | None, body: bytes):
    """Detect, then judge as the proxy does: a plain JSON answer is no stream (answers_a_stream)."""
    detection = detect_dialect(request, content_type)
    session = StreamSession(detection.dialect, detection.wire, streamed=answers_a_stream(detection, content_type),
                            one_response=True)
    session.feed(body)
    return detection, session.close().verdict


# --- Ollama's paths ----------------------------------------------------------------------

JSON = "application/json; charset=utf-8"  # gin's c.JSON, as Ollama answers one object


@pytest.mark.parametrize(("method", "path", "request_body", "answer"), [
    # an image API's plain JSON (no model), a GET listing chats, a POST with no body at all
    ("POST", "/api/generate", b'{"prompt":"a cat","width":512}', b'{"id":"img_1","url":"https://cdn.example/img_1.png"}'),
    ("GET", "/api/chat", None, b'{"chats":[{"id":1,"title":"hello"}]}\n'),
    ("GET", "/api/chat", None, b'{\n  "chats": []\n}\n'),
    ("POST", "/api/chat", b"", b'{"ok":true}'),
    ("POST", "/api/chat", b"title=hi", b'{"ok":true}'),
])
def test_another_apps_json_at_an_ollama_path_is_not_an_ollama_stream(method, path, request_body, answer):
    request = RequestInfo(method, f"http://localhost:3000{path}", {}, request_body)
    assert not is_llm_stream(request, JSON)
    detection, verdict = judged_as_the_tap_does(request, JSON, answer)
    assert detection.dialect is Dialect.UNKNOWN and "not Ollama" in detection.why, detection
    assert (verdict.kind, verdict.reason) == (VerdictKind.UNKNOWN, NOT_A_STREAM), verdict


# Ollama's answers to a call that only loads (no prompt, no messages) or unloads (keep_alive 0) the model
LOADED = {"model": "llama3.2", "created_at": "2025-10-26T17:15:24.101Z", "done": True}


@pytest.mark.parametrize(("path", "request_body", "answer"), [
    ("/api/generate", {"model": "llama3.2"}, {**LOADED, "response": "", "done_reason": "load"}),
    ("/api/generate", {"model": "llama3.2", "prompt": "", "stream": True}, {**LOADED, "response": "", "done_reason": "load"}),
    ("/api/generate", {"model": "llama3.2", "keep_alive": 0}, {**LOADED, "response": "", "done_reason": "unload"}),
    ("/api/chat", {"model": "llama3.2", "messages": []}, {**LOADED, "message": {"role": "assistant", "content": ""},
                                                           "done_reason": "load"}),
    ("/api/chat", {"model": "llama3.2", "keep_alive": 0}, {**LOADED, "message": {"role": "assistant", "content": ""},
                                                           "done_reason": "unload"}),
])
def test_ollamas_answer_to_a_load_or_unload_call_is_no_cut_stream(path, request_body, answer):
    request = RequestInfo("POST", f"http://127.0.0.1:11434{path}", {}, orjson.dumps(request_body))
    assert not is_llm_stream(request, JSON)
    detection, verdict = judged_as_the_tap_does(request, JSON, orjson.dumps(answer))  # no newline: gin writes none
    assert (detection.dialect, detection.streaming) == (Dialect.OLLAMA, False), detection
    assert "loads (or unloads) the model" in detection.why
    assert (verdict.kind, verdict.reason) == (VerdictKind.UNKNOWN, NOT_A_STREAM), verdict


OLLAMA_STREAM = b"".join(orjson.dumps(line) + b"\n" for line in (
    {"model": "llama3.2", "created_at": "x", "response": "Hi", "done": False},
    {"model": "llama3.2", "created_at": "y", "response": "", "done": True, "done_reason": "stop", "eval_count": 2},
))


@pytest.mark.parametrize("content_type", ["application/x-ndjson", JSON, None])
@pytest.mark.parametrize("request_body", [b'{"model":"llama3.2","prompt":"hi"}',
                                          b'{"model":"llama3.2","prompt":"hi","keep_alive":0}'])
def test_a_generation_at_ollamas_path_is_still_an_ollama_stream(content_type, request_body):
    """keep_alive 0 with a prompt generates (then unloads): a stream like any other."""
    request = RequestInfo("POST", "http://127.0.0.1:11434/api/generate", {}, request_body)
    assert is_llm_stream(request, content_type)
    detection, verdict = judged_as_the_tap_does(request, content_type, OLLAMA_STREAM)
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.OLLAMA, "ndjson", True), detection
    assert verdict.kind is VerdictKind.COMPLETE, verdict
    _, cut = judged_as_the_tap_does(request, content_type, OLLAMA_STREAM[: OLLAMA_STREAM.index(b"\n") + 1])
    assert cut.kind is VerdictKind.TRUNCATED, cut


def test_the_proxys_first_look_without_the_body_still_names_ollama():
    """At the response headers the proxy detects without the body (FlowSpec.of): the path decides."""
    detection = detect_dialect(RequestInfo("POST", "http://127.0.0.1:11434/api/chat", {}, None), "application/x-ndjson")
    assert (detection.dialect, detection.streaming) == (Dialect.OLLAMA, True)


# --- /responses/<segment> ------------------------------------------------------------------

SSE = b'data: {"id": 1, "text": "hello"}\n\ndata: {"id": 2, "text": "world"}\n\n'


@pytest.mark.parametrize("url", [
    "https://forms.example.com/api/surveys/42/responses/stream",
    "https://forms.example.com/api/surveys/42/responses/latest?stream=true",
])
def test_another_apps_responses_subpath_is_no_openai_responses_stream(url):
    detection, verdict = judged_as_the_tap_does(RequestInfo("GET", url, {}, None), "text/event-stream", SSE)
    assert detection.dialect is Dialect.UNKNOWN, detection
    assert verdict.kind is VerdictKind.UNKNOWN and "framing complete (2 sse events)" in verdict.reason, verdict


@pytest.mark.parametrize("url", [
    "https://api.openai.com/v1/responses",
    "https://api.openai.com/v1/responses/resp_0850765c843cca5300699cc47d93c0819089a181f5feeff8e?stream=true",
    "https://myres.openai.azure.com/openai/responses?api-version=2025-04-01-preview",
    "https://gateway.example.com/v1/responses/resp-example?stream=true",
])
def test_responses_create_and_retrieve_are_still_openai_responses(url):
    detection = detect_dialect(RequestInfo("POST", url, {}, b'{"stream": true}'), "text/event-stream")
    assert (detection.dialect, detection.streaming) == (Dialect.OPENAI_RESPONSES, True), detection


# --- api.anthropic.com: the path decides ---------------------------------------------------------

LEGACY_COMPLETE = (
    b'event: completion\ndata: {"type": "completion", "id": "compl_1", "completion": " Hello", "stop_reason": null, '
    b'"model": "claude-2.1"}\n\n'
    b'event: ping\ndata: {"type": "ping"}\n\n'
    b'event: completion\ndata: {"type": "completion", "id": "compl_1", "completion": "!", "stop_reason": "stop_sequence", '
    b'"model": "claude-2.1"}\n\n'
)


def test_anthropics_legacy_complete_stream_is_not_judged_as_messages():
    request = RequestInfo("POST", "https://api.anthropic.com/v1/complete", {},
                          b'{"model":"claude-2.1","prompt":"\\n\\nHuman: hi\\n\\nAssistant:","max_tokens_to_sample":50,"stream":true}')
    detection, verdict = judged_as_the_tap_does(request, "text/event-stream; charset=utf-8", LEGACY_COMPLETE)
    assert detection.dialect is Dialect.UNKNOWN, detection
    assert verdict.kind is VerdictKind.UNKNOWN and "framing complete (3 sse events)" in verdict.reason, verdict


@pytest.mark.parametrize("url", [
    "https://api.anthropic.com/v1/messages", "https://api.anthropic.com/v1/messages?beta=true",
    "https://api.anthropic.com/v1/messages/",
])
def test_anthropics_messages_paths_are_still_messages(url):
    detection = detect_dialect(RequestInfo("POST", url, {}, b'{"stream": true}'), "text/event-stream")
    assert (detection.dialect, detection.streaming) == (Dialect.ANTHROPIC, True), detection


# --- check_request: results whose call cannot be known ------------------------------------------

def test_a_responses_result_after_an_item_reference_is_no_orphan():
    """The referenced item (its `type` optional in the API) may be the call: its call_id is on the server."""
    for reference in ({"type": "item_reference", "id": "fc_67890"}, {"id": "fc_67890"}):
        body = {"model": "gpt-4.1", "input": [
            {"role": "user", "content": "weather in Paris?"},
            reference,
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        ]}
        assert check_request(Dialect.OPENAI_RESPONSES, body) == []
    # a result before any reference is still checked
    body = {"input": [{"type": "function_call_output", "call_id": "call_0", "output": "?"},
                      {"type": "item_reference", "id": "fc_1"}]}
    [finding] = check_request(Dialect.OPENAI_RESPONSES, body)
    assert "call_0" in finding and "input[0]" in finding


def test_an_ollama_tool_message_naming_no_call_is_no_orphan():
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]}
    for tool in ({"role": "tool", "content": "18C", "name": "get_weather"}, {"role": "tool", "content": "18C"}):
        assert check_request(Dialect.OLLAMA, {"messages": [{"role": "user", "content": "hi"}, call, tool]}) == []
    # one naming a tool never called still is one
    [finding] = check_request(Dialect.OLLAMA, {"messages": [call, {"role": "tool", "content": "x", "tool_name": "other"}]})
    assert "'other'" in finding


@pytest.mark.parametrize("host", ["tok:HOSTPW@", "tok:HOSTPW@:443", "toku_HOSTPW@"])
def test_why_never_shows_the_userinfo_of_a_host_header(host):
    """Where the URL names no host, detection read the Host header as it came, userinfo and all,
    into ``why``, which the recording keeps unredacted."""
    detection = detect_dialect(RequestInfo("POST", "/v1/messages", {"host": host}, b'{"stream": true}'), "text/event-stream")
    assert "hostpw" not in detection.why.lower(), detection.why
