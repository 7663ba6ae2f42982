"""`streamtap serve` against real clients: the openai, anthropic and boto3 SDKs, httpx,
httpx-sse, curl and a raw socket, all on loopback."""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from replay_streams import (
    ANTHROPIC_REQUEST,
    BEDROCK_MODEL,
    BEDROCK_REQUEST,
    OPENAI_REQUEST,
    anthropic_frames,
    bedrock_invoke_frames,
    dechunk,
    openai_chat_frames,
    write_recording,
    write_recordings,
)

from streamtap.providers import analyze_bytes
from streamtap.providers.turn import Dialect
from streamtap.replay.faults import Timing, parse_faults
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread

REPO = Path(__file__).resolve().parents[1]
STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    return write_recordings(tmp_path_factory.mktemp("recordings"))


@pytest.fixture(scope="module")
def serve(recordings):
    """A real `streamtap serve` process, per-request faults enabled."""
    proc = subprocess.Popen(
        [*STREAMTAP, "serve", str(recordings), "--fault-header"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def recorded_turn(frames, dialect):
    return analyze_bytes(b"".join(frames), dialect).turn


def test_openai_sdk_gets_the_recorded_turn(serve):
    import openai

    client = openai.OpenAI(base_url=serve + "/v1", api_key="sk-test", max_retries=0)
    text, args = [], {}
    for chunk in client.chat.completions.create(**OPENAI_REQUEST):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    turn = recorded_turn(openai_chat_frames(), Dialect.OPENAI_CHAT)
    assert "".join(text) == turn.text()
    assert [json.loads(a) for a in args.values()] == [b.arguments for b in turn.tool_calls()]


def test_anthropic_sdk_gets_the_recorded_turn(serve):
    import anthropic

    client = anthropic.Anthropic(base_url=serve, api_key="sk-ant-test", max_retries=0)
    request = {k: v for k, v in ANTHROPIC_REQUEST.items() if k != "stream"}
    with client.messages.stream(**request) as stream:
        message = stream.get_final_message()
    turn = recorded_turn(anthropic_frames(), Dialect.ANTHROPIC)
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == turn.thinking()
    assert message.content[1].text == turn.text()
    assert message.content[2].input == turn.tool_calls()[0].arguments
    assert message.stop_reason == turn.stop_reason_raw == "tool_use"


def _bedrock(url: str, fault: str | None = None):
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="AKIDTEST",
        aws_secret_access_key="secret",
        config=Config(retries={"max_attempts": 0}),
    )
    if fault:
        client.meta.events.register("before-send.*", lambda request, **kw: request.headers.__setitem__("x-streamtap-fault", fault))
    return client


def _bedrock_events(client) -> list[dict]:
    response = client.invoke_model_with_response_stream(modelId=BEDROCK_MODEL, body=json.dumps(BEDROCK_REQUEST))
    return [json.loads(event["chunk"]["bytes"]) for event in response["body"]]


def test_boto3_gets_the_recorded_turn(serve):
    events = _bedrock_events(_bedrock(serve))
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    turn = recorded_turn(bedrock_invoke_frames(), Dialect.BEDROCK_INVOKE)
    assert text == turn.text() and events[-1]["type"] == "message_stop"


def test_boto3_raises_on_a_corrupted_crc(serve):
    from botocore.eventstream import ChecksumMismatch

    with pytest.raises(ChecksumMismatch):
        _bedrock_events(_bedrock(serve, "corrupt:frame=5,field=crc,byte=0x22"))


def test_boto3_raises_the_injected_model_stream_error(serve):
    from botocore.exceptions import EventStreamError

    with pytest.raises(EventStreamError, match="modelStreamErrorException"):
        _bedrock_events(_bedrock(serve, "error:kind=modelStreamErrorException,after=3"))


def test_anthropic_sdk_raises_on_the_injected_overloaded_error(serve):
    import anthropic

    client = anthropic.Anthropic(base_url=serve, api_key="sk-ant-test", max_retries=0, default_headers={"x-streamtap-fault": "error:kind=overloaded_error,after=12"})
    request = {k: v for k, v in ANTHROPIC_REQUEST.items() if k != "stream"}
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        with client.messages.stream(**request) as stream:
            stream.get_final_message()


def test_unmatched_request_gets_a_json_404_with_the_nearest_recording(serve):
    r = httpx.post(serve + "/v1/chat/completions", json=OPENAI_REQUEST | {"model": "gpt-other"}, timeout=5)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["looked_for"]["path"] == "/v1/chat/completions"
    assert error["nearest"][0]["recording"].endswith("openai.jsonl")
    assert error["nearest"][0]["differs_in"] == ["body.model"]


def test_a_404_names_the_query_parameters_that_differ_not_their_values(serve):
    r = httpx.post(serve + "/v1/chat/completions?api-version=2024-10-21&key=sk-secret-value", json=OPENAI_REQUEST, timeout=5)
    assert r.status_code == 404
    nearest = r.json()["error"]["nearest"][0]
    assert nearest["recording"].endswith("openai.jsonl")
    assert nearest["differs_in"] == ["query api-version", "query key"], nearest
    assert "sk-secret-value" not in r.text and "2024-10-21" not in json.dumps(nearest)


def test_a_bad_fault_header_is_a_400_naming_the_problem(serve):
    r = httpx.post(serve + "/v1/chat/completions", json=OPENAI_REQUEST, headers={"x-streamtap-fault": "cut:evnt=3"}, timeout=5)
    assert r.status_code == 400 and "cut takes" in r.json()["error"]["message"]


# --- the bytes on the wire, per end style: raw socket, curl, httpx ------------------------


@pytest.fixture(scope="module")
def library(recordings):
    return Library.load([recordings])


def _server(library, fault=None, timing="fast", **kw):
    return ServerThread(library, ServeOptions(Timing.parse(timing), parse_faults(fault), **kw))


def _raw_exchange(base_url: str, body: bytes, path: str = "/v1/chat/completions", extra: str = "") -> tuple[bytes, str]:
    """Send one request on a raw socket; return (everything received, how it ended)."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {len(body)}\r\n\r\n".encode() + body
        )
        data = b""
        while True:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                return data, "reset"
            except TimeoutError:
                return data, "open"
            if not piece:
                return data, "fin"
            data += piece
            if data.endswith(b"\r\n0\r\n\r\n"):
                return data, "complete"


OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()


@pytest.mark.parametrize("style, ending", [("clean", "complete"), ("abort", "fin"), ("reset", "reset")])
def test_cut_styles_on_a_raw_socket(library, style, ending):
    frames = openai_chat_frames()
    with _server(library, f"cut:event=9,style={style}") as server:
        data, how = _raw_exchange(server.base_url, OPENAI_BODY)
    assert how == ending
    if style != "reset":  # a reset may discard bytes still in flight: that is what a reset does
        chunks, terminated = dechunk(data)
        assert b"".join(chunks) == b"".join(frames[:10])
        assert terminated == (style == "clean")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-type: text/event-stream" in data


@pytest.mark.parametrize("style, exit_code", [("clean", 0), ("abort", 18), ("reset", 56)])
def test_cut_styles_seen_by_curl(library, style, exit_code):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    with _server(library, f"cut:byte=700,style={style}") as server:
        result = subprocess.run(
            ["curl", "-sS", "-N", "--max-time", "10", "-d", OPENAI_BODY, server.base_url + "/v1/chat/completions"],
            capture_output=True,
            timeout=20,
        )
    assert result.returncode == exit_code, result.stderr
    if style != "reset":
        assert result.stdout == b"".join(openai_chat_frames())[:700]


def test_abort_is_a_protocol_error_for_httpx(library):
    with _server(library, "cut:at=tool-args,style=abort") as server:
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10) as r:
                for _ in r.iter_bytes():
                    pass


def test_clean_cut_is_silently_complete_for_httpx(library):
    with _server(library, "cut:at=tool-args,style=clean") as server:
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10) as r:
            body = b"".join(r.iter_bytes())
    assert body == b"".join(openai_chat_frames())[: len(body)] and body.endswith(b'"arguments":"{')


def test_fragment_writes_small_chunks_and_keeps_the_bytes(library):
    with _server(library, "fragment:max=3") as server:
        data, how = _raw_exchange(server.base_url, OPENAI_BODY)
    chunks, terminated = dechunk(data)
    assert how == "complete" and terminated
    assert b"".join(chunks) == b"".join(openai_chat_frames())
    assert max(map(len, chunks)) <= 3


def test_stall_holds_the_stream_for_the_given_time(library):
    with _server(library, "stall:after=5,secs=0.6") as server:
        seen = []
        start = time.monotonic()
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    seen.append(time.monotonic() - start)
    assert len(seen) == len(openai_chat_frames())
    assert seen[5] < 0.4 and seen[6] - seen[5] >= 0.55


def test_original_timing_follows_the_recorded_gaps(tmp_path):
    write_recording(tmp_path / "slow.jsonl", "openai", openai_chat_frames(words=8, tool=False), gap_ms=50)
    with _server(Library.load([tmp_path]), timing="original") as server:
        seen = []
        start = time.monotonic()
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    seen.append(time.monotonic() - start)
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert len(gaps) == 10, gaps
    # never early (the deadlines are absolute), and the gaps are the recorded 50 ms: a late event
    # on a loaded machine shortens the gap after it, so the typical gap is what is held to 50 ms
    assert all(t - seen[0] >= i * 0.050 - 0.005 for i, t in enumerate(seen)), seen
    assert 0.045 < statistics.median(gaps) < 0.070, gaps


def test_once_serves_a_recording_a_single_time(recordings):
    with ServerThread(Library.load([recordings], MatchOptions(once=True)), ServeOptions()) as server:
        first = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5)
        second = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5)
    assert first.status_code == 200 and first.content == b"".join(openai_chat_frames())
    assert second.status_code == 404 and second.json()["error"]["nearest"][0]["already_served"] is True


def test_a_whole_recording_answers_before_a_killed_proxys_leftover_of_the_same_request(tmp_path):
    whole = write_recording(tmp_path / "b-whole.jsonl", "openai", openai_chat_frames())
    lines = whole.read_bytes().splitlines(keepends=True)
    (tmp_path / "a-cut.jsonl").write_bytes(b"".join(lines[:4]))  # first by name; its writer was killed
    full = b"".join(openai_chat_frames())
    with ServerThread(Library.load([tmp_path], MatchOptions(once=True)), ServeOptions()) as server:
        first = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5)
        leftover = b""
        # then, --once, the leftover: the only one left, ending as its killed proxy's client saw it end
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5) as answer:
                assert answer.status_code == 200
                for piece in answer.iter_bytes():
                    leftover += piece
    assert first.content == full
    assert leftover and full.startswith(leftover) and leftover != full
    proc = subprocess.Popen([*STREAMTAP, "serve", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        warning = proc.stderr.readline()
        assert httpx.post(url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5).content == full
    finally:
        proc.terminate()
        proc.wait(10)
    assert warning.startswith("streamtap serve: warning: 1 recording(s) without their end line") and "a-cut.jsonl" in warning, warning


def test_ignored_body_fields_still_match(recordings):
    options = MatchOptions(ignore_fields=("metadata.user_id", "temperature"))
    with ServerThread(Library.load([recordings], options), ServeOptions()) as server:
        request = OPENAI_REQUEST | {"temperature": 0.3, "metadata": {"user_id": "u-42"}}
        r = httpx.post(server.base_url + "/v1/chat/completions", json=request, timeout=5)
    # metadata.user_id is dropped but an empty metadata object remains: that still differs
    assert r.status_code == 404 and r.json()["error"]["nearest"][0]["differs_in"] == ["body.metadata"]
    with ServerThread(Library.load([recordings], MatchOptions(ignore_fields=("metadata", "temperature"))), ServeOptions()) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", json=request, timeout=5)
    assert r.status_code == 200


def test_a_long_running_server_keeps_a_bounded_record_of_what_it_served(recordings, monkeypatch):
    import streamtap.replay.server as server_module

    monkeypatch.setattr(server_module, "SERVED_KEPT", 3)
    with ServerThread(Library.load([recordings]), ServeOptions()) as server, httpx.Client(timeout=5) as client:
        for i in range(5):
            client.post(server.base_url + f"/v1/nothing/{i}", json={})
        assert [s.target for s in server.served] == ["/v1/nothing/2", "/v1/nothing/3", "/v1/nothing/4"]


def test_serve_usage_errors_exit_2_with_one_line(tmp_path):
    for args, message in [
        (["serve", str(tmp_path / "missing")], "no such file"),
        (["serve", str(tmp_path)], "no recordings"),
        (["serve", str(tmp_path), "--fault", "cut:nowhere=1"], "cut takes"),
        (["serve", str(tmp_path), "--timing", "slow"], "timing is"),
        (["serve", str(tmp_path), "--port", "70000"], "--port 70000"),
        (["serve", str(tmp_path), "--host", ""], "--host '': no address"),  # an unset $HOST: every interface
        (["serve", str(tmp_path), "--host", " "], "--host ' ': no address"),
        (["serve", str(tmp_path), "--fault", ""], "--fault '': no fault in it"),  # an unset $SPEC
        (["serve", str(tmp_path), "--fault", " ; "], "--fault ' ; ': no fault in it"),
        (["serve", str(tmp_path), "--match-header", "x b"], "--match-header: 'x b' is not a header"),
        (["serve", str(tmp_path), "--ignore-param", ""], "--ignore-param: an empty name"),
        (["serve", str(tmp_path), "--ignore-field", "a..b"], "--ignore-field: 'a..b' is not a dotted JSON field path"),
    ]:
        result = subprocess.run([*STREAMTAP, *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("stream_end", ["upstream_reset", "proxy_ended"])
def test_a_recorded_upstream_reset_replays_as_an_abort_with_its_tail(tmp_path, stream_end):
    """The client got a cut body: a reset upstream, or mitmproxy's own end (a kill from mitmweb,
    an addon's flow.kill()), which was replayed with a clean end."""
    frames = openai_chat_frames(words=6, tool=False)
    cut = frames[:5] + [frames[5][:40]]  # the upstream died 40 bytes into event 5
    write_recording(tmp_path / "reset.jsonl", "openai", cut, stream_end=stream_end)
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        data, how = _raw_exchange(server.base_url, OPENAI_BODY)
    chunks, terminated = dechunk(data)
    assert how == "fin" and not terminated
    assert b"".join(chunks) == b"".join(cut)


def test_original_timing_reproduces_the_recorded_network_reads(tmp_path):
    from streamtap.replay.faults import plan
    from streamtap.replay.source import load_source

    frames = openai_chat_frames(words=5, tool=False)
    write_recording(tmp_path / "r.jsonl", "openai", frames, gap_ms=7)
    source = load_source(tmp_path / "r.jsonl")
    assert [(o, n) for o, n, _t in source.reads] == [(sum(map(len, frames[:i])), len(f)) for i, f in enumerate(frames)]
    p = plan(source, [], Timing.parse("original"))
    assert [w.data for w in p.writes] == frames
    assert [round(w.at, 6) for w in p.writes] == [round(i * 0.007, 6) for i in range(len(frames))]
    with ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("original"))) as server:
        data, how = _raw_exchange(server.base_url, OPENAI_BODY)
    chunks, terminated = dechunk(data)
    assert how == "complete" and terminated and chunks == frames  # one HTTP chunk per recorded read


