"""`streamtap show` and `streamtap verify` run as real processes on captured files."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import shared_path

from streamtap.providers import Dialect, StreamSession
from streamtap.providers.judge import ARGUMENTS_CAP
from streamtap.recording import RecordingWriter, SpanNotKept

F = "fixtures"
STREAMTAP = Path(sys.executable).with_name("streamtap")


def streamtap(*args: str | Path, timeout: float = 30) -> subprocess.CompletedProcess:
    # the installed console script, as a user runs it
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return {
        "chat": shared_path(F, "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse"),
        "reasoning": shared_path(F, "pydantic-ai/bodies/openrouter/test_openrouter_streaming_reasoning.0.sse"),
        "responses": shared_path(F, "pydantic-ai/bodies/openai-responses/test_openai_responses_stream.1.sse"),
        "gemini": shared_path(F, "pydantic-ai/bodies/google/test_google_model_stream.0.sse"),
        "errored": shared_path(F, "pydantic-ai/bodies/openrouter/test_openrouter_stream_error.0.sse"),
        "anthropic": shared_path(F, "pydantic-ai/bodies/anthropic/test_anthropic_model_thinking_part_stream.0.sse"),
        "bedrock": shared_path(F, "openllmetry/bodies/converse_stream_anthropic_tool_use.0.bin"),
    }


def test_verify_all_complete_exits_0_one_line_each_and_says_it_sniffed(files):
    paths = [files[k] for k in ("chat", "reasoning", "responses", "gemini", "anthropic", "bedrock")]
    result = streamtap("verify", *paths)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(paths)
    for path, line in zip(paths, lines):
        assert line.startswith(f"{path}: complete (")
        assert "sniffed" in line
    assert "(openai-chat, sniffed" in lines[0] and "(gemini, sniffed" in lines[3]
    assert "(anthropic, sniffed" in lines[4] and "(bedrock-converse, sniffed" in lines[5]


def test_verify_exits_1_when_any_file_is_not_complete(files, tmp_path):
    body = files["chat"].read_bytes()
    cut = tmp_path / "cut.sse"
    cut.write_bytes(body[: len(body) * 2 // 3])
    result = streamtap("verify", files["chat"], cut, files["errored"])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert ": complete (" in lines[0]
    assert lines[1].startswith(f"{cut}: truncated (openai-chat, sniffed")
    assert ": errored (" in lines[2] and "Token limit reached" in lines[2]


def test_usage_errors_exit_2_in_one_line(files, tmp_path):
    missing = streamtap("verify", tmp_path / "nope.sse", files["chat"])
    assert missing.returncode == 2
    # the missing path is said on its own line; the file after it is still judged
    assert missing.stderr.strip() == f"streamtap verify: {tmp_path / 'nope.sse'}: no such file"
    assert missing.stdout.startswith(f"{files['chat']}: complete (") and len(missing.stdout.splitlines()) == 1
    bad = streamtap("show", "--provider", "openai", files["chat"])
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr
    none = streamtap("verify")
    assert none.returncode == 2


def test_provider_flag_overrides_sniffing(files):
    forced = streamtap("verify", "--provider", "openai-chat", files["chat"])
    assert forced.returncode == 0 and "sniffed" not in forced.stdout and "(openai-chat)" in forced.stdout
    # the wrong dialect on purpose: the file does not make sense as Responses
    wrong = streamtap("verify", "--provider", "openai-responses", files["chat"])
    assert wrong.returncode == 1 and ": truncated (openai-responses)" in wrong.stdout


def test_json_output_carries_turn_and_verdict(files):
    result = streamtap("verify", "--json", files["chat"], files["errored"])
    assert result.returncode == 1
    first, second = (orjson.loads(line) for line in result.stdout.splitlines())
    assert first["verdict"]["kind"] == "complete" and first["dialect"] == "openai-chat"
    calls = [b for b in first["turn"]["choices"][0]["blocks"] if b["kind"] == "tool_call"]
    assert [c["arguments"] for c in calls] == [{"location": "San Francisco"}, {"location": "Boston"}]
    assert second["verdict"]["kind"] == "errored" and second["turn"]["error"]["message"]
    assert first["detected"].startswith("sniffed")
    shown = streamtap("show", "--json", files["responses"])
    assert shown.returncode == 0 and orjson.loads(shown.stdout)["turn"]["dialect"] == "openai-responses"


def test_show_renders_thinking_apart_from_the_answer_and_tool_calls(files):
    result = streamtap("show", files["reasoning"], files["chat"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    first, second = out.split(f"\n\n{files['chat']}")
    assert first.index("─── thinking") < first.index("─── answer")
    assert "│ " in first.split("─── answer")[0]  # thinking lines are marked, the answer is not
    assert "verdict   COMPLETE" in first and "dialect   openai-chat  (sniffed" in first
    assert "timing    no arrival times" in first
    assert "usage     in 43, out 36, reasoning 13" in first
    assert '─── tool call get_current_weather (id call_' in second
    assert '{"location":"Boston"}' in second


def _redacted_bodies(data) -> dict[str, tuple[bytes, str]]:
    """One redacted thinking block and an answer, in each dialect that has one: (body, --provider)."""
    import base64

    from streamtap.wire import encode_message

    def frame(kind: str, payload: dict) -> bytes:
        return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                              json.dumps(payload).encode())

    def chunk(event: dict) -> bytes:
        return frame("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()})

    converse = [("messageStart", {"role": "assistant"}),
                *(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": piece}}})
                  for piece in ("YWI=", "Y2Rl", "Zg==")),  # b"ab", b"cde", b"f": a 6-byte blob
                ("contentBlockStop", {"contentBlockIndex": 0}),
                ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "ok"}}),
                ("contentBlockStop", {"contentBlockIndex": 1}), ("messageStop", {"stopReason": "end_turn"}),
                ("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}, "metrics": {"latencyMs": 1}})]
    anthropic = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                                              "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "redacted_thinking", "data": data}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": "ok"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"}]
    return {
        "converse": (b"".join(frame(kind, payload) for kind, payload in converse), "bedrock-converse"),
        "nova": (b"".join(chunk({kind: payload}) for kind, payload in converse), "bedrock-invoke"),
        "anthropic": (b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in anthropic), "anthropic"),
        "claude on bedrock": (b"".join(map(chunk, anthropic)), "bedrock-invoke"),
    }

def test_show_says_a_gemini_call_came_without_an_id():
    """Gemini sends function calls without ids (google-genai gives the app None): the id streamtap
    keys the call by read as the provider's own."""
    body = shared_path(F, "pydantic-ai/bodies/google/test_google_model_iter_stream.0.sse")
    result = streamtap("show", body)
    assert result.returncode == 0, result.stderr
    assert "(no id from the provider; streamtap's gemini-call-1)" in result.stdout
    assert "(id gemini-call-" not in result.stdout



