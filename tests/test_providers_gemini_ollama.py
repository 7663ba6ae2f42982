"""Gemini streamGenerateContent (SSE and JSON array) and Ollama NDJSON turns and verdicts."""

from __future__ import annotations

import json
import re

import orjson
import pytest
from provider_streams import (
    C,
    E,
    F,
    L,
    T,
    X,
    cassette_responses,
    chunk_lines,
    cut_points,
    frame_gemini_array,
    frame_gemini_sse,
    sse_spans,
    vercel,
)
from conftest import shared_files, shared_path

from streamtap.providers import BlockKind, Dialect, StreamEnd, VerdictKind, analyze_bytes, detect_dialect, sniff_dialect
from streamtap.wire import JSONArrayDecoder, NDJSONDecoder, Tail

GEMINI, OLLAMA = Dialect.GEMINI, Dialect.OLLAMA

# raw captured Gemini SSE bodies (CRLF framing): (stop, tool call names, text must contain)
GEMINI_BODIES = {
    "test_cancel_recorded_provider_stream__google.0.sse": ("end_turn", [], ""),
    "test_google_model_iter_stream.0.sse": ("tool_use", ["get_capital"], None),
    "test_google_model_iter_stream.1.sse": ("tool_use", ["get_temperature"], None),
    "test_google_model_iter_stream.2.sse": ("end_turn", [], "Paris"),
    "test_google_model_stream.0.sse": ("end_turn", [], ""),
    "test_google_stream_usage_is_live_mid_stream.0.sse": ("end_turn", [], ""),
    "test_google_streaming_tool_call_thought_signature.0.sse": ("tool_use", ["get_country"], None),
    "test_google_streaming_tool_call_thought_signature.1.sse": ("end_turn", [], ""),
}

GEMINI_CHUNKS = {
    "google-text.chunks.txt": "end_turn",
    "google-reasoning.chunks.txt": "end_turn",
    "google-reasoning-gemini3.chunks.txt": "end_turn",
    "google-tool-call.chunks.txt": "tool_use",
    "google-tool-call-gemini3.chunks.txt": "tool_use",
    "google-stream-no-args-tool-call.chunks.txt": "tool_use",
    "google-stream-tool-call-arguments.chunks.txt": "tool_use",
    "google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt": "tool_use",
    "google-vertex-stream-tool-call-arguments-nested.1.chunks.txt": "tool_use",
}


@pytest.mark.parametrize("name", sorted(GEMINI_BODIES))
def test_gemini_captured_body(name):
    body = shared_path("fixtures", "pydantic-ai", "bodies", "google", name).read_bytes()
    assert b"\r\n\r\n" in body  # the real API frames with CRLF
    stop, calls, text = GEMINI_BODIES[name]
    assert sniff_dialect(body).dialect is GEMINI
    analysis = analyze_bytes(body, GEMINI)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.stop_reason == stop
    assert [c.name for c in analysis.turn.tool_calls()] == calls
    assert all(isinstance(c.arguments, dict) for c in analysis.turn.tool_calls())
    if text is not None:
        assert text in analysis.turn.text()
        assert analysis.turn.text().strip()
    assert analysis.turn.usage.total is not None


def test_gemini_usage_is_the_last_snapshot_not_a_sum():
    body = shared_path("fixtures", "pydantic-ai", "bodies", "google", "test_google_stream_usage_is_live_mid_stream.0.sse").read_bytes()
    snapshots = [orjson.loads(line[6:])["usageMetadata"] for line in body.split(b"\r\n") if line.startswith(b"data: ")]
    assert len(snapshots) == 3
    usage = analyze_bytes(body, GEMINI).turn.usage
    assert (usage.input, usage.output, usage.total) == (
        snapshots[-1]["promptTokenCount"], snapshots[-1].get("candidatesTokenCount"), snapshots[-1]["totalTokenCount"])


def test_gemini_cassette_requests_detect_dialect_and_wire():
    shared_path("fixtures", "pydantic-ai", "cassettes", "google")
    captured = cassette_responses("pydantic-ai/cassettes/google/*.yaml")
    assert len(captured) == 8
    for item in captured:
        detection = detect_dialect(item.request, item.content_type)
        assert (detection.dialect, detection.wire) == (GEMINI, "sse"), item.name
        assert analyze_bytes(item.body, GEMINI, wire=detection.wire).verdict.kind is C


@pytest.mark.parametrize("name", sorted(GEMINI_CHUNKS))
@pytest.mark.parametrize("framing", ["sse", "json-array"])
def test_gemini_chunk_lists_reframed(name, framing):
    path = vercel("google", name)
    if not path.exists():
        pytest.skip(f"{path} is absent")
    lines = chunk_lines(path)
    body = frame_gemini_sse(lines) if framing == "sse" else frame_gemini_array(lines)
    detection = sniff_dialect(body)
    assert (detection.dialect, detection.wire) == (GEMINI, framing)
    analysis = analyze_bytes(body, GEMINI, wire=framing)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.stop_reason == GEMINI_CHUNKS[name]
    for call in analysis.turn.tool_calls():
        assert call.name and isinstance(call.arguments, dict) and call.closed
    if framing == "json-array":  # the same array without its closing bracket was cut
        cut = analyze_bytes(frame_gemini_array(lines, close=False), GEMINI, wire="json-array")
        assert cut.verdict.kind is T and "']'" in cut.verdict.reason


def test_gemini_streamed_partial_arguments_merge_into_the_documented_object():
    path = vercel("google", "google-stream-tool-call-arguments.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    # the arguments as the chunks spell them: jsonPath $.location, string pieces appended
    pieces = {}
    for line in chunk_lines(path):
        for candidate in orjson.loads(line).get("candidates", []):
            for part in candidate["content"].get("parts", []):
                for partial in part.get("functionCall", {}).get("partialArgs", []):
                    pieces.setdefault(partial["jsonPath"], []).append(partial["stringValue"])
    calls = analyze_bytes(frame_gemini_sse(chunk_lines(path)), GEMINI).turn.tool_calls()
    assert [c.arguments for c in calls] == [{"location": "Boston"}, {"location": "San Francisco"}]
    assert "".join(pieces["$.location"]) == "BostonSan Francisco"


def test_gemini_thought_parts_are_thinking_by_their_tag():
    chunk = lambda parts, **kw: {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0, **kw}]}  # noqa: E731
    body = frame_gemini_sse([orjson.dumps(c) for c in (
        chunk([{"text": "Considering", "thought": True}]),
        chunk([{"text": "Answer "}]),
        chunk([{"text": " more thought", "thought": True}]),
        chunk([{"text": "done."}, {"text": "", "thoughtSignature": "sig=="}], finishReason="STOP"),
    )])
    turn = analyze_bytes(body, GEMINI).turn
    assert [(b.kind, b.text) for b in turn.blocks] == [
        (BlockKind.THINKING, "Considering"), (BlockKind.TEXT, "Answer "), (BlockKind.THINKING, " more thought"), (BlockKind.TEXT, "done.")
    ]
    assert turn.blocks[-1].signature == "sig=="


# constructed from provider-streams.md §5 (no capture of these exists in ../shared)
def _gemini(*chunks: dict) -> bytes:
    return frame_gemini_sse([orjson.dumps(c) for c in chunks])


