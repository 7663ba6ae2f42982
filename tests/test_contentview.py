"""The contentviews render real captured bodies frame by frame.

What the views must show is worked out with peer decoders (botocore's event-stream
parser, httpx-sse's line decoder), not with streamtap's own, so a decoding mistake in
streamtap shows up as a difference here.
"""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys

import pytest
from botocore.eventstream import EventStreamBuffer
from httpx_sse._decoders import SSEDecoder as PeerSSEDecoder
from mitmproxy import contentviews
from mitmproxy.contentviews import Metadata

from conftest import shared_files
from interception import MITMDUMP, REPO, TAP
from streamtap.mitm.contentview import (
    ADDONS,
    EVENTSTREAM_TYPE,
    SSE_TYPE,
    EventStreamContentview,
    NDJSONContentview,
    SSEContentview,
    register,
)
from streamtap.providers.detect import STREAM_CONTENT_TYPES, wire_from_content_type

EVENTSTREAM_BODIES = shared_files("*/bodies/**/*.bin")
SSE_BODIES = shared_files("*/bodies/**/*.sse")[:12]
EVENTSTREAM_META = Metadata(content_type=EVENTSTREAM_TYPE)
SSE_META = Metadata(content_type=SSE_TYPE)


def blocks(rendered: str) -> list[str]:
    """The per-frame blocks of a rendering (after the summary line)."""
    return rendered.split("\n\n")[1:]


def indented(value) -> str:
    return "\n".join("  " + line for line in json.dumps(value, indent=2, ensure_ascii=False).splitlines())


def peer_messages(body: bytes) -> list:
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    return list(buffer)


def peer_sse(body: bytes) -> list:
    decoder = PeerSSEDecoder()
    events = []
    for line in body.decode("utf-8").splitlines():
        if (event := decoder.decode(line)) is not None:
            events.append(event)
    if (event := decoder.decode("")) is not None:
        events.append(event)
    return events


def require(files: list) -> None:
    if not files:
        pytest.skip("../shared/fixtures is absent: real captures exist beside a development or CI clone only")


@pytest.mark.parametrize("path", EVENTSTREAM_BODIES, ids=lambda p: p.name)
def test_eventstream_messages_headers_payloads_and_invoke_chunks(path):
    body = path.read_bytes()
    rendered = EventStreamContentview().prettify(body, EVENTSTREAM_META)
    expected = peer_messages(body)
    shown = blocks(rendered)
    assert len(shown) == len(expected) and "!!" not in rendered
    offset = 0
    for block, message in zip(shown, expected, strict=True):
        length = message.prelude.total_length
        assert block.startswith(f"# message {expected.index(message)} · offset {offset} · {length} bytes")
        offset += length
        for name, value in message.headers.items():
            assert f"\n{name}: {value}" in block
        payload = json.loads(message.payload)
        if isinstance(payload.get("bytes"), str):
            inner = json.loads(base64.b64decode(payload["bytes"]))
            assert f"bytes (base64-decoded):\n{indented(inner)}" in block
            assert payload["bytes"] not in block  # the base64 itself is replaced by its decoding
        else:
            assert f"payload:\n{indented(payload)}" in block


def test_bedrock_invoke_fixture_is_among_the_inputs():
    require(EVENTSTREAM_BODIES)
    assert any("invoke_stream" in p.name for p in EVENTSTREAM_BODIES)


@pytest.mark.parametrize("path", SSE_BODIES, ids=lambda p: p.name)
def test_sse_events_with_json_data(path):
    body = path.read_bytes()
    rendered = SSEContentview().prettify(body, SSE_META)
    expected = peer_sse(body)
    shown = blocks(rendered)
    assert len(shown) == len(expected), rendered[:500]
    for block, event in zip(shown, expected, strict=True):
        assert f"\nevent: {event.event or 'message'}" in block
        try:
            data = json.loads(event.data)
        except ValueError:
            assert f"data: {event.data}" in block
        else:
            if isinstance(data, (dict, list)):
                assert f"data:\n{indented(data)}" in block


def test_a_cut_eventstream_body_says_where_it_ends():
    require(EVENTSTREAM_BODIES)
    body = next(p for p in EVENTSTREAM_BODIES if "invoke_stream" in p.name).read_bytes()
    whole = peer_messages(body)
    keep = sum(m.prelude.total_length for m in whole[:2]) + 10
    rendered = EventStreamContentview().prettify(body[:keep], EVENTSTREAM_META)
    assert rendered.startswith("# 2 messages")
    assert f"# !! the body ends inside a frame: 10 bytes at offset {keep - 10}" in rendered


