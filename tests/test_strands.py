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


def _framed(name: str) -> bytes:
    """A vercel-ai capture (one chunk payload a line) framed as the SSE body it came in."""
    lines = [line for line in shared_path("fixtures", name).read_bytes().splitlines() if line.strip()]
    return b"".join(b"data: " + line + b"\r\n\r\n" for line in lines)


@pytest.mark.parametrize("name", [
    "vercel-ai/google/google-stream-tool-call-arguments.chunks.txt",
    "vercel-ai/google/google-vertex-stream-tool-call-arguments-nested.1.chunks.txt",
    "vercel-ai/google/google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt",
    "vercel-ai/google/google-stream-no-args-tool-call.chunks.txt",
])
def test_cut_gemini_streamed_calls_are_continuations_of_the_whole(name):
    """Gemini builds a streamed call's arguments path by path (partialArgs): a cut call's
    arguments_raw is what it had so far written out, strings and braces closed, never a prefix of
    the whole; it was called divergent from the stream it was cut from."""
    body = _framed(name)
    whole = analyze_bytes(body, Dialect.GEMINI).turn
    kinds = set()
    for point in cut_points(body, sse_spans(body), inside_per_event=1):
        cut = analyze_bytes(body[:point], Dialect.GEMINI).turn
        for result, longer in ((compare_strands(cut, whole), "b"), (compare_strands(whole, cut), "a")):
            assert result.kind in ("continuation", "identical"), (point, result)
            assert result.kind == "identical" or result.longer == longer
        kinds.add(compare_strands(cut, whole).kind)
    assert "continuation" in kinds


def _gemini_call(*parts: dict, finish: bool = True) -> Turn:
    """A Gemini turn with one function call streamed as these partialArgs, one chunk each."""
    import json

    def chunk(call: dict, **more) -> bytes:
        candidate = {"content": {"role": "model", "parts": [{"functionCall": call}]}, **more}
        return b"data: " + json.dumps({"candidates": [candidate], "responseId": "r1"}).encode() + b"\r\n\r\n"

    body = chunk({"name": "weather", "willContinue": True})
    body += b"".join(chunk({"partialArgs": [part], "willContinue": True}) for part in parts)
    if finish:
        body += chunk({}, finishReason="STOP")
    return analyze_bytes(body, Dialect.GEMINI).turn


def test_a_cut_gemini_call_with_other_arguments_diverges_and_names_where():
    city = {"jsonPath": "$.city", "stringValue": "Paris"}
    unit = {"jsonPath": "$.unit", "stringValue": "C"}
    whole = _gemini_call(city, unit, {"jsonPath": "$.days", "numberValue": 3})
    assert compare_strands(_gemini_call({**city, "stringValue": "Pa", "willContinue": True}, finish=False),
                           whole).kind == "continuation"
    other_city = compare_strands(_gemini_call({**city, "stringValue": "Lon"}, finish=False), whole)
    assert other_city.kind == "divergent" and "$.city" in other_city.reason and other_city.block == 0
    other_order = compare_strands(_gemini_call(unit, finish=False), whole)  # keys come in the order sent
    assert other_order.kind == "divergent" and "$.unit" in other_order.reason
    other_number = compare_strands(_gemini_call(city, unit, {"jsonPath": "$.days", "numberValue": 4}, finish=False), whole)
    assert other_number.kind == "divergent" and "$.days" in other_number.reason
    # two calls that both ended compare exactly: the shorter one is not the start of the other
    assert compare_strands(_gemini_call({**city, "stringValue": "Pa"}), whole).kind == "divergent"


def _server_tool_turn(query: str, ended: bool = True) -> Turn:
    """An Anthropic turn whose server tool (web search) input is ``{"query": ...}``, cut inside it unless ``ended``."""
    import json

    partial = json.dumps({"query": query}) if ended else json.dumps({"query": query})[:-2]
    events = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                                               "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": partial}},
    ]
    if ended:
        events += [{"type": "content_block_stop", "index": 0},
                   {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 5}},
                   {"type": "message_stop"}]
    body = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    return analyze_bytes(body, Dialect.ANTHROPIC).turn


def test_server_tool_inputs_are_compared():
    """A server tool's input is in arguments_raw as a client tool call's is: two strands searching
    for different things were identical, and a cut one a continuation of another search."""
    paris, acme = _server_tool_turn("weather in Paris"), _server_tool_turn("stock price of ACME")
    assert compare_strands(paris, copy.deepcopy(paris)).kind == "identical"
    result = compare_strands(paris, acme)
    assert result.kind == "divergent" and (result.block, result.offset) == (0, 11)
    cut = _server_tool_turn("weather in Paris", ended=False)
    assert compare_strands(cut, acme).kind == "divergent"
    assert (compare_strands(cut, paris).kind, compare_strands(cut, paris).longer) == ("continuation", "b")