TEXT = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Once upon a time"}]}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 4, "totalTokenCount": 8}}


@pytest.mark.parametrize(
    ("reason", "kind", "stop"),
    [("MAX_TOKENS", L, "max_tokens"), ("SAFETY", F, "filtered"), ("RECITATION", F, "filtered"),
     ("MALFORMED_FUNCTION_CALL", E, "malformed_output"), ("OTHER", VerdictKind.UNKNOWN, "other")],
)
def test_gemini_constructed_finish_reasons(reason, kind, stop):
    last = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": reason, "index": 0}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 9, "totalTokenCount": 13}}
    for wire, body in (("sse", _gemini(TEXT, last)), ("json-array", frame_gemini_array([orjson.dumps(TEXT), orjson.dumps(last)]))):
        analysis = analyze_bytes(body, GEMINI, wire=wire)
        assert analysis.verdict.kind is kind, (wire, analysis.verdict)
        assert analysis.turn.stop_reason == stop and analysis.turn.stop_reason_raw == reason
        assert analysis.turn.text() == "Once upon a time"
        assert analysis.turn.usage.output == 9


def test_gemini_constructed_prompt_blocked_and_error():
    blocked = _gemini({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}, "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}})
    analysis = analyze_bytes(blocked, GEMINI)
    assert analysis.verdict.kind is F and "PROHIBITED_CONTENT" in analysis.verdict.reason
    errored = _gemini(TEXT, {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}})
    analysis = analyze_bytes(errored, GEMINI)
    assert analysis.verdict.kind is E and "overloaded" in analysis.verdict.reason and analysis.verdict.seq == 1
    as_array = frame_gemini_array([orjson.dumps(TEXT), b'{"error": {"code": 500, "message": "Internal", "status": "INTERNAL"}}'])
    assert analyze_bytes(as_array, GEMINI, wire="json-array").verdict.kind is E


def test_gemini_no_finish_reason_is_truncated_and_only_the_last_chunk_counts():
    assert analyze_bytes(_gemini(TEXT, TEXT), GEMINI).verdict.kind is T
    early_stop = {"candidates": [{"content": {"role": "model", "parts": [{"text": "a"}]}, "finishReason": "STOP", "index": 0}]}
    # old models stamped STOP on every chunk: a stream that goes on after one is judged by its last chunk
    assert analyze_bytes(_gemini(early_stop, TEXT), GEMINI).verdict.kind is T
    assert analyze_bytes(_gemini(TEXT, early_stop), GEMINI).verdict.kind is C


def test_gemini_http_error_status_with_json_body():
    body = b'[{\n  "error": {\n    "code": 429,\n    "message": "Resource has been exhausted (e.g. check quota).",\n    "status": "RESOURCE_EXHAUSTED"\n  }\n}\n]'
    analysis = analyze_bytes(body, GEMINI, wire="json-array", http_status=429)
    assert analysis.verdict.kind is E
    assert analysis.verdict.reason.startswith("HTTP 429") and "exhausted" in analysis.verdict.reason


@pytest.mark.parametrize("name", ["test_google_model_stream.0.sse", "test_google_streaming_tool_call_thought_signature.1.sse",
                                  "test_google_model_iter_stream.2.sse"])
def test_gemini_cut_anywhere_is_never_complete(name):
    body = shared_path("fixtures", "pydantic-ai", "bodies", "google", name).read_bytes()
    points = cut_points(body, sse_spans(body), inside_per_event=8)
    assert points
    for point in points:
        verdict = analyze_bytes(body[:point], GEMINI).verdict
        assert verdict.kind in (T, X), (point, verdict)


def test_gemini_json_array_cut_anywhere_is_never_complete():
    path = vercel("google", "google-stream-tool-call-arguments.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_gemini_array(chunk_lines(path))
    decoder = JSONArrayDecoder()
    spans = [(e.start, e.end) for e in decoder.feed(body) + decoder.close() if not isinstance(e, Tail)]
    assert analyze_bytes(body, GEMINI, wire="json-array").verdict.kind is C
    for point in cut_points(body, spans, inside_per_event=3):
        verdict = analyze_bytes(body[:point], GEMINI, wire="json-array").verdict
        assert verdict.kind in (T, X), (point, verdict)


# ---------------------------------------------------------------------------------------
# Ollama: no capture in ../shared; streams constructed from provider-streams.md §6.1


def ndjson(*objects: dict) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objects)


CHAT = [
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.09Z", "message": {"role": "assistant", "content": "", "thinking": "User asks weather"}, "done": False},
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.10Z", "message": {"role": "assistant", "content": "Checking."}, "done": False},
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.11Z", "message": {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_x1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Tokyo"}}}]}, "done": False},
    {"model": "qwen3", "created_at": "2025-10-26T17:15:24.19Z", "message": {"role": "assistant", "content": ""}, "done": True,
     "done_reason": "stop", "total_duration": 182242375, "prompt_eval_count": 169, "eval_count": 15},
]
GENERATE = [
    {"model": "llama3.2", "created_at": "t", "response": "The", "done": False},
    {"model": "llama3.2", "created_at": "t", "response": " sky", "done": False},
    {"model": "llama3.2", "created_at": "t", "response": " is blue.", "done": True, "done_reason": "stop", "context": [1, 2], "prompt_eval_count": 26, "eval_count": 290},
]


def test_ollama_chat_turn():
    body = ndjson(*CHAT)
    assert sniff_dialect(body).dialect is OLLAMA
    analysis = analyze_bytes(body, OLLAMA)
    turn = analysis.turn
    assert analysis.verdict.kind is C and turn.stop_reason == "tool_use"
    assert [b.kind for b in turn.blocks] == [BlockKind.THINKING, BlockKind.TEXT, BlockKind.TOOL_CALL]
    call = turn.tool_calls()[0]
    assert (call.id, call.name, call.arguments) == ("call_x1", "get_weather", {"city": "Tokyo"})
    assert (turn.usage.input, turn.usage.output, turn.usage.total) == (169, 15, 184)
    assert turn.model == "qwen3"


def test_ollama_generate_turn_and_length():
    analysis = analyze_bytes(ndjson(*GENERATE), OLLAMA)
    assert analysis.verdict.kind is C and analysis.turn.text() == "The sky is blue."
    limited = [*GENERATE[:-1], {**GENERATE[-1], "done_reason": "length"}]
    assert analyze_bytes(ndjson(*limited), OLLAMA).verdict.kind is L


@pytest.mark.parametrize("reason", ["absent", "", None])
def test_an_ollama_done_line_without_a_done_reason_is_unknown_not_a_guessed_stop(reason):
    """Servers before done_reason sent none, and "" is a connection the server saw close: neither
    tells a finish from a length cut, so the turn does not claim the provider said "stop"."""
    done = {k: v for k, v in GENERATE[-1].items() if k != "done_reason"}
    if reason != "absent":
        done["done_reason"] = reason
    analysis = analyze_bytes(ndjson(*GENERATE[:-1], done), OLLAMA)
    assert analysis.verdict.kind is VerdictKind.UNKNOWN and "without a stop reason" in analysis.verdict.reason, analysis.verdict
    assert analysis.turn.stop_reason_raw is None and analysis.turn.text() == "The sky is blue."


