"""Anthropic blocks beyond the client's tool call:

- a server tool's use (web search, web fetch, code execution) whose input JSON lost a fragment is
  corrupt, as a tool_use block is: the provider's tool read something else than was streamed;
- an input_json_delta sent to a tool's result block is corrupt (it had crashed the assembler);
- an index that is a JSON boolean names no block (True would find block 1 in a dict)."""

from __future__ import annotations

import json

import orjson
import pytest
from conftest import shared_path
from provider_streams import chunk_lines

from streamtap.providers import Dialect, VerdictKind, analyze_bytes


def framed(objects: list[dict]) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (o["type"].encode(), json.dumps(o).encode()) for o in objects)


def judged(body: bytes):
    whole = analyze_bytes(body, Dialect.ANTHROPIC)
    by_byte = analyze_bytes(body, Dialect.ANTHROPIC, chunk_size=1)
    assert (whole.verdict.kind, whole.verdict.reason) == (by_byte.verdict.kind, by_byte.verdict.reason)
    return whole


@pytest.mark.parametrize("capture", ["anthropic-web-search-tool.1.chunks.txt", "anthropic-web-fetch-tool.1.chunks.txt",
                                     "anthropic-code-execution-20250825.1.chunks.txt"])
def test_a_server_tool_input_that_lost_a_fragment_is_corrupt(capture):
    objects = [orjson.loads(line) for line in chunk_lines(shared_path("fixtures", "vercel-ai", "anthropic", capture))]
    assert judged(framed(objects)).verdict.kind is VerdictKind.COMPLETE
    server = {o["index"] for o in objects if o["type"] == "content_block_start" and o["content_block"]["type"] == "server_tool_use"}
    fragments = [i for i, o in enumerate(objects) if o["type"] == "content_block_delta" and o["index"] in server
                 and o["delta"]["type"] == "input_json_delta" and o["delta"]["partial_json"]]
    assert fragments
    for dropped in (fragments[-1], fragments[len(fragments) // 2]):
        mutated = objects[:dropped] + objects[dropped + 1 :]
        analysis = judged(framed(mutated))
        blocks = [b for b in analysis.turn.choices[0].blocks if b.arguments_error]
        if not blocks:  # a fragment whose loss still leaves JSON (a whole value): nothing to see in the bytes
            continue
        assert analysis.verdict.kind is VerdictKind.CORRUPT, (capture, dropped, analysis.verdict)
        assert "invalid argument JSON" in analysis.verdict.reason


def message(*blocks: dict, stop: str = "end_turn") -> list[dict]:
    return [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                                              "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}},
        *blocks,
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]


def block(index: int, content_block: dict, *deltas: dict) -> list[dict]:
    return [{"type": "content_block_start", "index": index, "content_block": content_block},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": index}]


@pytest.mark.parametrize("kind", ["server_tool_use", "mcp_tool_use"])
def test_a_hand_made_server_tool_input_missing_its_middle_is_corrupt(kind):
    def stream(fragments):
        use = block(0, {"type": kind, "id": "srvtoolu_1", "name": "web_search", "input": {}},
                    *({"type": "input_json_delta", "partial_json": f} for f in fragments))
        result = block(1, {"type": kind.replace("_use", "_result").replace("server_tool", "web_search_tool"),
                           "tool_use_id": "srvtoolu_1", "content": []})
        text = block(2, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Answer."})
        return framed(message(*use, *result, *text))

    assert judged(stream(['{"query": ', '"weather ', 'in Paris"}'])).verdict.kind is VerdictKind.COMPLETE
    assert judged(stream(['{"query": ', 'in Paris"}'])).verdict.kind is VerdictKind.CORRUPT


@pytest.mark.parametrize("stop, kind", [("end_turn", VerdictKind.UNKNOWN), ("stop_sequence", VerdictKind.UNKNOWN),
                                        ("pause_turn", VerdictKind.STOPPED_BY_LIMIT), ("tool_use", VerdictKind.COMPLETE)])
def test_a_server_tool_use_without_its_result_is_unknown_where_the_model_went_on(stop, kind):
    """A server tool's result follows its use before the model goes on: under a stop of the model's
    own, a use without one says a block was lost. A pause, or a stop for a client tool, may leave it
    open (its result comes in a later response); a result without its use proves nothing."""
    use = block(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "input_json_delta", "partial_json": '{"query": "x"}'})

    def result(index: int) -> list[dict]:
        return block(index, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []})

    def text(index: int) -> list[dict]:
        return block(index, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Answer."})

    def call(index: int) -> list[dict]:
        return block(index, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
                     {"type": "input_json_delta", "partial_json": "{}"})

    verdict = judged(framed(message(*use, *(call(1) if stop == "tool_use" else text(1)), stop=stop))).verdict
    assert verdict.kind is kind, verdict
    if kind is VerdictKind.UNKNOWN:
        assert "server tool use srvtoolu_1 (web_search, block 0) has no result" in verdict.reason, verdict
    assert judged(framed(message(*use, *result(1), *text(2)))).verdict.kind is VerdictKind.COMPLETE
    assert judged(framed(message(*result(0), *text(1)))).verdict.kind is VerdictKind.COMPLETE


def test_input_json_delta_to_a_tool_result_block_is_corrupt():
    use = block(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
                {"type": "input_json_delta", "partial_json": '{"query": "x"}'})
    result = [{"type": "content_block_start", "index": 1,
               "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}},
              {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
              {"type": "content_block_stop", "index": 1}]
    analysis = judged(framed(message(*use, *result)))
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "input_json_delta does not fit" in analysis.verdict.reason


@pytest.mark.parametrize("index, delta", [(False, {"type": "text_delta", "text": " extra"}),
                                          (True, {"type": "input_json_delta", "partial_json": "{}"})])
def test_a_boolean_index_names_the_block_the_sdk_reads_it_as(index, delta):
    """The anthropic SDK builds its events leniently and reads false and true as 0 and 1: a late
    delta so numbered goes to that block, which has stopped."""
    text = block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Hi"})
    tool = block(1, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
                 {"type": "input_json_delta", "partial_json": '{"a": 1}'})
    late = {"type": "content_block_delta", "index": index, "delta": delta}
    analysis = judged(framed(message(*text, *tool, late, stop="tool_use")))
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert f"after block {int(index)} was closed by content_block_stop" in analysis.verdict.reason
    assert analysis.turn.text() == "Hi"


@pytest.mark.parametrize("index", ["0", " 0", 0.0, "0.0"])
def test_an_index_the_sdk_reads_as_a_whole_number_is_that_block(index):
    """Served to the real SDK, "0" or 0.0 is block 0: its stream helper returns the whole text."""
    import anthropic
    import httpx2

    events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                                     "usage": {"input_tokens": 1, "output_tokens": 1}}},
              {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "Hi there"}},
              {"type": "content_block_stop", "index": index},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 3}},
              {"type": "message_stop"}]
    body = framed(events)
    http = httpx2.Client(transport=httpx2.MockTransport(  # the anthropic SDK is built on httpx2
        lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)))
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://127.0.0.1:9", max_retries=0, http_client=http)
    with client.messages.stream(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_message()
    analysis = judged(body)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text() == "".join(part.text for part in final.content) == "Hi there"
