"""The session's own rules (framing trouble, HTTP status, end kinds, sentinel, fail-open), dialect
detection and sniffing, the unknown dialect, and request-side checks."""

from __future__ import annotations

import orjson
import pytest
from provider_streams import cassette_responses, openai_chat
from conftest import chunked, shared_files, shared_path

from streamtap.providers import (
    Dialect,
    RequestInfo,
    StreamEnd,
    StreamSession,
    VerdictKind,
    analyze_bytes,
    check_request,
    detect_dialect,
    sniff_dialect,
)
from streamtap.wire import encode_message

C, T, E, X, U = (VerdictKind.COMPLETE, VerdictKind.TRUNCATED, VerdictKind.ERRORED, VerdictKind.CORRUPT, VerdictKind.UNKNOWN)

CHAT_OK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hello.\\nDONE-42"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


# --- detection ---------------------------------------------------------------------------

VERTEX = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1"
DETECT = [
    ("POST", "https://api.openai.com/v1/chat/completions", b'{"stream":true}', "text/event-stream", Dialect.OPENAI_CHAT, "sse", True),
    ("POST", "https://api.openai.com/v1/chat/completions", b'{"stream":false}', "application/json", Dialect.OPENAI_CHAT, "sse", False),
    ("POST", "https://openrouter.ai/api/v1/chat/completions", b'{"stream":true}', "text/event-stream", Dialect.OPENAI_CHAT, "sse", True),
    ("POST", "http://127.0.0.1:11434/v1/chat/completions", b'{"stream":true}', "text/event-stream", Dialect.OPENAI_CHAT, "sse", True),
    ("POST", "https://api.openai.com/v1/responses", b'{"stream":true}', "text/event-stream; charset=utf-8", Dialect.OPENAI_RESPONSES, "sse", True),
    ("GET", "https://api.openai.com/v1/responses/resp_1?stream=true&starting_after=3", None, "text/event-stream", Dialect.OPENAI_RESPONSES, "sse", True),
    ("POST", "https://api.anthropic.com/v1/messages?beta=true", b'{"stream":true}', "text/event-stream", Dialect.ANTHROPIC, "sse", True),
    ("POST", "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3/invoke-with-response-stream", None,
     "application/vnd.amazon.eventstream", Dialect.BEDROCK_INVOKE, "eventstream", True),
    ("POST", "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.amazon.nova-micro-v1%3A0/converse-stream", None,
     "application/vnd.amazon.eventstream", Dialect.BEDROCK_CONVERSE, "eventstream", True),
    ("POST", "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", None,
     "text/event-stream", Dialect.GEMINI, "sse", True),
    ("POST", "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent", None,
     "application/json", Dialect.GEMINI, "json-array", True),
    ("POST", "http://127.0.0.1:11434/api/generate", b'{"model":"x","prompt":"hi"}', "application/x-ndjson", Dialect.OLLAMA, "ndjson", True),
    # Vertex AI's streamRawPredict speaks the publisher's own API
    ("POST", f"{VERTEX}/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict", b'{"stream":true}',
     "text/event-stream", Dialect.ANTHROPIC, "sse", True),
    ("POST", f"{VERTEX}/publishers/mistralai/models/mistral-large-2411:streamRawPredict", b'{"stream":true}',
     "text/event-stream", Dialect.OPENAI_CHAT, "sse", True),
    ("POST", f"{VERTEX}/publishers/ai21/models/jamba-1.5-large:streamRawPredict", b'{"stream":true}',
     "text/event-stream", Dialect.UNKNOWN, "sse", True),
    ("POST", "http://192.0.2.10/custom/stream", b"{}", "application/x-ndjson", Dialect.UNKNOWN, "ndjson", True),
    ("POST", "http://192.0.2.10/custom/stream", b"{}", "text/event-stream", Dialect.UNKNOWN, "sse", True),
]


@pytest.mark.parametrize(("method", "url", "body", "content_type", "dialect", "wire", "streaming"), DETECT)
def test_detect_dialect_from_request_and_content_type(method, url, body, content_type, dialect, wire, streaming):
    detection = detect_dialect(RequestInfo(method, url, {}, body), content_type)
    assert (detection.dialect, detection.wire, detection.streaming) == (dialect, wire, streaming)
    assert detection.why