def test_ollama_error_line_and_detection():
    analysis = analyze_bytes(ndjson(*GENERATE[:2], {"error": "an error was encountered while running the model"}), OLLAMA)
    assert analysis.verdict.kind is E and "error was encountered" in analysis.verdict.reason and analysis.verdict.seq == 2
    from streamtap.providers import RequestInfo

    for path, body in (("/api/chat", b'{"model":"qwen3","messages":[{"role":"user","content":"hi"}]}'),
                       ("/api/generate", b'{"model":"x","prompt":"hi"}')):
        detection = detect_dialect(RequestInfo("POST", f"http://127.0.0.1:11434{path}", {}, body), "application/x-ndjson")
        assert (detection.dialect, detection.wire, detection.streaming) == (OLLAMA, "ndjson", True)
    not_streamed = b'{"model":"qwen3","messages":[{"role":"user","content":"hi"}],"stream": false}'
    off = detect_dialect(RequestInfo("POST", "http://127.0.0.1:11434/api/chat", {}, not_streamed), "application/json")
    assert (off.dialect, off.streaming) == (OLLAMA, False)


def test_ollama_bad_line_is_corrupt_and_cuts_are_never_complete():
    body = ndjson(*CHAT)
    broken = body.replace(b'"content":"Checking."', b'"content":"Checking.', 1)
    verdict = analyze_bytes(broken, OLLAMA).verdict
    assert verdict.kind is X and verdict.seq == 1
    decoder = NDJSONDecoder()
    spans = [(e.start, e.end) for e in decoder.feed(body) + decoder.close()]
    for point in cut_points(body, spans, inside_per_event=5):
        for end in (StreamEnd.FINISHED, StreamEnd.UPSTREAM_RESET, StreamEnd.CLIENT_ABORTED):
            verdict = analyze_bytes(body[:point], OLLAMA, end=end).verdict
            assert verdict.kind is T, (point, verdict)
    # a last line that parses but lacks its newline is a cut where the body was cut; in a body that
    # ended cleanly the client reads it (see test_a_last_line_without_its_line_end_that_the_client_reads)
    assert analyze_bytes(body[:-1], OLLAMA, end=StreamEnd.UPSTREAM_RESET).verdict.kind is T


def test_every_gemini_body_is_covered():
    names = {p.name for p in shared_files("pydantic-ai/bodies/google/*.sse")}
    if not names:
        pytest.skip("../shared/fixtures is absent")
    assert names == set(GEMINI_BODIES)


def test_gemini_raw_json_error_without_data_lines():
    """Constructed (provider-streams.md §5.1): an error written as multi-line JSON, no data: prefix."""
    error = b'{\r\n  "error": {\r\n    "code": 503,\r\n    "message": "The model is overloaded.",\r\n    "status": "UNAVAILABLE"\r\n  }\r\n}\r\n'
    for tail in (error, error + b"\r\n"):
        analysis = analyze_bytes(_gemini(TEXT) + tail, GEMINI)
        assert analysis.verdict.kind is E and "overloaded" in analysis.verdict.reason, analysis.verdict
        assert analysis.turn.error["status"] == "UNAVAILABLE"
    # bytes that are not an error object stay a cut
    assert analyze_bytes(_gemini(TEXT) + b'{"candidates": [', GEMINI).verdict.kind is T


@pytest.mark.parametrize("stitched", [
    [*CHAT[:2], *({**line, "model": "qwen3:32b"} for line in CHAT[2:])],  # another model's answer
    [*GENERATE[:2], CHAT[-1]],  # a chat line ends a generate answer
    [CHAT[1], *GENERATE[1:]],  # a generate tail on a chat head
], ids=["model-changes", "generate-then-chat", "chat-then-generate"])
def test_ollama_lines_of_another_answer_are_corrupt(stitched):
    """Every line of one answer names the same model and has the same shape: a line that does not
    belongs to another answer (the ollama client reads a mix as the wrong text, or fails)."""
    verdict = analyze_bytes(ndjson(*stitched), OLLAMA).verdict
    assert verdict.kind is X and "two generations" in verdict.reason, verdict


THOUGHT_THEN_TEXT = [("thinking", "User asks"), ("thinking", " about the sky"), ("content", "The"), ("content", " sky"),
                     ("content", " is"), ("content", " blue.")]
# the answer opens the same way twice, as a second paragraph may: only the lines that open it recur
OPENS_TWICE = [("content", "The"), ("content", " sky"), ("content", " is"), ("content", " blue."), ("content", "\n\n"),
               ("content", "The"), ("content", " sky"), ("content", " is"), ("content", " wide.")]


def _ollama_answer(shape: str, parts: list[tuple[str, str]], stamps: bool = True) -> list[dict]:
    """An answer as Ollama streams it: every line stamped by the server's clock (Go's RFC 3339 with
    nanoseconds, trailing zeros trimmed; or one stamp on every line, as a coarse clock or a mock
    gives), ending with the done line. ``parts``: (field, text) per line, the field ``thinking`` or
    ``content`` (generate's ``response``)."""
    def stamp(i: int) -> str:
        seconds, ns = divmod(91_352_148 + i * 18_607_233, 10**9)
        return f"2025-10-26T17:15:{24 + seconds:02d}.{ns:09d}".rstrip("0") + "Z" if stamps else "2025-10-26T17:15:24Z"

    lines = []
    for i, (field, text) in enumerate(parts):
        line = {"model": "qwen3", "created_at": stamp(i)}
        if shape == "chat":
            line["message"] = {"role": "assistant", "content": "", field: text}
        else:
            line.update({"response": "", "response" if field == "content" else field: text})
        lines.append({**line, "done": False})
    final = {"message": {"role": "assistant", "content": ""}} if shape == "chat" else {"response": ""}
    return [*lines, {"model": "qwen3", "created_at": stamp(len(parts)), **final, "done": True, "done_reason": "stop",
                     "total_duration": 182242375, "prompt_eval_count": 12, "eval_count": len(parts)}]


@pytest.mark.parametrize("shape", ["chat", "generate"])
def test_an_ollama_answer_replayed_from_its_start_after_a_cut_is_not_complete(shape):
    """A proxy that retries after a cut and stitches the new answer on replays it from its start:
    the model and shape stay the same, and the ollama client hands the app the text twice without
    raising. The lines the body began with come back byte for byte (their created_at too), which
    real answers never do: the answer is not complete, at every line boundary, however chunked."""
    body = ndjson(*_ollama_answer(shape, THOUGHT_THEN_TEXT))
    whole = analyze_bytes(body, OLLAMA)
    assert whole.verdict.kind is C, whole.verdict  # the control: the answer alone
    ends = [event.end for event in NDJSONDecoder().feed(body)]
    for cut in ends[:-1]:
        stitched = body[:cut] + body
        analysis = analyze_bytes(stitched, OLLAMA)
        verdict = analysis.verdict
        assert analysis.turn.blocks != whole.turn.blocks  # the app got part of the answer twice
        assert verdict.kind is VerdictKind.UNKNOWN and "replayed from its start" in verdict.reason, (cut, verdict)
        assert (verdict.seq, verdict.offset) == (ends.index(cut) + 1, cut), (cut, verdict)
        for size in (1, 7):
            assert analyze_bytes(stitched, OLLAMA, chunk_size=size).verdict == verdict, (cut, size)


