"""Which faults the bytes alone reveal, per dialect: README's fault-detectability table, measured.

Each of streamtap's own faults (``streamtap.replay.faults``) is applied to a real capture per
dialect (Ollama: a constructed stream, no capture exists) at a text delta, the faulted body is
judged, and "revealed" means the verdict is no longer ``complete``. The measured table must be the
one README.md prints, row for row.
"""

from __future__ import annotations

import base64
import re

import orjson
import pytest
from conftest import REPO, shared_path

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.replay.faults import parse_faults, plan, Timing
from streamtap.replay.source import Source, view_frame
from streamtap.wire import EventStreamDecoder, Malformed, NDJSONDecoder, SSEDecoder, Tail

FAULTS = ("cut", "drop", "duplicate", "reorder", "corrupt byte", "error", "stall")

CAPTURES = {  # dialect -> (capture under fixtures/, wire, error kind)
    Dialect.OPENAI_CHAT: ("pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse", "sse", "openai"),
    Dialect.OPENAI_RESPONSES: ("pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.2.sse", "sse", "openai"),
    Dialect.ANTHROPIC: ("pydantic-ai/bodies/anthropic/test_anthropic_model_thinking_part_stream.0.sse", "sse", "overloaded_error"),
    Dialect.BEDROCK_INVOKE: ("openllmetry/bodies/invoke_stream_anthropic_claude3.0.bin", "eventstream",
                             "modelStreamErrorException"),
    Dialect.BEDROCK_CONVERSE: ("pydantic-ai/bodies/bedrock/test_bedrock_model_stream.0.bin", "eventstream",
                               "modelStreamErrorException"),
    Dialect.GEMINI: ("pydantic-ai/bodies/google/test_google_model_stream.0.sse", "sse", "openai"),
    Dialect.OLLAMA: (None, "ndjson", "openai"),
}


def _ollama() -> bytes:
    words = ["The", " sky", " is", " blue", " because", " of", " Rayleigh", " scattering", "."]
    lines = [{"model": "llama3", "message": {"role": "assistant", "content": w}, "done": False} for w in words]
    lines.append({"model": "llama3", "message": {"role": "assistant", "content": ""}, "done": True,
                  "done_reason": "stop", "prompt_eval_count": 9, "eval_count": len(words)})
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def events(body: bytes, wire: str) -> list:
    decoder = {"sse": SSEDecoder, "eventstream": EventStreamDecoder, "ndjson": NDJSONDecoder}[wire]()
    return [e for e in decoder.feed(body) + decoder.close() if not isinstance(e, (Tail, Malformed))]


def delta_text(event, dialect: Dialect) -> str | None:
    """The answer text an event carries, when it is a plain text delta (else None)."""
    if dialect is Dialect.BEDROCK_INVOKE:
        obj = orjson.loads(base64.b64decode(orjson.loads(event.payload)["bytes"]))
    elif dialect is Dialect.BEDROCK_CONVERSE:
        if event.headers.get(":event-type") != "contentBlockDelta":
            return None
        return orjson.loads(event.payload)["delta"].get("text")
    elif dialect is Dialect.OLLAMA:
        obj = event.value
        return None if obj.get("done") else obj["message"]["content"]
    else:
        if event.data == "[DONE]":
            return None
        obj = orjson.loads(event.data)
    if dialect in (Dialect.ANTHROPIC, Dialect.BEDROCK_INVOKE):
        delta = obj.get("delta") or {}
        return delta.get("text") if obj.get("type") == "content_block_delta" and delta.get("type") == "text_delta" else None
    if dialect is Dialect.OPENAI_RESPONSES:
        return obj.get("delta") if obj.get("type") == "response.output_text.delta" else None
    if dialect is Dialect.OPENAI_CHAT:
        choices = obj.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        return delta.get("content") if set(delta) <= {"content", "role"} and not choices[0].get("finish_reason") else None
    if dialect is Dialect.GEMINI:
        candidates = obj.get("candidates") or [{}]
        parts = (candidates[0].get("content") or {}).get("parts") or [{}]
        return parts[0].get("text") if not candidates[0].get("finishReason") and not parts[0].get("thought") else None
    return None


