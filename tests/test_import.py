"""`streamtap import`: real captures from a real `mitmdump -w` become recordings.

A loopback fake provider serves an OpenAI SSE stream, a Bedrock InvokeModel event-stream
(a real capture from ../shared) and an SSE stream cut mid-event; curl fetches them through
mitmdump, which writes the capture. The imported recordings must rebuild the bodies byte
for byte and carry the right verdicts.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from interception import REPO, Mitmdump, Provider, Route, invoke_body, openai_chat_stream
from streamtap.recording import check_recording, read_recording

STREAMTAP = REPO / ".venv" / "bin" / "streamtap"
SECRET = "sk-import-secret-7f3a"
CHAT = openai_chat_stream(["Imported ", "from ", "a ", "capture", "."])
CUT = openai_chat_stream(["This ", "answer ", "never ", "ends"])[:-60]
LIMITED = b'{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}'
INVOKE_PATH = "/model/anthropic.claude-3-haiku-20240307-v1:0/invoke-with-response-stream"


@pytest.fixture(scope="module")
def provider():
    invoke = invoke_body()
    routes = {
        "/v1/chat/completions": Route(CHAT),
        "/cut/v1/chat/completions": Route(CUT),
        INVOKE_PATH: Route(invoke, content_type="application/vnd.amazon.eventstream", chunk_size=211),
        "/v1/models": Route(b'{"data": []}', content_type="application/json"),
        "/v1/messages": Route(LIMITED, content_type="application/json", status=429),
    }
    with Provider(routes) as server:
        yield server


def fetch(proxy: Mitmdump, provider: Provider, path: str, body: str) -> bytes:
    if not shutil.which("curl"):
        pytest.skip("curl is not installed (scripts/system-deps.sh installs it as root)")
    result = subprocess.run(
        ["curl", "-sS", "--no-buffer", "--proxy", f"http://127.0.0.1:{proxy.port}",
         f"http://127.0.0.1:{provider.port}{path}", "-H", f"authorization: Bearer {SECRET}",
         "-H", "content-type: application/json", "-d", body],
        capture_output=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def capture(tmp: Path, provider: Provider, *options: str, tap: bool = False) -> tuple[Path, dict[str, bytes]]:
    """Run the four requests through `mitmdump -w FILE OPTIONS`; returns the file and what curl got."""
    path = tmp / "capture.mitm"
    extra = ["--set", f"streamtap_dir={tmp / 'live'}"] if tap else []
    proxy = Mitmdump("--listen-host", "127.0.0.1", "--listen-port", "0", "-w", str(path), *options, *extra,
                     confdir=tmp / "conf", tap=tap)
    try:
        got = {
            "chat": fetch(proxy, provider, "/v1/chat/completions", '{"model":"gpt-4o","stream":true,"messages":[]}'),
            "cut": fetch(proxy, provider, "/cut/v1/chat/completions", '{"model":"gpt-4o","stream":true,"messages":[]}'),
            "invoke": fetch(proxy, provider, INVOKE_PATH, '{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,"messages":[]}'),
            "models": fetch(proxy, provider, "/v1/models", "{}"),
            "limited": fetch(proxy, provider, "/v1/messages", '{"model":"claude-x","max_tokens":9,"stream":true,"messages":[]}'),
        }
    finally:
        proxy.stop()  # flushes the capture file
    return path, got


def streamtap_import(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), "import", *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def by_path(recordings: list) -> dict[str, object]:
    return {r.header["request"]["url"].split("127.0.0.1")[1].split("/", 1)[1]: r for r in recordings}


@pytest.fixture(scope="module")
def plain_capture(tmp_path_factory, provider):
    tmp = tmp_path_factory.mktemp("plain")
    return capture(tmp, provider), tmp


def test_a_plain_mitmdump_capture_imports_byte_exact_with_verdicts(plain_capture, provider):
    (path, got), tmp = plain_capture
    out = tmp / "imported"
    result = streamtap_import(str(path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    files = sorted(out.glob("*.jsonl"))
    assert len(files) == 4, result.stdout  # the JSON /v1/models flow is not a stream
    for file in files:
        assert str(file) in result.stdout  # each written file is printed
        assert SECRET not in file.read_text()
        assert oct(file.stat().st_mode & 0o777) == "0o600"
    recordings = by_path([read_recording(f) for f in files])
    sent = {s.path: s.sent for s in provider.served}
    chat, cut, invoke = recordings["v1/chat/completions"], recordings["cut/v1/chat/completions"], recordings[INVOKE_PATH[1:]]
    assert chat.body == got["chat"] == sent["/v1/chat/completions"] == CHAT
    assert cut.body == got["cut"] == CUT
    assert invoke.body == got["invoke"] == sent[INVOKE_PATH]
    assert chat.verdict["kind"] == "complete" and invoke.verdict["kind"] == "complete"
    assert cut.verdict["kind"] == "truncated", cut.verdict
    assert invoke.header["dialect"] == "bedrock-invoke"
    limited = recordings["v1/messages"]  # a streaming call answered with an HTTP error
    assert limited.body == got["limited"] == LIMITED and limited.header["response"]["status"] == 429
    assert limited.verdict["kind"] == "errored", limited.verdict
    for recording in (chat, cut, invoke):
        assert recording.complete_file and not check_recording(recording), check_recording(recording)
        assert recording.header["imported_from"] == str(path)
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert " truncated (" in lines[str(cut.path)] and " complete " in lines[str(invoke.path)]
    assert "_truncated_" in cut.path.name and "_bedrock-invoke_" in invoke.path.name
    verify = subprocess.run([str(STREAMTAP), "verify", str(chat.path), str(invoke.path)], capture_output=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_importing_again_skips_what_is_there(plain_capture):
    (path, _), tmp = plain_capture
    out = tmp / "again"
    first = streamtap_import(str(path), "--out", str(out), "-q")
    second = streamtap_import(str(path), "--out", str(out), "-q")
    assert first.returncode == second.returncode == 0
    assert second.stdout.count("already imported") == 4
    assert len(list(out.glob("*.jsonl"))) == 4


def test_an_output_that_fails_is_said_of_the_output_not_of_the_out_folder(plain_capture):
    """stdout closed early (| head) is 141, as for every verb; stdout on a full disk is exit 2
    with the error; neither blames --out. What was imported stays: again, the rest is imported."""
    (path, _), tmp = plain_capture
    out = tmp / "piped"
    piped = subprocess.run(f"{STREAMTAP} import {path} --out {out} | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}",
                           shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60, cwd=REPO)
    assert piped.stdout.strip() == "141", piped.stdout + piped.stderr
    assert str(out) not in piped.stderr, piped.stderr
    full = subprocess.run([str(STREAMTAP), "import", str(path), "--out", str(tmp / "full")], stdout=open("/dev/full", "w"),
                          stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO)
    assert full.returncode == 2 and "No space left on device" in full.stderr and str(tmp / "full") not in full.stderr, full.stderr
    again = streamtap_import(str(path), "--out", str(out), "-q")
    assert again.returncode == 0 and len(list(out.glob("*.jsonl"))) == 4, again.stderr


def test_filter_chooses_flows(plain_capture):
    (path, _), tmp = plain_capture
    out = tmp / "filtered"
    result = streamtap_import(str(path), "--out", str(out), "--filter", "~u invoke-with-response-stream", "-q")
    assert result.returncode == 0, result.stderr
    assert len(list(out.glob("*.jsonl"))) == 1


def test_the_recommended_capture_with_the_tap_matches_the_live_recordings(tmp_path, provider):
    """`mitmdump -w FILE -s addon/tap.py --set store_streamed_bodies=true`, as --help says:
    the imported recordings hold the same frames as the ones the Tap wrote live."""
    path, got = capture(tmp_path, provider, "--set", "store_streamed_bodies=true", tap=True)
    result = streamtap_import(str(path), "--out", str(tmp_path / "imported"))
    assert result.returncode == 0, result.stderr
    imported = by_path([read_recording(f) for f in (tmp_path / "imported").glob("*.jsonl")])
    live = by_path([read_recording(f) for f in (tmp_path / "live").glob("*.jsonl")])
    assert set(imported) == set(live) == {"v1/chat/completions", "cut/v1/chat/completions", INVOKE_PATH[1:], "v1/messages"}
    for key, recording in imported.items():
        assert recording.body == live[key].body
        assert [(f.offset, f.sum) for f in recording.frames] == [(f.offset, f.sum) for f in live[key].frames]
        assert recording.verdict["kind"] == live[key].verdict["kind"]
        assert all(f.t_ms is None for f in recording.frames)  # a capture has no arrival times


def test_importing_into_the_live_folder_skips_what_the_tap_recorded_compressed(tmp_path, provider):
    """The tap's recordings may be .jsonl.zst (streamtap_compress=zstd): importing the capture
    into that folder finds each flow there, as it does plain ones, rather than recording it twice."""
    path, _ = capture(tmp_path, provider, "--set", "store_streamed_bodies=true", "--set", "streamtap_compress=zstd", tap=True)
    live = tmp_path / "live"
    before = sorted(p.name for p in live.iterdir())
    assert len(before) == 4 and all(name.endswith(".jsonl.zst") for name in before), before
    result = streamtap_import(str(path), "--out", str(live))
    assert result.returncode == 0, result.stderr
    assert "0 recorded, 4 already there" in result.stderr, result.stderr
    assert sorted(p.name for p in live.iterdir()) == before


def test_a_streamed_capture_without_bodies_is_reported_not_guessed(tmp_path, provider):
    path, _ = capture(tmp_path, provider, tap=True)
    result = streamtap_import(str(path), "--out", str(tmp_path / "imported"))
    assert result.returncode == 1
    assert result.stdout.count("store_streamed_bodies=true") == 4
    assert not list((tmp_path / "imported").glob("*.jsonl"))


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        (b"data: {}\n\n", "is not a mitmproxy capture"),
        (b"\x00\x01\x02garbage", "is not a mitmproxy capture"),
    ],
    ids=["missing", "sse-text", "binary"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, expected):
    path = tmp_path / "capture.mitm"
    if content is not None:
        path.write_bytes(content)
    result = streamtap_import(str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_bad_filter_and_empty_capture(tmp_path):
    empty = tmp_path / "empty.mitm"
    empty.write_bytes(b"")
    result = streamtap_import(str(empty), "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "no streamed LLM answers" in result.stderr
    result = streamtap_import(str(empty), "--filter", "~q ~~ (")
    assert result.returncode == 2 and "--filter" in result.stderr and "Traceback" not in result.stderr


def test_help_explains_streamed_bodies():
    result = streamtap_import("--help")
    assert result.returncode == 0
    assert "store_streamed_bodies=true" in result.stdout and "mitmdump -w" in result.stdout


def test_a_sentinel_import_is_judged_the_same_by_verify(plain_capture):
    """Imported with --sentinel: the header keeps the sentinel, as the Tap's does, so verify
    judges the recording with it again instead of reporting a verdict it cannot reproduce."""
    (path, _), tmp = plain_capture
    out = tmp / "sentinel"
    result = streamtap_import(str(path), "--out", str(out), "--sentinel", "THE END", "-q", "--filter", "~u chat/completions")
    assert result.returncode == 0, result.stderr
    files = sorted(out.glob("*.jsonl"))
    assert len(files) == 2
    for file in files:
        recording = read_recording(file)
        assert recording.header["sentinel"] == "THE END"
        assert recording.verdict["kind"] == "truncated", recording.verdict
    verify = subprocess.run([str(STREAMTAP), "verify", *map(str, files)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "judging its bytes again" not in verify.stdout, verify.stdout
    assert verify.stdout.count(": truncated (") == 2, verify.stdout


def test_a_header_byte_that_is_not_utf8_is_kept_escaped_live_and_imported(tmp_path, provider):
    """HTTP lets a header carry bytes that are not UTF-8 (obs-text); mitmproxy keeps them as
    surrogate escapes, which JSON cannot hold: the recording writes them as \\xNN, live and imported."""
    path = tmp_path / "capture.mitm"
    proxy = Mitmdump("--listen-host", "127.0.0.1", "--listen-port", "0", "-w", str(path), "--set", "store_streamed_bodies=true",
                     "--set", f"streamtap_dir={tmp_path / 'live'}", confdir=tmp_path / "conf", tap=True)
    try:
        result = subprocess.run(
            ["curl", "-sS", "--no-buffer", "--proxy", f"http://127.0.0.1:{proxy.port}", f"http://127.0.0.1:{provider.port}/v1/chat/completions",
             b"-H", b"x-client-note: caf\xe9", "-H", "content-type: application/json", "-d", '{"model":"gpt-4o","stream":true,"messages":[]}'],
            capture_output=True, timeout=30,
        )
        assert result.returncode == 0 and result.stdout == CHAT, result.stderr
    finally:
        proxy.stop()
    imported = streamtap_import(str(path), "--out", str(tmp_path / "imported"))
    assert imported.returncode == 0 and "Traceback" not in imported.stderr, imported.stderr
    for folder in ("live", "imported"):
        [recording] = [read_recording(f) for f in (tmp_path / folder).glob("*.jsonl")]
        assert recording.verdict["kind"] == "complete" and recording.body == CHAT and not check_recording(recording)
        assert ["x-client-note", "caf\\xe9"] in recording.header["request"]["headers"], (folder, recording.header["request"]["headers"])


def test_a_capture_given_to_verify_or_show_is_refused_with_the_verb_that_reads_it(plain_capture):
    """The capture's framing around its bodies' data lines made a truncated or corrupt verdict,
    exit 1, which a script takes for a finding about the answer."""
    (path, _), _ = plain_capture
    for verb in ("verify", "show"):
        got = subprocess.run([str(STREAMTAP), verb, str(path)], capture_output=True, text=True, timeout=60)
        assert got.returncode == 2 and "a mitmproxy capture" in got.stderr and "streamtap import" in got.stderr, got
        assert not got.stdout.strip() and "Traceback" not in got.stderr, got