@pytest.mark.parametrize("stamps", [True, False], ids=["nanosecond-clock", "one-stamp"])
@pytest.mark.parametrize("shape", ["chat", "generate"])
def test_an_ollama_answer_that_opens_the_same_way_twice_stays_complete(shape, stamps):
    """With the server's clock no line comes back byte for byte; and where every line has one stamp,
    an answer whose words open it again brings back only some of the lines it began with: neither
    is a replay."""
    body = ndjson(*_ollama_answer(shape, OPENS_TWICE, stamps))
    analysis = analyze_bytes(body, OLLAMA)
    assert analysis.verdict.kind is C and not analysis.turn.notes, analysis.verdict
    assert analysis.turn.text() == "The sky is blue.\n\nThe sky is wide."
    assert analyze_bytes(body, OLLAMA, chunk_size=1).verdict == analysis.verdict


def ollama_client_reads(body: bytes) -> list[dict]:
    """The ollama Python client's reading of a streamed body: ``json.loads`` of every line httpx's
    ``iter_lines`` gives (``str.splitlines`` rules); raises where the client raises."""
    import json

    import httpx

    return [json.loads(line) for line in httpx.Response(200, content=body).iter_lines()]


def _with_text(text: str) -> list[dict]:
    return [{**CHAT[1], "message": {"role": "assistant", "content": text}}, CHAT[-1]]


CLIENT_FAILS = {  # Ollama NDJSON the decoder reads whole, but the ollama client fails on: (body, reason holds)
    "blank line between lines": (ndjson(*CHAT[:2]) + b"\n" + ndjson(*CHAT[2:]), "a blank line at byte"),
    "blank line first": (b"\n" + ndjson(*CHAT), "a blank line at byte 0,"),
    "line of spaces": (ndjson(*CHAT[:2]) + b"  \t\n" + ndjson(*CHAT[2:]), "a blank line"),
    "blank CRLF line": (ndjson(*CHAT[:2]).replace(b"\n", b"\r\n") + b"\r\n" + ndjson(*CHAT[2:]), "a blank line"),
    "blank line after the done line": (ndjson(*CHAT) + b"\n", "after the last line"),
    "raw U+0085": (ndjson(*_with_text("caf\u0085e")), "raw U+0085 (NEL)"),
    "raw U+2028": (ndjson(*_with_text("a\u2028b")), "raw U+2028"),
    "raw U+2029": (ndjson(*_with_text("a\u2029b")), "raw U+2029"),
    "CR before CRLF": (ndjson(*CHAT[:2]) + orjson.dumps(CHAT[2]) + b"\r\r\n" + ndjson(CHAT[3]), "raw CR not before the LF"),
}


@pytest.mark.parametrize("name", CLIENT_FAILS)
def test_ollama_lines_the_client_splits_otherwise_are_corrupt(name):
    """The ollama client reads lines with httpx's iter_lines, which gives blank lines and also breaks
    at NEL, U+2028, U+2029 and a lone CR (JSON may hold the first three raw in a string), and
    parses every piece as JSON: where it fails, the stream is not complete, however it is chunked."""
    body, says = CLIENT_FAILS[name]
    with pytest.raises(ValueError):
        ollama_client_reads(body)
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is X and says in verdict.reason and "the ollama client" in verdict.reason, verdict
    for size in (1, 7):
        chunked = analyze_bytes(body, OLLAMA, chunk_size=size).verdict
        assert (chunked.kind, chunked.reason, chunked.seq, chunked.offset) == (verdict.kind, verdict.reason, verdict.seq, verdict.offset)


@pytest.mark.parametrize("body", [
    ndjson(*CHAT).replace(b"\n", b"\r\n"),  # CRLF ends one line for both
    ndjson(*_with_text("caf\u00e9 \u2026 \u4e2d")),  # other non-ASCII text, raw
    ndjson(*CHAT[:-1]).replace(b'"Checking."', b'"Checking\\u0085\\u2028."') + ndjson(CHAT[-1]),  # escaped, as Go writes U+2028
], ids=["crlf", "non-ascii", "escaped"])
def test_ollama_lines_the_client_reads_whole_stay_complete(body):
    assert ollama_client_reads(body)
    assert analyze_bytes(body, OLLAMA).verdict.kind is C
    assert analyze_bytes(body, OLLAMA, chunk_size=1).verdict.kind is C


