"""drop, duplicate and reorder name an event, not a JSON array's framing: in a Gemini stream
without alt=sse, the first element carries the array's ``[``, the others a ``,``. A faulted
stream stays one array, in replay and live alike, that is missing, repeating or swapping the
element and nothing else. An injected error is one more element, and the closing bracket no event."""

from __future__ import annotations

import json

import pytest

from streamtap.providers import Dialect, StreamSession
from streamtap.recording import RecordingWriter
from streamtap.replay.faults import OPENAI_MESSAGE, LiveFaults, parse_faults, plan
from streamtap.replay.source import load_source
from streamtap.wire import JSONArrayDecoder, JSONValue, Tail


def chunk(text: str, finish: str | None = None) -> dict:
    candidate = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0, **({"finishReason": finish} if finish else {})}
    return {"candidates": [candidate], "responseId": "R1", "modelVersion": "gemini-test"}


ELEMENTS = [chunk("one "), chunk("two "), chunk("three", "STOP")]
BODY = ("[" + ",\r\n".join(json.dumps(e) for e in ELEMENTS) + "]").encode()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("array") / "gemini-array.jsonl"
    writer = RecordingWriter(path)
    writer.header({"dialect": "gemini", "wire": {"format": "json-array", "content_encoding": None},
                   "request": {"method": "POST", "url": "https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent", "headers": []},
                   "response": {"status": 200, "headers": [["content-type", "application/json"]]}})  # fmt: skip
    session = StreamSession(Dialect.GEMINI, "json-array")
    writer.read(BODY, 1.0)
    analysis = None
    for event in [*session.feed(BODY, 0.001), *(analysis := session.close()).events]:
        writer.frame(event, 1.0)
    writer.finish({"verdict": analysis.verdict.to_dict(), "stream_end": "finished"})
    return load_source(str(path))


def live_body(spec: str, chunk_size: int) -> bytes:
    live = LiveFaults(parse_faults(spec), "json-array", "gemini")
    out = []
    for i in range(0, len(BODY), chunk_size):
        out += live.feed(BODY[i : i + chunk_size])
    out += live.close()
    return b"".join(out)


@pytest.mark.parametrize("spec, served", [
    ("drop:event=0", [1, 2]),
    ("drop:event=1", [0, 2]),
    ("drop:event=2", [0, 1]),
    ("duplicate:event=0", [0, 0, 1, 2]),
    ("duplicate:event=2", [0, 1, 2, 2]),
    ("reorder:event=0", [1, 0, 2]),
    ("reorder:event=1", [0, 2, 1]),
    ("drop:event=0;drop:event=0;drop:event=0", []),
    # an injected error is an element of its own; the array's closing bracket is no event
    ("error:kind=openai,after=1", [0, 1, "E"]),
    ("error:kind=openai,after=0;duplicate:event=1", [0, "E", "E"]),
    ("error:kind=openai,after=1;drop:event=2", [0, 1]),
    ("error:kind=openai,after=0;reorder:event=0", ["E", 0]),
    ("error:kind=openai,after=0;drop:event=0;drop:event=0", []),
])  # fmt: skip
def test_a_faulted_array_is_still_one_array_of_the_elements_served(source, spec, served):
    assert source.body == BODY
    replayed = plan(source, parse_faults(spec)).body
    error = {"error": {"code": 500, "message": OPENAI_MESSAGE, "status": "INTERNAL"}}
    assert json.loads(replayed) == [error if i == "E" else ELEMENTS[i] for i in served], replayed
    decoder = JSONArrayDecoder()
    events = decoder.feed(replayed) + decoder.close()
    assert decoder.finished and all(isinstance(e, JSONValue) for e in events if not isinstance(e, Tail) or e.cut), events
    for chunk_size in (1, 7, len(BODY)):
        assert live_body(spec, chunk_size) == replayed, chunk_size
