"""Edges of `verify`, `show` and `import` at the command line: a bad value is one line and exit 2,
a capture cut short keeps what was read and says so, a `.partial.jsonl` is never vouched for.
Real processes, the installed console script; the captures are written by mitmproxy's own writer."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interception import REPO, openai_chat_stream

STREAMTAP = Path(sys.executable).with_name("streamtap")
RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "anthropic.jsonl"
# a strict terminal: a name printed as Python keeps it (lone surrogates) would fail there
STRICT = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}


def streamtap(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def one_line_error(result: subprocess.CompletedProcess, verb: str, says: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith(f"streamtap {verb}: ") and says in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def write_capture(path: Path, answers: int) -> list[int]:
    """A capture of ``answers`` streamed OpenAI chat answers; the byte where each flow ends."""
    from mitmproxy import io
    from mitmproxy.test import tflow

    ends = []
    with path.open("wb") as file:
        for n in range(answers):
            flow = tflow.tflow(resp=True)
            flow.request.host, flow.request.path = "api.openai.com", "/v1/chat/completions"
            flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
            flow.response.headers["content-type"] = "text/event-stream"
            flow.response.content = openai_chat_stream(["answer", f" {n}"])
            io.FlowWriter(file).add(flow)
            ends.append(file.tell())
    return ends


@pytest.mark.parametrize("verb", ["verify", "show", "import"])
@pytest.mark.parametrize(
    "sentinel, says", [("   ", "--sentinel: only whitespace"), ("END\nMORE", "--sentinel: 'END\\nMORE' spans lines"),
                       ("", "--sentinel: empty"),
                       ("\udcff\udcfe", "--sentinel: '\\xff\\xfe' is not UTF-8 text")],  # (bytes \xff\xfe on the command line)
    ids=["blank", "two-lines", "empty", "not-utf8"],
)
def test_a_sentinel_no_answer_could_end_with_is_refused(tmp_path, verb, sentinel, says):
    source = RECORDING
    if verb == "import":
        source = tmp_path / "capture.mitm"
        write_capture(source, 1)
    result = streamtap(verb, "--sentinel", sentinel, source, cwd=tmp_path)
    one_line_error(result, verb, says)
    assert result.stdout == "" and not (tmp_path / "recordings").exists()


def test_a_capture_cut_short_keeps_the_flows_before_the_cut_and_exits_1(tmp_path):
    whole = tmp_path / "whole.mitm"
    ends = write_capture(whole, 3)
    cut = tmp_path / "cut.mitm"
    cut.write_bytes(whole.read_bytes()[: ends[1] + 200])  # inside the third flow
    result = streamtap("import", cut, "--out", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "the capture is cut short after 2 flows" in result.stderr and "Traceback" not in result.stderr
    assert len(list((tmp_path / "out").glob("*_complete_*.jsonl"))) == 2
    assert "2 recorded" in result.stderr

    first = tmp_path / "first.mitm"
    data = whole.read_bytes()
    length_end = data.index(b":")
    for keep in (500, length_end, length_end + 1, length_end + 2):  # also right after the first length's colon
        first.write_bytes(data[:keep])
        result = streamtap("import", first, "--out", tmp_path / "none")
        assert result.returncode == 1 and "cut short inside its first flow" in result.stderr, (keep, result.stderr)
        assert not (tmp_path / "none").exists()


def test_a_capture_damaged_after_its_first_flow_keeps_that_flow(tmp_path):
    path = tmp_path / "damaged.mitm"
    ends = write_capture(path, 2)
    data = bytearray(path.read_bytes())
    data[ends[0] + 30 : ends[0] + 60] = b"!" * 30  # the same length: not cut, damaged
    path.write_bytes(data)
    result = streamtap("import", path, "--out", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "the capture is damaged after 1 flow (those are imported)" in result.stderr
    assert len(list((tmp_path / "out").glob("*.jsonl"))) == 1


@pytest.mark.parametrize("key, error", [(b"tls_version", "KeyError"), (b"6:backup;", "AssertionError")])
def test_a_capture_with_a_key_name_damaged_inside_a_whole_record_keeps_the_flows_before(tmp_path, key, error):
    """The record still frames (its lengths hold), and mitmproxy's loading of it fails: a key
    missing is a KeyError, a key it does not know fails Flow.set_state's assert. Each was a
    traceback and exit 3."""
    path = tmp_path / "damaged.mitm"
    ends = write_capture(path, 3)
    data = bytearray(path.read_bytes())
    at = data.rfind(key, ends[1])  # in the third flow
    assert at > ends[1], f"mitmproxy writes {key!r} in each flow"
    data[at + key.index(key.strip(b"0123456789:;")[:1])] ^= 1  # 'tls_version' -> 'uls_version', 'backup' -> 'cackup'
    path.write_bytes(data)
    result = streamtap("import", path, "--out", tmp_path / "out")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "the capture is damaged after 2 flows (those are imported): a record mitmproxy cannot load as a flow at byte " \
        f"{ends[1]} ({error})" in result.stderr, result.stderr
    assert len(list((tmp_path / "out").glob("*.jsonl"))) == 2


def test_a_capture_damaged_inside_its_first_flow_is_a_damaged_capture_not_another_file(tmp_path):
    path = tmp_path / "damaged.mitm"
    write_capture(path, 2)
    data = bytearray(path.read_bytes())
    data[60:90] = b"!" * 30  # the same length: not cut, damaged
    path.write_bytes(data)
    result = streamtap("import", path, "--out", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "the capture is damaged inside its first flow" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_damaged_captures_own_text_never_reaches_the_terminal(tmp_path):
    """mitmproxy's error quotes the whole damaged record: its API keys and bodies (megabytes on one
    line), an ESC that would act on the terminal, a newline that would forge a line of import's
    own. The line names the record's place and the error's kind instead."""
    from mitmproxy import io
    from mitmproxy.io import tnetstring

    path = tmp_path / "damaged.mitm"
    write_capture(path, 1)
    with path.open("rb") as file:
        state = next(io.FlowReader(file).stream()).get_state()
    state["type"] = "http\x1b]0;OWNED\x07\x1b[2J\nstreamtap import: 0 flows lost"
    state["request"]["headers"] = [(b"authorization", b"Bearer sk-proj-SECRET0123456789"), (b"x-pad", b"p" * 200_000)]
    with path.open("ab") as file:
        tnetstring.dump(state, file)
    result = streamtap("import", path, "--out", tmp_path / "out")
    assert result.returncode == 1 and "the capture is damaged after 1 flow" in result.stderr, result.stderr
    assert not set("\x1b\x07") & set(result.stderr), repr(result.stderr)
    assert "OWNED" not in result.stderr and "SECRET" not in result.stderr and len(result.stderr) < 1000, result.stderr[:1500]
    assert "streamtap import: 0 flows lost" not in result.stderr.splitlines(), result.stderr


def test_a_recording_import_could_not_write_is_said_escaped_on_one_line(tmp_path, monkeypatch, capsys):
    import streamtap.recording.importer as importer
    from streamtap.cli import main
    from streamtap.recording.writer import RecordingError

    def failing(*args, **kwargs):
        raise RecordingError("x\x1b[2J\nstreamtap import: all imported")
        yield

    capture = tmp_path / "capture.mitm"
    write_capture(capture, 1)
    monkeypatch.setattr(importer, "import_capture", failing)
    assert main(["import", str(capture), "--out", str(tmp_path / "out")]) == 1
    said = capsys.readouterr().err
    assert said == "streamtap import: stopped after 0 flows: x\\x1b[2J\\nstreamtap import: all imported\n", repr(said)


@pytest.mark.parametrize("start", [b"", b"\xef\xbb\xbf", b"\n  "], ids=["json", "byte-order-mark", "whitespace"])
def test_a_har_file_is_refused_before_anything_is_written(tmp_path, start):
    """mitmproxy reads a HAR file too, but gives its flows new ids each time: importing it again
    recorded every answer again, where import promises to skip what it recorded."""
    entry = {
        "startedDateTime": "2026-12-01T10:00:00.000Z", "time": 100,
        "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions", "httpVersion": "HTTP/1.1",
                    "headers": [{"name": "content-type", "value": "application/json"}], "queryString": [], "cookies": [],
                    "headersSize": -1, "bodySize": -1,
                    "postData": {"mimeType": "application/json", "text": '{"model":"gpt-test-1","stream":true,"messages":[]}'}},
        "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1", "cookies": [], "redirectURL": "",
                     "headers": [{"name": "content-type", "value": "text/event-stream"}], "headersSize": -1, "bodySize": -1,
                     "content": {"size": -1, "mimeType": "text/event-stream", "text": openai_chat_stream(["hi"]).decode()}},
        "cache": {}, "timings": {"send": 0, "wait": 50, "receive": 50},
    }  # fmt: skip
    har = tmp_path / "capture.har"
    har.write_bytes(start + json.dumps({"log": {"version": "1.2", "creator": {"name": "t", "version": "1"}, "entries": [entry]}}).encode())
    result = streamtap("import", har, "--out", tmp_path / "out")
    one_line_error(result, "import", "is JSON (a HAR file?), not a mitmproxy capture")
    assert "mitmdump -w" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("compressed", [False, True], ids=["jsonl", "zst"])
def test_a_recording_given_to_import_is_named_as_one(tmp_path, compressed):
    """A recording is JSON too: it was refused as "a HAR file?", which sent the user looking for one."""
    import zstandard

    recording = REPO / "recordings" / "openai-chat.jsonl"
    if compressed:  # under a name that does not say so: its first line does
        given = tmp_path / "backup.bin"
        given.write_bytes(zstandard.ZstdCompressor().compress(recording.read_bytes()))
    else:
        given = tmp_path / "answer.jsonl"
        given.write_bytes(recording.read_bytes())
    result = streamtap("import", given, "--out", tmp_path / "out")
    one_line_error(result, "import", "is a streamtap recording, not a mitmproxy capture")
    assert "mitmdump -w" in result.stderr and not (tmp_path / "out").exists()


def test_a_redact_name_that_cannot_be_a_name_is_refused_by_import(tmp_path):
    capture = tmp_path / "capture.mitm"
    write_capture(capture, 1)
    for flag, value, says in [("--redact", "helicone-auth,x-auth", "'helicone-auth,x-auth' is not a header"),
                              ("--redact-allow", "", "an empty name")]:
        result = streamtap("import", capture, "--out", tmp_path / "out", flag, value)
        one_line_error(result, "import", f"{flag}: {says}")
        assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_capture_leaves_no_out_folder(tmp_path):
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "side").mkdir()
    result = streamtap("import", "../garbage.bin", cwd=tmp_path / "side")  # the default --out, under the cwd
    one_line_error(result, "import", "is not a mitmproxy capture")
    assert list((tmp_path / "side").iterdir()) == []


def test_show_refuses_a_negative_width(tmp_path):
    one_line_error(streamtap("show", "--width", "-5", RECORDING), "show", "--width: -5 is negative")
    unwrapped = streamtap("show", "--width", "0", RECORDING)
    assert unwrapped.returncode == 0 and unwrapped.stdout


@pytest.mark.parametrize("verb", ["verify", "show"])
def test_help_lists_each_suffix_once(verb):
    text = " ".join(streamtap(verb, "--help").stdout.split())
    suffixes = re.search(r"files ending in ([^)]*)\)", text)[1].split(", ")
    assert ".jsonl" in suffixes and ".jsonl.zst" in suffixes
    assert len(suffixes) == len(set(suffixes)), suffixes


def test_a_whole_partial_recording_is_not_complete(tmp_path):
    partial = tmp_path / "20260101T000000.000Z_anthropic_0123456789ab.partial.jsonl"
    shutil.copy(RECORDING, partial)
    result = streamtap("verify", partial)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith(f"{partial}: complete (")  # the verdict its end line holds
    assert "never finished" in result.stdout and "renaming it from .partial" in result.stdout
    assert streamtap("verify", RECORDING).returncode == 0  # the same bytes, renamed, are complete
    shown = streamtap("show", partial)
    assert shown.returncode == 0 and "recording never finished" in shown.stdout
    assert "even with its end line" in " ".join(streamtap("verify", "--help").stdout.split())


def test_import_names_that_are_not_utf8_are_escaped_as_verify_does(tmp_path):
    capture = tmp_path / os.fsdecode(b"capture\xff.mitm")
    write_capture(capture, 1)
    out = tmp_path / os.fsdecode(b"out\xff")
    result = streamtap("import", capture, "--out", out, env=STRICT)
    assert result.returncode == 0, result.stderr
    assert "out\\xff/" in result.stdout and "-> " in result.stderr and "out\\xff" in result.stderr
    (recording,) = out.glob("*.jsonl")
    assert '"imported_from":"' in recording.read_text() and "capture\\\\xff.mitm" in recording.read_text()
    missing = streamtap("import", tmp_path / os.fsdecode(b"no\xff.mitm"), env=STRICT)
    one_line_error(missing, "import", "no\\xff.mitm: no such file")


@pytest.mark.parametrize("verb", ["verify", "show", "report", "index", "sweep", "serve", "import"])
def test_a_flag_the_verb_does_not_take_is_the_verbs_error_with_its_usage(verb):
    """argparse alone would answer with the top level's usage, which names none of the verb's options."""
    result = streamtap(verb, "--no-such-flag", "x", *(["--out", "o"] if verb == "index" else []))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"usage: streamtap {verb} "), result.stderr
    assert f"streamtap {verb}: error: unrecognized arguments: --no-such-flag" in result.stderr, result.stderr


def test_a_flag_before_any_verb_is_still_the_top_levels_error():
    result = streamtap("--no-such-flag")
    assert result.returncode == 2 and result.stderr.startswith("usage: streamtap [-h] [--version] VERB"), result.stderr
    assert "streamtap: error: unrecognized arguments: --no-such-flag" in result.stderr