def test_detection_never_reads_the_response_body():
    # body text that looks like Anthropic does not make an unknown endpoint Anthropic
    request = RequestInfo("POST", "http://192.0.2.10/proxy", {}, b'{"type":"message_start"}')
    assert detect_dialect(request, "text/event-stream").dialect is Dialect.UNKNOWN
    assert detect_dialect(None, "text/event-stream").dialect is Dialect.UNKNOWN


def test_detection_reads_a_url_whose_host_has_an_unbalanced_bracket():
    # the URL is built from the client's Host header, which can be anything; the path still decides
    request = RequestInfo("POST", "http://[192.0.2.10/v1/messages?beta=true", {}, b'{"stream": true}')
    detection = detect_dialect(request, "text/event-stream")
    assert (detection.dialect, detection.wire, detection.streaming) == (Dialect.ANTHROPIC, "sse", True)
    request = RequestInfo("POST", "http://192.0.2.10]/v1beta/models/g:streamGenerateContent?alt=sse", {}, None)
    assert (detect_dialect(request, None).dialect, detect_dialect(request, None).wire) == (Dialect.GEMINI, "sse")


def test_cassette_requests_and_sniffing_agree_on_every_stream():
    """Every streamed response in the cassettes: detection from the recorded request and sniffing
    the body alone name the same dialect and wire."""
    shared_path("fixtures", "MANIFEST.md")
    captured = [c for c in cassette_responses("*/cassettes/**/*.yaml") if c.status == 200]
    assert len(captured) > 50
    for item in captured:
        detected = detect_dialect(item.request, item.content_type)
        sniffed = sniff_dialect(item.body)
        assert detected.dialect is not Dialect.UNKNOWN, item.name
        if detected.dialect is Dialect.BEDROCK_INVOKE and b"chunk" not in item.body[:200]:
            continue  # a non-Claude invoke stream may open with other frames; the request decides
        assert (sniffed.dialect, sniffed.wire) == (detected.dialect, detected.wire), item.name
        assert sniffed.why.startswith("sniffed")


def test_sniffing_raw_bodies_by_folder():
    bodies = shared_files("*/bodies/**/*.*")
    if not bodies:
        pytest.skip("../shared/fixtures is absent")
    for path in bodies:
        detection = sniff_dialect(path.read_bytes())
        name = path.name
        if path.suffix == ".bin":
            expected = Dialect.BEDROCK_INVOKE if name.startswith("invoke_") else Dialect.BEDROCK_CONVERSE
            assert (detection.dialect, detection.wire) == (expected, "eventstream"), path
        elif "anthropic" in str(path.parent) or name.startswith("anthropic_"):
            assert detection.dialect is Dialect.ANTHROPIC, path
        elif "google" in str(path.parent):
            assert detection.dialect is Dialect.GEMINI, path
        elif "openai-responses" in str(path.parent) or "bedrock-mantle" in str(path.parent):
            assert detection.dialect is Dialect.OPENAI_RESPONSES, path
        else:
            assert detection.dialect is Dialect.OPENAI_CHAT, path


# --- the session's rules ------------------------------------------------------------------


def test_http_error_status_is_errored_with_the_body_message():
    captured = [c for c in cassette_responses("otel-contrib/cassettes/invoke_stream_invalid_model.yaml")]
    if not captured:
        pytest.skip("../shared/fixtures is absent")
    item = captured[0]
    assert item.status == 400
    detection = detect_dialect(item.request, item.content_type)
    analysis = analyze_bytes(item.body, detection.dialect, http_status=item.status)
    assert analysis.verdict.kind is E
    message = orjson.loads(item.body).get("message") or orjson.loads(item.body).get("Message")
    assert analysis.verdict.reason == f"HTTP 400: {message}"
    assert analysis.turn.error == {"source": "http", "status": 400, "message": message}


def test_http_error_wins_even_over_a_complete_looking_body():
    analysis = analyze_bytes(CHAT_OK, Dialect.OPENAI_CHAT, http_status=503)
    assert analysis.verdict.kind is E and analysis.verdict.reason.startswith("HTTP 503")