def test_a_recording_of_a_non_json_request_body_answers_that_body(tmp_path):
    """The recording header keeps a body that is not JSON as body_b64 (recording/header.py)."""
    import base64

    form = b"prompt=Weather+in+Paris%3F&stream=1"
    _one_event_recording(tmp_path / "form.jsonl", {"method": "POST", "url": "https://llm.example/generate", "headers": [],
                                                   "body_b64": base64.b64encode(form).decode()}, "unknown", b"data: hello\n\n")
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        matched = httpx.post(server.base_url + "/generate", content=form, timeout=5)
        other = httpx.post(server.base_url + "/generate", content=b"prompt=other", timeout=5)
    assert matched.status_code == 200 and matched.content == b"data: hello\n\n"
    assert other.status_code == 404


def _compressed(body: bytes, encoding: str) -> bytes:
    """``body`` with the codings of a Content-Encoding value applied, in the order it lists them."""
    import gzip
    import zlib

    import brotli

    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        from backports import zstd
    apply = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, "zstd": zstd.compress}
    for coding in encoding.split(","):
        body = apply[coding.strip()](body)
    return body


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_a_compressed_request_body_finds_the_recording_that_keeps_it_decoded(library, encoding):
    """The recording keeps the request body decoded; the client sends it compressed again on replay
    (the proxy's unmatched=upstream routes it here by the decoded body, so a 404 would strand it)."""
    with ServerThread(library, ServeOptions()) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", content=_compressed(OPENAI_BODY, encoding),
                       headers={"content-type": "application/json", "content-encoding": encoding}, timeout=5)
    assert r.status_code == 200, r.text
    assert r.content == b"".join(openai_chat_frames())


