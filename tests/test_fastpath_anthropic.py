"""The Anthropic Messages assembler with its delta fast path (text, tool arguments, thinking)
against the same assembler parsing every event: identical turns and verdicts on real captures
(whole and cut) and on generated streams built to hit every rule a skipped parse could miss (a
delta before its block starts or after it stops, after the stop reason or message_stop, into a
block of another kind, a second message, error events, renamed and unnamed events, deltas
with other members, mixed layouts)."""

from __future__ import annotations

import json
import random

import orjson
import pytest
from provider_streams import chunk_objects, sse_spans
from conftest import shared_files
from fastpath_differential import STYLES, FastPath

from streamtap.providers import Dialect, sniff_dialect
from streamtap.providers import anthropic
from streamtap.providers.fastpath import ANTHROPIC, ContentDeltas

ANTHROPIC_DIALECT = Dialect.ANTHROPIC


PATH = FastPath(ANTHROPIC_DIALECT, anthropic.Assembler, "_delta")
judged, assert_same = PATH.judged, PATH.assert_same


def _sse(obj: dict, name: str | None = None) -> bytes:
    return b"event: " + (name or obj["type"]).encode() + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _real_anthropic_bodies() -> dict[str, bytes]:
    bodies = {}
    for path in shared_files("*/bodies/**/*.sse"):
        body = path.read_bytes()
        if sniff_dialect(body).dialect is ANTHROPIC_DIALECT:
            bodies[str(path.relative_to(path.parents[2]))] = body
    for path in shared_files("vercel-ai/anthropic/**/*.chunks.txt"):
        events = chunk_objects(path)
        if events and all(isinstance(event.get("type"), str) for event in events):
            bodies[path.name] = b"".join(map(_sse, events))
    return bodies


def test_real_captures_whole_and_cut_are_judged_alike():
    PATH.assert_captures_alike(_real_anthropic_bodies(), sse_spans, least=100, absent="no Anthropic Messages capture")


# -- generated streams ------------------------------------------------------------------------------
FRAGMENTS = ["Hello", " world", "", 'say "hi"', "back\\slash", "line\nbreak", "é\U0001f600", "\u2028", " ", "x" * 40,
             '"text":"y"', '"}}', '{"a": 1', "}"]
OPS = ["text"] * 6 + ["json"] * 3 + ["thinking"] * 3 + [
    "start_text", "start_tool", "start_thinking", "start_server_tool", "stop", "message_start", "message_delta",
    "message_stop", "ping", "error_event", "error_data", "renamed", "unnamed", "as_ping", "extra_key", "index_bool",
    "index_string", "signature", "citation", "unknown_delta", "text_number", "not_json", "lone_surrogate", "style",
    "other_index"]
DELTAS = {"text": ("text_delta", "text"), "json": ("input_json_delta", "partial_json"),
          "thinking": ("thinking_delta", "thinking")}