def test_fatal_framing_error_is_corrupt_with_seq_and_offset():
    messages = [
        encode_message({":event-type": "messageStart", ":content-type": "application/json", ":message-type": "event"}, b'{"role":"assistant"}'),
        encode_message({":event-type": "contentBlockDelta", ":content-type": "application/json", ":message-type": "event"},
                       b'{"contentBlockIndex":0,"delta":{"text":"Hi"}}'),
        encode_message({":event-type": "messageStop", ":content-type": "application/json", ":message-type": "event"}, b'{"stopReason":"end_turn"}'),
    ]
    body = bytearray(b"".join(messages))
    flip = len(messages[0]) + 20  # inside the second message's payload
    body[flip] ^= 0xFF
    for dialect in (Dialect.BEDROCK_CONVERSE, Dialect.UNKNOWN):
        analysis = analyze_bytes(bytes(body), dialect, wire="eventstream")
        verdict = analysis.verdict
        assert verdict.kind is X, (dialect, verdict)
        assert verdict.seq == 1 and verdict.offset == len(messages[0])
        assert "CRC" in verdict.evidence["error"] and verdict.evidence["fatal"] is True


def test_non_fatal_malformed_unit_is_corrupt():
    body = (b'{"message":{"role":"assistant","content":"a"},"done":false}\nnot json at all\n'
            b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}\n')
    analysis = analyze_bytes(body, Dialect.OLLAMA)
    assert analysis.verdict.kind is X and analysis.verdict.seq == 1 and analysis.verdict.offset == body.index(b"not")
    assert analysis.verdict.evidence["fatal"] is False


def test_tail_is_truncated_with_the_tail_as_evidence():
    cut = CHAT_OK[:-5]
    for end, words in ((StreamEnd.FINISHED, "ended cleanly"), (StreamEnd.UPSTREAM_RESET, "reset"),
                       (StreamEnd.CLIENT_ABORTED, "not the provider's fault")):
        verdict = analyze_bytes(cut, Dialect.OPENAI_CHAT, end=end).verdict
        assert verdict.kind is T and words in verdict.reason
        assert verdict.evidence["end"] == end.value
        assert verdict.evidence["tail_bytes"] == len(cut) - verdict.offset
        assert verdict.evidence["tail_head"].startswith("data: [DO")


def test_sentinel():
    ok = analyze_bytes(CHAT_OK, Dialect.OPENAI_CHAT, sentinel="DONE-42")
    assert ok.verdict.kind is C
    missing = analyze_bytes(CHAT_OK.replace(b"DONE-42", b"DONE-4"), Dialect.OPENAI_CHAT, sentinel="DONE-42")
    assert missing.verdict.kind is T and missing.verdict.reason == "sentinel missing"
    assert missing.verdict.evidence["last_line"] == "DONE-4"
    # a sentinel inside the text but not as the last line does not count
    moved = analyze_bytes(CHAT_OK.replace(b"Hello.\\nDONE-42", b"DONE-42\\nHello."), Dialect.OPENAI_CHAT, sentinel="DONE-42")
    assert moved.verdict.kind is T


def _anthropic_text(*blocks: list[str]) -> bytes:
    """An Anthropic answer (end_turn) of one text block per item of ``blocks``, each given in these deltas."""
    def sse(data: dict) -> bytes:
        return f"event: {data['type']}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
    out = [sse({"type": "message_start", "message": message})]
    for index, deltas in enumerate(blocks):
        out.append(sse({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}))
        out += [sse({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": delta}})
                for delta in deltas]
        out.append(sse({"type": "content_block_stop", "index": index}))
    out.append(sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}))
    out.append(sse({"type": "message_stop"}))
    return b"".join(out)


def _capped(body: bytes, dialect: Dialect, size: int, sentinel: str = "DONE-42"):
    session = StreamSession(dialect, sentinel=sentinel, text_cap=100)
    for piece in chunked(body, size):
        session.feed(piece)
    return session.close()


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
def test_the_sentinel_is_read_beyond_the_text_cap(size):
    """The turn keeps the text up to its cap; the sentinel check reads the answer's own end (the
    judge keeps it apart), so the verdict is the one without the cap, for any chunking."""
    words = ["word " * 20] * 15  # 1,500 characters: most of them beyond the cap of 100
    ended = [*words, "\nDONE-42\n"]
    cases = [
        (_anthropic_text(ended), C),
        (_anthropic_text([*words, "\nDONE-4"]), T),
        (_anthropic_text(["x" * 95, "\nDONE-42"]), C),  # the cap falls inside the sentinel's line
        (_anthropic_text(words, ["\nDO", "NE-", "42 \r\n\n"]), C),  # the line spans blocks, both beyond the cap
        (_anthropic_text([*words, "\nDONE-"], ["42"]), C),
        (_anthropic_text(ended, ["more"]), T),
    ]
    for body, kind in cases:
        capped = _capped(body, Dialect.ANTHROPIC, size)
        assert any(block.extra.get("text_dropped_chars") for block in capped.turn.blocks)
        assert capped.verdict.kind is kind, (body[-300:], capped.verdict)
        assert capped.verdict.kind is analyze_bytes(body, Dialect.ANTHROPIC, sentinel="DONE-42").verdict.kind
    chat = _capped(openai_chat([*words, "\nDONE-42"]), Dialect.OPENAI_CHAT, size)
    assert chat.verdict.kind is C and chat.turn.blocks[0].extra["text_dropped_chars"] > 1000


