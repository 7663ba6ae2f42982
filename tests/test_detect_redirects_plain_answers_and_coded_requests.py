"""Which flows are judged, and as what: a redirect is no answer; a plain JSON answer a
`streamtap_filter` taps is no stream that never ended; a request body sent gzip-compressed is
read decoded; and a model named in a path whose ':' came as %3A loses its method suffix."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib

import pytest
from mitmproxy.test import taddons, tflow

import provider_streams as streams
from streamtap.mitm.tap import Tap
from streamtap.providers.model import model_of
from streamtap.providers.session import NOT_A_STREAM
from streamtap.recording import read_recording

PLAIN_ANSWER = json.dumps({"id": "c1", "object": "chat.completion", "model": "gpt-4o", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}).encode()


def flow(status: int = 200, content_type: str | None = "text/event-stream", body: bytes = b'{"model":"m","stream":true}'):
    f = tflow.tflow(resp=True)
    f.request.host = "api.openai.com"
    f.request.method, f.request.path = "POST", "/v1/chat/completions"
    f.request.content = body
    f.response.status_code = status
    f.response.headers.clear()
    if content_type:
        f.response.headers["content-type"] = content_type
    f.response.content = None
    return f


def tapped(tmp_path, f, chunks: list[bytes], **options) -> bool:
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path), streamtap_workers=0, **options)
        tap.responseheaders(f)
        if not callable(f.response.stream):
            return False
        for chunk in [*chunks, b""]:
            assert f.response.stream(chunk) == chunk
        tap.response(f)
    return True


def recording(tmp_path):
    [path] = [p for p in tmp_path.rglob("*.jsonl")]
    return path


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_on_a_streaming_endpoint_is_not_tapped(tmp_path, status):
    f = flow(status, content_type=None)
    f.response.headers["location"] = "/v1/chat/completions/"
    assert not tapped(tmp_path, f, [])
    assert not f.marked and not f.comment and not list(tmp_path.rglob("*.jsonl"))


def test_a_plain_json_answer_a_filter_taps_is_unknown_not_truncated(tmp_path):
    f = flow(content_type="application/json", body=b'{"model":"gpt-4o","stream":false}')
    assert tapped(tmp_path, f, [PLAIN_ANSWER], streamtap_filter="~d api.openai.com")
    assert f.metadata["streamtap"]["verdict"] == "unknown", f.metadata["streamtap"]
    assert f.metadata["streamtap"]["reason"] == NOT_A_STREAM and "truncated" not in f.comment
    path = recording(tmp_path)
    rec = read_recording(path)
    assert rec.header["streamed"] is False and rec.body == PLAIN_ANSWER
    verified = subprocess.run([sys.executable, "-m", "streamtap", "verify", "--json", path], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in verified.stderr, verified.stderr
    judged = json.loads(verified.stdout)
    assert judged["verdict"]["kind"] == "unknown" and judged["verdict"]["reason"] == NOT_A_STREAM, judged["verdict"]
    assert judged["problem"] is None, judged


def test_a_stream_sent_though_the_request_said_stream_false_is_judged_as_a_stream(tmp_path):
    """The answer's content type says it is a stream: a server that streams whatever the request said."""
    f = flow(body=b'{"model":"m","stream":false}')
    assert tapped(tmp_path, f, [streams.openai_chat(["hi"])])
    assert f.metadata["streamtap"]["verdict"] == "complete", f.metadata["streamtap"]
    assert "streamed" not in read_recording(recording(tmp_path)).header


def test_an_http_error_to_a_plain_call_a_filter_taps_is_still_errored(tmp_path):
    f = flow(429, content_type="application/json", body=b'{"model":"gpt-4o","stream":false}')
    error = b'{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}'
    assert tapped(tmp_path, f, [error], streamtap_filter="~d api.openai.com")
    assert f.metadata["streamtap"]["verdict"] == "errored", f.metadata["streamtap"]


def test_a_gzip_request_body_is_read_decoded_for_the_recordings_why(tmp_path):
    f = flow(body=b"")
    f.request.headers["content-encoding"] = "gzip"
    f.request.raw_content = gzip.compress(b'{"model":"m","stream":true}')
    assert tapped(tmp_path, f, [streams.openai_chat(["hi"])])
    header = read_recording(recording(tmp_path)).header
    assert header["request"]["body"] == {"model": "m", "stream": True}
    assert "stream=True" in header["why"], header["why"]


