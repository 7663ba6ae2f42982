"""NDJSONDecoder (Ollama) and JSONArrayDecoder (Gemini without alt=sse): framing rules,
chunking invariance, cut at every offset, errors and oversize values."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import feed_cycled, shared_files
from streamtap.wire import (
    InvalidJSON,
    JSONArrayDecoder,
    JSONValue,
    Malformed,
    NDJSONDecoder,
    OversizeError,
    Tail,
)


def decode(cls, stream: bytes, chunks: list[int] | None = None, **kwargs):
    """Decode ``stream`` fed in pieces of the given sizes (cycled), or whole."""
    decoder = cls(**kwargs)
    return feed_cycled(decoder, stream, chunks), decoder


def values(events: list) -> list:
    return [e.value for e in events if isinstance(e, JSONValue)]


def kinds(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def check_tiling(events: list, stream: bytes) -> None:
    pos = 0
    for seq, event in enumerate(events):
        assert (event.seq, event.start) == (seq, pos)
        if not (isinstance(event, Malformed) and event.raw == b""):  # over the limit: not kept
            assert event.raw == stream[event.start : event.end]
        pos = event.end
    assert pos == len(stream)


# -- NDJSON -------------------------------------------------------------------------

OLLAMA_CHAT = (  # constructed from the shapes in provider-streams.md section 6.1
    b'{"model":"qwen3","created_at":"2025-10-26T17:15:24.09Z","message":{"role":"assistant","content":"","thinking":"User asks weather"},"done":false}\n'
    b'{"model":"qwen3","created_at":"2025-10-26T17:15:24.11Z","message":{"role":"assistant","content":"","tool_calls":[{"id":"call_x1","function":{"index":0,"name":"get_weather","arguments":{"city":"Tokyo"}}}]},"done":false}\n'
    b'{"model":"qwen3","created_at":"2025-10-26T17:15:24.15Z","message":{"role":"assistant","content":"Sunny \xe2\x98\x80"},"done":false}\n'
    b'{"model":"qwen3","created_at":"2025-10-26T17:15:24.19Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":182242375,"eval_count":15}\n'
)

NDJSON_CASES = [
    ("one-value-per-line", b'{"a":1}\n{"b":2}\n', [{"a": 1}, {"b": 2}], ["JSONValue", "JSONValue"]),
    ("crlf-line-ends", b'{"a":1}\r\n{"b":2}\r\n', [{"a": 1}, {"b": 2}], ["JSONValue", "JSONValue"]),
    ("blank-lines-join-next-span", b'\n\n{"a":1}\n \r\n{"b":2}\n', [{"a": 1}, {"b": 2}], ["JSONValue", "JSONValue"]),
    ("any-json-value", b'1\n"s"\nnull\n[1]\n', [1, "s", None, [1]], ["JSONValue"] * 4),
    ("newline-inside-string-is-escaped", b'{"t":"a\\nb"}\n', [{"t": "a\nb"}], ["JSONValue"]),
    ("not-json-is-non-fatal", b'{"a":1}\nnope\n{"b":2}\n', [{"a": 1}, {"b": 2}], ["JSONValue", "Malformed", "JSONValue"]),
    ("two-values-on-one-line-is-not-json", b'{"a":1} {"b":2}\n', [], ["Malformed"]),
    ("unterminated-last-line-is-a-tail", b'{"a":1}\n{"b":2}', [{"a": 1}], ["JSONValue", "Tail"]),
    ("trailing-blank-lines-are-a-tail", b'{"a":1}\n\n\n', [{"a": 1}], ["JSONValue", "Tail"]),
    ("empty-stream", b"", [], []),
]


@pytest.mark.parametrize(
    "stream,expected,expected_kinds", [c[1:] for c in NDJSON_CASES], ids=[c[0] for c in NDJSON_CASES]
)
def test_ndjson_rule(stream: bytes, expected: list, expected_kinds: list[str]) -> None:
    for chunks in (None, [1], [2], [5, 1]):
        events, _ = decode(NDJSONDecoder, stream, chunks)
        assert values(events) == expected and kinds(events) == expected_kinds, chunks
        check_tiling(events, stream)


def test_ndjson_tail_that_parses_says_so_and_is_not_a_value() -> None:
    events, _ = decode(NDJSONDecoder, b'{"done":true}')
    (tail,) = events
    assert isinstance(tail, Tail) and tail.cut and "parses" in tail.reason


def test_ndjson_trailing_blank_lines_are_padding_not_a_cut() -> None:
    events, _ = decode(NDJSONDecoder, b'{"a":1}\n\r\n')
    assert isinstance(events[-1], Tail) and not events[-1].cut


def test_ndjson_invalid_line_names_its_offset() -> None:
    events, _ = decode(NDJSONDecoder, b'{"a":1}\n\n{oops}\n')
    bad = events[1]
    assert isinstance(bad, Malformed) and isinstance(bad.error, InvalidJSON) and not bad.fatal
    assert bad.error.offset == 9 and bad.start == 8 and bad.raw == b"\n{oops}\n"


def test_ndjson_realistic_stream_decodes_line_by_line() -> None:
    events, _ = decode(NDJSONDecoder, OLLAMA_CHAT)
    expected = [json.loads(line) for line in OLLAMA_CHAT.splitlines()]
    assert values(events) == expected and values(events)[-1]["done"] is True


def test_ndjson_oversize_line_skipped_unbuffered_and_decoding_resumes() -> None:
    decoder = NDJSONDecoder(max_event_size=100)
    assert values(decoder.feed(b'{"a":1}\n{"big":"')) == [{"a": 1}]
    for _ in range(100):
        assert decoder.feed(b"x" * 1000) == []
        assert len(decoder._buf) <= 100  # memory stays bounded by the limit
    bad, value = decoder.feed(b'"}\n{"b":2}\n')
    assert isinstance(bad.error, OversizeError) and bad.end == 8 + 8 + 100 * 1000 + 3
    assert value.value == {"b": 2} and value.start == bad.end


def test_ndjson_oversize_line_is_reported() -> None:
    stream = b'{"a":1}\n{"big":"' + b"x" * 300 + b'"}\n{"b":2}\n'
    for chunks in (None, [1], [7], [64]):
        events, _ = decode(NDJSONDecoder, stream, chunks, max_event_size=100)
        assert kinds(events) == ["JSONValue", "Malformed", "JSONValue"], chunks
        bad = events[1]
        assert isinstance(bad.error, OversizeError) and not bad.fatal and bad.raw == b""
        assert (bad.start, bad.end) == (8, len(stream) - len(b'{"b":2}\n'))
        assert values(events) == [{"a": 1}, {"b": 2}]


@st.composite
def ndjson_streams(draw) -> bytes:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=6,
    )
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["value", "value", "value", "blank", "junk"]))
        if kind == "value":
            parts.append(orjson.dumps(draw(json_values)) + draw(st.sampled_from([b"\n", b"\r\n"])))
        elif kind == "blank":
            parts.append(draw(st.sampled_from([b"\n", b" \n", b"\r\n"])))
        else:
            parts.append(draw(st.binary(max_size=6)) + b"\n")
    parts.append(draw(st.binary(max_size=6)))
    return b"".join(parts)


CHUNKINGS = st.lists(st.integers(1, 9), min_size=1, max_size=8)


@settings(max_examples=100)
@given(stream=ndjson_streams(), chunks=CHUNKINGS)
def test_ndjson_any_chunking_gives_the_one_shot_result(stream: bytes, chunks: list[int]) -> None:
    whole, _ = decode(NDJSONDecoder, stream)
    assert decode(NDJSONDecoder, stream, chunks)[0] == whole
    check_tiling(whole, stream)


@settings(max_examples=100)
@given(stream=ndjson_streams(), chunks=CHUNKINGS, limit=st.integers(1, 30))
def test_ndjson_oversize_is_chunking_invariant(stream: bytes, chunks: list[int], limit: int) -> None:
    whole, _ = decode(NDJSONDecoder, stream, max_event_size=limit)
    assert decode(NDJSONDecoder, stream, chunks, max_event_size=limit)[0] == whole
    check_tiling(whole, stream)
    for event in whole:
        if isinstance(event, JSONValue):
            assert event.end - event.start <= limit


def test_ndjson_cut_at_every_offset_yields_a_prefix() -> None:
    full, _ = decode(NDJSONDecoder, OLLAMA_CHAT)
    for cut in range(len(OLLAMA_CHAT) + 1):
        events, _ = decode(NDJSONDecoder, OLLAMA_CHAT[:cut])
        got = [e for e in events if isinstance(e, JSONValue)]
        assert got == full[: len(got)], cut
        assert all(e.end <= cut for e in got)
        if len(got) < len(full):
            assert full[len(got)].end > cut
        check_tiling(events, OLLAMA_CHAT[:cut])


# -- JSON array ---------------------------------------------------------------------

ARRAY_CASES = [
    ("gemini-crlf-comma-separators", b'[{"a":1}\r\n,\r\n{"b":2}\r\n]', [{"a": 1}, {"b": 2}], True, ["JSONValue", "JSONValue", "Tail"]),
    ("compact", b'[{"a":1},{"b":2}]', [{"a": 1}, {"b": 2}], True, ["JSONValue", "JSONValue", "Tail"]),
    ("empty-array", b"[]", [], True, ["Tail"]),
    ("leading-whitespace", b' \n[ {"a":1} ]\n', [{"a": 1}], True, ["JSONValue", "Tail"]),
    ("brackets-and-braces-inside-strings", b'[{"t":"]}{[,"}]', [{"t": "]}{[,"}], True, ["JSONValue", "Tail"]),
    ("escaped-quote-and-backslash", b'[{"t":"a\\"b\\\\"},{"u":"\\\\"}]', [{"t": 'a"b\\'}, {"u": "\\"}], True, ["JSONValue", "JSONValue", "Tail"]),
    ("nested-containers", b'[{"a":[1,{"b":[]}]},[[]]]', [{"a": [1, {"b": []}]}, [[]]], True, ["JSONValue", "JSONValue", "Tail"]),
    ("scalar-elements", b'[1, "s", true, null, -2.5e3]', [1, "s", True, None, -2500.0], True, ["JSONValue"] * 5 + ["Tail"]),
    ("missing-closing-bracket-is-a-tail", b'[{"a":1},{"b":2}', [{"a": 1}, {"b": 2}], False, ["JSONValue", "JSONValue"]),
    ("cut-inside-element", b'[{"a":1},{"b":', [{"a": 1}], False, ["JSONValue", "Tail"]),
    ("cut-number-is-not-a-value", b"[1, 23", [1], False, ["JSONValue", "Tail"]),
    ("cut-after-comma", b'[{"a":1},', [{"a": 1}], False, ["JSONValue", "Tail"]),
    ("no-opening-bracket-is-fatal", b'{"a":1}', [], False, ["Malformed", "Tail"]),
    ("garbage-between-elements-is-fatal", b'[{"a":1} x {"b":2}]', [{"a": 1}], False, ["JSONValue", "Malformed", "Tail"]),
    ("missing-comma-is-fatal", b'[{"a":1}{"b":2}]', [{"a": 1}], False, ["JSONValue", "Malformed", "Tail"]),
    ("double-comma-is-fatal", b"[1,,2]", [1], False, ["JSONValue", "Malformed", "Tail"]),
    ("trailing-comma-is-fatal", b"[1,]", [1], False, ["JSONValue", "Malformed"]),
    ("invalid-element-is-fatal", b'[{"a":}, {"b":2}]', [], False, ["Malformed", "Tail"]),
    ("data-after-closing-bracket-is-fatal", b"[1] [2]", [1], True, ["JSONValue", "Malformed", "Tail"]),
    ("empty-stream", b"", [], False, []),
]


@pytest.mark.parametrize(
    "stream,expected,finished,expected_kinds",
    [c[1:] for c in ARRAY_CASES],
    ids=[c[0] for c in ARRAY_CASES],
)
def test_json_array_rule(stream: bytes, expected: list, finished: bool, expected_kinds: list[str]) -> None:
    for chunks in (None, [1], [2], [5, 1]):
        events, decoder = decode(JSONArrayDecoder, stream, chunks)
        assert values(events) == expected and kinds(events) == expected_kinds, chunks
        assert decoder.finished is finished
        check_tiling(events, stream)
        if any(isinstance(e, Malformed) for e in events):
            assert [e.fatal for e in events if isinstance(e, Malformed)] == [True]


def test_json_array_spans_put_brackets_and_commas_before_the_element() -> None:
    stream = b'[{"a":1}\r\n,\r\n{"b":2}\r\n]\n'
    first, second, tail = decode(JSONArrayDecoder, stream)[0]
    assert first.raw == b'[{"a":1}'
    assert second.raw == b'\r\n,\r\n{"b":2}'
    assert (tail.raw, tail.cut) == (b"\r\n]\n", False)


def test_json_array_syntax_error_names_the_offset_and_stops() -> None:
    decoder = JSONArrayDecoder()
    first, bad = decoder.feed(b'[{"a":1} x')
    assert isinstance(bad.error, InvalidJSON) and bad.fatal and bad.error.offset == 9
    assert decoder.feed(b', {"b":2}]') == []  # stopped: later bytes are not decoded
    (tail,) = decoder.close()
    assert tail.raw == b', {"b":2}]' and "stopped" in tail.reason and not decoder.finished


def test_json_array_oversize_element_skipped_and_decoding_resumes() -> None:
    stream = b'[{"a":1},{"big":"' + b"x" * 500 + b'\\"}"},{"b":2}]'
    for chunks in (None, [1], [7], [64]):
        events, decoder = decode(JSONArrayDecoder, stream, chunks, max_event_size=100)
        assert kinds(events) == ["JSONValue", "Malformed", "JSONValue", "Tail"], chunks
        bad = events[1]
        assert isinstance(bad.error, OversizeError) and not bad.fatal and bad.raw == b""
        assert values(events) == [{"a": 1}, {"b": 2}] and decoder.finished


def test_json_array_oversize_element_is_not_buffered() -> None:
    decoder = JSONArrayDecoder(max_event_size=1000)
    decoder.feed(b'[{"big":"')
    for _ in range(300):
        assert decoder.feed(b'x\\"{[' * 200) == []
        assert len(decoder._buf) <= 2000
    bad, value = decoder.feed(b'"},{"b":2}]')
    assert isinstance(bad, Malformed) and value.value == {"b": 2}


def gemini_stream(lines: list[bytes]) -> bytes:
    """Gemini's alt=json framing: '[' element '\\r\\n,\\r\\n' element ... ']'."""
    return b"[" + b"\r\n,\r\n".join(lines) + b"]"


