"""Tool-call arguments nested deeper than orjson writes (254 levels) but no deeper than it reads
(1024): valid JSON a provider can send, which the Gemini assembler, `streamtap show` and
`--json` output must write back out rather than fail on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamtap.providers import Dialect, StreamSession, VerdictKind, analyze_bytes
from streamtap.providers.common import dumps
from streamtap.providers.gemini import MAX_PATH_STEPS
from streamtap.recording import RecordingWriter

DEPTH = 300


def nested(depth: int = DEPTH) -> dict:
    root: dict = {}
    node = root
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    node["leaf"] = "ünïcode"  # written as itself, as orjson writes it, not as \\u escapes
    return root


def sse(event: str | None, payload: dict) -> bytes:
    # the json module: orjson cannot write the deep payloads this test needs
    data = json.dumps(payload, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\r\n\r\n".encode()


def gemini_part(part: dict, finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": [part]}, "index": 0, **({"finishReason": finish} if finish else {})}
    return sse(None, {"candidates": [candidate], "responseId": "R1", "modelVersion": "gemini-test"})


def gemini_body(args: dict) -> bytes:
    return gemini_part({"functionCall": {"name": "deep", "args": args}}) + gemini_part({"text": ""}, "STOP")


def gemini_streamed_args_body(depth: int = DEPTH) -> bytes:
    """Vertex's streamed function-call arguments: one value set at a path ``depth`` keys deep."""
    parts = [
        {"functionCall": {"name": "deep", "willContinue": True}},
        {"functionCall": {"partialArgs": [{"jsonPath": "$" + ".a" * depth, "stringValue": "x"}], "willContinue": True}},
        {"functionCall": {}},
    ]
    return b"".join(gemini_part(part) for part in parts) + gemini_part({"text": ""}, "STOP")


def responses_body(args: dict) -> bytes:
    arguments = json.dumps(args, separators=(",", ":"))
    response = {"id": "resp_D1", "object": "response", "created_at": 1770000000, "status": "in_progress", "model": "gpt-test-5", "output": []}
    item = {"id": "fc_D1", "type": "function_call", "status": "in_progress", "arguments": "", "call_id": "call_D1", "name": "deep"}
    done_item = {**item, "status": "completed", "arguments": arguments}
    usage = {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}
    events = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_D1", "output_index": 0, "delta": arguments},
        {"type": "response.function_call_arguments.done", "item_id": "fc_D1", "output_index": 0, "arguments": arguments},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": {**response, "status": "completed", "output": [done_item], "usage": usage}},
    ]
    return b"".join(sse(event["type"], {**event, "sequence_number": seq}) for seq, event in enumerate(events))


def tool_calls(turn: dict) -> list[dict]:
    return [block for choice in turn["choices"] for block in choice["blocks"] if block["kind"] == "tool_call"]


