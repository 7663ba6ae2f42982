"""Live faults in the mitmproxy adapter, at the edges of the upstream's framing.

A real `mitmdump -s addon/tap.py` in front of the scripted Upstream, with raw-socket clients:
- an upstream reset while live faults hold bytes back (a partial event, events a tool-args
  cut may fall in): the bytes are lost, so the answer is recorded as injected and the loss logged;
- an upstream that answers with Content-Length: a fault that changes the body's length drops the
  header, and the client gets exactly the faulted body, close-delimited;
- a fault that can never apply live is refused when mitmproxy starts (not when it replays).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from replay_streams import openai_chat_frames, write_recording
from upstream import MITMDUMP, Mitmdump, Script, Upstream

from streamtap.recording import read_recording

pytestmark = pytest.mark.slow

EVENTS = [b'data: {"i": %d}\n\n' % i for i in range(8)]
BODY = b"".join(EVENTS)


PARTIAL = b'data: {"i": 8, "unfinish'


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with Upstream() as upstream:
        upstream.add("reset", Script(BODY + PARTIAL, chunks=[*EVENTS, PARTIAL], cut_at=len(BODY + PARTIAL), cut_style="reset"))
        upstream.add("ok", Script(BODY, chunks=[BODY[:5], BODY[5:30], BODY[30:]]))
        upstream.add("cl", Script(BODY, framing="length", gap=0.002))
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("work"), options={"streamtap_fault_header": "true"}) as mitm:
            yield mitm


def _get(mitm: Mitmdump, path: str, fault: str, close: bool = True):
    """A raw HTTP/1.1 request, read until the proxy closes (or sent the content-length's bytes):
    (head, body bytes as sent, the Tap's recording)."""
    before = set(mitm.record_dir.glob("*.jsonl")) if mitm.record_dir.is_dir() else set()
    request = f"POST {path} HTTP/1.1\r\nhost: x\r\nx-streamtap-fault: {fault}\r\ncontent-length: 2\r\n"
    with socket.create_connection(("127.0.0.1", mitm.port), timeout=10) as sock:
        sock.sendall(f"{request}{'connection: close' if close else 'x: y'}\r\n\r\n{{}}".encode())
        data = b""
        while not _whole(data) and (chunk := _recv(sock)):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.lower(), body, _recording(mitm, before)


def _whole(data: bytes) -> bool:
    head, found, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length: *(\d+)", head)
    return bool(found and match and len(body) >= int(match.group(1)))


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _recording(mitm: Mitmdump, before: set[Path], timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        paths = [p for p in mitm.record_dir.glob("*.jsonl") if p not in before and not p.name.endswith(".partial.jsonl")]
        if paths:
            [path] = paths
            return read_recording(path)
        time.sleep(0.05)
    raise AssertionError(f"no recording:\n{mitm.log()[-3000:]}")


@pytest.mark.parametrize("fault", ["cut:event=50", "reorder:event=40"])
def test_bytes_held_back_at_an_upstream_reset_make_the_answer_streamtaps(proxy, fault):
    _head, body, rec = _get(proxy, "/s/reset/x", fault)
    assert PARTIAL not in body, "mitmproxy calls no stream callable after the upstream's error"
    assert rec.body == BODY, "the Tap records what the client got"
    # the upstream sent the partial event; streamtap's faults kept it: not the upstream's answer
    assert rec.end["injected_fault"] == fault and rec.verdict["evidence"]["injected_fault"] == fault
    assert f"held back {len(PARTIAL)} bytes" in proxy.wait_log("held back", count=1)


def test_a_never_applied_fault_on_a_clean_end_is_not_named(proxy):
    _head, body, rec = _get(proxy, "/s/ok/x", "cut:event=50")
    assert body.endswith(b"\r\n0\r\n\r\n"), "everything held back is forwarded at the clean end"
    assert rec.body == BODY and "injected_fault" not in rec.end


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("duplicate:event=1", b"".join([EVENTS[0], EVENTS[1], *EVENTS[1:]])),
        ("drop:event=1", b"".join([EVENTS[0], *EVENTS[2:]])),
        ("cut:event=2,style=clean", b"".join(EVENTS[:3])),
        ("corrupt:frame=1", None),  # keeps the length: the upstream's content-length stays
    ],
)
def test_a_length_changing_fault_drops_the_upstreams_content_length(proxy, fault, expected):
    head, body, rec = _get(proxy, "/s/cl/x", fault, close=False)  # kept alive: only the framing ends the body
    if expected is None:
        assert f"content-length: {len(BODY)}".encode() in head and len(body) == len(BODY)
        return
    assert b"content-length" not in head and b"chunked" not in head, head
    assert body == expected, "close-delimited: exactly the faulted body, then FIN"
    assert rec.body == expected and rec.end["stream_end"] == "finished"


@pytest.mark.parametrize("fault", ["error:kind=openai", "corrupt:byte=0x22", "cut:at=prelude"])
def test_a_fault_that_never_applies_live_is_refused_at_start(tmp_path, fault):
    work = tmp_path / "work"
    work.mkdir()
    args = [str(MITMDUMP), "--listen-host", "127.0.0.1", "--listen-port", "0", "-s", str(Path(__file__).parents[1] / "addon" / "tap.py"),
            "--set", f"confdir={work}", "--set", f"streamtap_dir={work / 'rec'}", "--set", f"streamtap_fault={fault}"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=work)
    assert done.returncode != 0
    assert "streamtap_fault:" in done.stdout + done.stderr and "on live traffic" in done.stdout + done.stderr


def test_the_same_fault_on_replays_takes_replays_middle_event(tmp_path):
    recordings = tmp_path / "replay"
    recordings.mkdir()
    write_recording(recordings / "openai.jsonl", "openai", openai_chat_frames(words=12))
    options = {"streamtap_replay": str(recordings), "streamtap_fault": "error:kind=openai"}
    with Mitmdump("http://127.0.0.1:9", tmp_path / "work", options=options) as mitm:
        assert mitm.process.poll() is None