def test_a_sentinel_the_kept_end_cannot_settle_is_unknown_and_a_long_last_line_is_shown_by_its_end():
    """Beyond the cap, a last line whose start is not in the end kept (1,024 characters) and whose
    seen part could be the sentinel's end cannot be told: unknown, not a guess. The evidence shows
    at most the last 200 characters of the last line."""
    padded = _capped(_anthropic_text(["x" * 300, "\n" + " " * 2000 + "DONE-42"]), Dialect.ANTHROPIC, 1 << 20)
    assert padded.verdict.kind is U and "sentinel could not be checked" in padded.verdict.reason, padded.verdict
    assert padded.verdict.evidence["choices"] == [0]
    long_line = "y" * 5000 + " DONE-4"
    beyond = _capped(_anthropic_text(["x" * 300, "\n" + long_line]), Dialect.ANTHROPIC, 1 << 20)
    assert beyond.verdict.kind is T and beyond.verdict.reason == "sentinel missing"
    kept = analyze_bytes(_anthropic_text(["x\n" + long_line]), Dialect.ANTHROPIC, sentinel="DONE-42")
    for verdict in (beyond.verdict, kept.verdict):
        assert verdict.evidence["last_line"] == "…" + long_line[-199:], verdict.evidence["last_line"][:20]


def _two_choices(first: dict, second: dict, stops: tuple[str, str]) -> bytes:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    def chunk(index: int, delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}) + b"\n\n"
    return (chunk(0, {"role": "assistant", **first}) + chunk(1, {"role": "assistant", **second})
            + chunk(0, {}, stops[0]) + chunk(1, {}, stops[1]) + b"data: [DONE]\n\n")


def test_the_sentinel_exempts_each_choice_that_called_a_tool_by_its_own_stop():
    """With n > 1, each choice is checked but one whose own stop reason is a tool call: another
    choice's tool call neither exempts a text answer nor makes a tool call need the sentinel."""
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    text_then_call = _two_choices({"content": "hi\nDONE-42"}, call, ("stop", "tool_calls"))
    assert analyze_bytes(text_then_call, Dialect.OPENAI_CHAT, sentinel="DONE-42").verdict.kind is C
    call_then_text = _two_choices(call, {"content": "hi, but no sentinel"}, ("tool_calls", "stop"))
    missing = analyze_bytes(call_then_text, Dialect.OPENAI_CHAT, sentinel="DONE-42").verdict
    assert missing.kind is T and missing.reason == "sentinel missing" and missing.evidence["choices"] == [1]
    assert missing.evidence["last_line"] == "hi, but no sentinel"
    both = _two_choices({"content": "DONE-42"}, {"content": "DONE-42"}, ("stop", "stop"))
    assert analyze_bytes(both, Dialect.OPENAI_CHAT, sentinel="DONE-42").verdict.kind is C


def test_any_chunking_gives_the_same_analysis():
    body = shared_path("fixtures", "openllmetry", "bodies", "openai_chat_stream_parallel_tool_calls.0.sse").read_bytes()
    whole = analyze_bytes(body, Dialect.OPENAI_CHAT)
    for size in (1, 3, 64, 1000):
        session = StreamSession(Dialect.OPENAI_CHAT)
        for piece in chunked(body, size):
            session.feed(piece)
        again = session.close()
        assert again.turn.to_dict() == whole.turn.to_dict()
        assert again.verdict.to_dict() == whole.verdict.to_dict()