def streamtap(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtap", *map(str, args)], capture_output=True, text=True, timeout=60)


def test_dumps_writes_what_orjson_cannot_in_orjsons_own_format():
    shallow, deep = {"x": ["é", 1, 2.5, None, True]}, nested()
    assert dumps(shallow) == orjson.dumps(shallow).decode()
    with pytest.raises(TypeError, match="Recursion limit"):
        orjson.dumps(deep)
    assert orjson.loads(dumps(deep)) == deep
    assert '{"a":{"a":' in dumps(deep) and '"leaf":"ünïcode"' in dumps(deep)


def test_dumps_still_refuses_what_is_not_json():
    with pytest.raises(TypeError):
        dumps({"not json": object()})


@pytest.mark.parametrize("body", [gemini_body(nested()), gemini_streamed_args_body()], ids=["args", "partialArgs"])
def test_gemini_judges_deep_arguments_instead_of_an_internal_error(body):
    analysis = analyze_bytes(body, Dialect.GEMINI, wire="sse")
    assert analysis.verdict.kind is VerdictKind.COMPLETE, (analysis.verdict.reason, analysis.verdict.evidence)
    [call] = tool_calls(analysis.turn.to_dict())
    assert call["name"] == "deep"
    assert orjson.loads(call["arguments_raw"]) == call["arguments"]


@pytest.mark.parametrize("chunk_size", [1, None])
def test_gemini_partial_args_deeper_than_json_reads_are_not_assembled(chunk_size):
    """A jsonPath makes one level per step: arguments as deep as orjson reads are built, a path
    deeper is not (whole ``args`` that deep would not parse either), and the verdict says why."""
    at_limit = analyze_bytes(gemini_streamed_args_body(MAX_PATH_STEPS), Dialect.GEMINI, wire="sse", chunk_size=chunk_size)
    assert at_limit.verdict.kind is VerdictKind.COMPLETE, at_limit.verdict
    verdict = analyze_bytes(gemini_streamed_args_body(MAX_PATH_STEPS + 1), Dialect.GEMINI, wire="sse",
                            chunk_size=chunk_size).verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict
    assert f"has {MAX_PATH_STEPS + 1} steps, deeper than the {MAX_PATH_STEPS} levels" in verdict.reason, verdict
    assert verdict.seq == 1 and verdict.evidence["limit"] == MAX_PATH_STEPS


@pytest.mark.parametrize("dialect, make_body", [("gemini", gemini_body), ("responses", responses_body)])
def test_show_prints_deep_arguments(tmp_path, dialect, make_body):
    path = tmp_path / f"deep_{dialect}.sse"
    path.write_bytes(make_body(nested()))
    result = streamtap("show", path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "COMPLETE" in result.stdout
    assert dumps(nested()) in result.stdout


@pytest.mark.parametrize("verb", ["show", "verify"])
@pytest.mark.parametrize("dialect, make_body", [("gemini", gemini_body), ("responses", responses_body)])
def test_json_output_holds_deep_arguments(tmp_path, verb, dialect, make_body):
    path = tmp_path / f"deep_{dialect}.sse"
    path.write_bytes(make_body(nested()))
    result = streamtap(verb, "--json", path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    judged = orjson.loads(result.stdout)
    assert judged["verdict"]["kind"] == "complete"
    [call] = tool_calls(judged["turn"])
    assert call["name"] == "deep" and call["arguments"] == nested()


GEMINI_AT = ("https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent", "sse", "text/event-stream")


def record_as_the_proxy(path: Path, body: bytes, dialect: Dialect = Dialect.GEMINI, at: tuple[str, str, str] = GEMINI_AT) -> Path:
    """``body`` recorded with the end line the proxy writes (its verdict and turn); ``at`` is the
    request's URL, the wire format and the response's content type."""
    url, wire, content_type = at
    writer = RecordingWriter(path)
    writer.header({"dialect": dialect.value, "wire": {"format": wire, "content_encoding": None},
                   "request": {"method": "POST", "url": url, "headers": []},
                   "response": {"status": 200, "headers": [["content-type", content_type]]}})  # fmt: skip
    session = StreamSession(dialect)
    writer.read(body, 10.0)
    for event in [*session.feed(body, 0.01), *(analysis := session.close()).events]:
        writer.frame(event, 10.0)
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)  # as the proxy writes it
    writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished"})
    return path


def test_a_recording_with_deep_arguments_verifies_and_a_forged_deep_value_is_shown_as_json(tmp_path):
    path = record_as_the_proxy(tmp_path / "deep.jsonl", gemini_body(nested()))
    result = streamtap("verify", path)
    assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr

    lines = path.read_bytes().split(b"\n")[:-1]
    end = orjson.loads(lines[-1])
    end["turn"]["error"] = nested()  # a forged end line: the bytes give no error
    path.write_bytes(b"\n".join([*lines[:-1], json.dumps(end, separators=(",", ":")).encode()]) + b"\n")
    result = streamtap("verify", path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert 'the recording\'s turn has error {"a":{"a":' in result.stdout, result.stdout  # JSON, as every other value is shown


def test_a_line_whose_type_is_nested_deeper_than_orjson_writes_is_named_damaged(tmp_path):
    """The reader shows what is wrong with a line's fields as JSON: a deep value is shown too."""
    path = record_as_the_proxy(tmp_path / "deep-type.jsonl", gemini_body({"x": 1}))
    lines = path.read_bytes().split(b"\n")[:-1]
    frame = orjson.loads(lines[2])
    frame["type"] = nested()
    lines[2] = json.dumps(frame, separators=(",", ":")).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = streamtap("verify", path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert '{"a":{"a":' in result.stdout + result.stderr


def test_anthropic_input_arriving_whole_and_deep_keeps_its_text():
    """A tool_use block given whole in message_start: its arguments' text is written as the API gave it."""
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "deep", "input": nested()}]}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    analysis = analyze_bytes(b"".join(sse(name, payload) for name, payload in events), Dialect.ANTHROPIC)
    calls = [block for block in analysis.turn.choices[0].blocks if block.kind == "tool_call"]
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert len(calls) == 1 and calls[0].arguments_raw is not None
    assert json.loads(calls[0].arguments_raw) == nested()
