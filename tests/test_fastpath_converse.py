"""The ConverseStream assembler with its text-delta fast path against the same assembler parsing
every event: identical turns and verdicts on real captures (whole and cut) and on generated
streams built to hit every rule a skipped parse could miss (a delta before its block starts or
after it stops, outside the message, after the metadata, into a tool or reasoning block, a
second message, an exception frame, deltas botocore's model refuses, mixed layouts)."""

from __future__ import annotations

import json
import random

import orjson
import pytest
from provider_streams import chunk_objects
from conftest import shared_files
from fastpath_differential import STYLES, FastPath

from streamtap.providers import Dialect, bedrock_converse, sniff_dialect
from streamtap.providers.fastpath import CONVERSE, ContentDeltas
from streamtap.wire import EventStreamDecoder, encode_message

CONVERSE_DIALECT = Dialect.BEDROCK_CONVERSE


PATH = FastPath(CONVERSE_DIALECT, bedrock_converse.Assembler, "_text_delta")
judged, assert_same = PATH.judged, PATH.assert_same


def message(kind: str, payload: bytes, message_type: str = "event") -> bytes:
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": message_type}
    if message_type == "exception":
        headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return encode_message(headers, payload)


def frame_spans(body: bytes) -> list[tuple[int, int]]:
    decoder = EventStreamDecoder()
    return [(e.start, e.end) for e in decoder.feed(body) + decoder.close() if hasattr(e, "headers")]


def _real_converse_bodies() -> dict[str, bytes]:
    bodies = {}
    for path in shared_files("*/bodies/**/converse_stream*.bin"):
        body = path.read_bytes()
        if sniff_dialect(body).dialect is CONVERSE_DIALECT:
            bodies[path.name] = body
    for path in shared_files("vercel-ai/amazon-bedrock/**/*.chunks.txt"):
        objects = chunk_objects(path)  # each line one event: {"<type>": {payload}}
        events = [next(iter(obj.items())) for obj in objects if len(obj) == 1]
        if events and len(events) == len(objects) and all(isinstance(payload, dict) for _, payload in events):
            bodies[path.name] = b"".join(  # as Bedrock sends them: each event padded with "p"
                message(kind, json.dumps({**payload, "p": "abcdefgh"[: 1 + n % 8]}, separators=(",", ":")).encode())
                for n, (kind, payload) in enumerate(events)
            )
    return bodies


def test_real_captures_whole_and_cut_are_judged_alike():
    PATH.assert_captures_alike(_real_converse_bodies(), frame_spans, least=50, absent="no ConverseStream capture")


# -- generated streams ------------------------------------------------------------------------------
FRAGMENTS = ["Hello", " world", "", 'say "hi"', "back\\slash", "line\nbreak", "é\U0001f600", "\u2028", " ", "x" * 40,
             '"text":"y"', '","p":"']
OPS = ["text"] * 10 + ["start_text", "start_empty", "start_tool", "tool_delta", "reasoning", "stop", "message_start",
                       "message_stop", "metadata", "exception", "two_members", "extra_key", "index_bool", "no_padding",
                       "padding_null", "padding_quote", "delta_text_number", "not_json", "lone_surrogate", "nan",
                       "invalid_utf8", "style", "other_index", "string_index"]


