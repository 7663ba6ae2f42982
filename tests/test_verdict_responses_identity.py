"""Responses streams whose finished items contradict what their deltas streamed: a part or a
reasoning summary the finished item leaves out, a call whose call_id or name changes between
output_item.added and its end, and a reasoning summary aimed at a message. The openai SDK hands
the app the finished items, so the app gets another answer than the stream showed: corrupt."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes


def ev(kind: str, **fields) -> bytes:
    return f"event: {kind}\ndata: {orjson.dumps({'type': kind, **fields}).decode()}\n\n".encode()


def response(status: str, output: list) -> dict:
    return {"id": "resp_A", "object": "response", "status": status, "model": "gpt", "output": output}


def body_of(items: list[tuple[dict, dict, list[bytes]]]) -> bytes:
    """(the item as added, the item as done, the events between) for each output item in turn."""
    out = ev("response.created", response=response("in_progress", []))
    for index, (added, done, between) in enumerate(items):
        out += ev("response.output_item.added", output_index=index, item=added)
        out += b"".join(between)
        out += ev("response.output_item.done", output_index=index, item=done)
    return out + ev("response.completed", response=response("completed", [done for _, done, _ in items]))


def text_part(index: int, part: int, text: str) -> list[bytes]:
    where = {"item_id": "m1", "output_index": index, "content_index": part}
    whole = {"type": "output_text", "text": text, "annotations": []}
    return [ev("response.content_part.added", **where, part={**whole, "text": ""}),
            ev("response.output_text.delta", **where, delta=text),
            ev("response.output_text.done", **where, text=text),
            ev("response.content_part.done", **where, part=whole)]


def message(*texts: str) -> dict:
    return {"id": "m1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []} for t in texts]}


def call(call_id: str = "call_1", name: str = "get_capital", arguments: str = '{"country":"France"}') -> dict:
    return {"id": "fc1", "type": "function_call", "status": "completed", "call_id": call_id, "name": name,
            "arguments": arguments}


def call_events(arguments: str = '{"country":"France"}') -> list[bytes]:
    return [ev("response.function_call_arguments.delta", item_id="fc1", output_index=0, delta=arguments),
            ev("response.function_call_arguments.done", item_id="fc1", output_index=0, arguments=arguments)]


def summary_events(item_id: str, text: str) -> list[bytes]:
    where = {"item_id": item_id, "output_index": 0, "summary_index": 0}
    return [ev("response.reasoning_summary_text.delta", **where, delta=text)]


def sdk_final(body: bytes):
    """What the openai SDK's stream helper hands the app, or the exception it raises."""
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(upstream)))
    try:
        with client.responses.stream(model="m", input="hi") as stream:
            for _ in stream:
                pass
            return stream.get_final_response()
    except Exception as exc:  # noqa: BLE001 - what the app would get instead of an answer
        return exc


def verdict_of(body: bytes):
    return analyze_bytes(body, Dialect.OPENAI_RESPONSES).verdict


def test_the_whole_streams_are_complete():
    """The controls: the same streams with finished items that agree with the deltas."""
    two_parts = body_of([(message(), message("Paris.", " Also this."),
                          text_part(0, 0, "Paris.") + text_part(0, 1, " Also this."))])
    assert verdict_of(two_parts).kind is VerdictKind.COMPLETE
    final = sdk_final(two_parts)
    assert [p.text for p in final.output[0].content] == ["Paris.", " Also this."]
    a_call = body_of([({**call(), "arguments": ""}, call(), call_events())])
    assert verdict_of(a_call).kind is VerdictKind.COMPLETE
    assert sdk_final(a_call).output[0].name == "get_capital"
    reasoning = {"id": "rs1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think."}]}
    thought = body_of([({**reasoning, "summary": []}, reasoning, summary_events("rs1", "Think."))])
    assert verdict_of(thought).kind is VerdictKind.COMPLETE


def test_a_streamed_part_the_finished_message_leaves_out_is_corrupt():
    body = body_of([(message(), message("Paris."), text_part(0, 0, "Paris.") + text_part(0, 1, " Wire $500."))])
    final = sdk_final(body)
    assert [p.text for p in final.output[0].content] == ["Paris."]  # the app never sees the second part
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "leaves out content part 1 of output item 0" in verdict.reason, verdict


def test_a_streamed_summary_the_finished_reasoning_item_leaves_out_is_corrupt():
    reasoning = {"id": "rs1", "type": "reasoning", "summary": []}
    body = body_of([(reasoning, reasoning, summary_events("rs1", "I think the answer is 42."))])
    assert sdk_final(body).output[0].summary == []
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT and "leaves out summary part 0" in verdict.reason, verdict


@pytest.mark.parametrize("field, value", [("call_id", "call_OTHER"), ("name", "delete_account")])
def test_a_call_whose_identity_changes_by_its_end_is_corrupt(field, value):
    body = body_of([({**call(), "arguments": ""}, {**call(), field: value}, call_events())])
    final = sdk_final(body)
    if field == "call_id":
        assert isinstance(final, Exception)  # the SDK refuses it
    else:
        assert final.output[0].name == value  # the app calls another tool than the one streamed
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert f"added with {field} {call()[field]}" in verdict.reason and value in verdict.reason, verdict


def test_a_reasoning_summary_on_a_message_item_is_corrupt():
    body = body_of([(message(), message("Paris."), summary_events("m1", "A thought.") + text_part(0, 0, "Paris."))])
    assert [p.text for p in sdk_final(body).output[0].content] == ["Paris."]
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "added as a message, not a reasoning item" in verdict.reason, verdict