def test_a_corrupted_message_is_marked_not_hidden():
    vectors = shared_files("aws-sdk-go/encoded/negative/corrupted_payload")
    require(vectors)
    good = shared_files("aws-sdk-go/encoded/positive/payload_one_str_header")[0].read_bytes()
    rendered = EventStreamContentview().prettify(good + vectors[0].read_bytes(), EVENTSTREAM_META)
    assert rendered.startswith("# 1 message,")
    assert f"# !! malformed at offset {len(good)}" in rendered


def test_sse_without_json_and_a_cut_last_event():
    body = b": keep-alive\n\nevent: ping\ndata: hello\ndata: world\n\ndata: [DONE]\n\ndata: {\"cut\": tr"
    rendered = SSEContentview().prettify(body, SSE_META)
    assert rendered.startswith("# 2 events, 81 bytes, 1 framing problem")
    assert "event: ping\ndata: |\n  hello\n  world" in rendered
    assert "event: message\ndata: [DONE]" in rendered
    assert "# !! the body ends inside a frame: 16 bytes at offset 65" in rendered


def test_ndjson_values_and_a_line_that_is_not_json():
    values = [{"model": "llama3", "message": {"role": "assistant", "content": w}, "done": False} for w in ("Hi", "!")]
    values.append({"model": "llama3", "done": True, "done_reason": "stop", "eval_count": 2})
    lines = [json.dumps(v).encode() + b"\n" for v in values]
    body = lines[0] + b"not json\n" + b"".join(lines[1:]) + b'{"cut": '
    rendered = NDJSONContentview().prettify(body, Metadata(content_type="application/x-ndjson"))
    shown = [b for b in blocks(rendered) if not b.startswith("# !!")]
    assert rendered.startswith(f"# 3 values, {len(body)} bytes, 2 framing problems")
    for block, value in zip(shown, values, strict=True):
        assert json.dumps(value, indent=2) in block
    assert f"# !! malformed at offset {len(lines[0])}" in rendered
    assert "# !! the body ends inside a frame: 8 bytes" in rendered


@pytest.mark.parametrize("depth", [1000, 3000])
def test_json_nested_past_what_python_prints_is_shown_as_it_came(depth):
    """Past about 1,000 levels json.dumps (and past orjson's 1,024, json.loads) gives up: the
    frame is still listed, its bytes as they came, and the frames around it laid out."""
    deep = "[" * depth + "]" * depth
    sse = f'data: {{"a": 1}}\n\ndata: {{"deep": {deep}}}\n\ndata: {{"b": 2}}\n\n'.encode()
    rendered = SSEContentview().prettify(sse, SSE_META)
    assert '"a": 1' in rendered and '"b": 2' in rendered and deep in rendered
    ndjson = f'{{"a": 1}}\n{{"deep": {deep}}}\n{{"b": 2}}\n'.encode()
    rendered = NDJSONContentview().prettify(ndjson, Metadata(content_type="application/x-ndjson"))
    assert '"a": 1' in rendered and '"b": 2' in rendered and "offset 9 " in rendered  # the deep line listed where it is


def test_views_are_chosen_by_content_type_only():
    register()
    registry = contentviews.registry
    data = b"data: {}\n\n"
    assert isinstance(registry.get_view(data, SSE_META), SSEContentview)
    assert isinstance(registry.get_view(b"\x00" * 16, EVENTSTREAM_META), EventStreamContentview)
    assert not isinstance(registry.get_view(data, Metadata(content_type="text/plain")), SSEContentview)
    assert not isinstance(registry.get_view(b"{}", Metadata(content_type="application/json")), SSEContentview)
    assert isinstance(registry.get_view(b"{}\n", Metadata(content_type="application/x-ndjson")), NDJSONContentview)
    assert "aws event-stream" in registry and "llm stream sse" in registry


def test_every_content_type_the_tap_reads_picks_its_view():
    """application/x-jsonlines answers were tapped as NDJSON, yet the NDJSON view was not picked
    for them: mitmweb showed them as Raw text."""
    register()
    views = {"sse": SSEContentview, "eventstream": EventStreamContentview, "ndjson": NDJSONContentview}
    for content_type in STREAM_CONTENT_TYPES:
        view = contentviews.registry.get_view(b"{}\n", Metadata(content_type=content_type))
        assert isinstance(view, views[wire_from_content_type(content_type)]), content_type