def generated_stream(ops: list[tuple[str, int, int]], seed: int) -> bytes:
    """Event-stream bytes for a sequence of (operation, block index, fragment number)."""
    rng = random.Random(seed)
    styles = STYLES
    style = styles[0]
    out = []

    def padded(obj: dict, number: int) -> dict:
        return {**obj, "p": "abcdefghijklmnop"[: 1 + (number * 7) % 16]}

    for op, index, number in ops:
        text = FRAGMENTS[number % len(FRAGMENTS)]
        kind, obj, raw = "contentBlockDelta", None, None
        if op == "text":
            obj = padded({"contentBlockIndex": index, "delta": {"text": text}}, number)
        elif op == "start_text":  # ConverseStream never starts a text block, but a stream may
            kind, obj = "contentBlockStart", padded({"contentBlockIndex": index, "start": {}}, number)
        elif op == "start_empty":
            kind, obj = "contentBlockStart", {"contentBlockIndex": index, "start": {}}
        elif op == "start_tool":
            kind = "contentBlockStart"
            obj = padded({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}}, number)
        elif op == "tool_delta":
            obj = padded({"contentBlockIndex": index, "delta": {"toolUse": {"input": '{"a":1}'}}}, number)
        elif op == "reasoning":
            obj = padded({"contentBlockIndex": index, "delta": {"reasoningContent": {"text": text or "r"}}}, number)
        elif op == "stop":
            kind, obj = "contentBlockStop", padded({"contentBlockIndex": index}, number)
        elif op == "message_start":
            kind, obj = "messageStart", padded({"role": "assistant"}, number)
        elif op == "message_stop":
            kind, obj = "messageStop", padded({"stopReason": rng.choice(["end_turn", "max_tokens", "tool_use"])}, number)
        elif op == "metadata":
            kind = "metadata"
            obj = padded({"usage": {"inputTokens": 3, "outputTokens": number, "totalTokens": 3 + number},
                          "metrics": {"latencyMs": 5}}, number)
        elif op == "exception":
            out.append(message("throttlingException", b'{"message":"slow down"}', "exception"))
            continue
        elif op == "two_members":
            obj = padded({"contentBlockIndex": index, "delta": {"text": text, "toolUse": {"input": "{}"}}}, number)
        elif op == "extra_key":
            obj = padded({"contentBlockIndex": index, "delta": {"text": text}, "extra": 1}, number)
        elif op == "index_bool":
            obj = padded({"contentBlockIndex": True, "delta": {"text": text}}, number)
        elif op == "no_padding":
            obj = {"contentBlockIndex": index, "delta": {"text": text}}
        elif op == "padding_null":
            obj = {"contentBlockIndex": index, "delta": {"text": text}, "p": None}
        elif op == "padding_quote":
            raw = style({"contentBlockIndex": index, "delta": {"text": text}, "p": 'a"b'}).encode()
        elif op == "delta_text_number":
            obj = padded({"contentBlockIndex": index, "delta": {"text": number}}, number)
        elif op == "not_json":
            raw = b'{"contentBlockIndex": 0, "delta": {"text": "x"'
        elif op == "lone_surrogate":
            raw = b'{"contentBlockIndex":%d,"delta":{"text":"a\\ud800b"},"p":"ab"}' % index
        elif op == "nan":
            raw = b'{"contentBlockIndex":%d,"delta":{"text":"a"},"p":"ab","n":NaN}' % index
        elif op == "invalid_utf8":
            raw = b'{"contentBlockIndex":%d,"delta":{"text":"a\xffb"},"p":"ab"}' % index
        elif op == "other_index":
            obj = padded({"contentBlockIndex": index + 3, "delta": {"text": text}}, number)
        elif op == "string_index":
            obj = padded({"contentBlockIndex": str(index), "delta": {"text": text}}, number)
        else:  # "style": later events are serialised another way
            style = styles[number % len(styles)]
            continue
        out.append(message(kind, raw if raw is not None else style(obj).encode()))
    return b"".join(out)


PROLOGUE = [("message_start", 0, 0), ("text", 0, 0), ("text", 0, 1)]
ENDINGS = {
    "whole": [("stop", 0, 0), ("message_stop", 0, 0), ("metadata", 0, 9)],
    "stopped": [("stop", 0, 0), ("message_stop", 0, 0)],
    "none": [],
}


test_generated_streams_are_judged_alike = PATH.generated_streams_test(generated_stream, OPS, PROLOGUE, ENDINGS)


# each one where a skipped parse would miss a rule: the fast path must decline, and the full path judge
ADVERSARIAL = {
    "delta after its block stopped": PROLOGUE + [("stop", 0, 0), ("text", 0, 3)] + ENDINGS["whole"],
    "delta after messageStop": PROLOGUE + [("stop", 0, 0), ("message_stop", 0, 0), ("text", 0, 3), ("metadata", 0, 9)],
    "delta after metadata": PROLOGUE + [("metadata", 0, 9), ("text", 0, 3), ("stop", 0, 0), ("message_stop", 0, 0)],
    "second message": PROLOGUE + [("message_start", 0, 0), ("text", 0, 3)] + ENDINGS["whole"],
    # (twice: the first, parsed, teaches the layout of index 1; the second meets the fast path's check)
    "delta into a tool block": PROLOGUE + [("start_tool", 1, 0), ("text", 1, 3), ("text", 1, 4), ("stop", 1, 0)]
                               + ENDINGS["whole"],
    "delta model refuses": PROLOGUE + [("two_members", 0, 3), ("text", 0, 1)] + ENDINGS["whole"],
    "exception mid-stream": PROLOGUE + [("exception", 0, 0), ("text", 0, 1)] + ENDINGS["whole"],
}


