"""Property: no strict prefix of a real capture is judged complete, stopped_by_limit or filtered.

Every real capture in ../shared/fixtures (the cassettes' response bodies with their requests,
the raw bodies that come without a cassette, and the payload-only chunk lists re-framed in their
provider's wire format) is cut at every event boundary, every line boundary and each of its last
five bytes. A prefix may only keep such a verdict when it lost no event: the CRLF case (a body cut
between its last CR and LF still ends its last line and blank line, by the SSE rules) and padding
after the last event; or when it is a whole response of a multi-step chunk list that holds several
responses back to back (MANIFEST.md), cut right where the next response starts. Skips, saying why,
where ../shared is absent.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import orjson
from provider_streams import cassette_responses, chunk_lines, frame_chat, frame_gemini_sse, frame_responses
from conftest import FIXTURES, shared_files, shared_path

from streamtap.providers import Dialect, StreamSession, VerdictKind, analyze_bytes, detect_dialect, sniff_dialect
from streamtap.providers.session import _DECODERS
from streamtap.wire import Malformed, Tail, encode_message

ENDING = {VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED}


def _converse(lines: list[bytes]) -> bytes:
    out = []
    for line in lines:
        (kind, payload), = json.loads(line).items()
        out.append(encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                                  json.dumps(payload).encode()))
    return b"".join(out)


def _anthropic(lines: list[bytes]) -> bytes:
    return b"".join(b"event: " + json.loads(line)["type"].encode() + b"\ndata: " + line + b"\n\n" for line in lines)


def _reframed(path: Path) -> tuple[bytes, Dialect, str] | None:
    """A chunk list in its provider's wire format (constructed framing around real payloads)."""
    lines = chunk_lines(path)
    if not lines:
        return None
    first = orjson.loads(lines[0])
    if not isinstance(first, dict):
        return None
    kind = first.get("type")
    if isinstance(kind, str) and kind.startswith("response."):
        return frame_responses(lines), Dialect.OPENAI_RESPONSES, "sse"
    if kind == "message_start":
        return _anthropic(lines), Dialect.ANTHROPIC, "sse"
    if "choices" in first:
        return frame_chat(lines), Dialect.OPENAI_CHAT, "sse"
    if "candidates" in first:
        return frame_gemini_sse(lines), Dialect.GEMINI, "sse"
    if len(first) == 1 and next(iter(first)) in ("messageStart", "contentBlockStart", "contentBlockDelta"):
        return _converse(lines), Dialect.BEDROCK_CONVERSE, "eventstream"
    return None


def captures() -> list[tuple[str, bytes, Dialect, str]]:
    found = []
    for item in cassette_responses("*/cassettes/**/*.yaml"):
        if item.status != 200 or item.request is None:
            continue
        detection = detect_dialect(item.request, item.content_type)
        if detection.streaming and detection.dialect is not Dialect.UNKNOWN:
            found.append((item.name, item.body, detection.dialect, detection.wire))
    for path in shared_files("anthropic-sdk-python/**/*.txt") + shared_files("vercel-ai/openai-compatible/*.sse"):
        body = path.read_bytes()
        sniffed = sniff_dialect(body)
        if sniffed.dialect is not Dialect.UNKNOWN:
            found.append((str(path.relative_to(FIXTURES)), body, sniffed.dialect, sniffed.wire))
    for path in shared_files("vercel-ai/**/*.chunks.txt"):
        if "synthetic" in path.parts:
            continue
        reframed = _reframed(path)
        if reframed is not None:
            found.append((str(path.relative_to(FIXTURES)) + " (re-framed)", *reframed))
    return found


def _events(body: bytes, wire: str) -> list:
    decoder = _DECODERS[wire]()
    return [e for e in decoder.feed(body) + decoder.close() if not isinstance(e, (Tail, Malformed))]


def _next_response_starts(rest: bytes, wire: str) -> bool:
    events = _events(rest, wire)
    if wire != "sse" or not events:
        return False
    try:
        first = orjson.loads(events[0].data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(first, dict) and first.get("type") in ("message_start", "response.created")


def cut_positions(body: bytes, wire: str) -> set[int]:
    positions = {e.end for e in _events(body, wire)}
    if wire != "eventstream":
        positions |= {i + 1 for i, byte in enumerate(body) if byte in (10, 13)}
    positions |= {len(body) - k for k in range(1, 6)}
    return {p for p in positions if 0 <= p < len(body)}


def test_no_strict_prefix_of_a_real_capture_is_judged_finished():
    shared_path("fixtures", "MANIFEST.md")
    started = time.monotonic()
    found = captures()
    assert len(found) >= 100, len(found)
    checked = allowed = 0
    dialects = set()
    failures = []
    for name, body, dialect, wire in found:
        whole = len(_events(body, wire))
        # one session fed up to each cut, closed as a copy: the same verdict as judging the prefix afresh
        # (the decoders give the same events for any chunking; every 50th prefix is judged afresh to check)
        session, fed = StreamSession(dialect, wire, keep_arrivals=False), 0
        for point in sorted(cut_positions(body, wire)):
            prefix = body[:point]
            session.feed(body[fed:point])
            fed = point
            verdict = copy.deepcopy(session).close().verdict
            if checked % 50 == 0:
                afresh = analyze_bytes(prefix, dialect, wire=wire).verdict
                assert (afresh.kind, afresh.reason, afresh.seq) == (verdict.kind, verdict.reason, verdict.seq), name
            checked += 1
            if verdict.kind not in ENDING:
                continue
            if not body[point:].strip() and (len(_events(prefix, wire)) == whole
                                             or verdict.evidence.get("body_ended_without_line_end")):
                # no event lost, only line ends after it: CRLF's last LF, or padding (or the last event's
                # line ends, where the SDK reads an unended last line: google-genai, the ollama client)
                allowed += 1
                continue
            if _next_response_starts(body[point:], wire):
                allowed += 1  # a whole first response of several back to back
                continue
            failures.append((name, point, len(body), verdict.kind.value, verdict.reason))
        dialects.add(dialect)
    elapsed = time.monotonic() - started
    assert not failures, failures[:10]
    assert dialects >= {Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC, Dialect.BEDROCK_INVOKE,
                        Dialect.BEDROCK_CONVERSE, Dialect.GEMINI}, dialects
    assert checked > 5000
    print(f"{len(found)} captures, {checked} prefixes judged, {allowed} lost no event; {elapsed:.1f} s")

