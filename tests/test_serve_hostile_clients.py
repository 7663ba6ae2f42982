"""`streamtap serve` against clients that try to crash it, write into its log, hold its event
loop or its memory, run it out of file descriptors or smuggle a request past it (the r23
review): each gets an answer, never a traceback, and the other clients are served meanwhile."""

from __future__ import annotations

import base64
import contextlib
import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from replay_streams import OPENAI_REQUEST, OPENAI_URL, dechunk, openai_chat_frames, write_recording, write_recordings

import streamtap.replay.server as server_module
from streamtap.replay.faults import Timing, parse_faults, plan
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import Limits, ServeOptions, ServerThread
from streamtap.replay.source import load_source
from streamtap.wire import SSEDecoder

STREAMTAP = Path(sys.executable).with_name("streamtap")
PATH = "/v1/chat/completions"
BODY = json.dumps(OPENAI_REQUEST).encode()
EXPECTED = b"".join(openai_chat_frames())
BIG_REQUEST = {"model": "big", "stream": True, "messages": []}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    folder = write_recordings(tmp_path_factory.mktemp("hostile_clients"))
    # 390 KB of events: fragment:max=1 makes it 390,000 writes, about half a second to plan
    write_recording(folder / "big.jsonl", "openai", openai_chat_frames(2000), request=BIG_REQUEST)
    return folder


def running(folder: Path, lines: list[str] | None = None, **limits: float) -> ServerThread:
    options = ServeOptions(Timing.parse("fast"), fault_header=True)
    log = lines.append if lines is not None else None
    return ServerThread(Library.load([folder]), options, log=log, limits=Limits(**limits) if limits else None)


def address(server: ServerThread) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").split(":")
    return host, int(port)


def request_bytes(body: bytes = BODY, path: str = PATH, headers: str = "connection: close\r\n") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{headers}\r\n").encode() + body


