"""Detection gaps a review found: /api/chat answered with SSE is not Ollama, Azure OpenAI's legacy
Completions path, a Gemini or Vertex URL whose ":method" colon is percent-encoded, and Gemini's
`alt` written `$alt` (Google's REST client libraries)."""

from __future__ import annotations

import orjson
import pytest

from streamtap.providers import Dialect, RequestInfo, VerdictKind, analyze_bytes, detect_dialect
from streamtap.providers.detect import is_llm_stream


def sse(*objects: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objects)


def ndjson(*objects: dict) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objects)


def judge(url: str, content_type: str | None, body: bytes, request_body: bytes | None = b'{"stream": true}'):
    """Detect as the addon does (from the request and the response content-type), then judge the body."""
    request = RequestInfo("POST", url, {}, request_body)
    detection = detect_dialect(request, content_type)
    return request, detection, analyze_bytes(body, detection.dialect, wire=detection.wire)


# --- /api/chat is Ollama's path, and also the Vercel AI SDK useChat default ---------------------

# a complete AI SDK UI message stream, as a Next.js route at /api/chat answers it
AI_SDK_CHAT = sse(
    {"type": "start", "messageId": "m1"},
    {"type": "text-start", "id": "t1"},
    {"type": "text-delta", "id": "t1", "delta": "Hello"},
    {"type": "text-end", "id": "t1"},
    {"type": "finish"},
) + b"data: [DONE]\n\n"
AI_SDK_REQUEST = b'{"messages":[{"role":"user","parts":[{"type":"text","text":"hi"}]}]}'


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_an_sse_answer_at_an_ollama_path_is_an_unknown_dialect_read_as_sse_not_corrupt_ndjson(path):
    url = f"http://localhost:3000{path}"
    request, detection, analysis = judge(url, "text/event-stream", AI_SDK_CHAT, AI_SDK_REQUEST)
    assert is_llm_stream(request, "text/event-stream")
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.UNKNOWN, "sse", True), detection
    assert "not Ollama" in detection.why
    assert analysis.verdict.kind is VerdictKind.UNKNOWN, analysis.verdict
    assert "framing complete (6 sse events)" in analysis.verdict.reason
    # the same body at a path streamtap does not know is judged the same way
    _, _, elsewhere = judge("http://localhost:3000/api/assistant", "text/event-stream", AI_SDK_CHAT, AI_SDK_REQUEST)
    assert elsewhere.verdict.kind is VerdictKind.UNKNOWN and elsewhere.verdict.reason == analysis.verdict.reason


def test_a_plain_text_stream_at_api_chat_is_not_read_as_ollama():
    """The AI SDK's text stream answers text/plain; read as NDJSON it would be corrupt."""
    request, detection, _ = judge("http://localhost:3000/api/chat", "text/plain; charset=utf-8", b"Hello world", AI_SDK_REQUEST)
    assert detection.dialect is Dialect.UNKNOWN
    assert not is_llm_stream(request, "text/plain; charset=utf-8")


OLLAMA_CHAT = ndjson(
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.10Z", "message": {"role": "assistant", "content": "Hello"}, "done": False},
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.11Z", "message": {"role": "assistant", "content": " world"}, "done": False},
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.19Z", "message": {"role": "assistant", "content": ""}, "done": True,
     "done_reason": "stop", "prompt_eval_count": 12, "eval_count": 2},
)
OLLAMA_REQUEST = b'{"model":"qwen3","messages":[{"role":"user","content":"hi"}]}'


@pytest.mark.parametrize("content_type", ["application/x-ndjson", "application/json; charset=utf-8", None])
def test_ollama_ndjson_at_api_chat_is_still_ollama(content_type):
    request, detection, analysis = judge("http://127.0.0.1:11434/api/chat", content_type, OLLAMA_CHAT, OLLAMA_REQUEST)
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.OLLAMA, "ndjson", True), detection
    assert is_llm_stream(request, content_type)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Hello world"
    cut = analyze_bytes(OLLAMA_CHAT[: OLLAMA_CHAT.index(b"\n") + 1], detection.dialect, wire=detection.wire)
    assert cut.verdict.kind is VerdictKind.TRUNCATED, cut.verdict


# --- Azure OpenAI legacy Completions: /openai/deployments/{deployment}/completions ---------------

COMPLETION = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "gpt-35-turbo-instruct"}
COMPLETIONS_FULL = sse(
    {**COMPLETION, "choices": [{"text": "Hello", "index": 0, "finish_reason": None}]},
    {**COMPLETION, "choices": [{"text": " world", "index": 0, "finish_reason": "stop"}]},
) + b"data: [DONE]\n\n"
COMPLETIONS_CUT = sse({**COMPLETION, "choices": [{"text": "Hello", "index": 0, "finish_reason": None}]})
AZURE = "https://myres.openai.azure.com/openai/deployments/instruct/completions?api-version=2024-10-21"


@pytest.mark.parametrize(("body", "kind"), [(COMPLETIONS_FULL, VerdictKind.COMPLETE), (COMPLETIONS_CUT, VerdictKind.TRUNCATED)])
def test_azure_legacy_completions_are_judged_as_openai(body, kind):
    request, detection, analysis = judge(AZURE, "text/event-stream", body, b'{"prompt": "Say hello", "stream": true}')
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.OPENAI_CHAT, "sse", True), detection
    assert is_llm_stream(request, "text/event-stream")
    assert analysis.verdict.kind is kind, analysis.verdict
    # and exactly as the same body from api.openai.com
    _, _, openai = judge("https://api.openai.com/v1/completions", "text/event-stream", body)
    assert openai.verdict.kind is kind