@pytest.mark.parametrize(("data", "says"), [
    ("EmwKAhgB", "(8 characters of encrypted data)"), (5, "(encrypted data that is not a string: 5)"), (None, "(no encrypted data)")])
def test_show_sizes_redacted_thinking_in_what_the_app_gets(tmp_path, data, says):
    """Bedrock hands the app redactedContent as bytes (streamtap keeps their base64): their count is
    the size; Anthropic's data is a string the app gets as sent, counted in characters."""
    for name, (body, provider) in _redacted_bodies(data).items():
        path = tmp_path / f"{name}.{'sse' if provider == 'anthropic' else 'bin'}"  # the extension names the framing
        path.write_bytes(body)
        shown = streamtap("show", "--provider", provider, path)
        assert shown.returncode == 0 and "verdict   COMPLETE" in shown.stdout, shown.stdout + shown.stderr
        lines = shown.stdout.splitlines()
        redacted = lines[lines.index(next(line for line in lines if line.startswith("─── redacted thinking"))) + 1]
        bedrock = name in ("converse", "nova")
        assert redacted == ("│ (6 bytes of encrypted data)" if bedrock else f"│ {says}"), (name, redacted)


def test_sentinel_flag(files, tmp_path):
    result = streamtap("verify", "--sentinel", "THE END", files["gemini"])
    assert result.returncode == 1 and "truncated" in result.stdout and "sentinel missing" in result.stdout


def _record(path: Path, body: bytes, dialect: Dialect, step: int, finish: bool = True, sentinel: str | None = None) -> None:
    """Write a recording the way the proxy does: frames as the session returns them, with times;
    ``sentinel``: the proxy's streamtap_sentinel."""
    writer = RecordingWriter(path)
    writer.header({"dialect": dialect.value, "wire": {"format": "sse", "content_encoding": None},
                   "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions", "headers": []},
                   "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]}, "sentinel": sentinel})
    session = StreamSession(dialect, sentinel=sentinel)
    t_ms = 120.0
    for i in range(0, len(body), step):
        writer.read(body[i : i + step], t_ms)
        for event in session.feed(body[i : i + step], t_ms / 1000):
            writer.frame(event, t_ms)
        t_ms += 15
    analysis = session.close()
    for event in analysis.events:
        writer.frame(event, t_ms)
    if finish:
        turn = analysis.turn.to_dict()
        turn.get("timing", {}).pop("arrivals", None)  # as the proxy writes it
        writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished"})
    else:
        writer.flush()


def test_a_recording_whose_analysis_fell_behind_is_unknown_not_cut(tmp_path):
    """The proxy stopped handing the flow's reads on at byte N (its worker behind), and the
    recording stops there; the stream went on. Its bytes read as truncated: that is where the
    recording stopped, not the answer, as the proxy's own unknown says."""
    frames = [b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"w%d "},"finish_reason":null}]}\n\n' % i
              for i in range(6)]
    held, stopped_at = b"".join(frames[:4]), len(b"".join(frames[:4]))
    for name, errors in (("behind.jsonl", [f"analysis: analysis fell behind at byte {stopped_at}"]), ("cut.jsonl", None)):
        writer = RecordingWriter(tmp_path / name)
        writer.header({"dialect": "openai-chat", "wire": {"format": "sse", "content_encoding": None},
                       "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions", "headers": []},
                       "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]}})
        writer.read(held, 1.0)
        session = StreamSession(Dialect.OPENAI_CHAT)
        for event in session.feed(held) + session.close().events:
            writer.frame(event, 1.0)
        end = {"stream_end": "finished", "verdict": {"kind": "unknown", "reason": "streamtap could not analyse this flow", "evidence": {}}}
        writer.finish(end | {"streamtap_errors": errors} if errors else end | {"verdict": session.close().verdict.to_dict()})
    behind = streamtap("verify", "--json", tmp_path / "behind.jsonl")
    verdict = json.loads(behind.stdout)["verdict"]
    assert behind.returncode == 1 and verdict["kind"] == "unknown", behind.stdout
    assert f"the recording stops at wire byte {stopped_at}, where the proxy stopped analysing" in verdict["reason"]
    assert verdict["evidence"]["held_bytes_read_as"] == "truncated" and json.loads(behind.stdout)["problem"] is None
    cut = streamtap("verify", "--json", tmp_path / "cut.jsonl")  # without the note, the same bytes are a cut answer
    assert json.loads(cut.stdout)["verdict"]["kind"] == "truncated", cut.stdout


def test_show_and_verify_read_recordings_with_timing(files, tmp_path):
    recording = tmp_path / "flow.jsonl"
    _record(recording, files["reasoning"].read_bytes(), Dialect.OPENAI_CHAT, 500)
    verify = streamtap("verify", recording)
    assert verify.returncode == 0 and verify.stdout.startswith(f"{recording}: complete (openai-chat)")
    show = streamtap("show", recording)
    assert "(recording, sse," in show.stdout
    assert "timing    first byte 120 ms, first content" in show.stdout
    partial = tmp_path / "flow.partial.jsonl"
    body = files["reasoning"].read_bytes()
    _record(partial, body[: len(body) // 2], Dialect.OPENAI_CHAT, 500, finish=False)
    cut = streamtap("verify", partial)
    # the recording stops where its writer did, not necessarily where the stream did
    assert cut.returncode == 1 and ": unknown (openai-chat)" in cut.stdout and "read as truncated" in cut.stdout, cut.stdout
    assert "recording:" in cut.stdout and "ended cleanly" not in cut.stdout


def test_help_teaches(files):
    result = streamtap("verify", "--help")
    assert result.returncode == 0
    for word in ("--provider", "--sentinel", "--json", "openai-responses", "Exit codes", "truncated"):
        assert word in result.stdout


def test_ndjson_and_json_array_bodies_by_extension(tmp_path):
    """Constructed: an Ollama NDJSON body and a Gemini JSON-array body (real payloads re-framed)."""
    chunks = shared_path(F, "vercel-ai/google/google-text.chunks.txt").read_bytes().split(b"\n")
    array = tmp_path / "gemini.json"
    array.write_bytes(b"[" + b",\n".join(c for c in chunks if c.strip()) + b"]")
    cut_array = tmp_path / "gemini-cut.json"
    cut_array.write_bytes(array.read_bytes()[:-1])
    ollama = tmp_path / "ollama.ndjson"
    ollama.write_bytes(
        b'{"model":"llama3.2","response":"Hi","done":false}\n'
        b'{"model":"llama3.2","response":" there","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}\n'
    )
    result = streamtap("verify", array, ollama, cut_array)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert lines[0].startswith(f"{array}: complete (gemini, sniffed: JSON array")
    assert lines[1].startswith(f"{ollama}: complete (ollama, sniffed: NDJSON")
    assert lines[2].startswith(f"{cut_array}: truncated (gemini") and "']'" in lines[2]


def test_an_answer_that_quotes_the_recording_format_is_judged_as_the_stream_it_is(tmp_path):
    """The format's mark marks a damaged recording header only as the writer writes it: an answer
    whose first chunk's text quotes it (its quotes escaped in the chunk's JSON) is a body like any."""
    quoting = tmp_path / "quoting.ndjson"
    quoting.write_bytes(
        b'{"model":"llama3.2","response":"Each recording starts with {\\"type\\":\\"header\\",'
        b'\\"format\\":\\"streamtap-recording/2\\"}","done":false}\n'
        b'{"model":"llama3.2","response":".","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}\n'
    )
    for verb in ("verify", "show"):
        result = streamtap(verb, quoting)
        assert result.returncode == 0, result.stdout + result.stderr
    assert streamtap("verify", quoting).stdout.startswith(f"{quoting}: complete (ollama")


def test_a_json_document_that_is_no_stream_is_not_judged_as_one(tmp_path):
    """A non-streamed answer, a HAR file and a settings file are one JSON document each, not a
    stream cut or broken: each is "not a stream" (exit 2), as an empty file is, and --provider
    still judges it. An Ollama answer of one line stays a stream."""
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}
    docs = {
        "answer.json": json.dumps(answer, indent=2),
        "answer": json.dumps(answer),
        "message.json": json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "content": [], "stop_reason": "end_turn"}),
        "capture.har": json.dumps({"log": {"version": "1.2", "entries": []}}, indent=2),
        "settings.json": '{"retention_days": 30}\n',
    }
    for name, text in docs.items():
        (tmp_path / name).write_text(text)
        result = streamtap("verify", tmp_path / name)
        assert result.returncode == 2 and result.stdout == "", (name, result.stdout, result.stderr)
        assert f"{name}: not a stream: " in result.stderr, (name, result.stderr)
    assert "HAR file" in streamtap("verify", tmp_path / "capture.har").stderr
    assert streamtap("verify", "--provider", "openai-chat", tmp_path / "answer").returncode == 1  # judged, as asked
    ollama = tmp_path / "ollama.ndjson"
    ollama.write_text('{"model":"m","response":"Hi","done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}\n')
    result = streamtap("verify", ollama)
    assert result.returncode == 0 and ": complete (ollama" in result.stdout, result.stdout + result.stderr


