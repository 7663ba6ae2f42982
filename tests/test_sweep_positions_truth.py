"""The cut sweep tells the truth about the recording it cuts: each cut is judged as `verify`
judges the recording (its own wire and HTTP status, so a Gemini JSON array is no SSE stream and
an HTTP error no cut 200); a JSON array's cut before its closing `]` is swept; `escaped-quote`
falls after a real escaped quote; `--positions` items off the grammar are refused; and names
for the same cut are one run. Real recordings, real replay servers, real client processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from provider_streams import frame_gemini_array
from replay_streams import openai_chat_frames

from streamtap.providers import StreamSession, analyze_bytes
from streamtap.recording import RecordingWriter
from streamtap.replay.faults import FaultSpecError, parse_fault, plan, protocol_positions
from streamtap.replay.source import Source, load_source
from streamtap.replay.sweep import INCONCLUSIVE, SILENT, recording_problems, run_sweep, sweep_positions
from streamtap.wire import Tail, encode_message

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]
GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent"
CONTENT_TYPES = {"sse": "text/event-stream", "json-array": "application/json", "eventstream": "application/vnd.amazon.eventstream",
                 "ndjson": "application/x-ndjson"}

# an answer that speaks of failures: printed whole, it is the answer, not a client noticing a cut
GEMINI_TEXTS = ("The build failed because", " the linker reported an error", " about a missing symbol.")


def client(path: str, body: bytes, swallowed: str, prints: str) -> str:
    """A stdlib-only client: it asks the replay server for ``path``, keeps what came before any of
    the ``swallowed`` exceptions, prints what ``prints`` makes of ``body`` and exits 0."""
    return f"""
import http.client, json, os, re, urllib.parse
url = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn.request("POST", {path!r}, body={body!r})
try:
    body = conn.getresponse().read()
except ({swallowed}) as exc:
    body = getattr(exc, "partial", b"")
{prints}
"""


# prints every "text" of the JSON array it got
GEMINI_CLIENT = client("/v1beta/models/gemini-2.5-flash:streamGenerateContent", b"{}", "http.client.IncompleteRead,",
                       """texts = re.findall(rb'"text": ?"((?:[^"\\\\]|\\\\.)*)"', body)
print("".join(json.loads(b'"' + text + b'"') for text in texts))""")


def write_decoded_recording(path: Path, body: bytes, dialect: str, wire: str, url: str, status: int = 200) -> Path:
    """A recording of ``body`` written as the Tap writes one: the dialect's own session frames it."""
    writer = RecordingWriter(path)
    writer.header(
        {
            "request": {"method": "POST", "url": url, "headers": [["content-type", "application/json"]], "body": {"stream": True}},
            "response": {"status": status, "headers": [["content-type", CONTENT_TYPES[wire]]]},
            "dialect": dialect,
            "wire": {"format": wire, "content_encoding": None},
        }
    )
    session = StreamSession(dialect, wire, http_status=status)
    events = session.feed(body)
    analysis = session.close()
    for event in events + analysis.events:
        (writer.tail if isinstance(event, Tail) else writer.frame)(event, 0.0)
    writer.reads([body], [0.0])
    verdict = {"kind": str(analysis.verdict.kind), "reason": analysis.verdict.reason}
    writer.finish({"stream_end": "finished", "error": None, "duration_ms": 1, "verdict": verdict})
    return path


def gemini_array_body(texts: tuple[str, ...] = GEMINI_TEXTS) -> bytes:
    lines = []
    for i, text in enumerate(texts):
        candidate = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
        if i == len(texts) - 1:
            candidate["finishReason"] = "STOP"
        lines.append(json.dumps({"candidates": [candidate], "modelVersion": "gemini-2.5-flash"}).encode())
    return frame_gemini_array(lines)


@pytest.fixture
def gemini_array(tmp_path):
    return write_decoded_recording(tmp_path / "gemini-array.jsonl", gemini_array_body(), "gemini", "json-array", GEMINI_URL)


def position_spec(label: str) -> str:
    """The spec of a sweep position's label: ``cut:at=before-terminal (cut:event=21)`` names one cut twice."""
    return label.split(" (", 1)[0]


def verdict_of(source: Source, spec: str) -> str:
    """What `verify` would say of the stream cut at ``spec``: the recording's wire and status."""
    body = plan(source, [parse_fault(spec)]).body
    return str(analyze_bytes(body, source.dialect, wire=source.wire, http_status=source.status).verdict.kind)


# --- 1. each cut judged with the recording's own wire and status -------------------------------


