"""Helpers for the provider tests: captured bodies, cassette responses, re-framed chunk lists, cuts.

Nothing here decides a verdict; it only turns ../shared/ fixtures into the bytes a
provider would have sent. Re-framed chunk lists are labelled "constructed" framing
around real payloads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from conftest import FIXTURES

from streamtap.providers import RequestInfo
from streamtap.wire import SSEDecoder, Tail


@dataclass
class Captured:
    name: str
    body: bytes
    request: RequestInfo | None = None
    content_type: str | None = None
    status: int = 200


def chunk_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def frame_chat(lines: list[bytes], done: bool = True) -> bytes:
    """Constructed SSE framing for Chat Completions payloads: ``data: <line>`` then ``[DONE]``."""
    return b"".join(b"data: " + line + b"\n\n" for line in lines) + (b"data: [DONE]\n\n" if done else b"")


def frame_responses(lines: list[bytes]) -> bytes:
    """Constructed SSE framing for Responses payloads: ``event: <type>`` + ``data: <line>``."""
    out = []
    for line in lines:
        kind = orjson.loads(line).get("type", "message")
        out.append(b"event: " + kind.encode() + b"\ndata: " + line + b"\n\n")
    return b"".join(out)


def frame_gemini_sse(lines: list[bytes]) -> bytes:
    """Constructed SSE framing for Gemini payloads, CRLF like the real API."""
    return b"".join(b"data: " + line + b"\r\n\r\n" for line in lines)


def frame_gemini_array(lines: list[bytes], close: bool = True) -> bytes:
    """Constructed JSON-array framing (``alt=json``): ``[`` elements ``,`` ... ``]``."""
    return b"[" + b",\r\n".join(lines) + (b"]" if close else b"")


def vercel(*parts: str) -> Path:
    return FIXTURES.joinpath("vercel-ai", *parts)


def cassette_responses(pattern: str) -> list[Captured]:
    """Every interaction's response body from the cassettes matching ``pattern``, with its request."""
    found = []
    for path in sorted(FIXTURES.glob(pattern)):
        document = yaml.safe_load(path.read_text())
        for number, interaction in enumerate(document.get("interactions") or []):
            request, response = interaction["request"], interaction["response"]
            body = (response.get("body") or {}).get("string")
            if body is None:
                continue
            body = body if isinstance(body, bytes) else body.encode("utf-8")
            headers = {k.lower(): (v[0] if isinstance(v, list) else v) for k, v in (response.get("headers") or {}).items()}
            req_body = request.get("parsed_body", request.get("body"))
            if isinstance(req_body, (dict, list)):
                req_body = orjson.dumps(req_body)
            elif isinstance(req_body, str):
                req_body = req_body.encode()
            info = RequestInfo(request.get("method", "POST"), request["uri"], {}, req_body)
            status = int((response.get("status") or {}).get("code", 200))
            found.append(Captured(f"{path.relative_to(FIXTURES)}#{number}", body, info, headers.get("content-type"), status))
    return found


def sse_spans(body: bytes) -> list[tuple[int, int]]:
    decoder = SSEDecoder()
    events = decoder.feed(body) + decoder.close()
    return [(e.start, e.end) for e in events if not isinstance(e, Tail)]


def cut_points(body: bytes, spans: list[tuple[int, int]], inside_per_event: int = 1, seed: int = 7) -> list[int]:
    """Every event boundary but the last, plus sampled offsets strictly inside events."""
    rng = random.Random(seed)
    points = {end for _, end in spans[:-1]}
    for start, end in spans:
        for _ in range(inside_per_event):
            if end - start > 2:
                points.add(rng.randrange(start + 1, end - 1))
    return sorted(p for p in points if 0 < p < len(body) and body[p:].strip())