test_adversarial_streams_are_judged_alike = PATH.adversarial_test(generated_stream, ADVERSARIAL)


def test_a_text_delta_is_taken_without_a_parse_and_gives_the_parsed_text():
    deltas = ContentDeltas(CONVERSE)
    first = '{"contentBlockIndex":0,"delta":{"text":"Why"},"p":"abcdefghijklmnopqrstuvwxyz"}'
    assert deltas.learn(first, orjson.loads(first))
    for fragment in ["plain", 'say "hi"', "back\\slash", "line\nbreak", "\u0001", "é\U0001f600", '","p":"']:
        data = json.dumps({"contentBlockIndex": 0, "delta": {"text": fragment}, "p": "abc"}, separators=(",", ":"))
        assert deltas.content(data) == (0, fragment)
    assert deltas.content('{"contentBlockIndex":1,"delta":{"text":"x"},"p":"ab"}') is None  # another index
    assert deltas.content('{"contentBlockIndex":0,"delta":{"text":"x"},"p":"a\\"b"}') is None  # padding not plain


def test_events_that_are_not_plain_text_deltas_are_not_learnt():
    deltas = ContentDeltas(CONVERSE)
    for data in ['{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{}"}},"p":"ab"}',
                 '{"contentBlockIndex":0,"delta":{"text":"x"},"p":"ab","extra":1}',
                 '{"contentBlockIndex":true,"delta":{"text":"x"},"p":"ab"}',
                 '{"contentBlockIndex":0,"delta":{"text":"x","toolUse":null},"p":"ab"}',
                 '{"contentBlockIndex":0,"delta":{"text":"x"},"p":null}',
                 '{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"x"}},"p":"ab"}']:
        assert not deltas.learn(data, orjson.loads(data)), data
    assert deltas.content('{"contentBlockIndex":0,"delta":{"text":"x"},"p":"ab"}') is None


@pytest.mark.parametrize("spelling", ["raw", "escaped"])
def test_a_key_written_twice_teaches_no_layout(spelling):
    """The parse keeps a duplicate key's last value. Where that value was the text learning puts in
    the fragment's place, learning passed on the first key and later events gave the wrong text."""
    from streamtap.providers.fastpath import _SENTINEL

    # the sentinel as written, or with its first letter a JSON escape: the same string once parsed
    S = _SENTINEL if spelling == "raw" else "\\u%04x" % ord(_SENTINEL[0]) + _SENTINEL[1:]

    twice = '{"contentBlockIndex":0,"delta":{"text":"%s","text":"%s"},"p":"abc"}'
    body = generated_stream(PROLOGUE, seed=1) + b"".join(
        message("contentBlockDelta", (twice % pair).encode()) for pair in [(S, S), (" EVIL", S), (" EVIL", S)]
    ) + generated_stream(ENDINGS["whole"], seed=1)
    assert_same(body)
    turn, _, _ = judged(body, fast=True)
    assert "EVIL" not in json.dumps(turn)
    data = twice % (S, S)
    assert not ContentDeltas(CONVERSE).learn(data, orjson.loads(data))


def test_the_first_content_a_fast_delta_brings_is_timed():
    """An empty first delta teaches the layout; the next, taken by the fast path, is the first
    content, and its read's time the turn's first content."""
    body = generated_stream([("message_start", 0, 0), ("text", 0, 2), ("text", 0, 0)] + ENDINGS["whole"], seed=1)
    assert FRAGMENTS[2] == "" and assert_same(body, chunk_size=5) == 1
    turn, _, _ = judged(body, fast=True, chunk_size=5)
    assert turn["timing"]["first_content"] is not None, turn["timing"]
