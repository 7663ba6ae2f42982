"""Anthropic Messages streams: real captures, constructed edge cases, cuts, and the official SDK as the reference.

Expected verdicts come from the stream itself read independently (the last
``message_delta`` stop reason, whether ``message_stop`` was dispatched) mapped through
the outcome table of ../shared/docs/provider-streams.md §3.4; the blocks and their
content are checked against what the anthropic SDK's own stream accumulator
(``client.messages.stream(...).get_final_message()``) makes of the same bytes, served
over loopback HTTP.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from pathlib import Path
from typing import Any

import anthropic
import pytest
import yaml
from conftest import FIXTURES, chunked, shared_files

from streamtap.providers import (
    BlockKind,
    Dialect,
    RequestInfo,
    StreamEnd,
    VerdictKind,
    analyze_bytes,
    detect_dialect,
    sniff_dialect,
)
from streamtap.providers.anthropic import Assembler
from streamtap.wire import SSEDecoder
from streamtap.wire.eventstream import encode_message

# §3.4 of the provider notes: stop_reason -> outcome (pause_turn: our documented choice)
DOC_OUTCOME = {
    "end_turn": "complete",
    "stop_sequence": "complete",
    "tool_use": "complete",
    "max_tokens": "stopped_by_limit",
    "model_context_window_exceeded": "stopped_by_limit",
    "pause_turn": "stopped_by_limit",
    "refusal": "filtered",
}

SDK_KIND = {
    "text": BlockKind.TEXT,
    "thinking": BlockKind.THINKING,
    "redacted_thinking": BlockKind.REDACTED_THINKING,
    "tool_use": BlockKind.TOOL_CALL,
    "server_tool_use": BlockKind.SERVER_TOOL,
    "mcp_tool_use": BlockKind.SERVER_TOOL,
    "mcp_tool_result": BlockKind.SERVER_TOOL,
}


# -- loopback server the SDKs talk to --------------------------------------------------------
class LoopbackServer:
    """Serves one configurable body to every POST, on 127.0.0.1 and a free port."""

    def __init__(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("content-length") or 0))
                owner.paths.append(self.path)
                body = owner.body
                self.send_response(owner.status)
                self.send_header("content-type", owner.content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.body = b""
        self.status = 200
        self.content_type = "text/event-stream"
        self.paths: list[str] = []
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, body: bytes, content_type: str, status: int = 200) -> None:
        self.body, self.content_type, self.status = body, content_type, status

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def loopback():
    server = LoopbackServer()
    yield server
    server.stop()


def sdk_final_message(loopback: LoopbackServer, body: bytes) -> anthropic.types.Message:
    loopback.serve(body, "text/event-stream")
    client = anthropic.Anthropic(api_key="test-key", base_url=loopback.url, max_retries=0)
    with client.messages.stream(model="claude-test", max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        return stream.get_final_message()


def assert_turn_matches_sdk(turn, message) -> None:
    """The SDK's final message is the reference: blocks, text, thinking, tool input, stop reason, usage."""
    ours = turn.blocks
    assert len(ours) == len(message.content), ([b.kind for b in ours], [c.type for c in message.content])
    for block, content in zip(ours, message.content, strict=True):
        expected_kind = SDK_KIND.get(content.type)
        if expected_kind is None:
            expected_kind = BlockKind.SERVER_TOOL if content.type.endswith("_tool_result") else BlockKind.OTHER
        assert block.kind is expected_kind, (block.kind, content.type)
        if content.type == "text":
            assert block.text == content.text
            assert len(block.citations) == len(content.citations or [])
        elif content.type == "thinking":
            assert block.text == content.thinking
            assert block.signature == content.signature
        elif content.type == "redacted_thinking":
            assert block.data == content.data
        elif content.type in ("tool_use", "server_tool_use", "mcp_tool_use"):
            assert (block.id, block.name) == (content.id, content.name)
            # the SDK parses partial JSON for UI, so only a closed block compares; and its (non-beta)
            # accumulator tracks input for tool_use and server_tool_use only, not mcp_tool_use
            if block.closed and content.type != "mcp_tool_use":
                assert block.arguments == content.input
    assert turn.stop_reason_raw == message.stop_reason
    usage = message.usage
    assert turn.usage.input == usage.input_tokens
    assert turn.usage.output == usage.output_tokens
    assert turn.usage.cache_read == usage.cache_read_input_tokens
    assert turn.usage.cache_write == usage.cache_creation_input_tokens
    assert turn.model == message.model
    assert turn.response_id == message.id


# -- reading a stream independently, for the expected verdict ---------------------------------
def dispatched_events(body: bytes) -> tuple[list[dict], bool]:
    """Data objects of the events a blank line dispatched, and whether the body ended on one."""
    text = body.decode().replace("\r\n", "\n")
    parts = text.split("\n\n")
    events = []
    for part in parts[:-1]:
        data = [line[5:].lstrip(" ") for line in part.split("\n") if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events, parts[-1].strip() == ""


def expected_verdict(events: list[dict], ended_cleanly: bool) -> str:
    types = [e["type"] for e in events]
    if "error" in types:
        return "errored"
    if not ended_cleanly or not types or types[-1] != "message_stop":
        return "truncated"
    outcomes = []
    stop = None
    for event in events:
        if event["type"] == "message_start":
            stop = event["message"].get("stop_reason")
        elif event["type"] == "message_delta":
            stop = event["delta"].get("stop_reason") or stop
        elif event["type"] == "message_stop":
            outcomes.append(DOC_OUTCOME[stop])
    bad = [o for o in outcomes if o != "complete"]
    return bad[0] if bad else "complete"


def reframe(chunks_file: Path) -> bytes:
    """A payload-only chunk list re-framed as Anthropic SSE (constructed framing)."""
    out = []
    for line in chunks_file.read_bytes().splitlines():
        if line.strip():
            name = json.loads(line)["type"]
            out.append(b"event: " + name.encode() + b"\ndata: " + line + b"\n\n")
    return b"".join(out)


def cassette_bodies() -> list[tuple[str, bytes, RequestInfo, str | None]]:
    """Anthropic SSE response bodies inside the VCR cassettes, with their request and content type."""
    found = []
    for path in shared_files("*/cassettes/**/*.yaml"):
        if "anthropic" not in str(path.relative_to(FIXTURES)):
            continue
        for i, interaction in enumerate(yaml.safe_load(path.read_text())["interactions"]):
            request, response = interaction["request"], interaction["response"]
            body = (response.get("body") or {}).get("string")
            if isinstance(body, str) and "event: message_start" in body and "/v1/messages" in request["uri"]:
                sent = request.get("parsed_body") or json.loads(request.get("body") or "{}")
                info = RequestInfo(request["method"], request["uri"], {}, json.dumps(sent).encode())
                content_type = (response.get("headers") or {}).get("content-type", [None])[0]
                found.append((f"{path.relative_to(FIXTURES)}#{i}", body.encode(), info, content_type))
    return found


RAW_SSE = sorted(set(shared_files("*/bodies/**/anthropic*.sse") + shared_files("pydantic-ai/bodies/anthropic/*.sse")))
SDK_TXT = shared_files("anthropic-sdk-python/**/*.txt") + shared_files("anthropic-sdk-python/**/*.sse")
VERCEL = [p for p in shared_files("vercel-ai/anthropic/**/*.chunks.txt") if "synthetic" not in p.parts]
CASSETTES = cassette_bodies()


ABSENT = "../shared/fixtures is absent: the real captures live beside a development or CI clone only"


def or_absent(items: list, width: int = 1, ids: list[str] | None = None) -> list:
    """Parameters, or one parameter that skips saying why (instead of pytest's 'empty parameter set')."""
    if items:
        return [pytest.param(*(item if width > 1 else (item,)), id=i) for item, i in zip(items, ids, strict=True)]
    return [pytest.param(*([None] * width), marks=pytest.mark.skip(reason=ABSENT), id="shared-absent")]


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(FIXTURES)) for p in paths]


