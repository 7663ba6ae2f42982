"""Ollama NDJSON as its API documents it: /api/chat's last line may carry only done and the
counts (no message), and its clients raise only on a non-empty error, so a line whose error is
null or "" is read on. A stitched second generation is still caught."""

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


@pytest.mark.parametrize("reason, expected", [(None, VerdictKind.UNKNOWN), ("stop", VerdictKind.COMPLETE),
                                              ("length", VerdictKind.STOPPED_BY_LIMIT)])
def test_a_chat_final_line_without_a_message_ends_the_answer(reason, expected):
    final = dict(DOCS_FINAL, **({"done_reason": reason} if reason else {}))
    analysis = judged(ANSWER + line(**final))
    assert analysis.verdict.kind is expected, analysis.verdict
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
    for body in (ANSWER + line(error=empty) + final,
                 chat("The sky", done=False, error=empty) + chat(" is blue.", done=False) + final):
        analysis = judged(body)
        assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
        assert any("empty error" in note for note in analysis.turn.notes), analysis.turn.notes


def test_a_real_error_is_errored():
    analysis = judged(ANSWER + line(error="model runner has unexpectedly stopped"))
    assert analysis.verdict.kind is VerdictKind.ERRORED and "unexpectedly stopped" in analysis.verdict.reason