def test_a_stacked_content_encoding_finds_the_recording_the_recorder_made_of_it(tmp_path):
    """Whatever the recorder keeps of a body sent ``gzip, br`` (its header fields, as the Tap writes
    them), the same request finds it, its codings on one header line or on two."""
    from streamtap.recording import RecordingWriter
    from streamtap.recording.header import request_body_fields

    sent = _compressed(OPENAI_BODY, "gzip, br")
    writer = RecordingWriter(tmp_path / "stacked.jsonl")
    writer.header(
        {
            "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions",
                        "headers": [["content-encoding", "gzip, br"]], **request_body_fields((sent, "gzip, br"))},
            "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
            "dialect": "openai-chat",
            "wire": {"format": "sse", "content_encoding": None},
        }
    )
    writer.read(b"data: [DONE]\n\n", 0.0)
    writer.finish({"stream_end": "finished"})
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        one_line = httpx.post(server.base_url + "/v1/chat/completions", content=sent,
                              headers={"content-encoding": "gzip, br"}, timeout=5)
        data, how = _raw_exchange(server.base_url, sent, extra="connection: close\r\n"
                                   "content-encoding: gzip\r\ncontent-encoding: br\r\n")
    assert one_line.status_code == 200, one_line.text
    assert how == "complete" and data.startswith(b"HTTP/1.1 200 "), data[:300]