def test_escaped_bidi_and_c1_characters_stay_escaped():
    """An ASCII body's ``invoice_\\u202efdp.exe``, written with the override raw, read as
    ``invoice_exe.pdf`` in mitmweb: such characters stay escaped, as ``streamtap show`` writes
    them, and the JSON laid out still reads back as the body's."""
    marks = "\u0085\u009f\u061c\u200e\u200f\u2028\u2029\u202a\u202e\u2066\u2069"
    value = {"text": f"héllo 👋 invoice_{marks}fdp.exe"}
    for view, body, metadata in ((SSEContentview(), f"data: {json.dumps(value)}\n\n".encode(), SSE_META),
                                 (NDJSONContentview(), f"{json.dumps(value)}\n".encode(), Metadata(content_type="application/x-ndjson"))):
        assert body.isascii()
        rendered = view.prettify(body, metadata)
        assert not set(marks) & set(rendered), ascii(rendered)
        assert "héllo 👋 invoice_\\u0085\\u009f\\u061c" in rendered  # other characters written as they are
        assert json.loads(rendered[rendered.index("{") : rendered.rindex("}") + 1]) == value


def test_mitmdump_shows_a_saved_bedrock_flow_decoded(tmp_path):
    """A saved flow (gzip-encoded, as a provider may send it) read back by a real mitmdump
    with the addon loaded the way addon/tap.py loads it."""
    require(EVENTSTREAM_BODIES)
    from mitmproxy import io
    from mitmproxy.test import tflow

    body = next(p for p in EVENTSTREAM_BODIES if "invoke_stream" in p.name).read_bytes()
    flow = tflow.tflow(resp=True)
    flow.request.host = "bedrock-runtime.us-east-1.amazonaws.com"
    flow.request.path = "/model/anthropic.claude-v2/invoke-with-response-stream"
    flow.response.headers["content-type"] = EVENTSTREAM_TYPE
    flow.response.headers["content-encoding"] = "gzip"
    flow.response.raw_content = gzip.compress(body)
    capture = tmp_path / "bedrock.mitm"
    with capture.open("wb") as f:
        io.FlowWriter(f).add(flow)
    result = subprocess.run(
        [str(MITMDUMP), "-n", "-r", str(capture), "--flow-detail", "4", "-s", str(TAP),
         "--set", f"confdir={tmp_path}", "--set", f"streamtap_dir={tmp_path / 'rec'}"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    first = peer_messages(body)[0]
    inner = json.loads(base64.b64decode(json.loads(first.payload)["bytes"]))
    assert f"# {len(peer_messages(body))} messages, {len(body)} bytes" in out, out[-3000:]
    assert "bytes (base64-decoded):" in out and f'"type": "{inner["type"]}"' in out
    # a flow read from a file holds its body already: nothing streams, nothing is recorded
    assert not list((tmp_path / "rec").glob("*")), "the Tap recorded a flow read from a file"


def test_addons_list_registers_on_load():
    """ADDONS holds classes (addon/tap.py instantiates them); load() registers the three views."""
    for cls in ADDONS:
        cls().load(None)
    assert {"aws event-stream", "llm stream sse", "llm stream ndjson"} <= set(contentviews.registry)


if __name__ == "__main__":  # render a body by hand: python tests/test_contentview.py FILE
    data = open(sys.argv[1], "rb").read()
    view = EventStreamContentview() if sys.argv[1].endswith(".bin") else SSEContentview()
    print(view.prettify(data, Metadata()))


def test_integers_past_64_bits_are_shown_as_the_body_holds_them():
    """orjson reads them as doubles: 123456789012345678901 was shown as 1.2345678901234568e+20."""
    sse = b'data: {"id":"c","created":123456789012345678901,"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    shown = SSEContentview().prettify(sse, Metadata(content_type="text/event-stream"))
    assert '"created": 123456789012345678901' in shown and "e+20" not in shown, shown
    ndjson = b'{"model":"llama3","done":true,"seed":18446744073709551616}\n'
    shown = NDJSONContentview().prettify(ndjson, Metadata(content_type="application/x-ndjson"))
    assert '"seed": 18446744073709551616' in shown and "e+19" not in shown, shown
