"""Detection and sniffing that pick a dialect its judge can read, and judges that never call a
body of another framing cut (review r13).

Real captures from ../shared/fixtures (skipped where it is absent); the bodies of only an error
are the providers' documented shapes, constructed.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml
from conftest import shared_path
from provider_streams import chunk_lines

from streamtap.providers import (
    Dialect,
    RequestInfo,
    VerdictKind,
    analyze_bytes,
    analyze_error_document,
    detect_dialect,
    sniff_dialect,
)

F = "fixtures"
STREAMTAP = Path(sys.executable).with_name("streamtap")
SSE = "text/event-stream"
STREAMING = b'{"model":"m","stream":true}'


def streamtap(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=60)


def detect(url: str) -> tuple[Dialect, str]:
    detection = detect_dialect(RequestInfo("POST", url, {}, STREAMING), SSE)
    return detection.dialect, detection.wire


# --- Anthropic's OpenAI SDK compatibility endpoint answers Chat Completions chunks ----------------

def test_anthropic_openai_compatible_endpoint_is_judged_as_chat_completions():
    body = shared_path(F, "vercel-ai/openai-compatible/anthropic-fallback-tool-call.sse").read_bytes()
    body += b"\n"  # the capture lacks the blank line that dispatches its last event
    url = "https://api.anthropic.com/v1/chat/completions"  # base_url https://api.anthropic.com/v1/
    detection = detect_dialect(RequestInfo("POST", url, {}, b'{"model":"claude-sonnet-4-5","stream":true}'), SSE)
    assert (detection.dialect, detection.wire) == (Dialect.OPENAI_CHAT, "sse"), detection
    whole = analyze_bytes(body, detection.dialect, wire=detection.wire)
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict
    cut = body[: body.index(b'"tool_calls"')]
    cut = cut[: cut.rindex(b"\n\n") + 2]  # whole events only, before the one that finishes
    assert analyze_bytes(cut, detection.dialect, wire=detection.wire).verdict.kind is VerdictKind.TRUNCATED


@pytest.mark.parametrize("url", [
    "https://api.anthropic.com/v1/messages",
    "https://api.anthropic.com/v1/messages?beta=true",
])
def test_anthropic_messages_stay_anthropic(url):
    assert detect(url) == (Dialect.ANTHROPIC, "sse")


# --- more paths that answer chat.completion.chunk / text_completion chunks -------------------------

@pytest.mark.parametrize("url", [
    "https://api.mistral.ai/v1/fim/completions",
    "https://codestral.mistral.ai/v1/fim/completions",
    "https://api.mistral.ai/v1/agents/completions",
    "https://api.deepseek.com/beta/completions",
    "http://litellm:4000/completions",
])
def test_fim_agents_and_bare_completions_paths_are_chat_completions(url):
    assert detect(url) == (Dialect.OPENAI_CHAT, "sse")


# --- JSON lines of an SSE-only dialect: no judge of that dialect reads them ------------------------

NDJSON_OF_SSE_DIALECTS = [
    "vercel-ai/anthropic/anthropic-text.chunks.txt",
    "vercel-ai/openai/chat/openai-text.chunks.txt",
    "vercel-ai/openai/responses/openai-phase.1.chunks.txt",
]


@pytest.mark.parametrize("name", NDJSON_OF_SSE_DIALECTS)
def test_ndjson_of_an_sse_only_dialect_is_sniffed_as_unknown_not_judged_cut(name):
    lines = chunk_lines(shared_path(F, name))
    body = b"\n".join(lines) + b"\n"  # whole lines: nothing about this body is cut
    detection = sniff_dialect(body)
    assert (detection.dialect, detection.wire) == (Dialect.UNKNOWN, "ndjson"), detection
    assert "streams SSE, never NDJSON" in detection.why
    verdict = analyze_bytes(body, detection.dialect, wire=detection.wire).verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict


def test_anthropic_judge_calls_json_lines_corrupt_not_cut():
    lines = chunk_lines(shared_path(F, "vercel-ai/anthropic/anthropic-text.chunks.txt"))
    verdict = analyze_bytes(b"\n".join(lines) + b"\n", Dialect.ANTHROPIC, wire="ndjson").verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "unexpected JSONValue in an SSE dialect" in verdict.reason


# --- --provider naming a dialect of another framing: corrupt, never a cut -------------------------

def test_anthropic_judge_on_a_bedrock_body_is_corrupt_not_truncated():
    body = shared_path(F, "otel-contrib/bodies/invoke_stream_tool_call__anthropic.claude.1.bin").read_bytes()
    verdict = analyze_bytes(body, Dialect.ANTHROPIC, wire="eventstream").verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "EventStreamMessage" in verdict.reason


@pytest.mark.parametrize("dialect", [Dialect.BEDROCK_CONVERSE, Dialect.BEDROCK_INVOKE])
def test_bedrock_judges_on_an_sse_body_are_corrupt_not_truncated(dialect):
    body = shared_path(F, "openllmetry/bodies/openai_chat_stream_tool_call.0.sse").read_bytes()
    verdict = analyze_bytes(body, dialect, wire="sse").verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "unexpected SSEEvent" in verdict.reason


def test_cli_provider_anthropic_on_a_bedrock_file_is_corrupt():
    path = shared_path(F, "otel-contrib/bodies/invoke_stream_tool_call__anthropic.claude.1.bin")
    result = streamtap("verify", "--provider", "anthropic", path)
    assert result.stdout.startswith(f"{path}: corrupt (anthropic)"), result.stdout + result.stderr


# --- a body of only the provider's in-band SSE error ---------------------------------------------

ERROR_ONLY_SSE = {
    # OpenAI and vLLM: the error chunk, then [DONE] (HTTP 200)
    "openai": (b'data: {"error":{"message":"The server had an error while processing your request.",'
               b'"type":"server_error","param":null,"code":null}}\n\ndata: [DONE]\n\n', "server_error"),
    # Gemini alt=sse
    "gemini": (b'data: {"error": {"code": 503, "message": "The model is overloaded. Please try again later.", '
               b'"status": "UNAVAILABLE"}}\n\n', "overloaded"),
}


@pytest.mark.parametrize("name", ERROR_ONLY_SSE)
def test_a_body_of_only_an_sse_error_chunk_is_errored_when_sniffed(name):
    body, word = ERROR_ONLY_SSE[name]
    detection = sniff_dialect(body)
    analysis = analyze_bytes(body, detection.dialect, wire=detection.wire)
    assert analysis.verdict.kind is VerdictKind.ERRORED, analysis.verdict
    assert word in analysis.verdict.reason
    assert word in str(analysis.turn.error)


def test_sse_data_without_a_top_level_error_is_still_unknown():
    body = b'data: {"detail": {"error": "nested, not the payload\'s own"}}\n\ndata: {"error": null}\n\n'
    assert analyze_bytes(body, Dialect.UNKNOWN, wire="sse").verdict.kind is VerdictKind.UNKNOWN


# --- Bedrock's HTTP error body saved as a file ------------------------------------------------------

BEDROCK_ERROR_CASSETTES = [
    "otel-contrib/cassettes/invoke_stream_invalid_model.yaml",  # the recorder pretty-printed the body
    "pydantic-ai/cassettes/bedrock/test_bedrock_streaming_error.yaml",  # parsed_body: the 55-byte wire body
]


def bedrock_error_bodies() -> list[bytes]:
    """The HTTP 400 ValidationException bodies of the two cassettes, as the wire had them."""
    bodies = []
    for name in BEDROCK_ERROR_CASSETTES:
        document = yaml.safe_load(shared_path(F, name).read_text())
        (interaction,) = document["interactions"]
        response = interaction["response"]
        assert response["status"]["code"] == 400
        text = (response.get("body") or {}).get("string")
        bodies.append(text.encode() if text is not None else orjson.dumps(response["parsed_body"]))
    return bodies


def test_bedrock_http_error_bodies_are_errored_documents():
    for body in bedrock_error_bodies():
        analysis = analyze_error_document(body)
        assert analysis is not None, body
        assert analysis.verdict.kind is VerdictKind.ERRORED
        assert "The provided model identifier is invalid." in analysis.verdict.reason


def test_bedrock_error_body_type_and_other_documents():
    typed = analyze_error_document(b'{"__type": "com.amazon.coral.validate#ValidationException", "Message": "bad"}')
    assert typed is not None and typed.turn.error["type"] == "ValidationException"
    assert typed.verdict.reason.endswith("ValidationException: bad")
    # a message beside other members is anything's JSON, not an AWS error body
    assert analyze_error_document(b'{"message": "hi", "role": "assistant"}') is None
    assert analyze_error_document(b'{"message": {"role": "assistant"}}') is None


def test_cli_bedrock_error_body_file_is_errored(tmp_path):
    for number, body in enumerate(bedrock_error_bodies()):
        for name in (f"error{number}.json", f"error{number}.txt"):
            path = tmp_path / name
            path.write_bytes(body)
            result = streamtap("verify", path)
            assert result.stdout.startswith(f"{path}: errored"), result.stdout + result.stderr


ERROR_DOCUMENT = b'{"error": {"message": "The server had an error", "type": "server_error"}}'


@pytest.mark.parametrize("dialect", [Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC], ids=str)
@pytest.mark.parametrize("layout", ["one line", "line end", "pretty-printed"])
def test_an_error_document_sent_as_a_stream_with_200_is_errored_as_verify_says(dialect, layout, tmp_path):
    """A gateway that answers a streamed request with 200 and its error as one JSON document: the
    live tap and `streamtap import` judge it as `streamtap verify` judges a body file of it."""
    body = {"one line": ERROR_DOCUMENT, "line end": ERROR_DOCUMENT + b"\n",
            "pretty-printed": orjson.dumps(orjson.loads(ERROR_DOCUMENT), option=orjson.OPT_INDENT_2)}[layout]
    for chunk_size in (None, 1):
        analysis = analyze_bytes(body, dialect, chunk_size=chunk_size)
        assert analysis.verdict.kind is VerdictKind.ERRORED, analysis.verdict
        assert analysis.verdict.reason == "the body is one JSON document holding the provider's error: server_error: The server had an error"
        assert analysis.turn.error == {"source": "body", "type": "server_error", "message": "The server had an error"}
    path = tmp_path / "error.sse"
    path.write_bytes(body)
    verified = streamtap("verify", "--provider", str(dialect), path)
    assert f"errored ({dialect}) {analysis.verdict.reason}" in verified.stdout, verified.stdout + verified.stderr
    # not an error: a document of another kind stays a body that framed no event
    assert analyze_bytes(b'{"choices": []}', dialect).verdict.kind is VerdictKind.TRUNCATED
    assert analyze_bytes(b'{"error": null}', dialect).verdict.kind is VerdictKind.TRUNCATED


# --- an event-stream whose first prelude is damaged -------------------------------------------------

def damaged_first_prelude(tmp_path: Path) -> Path:
    body = bytearray(shared_path(F, "pydantic-ai/bodies/bedrock/test_bedrock_model_stream.0.bin").read_bytes())
    assert struct.unpack(">I", body[:4])[0] < len(body)
    body[3] ^= 0x01  # one bit of the first message's total length
    path = tmp_path / "first-prelude-damaged.bin"
    path.write_bytes(bytes(body))
    return path


def test_a_damaged_first_prelude_is_sniffed_as_event_stream(tmp_path):
    body = damaged_first_prelude(tmp_path).read_bytes()
    detection = sniff_dialect(body)
    assert (detection.dialect, detection.wire) == (Dialect.BEDROCK_CONVERSE, "eventstream"), detection
    assert "prelude fails its checks" in detection.why
    verdict = analyze_bytes(body, detection.dialect, wire=detection.wire).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "checksum" in verdict.reason, verdict


def test_cli_damaged_first_prelude_is_corrupt_not_no_stream(tmp_path):
    path = damaged_first_prelude(tmp_path)
    negative = "aws-sdk-go/encoded/negative"
    vectors = [shared_path(F, negative, name) for name in ("corrupted_length", "corrupted_header_len")]
    result = streamtap("verify", path, *vectors)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines] == ["corrupt"] * 3, result.stdout
    assert "not a stream" not in result.stderr


def test_bytes_without_event_stream_headers_are_still_no_stream():
    for junk in (bytes(range(256)), b"\x00\x00\x00\x3d\x00\x00\x00\x20" + b"\xff" * 60):
        assert sniff_dialect(junk).wire != "eventstream"


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_sse_of_every_line_ending_the_sse_rules_allow_is_sniffed_by_its_payload(ending):
    """Bare CR ends a line too: its payloads were read as one long line, and the dialect not found."""
    chunks = [{"candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}]} for text in ("Hel", "lo")]
    chunks[-1]["candidates"][0]["finishReason"] = "STOP"
    body = "".join(f"data: {orjson.dumps(chunk).decode()}{ending}{ending}" for chunk in chunks).encode()
    detection = sniff_dialect(body)
    assert (detection.dialect, detection.wire) == (Dialect.GEMINI, "sse"), detection
    analysis = analyze_bytes(body, detection.dialect, wire=detection.wire)
    assert analysis.verdict.kind is VerdictKind.COMPLETE and analysis.turn.text() == "Hello", analysis.verdict