FINISH = {"candidates": [{"content": {"role": "model", "parts": [{"text": "."}]}, "finishReason": "STOP", "index": 0}],
          "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 5, "totalTokenCount": 9}}


@pytest.mark.parametrize(("between", "kind", "words"), [
    (b": keep-alive\r\n\r\n", X, "not a 'data: ' line"),
    (b"data:" + orjson.dumps(TEXT) + b"\r\n\r\n", X, "not a 'data: ' line"),
    (orjson.dumps(TEXT) + b"\r\n\r\n", X, "google-genai reads it"),
    (b'{\r\n  "error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}\r\n}\r\n\r\n', E, "overloaded"),
], ids=["comment", "data-without-space", "chunk-without-data", "raw-error"])
def test_gemini_lines_that_are_not_data_lines_are_read_as_google_genai_reads_them(between, kind, words):
    """google-genai reads no SSE but ``data: `` lines: it parses every other line as JSON, fails on
    a comment or a field, raises on an error object and takes any other object as a chunk. The
    SSE rules skip all of them, so the turn cannot be complete."""
    body = _gemini(TEXT) + between + _gemini(FINISH)
    assert analyze_bytes(_gemini(TEXT) + _gemini(FINISH), GEMINI).verdict.kind is C
    for size in (None, 1, 7):
        verdict = analyze_bytes(body, GEMINI, chunk_size=size).verdict
        assert verdict.kind is kind and words in verdict.reason, (size, verdict)
        assert verdict.offset == len(_gemini(TEXT))


def google_genai_reads(body: bytes, transport: str) -> list:
    """What google-genai (3.4.0 and later) makes of an ``alt=sse`` body, as its code reads lines:
    through aiohttp a line ends at LF and loses its trailing blanks; through httpx it ends at CR,
    LF or CRLF and keeps them. Then empty lines are skipped, a ``data: `` line's rest is one chunk,
    and other lines are gathered until their braces balance and parsed as one. Raises ValueError
    where the client raises."""
    if transport == "aiohttp":
        lines = [line.decode().rstrip() for line in body.split(b"\n")]
    else:
        lines = [line.decode() for line in re.split(rb"\r\n|\r|\n", body)]
    chunks, gathered, balance = [], "", 0
    for line in lines:
        if not line:
            continue
        if line.startswith("data: "):
            chunks.append(json.loads(line[6:]))
            continue
        balance += line.count("{") - line.count("}")
        gathered += line
        if balance == 0:
            chunks.append(json.loads(gathered))
            gathered = ""
    if gathered:
        chunks.append(json.loads(gathered))
    return chunks


@pytest.mark.parametrize("blank, last", [(b" \r\n", False), (b"\t \r\n", False), (b" ", True), (b"\t", True),
                                         (b"\r\n ", True)], ids=["space", "tab-space", "unended-space",
                                                                 "unended-tab", "blank-then-unended-space"])
def test_a_gemini_line_of_blanks_is_unknown_as_google_genai_transports_disagree_on_it(blank, last):
    """A line of only blanks is no SSE field: the rules skip it. google-genai's aiohttp reader
    strips it to nothing and skips it too; its httpx reader parses it as JSON and fails. A last
    line without its line end is read at the body's end like any other."""
    for body in (_gemini(TEXT) + blank + _gemini(FINISH), _gemini(TEXT, FINISH) + blank):
        if last and not body.endswith(blank):
            continue
        assert len(google_genai_reads(body, "aiohttp")) == 2
        with pytest.raises(ValueError):
            google_genai_reads(body, "httpx")
        for size in (None, 1, 7):
            verdict = analyze_bytes(body, GEMINI, chunk_size=size).verdict
            assert verdict.kind is VerdictKind.UNKNOWN and "depends on its transport" in verdict.reason, (size, verdict)
            assert verdict.offset == body.rindex(blank.lstrip(b"\r\n")), (size, verdict)
    whole = _gemini(TEXT, FINISH)
    assert len(google_genai_reads(whole, "aiohttp")) == len(google_genai_reads(whole, "httpx")) == 2
    assert analyze_bytes(whole, GEMINI).verdict.kind is C


def test_gemini_raw_error_mid_stream_is_errored_however_long_and_whatever_follows():
    """google-genai gathers the lines of a raw JSON object until its braces balance, then raises
    the error it holds: a long pretty-printed error, or one with other lines after it, is errored."""
    details = b"".join(b'      {"@type": "type.googleapis.com/x", "n": %d},\r\n' % i for i in range(24))
    long_error = (b'{\r\n  "error": {\r\n    "code": 429,\r\n    "message": "quota",\r\n    "details": [\r\n'
                  + details + b'      {}\r\n    ]\r\n  }\r\n}\r\n\r\n')
    short_error = b'{"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}\r\n\r\n'
    for between in (long_error, short_error + b": keep-alive\r\n\r\n"):
        verdict = analyze_bytes(_gemini(TEXT) + between + _gemini(FINISH), GEMINI).verdict
        assert verdict.kind is E, verdict


@pytest.mark.parametrize(("flag", "thinking"), [(True, "A"), ("true", "A"), (1, "A"), (1.0, "A"), ("On", "A"), (False, ""),
                                              ("false", ""), ("0", ""), (0, ""), (0.0, ""), ("off", "")])
def test_gemini_thought_flag_is_read_as_the_client_reads_a_bool(flag, thinking):
    """google-genai reads ``thought`` as a bool field: the string "false" or 0 is false, and that
    part's text stays in the answer; 1.0 is true, as 1 (checked with google-genai 3.6.1)."""
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": "A", "thought": flag}, {"text": "B"}]}, "index": 0}]}
    turn = analyze_bytes(_gemini(chunk, FINISH), GEMINI).turn
    assert turn.thinking() == thinking
    assert turn.text() == ("B." if thinking else "AB.")


@pytest.mark.parametrize("flag", [True, False, 0, 1, 0.0, 1.0, -0.0, 2, 0.5, "TRUE", " true", "true ", "1.0", "Y", "no", "",
                                  "x", None])
def test_gemini_thought_flag_is_a_thought_exactly_where_pydantic_reads_it_true(flag):
    """google-genai's Part.thought is pydantic's lax bool: a flag it refuses fails the chunk, one it
    reads as true makes the text a thought. The shape check and the turn share one reading of it."""
    from pydantic import TypeAdapter, ValidationError

    try:
        read = TypeAdapter(bool | None).validate_python(flag)
    except ValidationError:
        read = "refused"
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": "A", "thought": flag}, {"text": "B"}]}, "index": 0}]}
    analysis = analyze_bytes(_gemini(chunk, FINISH), GEMINI)
    if read == "refused":
        assert analysis.verdict.kind is X and "parts[0].thought" in analysis.verdict.reason, analysis.verdict
    else:
        assert analysis.verdict.kind is C, analysis.verdict
        assert (analysis.turn.thinking(), analysis.turn.text()) == (("A", "B.") if read else ("", "AB."))


def genai_httpx_reads(body: bytes) -> list[dict]:
    """google-genai before 3.4.0 reading through httpx: ``json.loads`` of every ``data: `` line
    httpx's ``iter_lines`` gives (``str.splitlines`` rules); raises where the client raises (other
    lines, which it gathers and parses too, are left out: the bodies below have none)."""
    import json

    import httpx

    return [json.loads(line[6:]) for line in httpx.Response(200, content=body).iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("brk", ["\u0085", "\u2028", "\u2029"], ids=["NEL", "LS", "PS"])
def test_gemini_raw_line_breaks_google_genai_splits_at_leave_an_ended_answer_unknown(brk):
    """JSON may hold U+0085, U+2028 and U+2029 raw in a string. google-genai before 3.4.0 reading
    through httpx breaks the line there and fails on the pieces; 3.4.0 on, and its aiohttp transport,
    read it whole: whether the app read the answer depends on what it runs, so an answer that ended
    is unknown, and any other verdict keeps its kind with a note."""
    chunk = {**TEXT, "candidates": [{**TEXT["candidates"][0], "content": {"role": "model", "parts": [{"text": f"a{brk}b"}]}}]}
    body = _gemini(chunk, FINISH)
    with pytest.raises(ValueError):
        genai_httpx_reads(body)
    offset = body.index(brk.encode())
    verdict = analyze_bytes(body, GEMINI).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and f"raw U+{ord(brk):04X}" in verdict.reason, verdict
    assert "google-genai before 3.4.0" in verdict.reason and verdict.offset == offset
    for size in (1, 7):
        chunked = analyze_bytes(body, GEMINI, chunk_size=size).verdict
        assert (chunked.kind, chunked.reason, chunked.offset) == (verdict.kind, verdict.reason, verdict.offset)
    limited = {**FINISH, "candidates": [{**FINISH["candidates"][0], "finishReason": "MAX_TOKENS"}]}
    assert analyze_bytes(_gemini(chunk, limited), GEMINI).verdict.kind is VerdictKind.UNKNOWN
    cut = analyze_bytes(_gemini(chunk), GEMINI)  # no finishReason: still a cut, and it says what it holds
    assert cut.verdict.kind is T and any("google-genai before 3.4.0" in note for note in cut.turn.notes), cut.turn.notes
    escaped = _gemini(TEXT).replace(b"Once upon", b"Once\\u2028upon") + _gemini(FINISH)  # as Google writes them
    assert genai_httpx_reads(escaped) and analyze_bytes(escaped, GEMINI).verdict.kind is C


def test_gemini_utf8_bom_google_genai_keeps_is_corrupt():
    """The SSE rules drop a BOM at the start; google-genai decodes lines as utf-8 and keeps it, so
    its first line is no ``data: `` line, and it fails to parse it (every version, every transport)."""
    import json

    import httpx

    body = b"\xef\xbb\xbf" + _gemini(TEXT, FINISH)
    first = next(httpx.Response(200, content=body).iter_lines())
    assert first.startswith("\ufeffdata: ")
    with pytest.raises(ValueError):
        json.loads(first)
    for size in (None, 1, 2, 7):
        verdict = analyze_bytes(body, GEMINI, chunk_size=size).verdict
        assert verdict.kind is X and "UTF-8 BOM at byte 0" in verdict.reason and verdict.offset == 0, (size, verdict)
    assert analyze_bytes(_gemini(TEXT, FINISH), GEMINI).verdict.kind is C


def ollama_client_takes(body: bytes, generate: bool = False) -> None:
    """The ollama Python client (0.4 and later) builds a ChatResponse (``generate``: a GenerateResponse)
    of every line: the models' fields streamtap judges, transcribed from ollama/_types.py (0.6.3).
    Raises where the client raises."""
    from collections.abc import Mapping, Sequence
    from typing import Any

    from pydantic import BaseModel

    class Function(BaseModel):
        name: str
        arguments: Mapping[str, Any]

    class ToolCall(BaseModel):
        function: Function

    class Message(BaseModel):
        role: str
        content: str | None = None
        thinking: str | None = None
        tool_name: str | None = None
        tool_calls: Sequence[ToolCall] | None = None

    class BaseGenerateResponse(BaseModel):
        model: str | None = None
        created_at: str | None = None
        done: bool | None = None
        done_reason: str | None = None
        total_duration: int | None = None
        load_duration: int | None = None
        prompt_eval_count: int | None = None
        prompt_eval_duration: int | None = None
        eval_count: int | None = None
        eval_duration: int | None = None

    class ChatResponse(BaseGenerateResponse):
        message: Message

    class GenerateResponse(BaseGenerateResponse):
        response: str | None = None
        thinking: str | None = None

    for line in ollama_client_reads(body):
        if line.get("error"):  # as the client: a non-empty error raises before the line is built
            raise ValueError(line["error"])
        (GenerateResponse if generate else ChatResponse)(**line)


OLLAMA_CALLS_REFUSED = {  # a chat line's tool_calls the ollama client refuses: (tool_calls, reason holds)
    "no function": ([{"id": "call_1"}], "tool call 0 has nothing for its function"),
    "null function": ([{"function": None}], "tool call 0 has null for its function"),
    "no name": ([{"function": {"arguments": {"city": "Tokyo"}}}], "has nothing for its function's name"),
    "null name": ([{"function": {"name": None, "arguments": {}}}], "has null for its function's name"),
    "number name": ([{"function": {"name": 7, "arguments": {}}}], "has a number for its function's name"),
    "array arguments": ([{"function": {"name": "get_weather", "arguments": [1]}}], "has an array for its function's arguments"),
    "null arguments": ([{"function": {"name": "get_weather", "arguments": None}}], "has null for its function's arguments"),
    "string arguments": ([{"function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}], "has a string for"),
    "no arguments": ([{"function": {"name": "get_weather"}}], "has nothing for its function's arguments"),
    "second call": ([CHAT[2]["message"]["tool_calls"][0], {"function": {"name": "f"}}], "tool call 1 has nothing"),
    "call not an object": (["get_weather"], "tool call 0 is a string, not an object"),
    "tool_calls an object": ({"function": {"name": "get_weather", "arguments": {}}}, "tool_calls is an object, not an array"),
}


@pytest.mark.parametrize("name", OLLAMA_CALLS_REFUSED)
def test_ollama_tool_calls_the_client_refuses_are_corrupt(name):
    """Since 0.4 the ollama client validates every line: a tool call needs a function with a string
    name and an object of arguments, and a line without raises, however the rest of it reads."""
    calls, says = OLLAMA_CALLS_REFUSED[name]
    lines = [*CHAT[:2], {**CHAT[2], "message": {**CHAT[2]["message"], "tool_calls": calls}}, CHAT[3]]
    body = ndjson(*lines)
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        ollama_client_takes(body)
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is X and says in verdict.reason and "the ollama client" in verdict.reason, verdict
    assert (verdict.seq, verdict.offset) == (2, len(ndjson(*CHAT[:2])))


def test_ollama_tool_call_without_a_name_the_client_takes_is_still_corrupt():
    """An empty name passes the client's validation, but names no function the app can call."""
    lines = [*CHAT[:2], {**CHAT[2], "message": {**CHAT[2]["message"], "tool_calls": [
        {"function": {"name": "", "arguments": {}}}]}}, CHAT[3]]
    body = ndjson(*lines)
    ollama_client_takes(body)
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is X and "names no function" in verdict.reason and verdict.seq == 2, verdict


def test_ollama_tool_calls_the_client_takes_stay_complete():
    calls = [CHAT[2]["message"]["tool_calls"][0], {"function": {"name": "now", "arguments": {}}}]
    body = ndjson(*CHAT[:2], {**CHAT[2], "message": {**CHAT[2]["message"], "tool_calls": calls}}, CHAT[3])
    ollama_client_takes(body)
    analysis = analyze_bytes(body, OLLAMA)
    assert analysis.verdict.kind is C and [c.name for c in analysis.turn.tool_calls()] == ["get_weather", "now"]
    nulled = ndjson(*CHAT[:2], {**CHAT[2], "message": {**CHAT[2]["message"], "tool_calls": None}}, CHAT[3])
    ollama_client_takes(nulled)  # a null list is no call, as the client reads it
    assert analyze_bytes(nulled, OLLAMA).verdict.kind is C


def _last_chat_line(**fields) -> dict:
    return {k: v for k, v in {**CHAT[3], **fields}.items() if v is not _DROP}


_DROP = object()
OLLAMA_CHAT_LINES_REFUSED = {  # a chat stream's last line the ollama client refuses: (line, reason holds)
    # the done line as Ollama's docs/api.md drew it: no message
    "done line without message": (_last_chat_line(message=_DROP), "has nothing for its message, not an object"),
    "null message": (_last_chat_line(message=None), "has null for its message"),
    "message without role": (_last_chat_line(message={"content": ""}), "has nothing for its message's role"),
    "number role": (_last_chat_line(message={"role": 1, "content": ""}), "has a number for its message's role"),
    "empty error line": ({"error": ""}, "has nothing for its message"),
    "number content": (_last_chat_line(message={"role": "assistant", "content": 7}), "has a number for its message's content"),
    "array thinking": (_last_chat_line(message={"role": "assistant", "thinking": ["a"]}), "has an array for its message's thinking"),
    "number model": (_last_chat_line(model=3), "has a number for its model, not a string"),
    "bool created_at": (_last_chat_line(created_at=True), "has a boolean for its created_at"),
    "number done_reason": (_last_chat_line(done_reason=1), "has a number for its done_reason"),
    "fraction count": (_last_chat_line(eval_count=1.5), "has a fraction for its eval_count, not an integer"),
    "object duration": (_last_chat_line(total_duration={}), "has an object for its total_duration"),
}


@pytest.mark.parametrize("name", OLLAMA_CHAT_LINES_REFUSED)
def test_ollama_chat_lines_the_client_refuses_are_corrupt(name):
    """Since 0.4 the ollama client builds a ChatResponse of every /api/chat line: a message with a
    string role is required, and strings, counts and durations must be what the model declares."""
    refused, says = OLLAMA_CHAT_LINES_REFUSED[name]
    body = ndjson(*CHAT[:3], refused) if refused.get("done") else ndjson(*CHAT[:3], refused, CHAT[3])
    with pytest.raises(ValueError):
        ollama_client_takes(body)
    for size in (None, 1):
        verdict = analyze_bytes(body, OLLAMA, chunk_size=size).verdict
        assert verdict.kind is X and says in verdict.reason and "the ollama client" in verdict.reason, verdict
        assert (verdict.seq, verdict.offset) == (3, len(ndjson(*CHAT[:3])))


def test_an_ollama_line_without_a_shape_before_a_chat_line_is_refused_there():
    """A first line of only an empty error shows no shape; the next shows a chat stream, whose client
    refuses that first line (no message)."""
    body = ndjson({"error": ""}, *CHAT)
    with pytest.raises(ValueError):
        ollama_client_takes(body)
    analysis = analyze_bytes(body, OLLAMA)
    assert analysis.verdict.kind is X and analysis.verdict.seq == 0 and "line 1 shows an /api/chat" in analysis.verdict.reason
    assert not any("empty error" in note for note in analysis.turn.notes), analysis.turn.notes


@pytest.mark.parametrize("lines", [
    [*GENERATE[:-1], {k: v for k, v in GENERATE[-1].items() if k != "response"}],  # a done line of counts
    [{"error": ""}, *GENERATE],  # an empty error first, then generate lines: read on
    [*GENERATE[:-1], {**GENERATE[-1], "eval_count": 290.0, "message": None}],  # an integral float; a stray key
], ids=["counts only", "empty error first", "lax"])
def test_ollama_generate_lines_the_client_takes_stay_complete(lines):
    """GenerateResponse requires no field: a line without response is taken."""
    body = ndjson(*lines)
    ollama_client_takes(body, generate=True)
    analysis = analyze_bytes(body, OLLAMA)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.text() == "".join(line.get("response", "") for line in lines)


def test_ollama_generate_line_the_client_refuses_is_corrupt():
    body = ndjson(GENERATE[0], {**GENERATE[1], "response": 7}, GENERATE[2])
    with pytest.raises(ValueError):
        ollama_client_takes(body, generate=True)
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is X and "has a number for its response" in verdict.reason and verdict.seq == 1, verdict


def test_an_ollama_count_written_as_a_string_leaves_the_answer_unknown():
    """pydantic reads "15" as 15 and refuses "x": streamtap does not parse as pydantic does, and says so."""
    for count in ("15", "x"):
        verdict = analyze_bytes(ndjson(*CHAT[:3], {**CHAT[3], "eval_count": count}), OLLAMA).verdict
        assert verdict.kind is VerdictKind.UNKNOWN and "a string for its eval_count" in verdict.reason, verdict


UNENDED_LAST = {  # a body whose last event arrived whole, without the line end(s) after it: (dialect, body, cut)
    "gemini, no blank line": (GEMINI, _gemini(TEXT, FINISH), 2),
    "gemini, no line end": (GEMINI, _gemini(TEXT, FINISH), 4),
    "ollama, no newline": (OLLAMA, ndjson(*CHAT), 1),
}


@pytest.mark.parametrize("name", UNENDED_LAST)
def test_a_last_line_without_its_line_end_that_the_client_reads(name):
    """google-genai gives the app the data lines it gathered at the end of the body, and the ollama
    client's line reader (httpx iter_lines) the last line without its newline: where the body ended
    cleanly, the app got the whole answer. Where it was cut, the SDK raises: truncated."""
    dialect, body, cut = UNENDED_LAST[name]
    whole = analyze_bytes(body, dialect)
    assert whole.verdict.kind is C
    for size in (None, 1, 7):
        analysis = analyze_bytes(body[:-cut], dialect, chunk_size=size)
        verdict = analysis.verdict
        assert verdict.kind is C and verdict.evidence["body_ended_without_line_end"] is True, verdict
        assert "without the line end after it" in verdict.reason and "not dispatched" not in verdict.reason
        assert analysis.turn.text() == whole.turn.text() and analysis.turn.usage.output == whole.turn.usage.output
    for end in (StreamEnd.UPSTREAM_RESET, StreamEnd.PROXY_ENDED, StreamEnd.CLIENT_ABORTED):
        verdict = analyze_bytes(body[:-cut], dialect, end=end).verdict
        assert verdict.kind is T and "body_ended_without_line_end" not in verdict.evidence, (end, verdict)


def _text_chunk(**part) -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": "A", **part}]}, "index": 0}]}


def _usage(**counts) -> dict:
    return {**FINISH, "usageMetadata": {**FINISH["usageMetadata"], **counts}}


# Chunks google-genai 3.6.1's GenerateContentResponse (pydantic, lax mode) refuses: it raises a
# ValidationError in generate_content_stream, Gemini API and Vertex AI alike (checked against the real
# SDK; not a test dependency): (chunk before FINISH, or FINISH changed, the reason's path)
GEMINI_CHUNKS_REFUSED = {
    "fraction count": (_usage(totalTokenCount=5.5), "usageMetadata.totalTokenCount is a number (5.5)"),
    "non-numeric string count": (_usage(promptTokenCount="x"), "usageMetadata.promptTokenCount is a string"),
    "list count": (_usage(thoughtsTokenCount=[]), "usageMetadata.thoughtsTokenCount is a list"),
    "usage as a string": ({**FINISH, "usageMetadata": "x"}, "usageMetadata is a string"),
    "number text": (_text_chunk(text=7), "parts[0].text is a number"),
    "boolean text": (_text_chunk(text=True), "parts[0].text is a boolean"),
    "thought []": (_text_chunk(thought=[]), "parts[0].thought is a list"),
    "thought 2": (_text_chunk(thought=2), "parts[0].thought is a number"),
    "thought 'x'": (_text_chunk(thought="x"), "parts[0].thought is a string"),
    "thoughtSignature not base64": (_text_chunk(thoughtSignature="!!"), 'parts[0].thoughtSignature is a string ("!!")'),
    "thoughtSignature with a space": (_text_chunk(thoughtSignature="QU JD"), "parts[0].thoughtSignature is a string"),
    "thoughtSignature a number": (_text_chunk(thoughtSignature=5), "parts[0].thoughtSignature is a number"),
    "args a list": ({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "f", "args": []}}]},
                                     "index": 0}]}, "parts[0].functionCall.args is a list"),
    "args a JSON string": ({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "f",
                            "args": "{}"}}]}, "index": 0}]}, "parts[0].functionCall.args is a string"),
    "functionCall name a number": ({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": 5}}]},
                                                    "index": 0}]}, "parts[0].functionCall.name is a number"),
    "inlineData not base64": ({"candidates": [{"content": {"role": "model", "parts": [{"inlineData": {
        "mimeType": "image/png", "data": "!!"}}]}, "index": 0}]}, "parts[0].inlineData.data is a string"),
    "number modelVersion": ({**TEXT, "modelVersion": 2}, "modelVersion is a number"),
    "list responseId": ({**TEXT, "responseId": []}, "responseId is a list"),
    "number role": ({"candidates": [{"content": {"role": 1, "parts": [{"text": "A"}]}, "index": 0}]}, "content.role is a number"),
    "parts a string": ({"candidates": [{"content": {"role": "model", "parts": "A"}, "index": 0}]}, "content.parts is a string"),
    "part a string": ({"candidates": [{"content": {"role": "model", "parts": ["A"]}, "index": 0}]}, "content.parts[0] is a string"),
    "content a string": ({"candidates": [{"content": "A", "index": 0}]}, "candidates[0].content is a string"),
    "index a word": ({"candidates": [{"content": {"role": "model", "parts": [{"text": "A"}]}, "index": "x"}]},
                     "candidates[0].index is a string"),
    "promptFeedback a list": ({**TEXT, "promptFeedback": []}, "promptFeedback is a list"),
}


