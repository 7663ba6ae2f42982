"""Protocol positions (providers/positions.py) on every real capture in ../shared/fixtures.

Each position is checked against what it claims to be, with the verdict layer as the judge:
``between-blocks`` is where the turn's second block opens, ``before-terminal`` is where the
stream stops being judged truncated, ``tool-args`` keeps the first character of a value
that begins a tool call's final arguments, and so on.
"""

from __future__ import annotations

import json
from json.decoder import scanstring

import pytest
from conftest import shared_files

from streamtap.providers import StreamSession, VerdictKind, analyze_bytes, sniff_dialect
from streamtap.providers.positions import find_positions
from streamtap.wire import Tail


def _captures() -> list[tuple[str, bytes]]:
    raw = shared_files("*/bodies/**/*.*") + shared_files("anthropic-sdk-python/**/*.txt") + shared_files("anthropic-sdk-python/**/*.sse")
    out = [(f"{p.parent.name}/{p.name}", p.read_bytes()) for p in raw]
    for path in shared_files("vercel-ai/**/*.chunks.txt"):  # payloads only: framed as SSE data events
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        out.append((f"{path.parent.name}/{path.name}", b"".join(b"data: " + line + b"\n\n" for line in lines)))
    return out


CAPTURES = _captures()


class Stream:
    """A capture as the replay layer holds it: pieces that tile the body, each an event or not."""

    def __init__(self, body: bytes) -> None:
        detection = sniff_dialect(body)
        self.dialect, self.wire, self.body = detection.dialect, detection.wire, body
        session = StreamSession(self.dialect, self.wire)
        events = session.feed(body) + session.close().events
        self.pieces = [(e.raw, not isinstance(e, Tail)) for e in events]
        self.events: list[tuple[int, int]] = []  # (start, end) of each event
        pos = 0
        for raw, is_event in self.pieces:
            if is_event:
                self.events.append((pos, pos + len(raw)))
            pos += len(raw)

    def judged(self, end: int):
        return analyze_bytes(self.body[:end], self.dialect, wire=self.wire)

    def blocks(self, end: int) -> int:
        return sum(len(choice.blocks) for choice in self.judged(end).turn.choices)


def holds(stream: Stream, name: str, event: int, offset: int) -> bool:
    """Whether ``offset`` (inside event ``event``) is the position ``name`` says it is."""
    start, end = stream.events[event]
    body = stream.body
    if not start <= offset <= end:
        return False
    if name == "escaped-quote":
        return body[offset - 2 : offset] == b'\\"' and b'\\"' not in body[:start] + body[start : offset - 1]
    if name == "prelude":
        return offset - start == 6
    if name == "crc":
        return end - offset == 2
    if name == "between-blocks":
        return offset == start and stream.blocks(start) >= 1 and stream.blocks(end) > stream.blocks(start)
    if name == "before-terminal":
        unfinished = (VerdictKind.TRUNCATED, VerdictKind.CORRUPT)
        return offset == start and stream.judged(start).verdict.kind in unfinished and stream.judged(end).verdict.kind not in unfinished
    assert name == "tool-args"
    turn = stream.judged(len(body)).turn
    arguments = [b.arguments_raw for c in turn.choices for b in c.blocks if b.arguments_raw]
    if not arguments:
        return False
    if stream.wire == "eventstream":  # inside the payload of a message, past its headers
        return start + 12 < offset < end - 4
    text = body.decode("utf-8", "surrogateescape")
    at = len(body[: offset - 1].decode("utf-8", "surrogateescape"))  # the character before the cut
    if text[at - 1] == '"':  # one byte into a string: the value begins the arguments
        value, _ = scanstring(text, at)
        return bool(value) and any(a.startswith(value) for a in arguments)
    value, _ = json.JSONDecoder().raw_decode(text, at - 1 if text[at - 1] in "{[" else at)
    return any(json.loads(a) == value for a in arguments)


@pytest.mark.skipif(not CAPTURES, reason="../shared/fixtures is absent")
def test_positions_on_every_capture_are_what_they_claim_and_agree_with_the_old_catalog():
    from streamtap.replay.faults import protocol_positions
    from streamtap.replay.source import Frame, Source

    differences = []
    for name, body in CAPTURES:
        stream = Stream(body)
        found = find_positions(stream.pieces, stream.dialect, stream.wire)
        for p in found:
            assert holds(stream, p.name, p.event, p.offset), (name, p)
            if p.name != "tool-args":  # the check can fail: a byte off is not the position
                assert not holds(stream, p.name, p.event, p.offset + 1), (name, p)
        frames = [Frame(0 if is_event else None, raw, 0.0) for raw, is_event in stream.pieces]
        source = Source(name, "POST", "/", None, 200, [], frames, [], stream.wire, str(stream.dialect))
        new = {p.name: p.offset for p in found}
        for old_name, old_offset, _what in protocol_positions(source):
            if new.get(old_name) == old_offset:
                continue
            # the old catalog read per-dialect shapes; where it disagrees, its position is not what it claimed
            event = next((i for i, (s, e) in enumerate(stream.events) if s <= old_offset < e), len(stream.events) - 1)
            assert not holds(stream, old_name, event, old_offset), (name, old_name, old_offset, new.get(old_name))
            differences.append((name, old_name))
    assert len(CAPTURES) > 150