def test_a_gemini_json_array_recording_is_swept_as_a_json_array(gemini_array, tmp_path):
    client = tmp_path / "client.py"
    client.write_text(GEMINI_CLIENT)
    result = subprocess.run(
        [*STREAMTAP, "sweep", str(gemini_array), "--positions", "events,protocol", "--styles", "clean", "--no-progress",
         "--json", "-", "--jobs", "2", "--timeout", "15", "--", sys.executable, "-S", str(client)],
        capture_output=True, text=True, timeout=240,
    )
    assert "already" not in result.stderr and "warning" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    source = load_source(gemini_array)
    assert report["baseline"]["verdict"] == "complete" and report["baseline"]["outcome"] == SILENT, report["baseline"]
    for run in report["runs"]:
        assert run["verdict"] == verdict_of(source, position_spec(run["position"])), run
    # the answer is found, so the error words inside it are no noticing: every cut is silently accepted
    assert {run["outcome"] for run in report["runs"]} == {SILENT}, [(r["position"], r["outcome"]) for r in report["runs"]]
    assert report["counts"][INCONCLUSIVE] == 0 and not report["baseline_failed"] and result.returncode == 1


def test_an_http_error_recording_is_judged_errored_not_already_cut(tmp_path):
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    path = write_decoded_recording(tmp_path / "http529.jsonl", body, "anthropic", "sse", "https://api.anthropic.com/v1/messages", status=529)
    source = load_source(path, check=True)
    assert source.status == 529
    [problem] = recording_problems(source)  # an error answer, not a stream already cut
    assert problem.startswith("served uncut, its stream is an error answer (errored)"), problem
    report = asyncio.run(run_sweep(source, ["true"], positions=["cut:byte=10"], styles=("clean",), timeout=15))
    assert report.baseline.verdict == "errored"
    [run] = report.runs
    assert run.verdict == verdict_of(source, "cut:byte=10"), run


# --- 2. the cut before a JSON array's closing bracket ------------------------------------------


def test_the_cut_before_a_json_arrays_closing_bracket_is_swept_and_judged_truncated(gemini_array):
    source = load_source(gemini_array)
    body = source.body
    assert body.endswith(b"]") and verdict_of(source, "cut:byte=0") == "truncated"
    labels = sweep_positions(source)
    served = {position_spec(label): plan(source, [parse_fault(position_spec(label))]).body for label in labels}
    [without_bracket] = [spec for spec, cut in served.items() if cut == body[:-1]]
    assert without_bracket == "cut:at=before-terminal" and verdict_of(source, without_bracket) == "truncated"
    last = sum(1 for frame in source.frames if frame.seq is not None) - 1
    assert sweep_positions(source, f"event={last}") == [f"cut:event={last}"]  # it cuts the bracket: no longer refused
    assert plan(source, [parse_fault(f"cut:event={last}")]).body == body[:-1]
    # an SSE stream's last event still ends its body: that is no cut
    sse = Source.from_frames(openai_chat_frames(words=4), wire="sse", dialect="openai-chat")
    sse_last = len(openai_chat_frames(words=4)) - 1
    with pytest.raises(FaultSpecError, match="nothing would be cut"):
        sweep_positions(sse, f"event={sse_last}")


# --- 3. escaped-quote after a real escaped quote -----------------------------------------------


def _chat_chunk(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def escaped_quote_offset(source: Source) -> int:
    [offset] = [offset for name, offset, _what in protocol_positions(source) if name == "escaped-quote"]
    return offset


def test_escaped_quote_is_not_an_escaped_backslash_before_a_closing_quote():
    frames = [
        _chat_chunk({"role": "assistant", "content": ""}),
        _chat_chunk({"content": "Saved to C:\\temp\\"}),  # JSON: "Saved to C:\\temp\\" then the closing quote
        _chat_chunk({"content": ' as "report".'}),
        _chat_chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]
    source = Source.from_frames(frames, wire="sse", dialect="openai-chat")
    body = source.body
    assert escaped_quote_offset(source) == body.index(b'\\"report') + 2


def _bedrock_message(event_type: str, payload: bytes) -> bytes:
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload)


def test_escaped_quote_is_never_found_in_an_event_stream_messages_binary_framing():
    # a message 0x5C22 bytes long has the bytes of `\"` in its length prelude: 00 00 5C 22
    framing = len(_bedrock_message("messageStart", b""))
    payload = b'{"role":"assistant","p":"' + b"x" * (0x5C22 - framing - len(b'{"role":"assistant","p":""}')) + b'"}'
    first = _bedrock_message("messageStart", payload)
    assert len(first) == 0x5C22 and first[2:4] == b'\\"'
    body = first + b"".join(
        [
            _bedrock_message("contentBlockDelta", json.dumps({"contentBlockIndex": 0, "delta": {"text": 'It is "sunny".'}}).encode()),
            _bedrock_message("contentBlockStop", b'{"contentBlockIndex":0}'),
            _bedrock_message("messageStop", b'{"stopReason":"end_turn"}'),
        ]
    )
    source = Source.from_frames(_split_messages(body), wire="eventstream", dialect="bedrock-converse")
    assert escaped_quote_offset(source) == body.index(b'\\"sunny') + 2