def test_a_recording_written_again_with_spaces_is_still_one(tmp_path):
    """JSON allows spaces around a member's colon: a recording whose lines a tool wrote again that
    way (Python's json.dumps) is still read as one, as the mark of its format says."""
    spaced = tmp_path / "spaced.jsonl"
    lines = (Path(__file__).parents[1] / "recordings" / "anthropic.jsonl").read_text().splitlines()
    spaced.write_text("".join(json.dumps(json.loads(line)) + "\n" for line in lines))
    assert spaced.read_text().startswith('{"type": "header", "format": "streamtap-recording/')
    result = streamtap("verify", "--json", spaced)
    assert result.returncode == 0, result.stdout + result.stderr
    judged = json.loads(result.stdout)
    assert judged["source"] == "recording" and judged["verdict"]["kind"] == "complete", result.stdout


def test_a_file_that_cannot_be_judged_is_named_with_no_terminal_control_run(tmp_path):
    """The line for an input that cannot be judged holds someone else's text (a shared folder's
    file name, a recording header's own format): ESC and newlines in it are written as escapes."""
    header = json.loads((Path(__file__).parents[1] / "recordings" / "anthropic.jsonl").read_text().splitlines()[0])
    header["format"] = "streamtap-recording/9\x1b[31mRED\nstreamtap verify: all good"
    (tmp_path / "format.jsonl").write_text(json.dumps(header) + "\n")
    (tmp_path / "name\x1b[32m\nforged.jsonl").write_text('{"type":"header",\n')
    for verb in ("verify", "show"):
        result = streamtap(verb, tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "\x1b" not in result.stderr and len(result.stderr.splitlines()) == 2, result.stderr
        assert "\\x1b[31mRED\\nstreamtap verify: all good" in result.stderr and "name\\x1b[32m\\nforged.jsonl" in result.stderr


@pytest.mark.parametrize(
    ("line1", "line2", "says"),
    [
        ('"response":{"status":"abc"}', None, "line 1 is damaged: 'status' is \"abc\", not an integer"),
        ('"response":[200]', None, "line 1 is damaged: 'response' is [200], not an object"),
        ('"wire":{"format":"xml"}', None, "cannot judge recording: unknown wire 'xml'"),
        ('"wire":{"format":"sse"}', '{"type":"frame","seq":0,"offset":0,"raw":"data: x\\n\\n","sum":"x","t":"soon"}',
         "line 2 is damaged: 't' is \"soon\", not a number"),
        ('"wire":{"format":"sse"}', '{"type":"frame","seq":"a","offset":0,"raw":"a","sum":"x"}',
         "line 2 is damaged: 'seq' is \"a\", not an integer"),
        ('"wire":{"format":"sse"}', '{"type":"reads","reads":[[0,"a",1]]}',
         'line 2 is damaged: a network read is [0,"a",1], not [offset, length, t]'),
        ('"wire":{"format":"sse"}', '{"type":"end","verdict":"complete"}',
         "line 2 is damaged: 'verdict' is \"complete\", not an object"),
        ('"wire":{"format":"sse"}', '{"type":"end","verdict":{"iind":"complete"}}',
         "line 2 is damaged: 'kind' is null, not a string"),
    ],
)
def test_a_recording_with_a_mistyped_field_is_one_line_exit_2(tmp_path, line1, line2, says):
    """A hand-edited or damaged recording: a field of the wrong type names its line, no traceback."""
    recording = tmp_path / "edited.jsonl"
    lines = ['{"type":"header","format":"streamtap-recording/1","dialect":"openai-chat",' + line1 + "}"]
    lines += [line2] if line2 else []
    if not (line2 or "").startswith('{"type":"end"'):
        empty = hashlib.sha256(b"").hexdigest()
        lines.append('{"type":"end","stream_end":"finished","frames":0,"bytes":0,"sha256":"%s","wire_bytes":0,'
                     '"wire_sha256":"%s"}' % (empty, empty))
    recording.write_text("\n".join(lines) + "\n")
    for verb in ("verify", "show"):
        result = streamtap(verb, recording)
        assert result.returncode == 2, result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr
        assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr


def test_a_bug_in_a_verb_exits_3_not_1(monkeypatch, capsys, tmp_path):
    """Exit 1 means "a finding": an internal error must not be mistaken for one."""
    from streamtap import cli
    from streamtap.commands import verify

    def broken(args):
        raise RuntimeError("a bug in streamtap")

    monkeypatch.setattr(verify, "run", broken)
    body = tmp_path / "body.sse"
    body.write_bytes(b"data: {}\n\n")
    assert cli.main(["verify", str(body)]) == cli.EXIT_INTERNAL == 3
    assert "RuntimeError: a bug in streamtap" in capsys.readouterr().err


def test_a_verb_whose_module_fails_to_import_exits_3_not_1(tmp_path):
    """A broken install (here a dependency the verb imports that cannot load) is a bug, not a finding."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "zstandard.py").write_text('raise ImportError("libzstd.so.1: cannot open shared object file")\n')
    body = tmp_path / "body.sse"
    body.write_bytes(b"data: {}\n\n")
    result = subprocess.run([sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())", "verify", body],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(shadow)})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "ImportError: libzstd.so.1" in result.stderr


# -- recordings that contradict the format or their own bytes (issue 9.5) ---------------------------


def _edited(tmp_path: Path, files, edit) -> Path:
    """A real recording written by the project's writer, then edited by ``edit(lines) -> lines``
    (lines without their newline, as bytes)."""
    original = tmp_path / "original.jsonl"
    _record(original, files["reasoning"].read_bytes(), Dialect.OPENAI_CHAT, 500)
    assert streamtap("verify", original).returncode == 0
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"\n".join(edit(original.read_bytes().split(b"\n")[:-1])) + b"\n")
    return edited


def _first(lines: list[bytes], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if orjson.loads(line)["type"] == kind)


def _set(kind: str, **fields):
    """Set fields of the first line of that type."""

    def edit(lines: list[bytes]) -> list[bytes]:
        i = _first(lines, kind)
        record = orjson.loads(lines[i])
        for name, value in fields.items():
            if value is None:
                del record[name]
            else:
                record[name] = value
        return [*lines[:i], orjson.dumps(record), *lines[i + 1 :]]

    return edit


def _frame_as_b64(text: str):
    def edit(lines: list[bytes]) -> list[bytes]:
        i = _first(lines, "frame")
        record = orjson.loads(lines[i])
        del record["raw"]
        record["raw_b64"] = text
        return [*lines[:i], orjson.dumps(record), *lines[i + 1 :]]

    return edit


@pytest.mark.parametrize(
    ("edit", "line_of", "says"),
    [
        (_set("frame", len=10**18), "frame", "'len' is 1000000000000000000, but the line holds"),
        (_set("frame", len=None), "frame", "'len' is null"),
        (_set("frame", sum="zz" * 8), "frame", "'sum' is \"zzzz"),
        (_set("frame", offset=-3), "frame", "'offset' is -3"),
        (_set("frame", t=-5), "frame", "'t' is -5"),
        (_frame_as_b64("not base64!"), "frame", "'raw_b64' is not valid base64"),
        (_set("end", stream_end="exploded"), "end", "'stream_end' is \"exploded\", not one of"),
        # without it the body was judged as though the upstream had ended it: a reset answer read as complete
        (_set("end", stream_end=None), "end", "'stream_end' is null"),
        (_set("end", verdict={"kind": "great"}), "end", "'kind' is \"great\", not one of"),
        (_set("end", sha256="00"), "end", "'sha256' is \"00\", not 64 lowercase hex digits"),
        (_set("end", frames=None), "end", "'frames' is null, not an integer"),
        (_set("end", injected_fault=1), "end", "'injected_fault' is 1, not a string"),
        (_set("reads", wire_b64="AAAA"), "reads", "'wire_b64' holds 3 bytes, its reads add up to"),
        (lambda lines: [lines[0], lines[0], *lines[1:]], 1, "line 2 is a second header"),
        (lambda lines: [line + b"\r" for line in lines], 0, "line 1 ends in CR LF"),
        (lambda lines: [lines[0], b" " + lines[1], *lines[2:]], 1, "line 2 (byte"),
        (_set("frame", event={"sse": "error", "id": "forged", "retry": 99}), "frame",
         "is damaged: its 'event.sse' is \"error\", its bytes give \"message\""),
        (_set("frame", event=None), "frame", "is damaged: its 'event.sse' is missing, its bytes give \"message\""),
    ],
    ids=["len-huge", "len-missing", "sum-not-hex", "offset-negative", "t-negative", "raw_b64-invalid",
         "stream_end-invalid", "stream_end-missing", "verdict-kind-invalid", "sha256-not-hex", "frames-missing", "injected_fault-not-text",
         "wire_b64-length",
         "second-header", "crlf", "space-before-line", "event-forged", "event-missing"],  # fmt: skip
)
def test_a_recording_that_contradicts_the_format_is_one_line_exit_2_naming_the_line(files, tmp_path, edit, line_of, says):
    edited = _edited(tmp_path, files, edit)
    lines = edited.read_bytes().split(b"\n")
    number = line_of + 1 if isinstance(line_of, int) else _first(lines, line_of) + 1
    for verb in ("verify", "show"):
        result = streamtap(verb, edited)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert f"line {number} " in result.stderr and says in result.stderr, result.stderr


def _proxy_recording(path: Path, body: bytes, dialect: str, wire: str, max_event: int | None = None) -> None:
    """``body`` recorded as the proxy records it, an event skipped for its size too: its bytes as
    raw lines, then the event with none."""
    writer = RecordingWriter(path)
    writer.header({"dialect": dialect, "wire": {"format": wire, "content_encoding": None},
                   "request": {"method": "POST", "url": "https://example.test/v1", "headers": []},
                   "response": {"status": 200, "headers": []}} | ({"max_event_size": max_event} if max_event else {}))
    writer.read(body, 1.0)
    session = StreamSession(dialect, wire, **({"max_event_size": max_event} if max_event else {}))
    events = session.feed(body, 0.001)  # (one read: verify feeds the frames one by one, and decodes them alike)
    analysis = session.close()
    for event in [*events, *analysis.events]:
        try:
            writer.frame(event, 1.0)
        except SpanNotKept:
            writer.raw(body[writer.offset : event.end], 1.0, "the event outgrew the limit")
            writer.frame(event._replace(start=event.end, raw=b""), 1.0)
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)
    writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished"})


def _bedrock_body() -> bytes:
    return shared_path(F, "openllmetry/bodies/converse_stream_anthropic_tool_use.0.bin").read_bytes()


@pytest.mark.parametrize(
    ("body", "dialect", "wire", "max_event", "seq", "forged", "says"),
    [
        # each event is decoded once the next line's bytes show its lone CR is no CR LF; the last, at the end
        (b"data: a\r\rdata: b\r\r", "unknown", "sse", None, 0, {"sse": "ping"}, "'event.sse' is \"ping\""),
        (b"data: a\r\rdata: b\r\r", "unknown", "sse", None, 1, {"sse": "ping"}, "'event.sse' is \"ping\""),
        # the last event ID stays in force: a view gives it where it changes
        (b"id: 7\nretry: 5\ndata: a\n\ndata: b\n\n", "unknown", "sse", None, 1, {"sse": "message", "id": "8"},
         "'event.id' is \"8\", its bytes give none"),
        (b"id: 7\ndata: a\n\nid: 8\ndata: b\n\n", "unknown", "sse", None, 1, {"sse": "message"},
         "'event.id' is missing, its bytes give \"8\""),
        (b"id: 7\nretry: 5\ndata: a\n\n", "unknown", "sse", None, 0, {"sse": "message", "id": "7", "retry": 6},
         "'event.retry' is 6, its bytes give 5"),
        # decoded at the end of its raw lines, before its frame
        (b"data: 1\n\ndata: " + b"x" * 200 + b"\n\ndata: 2\n\n", "unknown", "sse", 64, 1, lambda event: event | {"fatal": True},
         "'event.fatal' is true, its bytes give false"),
        (b'{"a":1}\n{"b":2}\n', "unknown", "ndjson", None, 1, {"json": 1}, "'event.json' is 1, its bytes give true"),
        (_bedrock_body, "bedrock-converse", "eventstream", None, 2, lambda event: event | {"headers": event["headers"] | {":event-type": "messageStop"}},
         "'event.headers.:event-type' is \"messageStop\", its bytes give \"contentBlockDelta\""),
    ],
    ids=["lone-cr-first", "lone-cr-last-at-close", "id-in-force", "id-changed", "retry", "skipped-oversize", "ndjson", "eventstream-header"],
)
def test_a_frame_whose_event_its_bytes_do_not_decode_to_is_damaged(tmp_path, body, dialect, wire, max_event, seq, forged, says):
    """A frame's ``event`` is the decoded view of its bytes: verify decodes them again, as the proxy
    did, and one that says otherwise names its line (exit 2), as a ``len`` that is not theirs does."""
    original = tmp_path / "original.jsonl"
    _proxy_recording(original, body() if callable(body) else body, dialect, wire, max_event)
    lines = original.read_bytes().split(b"\n")[:-1]
    at = next(i for i, line in enumerate(lines) if orjson.loads(line)["type"] == "frame" and orjson.loads(line)["seq"] == seq)
    record = orjson.loads(lines[at])
    checked = streamtap("verify", original)
    assert checked.returncode in (0, 1) and checked.stderr == "", checked.stdout + checked.stderr
    record["event"] = forged(record["event"]) if callable(forged) else forged
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"\n".join([*lines[:at], orjson.dumps(record), *lines[at + 1 :]]) + b"\n")
    result = streamtap("verify", edited)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert f"line {at + 1} is damaged: its {says}" in result.stderr, result.stderr


def test_an_sse_id_is_recorded_where_it_changes_so_a_long_one_does_not_grow_every_frame(tmp_path):
    """The view gave the id in effect on every frame: one event setting a 100 KiB id, then 2,000
    small events, made a 205 MB recording of a 216 KB body. Format /2 gives it where it changes;
    a /1 recording, which gives it on every frame, still verifies clean, and each is held to its
    own rule: a /2 frame that leaves out a change, or a /1 frame that leaves out an id, is damage."""
    body = b"id: " + b"i" * 102_400 + b"\ndata: a\n\n" + b"data: b\n\n" * 2000 + b"id: 2\ndata: c\n\nid\ndata: d\n\n"
    recording = tmp_path / "ids.jsonl"
    _proxy_recording(recording, body, "unknown", "sse")
    assert recording.stat().st_size < 2 * len(body) + 200 * 2004, recording.stat().st_size  # (a line per frame: 205 MB before)
    lines = [orjson.loads(line) for line in recording.read_bytes().splitlines()]
    views = [line["event"] for line in lines if line["type"] == "frame"]
    assert views[0]["id"] == "i" * 102_400 and "id" not in views[1] and views[-2]["id"] == "2" and views[-1]["id"] == ""
    checked = streamtap("verify", recording)
    assert checked.returncode == 1 and checked.stderr == "", checked.stdout + checked.stderr  # (unknown: no dialect)
    in_effect = ""  # as format /1 gives it: on every frame, unless empty
    lines[0]["format"] = "streamtap-recording/1"
    for line in lines:
        if line["type"] == "frame":
            in_effect = line["event"].get("id", in_effect)
            line["event"].pop("id", None)
            if in_effect:
                line["event"] = {"sse": line["event"]["sse"], "id": in_effect, **line["event"]}
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    checked = streamtap("verify", old)
    assert checked.returncode == 1 and checked.stderr == "", checked.stdout + checked.stderr
    lines[0]["format"] = "streamtap-recording/2"  # the /1 views under the /2 rule: the second frame gives an id it never changed
    old.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    checked = streamtap("verify", old)
    assert checked.returncode == 2 and "line 3 is damaged: its 'event.id' is" in checked.stderr, checked.stdout + checked.stderr


def test_an_end_line_whose_frame_count_differs_from_the_file_is_a_finding(files, tmp_path):
    edited = _edited(tmp_path, files, lambda lines: [line for i, line in enumerate(lines) if i != _first(lines, "frame")])
    result = streamtap("verify", edited)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "frames, the file holds" in result.stdout and "offset" in result.stdout


PEAK_RSS = (
    "import resource, subprocess, sys;"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True);"
    "print(code.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, code.stderr.strip())"
)


def _peak_rss(*args: str | Path) -> tuple[int, int, str]:
    """(exit code, peak RSS in MiB, stderr) of one `streamtap` run, measured alone."""
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, str(STREAMTAP), *map(str, args)],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    code, mib, err = out.split(" ", 2)
    return int(code), int(mib), err


def test_a_line_longer_than_the_format_allows_is_refused_in_bounded_memory(files, tmp_path):
    """A ~200 MiB line (over MAX_LINE_BYTES) is refused without reading it whole into memory several times."""
    from streamtap.recording import MAX_LINE_BYTES

    note = b'{"type":"note","kind":"x","message":"' + b"a" * MAX_LINE_BYTES + b'"}'
    edited = _edited(tmp_path, files, lambda lines: [lines[0], note, *lines[1:]])
    code, mib, err = _peak_rss("verify", edited)
    assert code == 2 and "line 2 (byte" in err and f"longer than {MAX_LINE_BYTES} bytes" in err, err
    assert mib < 1.5 * MAX_LINE_BYTES / 2**20, f"peak RSS {mib} MiB"


def test_verify_memory_does_not_grow_with_the_recording(tmp_path):
    """A 64 MiB recording of events that hold no text (padded pings): verify's peak memory stays
    far below the file's size (before: about 6x it)."""
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message",'
             b'"role":"assistant","model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":1}}}\n\n')  # fmt: skip
    ping = b'event: ping\ndata: {"type":"ping","pad":"%s"}\n\n' % (b"x" * 4000)
    stop = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
            b'"usage":{"output_tokens":9}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')  # fmt: skip
    recording = tmp_path / "pings.jsonl"
    _record(recording, start + ping * (64 * 2**20 // len(ping)) + stop, Dialect.ANTHROPIC, 64 * 1024)
    size_mib = recording.stat().st_size / 2**20
    assert size_mib > 60
    code, mib, err = _peak_rss("verify", recording)
    assert code == 0, err
    assert mib < size_mib / 2, f"peak RSS {mib} MiB for a {size_mib:.0f} MiB recording"


# -- the CLI takes what users hand it (issue 10.2) --------------------------------------------------


def test_directories_are_judged_recursively_in_name_order_and_a_partial_recording_as_incomplete(files, tmp_path):
    root = tmp_path / "captures"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    body = files["reasoning"].read_bytes()
    _record(root / "a" / "flow.jsonl", body, Dialect.OPENAI_CHAT, 500)
    _record(root / "a" / "killed.partial.jsonl", body[: len(body) // 2], Dialect.OPENAI_CHAT, 500, finish=False)
    (root / "b" / "chat.sse").symlink_to(files["chat"])
    (root / "z.sse").symlink_to(files["gemini"])
    (root / "notes.md").write_text("# not a stream file: a directory contributes recordings and stream bodies only\n")
    os.mkfifo(root / "b" / "pipe.sse")  # not a regular file: never read (it would block), but said (exit 2)
    expected = [root / "a" / "flow.jsonl", root / "a" / "killed.partial.jsonl", root / "b" / "chat.sse", root / "z.sse"]
    result = streamtap("verify", root)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == f"streamtap verify: {root / 'b' / 'pipe.sse'}: not a file (a pipe, socket or device)\n"
    lines = result.stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [str(p) for p in expected]
    assert ": complete (" in lines[0] and ": complete (" in lines[2] and ": complete (" in lines[3]
    assert ": unknown (openai-chat)" in lines[1] and "(recording: recording incomplete at byte" in lines[1]
    shown = streamtap("show", root)
    assert shown.returncode == 2, shown.stderr
    positions = [shown.stdout.index(f"{p}  (") for p in expected]
    assert positions == sorted(positions)


def test_a_partial_recording_killed_before_its_header_was_out_is_judged_incomplete(files, tmp_path):
    whole = tmp_path / "whole.jsonl"
    _record(whole, files["reasoning"].read_bytes(), Dialect.OPENAI_CHAT, 500)
    empty = tmp_path / "20260130T061502.123Z_openai-chat_3f2a9c0e1b7d.partial.jsonl"
    empty.write_bytes(b"")
    cut = tmp_path / "20260130T061503.123Z_openai-chat_3f2a9c0e1b7e.partial.jsonl"
    cut.write_bytes(whole.read_bytes()[:40])
    result = streamtap("verify", empty, cut)
    assert result.returncode == 1, result.stdout + result.stderr
    first, second = result.stdout.splitlines()
    assert first.startswith(f"{empty}: unknown") and "recording incomplete at byte 0: the file is empty" in first
    assert second.startswith(f"{cut}: unknown") and "recording incomplete at byte 0: the header line is cut" in second


def test_an_unreadable_path_is_said_on_its_own_line_and_the_others_are_still_judged(files, tmp_path):
    root = tmp_path / "captures"
    root.mkdir()
    (root / "a.sse").symlink_to(files["chat"])
    (root / "gone.sse").symlink_to(tmp_path / "deleted.sse")  # a dangling link: listed, not readable
    (root / "z.sse").symlink_to(files["gemini"])
    for verb in ("verify", "show"):
        result = streamtap(verb, root, tmp_path / "missing.sse")
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.splitlines() == [
            f"streamtap {verb}: {root / 'gone.sse'}: cannot read: No such file or directory",
            f"streamtap {verb}: {tmp_path / 'missing.sse'}: no such file",
        ]
        assert str(root / "a.sse") in result.stdout and str(root / "z.sse") in result.stdout
    if os.geteuid() != 0:  # root reads a file whatever its mode
        locked = tmp_path / "locked.sse"
        locked.write_bytes(files["chat"].read_bytes())
        locked.chmod(0)
        result = streamtap("verify", locked, files["chat"])
        assert result.returncode == 2 and "cannot read: Permission denied" in result.stderr
        assert result.stdout.startswith(f"{files['chat']}: complete")


def test_provider_rejudges_a_recording_as_that_dialect(files, tmp_path):
    recording = tmp_path / "chat.jsonl"
    _record(recording, files["chat"].read_bytes(), Dialect.OPENAI_CHAT, 300)
    as_recorded = streamtap("verify", recording)
    assert as_recorded.returncode == 0 and "(openai-chat)" in as_recorded.stdout
    same = streamtap("verify", "--provider", "openai-chat", recording)
    assert same.returncode == 0 and same.stdout == as_recorded.stdout
    other = streamtap("verify", "--provider", "openai-responses", recording)
    assert other.returncode == 1, other.stdout + other.stderr
    assert "(openai-responses, --provider, the recording says openai-chat)" in other.stdout
    assert ": complete (" not in other.stdout and "judging its bytes again" not in other.stdout
    shown = streamtap("show", "--json", "--provider", "anthropic", recording)
    assert orjson.loads(shown.stdout)["dialect"] == "anthropic"


def test_a_sentinel_other_than_the_proxys_is_judged_not_called_a_contradiction(tmp_path):
    """`verify --sentinel` on a recording whose proxy had none, or another, asks another question
    than the proxy did: the verdict answers it (exit 1 when not complete), and the recording does
    not contradict its bytes for that. Asked the proxy's question, a forged end line is still found."""
    import provider_streams

    body = provider_streams.openai_chat(["The answer.", "\nTHE END"])
    none, other = tmp_path / "none.jsonl", tmp_path / "other.jsonl"
    _record(none, body, Dialect.OPENAI_CHAT, 100)
    _record(other, body, Dialect.OPENAI_CHAT, 100, sentinel="NOT THIS")  # truncated: sentinel missing
    missing = streamtap("verify", "--json", "--sentinel", "ELSEWHERE", none)
    judged = orjson.loads(missing.stdout)
    assert missing.returncode == 1 and judged["verdict"]["reason"] == "sentinel missing", missing.stdout
    assert judged["problem"] is None, judged["problem"]
    found = streamtap("verify", "--sentinel", "THE END", other)
    assert found.returncode == 0 and f"{other}: complete (" in found.stdout, found.stdout + found.stderr
    assert "recording:" not in found.stdout

    forged = tmp_path / "forged.jsonl"  # the end line says complete, the proxy's sentinel says truncated
    forged.write_bytes(other.read_bytes().replace(b'"kind":"truncated"', b'"kind":"complete"'))
    for asked in ([], ["--sentinel", "NOT THIS"]):
        result = streamtap("verify", *asked, forged)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "the recording says complete, judging its bytes again says truncated" in result.stdout, result.stdout


def test_a_file_that_is_not_a_stream_is_said_so(tmp_path):
    readme = Path(__file__).resolve().parents[1] / "README.md"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(random.Random(7).randbytes(3000))
    result = streamtap("verify", readme, junk)
    assert result.returncode == 2 and result.stdout == ""
    assert [line.split(": not a stream: ")[0] for line in result.stderr.splitlines()] == [
        f"streamtap verify: {readme}", f"streamtap verify: {junk}"
    ]
    forced = streamtap("verify", "--provider", "openai-chat", readme)  # the user insists: judged, not complete
    assert forced.returncode == 1 and forced.stdout.startswith(f"{readme}: truncated (openai-chat)")


def test_show_writes_what_a_terminal_would_act_on_as_escapes(tmp_path):
    """The answer is the model's text: an ESC sequence (colour, window title, clipboard), a CR or a
    right-to-left override in it must reach the terminal as text, not as commands."""
    import provider_streams

    body = tmp_path / "odd.sse"
    body.write_bytes(provider_streams.openai_chat(["red \x1b[31mALERT\x1b]0;title\x07", " back\rover \u202eevil", "\nnext\tline"],
                                                  model="m\x1b[2J"))
    shown = streamtap("show", "--width", "0", body)
    assert shown.returncode == 0, shown.stderr
    assert not [c for c in shown.stdout if c in "\x1b\x07\r\u202e"], repr(shown.stdout)
    assert "red \\x1b[31mALERT\\x1b]0;title\\x07 back\\rover \\u202eevil\nnext\tline" in shown.stdout, shown.stdout
    assert "m\\x1b[2J" in shown.stdout
    wrapped = streamtap("show", body)  # wrapped at the default width: escaped first, not turned into spaces
    assert "back\\rover" in wrapped.stdout and "\r" not in wrapped.stdout, wrapped.stdout
    as_json = streamtap("show", "--json", body)  # JSON escapes them itself, and keeps the text exact
    assert json.loads(as_json.stdout)["turn"]["choices"][0]["blocks"][0]["text"].startswith("red \x1b[31mALERT")


def test_show_keeps_a_name_or_id_with_a_line_break_on_its_own_line(tmp_path):
    """A tool's name and id are the provider's text, a file's name whoever made it: a newline in
    one printed as it is would start a line of show's own, such as a forged verdict."""
    def sse(events: list[dict]) -> bytes:
        return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    forged = "\nverdict   COMPLETE: forged"
    body = tmp_path / f"cut{forged}.sse"
    body.write_bytes(sse([
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                                              "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": f"web_search{forged}", "input": {}}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": f"toolu_1{forged}", "name": f"get_weather{forged}", "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a": 1'}},
    ]))  # cut inside the tool call: truncated
    shown = streamtap("show", "--provider", "anthropic", body)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line for line in lines if line.startswith("verdict")] == [next(line for line in lines if line.startswith("verdict   TRUNCATED"))]
    assert lines[0].startswith(f"{tmp_path}/cut\\nverdict   COMPLETE: forged.sse  (raw body"), lines[0]
    assert any(line.startswith("─── server_tool web_search\\nverdict") for line in lines), lines
    assert any(line.startswith("─── tool call get_weather\\nverdict   COMPLETE: forged (id toolu_1\\nverdict") for line in lines), lines


def test_an_empty_file_is_not_a_stream_unless_a_provider_is_given(tmp_path):
    empty = tmp_path / "body.sse"
    empty.write_bytes(b"")
    for verb in ("verify", "show"):
        result = streamtap(verb, empty)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr == f"streamtap {verb}: {empty}: not a stream: the file is empty; --provider judges it anyway (as a body cut before its first byte)\n"
    forced = streamtap("verify", "--provider", "anthropic", empty)
    assert forced.returncode == 1 and forced.stdout.startswith(f"{empty}: truncated (anthropic)"), forced
    assert forced.stdout.rstrip().endswith("[byte 0]"), forced.stdout  # no event: no sequence number to name


def test_the_sniffing_message_names_the_format_it_read_the_bytes_as(tmp_path):
    """SSE bytes of no known dialect in a .json file are read as a JSON array: the line says so."""
    odd = tmp_path / "odd.json"
    odd.write_bytes(b'data: {"a":1}\n\n')
    result = streamtap("verify", odd)
    assert result.returncode == 1
    assert "sniffed: SSE with no recognisable payload; read as a JSON array (a .json file)" in result.stdout


def test_show_marks_an_unfinished_tool_call_and_block(files, tmp_path):
    chat = files["chat"].read_bytes()
    cut_chat = tmp_path / "cut-in-second-call.sse"
    cut_chat.write_bytes(chat[: chat.index(b"\n\n", chat.index(b'"osto"')) + 2])  # after '{"location": "Bosto'
    out = streamtap("show", cut_chat).stdout
    first, second = out.split("─── tool call get_current_weather")[1:]
    assert "UNFINISHED" not in first and "San Francisco" in first
    assert "UNFINISHED" in second.splitlines()[0] and "Bosto" in second
    assert "UNFINISHED" not in streamtap("show", files["chat"]).stdout
    thinking = files["anthropic"].read_bytes()
    cut_text = tmp_path / "cut-in-answer.sse"
    cut_text.write_bytes(thinking[: thinking.index(b"\n\n", thinking.index(b"text_delta")) + 2])
    shown = streamtap("show", cut_text).stdout
    assert any(line.startswith("─── answer") and "UNFINISHED" in line for line in shown.splitlines()), shown
    assert not any(line.startswith("─── thinking") and "UNFINISHED" in line for line in shown.splitlines()), shown


REAL_RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "anthropic.jsonl"


def _deep(levels: int) -> list:
    """Nested deeper than orjson writes (255), as an end line can be."""
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def _turn_edited(change):
    """An edit of the end line's turn (the hashes cover the bytes, not the end line)."""

    def edit(lines: list[bytes]) -> list[bytes]:
        end = orjson.loads(lines[-1])
        change(end["turn"])
        return [*lines[:-1], json.dumps(end, separators=(",", ":")).encode()]  # json: orjson writes 255 levels at most

    return edit


@pytest.mark.parametrize("change, says", [
    (lambda turn: turn.update(model="cheap-model"), 'the recording\'s turn has model "cheap-model", its bytes give "anthropic/claude-sonnet-4.5"'),
    (lambda turn: turn["usage"]["raw"].update(completion_tokens=3), "the recording's turn has usage.raw.completion_tokens 3, its bytes give 36"),
    (lambda turn: turn.update(stop_reason_raw="length"), 'has stop reason "length", its bytes give "stop"'),
    (lambda turn: turn["choices"][0]["blocks"][1].update(text="2 + 2 = 5"), 'has choice 0, block 1: text "2 + 2 = 5", its bytes give "2 + 2 = 4"'),
    (lambda turn: turn["choices"][0]["blocks"].pop(0), "has choice 0: blocks 1, its bytes give 2"),
    (lambda turn: turn["usage"].update(output=999999), "the recording's turn has usage.output 999999, its bytes give 36"),  # what the index counts
    (lambda turn: turn["usage"].pop("reasoning"), "the recording's turn has usage.reasoning none, its bytes give 13"),
    (lambda turn: turn["choices"].append(turn["choices"][0]), "has choices 2, its bytes give 1"),
    (lambda turn: turn.update(model=_deep(300)), "the recording's turn has model [[["),
], ids=["model", "usage", "stop-reason", "text", "block-dropped", "normalised-usage", "usage-member-lost", "choice-added", "deep"])  # fmt: skip
def test_verify_finds_an_end_line_whose_turn_its_bytes_do_not_give(files, tmp_path, change, says):
    """report and index take a turn's model and usage from the end line, which no hash covers:
    verify assembles the turn from the bytes again and names the first fact that differs."""
    edited = _edited(tmp_path, files, _turn_edited(change))
    result = streamtap("verify", edited)
    assert result.returncode == 1 and says in result.stdout, (result.stdout, result.stderr)
    assert "complete" in result.stdout  # the verdict itself stands: the turn's record is what is wrong


def _chat_with_arguments(size: int, finish: str) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}

    def chunk(delta: dict, finish_reason: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}) + b"\n\n"

    arguments = orjson.dumps({"data": "y" * size}).decode()
    call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "w", "arguments": ""}}
    pieces = [chunk({"role": "assistant"}), chunk({"tool_calls": [call]})]
    pieces += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[i : i + 64000]}}]})
               for i in range(0, len(arguments), 64000)]  # fmt: skip
    return b"".join([*pieces, chunk({}, finish), b"data: [DONE]\n\n"])