def _need(items: list) -> None:
    if not items:
        pytest.skip(ABSENT)


# -- real captures -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", or_absent(RAW_SSE + SDK_TXT, ids=_ids(RAW_SSE + SDK_TXT)))
def test_raw_capture_verdict_and_blocks_match_the_sdk(path: Path, loopback: LoopbackServer) -> None:
    body = path.read_bytes()
    assert sniff_dialect(body).dialect is Dialect.ANTHROPIC
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    events, ended_cleanly = dispatched_events(body)
    assert analysis.turn.dialect is Dialect.ANTHROPIC
    assert analysis.verdict.kind.value == expected_verdict(events, ended_cleanly), analysis.verdict
    assert_turn_matches_sdk(analysis.turn, sdk_final_message(loopback, body))


def test_sdk_fixtures_without_final_blank_line_are_truncated() -> None:
    """The SDK's test fixtures end right after the last ``data:`` line: per the SSE rules that
    event (message_stop) is never dispatched - the SDK's own decoder drops it too - so the
    stream has no terminal signal. Decided: truncated, with the unfinished bytes as evidence."""
    files = shared_files("anthropic-sdk-python/**/*.txt")
    _need(files)
    for path in files:
        analysis = analyze_bytes(path.read_bytes(), Dialect.ANTHROPIC)
        assert analysis.verdict.kind is VerdictKind.TRUNCATED, (path.name, analysis.verdict)
        assert analysis.verdict.evidence.get("tail_bytes"), analysis.verdict
        assert b"message_stop" in path.read_bytes()[analysis.verdict.offset:]


def test_max_tokens_capture_keeps_the_cut_tool_call_raw() -> None:
    """The real capture cut by max_tokens inside tool input: the tool block never closes.
    Completed with its blank line (constructed), it is stopped_by_limit and the
    arguments stay raw, unparsed, with the reason."""
    path = FIXTURES / "anthropic-sdk-python/streaming/incomplete_partial_json_response.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    analysis = analyze_bytes(path.read_bytes() + b"\n\n", Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.STOPPED_BY_LIMIT, analysis.verdict
    tool = analysis.turn.tool_calls()[0]
    assert tool.closed is False and tool.arguments is None
    assert tool.arguments_raw.startswith('{"filename": "taxes.txt')
    assert "max_tokens" in tool.arguments_error


@pytest.mark.parametrize("stop_reason, kind", [("max_tokens", VerdictKind.STOPPED_BY_LIMIT), ("end_turn", VerdictKind.CORRUPT)])
def test_a_cut_tool_block_the_provider_stopped_is_judged_by_the_stop_reason_that_follows(stop_reason, kind) -> None:
    """The same capture with the tool block stopped before the stop reason, as fine-grained tool
    streaming sends it: still the limit's cut, not corruption; after a normal stop, corrupt."""
    path = FIXTURES / "anthropic-sdk-python/streaming/incomplete_partial_json_response.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = path.read_bytes().replace(b"event: message_delta", b'event: content_block_stop\ndata: {"type":"content_block_stop",'
                                     b'"index":1}\n\nevent: message_delta').replace(b'"max_tokens"', f'"{stop_reason}"'.encode())
    analysis = analyze_bytes(body + b"\n\n", Dialect.ANTHROPIC)
    verdict = analysis.verdict
    assert verdict.kind is kind, verdict
    if kind is VerdictKind.STOPPED_BY_LIMIT:
        assert verdict.evidence["cut_tool_calls"] == [[0, 1]], verdict
    else:
        assert "invalid argument JSON" in verdict.reason and body[verdict.offset:].startswith(b"event: content_block_stop")
    assert analysis.turn.tool_calls()[0].arguments_raw.startswith('{"filename": "taxes.txt')


def answer_with_message_start_stop_reason(delta: dict) -> bytes:
    def event(kind: str, data: dict) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
               "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
    return (event("message_start", {"message": message})
            + event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            + event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Paris."}})
            + event("content_block_stop", {"index": 0})
            + event("message_delta", {"delta": delta, "usage": {"output_tokens": 2}})
            + event("message_stop", {}))