def gemini_fixtures() -> list[tuple[str, bytes, list]]:
    """vercel-ai Gemini chunk lists (JSON lines) re-framed as a streamed JSON array
    (constructed framing: the captures themselves are payloads without framing)."""
    out = []
    for path in shared_files("vercel-ai/google/*.chunks.txt"):
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        out.append((f"constructed-from:{path.name}", gemini_stream(lines), [orjson.loads(x) for x in lines]))
    if not out:
        lines = [b'{"candidates":[{"content":{"parts":[{"text":"Hi \\"there\\" {]"}],"role":"model"},"index":0}]}',
                 b'{"candidates":[{"content":{"parts":[{"text":""}],"role":"model"},"finishReason":"STOP","index":0}]}']
        out.append(("constructed", gemini_stream(lines), [orjson.loads(x) for x in lines]))
    return out


@pytest.mark.parametrize("name,stream,expected", gemini_fixtures(), ids=lambda v: v if isinstance(v, str) else "")
def test_gemini_array_fixtures_decode_at_every_chunk_size(name: str, stream: bytes, expected: list) -> None:
    for chunks in (None, [1], [16], [1500]):
        events, decoder = decode(JSONArrayDecoder, stream, chunks)
        assert values(events) == expected and decoder.finished, chunks
        check_tiling(events, stream)


