"""Faults on resumes and on id'd bodies: a Last-Event-ID resume gets the fault its own
x-streamtap-fault header asks for (the server's --fault spares it), and with --assign-ids a
byte position is checked at start against the body served, id lines included."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
from replay_streams import ANTHROPIC_REQUEST, OPENAI_REQUEST, anthropic_frames, dechunk, openai_chat_frames, write_recording

from streamtap.recording.flows import INJECTED_HEADER
from streamtap.replay.faults import parse_faults
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread

pytest_plugins = ["pytester"]

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]


def exchange(base_url: str, path: str, request: dict, extra: str = "") -> tuple[bytes, bytes, str]:
    """One request on a raw socket: (response head, body dechunked, how it ended)."""
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps(request).encode()
    data, how = b"", "fin"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n".encode() + body
        )
        while piece := sock.recv(65536):
            data += piece
            if data.endswith(b"\r\n0\r\n\r\n"):
                how = "complete"
                break
    chunks, _ = dechunk(data)
    return data.partition(b"\r\n\r\n")[0].lower(), b"".join(chunks), how


def with_ids(frames: list[bytes]) -> list[bytes]:
    return [b"id: %d\n" % i + raw for i, raw in enumerate(frames)]


# --- a resume gets the fault its request asks for -------------------------------------------


def test_a_resume_gets_the_fault_its_own_header_asks_for_and_not_the_servers(tmp_path):
    frames = with_ids(anthropic_frames())
    write_recording(tmp_path / "anthropic.jsonl", "anthropic", anthropic_frames())
    options = ServeOptions(faults=parse_faults("cut:event=3"), assign_ids=True, fault_header=True)
    asked = "cut:event=2,style=abort"
    with ServerThread(Library.load([tmp_path]), options) as server:
        faulted = exchange(server.base_url, "/v1/messages", ANTHROPIC_REQUEST, f"last-event-id: 5\r\nx-streamtap-fault: {asked}\r\n")
        plain = exchange(server.base_url, "/v1/messages", ANTHROPIC_REQUEST, "last-event-id: 5\r\n")
    head, body, how = faulted
    assert how == "fin" and body == b"".join(frames[6:9])  # events 0..2 of the tail, then the abort
    assert f"{INJECTED_HEADER}: {asked}".encode() in head  # the header fault alone: --fault spares resumes
    assert [s.log for s in server.served][0] == [f"{asked}: abort cut at byte {len(body)} (after event 2)"]
    head, body, how = plain
    assert how == "complete" and body == b"".join(frames[6:]) and INJECTED_HEADER.encode() not in head


# --- --assign-ids: byte positions count the id lines -----------------------------------------


def served_and_plain() -> tuple[bytes, int]:
    """The openai body as served with ids, and a byte position past the plain body's end
    but inside the served one."""
    frames = openai_chat_frames(words=6, tool=False)
    plain, served = b"".join(frames), b"".join(with_ids(frames))
    return served, len(plain) + 5


def test_serve_assign_ids_takes_a_byte_position_of_the_served_body_and_cuts_there(tmp_path):
    served, at = served_and_plain()
    write_recording(tmp_path / "openai.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    proc = subprocess.Popen(
        [*STREAMTAP, "serve", str(tmp_path), "--assign-ids", "--fault", f"cut:byte={at},style=abort"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.wait(10) is not None else ""
        _, body, how = exchange(url, "/v1/chat/completions", OPENAI_REQUEST)
    finally:
        proc.terminate()
        proc.wait(10)
    assert how == "fin" and body == served[:at]


PLUGIN_TEST = """
import json
import socket

import pytest


@pytest.mark.streamtap_faults("cut:byte={at},style=abort")
def test_cut_in_the_id_lines(streamtap_replay):
    server = streamtap_replay("openai.jsonl", assign_ids=True)
    body = json.dumps({request!r}).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nhost: x\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(body) + body)
        while sock.recv(65536):
            pass
    assert server.served[0].log == ["cut:byte={at},style=abort: abort cut at byte {at} (byte {at})"]
"""


def test_the_plugin_checks_a_byte_position_against_the_body_with_ids(pytester):
    _, at = served_and_plain()
    write_recording(pytester.path / "openai.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    pytester.makepyfile(test_ids=PLUGIN_TEST.format(at=at, request=OPENAI_REQUEST))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)


def test_mitmdump_replay_with_ids_takes_a_byte_position_of_the_served_body(tmp_path):
    """The proxy's replay checked streamtap_fault on the recordings without their id lines, and
    refused at start a position only the served body has."""
    from upstream import Mitmdump, Upstream

    served, at = served_and_plain()
    recordings = tmp_path / "replay"
    recordings.mkdir()
    write_recording(recordings / "openai.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    options = {"streamtap_replay": str(recordings), "streamtap_replay_assign_ids": "true",
               "streamtap_fault": f"cut:byte={at},style=abort"}
    with Upstream() as upstream, Mitmdump(upstream.url, tmp_path / "m", options=options) as proxy:
        _, body, how = exchange(proxy.url, "/v1/chat/completions", OPENAI_REQUEST)
    assert how == "fin" and body == served[:at]


# --- a resume takes the protocol positions of the whole stream ------------------------------


def test_a_resume_cuts_at_the_turns_position_as_the_whole_stream_places_it(tmp_path):
    """The positions of a resumed body were read off its events alone, by a session that never saw
    the turn begin: a resume asking for cut:at=tool-args got a 400 although its events held the
    whole tool call. Read off the whole stream, each falls where it falls without the resume; one
    before the resume point is refused for that reason."""
    frames = with_ids(anthropic_frames())
    tool_args = next(i for i, raw in enumerate(frames) if b'"partial_json":"{' in raw)
    write_recording(tmp_path / "anthropic.jsonl", "anthropic", anthropic_frames())
    options = ServeOptions(assign_ids=True, fault_header=True)
    resume_after = 10
    skipped = len(b"".join(frames[: resume_after + 1]))
    with ServerThread(Library.load([tmp_path]), options) as server, httpx.Client(timeout=10) as client:
        post = lambda headers: client.post(server.base_url + "/v1/messages", json=ANTHROPIC_REQUEST, headers=headers)  # noqa: E731
        for at in ("tool-args", "before-terminal"):
            whole = post({"x-streamtap-fault": f"cut:at={at}"})
            resumed = post({"last-event-id": str(resume_after), "x-streamtap-fault": f"cut:at={at}"})
            assert resumed.status_code == 200, resumed.text
            assert len(whole.content) > skipped and resumed.content == whole.content[skipped:]  # the same cut, in the resumed body
        past = post({"last-event-id": str(tool_args), "x-streamtap-fault": "cut:at=tool-args"})
    assert past.status_code == 400
    assert f"lies before the resume point, after event {tool_args}" in past.text, past.text


def test_a_fault_header_is_read_as_utf8_as_the_live_addon_reads_it(tmp_path):
    """curl -H sends the header's text as UTF-8: the replay server read it as Latin-1, so one spec
    injected another message than the live addon and recorded another spec than it was given."""
    write_recording(tmp_path / "openai.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    spec = "error:kind=openai,after=1,message=héllo ✓"
    with ServerThread(Library.load([tmp_path]), ServeOptions(fault_header=True)) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        body = json.dumps(OPENAI_REQUEST).encode()
        data = b""
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"x-streamtap-fault: " + spec.encode() + b"\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            while piece := sock.recv(65536):
                data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"x-streamtap-injected-fault: error:kind=openai,after=1,message=h%C3%A9llo %E2%9C%93" in head.split(b"\r\n"), head
    assert json.dumps("héllo ✓").encode() in rest, rest