def _answer_with(chunk: dict) -> list[dict]:
    """An answer holding ``chunk`` second: last where it finishes the answer, else before FINISH."""
    return [TEXT, chunk] if chunk.get("candidates", [{}])[0].get("finishReason") else [TEXT, chunk, FINISH]


@pytest.mark.parametrize("name", GEMINI_CHUNKS_REFUSED)
def test_gemini_chunks_google_genai_refuses_are_corrupt(name):
    """A field of a JSON type google-genai's model refuses: the app's stream raises at that chunk."""
    chunk, says = GEMINI_CHUNKS_REFUSED[name]
    chunks = _answer_with(chunk)
    for wire, body in (("sse", _gemini(*chunks)), ("json-array", frame_gemini_array([orjson.dumps(c) for c in chunks]))):
        for size in (None, 1):
            verdict = analyze_bytes(body, GEMINI, wire=wire, chunk_size=size).verdict
            assert verdict.kind is X and verdict.seq == 1, (wire, verdict)
            assert says in verdict.reason and "google-genai refuses this chunk" in verdict.reason, verdict


# what pydantic's lax mode takes (each checked against google-genai 3.6.1): counts as whole floats,
# numeric strings or booleans; a flag as 0/1 or "yes"/"TRUE"; base64 in either alphabet, unpadded
GEMINI_CHUNKS_TAKEN = {
    "lax counts": _usage(promptTokenCount="4", candidatesTokenCount=5.0, totalTokenCount=" 9", thoughtsTokenCount=True),
    "lax thought": {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "A", "thought": "TRUE"}, {"text": "B", "thought": 0.0}, {"text": "C", "thought": "off"}]}, "index": 0}]},
    "signatures": {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "A", "thoughtSignature": "a-_b"}, {"text": "B", "thoughtSignature": "a+/b"},
        {"text": "C", "thoughtSignature": "QUJDRA"}, {"text": "", "thoughtSignature": "QUJDRA=="}]}, "index": 0}]},
    "nulls": {"candidates": [{"content": {"role": None, "parts": [{"text": "A", "thought": None, "thoughtSignature": None},
              {"functionCall": {"name": "f", "args": None}}]}, "index": None}], "modelVersion": None, "usageMetadata": None},
    "empty parts": {"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}]},
}