@pytest.mark.parametrize("name,stream,expected", gemini_fixtures()[:2], ids=lambda v: v if isinstance(v, str) else "")
def test_json_array_cut_at_every_offset_yields_a_prefix(name: str, stream: bytes, expected: list) -> None:
    full, _ = decode(JSONArrayDecoder, stream)
    for cut in range(len(stream) + 1):
        events, decoder = decode(JSONArrayDecoder, stream[:cut])
        got = [e for e in events if isinstance(e, JSONValue)]
        assert got == full[: len(got)], cut
        assert all(e.end <= cut for e in got)
        assert not any(isinstance(e, Malformed) for e in events), cut  # a cut is not a syntax error
        if len(got) < len([e for e in full if isinstance(e, JSONValue)]):
            assert full[len(got)].end > cut and not decoder.finished
        check_tiling(events, stream[:cut])


@st.composite
def array_streams(draw) -> bytes:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(alphabet='ab"\\{}[],: \n', max_size=6),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='k"\\]}', max_size=3), inner, max_size=3),
        max_leaves=6,
    )
    space = st.sampled_from([b"", b" ", b"\r\n", b"\n  "])
    elements = [orjson.dumps(v) for v in draw(st.lists(json_values, max_size=5))]
    body = b"[" + draw(space) + (draw(space) + b"," + draw(space)).join(elements) + draw(space)
    ending = draw(st.sampled_from([b"]", b"]\n", b"", b"x", b",", b"] junk"]))
    return body + ending + draw(st.binary(max_size=3)) if draw(st.booleans()) else body + ending