def test_a_bug_in_an_assembler_fails_open(monkeypatch):
    from streamtap.providers import openai_chat

    def broken(self, event, t):
        raise KeyError("boom")

    monkeypatch.setattr(openai_chat.Assembler, "feed", broken)
    session = StreamSession(Dialect.OPENAI_CHAT)
    events = session.feed(CHAT_OK)
    assert len(events) == 3  # the wire events still come back for the recorder
    analysis = session.close()
    assert analysis.verdict.kind is U and "internal error" in analysis.verdict.reason
    assert "boom" in analysis.verdict.evidence["bug"]


def test_close_is_idempotent_and_feed_after_close_is_ignored():
    session = StreamSession(Dialect.OPENAI_CHAT)
    session.feed(CHAT_OK)
    first = session.close()
    assert session.feed(b"data: more\n\n") == []
    assert session.close() is first


def test_unknown_dialect_judges_framing_only():
    body = b"event: tick\ndata: 1\n\nevent: tick\ndata: 2\n\n"
    whole = analyze_bytes(body, Dialect.UNKNOWN)
    assert whole.verdict.kind is U and "framing complete (2" in whole.verdict.reason
    assert analyze_bytes(body[:-1], Dialect.UNKNOWN).verdict.kind is T
    lines = b'{"a":1}\n{"b":2}\n'
    assert analyze_bytes(lines, Dialect.UNKNOWN, wire="ndjson").verdict.kind is U
    assert analyze_bytes(lines[:-3], Dialect.UNKNOWN, wire="ndjson").verdict.kind is T


def test_bad_wire_name_is_refused():
    with pytest.raises(ValueError, match="unknown wire"):
        StreamSession(Dialect.OPENAI_CHAT, "xml")


# --- request side ---------------------------------------------------------------------------


def test_check_request_finds_orphan_tool_results():
    anthropic = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "w", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "tool_result", "tool_use_id": "toolu_9", "content": "stale"}]},
    ]}
    findings = check_request(Dialect.ANTHROPIC, anthropic)
    assert len(findings) == 1 and "toolu_9" in findings[0] and "messages[2].content[1]" in findings[0]
    assert check_request(Dialect.BEDROCK_INVOKE, anthropic) == findings

    chat = {"messages": [
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_2", "content": "orphan"},
    ]}
    assert [f for f in check_request(Dialect.OPENAI_CHAT, chat) if "call_2" in f and "messages[2]" in f]
    assert len(check_request(Dialect.OPENAI_CHAT, chat)) == 1

    responses = {"input": [
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
        {"type": "function_call_output", "call_id": "call_7", "output": "orphan"},
    ]}
    assert len(check_request(Dialect.OPENAI_RESPONSES, responses)) == 1
    # with server-side history the request alone cannot tell
    assert check_request(Dialect.OPENAI_RESPONSES, {**responses, "previous_response_id": "resp_1"}) == []

    converse = {"messages": [{"role": "user", "content": [{"toolResult": {"toolUseId": "t9", "content": []}}]}]}
    assert "t9" in check_request(Dialect.BEDROCK_CONVERSE, converse)[0]
    gemini = {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                           {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}},
                                                      {"functionResponse": {"name": "g", "response": {}}}]}]}
    assert len(check_request(Dialect.GEMINI, gemini)) == 1
    # a result placed before its call is an orphan too: providers read the history in order
    before = {"messages": [chat["messages"][1], chat["messages"][0]]}
    assert len(check_request(Dialect.OPENAI_CHAT, before)) == 1
    assert check_request(Dialect.OPENAI_CHAT, "not a dict") == []


def test_check_request_reads_odd_shapes_without_raising():
    """Request bodies come from any client: a value of the wrong type is skipped, never a traceback."""
    chat = {"messages": [
        {"role": "assistant", "tool_calls": 5},
        {"role": "assistant", "tool_calls": [{"id": ["not", "a", "string"]}]},
        {"role": "tool", "tool_call_id": {"odd": 1}, "content": "x"},
        {"role": "tool", "tool_call_id": "call_3", "content": "orphan"},
    ]}
    findings = check_request(Dialect.OPENAI_CHAT, chat)
    assert len(findings) == 2 and "messages[2]" in findings[0] and "call_3" in findings[1]

    responses = {"input": [{"type": None}, {"type": 7, "call_id": "c"},
                           {"type": "function_call_output", "call_id": "call_7"}]}
    findings = check_request(Dialect.OPENAI_RESPONSES, responses)
    assert len(findings) == 1 and "input[2]" in findings[0]

    ollama = {"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]},
                           {"role": "tool", "tool_name": "g", "content": "orphan"}]}
    findings = check_request(Dialect.OLLAMA, ollama)
    assert len(findings) == 1 and "'g'" in findings[0]