def _old_shape_recording(path: Path, sent: bytes, coding_headers: list[list[str]]) -> None:
    """A recording as the recorder wrote one before it decoded a body that is not JSON to orjson:
    ``body_b64`` holds it compressed, as sent, and no ``body_decoded_from`` says it was decoded."""
    import base64

    _one_event_recording(path, {"method": "POST", "url": "https://api.openai.com/v1/chat/completions",
                                "headers": coding_headers, "body_b64": base64.b64encode(sent).decode()},
                         "openai-chat", b"data: [DONE]\n\n")


def _one_event_recording(path: Path, request: dict, dialect: str, event_bytes: bytes) -> None:
    """A finished SSE recording of ``request`` answered by the one event ``event_bytes``."""
    from streamtap.recording import RecordingWriter
    from streamtap.wire import SSEDecoder

    writer = RecordingWriter(path)
    writer.header(
        {
            "request": request,
            "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
            "dialect": dialect,
            "wire": {"format": "sse", "content_encoding": None},
        }
    )
    writer.read(event_bytes, 0.0)
    [event] = SSEDecoder().feed(event_bytes)
    writer.frame(event, 0.0)
    writer.finish({"stream_end": "finished"})


@pytest.mark.parametrize(
    ("body", "coding_headers"),
    [
        (b"model=gpt-4o&prompt=hello", [["content-encoding", "gzip"]]),  # a form body: not JSON
        (OPENAI_BODY, [["content-encoding", "gzip, br"]]),  # stacked: the old recorder kept it as sent
        (OPENAI_BODY, [["content-encoding", "gzip"], ["content-encoding", "br"]]),  # stacked over two lines
    ],
    ids=["gzip-form", "gzip-br", "gzip-br-two-lines"],
)
def test_a_recording_that_kept_a_compressed_body_as_sent_still_answers_it(tmp_path, body, coding_headers):
    """A live body is compared decoded from its Content-Encoding: a recording made before the
    recorder decoded it is decoded on loading, else the request it answered gets a 404."""
    encoding = ", ".join(value for _, value in coding_headers)
    sent = _compressed(body, encoding)
    _old_shape_recording(tmp_path / "old.jsonl", sent, coding_headers)
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", content=sent,
                       headers={"content-encoding": encoding}, timeout=5)
    assert r.status_code == 200, r.text
    assert r.content == b"data: [DONE]\n\n"


