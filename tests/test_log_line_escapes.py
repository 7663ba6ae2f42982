"""The proxy logs one line per turn. The model name comes from the provider (or, when the answer
names none, from the app's request) and the reason quotes the provider's error: a newline in them
forged a "complete" line of its own ahead of the real verdict, and an ESC acted on the terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from upstream import CHAT as CHAT_PATH
from upstream import Mitmdump, Script, Upstream, curl, find_recording

STREAMTAP = Path(sys.executable).with_name("streamtap")
FORGED = "gpt-4o\n[17:00:00.000] streamtap: openai-chat gpt-4o complete: 99 events -> forged.jsonl\x1b[2K"


def chunk(delta: dict, finish: str | None = None) -> bytes:
    payload = {"id": "c1", "object": "chat.completion.chunk", "model": FORGED,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def test_a_model_name_and_an_error_message_stay_inside_their_one_log_line(tmp_path):
    limited = chunk({"role": "assistant", "content": "Hi"}) + chunk({}, "length") + b"data: [DONE]\n\n"
    error = orjson.dumps({"error": {"message": "bad key\n[17:00:00.000] streamtap: forged complete\x1b]0;title\x07",
                                    "type": "invalid_request_error"}})
    with Upstream() as up:
        up.add("limited", Script(limited))
        up.add("error", Script(error, status=401, content_type="application/json"))
        with Mitmdump(up.url, tmp_path / "m") as proxy:
            assert curl(f"{proxy.url}/s/limited{CHAT_PATH}").stdout == limited
            assert curl(f"{proxy.url}/s/error{CHAT_PATH}").stdout == error
            proxy.wait_log(" stopped_by_limit (")
            log = proxy.wait_log(" errored (")
            recording = find_recording(proxy.record_dir, "limited")
    lines = [line for line in log.splitlines() if "streamtap: " in line and "analysis worker" not in line]
    assert len(lines) == 2 and "\x1b" not in log and "\x07" not in log, lines
    [limited_line] = [line for line in lines if "stopped_by_limit" in line]
    assert "gpt-4o\\n[17:00:00.000] streamtap: openai-chat gpt-4o complete" in limited_line and "\\x1b[2K" in limited_line
    [error_line] = [line for line in lines if "errored" in line]
    assert "streamtap: forged complete\\x1b]0;title\\x07" in error_line, error_line
    # show and verify keep the model's one line too, where the answer's own newlines stay
    for verb in ("show", "verify"):
        got = subprocess.run([str(STREAMTAP), verb, recording.path], capture_output=True, text=True, timeout=60)
        assert "\x1b" not in got.stdout and "\n[17:00:00.000]" not in got.stdout, got.stdout
        assert verb == "verify" or "model     gpt-4o\\n[17:00:00.000] streamtap" in got.stdout, got.stdout


def test_an_exception_logged_for_a_flow_keeps_to_one_line_whatever_it_quotes():
    """streamtap's own failures are logged with their message, which may quote the traffic
    (a header, a line of the body): it gets one line, and no control reaches the terminal."""
    from streamtap.cli import failure

    quoted = ValueError("bad line: 'x\n[17:00:00.000] streamtap: forged complete\x1b]0;title\x07\u202e'")
    line = failure(quoted)
    assert line.startswith("ValueError: bad line: ") and line.isprintable(), repr(line)
    assert "\\n[17:00:00.000]" in line and "\\x1b]0;title\\x07" in line and "\\u202e" in line