@settings(max_examples=100)
@given(stream=array_streams(), chunks=CHUNKINGS)
def test_json_array_any_chunking_gives_the_one_shot_result(stream: bytes, chunks: list[int]) -> None:
    whole, decoder = decode(JSONArrayDecoder, stream)
    again, chunked = decode(JSONArrayDecoder, stream, chunks)
    assert again == whole and chunked.finished == decoder.finished
    check_tiling(whole, stream)


@settings(max_examples=100)
@given(stream=array_streams())
def test_json_array_elements_match_a_whole_parse(stream: bytes) -> None:
    events, decoder = decode(JSONArrayDecoder, stream)
    try:
        parsed = orjson.loads(stream)
    except orjson.JSONDecodeError:
        assert not decoder.finished or any(isinstance(e, Malformed) for e in events)
    else:
        assert decoder.finished and values(events) == parsed
        assert not any(isinstance(e, Malformed) for e in events)


@settings(max_examples=100)
@given(stream=array_streams(), chunks=CHUNKINGS, limit=st.integers(1, 30))
def test_json_array_oversize_is_chunking_invariant(stream: bytes, chunks: list[int], limit: int) -> None:
    whole, _ = decode(JSONArrayDecoder, stream, max_event_size=limit)
    assert decode(JSONArrayDecoder, stream, chunks, max_event_size=limit)[0] == whole


