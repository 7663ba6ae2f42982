"""compare_strands: two streams of the same turn, compared block by block."""

from __future__ import annotations

import copy

import pytest

from provider_streams import cut_points, sse_spans
from conftest import shared_path

from streamtap.providers import Block, BlockKind, Dialect, Turn, analyze_bytes, compare_strands
from streamtap.providers.turn import Choice

CHAT = Dialect.OPENAI_CHAT


def turn_of(*blocks: Block) -> Turn:
    turn = Turn(Dialect.ANTHROPIC)
    turn.choices = [Choice(0, list(blocks))]
    return turn


def text(t: str, i: int = 0) -> Block:
    return Block(BlockKind.TEXT, i, text=t)


def call(id: str, args: str, i: int = 1, name: str = "get_weather") -> Block:
    return Block(BlockKind.TOOL_CALL, i, id=id, name=name, arguments_raw=args)


def test_identical():
    a = turn_of(text("Hello"), call("c1", '{"city":"Paris"}'))
    result = compare_strands(a, copy.deepcopy(a))
    assert result.kind == "identical" and result.longer is None and not result.divergent


def test_continuation_either_way_round():
    short = turn_of(text("Hello, wor"))
    long = turn_of(text("Hello, world."), call("c1", "{}"))
    forward, backward = compare_strands(short, long), compare_strands(long, short)
    assert (forward.kind, forward.longer) == ("continuation", "b")
    assert (backward.kind, backward.longer) == ("continuation", "a")
    assert (forward.block, forward.offset) == (0, 10)


def test_divergent_inside_a_block_names_block_and_offset():
    a = turn_of(text("The answer is 42."))
    b = turn_of(text("The answer is 41, or so"))
    result = compare_strands(a, b)
    assert result.kind == "divergent" and (result.choice, result.block, result.offset) == (0, 0, 15)


def test_divergent_when_the_shorter_stops_early_inside_an_earlier_block():
    # a has a shorter first block but then goes on: that is not a prefix of b
    a = turn_of(text("Hel"), call("c1", "{}"))
    b = turn_of(text("Hello"), call("c1", "{}"))
    assert compare_strands(a, b).kind == "divergent"


def test_divergent_tool_calls_and_kinds():
    base = turn_of(text("x"), call("c1", '{"a":1}'))
    other_id = turn_of(text("x"), call("c2", '{"a":1}'))
    result = compare_strands(base, other_id)
    assert result.kind == "divergent" and result.block == 1 and "tool call" in result.reason
    other_args = turn_of(text("x"), call("c1", '{"a":2}'))
    assert (compare_strands(base, other_args).block, compare_strands(base, other_args).offset) == (1, 5)
    thinking_first = turn_of(Block(BlockKind.THINKING, 0, text="x"), call("c1", '{"a":1}'))
    assert compare_strands(base, thinking_first).block == 0


def test_never_stitched_nor_picked():
    a = turn_of(text("abc"))
    b = turn_of(text("abcdef"))
    before_a, before_b = copy.deepcopy(a), copy.deepcopy(b)
    compare_strands(a, b)
    assert a == before_a and b == before_b  # the comparison changes neither turn


def test_cut_streams_are_continuations_of_the_whole_never_divergent():
    """Real captures cut anywhere: the cut turn is always a prefix of the whole one."""
    for name, dialect in (
        ("openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse", CHAT),
        ("pydantic-ai/bodies/openrouter/test_openrouter_streaming_reasoning.0.sse", CHAT),
        ("pydantic-ai/bodies/openai-responses/test_openai_responses_streaming_usage.0.sse", Dialect.OPENAI_RESPONSES),
    ):
        body = shared_path("fixtures", name).read_bytes()
        whole = analyze_bytes(body, dialect).turn
        kinds = set()
        for point in cut_points(body, sse_spans(body), inside_per_event=1):
            cut = analyze_bytes(body[:point], dialect).turn
            result = compare_strands(cut, whole)
            assert result.kind in ("continuation", "identical"), (name, point, result)
            if result.kind == "continuation":
                assert result.longer == "b"
            kinds.add(result.kind)
        assert "continuation" in kinds


def test_two_different_captures_diverge():
    a = analyze_bytes(shared_path("fixtures", "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse").read_bytes(), CHAT).turn
    b = analyze_bytes(shared_path("fixtures", "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.1.sse").read_bytes(), CHAT).turn
    result = compare_strands(a, b)
    assert result.kind == "divergent"
    assert result.block == 0  # different call ids from the first block on


def test_multi_choice():
    a = turn_of(text("A"))
    a.choices.append(Choice(1, [text("B")]))
    b = copy.deepcopy(a)
    b.choices[1].blocks[0].text = "Bb"
    assert compare_strands(a, b).kind == "continuation"
    b.choices[0].blocks[0].text = ""
    assert compare_strands(a, b).kind == "divergent"  # a is longer in choice 0, b in choice 1


def _gemini_with(part: dict) -> bytes:
    import json

    def sse(*chunks):
        return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)

    def content(parts, **more):
        return {"candidates": [{"content": {"role": "model", "parts": parts}, **more}]}

    return sse(content([{"text": "Running code."}]), content([part]), content([{"text": " Done."}], finishReason="STOP"))


@pytest.mark.parametrize("one, other", [
    ({"executableCode": {"language": "PYTHON", "code": "print(1+1)"}},
     {"executableCode": {"language": "PYTHON", "code": "print(2+2)"}}),
    ({"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "2\n"}},
     {"codeExecutionResult": {"outcome": "OUTCOME_FAILED", "output": "Traceback\n"}}),
    ({"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, {"inlineData": {"mimeType": "image/png", "data": "BBBB"}}),
])
def test_gemini_parts_kept_beside_the_text_are_compared(one, other):
    """Gemini keeps code, its result and inline data in the block's extra, not its text: two turns
    that differ only there were called identical."""

    a, b = (analyze_bytes(_gemini_with(part), Dialect.GEMINI).turn for part in (one, other))
    assert compare_strands(a, b).kind == "divergent"
    assert compare_strands(a, analyze_bytes(_gemini_with(one), Dialect.GEMINI).turn).kind == "identical"
