"""Each fault kind through the replay server, as a raw-socket client receives it: the bytes
on the wire are what the spec says (expected bodies built from the frame lists), the
timing faults take the time they say, and the verdict layer judges what arrived."""

from __future__ import annotations

import json
import socket
import time

import pytest
from replay_streams import (
    ANTHROPIC_REQUEST,
    BEDROCK_MODEL,
    BEDROCK_REQUEST,
    OPENAI_REQUEST,
    anthropic_frames,
    bedrock_invoke_frames,
    openai_chat_frames,
    dechunk,
    write_recording,
    write_recordings,
)

from streamtap.providers import analyze_bytes
from streamtap.providers.turn import Dialect, VerdictKind
from streamtap.replay.faults import Timing, parse_faults
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread

OPENAI, ANTHROPIC, BEDROCK = openai_chat_frames(), anthropic_frames(), bedrock_invoke_frames()
OTHER = [f.replace(b"chatcmpl-T1", b"chatcmpl-T2").replace(b"weather", b"forecast") for f in OPENAI]
REQUESTS = {
    "openai": ("/v1/chat/completions", OPENAI_REQUEST, Dialect.OPENAI_CHAT),
    "anthropic": ("/v1/messages", ANTHROPIC_REQUEST, Dialect.ANTHROPIC),
    "bedrock": (f"/model/{BEDROCK_MODEL}/invoke-with-response-stream", BEDROCK_REQUEST, Dialect.BEDROCK_INVOKE),
}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    d = write_recordings(tmp_path_factory.mktemp("wire"))
    write_recording(d / "other.jsonl", "openai", OTHER, request=OPENAI_REQUEST | {"model": "another"})
    return Library.load([d])


def receive(library, kind: str, spec: str | None) -> tuple[bytes, bool, float]:
    """(the dechunked body, whether it was terminated, seconds from request to end)."""
    path, request, _dialect = REQUESTS[kind]
    body = json.dumps(request).encode()
    with ServerThread(library, ServeOptions(Timing.parse("fast"), parse_faults(spec))) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        start = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
            data = b""
            while not data.endswith(b"\r\n0\r\n\r\n"):
                piece = sock.recv(65536)
                if not piece:
                    break
                data += piece
        elapsed = time.monotonic() - start
    head = data.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    chunks, terminated = dechunk(data)
    return b"".join(chunks), terminated, elapsed


def verdict(kind: str, body: bytes) -> VerdictKind:
    return analyze_bytes(body, REQUESTS[kind][2]).verdict.kind


@pytest.mark.parametrize(
    "kind, spec, expected, judged",
    [
        ("openai", "duplicate:event=10", OPENAI[:11] + [OPENAI[10]] + OPENAI[11:], None),
        ("openai", "drop:event=10", OPENAI[:10] + OPENAI[11:], None),
        ("openai", f"drop:event={len(OPENAI) - 1}", OPENAI[:-1], VerdictKind.TRUNCATED),
        ("anthropic", "reorder:event=30", ANTHROPIC[:30] + [ANTHROPIC[31], ANTHROPIC[30]] + ANTHROPIC[32:], "not complete"),
        ("anthropic", "drop:event=0", ANTHROPIC[1:], "not complete"),
        ("openai", "swap-tail:with=other.jsonl,at=25", OPENAI[:26] + OTHER[26:], "not complete"),
        ("openai", "fragment:max=5", OPENAI, VerdictKind.COMPLETE),
        ("bedrock", "cut:at=before-terminal,style=clean", BEDROCK[:-1], VerdictKind.TRUNCATED),
    ],
)
def test_event_faults_on_the_wire(library, kind, spec, expected, judged):
    body, terminated, _ = receive(library, kind, spec)
    assert terminated
    assert body == b"".join(expected)
    if judged == "not complete":
        assert verdict(kind, body) is not VerdictKind.COMPLETE
    elif judged is not None:
        assert verdict(kind, body) is judged


def test_corrupt_crc_byte_on_the_wire(library):
    body, terminated, _ = receive(library, "bedrock", "corrupt:frame=5,field=crc,byte=0x22")
    original = b"".join(BEDROCK)
    at = sum(map(len, BEDROCK[:6])) - 4
    assert terminated and body[at] == 0x22 and body[:at] == original[:at] and body[at + 1 :] == original[at + 1 :]
    assert verdict("bedrock", body) is VerdictKind.CORRUPT


def test_corrupt_length_byte_is_caught_by_the_prelude_crc(library):
    body, _, _ = receive(library, "bedrock", "corrupt:frame=2,field=length")
    at = sum(map(len, BEDROCK[:2])) + 3
    assert body[at] == b"".join(BEDROCK)[at] ^ 0xFF
    assert verdict("bedrock", body) is VerdictKind.CORRUPT


def test_injected_errors_on_the_wire(library):
    body, _, _ = receive(library, "anthropic", "error:kind=api_error,after=8")
    assert body == b"".join(ANTHROPIC[:9]) + b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"Injected by streamtap"}}\n\n'
    assert verdict("anthropic", body) is VerdictKind.ERRORED
    body, _, _ = receive(library, "bedrock", "error:kind=throttlingException,after=2")
    assert body.startswith(b"".join(BEDROCK[:3])) and b"throttlingException" in body[len(b"".join(BEDROCK[:3])) :]
    assert verdict("bedrock", body) is VerdictKind.ERRORED


@pytest.mark.parametrize(
    "spec, low, high",
    [
        ("latency:ms=300,jitter=20", 0.28, 1.5),
        ("bandwidth:bps=40000", 0.9 * len(b"".join(ANTHROPIC)) * 8 / 40000, 3 + len(b"".join(ANTHROPIC)) * 8 / 40000),
        ("stall:after=3,secs=0.5", 0.5, 2.0),
    ],
)
def test_timing_faults_take_the_time_they_say_and_keep_the_bytes(library, spec, low, high):
    body, terminated, elapsed = receive(library, "anthropic", spec)
    assert terminated and body == b"".join(ANTHROPIC)
    assert low <= elapsed <= high, elapsed
    assert verdict("anthropic", body) is VerdictKind.COMPLETE