def exchange(server: ServerThread, data: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers ``data`` with, up to its close."""
    with socket.create_connection(address(server), timeout=timeout) as sock:
        sock.sendall(data)
        return read_to_close(sock, timeout)


def read_to_close(sock: socket.socket, timeout: float) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    try:
        while time.monotonic() < deadline:
            piece = sock.recv(1 << 20)
            if not piece:
                break
            got += piece
    except (TimeoutError, ConnectionResetError):
        pass
    return got


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def json_of(response: bytes) -> dict:
    return json.loads(response.partition(b"\r\n\r\n")[2])


# --- 1. a lone surrogate escape in a JSON body ----------------------------------------------


SURROGATE_BODY = b'{"model":"gpt-4.1-nano","stream":true,"messages":[{"role":"user","content":"cut emoji \\ud83d"}]}'


def write_surrogate_recording(path: Path) -> Path:
    """What the Tap writes for such a request: its JSON parser refuses the lone surrogate, so the
    body is kept as its bytes (body_b64)."""
    from streamtap.recording import RecordingWriter

    writer = RecordingWriter(path)
    writer.header({"request": {"method": "POST", "url": OPENAI_URL, "headers": [["content-type", "application/json"]],
                               "body_b64": base64.b64encode(SURROGATE_BODY).decode()},
                   "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
                   "dialect": "openai-chat", "wire": {"format": "sse", "content_encoding": None}})
    decoder = SSEDecoder()
    for i, frame in enumerate(openai_chat_frames(3, tool=False)):
        writer.read(frame, i)
        for event in decoder.feed(frame):
            writer.frame(event, i)
    writer.finish({"stream_end": "finished"})
    return path


def test_a_recording_of_a_body_with_a_lone_surrogate_loads_and_answers_that_request(tmp_path):
    write_surrogate_recording(tmp_path / "surrogate.jsonl")
    write_recordings(tmp_path)
    with running(tmp_path) as server:
        response = exchange(server, request_bytes(SURROGATE_BODY))
    assert status_of(response) == 200, response[:300]
    chunks, terminated = dechunk(response)
    assert b"".join(chunks) == b"".join(openai_chat_frames(3, tool=False)) and terminated


def test_a_live_body_with_a_lone_surrogate_gets_a_404_not_a_dropped_connection(recordings):
    lines: list[str] = []
    with running(recordings, lines) as server:
        response = exchange(server, request_bytes(b'{"model":"\\ud800"}'))
    assert status_of(response) == 404, response[:300]
    assert json_of(response)["error"]["type"] == "streamtap_no_recording"
    assert any(" -> 404 " in line for line in lines), lines


# --- 2. control characters a client sends, in the 404 and the log ---------------------------


def test_control_characters_in_the_path_and_field_names_are_escaped_in_the_404_and_the_log(recordings):
    forged = "/v1/x%0astreamtap%20replay:%20forged%1b[31mRED%1b[0m%1b]0;pwned%07%c2%9b2K%e2%80%ae"
    body = json.dumps({**OPENAI_REQUEST, "\x1b[2Kfield\u202e": 1}).encode()
    lines: list[str] = []
    with running(recordings, lines) as server:
        on_path = exchange(server, request_bytes(path=forged))
        on_field = exchange(server, request_bytes(body))
    assert status_of(on_path) == 404 and status_of(on_field) == 404
    messages = [json_of(on_path)["error"]["message"], json_of(on_field)["error"]["message"]]
    for text in messages + lines:
        assert not any(char in text for char in "\x1b\x07\x9b\u202e\n"), repr(text)
    assert "\\x1b[31mRED\\x1b[0m\\x1b]0;pwned\\x07\\x9b2K\\u202e" in messages[0], messages[0]
    assert "body.\\x1b[2Kfield\\u202e" in messages[1], messages[1]
    assert len(lines) == 2 and "\\x1b[31mRED" in lines[0] and "body.\\x1b[2Kfield" in lines[1], lines


# --- 3. one fault-header request and the rest of the server ----------------------------------


class Streaming(threading.Thread):
    """A client that asks for ``fault`` on the big recording and reads all it is sent, as fast
    as it comes (``until``: stop reading after that many seconds)."""

    def __init__(self, server: ServerThread, fault: str, until: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(address(server), timeout=30)
        self.fault, self.until = fault, until
        self.first_byte = threading.Event()
        self.first_byte_at = self.done_at = None
        self.received = 0

    def run(self) -> None:
        self.sock.sendall(request_bytes(json.dumps(BIG_REQUEST).encode(), headers=f"x-streamtap-fault: {self.fault}\r\n"))
        start = time.monotonic()
        try:
            while time.monotonic() - start < self.until:
                piece = self.sock.recv(1 << 20)
                if not piece:
                    break
                if not self.received:
                    self.first_byte_at = time.monotonic()
                    self.first_byte.set()
                self.received += len(piece)
                if piece.endswith(b"\r\n0\r\n\r\n"):
                    break
        except OSError:
            pass
        self.done_at = time.monotonic()
        self.sock.close()


def test_a_one_byte_fragmented_stream_lets_the_other_clients_in(recordings):
    """390,000 writes to a client that keeps up: drain() never waits, and without a yield the
    other clients were answered only once the whole stream had been written."""
    with running(recordings) as server:
        hog = Streaming(server, "fragment:max=1")
        hog.start()
        assert hog.first_byte.wait(20)
        response = exchange(server, request_bytes(), timeout=20)
        other_done = time.monotonic()
        hog.join(30)
    assert status_of(response) == 200 and dechunk(response)[0] and b"".join(dechunk(response)[0]) == EXPECTED
    assert hog.done_at is not None and hog.received > 390_000
    assert other_done < hog.done_at, f"the other client was answered {other_done - hog.done_at:.2f} s after the stream ended"


def test_a_long_plan_is_made_while_the_other_clients_are_served(recordings):
    """A plan of 390,000 writes (here: each an hour late) is made in a worker thread."""
    source = load_source(recordings / "big.jsonl")
    fault = "fragment:max=1;latency:ms=3600000"
    started = time.monotonic()
    plan(source, parse_faults(fault), Timing.parse("fast"))
    planning = time.monotonic() - started
    with running(recordings) as server:
        hog = Streaming(server, fault, until=planning * 3 + 2)
        hog.start()
        time.sleep(0.02)  # (its request in first)
        sent = time.monotonic()
        response = exchange(server, request_bytes(), timeout=20)
        waited = time.monotonic() - sent
        hog.sock.shutdown(socket.SHUT_RDWR)
        hog.join(10)
    assert status_of(response) == 200
    assert waited < planning / 2, f"the other client waited {waited:.2f} s; planning alone takes {planning:.2f} s"


def test_the_plan_cache_is_bounded_by_size_not_only_by_count(recordings, monkeypatch):
    """Each fragment:max=1 plan of the 12 KB recording holds 12,000 writes (about 1.3 MB kept);
    different seeds make different plans, each a new entry of the cache."""
    budget = 3 * 1024 * 1024
    monkeypatch.setattr(server_module, "PLANS_KEPT_BYTES", budget)
    with running(recordings) as server:
        for seed in range(5):
            response = exchange(server, request_bytes(headers=f"x-streamtap-fault: fragment:max=1,seed={seed}\r\nconnection: close\r\n"))
            assert status_of(response) == 200
        replay = server.server
        kept = list(replay._plans.values())  # (the cache itself: its size is what is bounded)
        assert 1 <= len(kept) <= 2 and replay._plans_bytes == sum(size for _, size in kept) <= budget, [s for _, s in kept]
        assert all(size > 1024 * 1024 for _, size in kept)
        assert status_of(exchange(server, request_bytes())) == 200  # a small plan is still kept beside them
        assert len(replay._plans) <= 3 and replay._plans_bytes <= budget


# --- 4. the 404 of a body of many fields ----------------------------------------------------


def test_the_404_names_the_first_ten_differing_fields_and_counts_the_rest(recordings):
    fields = 200_000
    body = json.dumps({f"k{i:06d}": 1 for i in range(fields)}).encode()
    lines: list[str] = []
    with running(recordings, lines, body_bytes=32 * 1024 * 1024) as server:
        response = exchange(server, request_bytes(body), timeout=30)
    assert status_of(response) == 404
    nearest = json_of(response)["error"]["nearest"]
    assert len(response) < 20_000, f"a 404 of {len(response)} bytes"
    for recording in nearest:
        differs = recording["differs_in"]
        assert len(differs) == 11 and differs[-1].startswith("and ") and differs[-1].endswith(" more"), differs
        fields_named = [name for name in differs[:10] if name.startswith("body.")]
        assert fields_named and fields_named == sorted(fields_named), differs
    big = next(r for r in nearest if r["recording"].endswith("big.jsonl"))
    # the big recording's body has 3 fields, none in the live one: all 200,003 differ
    assert big["differs_in"][:10] == [f"body.k{i:06d}" for i in range(10)] and big["differs_in"][10] == f"and {fields + 3 - 10} more"
    assert len(lines) == 1 and len(lines[0]) < 2_000, len(lines[0])


# --- 5. out of file descriptors -------------------------------------------------------------


@contextlib.contextmanager
def serving_with_fd_limit(recordings: Path, tmp_path: Path, soft: int):
    """``streamtap serve`` whose ``ulimit -n`` is ``soft``: (host, port, the sockets the test opens,
    to be closed after the server stopped). Its stderr is in tmp_path/stderr."""
    def fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    log = (tmp_path / "stderr").open("w+")  # (a file: a pipe that fills would stop the server)
    serve = subprocess.Popen([str(STREAMTAP), "serve", "--port", "0", str(recordings)], stdout=subprocess.PIPE,
                             stderr=log, text=True, preexec_fn=fd_limit)
    opened: list[socket.socket] = []
    try:
        base_url = serve.stdout.readline().strip()
        assert base_url.startswith("http://"), (tmp_path / "stderr").read_text()
        host, port = base_url.removeprefix("http://").split(":")
        yield host, int(port), opened
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=10)
        log.close()
        for sock in opened:
            sock.close()


def test_running_out_of_file_descriptors_is_said_in_one_line_and_the_server_recovers(recordings, tmp_path):
    with serving_with_fd_limit(recordings, tmp_path, 48) as (host, port, opened):
        idle = [socket.create_connection((host, port), timeout=5) for _ in range(100)]
        opened += idle  # (closed again after the server stopped, should an assertion stop the test first)
        time.sleep(2.5)  # asyncio retries each second: a few passes over the backlog
        for sock in idle:
            sock.close()
        response = b""
        deadline = time.monotonic() + 5
        while status_of(response) != 200 and time.monotonic() < deadline:  # accepting again within a second or so
            with socket.create_connection((host, port), timeout=5) as sock:
                sock.sendall(request_bytes())
                response = read_to_close(sock, 5)
        assert status_of(response) == 200, response[:200]
        # out of fds again, and stopped so: asyncio's retries of accept() still pending then find
        # the listening socket closed, each with a traceback of its own
        opened += [socket.create_connection((host, port), timeout=5) for _ in range(100)]
        time.sleep(1.5)
    stderr = (tmp_path / "stderr").read_text()
    said = [line for line in stderr.splitlines() if "cannot accept connections" in line]
    assert len(said) == 1 and "Too many open files" in said[0], stderr[-3000:]
    assert "Traceback" not in stderr and "out of system resource" not in stderr, stderr[-3000:]
    assert len(stderr.splitlines()) < 20, stderr[-3000:]


def test_a_connection_that_never_sends_a_byte_is_closed_after_the_first_byte_timeout(recordings):
    with running(recordings, first_byte_timeout=0.5, idle_timeout=60) as server:
        with socket.create_connection(address(server), timeout=5) as silent:
            started = time.monotonic()
            assert read_to_close(silent, 4) == b""
            assert time.monotonic() - started < 3
        with socket.create_connection(address(server), timeout=5) as kept:  # after a request: the keep-alive wait
            for _ in range(2):
                kept.sendall(request_bytes(headers=""))
                got = b""
                while not got.endswith(b"\r\n0\r\n\r\n"):
                    got += kept.recv(65536)
                assert status_of(got) == 200
                time.sleep(1.0)


# --- 6. Content-Length and Transfer-Encoding together ----------------------------------------


def test_content_length_with_transfer_encoding_gets_a_400_and_the_connection_closes(recordings):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    smuggled = (f"POST {PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n".encode()
                + chunked + request_bytes())
    with running(recordings) as server:
        response = exchange(server, smuggled)
        assert status_of(exchange(server, request_bytes())) == 200
    assert status_of(response) == 400, response[:300]
    assert response.count(b"HTTP/1.1 ") == 1, response[:600]
    error = json_of(response)["error"]
    assert error["type"] == "bad_request" and "Content-Length" in error["message"] and "Transfer-Encoding" in error["message"]


def test_under_once_a_recording_taken_while_a_request_planned_is_not_served_twice(recordings):
    """Planning in a thread lets another request take the recording meanwhile: the planning one
    then looks again and, with the only recording of its request used up, gets a 404."""
    options = ServeOptions(Timing.parse("fast"), fault_header=True)
    with ServerThread(Library.load([recordings / "big.jsonl"], MatchOptions(once=True)), options) as server:
        body = json.dumps(BIG_REQUEST).encode()
        planning = threading.Thread(target=exchange, daemon=True, args=(server, request_bytes(
            body, headers="x-streamtap-fault: fragment:max=1;latency:ms=3600000\r\nconnection: close\r\n"), 10))
        planning.start()
        time.sleep(0.05)  # (its request in first)
        quick = exchange(server, request_bytes(body), timeout=10)
        planning.join(10)
        statuses = [entry.status for entry in server.served]
    assert status_of(quick) == 200
    assert statuses == [200, 404], statuses
    assert "already served" in server.served[1].refused


def test_ctrl_c_stops_the_server_without_waiting_for_the_plans_being_made(recordings, tmp_path):
    """Four requests each ask for a plan of 390,000 writes (different seeds: four plans, a few
    seconds of work together); Ctrl-C while they are made stops the server at once."""
    source = load_source(recordings / "big.jsonl")
    started = time.monotonic()
    plan(source, parse_faults("fragment:max=1"), Timing.parse("fast"))
    planning = time.monotonic() - started
    log = (tmp_path / "stderr").open("w+")
    serve = subprocess.Popen([str(STREAMTAP), "serve", "--port", "0", "--fault-header", str(recordings)],
                             stdout=subprocess.PIPE, stderr=log, text=True)
    clients: list[socket.socket] = []
    try:
        host, port = serve.stdout.readline().strip().removeprefix("http://").split(":")
        body = json.dumps(BIG_REQUEST).encode()
        for seed in range(4):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(request_bytes(body, headers=f"x-streamtap-fault: fragment:max=1,seed={seed}\r\nconnection: close\r\n"))
            clients.append(sock)
        time.sleep(min(planning / 2, 0.3))  # (the plans under way)
        interrupted = time.monotonic()
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=30)
        stopped = time.monotonic() - interrupted
    finally:
        if serve.poll() is None:
            serve.kill()
        serve.communicate(timeout=10)
        log.close()
        for sock in clients:
            sock.close()
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr, stderr
    assert stopped < planning * 2, f"stopped {stopped:.2f} s after Ctrl-C; four plans take about {4 * planning:.2f} s"


def test_clients_that_ask_for_plans_and_hang_up_start_no_more_threads_than_the_limit(recordings):
    body = json.dumps(BIG_REQUEST).encode()
    clients = 8
    assert server_module.PLANS_AT_ONCE < clients, "the test needs more clients than plans made at once"
    most = 0
    with running(recordings) as server:
        for seed in range(clients):
            with socket.create_connection(address(server), timeout=5) as sock:
                sock.sendall(request_bytes(body, headers=f"x-streamtap-fault: fragment:max=1,seed={seed}\r\nconnection: close\r\n"))
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            most = max(most, sum(thread.name == "streamtap-plan" for thread in threading.enumerate()))
            time.sleep(0.01)
        assert 1 <= most <= server_module.PLANS_AT_ONCE, f"{most} plans made at once"


# --- 9. More connections than the server serves at once ----------------------------------------


def held_connections(server: ServerThread, count: int) -> list[socket.socket]:
    """``count`` connections that send nothing, each taken by the server before this returns."""
    held = [socket.create_connection(address(server), timeout=5) for _ in range(count)]
    deadline = time.monotonic() + 5
    while len(server.server._handlers) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server.server._handlers) == count
    return held


def test_a_connection_over_the_cap_gets_a_503_the_sdk_retries_and_the_server_serves_again(recordings):
    import openai

    lines: list[str] = []
    with running(recordings, lines, connections=2, first_byte_timeout=30) as server:
        held = held_connections(server, 2)
        try:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-test", max_retries=0)
            with pytest.raises(openai.InternalServerError) as refused:
                client.chat.completions.create(**OPENAI_REQUEST)
            assert refused.value.status_code == 503
            assert refused.value.response.headers["retry-after"] == "1"
            assert "its limit of 2 connections" in refused.value.message
            # a request body the server never reads still gets the 503, not a reset
            big = json.dumps({**OPENAI_REQUEST, "padding": "x" * 2_000_000}).encode()
            assert status_of(exchange(server, request_bytes(big))) == 503

            # the SDK's own retry (after Retry-After) is served once a held connection closes
            threading.Timer(0.3, held.pop().close).start()
            retrying = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-test", max_retries=2)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in retrying.chat.completions.create(**OPENAI_REQUEST)
                           if chunk.choices)
            turn_text = "".join(piece for frame in openai_chat_frames() for piece in _content_of(frame))
            assert text == turn_text
        finally:
            for sock in held:
                sock.close()
    said = [line for line in lines if "its limit of 2 connections" in line]
    assert len(said) == 1 and "503" in said[0] and "--max-connections" in said[0], lines


def _content_of(frame: bytes) -> list[str]:
    data = frame.removeprefix(b"data: ").strip()
    if not data.startswith(b"{"):
        return []
    return [choice["delta"].get("content") or "" for choice in json.loads(data).get("choices", [])]


def test_max_connections_below_one_is_refused_before_listening(recordings):
    done = subprocess.run([str(STREAMTAP), "serve", "--max-connections", "0", str(recordings)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--max-connections 0: at least 1" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_flood_over_the_cap_is_closed_at_once_past_the_lingering_limit_and_the_server_recovers(recordings, monkeypatch):
    monkeypatch.setattr(server_module, "REFUSED_LINGERING", 2)
    lines: list[str] = []
    with running(recordings, lines, connections=1, first_byte_timeout=30) as server:
        held = held_connections(server, 1)
        flood = [socket.create_connection(address(server), timeout=5) for _ in range(6)]
        try:
            answers = [read_to_close(sock, 3) for sock in flood]
        finally:
            for sock in flood:
                sock.close()
        statuses = sorted(status_of(answer) for answer in answers)
        assert statuses == [0, 0, 0, 0, 503, 503], statuses  # two lingering with their 503, the rest closed
        held.pop().close()
        deadline = time.monotonic() + 5
        while (server.server._handlers or server.server._refusing) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.server._handlers and not server.server._refusing
        assert status_of(exchange(server, request_bytes())) == 200
    assert len([line for line in lines if "its limit of 1 connections" in line]) == 1, lines


def test_by_default_the_cap_is_what_the_fd_limit_leaves_room_for_less_128(recordings, tmp_path):
    soft = 400
    with serving_with_fd_limit(recordings, tmp_path, soft) as (host, port, held):
        held += [socket.create_connection((host, port), timeout=5) for _ in range(soft - 128)]
        time.sleep(0.5)  # (all taken: the server accepts in the order they came)
        with socket.create_connection((host, port), timeout=5) as one_more:
            one_more.sendall(request_bytes())
            refused = read_to_close(one_more, 5)
        held.pop().close()
        time.sleep(0.5)
        with socket.create_connection((host, port), timeout=5) as again:
            again.sendall(request_bytes())
            served = read_to_close(again, 5)
    assert status_of(refused) == 503 and f"its limit of {soft - 128} connections" in json_of(refused)["error"]["message"]
    assert status_of(served) == 200, served[:300]
    log = (tmp_path / "stderr").read_text()
    assert "Traceback" not in log
    busy = [line for line in log.splitlines() if f"its limit of {soft - 128} connections" in line]
    assert len(busy) == 1 and "what `ulimit -n` leaves room for" in busy[0] and "--max-connections" not in busy[0], log


def test_at_the_cap_the_connection_idle_longest_between_requests_makes_room(recordings):
    """Kept-alive connections in clients' pools would hold the cap until their idle timeout; at the
    cap the server closes the one idle longest instead of refusing, and a pool reconnects. (One
    that never sent a request is no pool's, and stays: the 503 test above holds such ones.)"""
    import httpx

    with running(recordings, connections=2, first_byte_timeout=30, idle_timeout=60) as server:
        url = server.base_url + PATH
        first, second, third = (httpx.Client(timeout=5) for _ in range(3))
        try:
            for client in (first, second):  # each leaves a connection in its pool, idle between requests
                assert client.post(url, content=BODY).content == EXPECTED
            assert third.post(url, content=BODY).content == EXPECTED  # first's, idle longest, made room
            wait_for(lambda: len(server.server._connections) == 2)
            assert second.post(url, content=BODY).content == EXPECTED  # its connection is still open
            assert first.post(url, content=BODY).content == EXPECTED  # a new one: third's made room
            wait_for(lambda: len(server.server._connections) == 2)
        finally:
            for client in (first, second, third):
                client.close()


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()
