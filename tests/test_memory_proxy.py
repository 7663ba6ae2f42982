"""One long answer through a real mitmdump with streamtap: the proxy's memory does not grow with it.

A 64 MB Anthropic answer of 64 KiB text deltas grew the proxy's peak RSS by about 200 MiB
when the turn kept all its text (several copies); the turn now keeps TEXT_CAP characters
and the recording still holds every byte."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx

from streamtap.providers.judge import TEXT_CAP
from upstream import Mitmdump, find_recording

DELTAS = 1000  # of 64 KiB: a 64 MB answer
GROWTH_BOUND_MIB = 48  # TEXT_CAP (4 MiB) and its copies while the turn is written, with room for noise


def sse(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def answer(deltas: int) -> bytes:
    delta = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": "lorem ipsum " * 5461 + "abcd"}})
    return b"".join([
        sse("message_start", {"type": "message_start", "message": {"id": "msg_big", "type": "message", "role": "assistant",
                                                                   "model": "claude-test", "content": [], "stop_reason": None,
                                                                   "usage": {"input_tokens": 1, "output_tokens": 1}}}),
        sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        delta * deltas,
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}),
        sse("message_stop", {"type": "message_stop"}),
    ])


@contextmanager
def upstream(bodies: dict[str, bytes]):
    """A loopback server answering POST /s/NAME/... with bodies[NAME], one HTTP chunk per event (at most 64 KiB).
    (tests/upstream.py keeps what it sent, growing a bytes object per write: too slow for 64 MB.)"""
    server = socket.create_server(("127.0.0.1", 0))

    def answer_one(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:  # mitmdump connects ahead of a request (and the readiness probe sends none)
                    return
                data += more
            head, rest = data.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(rest) < length:
                rest += conn.recv(65536)
            body = bodies[head.split(b" ")[1].decode().split("/")[2]]
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                         b"connection: close\r\n\r\n")
            start = 0
            while start < len(body):  # an event per chunk, or 64 KiB of a longer one
                end = body.find(b"\n\n", start, start + 65536)
                end = end + 2 if end >= 0 else min(start + 65536, len(body))
                conn.sendall(b"%x\r\n%s\r\n" % (end - start, body[start:end]))
                start = end
            conn.sendall(b"0\r\n\r\n")

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def fetch(client: httpx.Client, url: str) -> tuple[str, int]:
    """The client reads the answer and discards it: its sha256 and length."""
    digest, size = hashlib.sha256(), 0
    with client.stream("POST", url, content=b'{"model":"m","stream":true,"messages":[]}',
                       headers={"content-type": "application/json"}) as response:
        for chunk in response.iter_raw():
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def test_a_64_mb_answer_does_not_grow_the_proxy_memory_with_its_length(tmp_path):
    body = answer(DELTAS)
    assert len(body) > 64e6
    with upstream({"warm": answer(4), "big": body}) as url:
        # in-process analysis (workers=0): the turn's caps are measured in the proxy's own memory, and
        # no worker falls behind a loopback-speed answer (test_workers.py bounds the worker path)
        with Mitmdump(url, tmp_path / "m", options={"streamtap_fsync": "end", "streamtap_workers": 0}) as proxy, \
                httpx.Client(timeout=60) as client:
            fetch(client, f"{proxy.url}/s/warm/v1/messages")  # imports and caches, before the baseline
            find_recording(proxy.record_dir, "warm")
            before = peak_rss_mib(proxy.process.pid)
            digest, size = fetch(client, f"{proxy.url}/s/big/v1/messages")
            rec = find_recording(proxy.record_dir, "big", timeout=30)
            growth = peak_rss_mib(proxy.process.pid) - before
    assert (digest, size) == (hashlib.sha256(body).hexdigest(), len(body))  # the client got every byte
    assert growth < GROWTH_BOUND_MIB, f"the proxy's peak RSS grew by {growth:.1f} MiB for one 64 MB answer"
    assert rec.complete_file and rec.wire == body  # the recording holds every byte
    assert rec.verdict["kind"] == "complete"
    block = rec.end["turn"]["choices"][0]["blocks"][0]
    assert len(block["text"]) == TEXT_CAP and block["extra"]["text_dropped_chars"] == DELTAS * 65536 - TEXT_CAP
    assert any("not kept in memory" in note for note in rec.end["turn"]["notes"])
    verify = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(rec.path)], capture_output=True, text=True)
    assert verify.returncode == 0 and ": complete " in verify.stdout, verify.stdout + verify.stderr
