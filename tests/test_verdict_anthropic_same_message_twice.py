"""The same Anthropic message twice in one body is corrupt, not two steps.

A cut that falls right after ``message_stop``, and a retry stitched on whole, gives a body with
the response and then the same response again, with the same ``msg_...`` id. Multi-step recordings
hold several messages back to back too, but each with a new id. Chat Completions and Responses
call the doubled body corrupt; Anthropic must too, naming the id and where it starts again.
"""

from __future__ import annotations

import copy

from conftest import shared_path
from test_providers_anthropic import START, end, sse, text_block

from streamtap.providers import Dialect, VerdictKind, analyze_bytes


def message(message_id: str, text: str) -> bytes:
    start = copy.deepcopy(START)
    start["message"]["id"] = message_id
    return sse(start, *text_block(0, text), *end("end_turn"))


def assert_starts_again(body: bytes, message_id: str, at: int) -> None:
    verdict = analyze_bytes(body, Dialect.ANTHROPIC).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert message_id in verdict.reason and "starts again" in verdict.reason, verdict
    assert verdict.offset == at and verdict.evidence["message_id"] == message_id, verdict


def test_a_real_capture_sent_twice_is_corrupt() -> None:
    body = shared_path("fixtures", "openllmetry", "bodies", "anthropic_thinking_stream.0.sse").read_bytes()
    once = analyze_bytes(body, Dialect.ANTHROPIC)
    assert once.verdict.kind is VerdictKind.COMPLETE, once.verdict
    twice = analyze_bytes(body + body, Dialect.ANTHROPIC)
    assert_starts_again(body + body, once.turn.response_id, len(body))
    evidence = twice.verdict.evidence
    assert (evidence["first_seq"], evidence["first_offset"]) == (0, 0) and twice.verdict.seq > 0, twice.verdict
    # the turn holds the answer once, not doubled
    assert twice.turn.text() == once.turn.text()


def test_a_crafted_message_sent_twice_is_corrupt() -> None:
    body = message("msg_same", "Hello.")
    assert analyze_bytes(body, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
    assert_starts_again(body + body, "msg_same", len(body))


def test_an_earlier_message_again_after_a_next_step_is_corrupt() -> None:
    first, second = message("msg_a", "Let me check."), message("msg_b", "Done.")
    assert_starts_again(first + second + first, "msg_a", len(first + second))


def test_steps_with_new_ids_stay_back_to_back() -> None:
    body = b"".join(message(f"msg_{i}", f"step {i}.") for i in range(3))
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert any("several responses back to back" in note for note in analysis.turn.notes), analysis.turn.notes
    assert analysis.turn.text() == "step 0.step 1.step 2."


def test_the_first_ids_are_still_known_after_many_steps() -> None:
    """The remembered ids are capped; the earliest ones, those a replay repeats, are kept."""
    steps = b"".join(message(f"msg_{i}", "ok.") for i in range(300))
    assert analyze_bytes(steps, Dialect.ANTHROPIC).verdict.kind is VerdictKind.COMPLETE
    assert_starts_again(steps + message("msg_0", "ok."), "msg_0", len(steps))


def test_message_start_repeated_before_any_content_stays_tolerated() -> None:
    body = sse(START, START, *text_block(0, "Hello, World!"), *end("end_turn"))
    analysis = analyze_bytes(body, Dialect.ANTHROPIC)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "Hello, World!"