@pytest.mark.parametrize("delta", [{"stop_reason": None, "stop_sequence": None}, {}])
def test_a_stop_reason_from_message_start_withdrawn_by_message_delta_is_corrupt(delta, loopback: LoopbackServer) -> None:
    """A compatible server's message_start that already names the stop reason: the SDK copies
    message_delta's (null or absent) over it, so the app's message ends with none."""
    body = answer_with_message_start_stop_reason(delta)
    assert sdk_final_message(loopback, body).stop_reason is None
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "no stop reason" in verdict.reason, verdict
    again = answer_with_message_start_stop_reason({"stop_reason": "end_turn"})  # the same one again withdraws nothing
    assert analyze_bytes(again, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("name, body, request_info, content_type",
                         or_absent(CASSETTES, width=4, ids=[c[0] for c in CASSETTES]))
def test_cassette_bodies(name: str, body: bytes, request_info: RequestInfo, content_type: str | None,
                         loopback: LoopbackServer) -> None:
    detection = detect_dialect(request_info, content_type)
    assert (detection.dialect, detection.wire) == (Dialect.ANTHROPIC, "sse"), detection
    analysis = analyze_bytes(body, detection.dialect)
    events, ended_cleanly = dispatched_events(body)
    assert analysis.verdict.kind.value == expected_verdict(events, ended_cleanly), analysis.verdict
    assert_turn_matches_sdk(analysis.turn, sdk_final_message(loopback, body))


@pytest.mark.parametrize("path", or_absent(VERCEL, ids=_ids(VERCEL)))
def test_vercel_chunks_reframed(path: Path, loopback: LoopbackServer) -> None:
    """Constructed framing (``event: <type>`` + ``data: <line>``) around real payloads."""
    body = reframe(path)
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    events, ended_cleanly = dispatched_events(body)
    assert analysis.verdict.kind.value == expected_verdict(events, ended_cleanly), analysis.verdict
    starts = sum(1 for e in events if e["type"] == "message_start")
    if starts == 1:
        assert_turn_matches_sdk(analysis.turn, sdk_final_message(loopback, body))
    else:
        # several responses back to back (multi-step recordings): every message's blocks, in order,
        # and the last message's stop reason. The SDK accumulator is not a reference here: it
        # keeps indexing the first message's content list.
        expected = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        prefilled = [c["type"] for e in events if e["type"] == "message_start" for c in e["message"]["content"]]
        assert len(analysis.turn.blocks) == len(expected) + len(prefilled)
        assert {b.extra.get("message", 0) for b in analysis.turn.blocks} <= set(range(starts))
        last_delta = [e for e in events if e["type"] == "message_delta"][-1]
        assert analysis.turn.stop_reason_raw == last_delta["delta"]["stop_reason"]


def test_synthetic_edge_cases() -> None:
    """Hand-written vendor files, not ground truth: what streamtap decides, and why."""
    base = FIXTURES / "vercel-ai/anthropic/synthetic"
    if not base.exists():
        pytest.skip(f"{base} is absent")
    # a second message_start while a tool call is mid-arguments: two streams spliced together
    spliced = analyze_bytes(reframe(base / "spliced-message-start.chunks.txt"), Dialect.ANTHROPIC)
    assert spliced.verdict.kind is VerdictKind.CORRUPT
    assert spliced.verdict.seq == 7 and "spliced" in spliced.verdict.reason
    assert spliced.verdict.evidence["first_id"] == "msg_first"
    assert spliced.verdict.evidence["second_id"] == "msg_second"
    assert spliced.verdict.evidence["open_blocks"] == [1]
    # the same message_start twice before any content is harmless: tolerated, noted
    duplicate = analyze_bytes(reframe(base / "duplicate-message-start.chunks.txt"), Dialect.ANTHROPIC)
    assert duplicate.verdict.kind is VerdictKind.COMPLETE
    assert duplicate.turn.text() == "Hello, World!"
    assert any("repeated" in n for n in duplicate.turn.notes)
    # refusal without content: filtered, with the provider's stop details kept
    refusal = analyze_bytes(reframe(base / "anthropic-refusal.chunks.txt"), Dialect.ANTHROPIC)
    assert refusal.verdict.kind is VerdictKind.FILTERED
    assert refusal.turn.extra["stop_details"]["category"] == "cyber"
    # an advisor result that itself says max_tokens is the tool's business, not the turn's
    advisor = analyze_bytes(reframe(base / "anthropic-advisor-stop-reasons.chunks.txt"), Dialect.ANTHROPIC)
    assert advisor.verdict.kind is VerdictKind.COMPLETE
    assert [b.kind for b in advisor.turn.blocks] == [BlockKind.SERVER_TOOL] * 4
    assert advisor.turn.blocks[1].extra["content"]["stop_reason"] == "max_tokens"
    # a model-fallback marker block is kept whole as 'other', never mixed into the answer
    fallback = analyze_bytes(reframe(base / "anthropic-fallback.chunks.txt"), Dialect.ANTHROPIC)
    assert fallback.verdict.kind is VerdictKind.COMPLETE
    assert fallback.turn.blocks[0].kind is BlockKind.OTHER and fallback.turn.blocks[0].extra["type"] == "fallback"
    assert fallback.turn.text() == "The printing press was invented by Johannes Gutenberg around 1440."


# -- constructed from the provider notes (labelled constructed) --------------------------------
def sse(*events: dict) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events
    )


START = {"type": "message_start", "message": {"id": "msg_c1", "type": "message", "role": "assistant",
                                              "model": "claude-constructed", "content": [], "stop_reason": None,
                                              "stop_sequence": None, "usage": {"input_tokens": 12,
                                                                               "output_tokens": 1}}}


def text_block(index: int, *pieces: str) -> list[dict]:
    return [{"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
              for p in pieces),
            {"type": "content_block_stop", "index": index}]


def tool_block(index: int, *fragments: str, name: str = "get_weather") -> list[dict]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": f}} for f in fragments),
            {"type": "content_block_stop", "index": index}]


def thinking_block(index: int, thought: str, signature: str) -> list[dict]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
            {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": thought}},
            {"type": "content_block_delta", "index": index,
             "delta": {"type": "signature_delta", "signature": signature}},
            {"type": "content_block_stop", "index": index}]


def end(stop_reason: str, output_tokens: int = 40) -> list[dict]:
    return [{"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
             "usage": {"output_tokens": output_tokens}}, {"type": "message_stop"}]


THINK_TEXT_TOOL = sse(START, *thinking_block(0, "Weather needs the tool.", "sig-A"), {"type": "ping"},
                      *text_block(1, "Let me ", "check."),
                      *tool_block(2, "", '{"location": "San Fra', 'ncisco, CA", "days": 1', "2}"),
                      *text_block(3, "Done."), *end("tool_use", 89))


def test_constructed_thinking_text_tool_matches_the_sdk(loopback: LoopbackServer) -> None:
    analysis = analyze_bytes(THINK_TEXT_TOOL, Dialect.ANTHROPIC)
    turn = analysis.turn
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    assert [b.kind for b in turn.blocks] == [BlockKind.THINKING, BlockKind.TEXT, BlockKind.TOOL_CALL, BlockKind.TEXT]
    assert turn.thinking() == "Weather needs the tool." and turn.blocks[0].signature == "sig-A"
    assert turn.blocks[1].text == "Let me check." and turn.blocks[3].text == "Done."  # two text blocks stay two
    tool = turn.tool_calls()[0]
    assert tool.arguments_raw == '{"location": "San Francisco, CA", "days": 12}'  # the bare value 12 came as 1 + 2
    assert tool.arguments == {"location": "San Francisco, CA", "days": 12}
    assert_turn_matches_sdk(turn, sdk_final_message(loopback, THINK_TEXT_TOOL))


