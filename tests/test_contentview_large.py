"""A contentview on a big body decodes no further than the frames it shows: mitmweb renders it on
the event loop that carries the traffic. What it shows is worked out with httpx-sse's decoder."""

from __future__ import annotations

import json
import re

import pytest

from httpx_sse._decoders import SSEDecoder as PeerSSEDecoder
from mitmproxy.contentviews import Metadata

from streamtap.mitm.contentview import (
    DECODE_STEP,
    MAX_DECODED,
    MAX_FRAMES_SHOWN,
    MAX_LAID_OUT_BYTES,
    MAX_LAID_OUT_DEPTH,
    MAX_LINES_DECODED,
    MAX_TEXT_SHOWN,
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


def test_the_text_stops_at_its_budget_and_says_where():
    """Laid out, JSON nested 16 deep is 18 times its bytes: 4 MiB of such frames made 77 M characters,
    15 s on the loop that carries the traffic. Frames are laid out while the text stays within
    MAX_TEXT_SHOWN; the one that would pass it is shown as it came, and the view says where it stopped."""
    frame = b"data: " + b"[" * MAX_LAID_OUT_DEPTH + b",".join([b"0"] * 400) + b"]" * MAX_LAID_OUT_DEPTH + b"\n\n"
    body = frame * 600
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    assert len(rendered) < MAX_TEXT_SHOWN + 2 * len(frame), len(rendered)
    summary, *blocks = rendered.rstrip("\n").split("\n\n")
    assert summary == f"# 600 events, {len(body)} bytes"
    laid_out = [block for block in blocks if block.startswith("# event ")]
    assert 0 < len(laid_out) < 600
    assert laid_out[-1].endswith("  " * MAX_LAID_OUT_DEPTH + "  0\n" + "\n".join("  " * level + "]" for level in range(MAX_LAID_OUT_DEPTH, 0, -1)))
    shown_to = (len(laid_out) + 1) * len(frame)
    assert blocks[len(laid_out):] == [
        f"# frame {len(laid_out)} · offset {len(laid_out) * len(frame)} · {len(frame)} bytes · laid out, past the "
        f"{MAX_TEXT_SHOWN} characters this view writes, as it came:\n  " + frame.decode().rstrip("\n") + "\n  ",  # its blank line indented
        f"# ... the text stopped at offset {shown_to} (this view writes at most {MAX_TEXT_SHOWN} characters of a body): "
        f"the {len(body) - shown_to} bytes from offset {shown_to} on not shown",
    ]


def test_a_frame_whose_lay_out_alone_passes_the_text_budget_is_shown_as_it_came():
    """Under MAX_LAID_OUT_BYTES, yet 18 times that laid out: shown as it came, as a longer frame is."""
    deep = b"[" * MAX_LAID_OUT_DEPTH + b",".join([b"0"] * 150_000) + b"]" * MAX_LAID_OUT_DEPTH + b"\n"
    assert len(deep) < MAX_LAID_OUT_BYTES
    body = deep + b'{"done": true}\n'
    rendered = NDJSONContentview().prettify(body, Metadata(content_type=NDJSON_TYPES[0]))
    assert len(rendered) < len(body) + 1000, len(rendered)
    assert f"# frame 0 · offset 0 · {len(deep)} bytes · laid out, past the {MAX_TEXT_SHOWN} characters this view writes, as it came:" in rendered
    assert rendered.rstrip().endswith(f"# ... the text stopped at offset {len(deep)} (this view writes at most {MAX_TEXT_SHOWN} "
                                      f"characters of a body): the 15 bytes from offset {len(deep)} on not shown")


@pytest.mark.parametrize("line", [b"x\n", b"x\r", b":\r\n"])
def test_lines_that_make_no_frame_are_decoded_no_further_than_the_line_budget(line):
    """4 MiB of an SSE field no provider sends made no frame, and took the decoder 2.4 s: a
    line-framed body is decoded no further than MAX_LINES_DECODED lines, and the view says so."""
    body = line * (MAX_DECODED // len(line))
    rendered = SSEContentview().prettify(body, Metadata(content_type=SSE_TYPE))
    assert (summary := SUMMARY.match(rendered)), rendered[:300]  # "in the first N of M bytes": not decoded whole
    frames, _noun, decoded, total = summary.groups()
    assert (int(frames), int(total)) == (0, len(body))
    assert MAX_LINES_DECODED * len(line) < int(decoded) <= MAX_LINES_DECODED * len(line) + DECODE_STEP
    assert rendered.rstrip().endswith(f"decoding stopped at byte {decoded} (this view decodes at most {MAX_LINES_DECODED} "
                                      f"lines of a body): the {len(body)} bytes from offset 0 on not shown")