def test_arguments_the_writer_kept_only_the_start_of_are_no_turn_difference(tmp_path):
    """Beyond ARGUMENTS_CAP the proxy keeps a call's first characters and counts the rest; verify
    keeps them all. A turn that stopped at its limit is judged the same by both, so the turns are
    compared: the kept start must match, and only an edit of it is a difference."""
    recording = tmp_path / "long.jsonl"
    _record(recording, _chat_with_arguments(ARGUMENTS_CAP + 1000, "length"), Dialect.OPENAI_CHAT, 1 << 20)
    result = streamtap("verify", recording)
    assert "stopped_by_limit" in result.stdout and "turn has" not in result.stdout, result.stdout

    def edit(turn):
        block = turn["choices"][0]["blocks"][0]
        assert block["extra"]["arguments_dropped_chars"] > 0  # the case under test
        block["arguments_raw"] = block["arguments_raw"][:100] + "z" + block["arguments_raw"][101:]

    lines = recording.read_bytes().split(b"\n")[:-1]
    recording.write_bytes(b"\n".join(_turn_edited(edit)(lines)) + b"\n")
    result = streamtap("verify", recording)
    assert "turn has choice 0, block 0: arguments_raw 4194304 characters, from character 100: \"z" in result.stdout, result.stdout


def another_wire_hash(lines: list[bytes]) -> list[bytes]:
    """The body was not content-encoded: its wire bytes are the body's, and so is their hash."""
    end = orjson.loads(lines[-1])
    end["wire_sha256"] = hashlib.sha256(b"other bytes").hexdigest()
    return [*lines[:-1], orjson.dumps(end)]