def _split_messages(body: bytes) -> list[bytes]:
    messages, at = [], 0
    while at < len(body):
        length = int.from_bytes(body[at : at + 4], "big")
        messages.append(body[at : at + length])
        at += length
    return messages


# --- 4. --positions items off the grammar -------------------------------------------------------


@pytest.mark.parametrize(
    "item, message",
    [
        ("events=5", "'events=5': events takes no value (for one cut: event=N)"),
        ("events=oops", "'events=oops': events takes no value"),
        ("protocol=tool-args", "'protocol=tool-args': protocol takes no value (for one cut: at=NAME)"),
        ("bytes=", "'bytes=' needs a count: bytes=K"),
        ("event", "'event' needs a value: event=N"),
    ],
)
def test_a_positions_item_off_the_grammar_is_refused(item, message):
    source = Source.from_frames(openai_chat_frames(words=4), wire="sse", dialect="openai-chat")
    with pytest.raises(FaultSpecError) as refused:
        sweep_positions(source, f"events,{item}")
    assert message in str(refused.value)


def test_the_cli_refuses_a_positions_value_in_one_line_before_any_run(gemini_array, tmp_path):
    ran = tmp_path / "ran"
    marker = tmp_path / "marker.py"
    marker.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = subprocess.run(
        [*STREAMTAP, "sweep", str(gemini_array), "--positions", "events=5", "--", sys.executable, "-S", str(marker)],
        capture_output=True, text=True, timeout=120,
    )
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and "events takes no value" in line, result.stderr
    assert not ran.exists()


# --- 5. one run per distinct cut -----------------------------------------------------------------


def test_names_for_the_same_cut_are_one_position_with_both_names():
    source = Source.from_frames(openai_chat_frames(words=4), wire="sse", dialect="openai-chat")
    labels = sweep_positions(source)
    served = [plan(source, [parse_fault(position_spec(label))]).body for label in labels]
    assert len(set(served)) == len(served), "a cut served twice"
    terminal = protocol_positions(source, only="before-terminal")[0][1]
    [event] = [f"cut:event={n}" for n in range(-1, 20) if served_length(source, f"cut:event={n}") == terminal]
    assert f"cut:at=before-terminal ({event})" in labels and event not in labels
    assert sweep_positions(source, f"{event.removeprefix('cut:')},at=before-terminal") == [f"cut:at=before-terminal ({event})"]
    report = asyncio.run(run_sweep(source, ["true"], positions=[f"cut:at=before-terminal ({event})"], styles=("clean",), timeout=15))
    [run] = report.runs
    assert run.spec == "cut:at=before-terminal,style=clean" and report.to_dict()["runs"][0]["spec"] == run.spec


def served_length(source: Source, spec: str) -> int | None:
    try:
        return len(plan(source, [parse_fault(spec)]).body)
    except FaultSpecError:
        return None


# --- 4. an abort or a reset is no clean end --------------------------------------------------

# prints the text of every line it got, even of a body that broke off
OLLAMA_CLIENT = client("/api/chat", b'{"model": "qwen3", "messages": []}', "http.client.IncompleteRead, ConnectionError",
                       """print("".join(json.loads(line)["message"]["content"] for line in body.splitlines() if line.strip()))""")


def test_a_cut_that_keeps_the_last_line_but_not_its_end_is_judged_by_how_the_body_ended(tmp_path):
    """The ollama client (and google-genai) reads a last line without its line end only where the
    body ended cleanly: cut there with an abort or a reset, the app did not get the answer it
    printed whole, and a client that swallows the error took a partial answer silently."""
    lines = [{"model": "qwen3", "created_at": f"2025-01-01T00:00:0{i}Z", "message": {"role": "assistant", "content": text},
              "done": False} for i, text in enumerate(["The sky ", "is blue."])]
    lines.append({"model": "qwen3", "created_at": "2025-01-01T00:00:03Z", "message": {"role": "assistant", "content": ""},
                  "done": True, "done_reason": "stop", "eval_count": 2})
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    source = load_source(write_decoded_recording(tmp_path / "ollama.jsonl", body, "ollama", "ndjson",
                                                 "http://localhost:11434/api/chat"))
    spec = f"cut:byte={len(body) - 1}"
    report = asyncio.run(run_sweep(source, [sys.executable, "-c", OLLAMA_CLIENT], positions=[spec],
                                   styles=("clean", "abort", "reset"), timeout=15))
    verdicts = {run.style: (run.verdict, run.outcome) for run in report.runs}
    assert verdicts["clean"][0] == "complete", verdicts  # read whole: the cut cost the app nothing
    assert verdicts["abort"] == verdicts["reset"] == ("truncated", SILENT), verdicts