@pytest.mark.parametrize("name", GEMINI_CHUNKS_TAKEN)
def test_gemini_chunks_google_genai_takes_stay_complete(name):
    verdict = analyze_bytes(_gemini(*_answer_with(GEMINI_CHUNKS_TAKEN[name])), GEMINI).verdict
    assert verdict.kind is C, verdict


@pytest.mark.parametrize("empty", [b"data: \r\n\r\n", b"data:  \r\n\r\n", b"data: \r\ndata: \r\n\r\n"])
@pytest.mark.parametrize("where", ["between", "after the last"])
def test_a_gemini_event_of_empty_data_is_corrupt_as_google_genai_fails_on_it(empty, where):
    """google-genai parses the text of every `data: ` line as JSON, an empty one too, and raises
    (UnknownApiResponseError, checked with google-genai 3.6.1): the SSE rules dispatch nothing
    worth reading there, but the app gets an exception."""
    first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}, "index": 0}]}
    last = {"candidates": [{"content": {"role": "model", "parts": [{"text": " world"}]}, "finishReason": "STOP",
                            "index": 0}]}
    chunks = [b"data: " + orjson.dumps(first) + b"\r\n\r\n", b"data: " + orjson.dumps(last) + b"\r\n\r\n"]
    body = chunks[0] + empty + chunks[1] if where == "between" else chunks[0] + chunks[1] + empty
    for size in (None, 1, 7):
        verdict = analyze_bytes(body, Dialect.GEMINI, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT and "google-genai" in verdict.reason, verdict
    assert analyze_bytes(chunks[0] + chunks[1], Dialect.GEMINI).verdict.kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("shape", ["chat", "generate"])
def test_an_ollama_line_sent_twice_is_not_complete(shape):
    """Each line carries the server's clock to the nanosecond: a line that repeats the one before,
    its created_at too, is one line sent twice, and the client hands the app its text twice."""
    lines = _ollama_answer(shape, THOUGHT_THEN_TEXT)
    body = ndjson(*lines[:3], lines[2], *lines[3:])
    assert analyze_bytes(ndjson(*lines), OLLAMA).verdict.kind is C
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "repeats the one before it byte for byte" in verdict.reason, verdict
    assert verdict.seq == 3
    assert analyze_bytes(body, OLLAMA, chunk_size=1).verdict == verdict


@pytest.mark.parametrize("shape", ["chat", "generate"])
def test_ollama_lines_out_of_order_are_not_complete(shape):
    """Two lines swapped: the app reads the text scrambled, and created_at goes back."""
    lines = _ollama_answer(shape, THOUGHT_THEN_TEXT)
    body = ndjson(*lines[:3], lines[4], lines[3], *lines[5:])
    verdict = analyze_bytes(body, OLLAMA).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "created_at goes back" in verdict.reason, verdict
    assert verdict.seq == 4


def test_an_ollama_token_that_recurs_under_a_coarse_clock_stays_complete_unless_its_line_repeats():
    """Under one stamp for every line, only a line that repeats the one before is doubted: the
    same token two lines apart is not."""
    apart = _ollama_answer("chat", [("content", "\n"), ("content", "a"), ("content", "\n")], stamps=False)
    assert analyze_bytes(ndjson(*apart), OLLAMA).verdict.kind is C


def test_a_gemini_chunk_sent_twice_is_not_complete():
    """usageMetadata counts the candidates' tokens cumulatively: a chunk of text that repeats the one
    before, its count too, is one chunk sent twice. An empty chunk repeated adds nothing."""
    more = {"candidates": [{"content": {"role": "model", "parts": [{"text": ", a fox"}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 7, "totalTokenCount": 11}}
    last = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 7, "totalTokenCount": 11}}
    assert analyze_bytes(_gemini(TEXT, more, last), GEMINI).verdict.kind is C
    verdict = analyze_bytes(_gemini(TEXT, more, more, last), GEMINI).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "repeats the one before it byte for byte" in verdict.reason, verdict
    assert verdict.seq == 2
    assert analyze_bytes(_gemini(TEXT, more, last, last), GEMINI).verdict.kind is C