def test_an_old_recordings_body_whose_coding_cannot_be_undone_is_compared_as_sent(tmp_path):
    """Bytes a recording kept as sent whose coding cannot be undone stay as they are: the server
    compares the same request's body as sent too, so it still answers it."""
    damaged = _compressed(b"model=gpt-4o&prompt=hello", "gzip")[:-12]  # cut short
    _old_shape_recording(tmp_path / "old.jsonl", damaged, [["content-encoding", "gzip"]])
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", content=damaged,
                       headers={"content-encoding": "gzip"}, timeout=5)
    assert r.status_code == 200, r.text


def test_a_request_body_that_cannot_be_decoded_gets_a_404_saying_so(library):
    import gzip

    damaged = gzip.compress(OPENAI_BODY)[:-12]  # cut short
    with ServerThread(library, ServeOptions()) as server:
        r = httpx.post(server.base_url + "/v1/chat/completions", content=damaged,
                       headers={"content-encoding": "gzip"}, timeout=5)
        after = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=5)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "Content-Encoding 'gzip' could not be undone" in message and "compared as sent" in message, message
    assert after.status_code == 200  # the server goes on


def test_serve_refuses_at_start_a_fault_that_fits_none_of_the_recordings(tmp_path):
    write_recording(tmp_path / "no-tool.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    write_recording(tmp_path / "also-no-tool.jsonl", "openai", openai_chat_frames(words=5, tool=False))
    for fault, message in [
        ("cut:at=tool-args", "has no tool-args position (nor any of the other 1 recordings)"),
        ("cut:event=500", "event 500 does not exist"),
        ("drop:event=500", "event 500 does not exist"),
        ("swap-tail:with=no-tool.jsonl,at=500", "event 500 does not exist"),  # checked once its recording is loaded
    ]:
        result = subprocess.run([*STREAMTAP, "serve", str(tmp_path), "--fault", fault], capture_output=True, text=True, timeout=10)
        assert result.returncode == 2, (fault, result.stderr)
        assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


def test_serve_takes_a_fault_that_fits_one_of_the_recordings(tmp_path):
    write_recording(tmp_path / "no-tool.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    write_recording(tmp_path / "tool.jsonl", "openai", openai_chat_frames(words=3, tool=True))
    proc = subprocess.Popen([*STREAMTAP, "serve", str(tmp_path), "--fault", "cut:at=tool-args"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("http://127.0.0.1:"), proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_http_1_0_client_gets_the_body_as_it_is_ended_by_the_close(library):
    """RFC 9112: no Transfer-Encoding to an HTTP/1.0 client; the body runs to the close."""
    frames = openai_chat_frames()
    with _server(library) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(OPENAI_BODY) + OPENAI_BODY)
            data = b""
            while piece := sock.recv(65536):
                data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head
    assert body == b"".join(frames)


def _server_side_connections(port: int) -> list[str]:
    """The TCP states (hex, as /proc/net/tcp gives them) of the server's own sockets on ``port``
    but its listening one: a connection the server has not closed yet shows here."""
    states = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] != "0A":
            states.append(fields[3])
    return states


@pytest.mark.parametrize("leave", ["close", "half-close"])
def test_a_client_that_leaves_during_a_stall_is_let_go_at_once_not_when_the_stall_ends(library, leave):
    """A stall of 30 s: the client reads what came before it and hangs up. The server notices
    then, not 30 s later, and closes its side (its socket would sit in CLOSE_WAIT meanwhile);
    the next client is answered as usual."""
    with _server(library, "stall:after=2,secs=30") as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(OPENAI_BODY)}\r\n\r\n".encode() + OPENAI_BODY)
        data = b""
        while data.count(b"\n\n") < 3:  # the events before the stall
            data += sock.recv(65536)
        assert _server_side_connections(int(port)) == ["01"], "the server's side of the connection is not to be seen"
        if leave == "half-close":
            sock.shutdown(socket.SHUT_WR)
        else:
            sock.close()
        deadline = time.monotonic() + 3
        while _server_side_connections(int(port)) and time.monotonic() < deadline:
            time.sleep(0.02)
        held = _server_side_connections(int(port))
        if leave == "half-close":
            assert sock.recv(100) == b""  # the server closed its side: no more of the answer comes
            sock.close()
        with socket.create_connection((host, int(port)), timeout=10) as again:
            again.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(OPENAI_BODY)}\r\n\r\n".encode() + OPENAI_BODY)
            assert again.recv(100).startswith(b"HTTP/1.1 200 ")  # the next client is answered
    assert held == [], f"the server still holds the connection the client left: states {held}"


