"""``Content-Encoding: identity`` is no encoding, for the Tap, ``streamtap import`` and the reader
alike; and a flow whose analysis falls behind has that error logged once, not by the proxy and
again by its worker."""

from __future__ import annotations

import gzip
import re
import subprocess

import pytest

import provider_streams as streams
from streamtap.mitm.worker import RING_ENV, STALL_ENV
from streamtap.recording import check_recording
from streamtap.recording.content import content_encoded
from upstream import CHAT, REPO, Mitmdump, Script, Upstream, curl, find_recording

HUNG_ENV = "STREAMTAP_TEST_WORKER_HUNG_AFTER"


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


def verify(path) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / ".venv" / "bin" / "streamtap"), "verify", str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(None, False), ("", False), ("identity", False), (" IDENTITY ", False), ("Identity, identity", False),
     ("gzip", True), ("identity, gzip", True), ("GZIP , br", True), ("x-unknown", True)],
)
def test_one_rule_says_whether_a_content_encoding_changes_the_bytes(value, encoded):
    assert content_encoded(value) is encoded


def test_an_identity_encoded_answer_is_recorded_whole_and_verifies_complete(upstream, tmp_path):
    """The recording of an untouched answer sent with ``Content-Encoding: identity`` (as the Tap
    wrote it before too: the header names identity, no wire copy is kept) verifies complete,
    and its wire bytes are the bytes the client got."""
    body = streams.openai_chat(["an answer", " sent", " as is"])
    upstream.add("identity", Script(body, headers=[("content-encoding", "identity")], chunk_size=16))
    upstream.add("identity-cased", Script(body, headers=[("content-encoding", "Identity")], chunk_size=16))
    stacked = gzip.compress(body)
    upstream.add("identity-gzip", Script(stacked, headers=[("content-encoding", "identity, gzip")], chunk_size=16))
    with Mitmdump(upstream.url, tmp_path / "m") as proxy:
        got = {name: curl(f"{proxy.url}/s/{name}{CHAT}").stdout for name in ("identity", "identity-cased", "identity-gzip")}
        recordings = {name: find_recording(proxy.record_dir, name) for name in got}
    for name in ("identity", "identity-cased"):
        rec = recordings[name]
        assert got[name] == body
        assert rec.content_encoding.lower() == "identity"
        assert b"wire_b64" not in rec.path.read_bytes()  # the body is the wire: no copy kept apart
        assert rec.body == body and rec.wire == body
        assert check_recording(rec) == []
        checked = verify(rec.path)
        assert checked.returncode == 0 and "complete" in checked.stdout, checked.stdout + checked.stderr
    rec = recordings["identity-gzip"]  # identity stacked on a real coding: encoded
    assert got["identity-gzip"] == stacked
    assert rec.body == body and rec.wire == stacked
    assert check_recording(rec) == []
    assert verify(rec.path).returncode == 0


def test_an_imported_identity_encoded_answer_is_taken_as_the_tap_takes_it(upstream, tmp_path):
    """``streamtap import`` applies the same rule: identity keeps no wire copy apart either."""
    body = streams.openai_chat(["imported", " as is"])
    upstream.add("imported", Script(body, headers=[("content-encoding", "identity")]))
    capture = tmp_path / "capture.mitm"
    with Mitmdump(upstream.url, tmp_path / "m", script=None, options={"save_stream_file": str(capture)}) as proxy:
        assert curl(f"{proxy.url}/s/imported{CHAT}").stdout == body
    out = tmp_path / "imported"
    imported = subprocess.run([str(REPO / ".venv" / "bin" / "streamtap"), "import", "--out", str(out), str(capture)],
                              capture_output=True, text=True, timeout=30)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    rec = find_recording(out, "imported")
    assert b"wire_b64" not in rec.path.read_bytes()
    assert rec.body == body and rec.wire == body
    assert check_recording(rec) == []
    assert verify(rec.path).returncode == 0


def test_a_flow_that_falls_behind_has_its_error_logged_once(upstream, tmp_path, monkeypatch):
    """The proxy logs that the flow's analysis fell behind when it stops handing its reads on;
    the worker, told so, records it without logging it a second time."""
    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv(STALL_ENV, str(stall))  # the worker stalls at its first reads while this file exists
    monkeypatch.setenv(HUNG_ENV, "600")  # slow, not hung
    ring = 2 * 1024 * 1024
    monkeypatch.setenv(RING_ENV, str(ring))
    line = b"data: " + b"x" * 16377 + b"\n\n"
    flood = line * (3 * ring // len(line))
    upstream.add("first", Script(streams.openai_chat(["hi"])))
    upstream.add("flood", Script(flood, chunk_size=64 * 1024))
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_filter": "~u /s/"}) as proxy:
        assert curl(f"{proxy.url}/s/first{CHAT}").returncode == 0  # the worker stalls on this one
        out = curl(f"{proxy.url}/s/flood{CHAT}", max_time=20)
        assert out.returncode == 0 and out.stdout == flood
        log = proxy.wait_log("fell behind at byte")
        stall.unlink()
        log = proxy.wait_log("streamtap: openai-chat", count=2, timeout=20)  # both verdicts: the worker has spoken
        rec = find_recording(proxy.record_dir, "flood", timeout=20)
    said = re.findall(r"flow ([0-9a-f]{8}): .*fell behind at byte (\d+)", log)
    assert len(said) == 1, log
    behind = said[0][1]
    assert any(f"analysis fell behind at byte {behind}" in note.get("message", "") for note in rec.notes), rec.notes
    assert any("fell behind" in error for error in rec.end["streamtap_errors"])
    assert check_recording(rec) == []
