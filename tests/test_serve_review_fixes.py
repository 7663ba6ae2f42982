"""`streamtap serve` and `sweep`, after a review: what a killed proxy's leftover ends with, a reset
that keeps the bytes before it, a stall a slow reader still gets, header fields the sweep judges
with, response heads no recording or fault can break, and empty lines before a request. Real
clients on loopback: the openai SDK, httpx, a raw socket, the CLI."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from replay_streams import KINDS, OPENAI_REQUEST, dechunk, openai_chat_frames

from streamtap.recording import RecordingWriter
from streamtap.replay.faults import parse_faults
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread
from streamtap.replay.source import RecordingError, load_source
from streamtap.wire import SSEDecoder

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]
OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()
# one large OpenAI chunk: 4,000 of them make a body of about 3.9 MB, more than every buffer between
# the server and a client holds
BIG_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 900 + b'"}}]}\n\n'
CUT = 3_000_000


def recording(path: Path, frames: list[bytes], *, end: bool = True, response_headers=None, **header_fields) -> Path:
    """An OpenAI chat recording of ``frames`` (one read each), with ``header_fields`` in its header;
    without its end line when ``end`` is false (what a killed proxy leaves)."""
    url, request, wire, dialect, content_type = KINDS["openai"]
    writer = RecordingWriter(path)
    writer.header({
        "request": {"method": "POST", "url": url, "headers": [["content-type", "application/json"]], "body": request},
        "response": {"status": 200, "headers": response_headers or [["content-type", content_type]]},
        "dialect": dialect, "wire": {"format": wire, "content_encoding": None}, **header_fields,
    })  # fmt: skip
    decoder = SSEDecoder()
    for i, raw in enumerate(frames):
        writer.read(raw, float(i))
        for event in decoder.feed(raw):
            writer.frame(event, float(i))
    writer.finish({"stream_end": "finished"})
    if not end:
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(line for line in lines if b'"type":"end"' not in line))
    return path


def request_bytes(close: bool = True) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n" % (len(OPENAI_BODY), b"connection: close\r\n" if close else b"") + OPENAI_BODY)


def slow_socket(server: ServerThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(20)
    sock.sendall(request_bytes())
    return sock


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    return recording(tmp_path_factory.mktemp("big") / "big.jsonl", [BIG_CHUNK] * 4000)


# --- a killed proxy's leftover ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["20261206T000000Z_openai_abc.partial.jsonl", "renamed.jsonl"])
def test_a_killed_proxys_leftover_ends_with_an_abort_as_its_client_got_it(tmp_path, name):
    import openai

    frames = openai_chat_frames(10, tool=False)
    leftover = recording(tmp_path / name, frames[:5], end=False)
    assert load_source(leftover).end_style == "abort"
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-test", max_retries=0)
        with pytest.raises(openai.APIConnectionError):  # not a short answer taken for the whole one
            for _chunk in client.chat.completions.create(**OPENAI_REQUEST):
                pass
    proc = subprocess.Popen([*STREAMTAP, "serve", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        warning = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert "without their end line" in warning and "ends with an abort" in warning, warning


def test_a_whole_recording_still_ends_clean(tmp_path):
    whole = recording(tmp_path / "whole.jsonl", openai_chat_frames(10, tool=False))
    assert load_source(whole).end_style == "clean"


# --- a reset keeps the bytes before it; a stall is a silence a slow reader gets whole ------------


def test_a_reset_cut_delivers_every_byte_before_it_to_a_client_slow_to_read(big):
    with ServerThread(Library.load([big]), ServeOptions(faults=parse_faults(f"cut:byte={CUT},style=reset"))) as server:
        sock = slow_socket(server)
        time.sleep(1.0)  # busy elsewhere: the server's buffers and the kernel's fill up meanwhile
        received, ended = b"", "FIN"
        try:
            while data := sock.recv(64 * 1024):
                received += data
        except ConnectionResetError:
            ended = "RST"
        finally:
            sock.close()
    chunks, terminated = dechunk(received)
    body = b"".join(chunks)
    assert (len(body), ended, terminated) == (CUT, "RST", False)
    assert body == (BIG_CHUNK * 4000)[:CUT]


def test_a_stall_is_a_silence_a_slow_reader_still_gets_whole(big):
    with ServerThread(Library.load([big]), ServeOptions(faults=parse_faults(f"stall:byte={CUT},secs=1"))) as server:
        sock = slow_socket(server)
        got, last, gaps = 0, time.monotonic(), []
        with sock:
            while data := sock.recv(16 * 1024):
                now = time.monotonic()
                gaps.append((now - last, got))
                last, got = now, got + len(data)
                time.sleep(len(data) / 2_000_000)  # reads at about 2 MB/s: the buffers hold a second's worth
    longest, at = max(gaps)
    assert longest >= 0.95 and CUT - 300_000 <= at <= CUT + 300_000, (longest, at)


# --- the sweep judges with the recording's own header fields -------------------------------------


@pytest.mark.parametrize(
    ("fields", "verdict"),
    [({"sentinel": "END-OF-ANSWER"}, "truncated"), ({"max_event_size": 100}, "corrupt"), ({"streamed": False}, "unknown")],
)
def test_the_sweep_judges_the_served_stream_as_verify_judges_the_recording(tmp_path, fields, verdict):
    path = recording(tmp_path / "r.jsonl", openai_chat_frames(10, tool=False), **fields)
    verified = subprocess.run([*STREAMTAP, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert f": {verdict} (openai-chat)" in verified.stdout, verified.stdout
    swept = subprocess.run(
        [*STREAMTAP, "sweep", str(path), "--positions", "event=3", "--styles", "clean", "--no-progress", "--json", "-",
         "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = json.loads(swept.stdout)
    assert report["baseline"]["verdict"] == verdict and report["runs"][0]["verdict"] == verdict, report


# --- response heads that no recording, and no fault spec, can break -------------------------------


@pytest.mark.parametrize(
    "header",
    [["content-type", "text/event-stream\r\nx-evil: 1"], ["x-a\nx-evil", "1"], ["x-a", "1\0"], ["x-a", "1\rx"]],
)
def test_a_recorded_response_header_with_a_line_break_is_refused_in_one_line(tmp_path, header):
    path = recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False), response_headers=[header])
    with pytest.raises(RecordingError, match=r"line 1 is damaged: the response header .* holds a CR, LF or NUL"):
        load_source(path)
    served = subprocess.run([*STREAMTAP, "serve", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert served.returncode == 2 and served.stderr.count("\n") == 1 and "holds a CR, LF or NUL" in served.stderr, served.stderr


def test_a_recorded_response_header_is_served_as_the_bytes_it_was_recorded_from(tmp_path):
    """mitmproxy reads a header's bytes as UTF-8 (a byte that is not, as a lone surrogate): serve
    writes them back so, where it wrote latin-1 and a "?" for any other character."""
    recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False),
              response_headers=[["content-type", "text/event-stream"], ["x-note", "café ☕"]])
    library = Library.load([tmp_path])
    headers = library.entries[0].source.headers
    with ServerThread(library, ServeOptions()) as server:
        def served() -> dict[bytes, bytes]:
            answer = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10)
            assert answer.status_code == 200 and answer.content == b"".join(openai_chat_frames(3, tool=False))
            return dict(answer.headers.raw)

        assert served()[b"x-note"] == "café ☕".encode()
        # what a recording cannot hold (its JSON reader refuses a lone surrogate), a Source made in code can
        headers.append(("x-byte", "a\udcffb"))
        assert served()[b"x-byte"] == b"a\xffb"
        headers.append(("x-odd", "a\ud800b"))  # a surrogate no byte gives: a "?", not a failed answer
        assert served()[b"x-odd"] == b"a?b"


def test_the_injected_fault_header_carries_any_text_of_the_spec(tmp_path):
    recording(tmp_path / "r.jsonl", openai_chat_frames(10, tool=False))
    spec = "error:kind=openai,after=2,message=日本語のエラー 100% sûr"
    with ServerThread(Library.load([tmp_path]), ServeOptions(faults=parse_faults(spec))) as server:
        answer = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10)
    written = answer.headers.raw
    value = next(v for k, v in written if k.lower() == b"x-streamtap-injected-fault")
    assert value.isascii() and unquote(value.decode("ascii")) == spec, value
    assert len(written) == 4  # content-type, transfer-encoding, connection and the fault: no header more


# --- empty lines before a request line (RFC 9112 2.2) --------------------------------------------


def read_all(sock: socket.socket) -> bytes:
    received = b""
    while data := sock.recv(64 * 1024):
        received += data
    return received


def test_empty_lines_before_a_request_line_are_ignored(tmp_path):
    recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False))
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        for sent in (b"\r\n" + request_bytes(),  # one before the connection's first request
                     request_bytes(close=False) + b"\r\n" + request_bytes(),  # a CRLF after a POST body
                     b"\r\n\r\n" + request_bytes(close=False) + b"\r\n\r\n\r\n" + request_bytes()):
            with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
                for piece in (sent[:1], sent[1:]):  # the empty line in pieces too
                    sock.sendall(piece)
                    time.sleep(0.05)
                answers = read_all(sock)
            assert answers.count(b"HTTP/1.1 200 OK\r\n") == sent.count(b"POST ") and b" 400 " not in answers, answers[:300]


def test_a_kept_alive_connection_that_sends_only_empty_lines_and_leaves_is_let_go(tmp_path):
    recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False))
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
            sock.sendall(request_bytes(close=False) + b"\r\n")
            time.sleep(0.2)
            sock.shutdown(socket.SHUT_WR)
            answers = read_all(sock)  # the connection ends: no 400, no 408, no wait
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 1 and answers.endswith(b"0\r\n\r\n"), answers[-200:]


def test_a_proxy_in_front_records_the_injected_fault_as_it_was_given(tmp_path):
    """The Tap reads the header back: it decodes it, so the recording names the spec, not its escapes."""
    from mitmproxy.http import Headers
    from mitmproxy.test import tflow

    from streamtap.recording.flows import injected_fault

    recording(tmp_path / "r.jsonl", openai_chat_frames(10, tool=False))
    spec = "error:kind=openai,after=2,message=日本語のエラー 100% sûr"
    with ServerThread(Library.load([tmp_path]), ServeOptions(faults=parse_faults(spec))) as server:
        answer = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10)
    flow = tflow.tflow(resp=True)
    flow.response.headers = Headers(list(answer.headers.raw))
    assert injected_fault(flow) == spec


def test_positions_read_the_turn_as_the_recording_was_judged(tmp_path):
    """before-terminal is before the event after which the stream is no longer judged truncated:
    with the recording's sentinel missing from the answer, no event does, so the position is not
    there (it was found as if no sentinel had been asked for, and the cut judged like the whole)."""
    from streamtap.replay.faults import FaultSpecError, plan, protocol_positions

    frames = openai_chat_frames(10, tool=False)
    plain = load_source(recording(tmp_path / "plain.jsonl", frames))
    guarded = load_source(recording(tmp_path / "guarded.jsonl", frames, sentinel="END-OF-ANSWER"))
    assert [name for name, _, _ in protocol_positions(plain)].count("before-terminal") == 1
    assert "before-terminal" not in [name for name, _, _ in protocol_positions(guarded)]
    with pytest.raises(FaultSpecError, match="no before-terminal position"):
        plan(guarded, parse_faults("cut:at=before-terminal"))


def test_matching_a_request_runs_beside_the_loop_that_times_the_other_clients(tmp_path, monkeypatch):
    """Hashing a 16 MB body against the recordings held another client's original-timing stream
    for 1.7 s, a 404's nearest recordings over a thousand for 0.4 s: matching, explaining and
    finding a Last-Event-ID now run in threads, not on the server's loop."""
    import threading

    import streamtap.replay.server as server_module

    threads: dict[str, set[str]] = {}

    def watched(name, work):
        def run(*args, **kwargs):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return work(*args, **kwargs)
        return run

    monkeypatch.setattr(Library, "find", watched("find", Library.find))
    monkeypatch.setattr(Library, "explain", watched("explain", Library.explain))
    monkeypatch.setattr(server_module, "resume_position", watched("resume", server_module.resume_position))
    recording(tmp_path / "r.jsonl", [b"id: 1\n" + frame for frame in openai_chat_frames(3, tool=False)])
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server:
        assert httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10).status_code == 200
        assert httpx.post(server.base_url + "/v1/nothing", content=b"{}", timeout=10).status_code == 404
        resumed = httpx.post(server.base_url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10,
                             headers={"last-event-id": "1"})
        assert resumed.status_code == 200
    assert set(threads) == {"find", "explain", "resume"}, threads
    assert "streamtap-replay" not in set().union(*threads.values()), threads