def test_azure_non_streaming_completions_are_not_a_stream():
    request = RequestInfo("POST", AZURE, {}, b'{"prompt": "Say hello"}')
    detection = detect_dialect(request, "application/json")
    assert (detection.dialect, detection.streaming) == (Dialect.OPENAI_CHAT, False)
    assert not is_llm_stream(request, "application/json")


# --- a percent-encoded ":" before the Google method ---------------------------------------------

GEMINI_FULL = (
    b'data: {"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"index":0}],"responseId":"R"}\r\n\r\n'
    b'data: {"candidates":[{"content":{"parts":[{"text":"!"}],"role":"model"},"finishReason":"STOP","index":0}],'
    b'"responseId":"R"}\r\n\r\n'
)
GEMINI_CUT = GEMINI_FULL.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
GEMINI_MODELS = "https://generativelanguage.googleapis.com/v1beta/models"


@pytest.mark.parametrize("colon", [":", "%3A", "%3a"])
@pytest.mark.parametrize(("body", "kind"), [(GEMINI_FULL, VerdictKind.COMPLETE), (GEMINI_CUT, VerdictKind.TRUNCATED)])
def test_gemini_url_with_an_encoded_colon_is_gemini(colon, body, kind):
    url = f"{GEMINI_MODELS}/gemini-2.0-flash{colon}streamGenerateContent?alt=sse"
    _, detection, analysis = judge(url, "text/event-stream", body, None)
    assert (detection.dialect, detection.wire) == (Dialect.GEMINI, "sse"), detection
    assert analysis.verdict.kind is kind, analysis.verdict


def test_gemini_json_array_url_with_an_encoded_colon_is_gemini():
    detection = detect_dialect(RequestInfo("POST", f"{GEMINI_MODELS}/gemini-2.0-flash%3AstreamGenerateContent", {}, None),
                               "application/json")
    assert (detection.dialect, detection.wire) == (Dialect.GEMINI, "json-array")


@pytest.mark.parametrize(("query", "wire"), [
    ("?$alt=sse", "sse"), ("?%24alt=sse", "sse"), ("?alt=sse", "sse"), ("?$alt=sse;enum-encoding=int", "sse"),
    ("?$alt=json;enum-encoding=int", "json-array"), ("?%24alt=json%3Benum-encoding%3Dint", "json-array"), ("", "json-array"),
])
def test_gemini_reads_the_alt_system_parameter_as_alt_or_dollar_alt(query, wire):
    """Google takes `alt` and `$alt` alike; its REST client libraries send `$alt=json;enum-encoding=int`."""
    detection = detect_dialect(RequestInfo("POST", f"{GEMINI_MODELS}/gemini-2.0-flash:streamGenerateContent{query}", {},
                                           None), None)
    assert (detection.dialect, detection.wire) == (Dialect.GEMINI, wire), detection


def test_a_rest_client_librarys_numbered_enums_are_judged_by_their_names():
    """`enum-encoding=int`: the JSON array's finishReason is a number, 1 for STOP."""
    first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}, "index": 0}], "responseId": "R"}
    last = {"candidates": [{"content": {"role": "model", "parts": [{"text": " there."}]}, "finishReason": 1, "index": 0}],
            "responseId": "R"}
    body = b"[" + orjson.dumps(first) + b",\r\n" + orjson.dumps(last) + b"]"
    url = f"{GEMINI_MODELS}/gemini-2.0-flash:streamGenerateContent?%24alt=json%3Benum-encoding%3Dint"
    _, detection, analysis = judge(url, "application/json", body, None)
    assert detection.wire == "json-array" and analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.stop_reason_raw == "STOP"


def test_vertex_anthropic_stream_raw_predict_with_an_encoded_colon_is_anthropic():
    vertex = "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/publishers/anthropic/models"
    detection = detect_dialect(RequestInfo("POST", f"{vertex}/claude-sonnet-4@20250514%3AstreamRawPredict", {},
                                           b'{"stream": true}'), "text/event-stream")
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.ANTHROPIC, "sse", True)


@pytest.mark.parametrize(("body", "says", "not_says"), [
    (b'data: {"type":"response.created","response":{"id":"r"}}\n\n', 'a Responses "response.created" event', "sequence_number"),
    (b'data: {"type":"response.created","sequence_number":0,"response":{"id":"r"}}\n\n',
     'a Responses "response.created" event with sequence_number', None),
    (b'{"object":"chat.completion","choices":[]}\n', "a chat.completion", "chunk"),
    (b'{"choices":[]}\n', "an object with choices", "chunk"),
])
def test_what_sniffing_says_it_saw_is_what_the_bytes_hold(body, says, not_says):
    """The reason a sniff gives is shown to the user (verify's "sniffed: ..."): it names only what is there."""
    from streamtap.providers import sniff_dialect

    why = sniff_dialect(body).why
    assert says in why, why
    assert not_says is None or not_says not in why, why