def generated_stream(ops: list[tuple[str, int, int]], seed: int) -> bytes:
    """SSE bytes for a sequence of (operation, block index, fragment number)."""
    rng = random.Random(seed)
    styles = STYLES
    style = styles[0]
    out = []

    def delta(index, delta_type, key, value, **extra) -> dict:
        return {"type": "content_block_delta", "index": index, "delta": {"type": delta_type, key: value}, **extra}

    for op, index, number in ops:
        text = FRAGMENTS[number % len(FRAGMENTS)]
        name, obj, raw = None, None, None
        if op in DELTAS:
            obj = delta(index, *DELTAS[op], text)
        elif op == "start_text":
            obj = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        elif op == "start_tool":
            obj = {"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}
        elif op == "start_thinking":
            obj = {"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
        elif op == "start_server_tool":
            obj = {"type": "content_block_start", "index": index,
                   "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}}
        elif op == "stop":
            obj = {"type": "content_block_stop", "index": index}
        elif op == "message_start":
            obj = {"type": "message_start", "message": {
                "id": "msg_gen", "type": "message", "role": "assistant", "content": [], "model": "claude-gen",
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}}
        elif op == "message_delta":
            obj = {"type": "message_delta",
                   "delta": {"stop_reason": rng.choice(["end_turn", "max_tokens", "tool_use"]), "stop_sequence": None},
                   "usage": {"output_tokens": number}}
        elif op == "message_stop":
            obj = {"type": "message_stop"}
        elif op == "ping":
            obj = {"type": "ping"}
        elif op == "error_event":
            obj = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        elif op == "error_data":  # an error event name over a delta's data
            obj, name = delta(index, "text_delta", "text", text), "error"
        elif op == "renamed":  # another event name over a delta's data
            obj, name = delta(index, "text_delta", "text", text), "content_block_start"
        elif op == "unnamed":
            raw = b"data: " + style(delta(index, "text_delta", "text", text)).encode() + b"\n\n"
        elif op == "as_ping":
            obj, name = delta(index, "text_delta", "text", text), "ping"
        elif op == "extra_key":
            obj = delta(index, "text_delta", "text", text, extra=1)
        elif op == "index_bool":
            obj = delta(True, "text_delta", "text", text)
        elif op == "index_string":
            obj = delta(str(index), "text_delta", "text", text)
        elif op == "signature":
            obj = delta(index, "signature_delta", "signature", "sig" + text)
        elif op == "citation":
            obj = delta(index, "citations_delta", "citation", {"type": "web_search_result_location", "url": "u"})
        elif op == "unknown_delta":
            obj = delta(index, "compaction_delta", "content", text)
        elif op == "text_number":
            obj = delta(index, "text_delta", "text", number)
        elif op == "not_json":
            raw = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{\n\n'
        elif op == "lone_surrogate":
            raw = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
                   b'"delta":{"type":"text_delta","text":"a\\ud800b"}}\n\n' % index)
        elif op == "other_index":
            obj = delta(index + 3, "text_delta", "text", text)
        else:  # "style": later events are serialised another way
            style = styles[number % len(styles)]
            continue
        if raw is None:
            raw = b"event: " + (name or obj["type"]).encode() + b"\ndata: " + style(obj).encode() + b"\n\n"
        out.append(raw)
    return b"".join(out)


PROLOGUE = [("message_start", 0, 0), ("start_text", 0, 0), ("text", 0, 0), ("text", 0, 1)]
ENDINGS = {
    "whole": [("stop", 0, 0), ("message_delta", 0, 9), ("message_stop", 0, 0)],
    "no_stop": [("stop", 0, 0), ("message_delta", 0, 9)],
    "none": [],
}


test_generated_streams_are_judged_alike = PATH.generated_streams_test(generated_stream, OPS, PROLOGUE, ENDINGS)


# each one where a skipped parse would miss a rule: the fast path must decline, and the full path judge
TOOL = [("start_tool", 1, 0), ("json", 1, 12), ("json", 1, 13)]  # '{"a": 1' + '}'
THINKING = [("start_thinking", 1, 0), ("thinking", 1, 0), ("thinking", 1, 1)]
ADVERSARIAL = {
    "text after its block stopped": PROLOGUE + [("stop", 0, 0), ("text", 0, 3)] + ENDINGS["whole"],
    "text after the stop reason": PROLOGUE + [("stop", 0, 0), ("message_delta", 0, 9), ("text", 0, 3),
                                              ("message_stop", 0, 0)],
    "text after message_stop": PROLOGUE + ENDINGS["whole"] + [("text", 0, 3)],
    "second message": PROLOGUE + [("message_start", 0, 0), ("text", 0, 3)] + ENDINGS["whole"],
    # (a wrong kind twice: the first, parsed, teaches the layout at its index; the second meets the fast path's check)
    "text into a tool block": PROLOGUE + TOOL + [("text", 1, 3), ("text", 1, 4), ("stop", 1, 0)] + ENDINGS["whole"],
    "arguments into a text block": PROLOGUE + TOOL + [("json", 0, 3), ("json", 0, 4), ("stop", 1, 0)]
                                   + ENDINGS["whole"],
    "arguments after their block stopped": PROLOGUE + TOOL + [("stop", 1, 0), ("json", 1, 3)] + ENDINGS["whole"],
    "thinking into a text block": PROLOGUE + THINKING + [("thinking", 0, 3), ("thinking", 0, 4), ("stop", 1, 0)]
                                  + ENDINGS["whole"],
    "text into a thinking block": PROLOGUE + THINKING + [("text", 1, 3), ("text", 1, 4), ("stop", 1, 0)]
                                  + ENDINGS["whole"],
    "an error event mid-stream": PROLOGUE + [("error_event", 0, 0), ("text", 0, 1)] + ENDINGS["whole"],
    "a delta sent as ping": PROLOGUE + [("as_ping", 0, 1), ("text", 0, 1)] + ENDINGS["whole"],
}


test_adversarial_streams_are_judged_alike = PATH.adversarial_test(generated_stream, ADVERSARIAL)


def test_tool_arguments_and_thinking_take_the_fast_path_too():
    body = generated_stream(PROLOGUE + [("stop", 0, 0)] + TOOL + [("json", 1, 2), ("stop", 1, 0)]
                            + [("start_thinking", 2, 0), ("thinking", 2, 0), ("thinking", 2, 1), ("thinking", 2, 3),
                               ("stop", 2, 0)] + [("message_delta", 0, 9), ("message_stop", 0, 0)], seed=1)
    hits = assert_same(body)
    assert hits == 1 + 2 + 2  # each stream's first delta of a kind is parsed and taught
    _, verdict, _ = judged(body, fast=True)
    assert verdict["kind"] == "complete", verdict


def test_a_delta_is_taken_without_a_parse_and_gives_the_parsed_fragment():
    deltas = ContentDeltas(ANTHROPIC["text_delta"])
    first = '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}'
    assert deltas.learn(first, orjson.loads(first))
    for fragment in ["plain", 'say "hi"', "back\\slash", "line\nbreak", "\u0001", "é\U0001f600", '"}}']:
        data = json.dumps({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": fragment}},
                          separators=(",", ":"))
        assert deltas.content(data) == (0, fragment)
    assert deltas.content(first.replace('"index":0', '"index":1')) is None
    for data in ['{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x","citations":[]}}',
                 '{"type":"content_block_delta","index":true,"delta":{"type":"text_delta","text":"x"}}',
                 '{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"x"}}',
                 '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"},"extra":1}',
                 '{"type":"content_block_start","index":0,"delta":{"type":"text_delta","text":"x"}}']:
        assert not ContentDeltas(ANTHROPIC["text_delta"]).learn(data, orjson.loads(data)), data


def _events(*pairs: tuple[str, str]) -> bytes:
    return b"".join(b"event: " + name.encode() + b"\ndata: " + data.encode() + b"\n\n" for name, data in pairs)


@pytest.mark.parametrize("spelling", ["raw", "escaped"])
def test_a_key_written_twice_teaches_no_layout(spelling):
    """The parse keeps a duplicate key's last value. Where that value was the text learning puts in
    the fragment's place, learning passed on the first key, later events gave the wrong fragment,
    and a tool call's broken arguments came out complete."""
    from streamtap.providers.fastpath import _SENTINEL

    # the sentinel as written, or with its first letter a JSON escape: the same string once parsed
    S = _SENTINEL if spelling == "raw" else "\\u%04x" % ord(_SENTINEL[0]) + _SENTINEL[1:]

    twice = '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"%s","partial_json":"%s"}}'
    body = _events(
        ("message_start", '{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
                          '"content":[],"model":"m","stop_reason":null,"stop_sequence":null,'
                          '"usage":{"input_tokens":1,"output_tokens":1}}}'),
        ("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"tool_use",'
                                '"id":"toolu_1","name":"f","input":{}}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta",'
                                '"partial_json":"{\\"k\\": \\""}}'),
        ("content_block_delta", twice % (S, S)),
        ("content_block_delta", twice % ('\\"}', S)),  # the parse keeps S: the arguments never close
        ("content_block_stop", '{"type":"content_block_stop","index":0}'),
        ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},'
                          '"usage":{"output_tokens":3}}'),
        ("message_stop", '{"type":"message_stop"}'),
    )
    assert assert_same(body) == 0
    _, verdict, _ = judged(body, fast=True)
    assert verdict["kind"] == "corrupt", verdict
    data = twice % (S, S)
    assert not ContentDeltas(ANTHROPIC["input_json_delta"]).learn(data, orjson.loads(data))


def test_a_delta_type_that_is_no_string_is_kept_as_before():
    """Looking its layout up by a list as the delta type raised: the turn stopped at it, unknown."""
    body = generated_stream(PROLOGUE, seed=1) + _events(
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":["x"],"text":"?"}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":{"a":1},"text":"?"}}'),
    ) + generated_stream([("text", 0, 1)] + ENDINGS["whole"], seed=1)
    assert_same(body)
    turn, verdict, _ = judged(body, fast=True)
    assert verdict["kind"] == "complete", verdict
    assert any("not modelled" in note for note in turn["notes"]), turn["notes"]


def test_the_first_content_a_fast_delta_brings_is_timed():
    """An empty first delta teaches the layout; the next, taken by the fast path, is the first
    content, and its read's time the turn's first content."""
    body = generated_stream([("message_start", 0, 0), ("start_text", 0, 0), ("text", 0, 2), ("text", 0, 0)]
                            + ENDINGS["whole"], seed=1)
    assert FRAGMENTS[2] == "" and assert_same(body, chunk_size=5) == 1
    turn, _, _ = judged(body, fast=True, chunk_size=5)
    assert turn["timing"]["first_content"] is not None, turn["timing"]
