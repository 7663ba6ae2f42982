"""A contentview on a big body decodes no further than the frames it shows: mitmweb renders it on
the event loop that carries the traffic. What it shows is worked out with httpx-sse's decoder."""

from __future__ import annotations

import json
import re

from httpx_sse._decoders import SSEDecoder as PeerSSEDecoder
from mitmproxy.contentviews import Metadata

from streamtap.mitm.contentview import (
    DECODE_STEP,
    MAX_DECODED,
    MAX_FRAMES_SHOWN,
    MAX_LAID_OUT_BYTES,
    MAX_LAID_OUT_DEPTH,
    NDJSON_TYPES,
    SSE_TYPE,
    NDJSONContentview,
    SSEContentview,
)

SUMMARY = re.compile(r"# (\d+) (\w+) in the first (\d+) of (\d+) bytes")


def chat_events(count: int) -> list[bytes]:
    return [b'data: {"choices":[{"index":0,"delta":{"content":"w%d "}}]}\n\n' % i for i in range(count)]


def peer_data(body: bytes) -> list[str]:
    decoder, found = PeerSSEDecoder(), []
    for line in body.decode().splitlines():
        if (event := decoder.decode(line)) is not None:
            found.append(event.data)
    return found


def test_a_long_sse_body_shows_its_first_frames_and_says_how_far_it_decoded():
    events = chat_events(4 * MAX_FRAMES_SHOWN)
    body = b"".join(events)
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    summary, *blocks = rendered.split("\n\n")
    frames, noun, decoded, total = SUMMARY.fullmatch(summary).groups()
    assert noun == "events" and int(total) == len(body)
    assert int(frames) > MAX_FRAMES_SHOWN and int(decoded) < len(body)
    shown_through = sum(map(len, events[: MAX_FRAMES_SHOWN + 1]))  # the frame past the shown ones ends here
    assert int(decoded) <= shown_through + DECODE_STEP  # no further than the step that brought it
    assert int(frames) == len(peer_data(body[: int(decoded)]))
    shown = [block for block in blocks if block.startswith("# event ")]
    assert len(shown) == MAX_FRAMES_SHOWN
    for block, data in zip(shown, peer_data(body)[:MAX_FRAMES_SHOWN]):
        assert block.split("\n", 1)[1] == "event: message\ndata:\n" + "\n".join("  " + line for line in json.dumps(json.loads(data), indent=2).splitlines())
    assert rendered.rstrip().endswith(f"# ... {int(frames) - MAX_FRAMES_SHOWN} more, and the {len(body) - int(decoded)} bytes after them not decoded, not shown")


def test_a_body_of_bad_lines_stops_at_the_problems_shown():
    """Pretty-printed JSON sent as NDJSON: every line is a framing problem; only those shown are built."""
    line = json.dumps({"message": {"content": "x" * 40}}, indent=2).encode() + b"\n"
    body = line * (2 * 1024 * 1024 // len(line))
    rendered = NDJSONContentview().prettify(body, Metadata(content_type=NDJSON_TYPES[0]))
    summary = rendered.split("\n", 1)[0]
    decoded, total = SUMMARY.match(summary).group(3, 4)
    problems = int(re.search(r", (\d+) framing problems", summary).group(1))
    assert int(total) == len(body) and int(decoded) < len(body)
    assert MAX_FRAMES_SHOWN < problems <= MAX_FRAMES_SHOWN + DECODE_STEP  # at most a step's lines past the cap


def test_a_body_within_the_cap_is_decoded_whole():
    events = chat_events(MAX_FRAMES_SHOWN)
    body = b"".join(events)
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    assert rendered.startswith(f"# {MAX_FRAMES_SHOWN} events, {len(body)} bytes\n")
    assert "not shown" not in rendered and "not decoded" not in rendered


def test_deep_nesting_is_shown_as_it_came_so_the_text_stays_within_a_multiple_of_the_body():
    """Each level of nesting indents every line below it: 400 levels laid out made 400 times the
    body. Past MAX_LAID_OUT_DEPTH a value is shown as it came; up to it, laid out."""
    deep, shallow = b"[" * 400 + b"]" * 400, b"[" * MAX_LAID_OUT_DEPTH + b"1" + b"]" * MAX_LAID_OUT_DEPTH
    for view, content_type, frame in ((SSEContentview(), SSE_TYPE, b"data: %s\n\n"), (NDJSONContentview(), NDJSON_TYPES[0], b"%s\n")):
        body = (frame % deep) * 200
        rendered = view.prettify(body, Metadata(content_type=content_type))
        assert len(rendered) < 2 * len(body), (content_type, len(rendered))
        assert rendered.count(deep.decode()) == 200
        laid_out = view.prettify(frame % shallow, Metadata(content_type=content_type))
        assert " " * (2 * MAX_LAID_OUT_DEPTH) + "1" in laid_out, laid_out


def test_data_the_judge_does_not_read_as_json_is_not_laid_out_as_json():
    """A lone surrogate escape (an emoji's pair split over two chunks) is no JSON to orjson, as the
    judge reads it: shown as it came, the view's text stays encodable (mitmdump writes it out)."""
    body = b'data: {"choices":[{"index":0,"delta":{"content":"\\ud83d"}}]}\n\n'
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    rendered.encode("utf-8")
    assert 'data: {"choices":[{"index":0,"delta":{"content":"\\ud83d"}}]}' in rendered


def test_a_body_of_few_frames_is_decoded_no_further_than_the_byte_budget_and_says_so():
    """One 12 MB NDJSON value (the decoder takes values up to 16 MiB) was decoded whole and laid
    out: twice the body in text. The view decodes the first MAX_DECODED bytes and says where it stopped."""
    body = json.dumps([[i] for i in range(1_200_000)]).encode() + b"\n"
    assert len(body) > 2 * MAX_DECODED
    rendered = NDJSONContentview().prettify(body, Metadata(content_type=NDJSON_TYPES[0]))
    assert len(rendered) < 1000, len(rendered)
    frames, _noun, decoded, total = SUMMARY.match(rendered).groups()
    assert (int(frames), int(decoded), int(total)) == (0, MAX_DECODED, len(body))
    assert rendered.rstrip().endswith(f"decoding stopped at byte {MAX_DECODED} (this view decodes at most {MAX_DECODED} "
                                      f"bytes of a body): the {len(body)} bytes from offset 0 on not shown")


def test_a_frame_longer_than_the_lay_out_budget_is_shown_cut_as_it_came():
    """A 2 MB JSON event laid out made several times its size in text: it is shown as it came, its
    first MAX_LAID_OUT_BYTES only; the frames around it are laid out as ever."""
    big = b"data: " + json.dumps({"choices": [{"index": i, "delta": {}} for i in range(60_000)]}).encode() + b"\n\n"
    small = b'data: {"choices":[]}\n\n'
    body = small + big + small
    assert MAX_LAID_OUT_BYTES < len(big) < MAX_DECODED
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    assert len(rendered) < MAX_LAID_OUT_BYTES + 1000, len(rendered)
    assert rendered.startswith(f"# 3 events, {len(body)} bytes\n")
    assert (f"# frame 1 · offset {len(small)} · {len(big)} bytes · longer than {MAX_LAID_OUT_BYTES} bytes, not laid out, "
            f"as it came (its last {len(big) - MAX_LAID_OUT_BYTES} bytes not shown):\n  data: {{\"choices\": [{{\"index\": 0,") in rendered
    assert rendered.count('data:\n  {\n    "choices": []\n  }') == 2