# --- a recorded status no HTTP response carries -----------------------------------------------------


@pytest.mark.parametrize(
    ("response", "served"),
    [({"status": None}, 200), ({"status": None, "status_code": 404}, 404), ({"status_code": 503}, 503), ({}, 200)],
)
def test_a_status_given_as_null_or_as_status_code_is_served(tmp_path, response, served):
    path = recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False), response=response)
    assert load_source(path).status == served


@pytest.mark.parametrize(
    ("response", "says"),
    [
        ({"status_code": "abc"}, """'status_code' is "abc", not an HTTP status"""),
        ({"status": None, "status_code": 99}, "'status_code' is 99, not an HTTP status"),
        ({"status_code": True}, "'status_code' is true, not an HTTP status"),
        ({"status_code": 200.0}, "'status_code' is 200.0, not an HTTP status"),
    ],
)
def test_a_recorded_status_no_http_response_carries_is_refused_in_one_line(tmp_path, response, says):
    """`streamtap verify` reads only `status`: such a file passed it, and sweep, serve and the
    pytest fixture (all of them load_source) broke on int() with a traceback."""
    path = recording(tmp_path / "r.jsonl", openai_chat_frames(3, tool=False), response=response)
    with pytest.raises(RecordingError, match=f"^{re.escape(f'{path}: line 1 is damaged: {says}')}$"):
        load_source(path)
    for verb in (["serve", str(path)], ["sweep", str(path), "--", sys.executable, "-c", "pass"]):
        done = subprocess.run([*STREAMTAP, *verb], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