def test_check_request_on_recorded_request_bodies():
    captured = [c for c in cassette_responses("pydantic-ai/cassettes/openai-responses/*.yaml") + cassette_responses("pydantic-ai/cassettes/bedrock-mantle/*.yaml")
                if c.request.body]
    if not captured:
        pytest.skip("../shared/fixtures is absent")
    for item in captured:
        detection = detect_dialect(item.request, item.content_type)
        assert check_request(detection.dialect, orjson.loads(item.request.body)) == [], item.name
    # drop the function_call from a recorded follow-up request: its output becomes an orphan
    follow_ups = [c for c in captured if b"function_call_output" in c.request.body]
    assert follow_ups
    body = orjson.loads(follow_ups[0].request.body)
    body["input"] = [i for i in body["input"] if not (isinstance(i, dict) and i.get("type") == "function_call")]
    assert check_request(Dialect.OPENAI_RESPONSES, body)


# --- odd shapes: a provider (or a fault) may put any JSON anywhere ----------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from streamtap.providers.session import make_assembler  # noqa: E402
from streamtap.providers.turn import StreamEnd as _End  # noqa: E402
from streamtap.wire import JSONValue, SSEDecoder  # noqa: E402

ODD = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(["type", "index", "text", "delta", "x"]), inner, max_size=2),
    max_leaves=4,
)

_SAMPLES = {
    Dialect.OPENAI_CHAT: "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse",
    Dialect.OPENAI_RESPONSES: "pydantic-ai/bodies/openai-responses/test_openai_responses_streaming_usage.0.sse",
    Dialect.GEMINI: "pydantic-ai/bodies/google/test_google_streaming_tool_call_thought_signature.0.sse",
}


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


def _replace(value, path, new):
    if not path:
        return new
    value = copy_json(value)
    node = value
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = new
    return value


def copy_json(value):
    return orjson.loads(orjson.dumps(value))


@pytest.mark.parametrize("dialect", sorted(_SAMPLES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_odd_shapes_never_raise_inside_an_assembler(dialect, data):
    body = shared_path("fixtures", _SAMPLES[dialect]).read_bytes()
    decoder = SSEDecoder()
    events = [e for e in decoder.feed(body) if e.data.strip() not in ("", "[DONE]")]
    target = data.draw(st.integers(0, len(events) - 1))
    payload = orjson.loads(events[target].data)
    path = data.draw(st.sampled_from(list(_paths(payload))))
    mutated = _replace(payload, path, data.draw(ODD))
    assembler = make_assembler(dialect, "sse")
    for i, event in enumerate(events):
        if i == target:
            event = type(event)(event.seq, event.start, event.end, event.raw, event.event, orjson.dumps(mutated).decode(), event.id, event.retry)
        assembler.feed(event, None)
    assembler.finish(_End.FINISHED)


@settings(max_examples=60, deadline=None)
@given(value=ODD)
def test_odd_ndjson_lines_never_raise_inside_the_ollama_assembler(value):
    assembler = make_assembler(Dialect.OLLAMA, "ndjson")
    for seq, obj in enumerate(({"message": value, "done": False}, value, {"done": True, "done_reason": value, "message": {"tool_calls": value}})):
        assembler.feed(JSONValue(seq, seq, seq + 1, b"x", obj), None)
    assembler.finish(_End.FINISHED)


def test_a_bug_in_an_assembler_at_the_end_keeps_what_it_assembled(monkeypatch):
    """The verdict is unknown, but the blocks, usage and model already read stay the turn's account."""
    from provider_streams import anthropic

    from streamtap.providers import anthropic as anthropic_assembler

    def broken(self, end):
        raise KeyError("boom")

    body = anthropic("", "Hello there.", {})
    whole = analyze_bytes(body, Dialect.ANTHROPIC)
    monkeypatch.setattr(anthropic_assembler.Assembler, "finish", broken)
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is U and "boom" in analysis.verdict.evidence["bug"]
    assert analysis.turn.text() == whole.turn.text() == "Hello there."
    assert analysis.turn.model == whole.turn.model is not None
