"""Numbers the providers' SDKs read (json.loads) and orjson does not: an integer past a double's
range, a float that is not finite. The turn holds them as the app gets them, the writer writes
such a line with the json module, and the readers (verify, read_recording, report) read it back:
a turn judged complete is not left in a recording called damaged."""

from __future__ import annotations

import json

import pytest

import provider_streams as streams
from streamtap.providers import Dialect
from streamtap.providers.common import json_ready
from streamtap.recording import check_recording, read_recording
from streamtap.recording.reader import line_json
from test_deep_arguments import nested, record_as_the_proxy, streamtap, tool_calls
from test_exact_integers import same

HUGE = 10**400  # past a double's range: orjson refuses it ("number is infinity when parsed as double")
CHAT_AT = ("https://api.openai.com/v1/chat/completions", "sse", "text/event-stream")


def chat_with_arguments(arguments: str) -> bytes:
    return streams.openai_chat_with_tool_calls(1).replace(b'"arguments":"{}"', b'"arguments":' + json.dumps(arguments).encode())


@pytest.mark.parametrize("arguments", [
    f'{{"n": {HUGE}}}',
    f'{{"n": -{HUGE}, "nested": [{{"id": {HUGE}}}]}}',
    f'{{"inf": 1e400, "n": {HUGE}}}',  # json.loads's inf: written null, as orjson writes it (Infinity is no JSON)
    f'{{"n": {HUGE}, "minus": -1e400, "small": 123456789012345678901234567890}}',
])  # fmt: skip
def test_tool_arguments_past_a_double_leave_a_recording_that_verifies(tmp_path, arguments):
    path = record_as_the_proxy(tmp_path / "args.jsonl", chat_with_arguments(arguments), Dialect.OPENAI_CHAT, CHAT_AT)
    result = streamtap("verify", path)
    assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr
    rec = read_recording(path)
    assert check_recording(rec) == []
    [call] = tool_calls(rec.end["turn"])
    assert same(call["arguments"], json_ready(json.loads(arguments))) and call["arguments_raw"] == arguments
    report = streamtap("report", "--json", tmp_path)
    assert report.returncode == 0 and json.loads(report.stdout)["verdicts"] == {"complete": 1}, report.stdout + report.stderr


def test_a_usage_count_past_a_double_leaves_a_recording_that_verifies(tmp_path):
    body = streams.openai_chat(["a ", "b"], model="gpt-x").replace(b'"prompt_tokens":9', b'"prompt_tokens":%d' % HUGE)
    path = record_as_the_proxy(tmp_path / "usage.jsonl", body, Dialect.OPENAI_CHAT, CHAT_AT)
    result = streamtap("verify", path)
    assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr
    assert same(read_recording(path).end["turn"]["usage"]["input"], HUGE)


def test_a_line_reads_back_what_the_json_module_wrote_and_no_more():
    written = {"n": HUGE, "low": -HUGE, "inf": float("inf"), "minus": float("-inf"), "small": 123456789012345678901234567890}
    for deep in (None, nested(1100)):  # past the 1024 levels orjson reads
        line = json.dumps({**written, "deep": deep}, separators=(",", ":")).encode()
        read = line_json(line)
        node = read.pop("deep")
        while isinstance(node, dict) and "a" in node:
            node = node["a"]
        assert same(read, written) and node == (None if deep is None else {"leaf": "ünïcode"})
    assert line_json(b'{"x":NaN}')["x"] != line_json(b'{"x":NaN}')["x"]  # NaN is the one value not equal to itself
    assert same(line_json(b'{"x":[-Infinity,Infinity],"n":%d}' % HUGE), {"x": [float("-inf"), float("inf")], "n": HUGE})
    for damaged in (b'{"x":Infinit}', b'{"x":Nan}', b'{"x":tru}', b'{"x":1' + b"0" * 5000 + b"}", b'{"x":' + b"1" * 400 + b",}",
                    b'{"x":"\xff", "n":' + b"1" * 400 + b"}"):  # fmt: skip
        with pytest.raises(ValueError):
            line_json(damaged)


def test_json_output_past_orjson_writes_no_nan_or_infinity(tmp_path):
    """Where orjson cannot write a value (an integer past 64 bits), the json module wrote a NaN or
    an infinity beside it as ``NaN``/``Infinity``, which is no JSON: verify --json, show --json and
    the end line then failed strict parsers (orjson, JSON.parse), while the same value beside a
    small integer came out null."""
    import orjson

    body = streams.openai_chat(["a ", "b"], model="gpt-x").replace(
        b'"prompt_tokens":9', b'"prompt_tokens":123456789012345678901234567890,"cached":NaN,"x":-Infinity')
    path = record_as_the_proxy(tmp_path / "usage.jsonl", body, Dialect.OPENAI_CHAT, CHAT_AT)
    end = path.read_bytes().splitlines()[-1]
    assert b"NaN" not in end and b"Infinity" not in end
    for verb in ("verify", "show"):
        result = streamtap(verb, "--json", path)
        assert result.returncode == 0, result.stdout + result.stderr
        [line] = result.stdout.splitlines()
        orjson.loads(line.replace("123456789012345678901234567890", "1"))  # (orjson reads no integer that long either)