def measure(dialect: Dialect) -> dict[str, bool]:
    """fault -> revealed (the verdict is not complete) for one dialect's capture."""
    name, wire, error_kind = CAPTURES[dialect]
    body = _ollama() if name is None else shared_path("fixtures", name).read_bytes()
    assert analyze_bytes(body, dialect, wire=wire).verdict.kind is VerdictKind.COMPLETE
    found = events(body, wire)
    texts = [delta_text(e, dialect) for e in found]
    n = next(i for i in range(len(found) - 1) if texts[i] and texts[i + 1] and texts[i] != texts[i + 1])
    # the body's first chunk sent again reads as the response starting over: a later delta is sent twice
    twice = n or next(i for i in range(1, len(found)) if texts[i])
    source = Source.from_frames([e.raw for e in found], wire=wire, dialect=dialect.value)
    # text formats: the byte flipped is one inside the delta's text (a JSON structural byte would be
    # noticed anyway); event-stream: the default, the middle of the payload
    raw, encoded = found[n].raw, texts[n].encode()
    inside_text = raw.rfind(encoded) + len(encoded) // 2 - view_frame(raw, wire).payload_start
    specs = {
        "cut": f"cut:event={n}",
        "drop": f"drop:event={n}",
        "duplicate": f"duplicate:event={twice}",
        "reorder": f"reorder:event={n}",
        "corrupt byte": f"corrupt:frame={n},field=payload" if wire == "eventstream" else
                        f"corrupt:frame={n},field=payload,offset={inside_text}",
        "error": f"error:kind={error_kind},after={n}",
        "stall": f"stall:after={n},secs=30",
    }
    revealed = {}
    for fault, spec in specs.items():
        served = plan(source, parse_faults(spec), Timing.parse("original")).body
        if fault != "stall":
            assert served != body, spec
        verdict = analyze_bytes(served, dialect, wire=wire).verdict
        revealed[fault] = verdict.kind is not VerdictKind.COMPLETE
    return revealed


def readme_table() -> dict[str, dict[str, bool]]:
    text = (REPO / "README.md").read_text()
    header = re.search(r"^\| dialect \| cut \| drop \| duplicate \| reorder \| corrupt byte \| error \| stall \|$", text, re.M)
    assert header, "README has no fault-detectability table"
    rows = {}
    for line in text[header.end():].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = {f: cell.startswith("yes") for f, cell in zip(FAULTS, cells[1:])}
    return rows


@pytest.mark.parametrize("dialect", list(CAPTURES), ids=[d.value for d in CAPTURES])
def test_readme_detectability_row_is_what_the_faults_do(dialect):
    assert readme_table()[dialect.value] == measure(dialect)


def test_readme_table_has_every_dialect():
    assert set(readme_table()) == {d.value for d in CAPTURES}


@pytest.mark.parametrize("dialect", [d for d, (_, wire, _) in CAPTURES.items() if wire != "eventstream"],
                         ids=[d.value for d, (_, wire, _) in CAPTURES.items() if wire != "eventstream"])
def test_a_letter_changed_inside_text_is_seen_only_where_the_text_is_repeated(dialect):
    """README: a byte changed to another valid letter inside a text delta shows only in Responses."""
    name, wire, _ = CAPTURES[dialect]
    body = _ollama() if name is None else shared_path("fixtures", name).read_bytes()
    found = events(body, wire)
    n, text = next((i, t) for i, e in enumerate(found) if (t := delta_text(e, dialect)) and len(t) > 1 and t.isascii())
    raw = found[n].raw
    at = raw.rfind(text.encode()) + len(text) // 2
    letter = b"Q" if raw[at:at + 1] != b"Q" else b"R"
    changed = body[: found[n].start + at] + letter + body[found[n].start + at + 1:]
    verdict = analyze_bytes(changed, dialect, wire=wire).verdict
    assert (verdict.kind is not VerdictKind.COMPLETE) is (dialect is Dialect.OPENAI_RESPONSES), verdict
