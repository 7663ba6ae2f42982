"""Ollama NDJSON as its API documents it and its client reads it: the ollama client (0.4 and later)
builds a ChatResponse of every /api/chat line, so a last line of only done and the counts (no
message, as Ollama's API docs draw it) makes it raise; it raises only on a non-empty error, so
a line whose error is null or "" is read on where the line is otherwise taken. A stitched second
generation is still caught."""

from __future__ import annotations

import json

import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes


def line(**fields) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def chat(content: str, **fields) -> bytes:
    return line(model="llama3.2", created_at="2026-12-05T08:00:00Z", message={"role": "assistant", "content": content}, **fields)


ANSWER = chat("The sky", done=False) + chat(" is blue.", done=False)
# the final line as Ollama's docs/api.md shows it for a streamed chat: no message
DOCS_FINAL = dict(model="llama3.2", created_at="2026-12-05T08:00:01Z", done=True, total_duration=4883583458, eval_count=282)


def judged(body: bytes):
    whole = analyze_bytes(body, Dialect.OLLAMA)
    byte_by_byte = analyze_bytes(body, Dialect.OLLAMA, chunk_size=1)
    assert (whole.verdict.kind, whole.verdict.reason) == (byte_by_byte.verdict.kind, byte_by_byte.verdict.reason)
    return whole


@pytest.mark.parametrize("reason", [None, "stop", "length"])
def test_a_chat_final_line_without_a_message_is_refused_by_the_client(reason):
    final = dict(DOCS_FINAL, **({"done_reason": reason} if reason else {}))
    analysis = judged(ANSWER + line(**final))
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "has nothing for its message" in analysis.verdict.reason and "ollama client" in analysis.verdict.reason
    assert analysis.turn.text() == "The sky is blue." and analysis.turn.usage.output == 282


def test_a_generate_answer_stitched_after_a_chat_answer_is_still_corrupt():
    generated = line(model="llama3.2", created_at="x", response="Hello", done=False)
    analysis = judged(ANSWER + generated + line(**dict(DOCS_FINAL, done_reason="stop")))
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "two generations" in analysis.verdict.reason


def test_another_model_on_a_line_without_a_message_is_still_corrupt():
    analysis = judged(ANSWER + line(**dict(DOCS_FINAL, model="qwen3", done_reason="stop")))
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "llama3.2 (chat)" in analysis.verdict.reason


@pytest.mark.parametrize("empty", [None, ""])
def test_an_empty_error_is_read_on_as_the_clients_do(empty):
    final = chat("", done=True, done_reason="stop", eval_count=3)
    generated = line(model="llama3.2", response="The sky", done=False)
    for body in (chat("The sky", done=False, error=empty) + chat(" is blue.", done=False) + final,
                 generated + line(error=empty) + line(model="llama3.2", response=" is blue.", done=True, done_reason="stop")):
        analysis = judged(body)
        assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
        assert any("empty error" in note for note in analysis.turn.notes), analysis.turn.notes
    # a line of only the empty error is no ChatResponse: in a chat stream the client raises on it
    analysis = judged(ANSWER + line(error=empty) + final)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and analysis.verdict.seq == 2, analysis.verdict
    assert not any("empty error" in note for note in analysis.turn.notes), analysis.turn.notes


def test_a_real_error_is_errored():
    analysis = judged(ANSWER + line(error="model runner has unexpectedly stopped"))
    assert analysis.verdict.kind is VerdictKind.ERRORED and "unexpectedly stopped" in analysis.verdict.reason