def test_thinking_is_routed_by_block_type_not_position() -> None:
    """Constructed: the answer block comes first and thinking second; each keeps its own kind."""
    body = sse(START, *text_block(0, "Answer."), *thinking_block(1, "Afterthought.", "sig"), *end("end_turn"))
    turn = analyze_bytes(body, Dialect.ANTHROPIC).turn
    assert turn.text() == "Answer." and turn.thinking() == "Afterthought."


def test_overloaded_error_mid_stream_is_errored(loopback: LoopbackServer) -> None:
    """Constructed from the documented in-band error example, after some text."""
    body = sse(START, text_block(0, "Partial")[0], text_block(0, "Partial")[1],
               {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.ERRORED
    assert "overloaded_error" in analysis.verdict.reason and "Overloaded" in analysis.verdict.reason
    assert analysis.verdict.seq == 3
    assert analysis.turn.error["type"] == "overloaded_error"
    assert analysis.turn.text() == "Partial"
    # the SDK agrees that this stream failed
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        sdk_final_message(loopback, body)


@pytest.mark.parametrize("stop_reason, kind", [
    ("max_tokens", VerdictKind.STOPPED_BY_LIMIT),
    ("model_context_window_exceeded", VerdictKind.STOPPED_BY_LIMIT),
    ("pause_turn", VerdictKind.STOPPED_BY_LIMIT),
    ("refusal", VerdictKind.FILTERED),
    ("stop_sequence", VerdictKind.COMPLETE),
    ("a_new_reason", VerdictKind.UNKNOWN),
])
def test_constructed_stop_reasons(stop_reason: str, kind: VerdictKind) -> None:
    analysis = analyze_bytes(sse(START, *text_block(0, "Some text"), *end(stop_reason)), Dialect.ANTHROPIC)
    assert analysis.verdict.kind is kind, analysis.verdict
    assert analysis.turn.stop_reason_raw == stop_reason


PREFILLED = {**START, "message": {**START["message"], "content": [
    {"type": "tool_use", "id": "toolu_p", "name": "get_weather", "input": {"city": "Paris"}}]}}


@pytest.mark.parametrize("event", [
    {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"city": "Berlin"}'}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_stop", "index": 0},
], ids=["delta", "start", "stop"])
def test_a_block_that_arrived_whole_in_message_start_is_closed(event: dict, loopback: LoopbackServer) -> None:
    """Content pre-filled in message_start (programmatic tool calling) is whole: a later delta grows
    the SDK's tool input past what was recorded, so any event for that block is corrupt."""
    whole = analyze_bytes(sse(PREFILLED, *end("tool_use")), Dialect.ANTHROPIC)
    assert whole.verdict.kind is VerdictKind.COMPLETE and whole.turn.tool_calls()[0].arguments == {"city": "Paris"}
    body = sse(PREFILLED, event, *end("tool_use"))
    if event["type"] == "content_block_delta":
        assert sdk_final_message(loopback, body).content[0].input == {"city": "Berlin"}
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and verdict.seq == 1, verdict
    assert "after block 0 was closed by message_start (content arrived whole)" in verdict.reason, verdict
    assembler, decoder = Assembler(), SSEDecoder()
    for decoded in decoder.feed(sse(PREFILLED)):
        assembler.feed(decoded, None)
    assert assembler.builder.fragments == {}  # nothing more to join: none kept


def test_a_tool_use_stop_needs_a_tool_call_in_its_own_message() -> None:
    """Messages back to back (a multi-step recording): the last message's stop reason tool_use is the
    turn's, and an earlier step's call does not answer it."""
    second = {**START, "message": {**START["message"], "id": "msg_c2"}}
    called = sse(START, *tool_block(0, '{"city": "Paris"}'), *end("tool_use"))
    verdict = analyze_bytes(called + sse(second, *text_block(0, "I will call it."), *end("tool_use")),
                            Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "no tool call arrived in the last of 2 messages" in verdict.reason, verdict
    answered = sse(START, *text_block(0, "Hi."), *end("end_turn")) + sse(second, *tool_block(0, "{}"), *end("tool_use"))
    assert analyze_bytes(answered, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


def test_an_earlier_messages_tool_use_stop_without_its_tool_call_is_corrupt_whatever_follows() -> None:
    """Messages back to back: a step that stops for a tool call it never sent is corrupt on its own,
    and a clean step after it does not make the body complete."""
    second = {**START, "message": {**START["message"], "id": "msg_c2"}}
    uncalled = sse(START, *text_block(0, "Let me check."), *end("tool_use"))
    clean = sse(second, *text_block(0, "It is sunny."), *end("end_turn"))
    assert analyze_bytes(uncalled, Dialect.ANTHROPIC).verdict.kind is VerdictKind.CORRUPT
    verdict = analyze_bytes(uncalled + clean, Dialect.ANTHROPIC, chunk_size=7).verdict
    assert verdict.kind is VerdictKind.CORRUPT and verdict.evidence["messages"] == 2, verdict
    assert "earlier message in this stream ended with stop_reason tool_use" in verdict.reason, verdict
    assert "that message holds no tool call" in verdict.reason, verdict
    called = sse(START, *tool_block(0, '{"city": "Paris"}'), *end("tool_use"))
    assert analyze_bytes(called + clean, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


def test_a_limit_in_the_last_message_does_not_excuse_an_earlier_messages_broken_tool_call() -> None:
    """Messages back to back: the last one's max_tokens cut only its own blocks; a tool call of an
    earlier message, which ended normally, whose arguments do not parse is corrupt."""
    second = {**START, "message": {**START["message"], "id": "msg_c2"}}
    broken = sse(START, *tool_block(0, '{"city": "Par'), *end("tool_use"))
    verdict = analyze_bytes(broken + sse(second, *text_block(0, "And then"), *end("max_tokens")), Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "get_weather" in verdict.reason, verdict
    cut_last = sse(START, *text_block(0, "Hi."), *end("end_turn")) + sse(second, *tool_block(0, '{"city": "Par'), *end("max_tokens"))
    verdict = analyze_bytes(cut_last, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.STOPPED_BY_LIMIT and verdict.evidence["cut_tool_calls"] == [[0, 1]], verdict


def test_message_delta_without_message_stop_is_truncated() -> None:
    body = sse(START, *text_block(0, "All of it."), end("end_turn")[0])
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.TRUNCATED
    assert "message_stop" in verdict.reason


@pytest.mark.parametrize("events, words, seq", [
    ([START, text_block(0)[0], {"type": "content_block_delta", "index": 5,
                                "delta": {"type": "text_delta", "text": "x"}}], "unknown index 5", 2),
    ([START, text_block(0, "x")[0], text_block(0, "x")[1], *end("end_turn")], "never stopped", 4),
    ([START, *tool_block(0, '{"a": '), *end("tool_use")], "invalid argument JSON", 3),
    ([START, text_block(0)[0], {"type": "content_block_delta", "index": 0,
                                "delta": {"type": "input_json_delta", "partial_json": "{}"}}], "does not fit", 2),
    ([START, *text_block(0, "x"), {"type": "content_block_stop", "index": 0}],
         "content_block_stop at seq 4 (byte", 4),
    ([text_block(0)[0]], "before message_start", 0),
    ([START, *text_block(0, "a"), *end("end_turn"), *text_block(1, "late")],
         "after the message was closed by message_stop at seq 5", 6),
])
def test_corrupt_streams_name_the_event(events: list[dict], words: str, seq: int) -> None:
    verdict = analyze_bytes(sse(*events), Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert words in verdict.reason
    assert verdict.seq == seq
    assert verdict.offset == sse(*events[:seq]).__len__()


def test_bad_event_json_is_corrupt() -> None:
    body = sse(START) + b"event: content_block_start\ndata: {\"type\": \"content_block_start\", \n\n" + sse(*end("end_turn"))
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and verdict.seq == 1 and "JSON" in verdict.reason


def test_empty_tool_arguments_mean_an_empty_object() -> None:
    turn = analyze_bytes(sse(START, *tool_block(0, ""), *end("tool_use")), Dialect.ANTHROPIC).turn
    assert turn.tool_calls()[0].arguments == {} and turn.tool_calls()[0].arguments_raw == ""


def test_usage_is_overwritten_by_the_cumulative_message_delta() -> None:
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 30, "input_tokens": 61, "cache_read_input_tokens": 5}}
    turn = analyze_bytes(sse(START, *text_block(0, "x"), {**delta, "usage": {"output_tokens": 10}}, delta,
                             {"type": "message_stop"}), Dialect.ANTHROPIC).turn
    assert (turn.usage.input, turn.usage.output, turn.usage.cache_read) == (61, 30, 5)


# -- cuts: never complete ----------------------------------------------------------------------
def cut_points(body: bytes, events: list, samples: int = 40) -> list[int]:
    boundaries = {e.end for e in events if e.end < len(body)}
    step = max(1, len(body) // samples)
    inside = set(range(1, len(body), step))
    return sorted(boundaries | inside | {0})


CUT_BODIES = ["openllmetry/bodies/anthropic_tools_stream.0.sse",
              "pydantic-ai/bodies/anthropic/test_anthropic_model_thinking_part_redacted_stream.0.sse",
              "pydantic-ai/bodies/anthropic/test_anthropic_code_execution_tool_stream.0.sse"]


@pytest.mark.parametrize("name", ["constructed", *CUT_BODIES])
def test_cut_anywhere_is_never_complete(name: str) -> None:
    if name == "constructed":
        body = THINK_TEXT_TOOL
    else:
        path = FIXTURES / name
        if not path.exists():
            pytest.skip(f"{path} is absent")
        body = path.read_bytes()
    decoder = SSEDecoder()
    events = decoder.feed(body) + decoder.close()
    assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
    for cut in cut_points(body, events):
        for end_kind in (StreamEnd.FINISHED, StreamEnd.UPSTREAM_RESET):
            verdict = analyze_bytes(body[:cut], Dialect.ANTHROPIC, end=end_kind).verdict
            assert verdict.kind in (VerdictKind.TRUNCATED, VerdictKind.CORRUPT), (cut, verdict)


def test_any_chunking_gives_the_same_turn() -> None:
    whole = analyze_bytes(THINK_TEXT_TOOL, Dialect.ANTHROPIC)
    for size in (1, 7, 64):
        split = analyze_bytes(THINK_TEXT_TOOL, Dialect.ANTHROPIC, chunk_size=size)
        assert split.turn.to_dict() == whole.turn.to_dict()
        assert split.verdict.to_dict() == whole.verdict.to_dict()


def test_assembler_alone_follows_the_protocol() -> None:
    """The Assembler works without a session: events in, (turn, verdict) out."""
    decoder = SSEDecoder()
    assembler = Assembler()
    for piece in chunked(THINK_TEXT_TOOL, 50):
        for event in decoder.feed(piece):
            assembler.feed(event, 0.5)
    turn, verdict = assembler.finish(StreamEnd.FINISHED)
    assert verdict.ok and turn.timing.first_content == 0.5 and turn.events == THINK_TEXT_TOOL.count(b"\n\n")


# -- fail open: odd shapes never raise ------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
BASE_EVENTS = [json.loads(line[6:]) for line in THINK_TEXT_TOOL.decode().split("\n") if line.startswith("data: ")]


def mutated(events: list[dict], data: st.DataObject) -> list[dict]:
    out = [json.loads(json.dumps(e)) for e in events]
    for _ in range(data.draw(st.integers(1, 4))):
        event = out[data.draw(st.integers(0, len(out) - 1))]
        target = event
        for key in ("delta", "content_block", "message", "usage"):
            if isinstance(event.get(key), dict) and data.draw(st.booleans()):
                target = event[key]
                break
        key = data.draw(st.sampled_from(sorted(target) + ["index", "type"]))
        target[key] = data.draw(JSON_VALUES)
    return out


@settings(max_examples=80)
@given(st.data())
def test_odd_event_shapes_never_raise(data: st.DataObject) -> None:
    events = mutated(BASE_EVENTS, data)
    assembler = Assembler()
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    for event in SSEDecoder().feed(body):
        assembler.feed(event, None)
    turn, verdict = assembler.finish(StreamEnd.FINISHED)
    assert isinstance(verdict.kind, VerdictKind) and verdict.reason
    turn.to_dict()


def test_unknown_block_types_are_kept_whole() -> None:
    """Constructed: a block type this version does not model (compaction) with its own delta."""
    body = sse(START, {"type": "content_block_start", "index": 0,
                       "content_block": {"type": "compaction", "content": None}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": "Sum"}},
               {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": "mary"}},
               {"type": "content_block_stop", "index": 0}, *text_block(1, "Hi"), *end("end_turn"))
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    other = analysis.turn.blocks[0]
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    assert (other.kind, other.text, other.extra["type"]) == (BlockKind.OTHER, "Summary", "compaction")
    assert analysis.turn.text() == "Hi"  # never mixed into the answer


def test_an_unmodelled_deltas_other_fields_are_kept_apart_from_its_text() -> None:
    """A compaction delta with its summary and its encrypted_content: the SDK keeps them apart, and
    the turn showed them glued into one text (the note said they were in extra)."""
    body = sse(START, {"type": "content_block_start", "index": 0, "content_block": {"type": "compaction", "content": None}},
               {"type": "content_block_delta", "index": 0,
                "delta": {"type": "compaction_delta", "content": "Summary.", "encrypted_content": "EpwB0paque"}},
               {"type": "content_block_stop", "index": 0}, *text_block(1, "Hi"), *end("end_turn"))
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    other = analysis.turn.blocks[0]
    assert (other.text, other.extra["encrypted_content"]) == ("Summary.", "EpwB0paque")
    assert "kept as the block's extra.encrypted_content, text" in " ".join(analysis.turn.notes), analysis.turn.notes


def test_session_timing_comes_from_the_reads() -> None:
    """Fed through StreamSession with arrival times: first content is the read that carried the
    first text, not the message_start."""
    from streamtap.providers import StreamSession

    session = StreamSession(Dialect.ANTHROPIC)
    head = sse(START)
    session.feed(head, 0.25)
    session.feed(THINK_TEXT_TOOL[len(head):], 0.75)
    analysis = session.close()
    assert analysis.verdict.ok
    timing = analysis.turn.timing
    assert (timing.first_byte, timing.first_content, timing.last_byte) == (0.25, 0.75, 0.75)


# -- blocks without a data line: the HTML rules drop them, the SDK dispatches them -------------


@pytest.mark.parametrize(("block", "where"), [(b"event: error\n\n", "middle"), (b"event: error\n\n", "after the end")])
def test_error_event_without_data_is_errored_as_the_sdk_raises(block: bytes, where: str, loopback: LoopbackServer) -> None:
    """The anthropic SDK raises on an ``event: error`` block even with no data line (and it reads
    on after message_stop), so the app sees an error: the verdict is not complete."""
    body = THINK_TEXT_TOOL + block if where == "after the end" else THINK_TEXT_TOOL.replace(
        b"event: content_block_stop", block + b"event: content_block_stop", 1)
    with pytest.raises(anthropic.APIStatusError):
        sdk_final_message(loopback, body)
    for reads in (None, 1, 7):
        analysis = analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=reads)
        assert analysis.verdict.kind is VerdictKind.ERRORED, analysis.verdict
        assert analysis.verdict.offset == body.index(block) + len(block) - 1  # its blank line


@pytest.mark.parametrize("before", [b"event: ping\n\n" * 16, b"event: ping\n\n" * 100, b"id: 1\n\n" + b"\n" * 20],
                         ids=["16-pings", "100-pings", "id-then-20-blank-lines"])
def test_an_error_event_without_data_after_many_others_is_errored_however_the_bytes_are_read(
    before: bytes, loopback: LoopbackServer,
) -> None:
    """Every block without data counts, not only the first few: the SDK raises on the ``event:
    error`` after any number of them, whether the body comes whole, byte by byte or in reads."""
    from streamtap.providers import StreamSession

    block = b"event: error\n\n"
    body = THINK_TEXT_TOOL.replace(b"event: content_block_stop", before + block + b"event: content_block_stop", 1)
    with pytest.raises(anthropic.APIStatusError):
        sdk_final_message(loopback, body)
    where = body.index(before + block) + len(before) + len(block) - 1  # its blank line
    verdicts = [analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=size).verdict for size in (None, len(body), 1, 7)]
    session = StreamSession(Dialect.ANTHROPIC)
    session.feed_reads(chunked(body, 5), [1.0] * len(chunked(body, 5)))
    verdicts.append(session.close().verdict)
    for verdict in verdicts:
        assert (verdict.kind, verdict.offset) == (VerdictKind.ERRORED, where), verdict


def test_blocks_without_data_are_not_kept_past_the_read_that_brought_them() -> None:
    """The session takes the decoder's notes of blocks without data as it feeds them, so a stream
    of many keeps none of them between reads."""
    from streamtap.providers import StreamSession

    session = StreamSession(Dialect.ANTHROPIC)
    session.feed(sse(START) + b"id: 1\n\n")
    for _ in range(100):
        session.feed(b"event: ping\n\n\n")
        assert session._decoder.empty_dispatches == []
    assert session.close().verdict.kind is VerdictKind.TRUNCATED


def test_other_blocks_without_data_are_what_the_sdk_skips(loopback: LoopbackServer) -> None:
    """``event: ping`` or ``id:`` alone, no data line: the SDK dispatches them and skips them."""
    body = THINK_TEXT_TOOL.replace(b"event: content_block_stop", b"event: ping\n\nid: 4\n\n: ka\n\nevent: content_block_stop", 1)
    assert_turn_matches_sdk(analyze_bytes(body, Dialect.ANTHROPIC).turn, sdk_final_message(loopback, body))
    assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE



# -- what the SDK never sees, or reads differently -----------------------------------------------

TEXT_TURN = sse(START, *text_block(0, "Hello"), *end("end_turn"))


def renamed(body: bytes, event_type: str, name: bytes | None) -> bytes:
    """``body`` with the SSE name of its first ``event_type`` event changed (None: no event line)."""
    line = b"event: " + event_type.encode() + b"\n"
    return body.replace(line, b"" if name is None else b"event: " + name + b"\n", 1)


@pytest.mark.parametrize(("event_type", "name"), [
    ("message_delta", b"ping"), ("message_delta", None), ("content_block_delta", b"ping"), ("content_block_start", None),
], ids=["delta-as-ping", "delta-unnamed", "text-as-ping", "start-unnamed"])
def test_an_event_the_sdk_skips_by_its_name_is_corrupt(event_type: str, name: bytes | None, loopback: LoopbackServer) -> None:
    """The SDK skips events named ping or not named, whatever their data: the app's message lacks
    that event (no stop reason, no text, or an IndexError), so the verdict is not complete."""
    body = renamed(TEXT_TURN, event_type, name)
    try:
        message = sdk_final_message(loopback, body)
    except Exception:  # noqa: BLE001 - any SDK failure shows the app did not get the answer
        message = None
    assert message is None or message.stop_reason is None or [b.text for b in message.content] != ["Hello"]
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "the SDK skips" in verdict.reason, verdict


@pytest.mark.parametrize("name", [b"event: ping\n", b"", b"event:\n"], ids=["ping", "unnamed", "empty-name"])
@pytest.mark.parametrize("data", [b"{}", b"keep-alive", b"null", b'{"type": "keepalive"}'],
                         ids=["empty-object", "text", "null", "other-type"])
def test_a_ping_is_a_ping_whatever_its_data(name: bytes, data: bytes, loopback: LoopbackServer) -> None:
    """The SDK skips an event named ping, or without a name, before it reads the data: one that
    carries no event of the message loses the app nothing, so it is read as a ping, like
    ``{"type": "ping"}``."""
    ping = name + b"data: " + data + b"\n\n"
    body = TEXT_TURN.replace(b"event: content_block_stop", ping + b"event: content_block_stop", 1)
    assert sdk_final_message(loopback, body).stop_reason == "end_turn"
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.COMPLETE, verdict
    typed = analyze_bytes(TEXT_TURN + sse({"type": "ping"}), Dialect.ANTHROPIC).verdict  # after the message: as a ping
    assert analyze_bytes(TEXT_TURN + ping, Dialect.ANTHROPIC).verdict.reason == typed.reason


def test_a_later_message_delta_without_stop_reason_withdraws_it_in_the_sdk(loopback: LoopbackServer) -> None:
    withdraw = sse({"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None},
                    "usage": {"output_tokens": 3}})
    body = TEXT_TURN.replace(b"event: message_stop", withdraw + b"event: message_stop", 1)
    assert sdk_final_message(loopback, body).stop_reason is None
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "stop_reason null" in verdict.reason, verdict
    # the SDK's event model gives an absent stop_reason as None too
    withdraw = sse({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 3}})
    body = TEXT_TURN.replace(b"event: message_stop", withdraw + b"event: message_stop", 1)
    assert sdk_final_message(loopback, body).stop_reason is None
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "stop_reason absent" in verdict.reason, verdict


def test_a_message_delta_without_usage_is_corrupt_as_the_sdk_fails_on_it(loopback: LoopbackServer) -> None:
    body = sse(START, *text_block(0, "Hello"), {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
               {"type": "message_stop"})
    with pytest.raises(AttributeError):
        sdk_final_message(loopback, body)
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "without usage" in verdict.reason, verdict


def _without(event: dict, *path: str) -> dict:
    """A deep copy of ``event`` without the field at ``path``."""
    event = json.loads(json.dumps(event))
    *parents, last = path
    holder = event
    for key in parents:
        holder = holder[key]
    del holder[last]
    return event


THINKING_START = {"type": "content_block_start", "index": 0,
                  "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
TEXT_EVENTS = [START, *text_block(0, "Hello")]
THINKING_EVENTS = [START, THINKING_START,
                   {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm."}},
                   {"type": "content_block_stop", "index": 0}, *text_block(1, "Hi")]
SHAPES_THE_HELPER_FAILS_ON = {  # (a complete message's events, which one loses which field, the reason says, raised)
    "message_start without usage": (TEXT_EVENTS, 0, ("message", "usage"), "after a message_start without usage",
                                    AttributeError),
    "message_start without content": (TEXT_EVENTS, 0, ("message", "content"), "has no content list", AttributeError),
    "text block without text": (TEXT_EVENTS, 1, ("content_block", "text"), "without its 'text' string", TypeError),
    "thinking block without thinking": (THINKING_EVENTS, 1, ("content_block", "thinking"),
                                        "without its 'thinking' string", TypeError),
}


@pytest.mark.parametrize("name", SHAPES_THE_HELPER_FAILS_ON)
def test_a_message_the_sdk_stream_helper_fails_on_is_corrupt(loopback: LoopbackServer, name: str) -> None:
    """The SDK's stream helper builds the message on message_start's: it copies message_delta's
    usage onto that usage, appends each block to its content, and adds each delta to the string its
    block started with. Where one is missing it raises; the sibling rule is message_delta without usage."""
    events, which, path, says, raised = SHAPES_THE_HELPER_FAILS_ON[name]
    whole = sse(*events, *end("end_turn"))
    assert sdk_final_message(loopback, whole).stop_reason == "end_turn"
    assert analyze_bytes(whole, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
    body = sse(*events[:which], _without(events[which], *path), *events[which + 1 :], *end("end_turn"))
    with pytest.raises(raised):
        sdk_final_message(loopback, body)
    for size in (None, 1, 7):
        verdict = analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT and says in verdict.reason, (size, verdict)
    # Claude on Bedrock InvokeModel: the same events, each in a chunk (AnthropicBedrock's helper is the same)
    invoke = b"".join(
        encode_message({":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
                       json.dumps({"bytes": base64.b64encode(line[line.index(b"{"):].strip()).decode()}).encode())
        for line in body.split(b"\n\n") if line)
    verdict = analyze_bytes(invoke, Dialect.BEDROCK_INVOKE).verdict
    assert verdict.kind is VerdictKind.CORRUPT and says in verdict.reason, verdict


def test_an_event_named_message_on_its_own_line_is_read_as_the_sdk_reads_it(loopback: LoopbackServer) -> None:
    """Only an event without an event: line is skipped by the SDK; ``event: message`` is read
    (the decoder names both "message")."""
    body = TEXT_TURN.replace(b"event: content_block_delta", b"event: message", 1)
    assert [b.text for b in sdk_final_message(loopback, body).content] == ["Hello"]
    assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
    unnamed = renamed(TEXT_TURN, "content_block_delta", None)
    assert analyze_bytes(unnamed, Dialect.ANTHROPIC).verdict.kind is VerdictKind.CORRUPT


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_the_event_name_is_read_from_the_events_own_lines_whatever_the_line_ends(line_end: bytes, loopback: LoopbackServer) -> None:
    named = TEXT_TURN.replace(b"event: content_block_delta", b"event: message", 1)
    empty = TEXT_TURN.replace(b"event: content_block_delta", b"event:", 1)  # the SDK reads an empty name as none
    assert [b.text for b in sdk_final_message(loopback, empty).content] != ["Hello"]
    for body, kind in ((named, VerdictKind.COMPLETE), (empty, VerdictKind.CORRUPT)):
        body = body.replace(b"\n", line_end)
        verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
        assert verdict.kind is kind, (line_end, body[:60], verdict)


# -- what the SDK reads otherwise: JSON whitespace, a BOM, two events run together ---------------

@pytest.mark.parametrize("whitespace", [" ", "\n", "\t\r\n "], ids=["space", "LF", "mixed"])
def test_tool_input_of_only_json_whitespace_is_corrupt_as_the_sdk_refuses_it(whitespace: str,
                                                                            loopback: LoopbackServer) -> None:
    """The SDK keeps the start input only when the joined partial_json is empty; whitespace it parses, and fails."""
    body = sse(START, *tool_block(0, whitespace), *end("tool_use"))
    with pytest.raises(ValueError, match="tool parameter JSON"):
        sdk_final_message(loopback, body)
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "invalid argument JSON" in analysis.verdict.reason
    call = analysis.turn.tool_calls()[0]
    assert (call.arguments, call.arguments_raw) == (None, whitespace)
    # cut by max_tokens, it is the limit's doing
    assert analyze_bytes(sse(START, *tool_block(0, whitespace), *end("max_tokens")),
                         Dialect.ANTHROPIC).verdict.kind is VerdictKind.STOPPED_BY_LIMIT


@pytest.mark.parametrize("start_input", ["oops", [1], 3])
def test_a_tool_start_input_that_is_no_object_is_corrupt_and_kept_as_the_sdk_hands_it_over(start_input,
                                                                                           loopback: LoopbackServer) -> None:
    """With no fragment after it, the SDK hands the app the start's input as it came: a tool's
    input is an object, so an app's handler gets what it cannot take."""
    start, stop = tool_block(0)
    start["content_block"]["input"] = start_input
    body = sse(START, start, stop, *end("tool_use"))
    assert sdk_final_message(loopback, body).content[0].input == start_input
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "not a JSON object" in analysis.verdict.reason, analysis.verdict
    assert analysis.turn.tool_calls()[0].arguments == start_input
    empty = tool_block(0)  # the usual start input, {}: a tool without parameters
    assert analyze_bytes(sse(START, *empty, *end("tool_use")), Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("first", [b"", b"data-first"], ids=["event-line-first", "data-line-first"])
def test_a_bom_that_hides_the_first_events_line_from_the_sdk_is_corrupt(first: bytes, loopback: LoopbackServer) -> None:
    """The SSE rules drop a UTF-8 BOM at byte 0; the SDK keeps it, reads the first line as a field
    '\\ufeffevent' (or '\\ufeffdata') it ignores, and so loses message_start: get_final_message fails."""
    body = TEXT_TURN
    if first:  # message_start's data line before its event line
        start = sse(START)
        event_line, data_line = start.split(b"\n", 1)
        body = data_line.replace(b"\n\n", b"\n" + event_line + b"\n\n", 1) + body[len(start):]
        assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
        assert sdk_final_message(loopback, body).stop_reason == "end_turn"
    with pytest.raises(AssertionError):
        sdk_final_message(loopback, BOM + body)
    for size in (None, 1, 2, 5):
        verdict = analyze_bytes(BOM + body, Dialect.ANTHROPIC, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT and "BOM" in verdict.reason, (size, verdict)
        assert (verdict.seq, verdict.offset) == (0, 0)


@pytest.mark.parametrize("before", [b": keep-alive\n\n", b"\n", b'event: ping\ndata: {"type": "ping"}\n\n'],
                         ids=["comment", "blank-line", "ping"])
def test_a_bom_before_a_line_the_sdk_does_without_is_harmless(before: bytes, loopback: LoopbackServer) -> None:
    body = BOM + before + TEXT_TURN
    assert [b.text for b in sdk_final_message(loopback, body).content] == ["Hello"]
    assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


def test_a_message_event_run_into_a_ping_by_a_lost_blank_line_is_corrupt(loopback: LoopbackServer) -> None:
    """A blank line lost between a delta and the ping after it makes one event, named by the ping's
    line, whose data is two lines (no one JSON value): the SDK skips it, and the delta's text with it."""
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " world"}}
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    merged = TEXT_TURN.replace(b"event: content_block_stop", sse(delta)[:-1] + ping + b"event: content_block_stop", 1)
    assert [b.text for b in sdk_final_message(loopback, merged).content] == ["Hello"]
    for size in (None, 1, 7):
        verdict = analyze_bytes(merged, Dialect.ANTHROPIC, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT and "content_block_delta merged into" in verdict.reason, verdict


@pytest.mark.parametrize("name", [b"event: ping\n", b""], ids=["ping", "unnamed"])
def test_a_ping_whose_data_lines_hold_no_message_event_is_still_a_ping(name: bytes, loopback: LoopbackServer) -> None:
    odd = TEXT_TURN.replace(b"event: content_block_stop",
                            name + b'data: keep\ndata: {"type": "ping"}\ndata: {}\n\nevent: content_block_stop', 1)
    assert sdk_final_message(loopback, odd).stop_reason == "end_turn"
    assert analyze_bytes(odd, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("usage", [{"output_tokens": None}, {"input_tokens": 3}], ids=["null", "missing"])
def test_an_output_count_sent_null_by_message_delta_leaves_none_as_in_the_sdk(loopback: LoopbackServer, usage) -> None:
    body = sse(START, *text_block(0, "Hello"), {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                                "usage": usage}, {"type": "message_stop"})
    message = sdk_final_message(loopback, body)
    assert message.usage.output_tokens is None
    assert_turn_matches_sdk(analyze_bytes(body, Dialect.ANTHROPIC).turn, message)


def test_a_thinking_block_closed_without_its_signature_keeps_its_verdict_with_a_note(loopback: LoopbackServer) -> None:
    """The API refuses a thinking block sent back without its signature (a tool-use loop sends it
    back): a lost signature_delta shows only later, as the app's next request failing."""
    blocks = thinking_block(0, "hmm", "SIG")
    unsigned = sse(START, *[b for b in blocks if b.get("delta", {}).get("type") != "signature_delta"], *end("end_turn"))
    assert sdk_final_message(loopback, unsigned).content[0].signature == ""
    analysis = analyze_bytes(unsigned, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    assert any("thinking block 0 closed without a signature" in note for note in analysis.turn.notes), analysis.turn.notes
    signed = analyze_bytes(sse(START, *blocks, *end("end_turn")), Dialect.ANTHROPIC)
    assert not any("signature" in note for note in signed.turn.notes)
