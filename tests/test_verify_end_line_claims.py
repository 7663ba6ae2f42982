"""`streamtap verify` holds a recording's end line to its bytes: report and index take the verdict,
the model and the usage from that line, which no hash covers. A forged line must be a finding
(exit 1), whatever flag it carries, and the recordings the proxy really writes must stay clean."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamtap.providers import Dialect, StreamSession
from streamtap.recording import RecordingWriter
from test_cli_show_verify import _chat_with_arguments

REAL_RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "openai-chat.jsonl"
STREAMTAP = Path(sys.executable).with_name("streamtap")


def streamtap(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=60)


def edit_end(path: Path, change) -> Path:
    """``path`` with its end line changed by ``change(end)`` (the hashes cover the bytes, not the end line)."""
    lines = path.read_bytes().split(b"\n")[:-1]
    end = orjson.loads(lines[-1])
    change(end)
    edited = path.with_name("edited_" + path.name)
    edited.write_bytes(b"\n".join([*lines[:-1], json.dumps(end, separators=(",", ":")).encode()]) + b"\n")
    return edited


def not_kept(end: dict) -> None:
    end["verdict"]["evidence"]["arguments_not_kept"] = True


def forged_turn(end: dict) -> None:
    end["turn"]["model"] = "gpt-5-FAKE"
    end["turn"]["usage"]["output"] = 999999


@pytest.fixture
def recording(tmp_path) -> Path:
    copy = tmp_path / REAL_RECORDING.name
    shutil.copyfile(REAL_RECORDING, copy)
    assert streamtap("verify", copy).returncode == 0
    return copy


@pytest.mark.parametrize("change, says", [
    (lambda end: (end["verdict"].update(kind="errored"), not_kept(end)), "the recording says errored, judging its bytes again says complete"),
    (lambda end: (forged_turn(end), not_kept(end)), 'the recording\'s turn has model "gpt-5-FAKE", its bytes give "gpt-4.1-nano"'),
    (lambda end: (end.pop("verdict"), forged_turn(end)), "the end line holds no verdict"),
    (lambda end: end.pop("verdict"), "the end line holds no verdict"),
    (lambda end: end.pop("turn"), "the end line holds no turn, its bytes give one"),
    (lambda end: (end.pop("turn"), not_kept(end)), "the end line holds no turn, its bytes give one"),
], ids=["kind-with-flag", "turn-with-flag", "no-verdict-forged-turn", "no-verdict", "no-turn", "no-turn-with-flag"])  # fmt: skip
def test_a_forged_end_line_is_a_finding(recording, change, says):
    result = streamtap("verify", edit_end(recording, change))
    assert result.returncode == 1 and says in result.stdout, (result.stdout, result.stderr)


def finish_as_the_proxy(writer: RecordingWriter, session: StreamSession, body: bytes, read: int | None = None) -> None:
    """``body`` recorded and judged by ``session`` as the proxy does it, in reads of ``read`` bytes."""
    read = read or len(body)
    for i in range(0, len(body), read):
        writer.read(body[i : i + read], 10.0)
        for event in session.feed(body[i : i + read], 0.01):
            writer.frame(event, 10.0)
    analysis = session.close()
    for event in analysis.events:
        writer.frame(event, 10.0)
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)  # as the proxy writes it
    writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished"})


@pytest.fixture
def not_kept_recording(tmp_path) -> Path:
    """A recording as the proxy writes it when a call's arguments pass its cap: it keeps their start,
    cannot parse them, and says unknown with arguments_not_kept."""
    path = tmp_path / "huge-arguments.jsonl"
    body = _chat_with_arguments(20_000, "tool_calls")
    writer = RecordingWriter(path)
    writer.header({"dialect": "openai-chat", "wire": {"format": "sse", "content_encoding": None},
                   "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions", "headers": []},
                   "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]}})
    finish_as_the_proxy(writer, StreamSession(Dialect.OPENAI_CHAT, arguments_cap=1000), body, read=4096)
    end = orjson.loads(path.read_bytes().split(b"\n")[-2])
    assert end["verdict"]["kind"] == "unknown" and end["verdict"]["evidence"]["arguments_not_kept"] is True
    assert end["turn"]["choices"][0]["blocks"][0]["extra"]["arguments_dropped_chars"] > 0  # the case under test
    return path


def test_the_proxys_unknown_for_arguments_it_could_not_keep_verifies_clean(not_kept_recording):
    """verify parses every argument and says complete; the proxy's unknown and its shortened
    arguments are no contradiction."""
    result = streamtap("verify", not_kept_recording)
    assert result.returncode == 0 and ": complete " in result.stdout and "recording:" not in result.stdout, result.stdout


def test_the_turn_of_an_unknown_for_arguments_not_kept_is_still_compared(not_kept_recording):
    result = streamtap("verify", edit_end(not_kept_recording, forged_turn))
    assert result.returncode == 1 and 'the recording\'s turn has model "gpt-5-FAKE", its bytes give "gpt-x"' in result.stdout, result.stdout

    def kept_start_edited(end: dict) -> None:
        block = end["turn"]["choices"][0]["blocks"][0]
        block["arguments_raw"] = block["arguments_raw"][:100] + "z" + block["arguments_raw"][101:]

    result = streamtap("verify", edit_end(not_kept_recording, kept_start_edited))
    assert result.returncode == 1 and "block 0: arguments_raw" in result.stdout, result.stdout


def test_an_end_line_event_count_the_file_does_not_hold_is_a_finding(recording):
    """`events` is what metrics and the index count: a count no frame backs is a problem, not a figure."""
    result = streamtap("verify", edit_end(recording, lambda end: end.update(events=99)))
    assert result.returncode == 1 and "end line says 99 events, the file holds 23 frames" in result.stdout, result.stdout
    old = edit_end(recording, lambda end: end.pop("events"))  # a recording written before every end line had it
    assert streamtap("verify", old).returncode == 0


def test_the_proxys_count_of_a_cut_stream_holds_its_tail(tmp_path):
    """A stream cut inside an event: the proxy counts the frames and the cut tail, as the file holds them."""
    from mitmproxy.test import tflow

    from streamtap.mitm.flowtap import FlowTap
    from streamtap.providers import StreamEnd
    from streamtap.recording import check_recording, read_recording

    flow = tflow.tflow(resp=True)
    flow.request.method, flow.request.path = "POST", "/v1/chat/completions"
    flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
    flow.response.headers["content-type"] = "text/event-stream"
    tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)
    body = _chat_with_arguments(100, "tool_calls")
    tap.arrived(body[: len(body) - 5], None)  # cut inside the last event
    summary = tap.finish(StreamEnd.UPSTREAM_RESET)
    rec = read_recording(summary["recording"])
    assert rec.tail is not None and rec.end["events"] == len(rec.frames) + 1 == summary["events"]
    assert check_recording(rec) == []
    assert "recording:" not in streamtap("verify", summary["recording"]).stdout