@settings(max_examples=100)
@given(stream=st.binary(max_size=60), chunks=CHUNKINGS)
def test_arbitrary_bytes_never_raise(stream: bytes, chunks: list[int]) -> None:
    for cls in (NDJSONDecoder, JSONArrayDecoder):
        whole, _ = decode(cls, stream)
        assert decode(cls, stream, chunks)[0] == whole
        check_tiling(whole, stream)


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1E+999"])
def test_a_number_beyond_a_double_is_json_as_the_clients_read_it(number: bytes) -> None:
    """JSON allows any number; orjson refuses one that overflows a double, json.loads (the SDKs')
    reads it as infinity. One such value must not stop a JSON array or make its line malformed."""
    line = b'{"candidates":[{"content":{"parts":[{"text":"x","n":' + number + b'}]}}]}'
    events, _ = decode(NDJSONDecoder, line + b"\n" + b'{"done":true}\n')
    assert kinds(events) == ["JSONValue", "JSONValue"] and values(events) == [json.loads(line), {"done": True}]
    array = b"[" + line + b",\n" + b'{"done":true}' + b"]"
    events, _ = decode(JSONArrayDecoder, array, [7])
    assert kinds(events) == ["JSONValue", "JSONValue", "Tail"] and not events[-1].cut, events  # the Tail: "]"
    assert values(events)[0]["candidates"][0]["content"]["parts"][0]["n"] == json.loads(number)


def test_what_no_json_reader_takes_stays_malformed() -> None:
    deep = b"[" * 3000 + b"]" * 3000  # past orjson's depth and Python's recursion
    events, _ = decode(NDJSONDecoder, b'{"n": NaN}\n{"n": Infinity}\n{"n": 1e400\n' + deep + b"\n")
    assert [type(e).__name__ for e in events] == ["Malformed"] * 4, events
    events, _ = decode(JSONArrayDecoder, b"[" + deep + b"]")
    assert type(events[0]).__name__ == "Malformed", events


def test_a_lone_surrogate_escape_stays_malformed_on_the_ndjson_wire() -> None:
    """json.loads takes it, but no UTF-8 text (a recording, the turn) can hold the value. (Ollama's
    Go server never writes one. OpenAI's tool arguments, which apps read with json.loads, hold U+FFFD
    for one: ``judge.parse_arguments``; ``lenient_loads`` and ``IncrementalJSON`` still refuse it.)"""
    events, _ = decode(NDJSONDecoder, b'{"content": "A\\ud83d"}\n{"n": 1e400}\n')
    assert kinds(events) == ["Malformed", "JSONValue"], events