def reads_renamed(lines: list[bytes]) -> list[bytes]:
    """A reads line whose type was damaged: the network reads are gone."""
    return [line.replace(b'"type":"reads"', b'"type":"peads"') for line in lines]


@pytest.mark.parametrize("edit, says", [
    (another_wire_hash, "wire sha256 differs from the body's"),
    (reads_renamed, "the file holds no network reads"),
], ids=["wire-hash", "reads-lost"])
def test_verify_finds_damage_that_leaves_every_line_well_formed(tmp_path, edit, says):
    lines = REAL_RECORDING.read_bytes().splitlines()
    edited = edit(lines)
    assert edited != lines
    recording = tmp_path / "damaged.jsonl"
    recording.write_bytes(b"\n".join(edited) + b"\n")
    assert streamtap("verify", REAL_RECORDING).returncode == 0
    result = streamtap("verify", recording)
    assert result.returncode == 1 and says in result.stdout + result.stderr, (result.stdout, result.stderr)


def test_the_exit_codes_help_gives_for_damage_are_the_ones_verify_returns(tmp_path):
    """--help said exit 2 for 'a damaged recording'; one whose frame does not check out is judged
    unknown, exit 1, and only one whose lines break the format is exit 2."""
    good = Path(__file__).resolve().parents[1] / "recordings" / "anthropic.jsonl"
    lines = good.read_bytes().splitlines(keepends=True)
    frame = next(i for i, line in enumerate(lines) if line.startswith(b'{"type":"frame"') and b'"sum":"' in line)
    at = lines[frame].index(b'"sum":"') + 7
    flipped = tmp_path / "flipped.jsonl"
    flipped.write_bytes(b"".join(lines[:frame] + [lines[frame][:at] + (b"0" if lines[frame][at:at + 1] != b"0" else b"1")
                                                  + lines[frame][at + 1:]] + lines[frame + 1:]))
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join(lines[:frame] + [b"not json\n"] + lines[frame + 1:]))
    helped = subprocess.run([STREAMTAP, "verify", "--help"], capture_output=True, text=True).stdout
    helped = " ".join(helped.split())
    assert "does not check out" in helped and "judged unknown, saying why: exit 1" in helped
    checked = subprocess.run([STREAMTAP, "verify", flipped], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 1 and ": unknown (" in checked.stdout, checked.stdout + checked.stderr
    unreadable = subprocess.run([STREAMTAP, "verify", broken], capture_output=True, text=True, timeout=60)
    assert unreadable.returncode == 2 and "cannot read recording" in unreadable.stderr, unreadable.stderr
