"""A stream cut inside a tool call keeps the arguments that came, as Chat Completions and
Responses already did: the turn, the recording's end line and show hold them, marked as not
parsed, never as a call without arguments."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import provider_streams as streams
from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import EventStreamDecoder

ARGS = {"city": "Paris"}


def tool_call(analysis):
    [block] = [b for b in analysis.turn.choices[0].blocks if b.kind == "tool_call"]
    return block


def anthropic_cut_before_the_calls_stop(events: list[dict], count: int) -> bytes:
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop" and e["index"] == 2)
    return b"".join(streams._sse(e["type"], e) for e in events[: stop - 2 + count])


@pytest.mark.parametrize("fragments, kept", [(2, json.dumps(ARGS)), (1, json.dumps(ARGS)[: len(json.dumps(ARGS)) // 2])])
def test_anthropic_keeps_the_fragments_of_a_cut_tool_call(fragments, kept):
    body = anthropic_cut_before_the_calls_stop(streams.anthropic_events("t", "x", ARGS), fragments)
    for size in (None, 1):
        analysis = analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=size)
        assert analysis.verdict.kind is VerdictKind.TRUNCATED
        call = tool_call(analysis)
        assert call.arguments_raw == kept and not call.closed and call.arguments_error


def test_bedrock_invoke_keeps_them_too():
    body = streams.bedrock_invoke("t", "x", ARGS)
    decoder = EventStreamDecoder()
    messages = decoder.feed(body)
    cut = messages[11].end  # message_start .. the tool call's second fragment, before its stop
    analysis = analyze_bytes(body[:cut], Dialect.BEDROCK_INVOKE)
    assert analysis.verdict.kind is VerdictKind.TRUNCATED
    assert tool_call(analysis).arguments_raw == json.dumps(ARGS)


def test_converse_keeps_the_first_fragment():
    body = streams.bedrock_converse(["Hello"], ARGS)
    messages = EventStreamDecoder().feed(body)
    cut = messages[4].end  # up to the tool call's first fragment
    analysis = analyze_bytes(body[:cut], Dialect.BEDROCK_CONVERSE)
    assert analysis.verdict.kind is VerdictKind.TRUNCATED
    assert tool_call(analysis).arguments_raw == json.dumps(ARGS)[:5]


def test_show_prints_them_as_not_parsed(tmp_path):
    path = tmp_path / "cut.sse"
    path.write_bytes(anthropic_cut_before_the_calls_stop(streams.anthropic_events("t", "x", ARGS), 2))
    got = subprocess.run([sys.executable, "-m", "streamtap.cli", "show", str(path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert "NOT PARSED" in got.stdout and json.dumps(ARGS) in got.stdout and "INVALID JSON" not in got.stdout
