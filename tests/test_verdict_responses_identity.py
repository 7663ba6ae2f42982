"""Responses streams whose finished items contradict what their deltas streamed: a part or a
reasoning summary the finished item leaves out, a call whose call_id or name changes between
output_item.added and its end, and a reasoning summary aimed at a message. The openai SDK hands
the app the finished items, so the app gets another answer than the stream showed: corrupt.
So is one item at two output indexes (the SDK refuses the response), a part's .done event that
its deltas do not add up to, and a later lifecycle event's other copy of a finished item (the SDK
swaps it in)."""

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


# -- one item twice: the same item id, or one call_id, at two output indexes ----------------------

def test_one_message_at_two_output_indexes_is_corrupt():
    """A message sent twice (stitched, or duplicated in flight under the next index): its text would
    count twice, and the openai SDK refuses the response ("conflicting output identities")."""
    body = body_of([(message(), message("Paris."), text_part(0, 0, "Paris.")),
                    (message(), message("Paris."), text_part(1, 0, "Paris."))])
    assert "conflicting output identities" in str(sdk_final(body))
    analysis = analyze_bytes(body, Dialect.OPENAI_RESPONSES)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "output item 1" in verdict.reason and "has id m1, which output item 0 has" in verdict.reason, verdict
    assert (verdict.evidence["output_index"], verdict.evidence["other_index"]) == (1, 0)
    assert analysis.turn.text() == "Paris."  # the second copy is not added to the answer


def test_two_calls_under_one_call_id_are_corrupt():
    """Two function calls the app would answer under one call_id: the openai SDK refuses the response."""
    def a_call(index: int, item_id: str, call_id: str = "call_1") -> tuple[dict, dict, list[bytes]]:
        done = {**call(call_id), "id": item_id}
        arguments = done["arguments"]
        return ({**done, "arguments": ""}, done,
                [ev("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=arguments),
                 ev("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=arguments)])

    body = body_of([a_call(0, "fc1"), a_call(1, "fc2")])
    assert "conflicting output identities" in str(sdk_final(body))
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "call_id call_1, which output item 0 has" in verdict.reason, verdict
    other = body_of([a_call(0, "fc1"), a_call(1, "fc2", "call_2")])
    assert len(sdk_final(other).output) == 2 and verdict_of(other).kind is VerdictKind.COMPLETE  # the control


# -- a part's .done events: its whole text, which its deltas must add up to ------------------------

def test_a_content_part_done_that_contradicts_the_deltas_is_corrupt():
    """The app that reads the events gets content_part.done's part.text: another text than the deltas."""
    events = text_part(0, 0, "Paris.")
    events[-1] = events[-1].replace(b'"text":"Paris."', b'"text":"Rome."')
    body = body_of([(message(), message("Paris."), events)])
    parts = [e.part.text for e in _sdk_events(body) if e.type == "response.content_part.done"]
    assert parts == ["Rome."]
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "disagree with response.content_part.done at block 0, byte 0" in verdict.reason, verdict


def test_a_reasoning_summary_part_done_that_contradicts_the_deltas_is_corrupt():
    reasoning = {"id": "rs1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think."}]}
    where = {"item_id": "rs1", "output_index": 0, "summary_index": 0}
    events = summary_events("rs1", "Think.") + [
        ev("response.reasoning_summary_text.done", **where, text="Think."),
        ev("response.reasoning_summary_part.done", **where, part={"type": "summary_text", "text": "Thought."})]
    body = body_of([({**reasoning, "summary": []}, reasoning, events)])
    parts = [e.part.text for e in _sdk_events(body) if e.type == "response.reasoning_summary_part.done"]
    assert parts == ["Thought."]
    verdict = verdict_of(body)
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "disagree with response.reasoning_summary_part.done at block 0, byte 2" in verdict.reason, verdict
    agreeing = body.replace(b'"text":"Thought."', b'"text":"Think."')
    assert verdict_of(agreeing).kind is VerdictKind.COMPLETE  # the control


def _sdk_events(body: bytes) -> list:
    """The typed events the openai SDK's stream helper hands an app that reads them."""
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(upstream)))
    with client.responses.stream(model="m", input="hi") as stream:
        return list(stream)


# -- a later lifecycle event's copy of a finished item --------------------------------------------

@pytest.mark.parametrize("copy_text, kind", [("Rome.", VerdictKind.CORRUPT), ("Paris.", VerdictKind.COMPLETE)],
                         ids=["another text", "the same"])
def test_a_later_in_progress_whose_output_holds_another_copy_of_a_finished_item_is_corrupt(copy_text, kind):
    """The openai SDK swaps a start event's copy of a finished item in for it, and hands the app that
    copy where the terminal event lists no output: another text than the stream's is corrupt."""
    body = body_of([(message(), message("Paris."), text_part(0, 0, "Paris."))])
    end = body.index(b"event: response.completed")
    completed = {"id": "resp_A", "object": "response", "status": "completed", "model": "gpt"}  # no output
    body = body[:end] + ev("response.in_progress", response=response("in_progress", [message(copy_text)])) + \
        ev("response.completed", response=completed)
    assert sdk_final(body).output_text == copy_text  # what the app gets
    verdict = verdict_of(body)
    assert verdict.kind is kind, verdict
    if kind is VerdictKind.CORRUPT:
        assert "the deltas disagree with response.in_progress at block 0, byte 0" in verdict.reason, verdict