def test_a_request_pipelined_during_a_stall_is_kept_and_answered_after_the_first(library):
    """What the client sends while the server watches a stall for its leaving is the next request."""
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(OPENAI_BODY)}\r\n\r\n".encode() + OPENAI_BODY)
    with _server(library, "stall:after=2,secs=0.4") as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request)
            data = b""
            while data.count(b"\n\n") < 3:
                data += sock.recv(65536)
            sock.sendall(request)  # during the first answer's stall
            while data.count(b"\r\n0\r\n\r\n") < 2:
                piece = sock.recv(65536)
                assert piece, "the connection ended before the second answer"
                data += piece
    first, second = data.split(b"\r\n0\r\n\r\n")[:2]
    assert first.startswith(b"HTTP/1.1 200 ") and second.startswith(b"HTTP/1.1 200 ")
    assert [served.target for served in server.served] == ["/v1/chat/completions"] * 2


def test_a_client_that_leaves_mid_stream_costs_no_traceback_and_the_next_is_served(library, caplog):
    with _server(library, "stall:after=2,secs=0.5") as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        with caplog.at_level("ERROR"):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(OPENAI_BODY)}\r\n\r\n".encode() + OPENAI_BODY)
            assert sock.recv(100)
            time.sleep(0.1)  # the rest of what was sent sits unread: the close resets the connection
            sock.close()
            time.sleep(0.8)  # past the stall: the server writes to a connection that is gone
        data, how = _raw_exchange(server.base_url, OPENAI_BODY)
    assert how == "complete"
    assert "Unhandled exception" not in caplog.text and "Traceback" not in caplog.text, caplog.text