@pytest.mark.parametrize("coding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_an_http_error_to_a_compressed_streaming_call_is_tapped(tmp_path, coding, compress):
    """The request's "stream" is read decoded: else the error of every compressed streaming call
    went unseen (no recording, no log line, no metric)."""
    f = flow(429, content_type="application/json", body=b"")
    f.request.headers["content-encoding"] = coding
    f.request.raw_content = compress(b'{"model":"gpt-4o","messages":[],"stream":true}')
    error = b'{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}'
    assert tapped(tmp_path, f, [error])
    assert f.metadata["streamtap"]["verdict"] == "errored", f.metadata["streamtap"]
    plain = flow(429, content_type="application/json", body=b"")  # a compressed call that asked for no stream
    plain.request.headers["content-encoding"] = coding
    plain.request.raw_content = compress(b'{"model":"gpt-4o","messages":[],"stream":false}')
    assert not tapped(tmp_path / "plain", plain, [error])


@pytest.mark.parametrize("url, model", [
    ("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash%3AstreamGenerateContent?alt=sse", "gemini-2.5-flash"),
    ("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash%3astreamGenerateContent", "gemini-2.5-flash"),
    ("https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/publishers/anthropic/models/"
     "claude-sonnet-4@20250514%3AstreamRawPredict", "claude-sonnet-4@20250514"),
    ("https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent", "gemini-2.5-flash"),
    ("https://bedrock-runtime.us-east-1.amazonaws.com/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile"
     "%2Fus.anthropic.claude/converse-stream", "arn:aws:bedrock:us-east-1:123:inference-profile/us.anthropic.claude"),
])  # fmt: skip
def test_the_model_named_in_the_path_is_the_name_alone(url, model):
    assert model_of(None, url, None) == model


def test_import_with_a_filter_records_a_plain_answer_as_unknown_and_verify_agrees(tmp_path):
    from mitmproxy import io

    capture = tmp_path / "plain.mitm"
    f = flow(content_type="application/json", body=b'{"model":"gpt-4o","stream":false}')
    f.response.content = PLAIN_ANSWER
    with capture.open("wb") as file:
        io.FlowWriter(file).add(f)
    out = tmp_path / "recordings"
    imported = subprocess.run([sys.executable, "-m", "streamtap", "import", "--filter", "~d api.openai.com", "--out", out, capture],
                              capture_output=True, text=True, timeout=60)
    assert imported.returncode in (0, 1) and "Traceback" not in imported.stderr, imported.stderr
    [path] = out.glob("*.jsonl")
    assert read_recording(path).header["streamed"] is False and "_unknown_" in path.name
    verified = subprocess.run([sys.executable, "-m", "streamtap", "verify", "--json", path], capture_output=True, text=True, timeout=60)
    judged = json.loads(verified.stdout)
    assert judged["verdict"]["reason"] == NOT_A_STREAM and judged["problem"] is None, judged


LLAMA_CPP_NATIVE = (b'data: {"index":0,"content":"Hello","stop":false,"id_slot":-1,"tokens_predicted":1}\n\n'
                    b'data: {"index":0,"content":"","stop":true,"stop_type":"eos","model":"m","tokens_predicted":1}\n\n')


@pytest.mark.parametrize("path, body, dialect", [
    ("/completion", b'{"prompt":"hi","stream":true}', "unknown"),  # llama.cpp's native routes, asked without a model
    ("/completions", b'{"prompt":"hi","stream":true}', "unknown"),
    ("/completions", b'{"model":"gpt-3.5-turbo-instruct","prompt":"hi","stream":true}', "openai-chat"),  # LiteLLM's root
    ("/v1/completions", b'{"prompt":"hi","stream":true}', "openai-chat"),
])  # fmt: skip
def test_the_root_completions_path_is_openai_only_when_the_request_names_a_model(path, body, dialect):
    from streamtap.providers import RequestInfo, VerdictKind, analyze_bytes, detect_dialect

    detection = detect_dialect(RequestInfo("POST", f"http://127.0.0.1:8080{path}", {}, body), "text/event-stream")
    assert detection.dialect.value == dialect, detection
    if dialect == "unknown":  # its chunks have no choices and no [DONE]: read as Chat Completions they would be cut
        assert analyze_bytes(LLAMA_CPP_NATIVE, detection.dialect, wire=detection.wire).verdict.kind is VerdictKind.UNKNOWN


def test_import_reads_a_gzip_request_body_decoded_for_the_recordings_why(tmp_path):
    from mitmproxy import io

    f = flow(body=b"")
    f.request.headers["content-encoding"] = "gzip"
    f.request.raw_content = gzip.compress(b'{"model":"m","stream":true}')
    f.response.content = streams.openai_chat(["hi"])
    capture = tmp_path / "gzip.mitm"
    with capture.open("wb") as file:
        io.FlowWriter(file).add(f)
    out = tmp_path / "recordings"
    imported = subprocess.run([sys.executable, "-m", "streamtap", "import", "--out", out, capture], capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0 and "Traceback" not in imported.stderr, imported.stderr
    [path] = out.glob("*.jsonl")
    assert "stream=True" in read_recording(path).header["why"]
