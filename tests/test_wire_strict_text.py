"""The line decoders read JSON as the clients do: as UTF-8 text. json.loads given bytes would guess
UTF-16 or UTF-32 from NULs and drop a BOM, which ollama-python, reading decoded lines, never does,
so such a line is malformed, and a stream ending in one is not complete. The SSE decoder takes
any bytes-like read, alike for every chunking."""

from __future__ import annotations

import json

import pytest

from conftest import chunked
from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import JSONArrayDecoder, NDJSONDecoder, SSEDecoder

NOT_UTF8_JSON = [
    b'{\x00}\x00',  # UTF-16-LE without a BOM
    b"1\x00",
    '{"done":true}'.encode("utf-16"),  # with its BOM
    '{"done":true}'.encode("utf-32"),
    b'\xef\xbb\xbf{"done":true}',  # a UTF-8 BOM in front of the line
]


def decoded(decoder_class, body: bytes, size: int):
    decoder = decoder_class()
    events = [e for piece in chunked(body, size) for e in decoder.feed(piece)] + decoder.close()
    return [(type(e).__name__, e.start, e.end, getattr(e, "value", None)) for e in events]


@pytest.mark.parametrize("line", NOT_UTF8_JSON)
def test_a_line_that_is_not_utf8_json_is_malformed_however_it_comes(line):
    body = b'{"a":1}\n' + line + b'\n{"b":2}\n'
    whole = decoded(NDJSONDecoder, body, len(body))
    assert [kind for kind, *_ in whole] == ["JSONValue", "Malformed", "JSONValue"], whole
    for size in (1, 3, 7):
        assert decoded(NDJSONDecoder, body, size) == whole


@pytest.mark.parametrize("element", NOT_UTF8_JSON[:2] + NOT_UTF8_JSON[4:])
def test_an_array_element_that_is_not_utf8_json_is_malformed(element):
    body = b'[{"a":1},' + element + b',{"b":2}]'
    kinds = [kind for kind, *_ in decoded(JSONArrayDecoder, body, len(body))]
    assert kinds[0] == "JSONValue" and "Malformed" in kinds[1:], kinds
    assert not any(kind == "JSONValue" and value == {"done": True} for kind, _, _, value in decoded(JSONArrayDecoder, body, 1))


def ollama_line(**fields) -> bytes:
    return json.dumps({"model": "llama3.2", "created_at": "x", **fields}).encode()


@pytest.mark.parametrize("encode", [lambda text: text.encode("utf-16-le"), lambda text: b"\xef\xbb\xbf" + text.encode()])
def test_an_ollama_stream_whose_done_line_a_client_cannot_read_is_not_complete(encode):
    done = ollama_line(message={"role": "assistant", "content": ""}, done=True, done_reason="stop").decode()
    body = ollama_line(message={"role": "assistant", "content": "Hi"}, done=False) + b"\n" + encode(done) + b"\n"
    assert analyze_bytes(body.replace(encode(done), done.encode()), Dialect.OLLAMA).verdict.kind is VerdictKind.COMPLETE
    for size in (None, 1):
        verdict = analyze_bytes(body, Dialect.OLLAMA, chunk_size=size).verdict
        assert verdict.kind is VerdictKind.CORRUPT, verdict


@pytest.mark.parametrize("kind", [memoryview, bytearray])
def test_sse_takes_any_bytes_like_read_alike_for_every_chunking(kind):
    body = b'event: a\ndata: {"x":1}\n\ndata: two\n\n'
    expected = [(e.event, e.data, e.start, e.end) for e in SSEDecoder().feed(body)]
    for size in (1, 5, len(body)):
        decoder = SSEDecoder()
        events = [e for piece in chunked(body, size) for e in decoder.feed(kind(piece))] + decoder.close()
        assert [(e.event, e.data, e.start, e.end) for e in events] == expected, size
