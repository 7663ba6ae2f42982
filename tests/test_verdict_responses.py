"""Responses verdicts that must never be complete (provider-streams.md §2): a payload with a
top-level "error" (the openai SDK raises on it), two responses stitched into one body
(§2.4: the response id must not change between lifecycle events), and a stream that lost its
head (§2.5: only a starting_after replay starts after response.created)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from conftest import shared_path
from provider_streams import openai_responses, sse_spans

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.providers.request import may_resume

RESPONSES = Dialect.OPENAI_RESPONSES


def sse(data: dict | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


def ev(kind: str, **fields) -> bytes:
    return sse({"type": kind, **fields}, kind)


ITEM = {"id": "m1", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}


def response(rid: str, status: str = "completed", output: list | None = None) -> dict:
    return {"id": rid, "object": "response", "status": status, "model": "gpt", "output": output or []}


def start(rid: str) -> bytes:
    return (ev("response.created", response=response(rid, "in_progress"))
            + ev("response.in_progress", response=response(rid, "in_progress")))


def output() -> bytes:
    return (ev("response.output_item.added", output_index=0, item={**ITEM, "content": []})
            + ev("response.content_part.added", item_id="m1", output_index=0, content_index=0,
                 part={"type": "output_text", "text": ""})
            + ev("response.output_text.delta", item_id="m1", output_index=0, content_index=0, delta="Hello")
            + ev("response.output_text.done", item_id="m1", output_index=0, content_index=0, text="Hello")
            + ev("response.content_part.done", item_id="m1", output_index=0, content_index=0, part=ITEM["content"][0])
            + ev("response.output_item.done", output_index=0, item=ITEM))


def completed(rid: str) -> bytes:
    return ev("response.completed", response=response(rid, output=[ITEM]))


def whole(rid: str) -> bytes:
    return start(rid) + output() + completed(rid)


def judged(body: bytes):
    return analyze_bytes(body, RESPONSES)


def sdk_client(body: bytes) -> openai.OpenAI:
    """The openai SDK, answered ``body`` in process."""
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(upstream)))


def sdk_raises(body: bytes) -> bool:
    try:
        for _ in sdk_client(body).responses.create(model="m", input="hi", stream=True):
            pass
    except openai.APIError:
        return True
    return False


def sdk_helper_fails(body: bytes) -> bool:
    """Whether the SDK's stream helper, which rebuilds the response, fails on ``body``."""
    try:
        with sdk_client(body).responses.stream(model="m", input="hi") as stream:
            for _ in stream:
                pass
            stream.get_final_response()
    except Exception:  # noqa: BLE001 - any failure: the app did not get this answer
        return True
    return False


def test_the_constructed_stream_is_complete():
    assert not sdk_helper_fails(whole("resp_A"))
    assert judged(whole("resp_A")).verdict.kind is VerdictKind.COMPLETE


@pytest.mark.parametrize("where", ["output_item.done", "final output"])
def test_a_completed_response_holding_an_item_done_incomplete_is_corrupt(where):
    """An item's status incomplete says it was cut (it belongs with response.incomplete): under
    response.completed the two contradict each other, and the app would take the cut item as whole."""
    cut = {**ITEM, "status": "incomplete"}
    done_item = cut if where == "output_item.done" else ITEM
    body = (start("resp_A") + output().replace(orjson.dumps(ITEM), orjson.dumps(done_item))
            + ev("response.completed", response=response("resp_A", output=[cut])))
    assert body.count(b'"status":"incomplete"') == (2 if where == "output_item.done" else 1)
    verdict = judged(body).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "output item 0 is done with status incomplete" in verdict.reason, verdict
    stopped = start("resp_A") + output() + ev("response.incomplete", response={
        **response("resp_A", "incomplete", [cut]), "incomplete_details": {"reason": "max_output_tokens"}})
    assert judged(stopped).verdict.kind is VerdictKind.STOPPED_BY_LIMIT


# -- (a) a payload with a top-level "error" ---------------------------------------------------

ERROR_PAYLOADS = {
    "no type, no event line": sse('{"error":{"type":"server_error","message":"boom"}}'),
    "error as a string": sse('{"error":"boom"}'),
    "on a typed event": ev("response.output_text.delta", item_id="m1", output_index=0, content_index=0,
                           delta="", error={"type": "server_error", "message": "boom"}),
}


@pytest.mark.parametrize("name", sorted(ERROR_PAYLOADS))
def test_a_top_level_error_then_completed_is_errored_as_the_sdk_raises(name):
    body = start("resp_A") + output() + ERROR_PAYLOADS[name] + completed("resp_A")
    assert sdk_raises(body)
    verdict = judged(body).verdict
    assert verdict.kind is VerdictKind.ERRORED, verdict
    assert "boom" in verdict.reason
    assert verdict.seq == 8


@pytest.mark.parametrize("empty", ["null", "{}", '""', "false"])
def test_an_empty_error_field_is_not_an_error(empty):
    body = start("resp_A") + output() + sse(f'{{"error":{empty}}}') + completed("resp_A")
    assert not sdk_raises(body)
    assert judged(body).verdict.kind is VerdictKind.COMPLETE


# -- (b) two responses in one body --------------------------------------------------------------

def test_a_terminal_event_of_another_response_is_corrupt_and_names_both_ids():
    for terminal in (completed("resp_B"),
                     ev("response.incomplete", response={**response("resp_B", "incomplete", [ITEM]),
                                                         "incomplete_details": {"reason": "max_output_tokens"}})):
        analysis = judged(start("resp_A") + output() + terminal)
        assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
        assert "resp_A" in analysis.verdict.reason and "resp_B" in analysis.verdict.reason
        assert analysis.turn.response_id == "resp_A"


def test_a_cut_response_followed_by_a_whole_one_is_corrupt():
    analysis = judged(ev("response.created", response=response("resp_X", "in_progress")) + whole("resp_A"))
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "from resp_X" in analysis.verdict.reason and "to resp_A" in analysis.verdict.reason
    assert analysis.verdict.seq == 1


def test_a_second_in_progress_under_another_id_is_corrupt():
    body = start("resp_A") + ev("response.in_progress", response=response("resp_B", "in_progress")) + output() \
        + completed("resp_A")
    assert judged(body).verdict.kind is VerdictKind.CORRUPT


def test_a_repeated_lifecycle_event_with_the_same_id_is_still_complete():
    body = start("resp_A") + start("resp_A") + output() + completed("resp_A")
    assert judged(body).verdict.kind is VerdictKind.COMPLETE


def test_every_cut_of_a_stream_without_sequence_numbers_followed_by_another_is_never_complete():
    first = re.sub(rb'"sequence_number":\d+,', b"", openai_responses(["Hel", "lo", " there"]))
    second = first.replace(b"resp_T1", b"resp_T2")
    assert judged(second).verdict.kind is VerdictKind.COMPLETE
    for _, end in sse_spans(first)[:-1]:
        assert judged(first[:end] + second).verdict.kind is not VerdictKind.COMPLETE, end


def test_ids_rewritten_on_every_event_stay_complete_but_a_second_created_does_not():
    # GitHub Copilot rewrites every id per event (the real capture github-copilot-id-rotation)
    rotating = (ev("response.created", response=response("id-1", "in_progress"))
                + ev("response.in_progress", response=response("id-2", "in_progress"))
                + output() + completed("id-3"))
    analysis = judged(rotating)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.response_id == "id-1"
    stitched = ev("response.created", response=response("id-0", "in_progress")) + rotating
    assert judged(stitched).verdict.kind is VerdictKind.CORRUPT


def rewritten(body: bytes) -> bytes:
    """``body`` with every item_id rewritten to a new id, one per event, as GitHub Copilot does."""
    parts = body.split(b'"item_id":"m1"')
    return b"".join(part + (b'"item_id":"rewritten-%d"' % i if i < len(parts) - 1 else b"") for i, part in enumerate(parts))


def test_item_ids_rewritten_per_event_excuse_another_id_at_the_terminal_event():
    body = ev("response.created", response=response("id-1", "in_progress")) + rewritten(output()) + completed("id-3")
    assert judged(body).verdict.kind is VerdictKind.COMPLETE
    body = ev("response.created", response=response("id-1", "in_progress")) + output() + completed("id-3")
    assert judged(body).verdict.kind is VerdictKind.CORRUPT


def test_another_id_that_repeats_is_another_answer_not_a_rewrite():
    """A gateway that rewrites ids gives each event a new one; an id other than the first that
    comes twice belongs to another answer's events (a stitched stream)."""
    foreign_items = ev("response.created", response=response("r1", "in_progress")) + output().replace(
        b'"item_id":"m1"', b'"item_id":"m9"') + completed("r1")
    verdict = judged(foreign_items).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "another answer" in verdict.reason, verdict
    foreign_response = (ev("response.created", response=response("resp_A", "in_progress"))
                        + ev("response.in_progress", response=response("resp_B", "in_progress")) + output() + completed("resp_B"))
    verdict = judged(foreign_response).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "two generations" in verdict.reason, verdict
    assert sdk_helper_fails(foreign_response)


def test_a_response_id_that_goes_back_to_the_first_after_a_change_is_another_responses_event_not_rotation():
    """Rotating ids are new on every event: one that goes back to the first after a change is another
    response's start event spliced in (the raw loop hands the app its event, the helper raises)."""
    spliced = (ev("response.created", response=response("resp_A", "in_progress"))
               + ev("response.queued", response=response("resp_B", "queued"))
               + ev("response.in_progress", response=response("resp_A", "in_progress")) + output() + completed("resp_A"))
    verdict = judged(spliced).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "the first one again" in verdict.reason, verdict
    assert verdict.evidence["response_id"] == "resp_A", verdict.evidence
    assert sdk_helper_fails(spliced)
    # the same from real captures: another response's response.queued right after response.created
    host = shared_path("fixtures", CAPTURES, "test_openai_responses_stream.0.sse").read_bytes()
    donor = shared_path("fixtures", CAPTURES, "test_background_mode_streaming_starting_after_vcr.1.sse").read_bytes()
    (_, head_end), (donor_start, donor_end) = sse_spans(host)[0], sse_spans(donor)[0]
    assert b"response.queued" in donor[donor_start:donor_end] and judged(host).verdict.kind is VerdictKind.COMPLETE
    verdict = judged(host[:head_end] + donor[donor_start:donor_end] + host[head_end:]).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "two generations" in verdict.reason, verdict
    # ids that keep rotating stay complete, the rotation noted with what the SDK's helper does with it
    rotating = (ev("response.created", response=response("id-1", "in_progress"))
                + ev("response.in_progress", response=response("id-2", "in_progress")) + output() + completed("id-3"))
    analysis = judged(rotating)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert any("stream helper" in note for note in analysis.turn.notes) and sdk_helper_fails(rotating)


def test_an_output_slot_added_as_one_type_and_done_as_another_is_corrupt():
    call = {"id": "fc1", "type": "function_call", "call_id": "call_1", "name": "get_capital", "arguments": ""}
    body = (start("r1") + ev("response.output_item.added", output_index=0, item=call)
            + ev("response.function_call_arguments.delta", item_id="fc1", output_index=0, delta='{"country')
            + ev("response.output_item.done", output_index=0, item=ITEM) + completed("r1"))
    verdict = judged(body).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "added as a function_call and is done as a message" in verdict.reason, verdict
    assert sdk_helper_fails(body)


# -- (c) the head: only a starting_after replay starts after response.created -------------------

def test_a_stream_without_sequence_numbers_that_lost_its_head_is_unknown():
    """Nothing in such a stream marks a replay: starting after response.created, it lost events."""
    created = ev("response.created", response=response("resp_A", "in_progress"))
    assert whole("resp_A").startswith(created)
    for head in (created, start("resp_A")):  # response.created lost; it and response.in_progress lost
        body = whole("resp_A")[len(head):]
        verdict = judged(body).verdict
        assert verdict.kind is VerdictKind.UNKNOWN, verdict
        assert "not with response.created" in verdict.reason and "without a sequence_number" in verdict.reason
        assert verdict.evidence["was"] == "complete" and verdict.seq == 0, verdict
        assert sdk_helper_fails(body)  # the SDK's helper wants response.created first


def numbered_events() -> list[bytes]:
    return [event + b"\n\n" for event in openai_responses(["Hel", "lo"]).split(b"\n\n") if event]


def test_a_numbered_stream_that_starts_after_response_created_is_a_replay_and_complete():
    """GET /v1/responses/{id}?stream=true&starting_after=N replays from sequence_number N+1."""
    events = numbered_events()
    for after in (0, 1):
        analysis = judged(b"".join(events[after + 1:]))
        assert analysis.verdict.kind is VerdictKind.COMPLETE, (after, analysis.verdict)
        assert any(f"starting_after={after}" in note for note in analysis.turn.notes), analysis.turn.notes


def test_a_stream_numbered_from_0_that_does_not_start_with_response_created_is_unknown():
    events = numbered_events()[1:]
    renumbered = b"".join(re.sub(rb'"sequence_number":(\d+)', lambda m: b'"sequence_number":%d' % (int(m[1]) - 1), e)
                          for e in events)
    verdict = judged(renumbered).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "at sequence_number 0" in verdict.reason, verdict


def test_a_create_whose_numbered_stream_starts_after_response_created_is_unknown_not_a_replay():
    """Only a retrieve (GET /v1/responses/{id}?stream=true&starting_after=N) replays from a later event;
    the answer to a create (POST /v1/responses) that starts there lost its head."""
    body = b"".join(numbered_events()[1:])
    assert judged(body).verdict.kind is VerdictKind.COMPLETE  # the request unknown: it may be a replay
    verdict = analyze_bytes(body, RESPONSES, may_resume=False).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "the request created the response" in verdict.reason, verdict
    assert verdict.evidence["first_sequence_number"] == 1 and verdict.evidence["was"] == "complete", verdict.evidence
    assert sdk_helper_fails(body)
    # one that starts inside an item carries on an item it never added
    events = three_items([REASONING, MESSAGE, CALL])
    middle = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    verdict = analyze_bytes(framed(events[middle:]), RESPONSES, may_resume=False).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "never added" in verdict.reason, verdict


@pytest.mark.parametrize("method, url, resumes", [
    ("POST", "https://api.openai.com/v1/responses", False),
    ("post", "https://gateway.example/openai/v1/responses/?api-version=1", False),
    ("GET", "https://api.openai.com/v1/responses/resp_1?stream=true&starting_after=0", True),
    ("POST", "https://api.openai.com/v1/responses/resp_1/cancel", True),
    ("POST", "https://api.openai.com/v1/chat/completions", True),
    ("POST", "http://[::1/v1/responses", True),  # a URL no one can read: nothing known
    (None, None, True),  # no request known
])
def test_only_a_responses_create_is_known_not_to_be_a_replay(method, url, resumes):
    assert may_resume(method, url) is resumes


@pytest.mark.parametrize("method, path, expected", [
    ("POST", "/v1/responses", "unknown"),
    ("GET", "/v1/responses/resp_1?stream=true&starting_after=0", "complete"),
])
def test_the_tap_verify_and_import_know_a_create_is_no_replay(tmp_path, method, path, expected):
    from mitmproxy.test import tflow

    from streamtap.commands.verify import judge_file
    from streamtap.mitm.flowtap import FlowTap
    from streamtap.providers import StreamEnd
    from streamtap.recording.importer import import_flow

    body = b"".join(numbered_events()[1:])  # starts at sequence_number 1

    def flow():
        f = tflow.tflow(resp=True)
        f.request.host, f.request.method, f.request.path = "api.openai.com", method, path
        f.request.content = b'{"model":"m","input":"hi","stream":true}' if method == "POST" else b""
        f.response.headers["content-type"] = "text/event-stream"
        return f

    live = flow()
    live.response.content = None
    tap = FlowTap(live, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)
    tap.arrived(body, None)
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == expected, summary
    judged_again = judge_file(Path(summary["recording"]), None, None)
    assert judged_again.analysis.verdict.kind.value == expected and judged_again.problem is None, judged_again
    captured = flow()
    captured.response.raw_content = body
    (tmp_path / "out").mkdir()
    assert import_flow(captured, tmp_path / "out", tmp_path / "capture.mitm").verdict == expected


CAPTURES = "pydantic-ai/bodies/openai-responses"
CAPTURES = "pydantic-ai/bodies/openai-responses"


def test_real_captures_a_replay_stays_complete_and_a_capture_without_its_head_is_unknown():
    replay = shared_path("fixtures", CAPTURES, "test_background_mode_streaming_starting_after_vcr.1.sse")
    analysis = judged(replay.read_bytes())  # recorded after GET ...?starting_after=0&stream=true
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert any("starting_after=0" in note for note in analysis.turn.notes), analysis.turn.notes
    unnumbered = shared_path("fixtures", CAPTURES, "test_openai_responses_stream.1.sse").read_bytes()
    assert judged(unnumbered).verdict.kind is VerdictKind.COMPLETE
    first = sse_spans(unnumbered)[0]
    assert b"response.created" in unnumbered[first[0]:first[1]]
    verdict = judged(unnumbered[first[1]:]).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "response.in_progress" in verdict.reason, verdict


REASONING = {"id": "rs1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think it over."}],
             "encrypted_content": "c2ln"}
CALL = {"id": "fc1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "get_capital",
        "arguments": '{"country": "France"}'}
MESSAGE = {"id": "m1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Paris, I think.", "annotations": []}]}


def three_items(final_output: list | None) -> list[dict]:
    """A numbered stream: a reasoning summary, a message and a function call, each in several deltas."""
    opened = {"status": "in_progress"}
    events = [{"type": "response.created", "response": response("r1", "in_progress")},
              {"type": "response.in_progress", "response": response("r1", "in_progress")},
              {"type": "response.output_item.added", "output_index": 0, "item": {**REASONING, "summary": [], "encrypted_content": None}}]
    for piece in ("Think ", "it ", "over."):
        events.append({"type": "response.reasoning_summary_text.delta", "item_id": "rs1", "output_index": 0, "summary_index": 0, "delta": piece})
    events += [{"type": "response.reasoning_summary_text.done", "item_id": "rs1", "output_index": 0, "summary_index": 0, "text": "Think it over."},
               {"type": "response.output_item.done", "output_index": 0, "item": REASONING},
               {"type": "response.output_item.added", "output_index": 1, "item": {**MESSAGE, **opened, "content": []}},
               {"type": "response.content_part.added", "item_id": "m1", "output_index": 1, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}]
    for piece in ("Paris", ", I ", "think."):
        events.append({"type": "response.output_text.delta", "item_id": "m1", "output_index": 1, "content_index": 0, "delta": piece})
    events += [{"type": "response.output_text.done", "item_id": "m1", "output_index": 1, "content_index": 0, "text": "Paris, I think."},
               {"type": "response.content_part.done", "item_id": "m1", "output_index": 1, "content_index": 0, "part": MESSAGE["content"][0]},
               {"type": "response.output_item.done", "output_index": 1, "item": MESSAGE},
               {"type": "response.output_item.added", "output_index": 2, "item": {**CALL, **opened, "arguments": ""}}]
    for piece in ('{"coun', 'try": "Fr', 'ance"}'):
        events.append({"type": "response.function_call_arguments.delta", "item_id": "fc1", "output_index": 2, "delta": piece})
    events += [{"type": "response.function_call_arguments.done", "item_id": "fc1", "output_index": 2, "arguments": CALL["arguments"]},
               {"type": "response.output_item.done", "output_index": 2, "item": CALL},
               {"type": "response.completed", "response": {**response("r1"), "output": final_output}}]
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def framed(events: list[dict]) -> bytes:
    return b"".join(sse(event, event["type"]) for event in events)


def turn_view(analysis) -> tuple:
    turn = analysis.turn
    return (turn.text(), [b.text for b in turn.blocks if b.kind.value == "thinking"],
            [(b.name, b.arguments) for b in turn.blocks if b.kind.value == "tool_call"], turn.stop_reason)


@pytest.mark.parametrize("final_output", [[REASONING, MESSAGE, CALL], None], ids=["output", "no-output"])
def test_a_replay_that_starts_inside_an_item_is_complete_and_takes_the_item_from_its_done_event(final_output):
    """A starting_after replay may start anywhere, inside an item too: the events of an item added
    before its first event continue what the body does not hold, which is no contradiction. The
    item comes whole with output_item.done (and the final response, when it lists its output), so
    the turn is the whole stream's (without a final output list: but for the items done before the
    replay); only the item's own events are passed over, with a note."""
    events = three_items(final_output)
    whole = judged(framed(events))
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict
    for after in range(0, len(events) - 1):
        replay = events[after + 1:]
        analysis = judged(framed(replay))
        assert analysis.verdict.kind is VerdictKind.COMPLETE, (after, analysis.verdict)
        if final_output is None:  # an item done before the replay's first event is not in it at all
            done = {e["output_index"] for e in replay if e["type"] == "response.output_item.done"}
            text, thinking, calls, stop = turn_view(whole)
            expected = (text if 1 in done else "", thinking if 0 in done else [], calls if 2 in done else [],
                        stop if 2 in done else "end_turn")  # a turn's tool call makes it tool_use
        else:
            expected = turn_view(whole)
        assert turn_view(analysis) == expected, after
        inside = [index for index in range(3) if any(e.get("output_index") == index and e["type"] != "response.output_item.added"
                                                    for e in events[after + 1:]) and not any(
            e["type"] == "response.output_item.added" and e["output_index"] == index for e in events[after + 1:])]
        noted = [note for note in analysis.turn.notes if "added before this replay's first event" in note]
        assert len(noted) == len(inside), (after, analysis.turn.notes)


def test_a_replay_cut_inside_an_item_it_started_in_is_truncated_never_complete():
    events = three_items([REASONING, MESSAGE, CALL])
    middle = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    for cut in range(middle + 1, len(events) - 1):
        verdict = judged(framed(events[middle:cut])).verdict
        assert verdict.kind is VerdictKind.TRUNCATED, (cut, verdict)


def test_a_replay_whose_earlier_item_is_never_done_before_response_completed_is_corrupt():
    events = three_items([REASONING, MESSAGE, CALL])
    middle = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    body = [e for e in events[middle:] if not (e["type"] == "response.output_item.done" and e["output_index"] == 1)]
    for number, event in enumerate(body, start=middle):
        event["sequence_number"] = number
    verdict = judged(framed(body)).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "began before this replay's first event and was never done" in verdict.reason, verdict


def test_a_stream_that_is_no_replay_and_carries_on_an_item_it_never_added_stays_corrupt():
    """Only a replay's first event (sequence_number >= 1, not response.created) says items came before it."""
    events = three_items([REASONING, MESSAGE, CALL])
    middle = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    dropped = events[:middle - 2] + events[middle:]  # response.created kept, the message's added and part lost
    for number, event in enumerate(dropped):
        event["sequence_number"] = number
    verdict = judged(framed(dropped)).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "output item 1 that was never added" in verdict.reason, verdict
    renumbered = [{**event, "sequence_number": number} for number, event in enumerate(events[middle:])]  # numbered from 0
    verdict = judged(framed(renumbered)).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "never added" in verdict.reason, verdict


def test_a_custom_tool_call_that_comes_only_with_the_terminal_event_keeps_its_freeform_input():
    """A custom tool's input is free text, not JSON: streamed, the item's added event says so; an
    item only the final response lists (or only its done event, in a replay) must say so too,
    else its SQL reads as JSON that failed to parse and the turn as corrupt."""
    item = {"id": "ct1", "type": "custom_tool_call", "status": "completed", "call_id": "call_9", "name": "run_sql",
            "input": "SELECT 1"}
    analysis = judged(start("r1") + ev("response.completed", response=response("r1", output=[item])))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    [call] = analysis.turn.blocks
    assert (call.name, call.arguments, call.arguments_error) == ("run_sql", "SELECT 1", None)


# -- a replay that starts inside an item: what it holds of that item is checked, not passed over --

def replay_inside_the_message(events: list[dict]) -> list[dict]:
    """From the message's second text delta on: the replay starts inside output item 1."""
    first = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    return events[first + 1:]


def renumbered(events: list[dict], start: int) -> list[dict]:
    return [{**event, "sequence_number": start + i} for i, event in enumerate(events)]


def other_generation(events: list[dict]) -> list[dict]:
    """The same events from another answer: another response, item and text."""
    text = orjson.dumps(events).decode().replace('"r1"', '"r2"').replace('"m1"', '"m2"')
    return orjson.loads(text.replace("Paris, I think.", "Lyon, surely!!").replace('"Paris"', '"Lyon,"').replace('", I "', '" sur"')
                        .replace('"think."', '"ely!!"'))


def replay_verdict(events: list[dict]):
    return judged(framed(events)).verdict


def test_a_replay_stitched_inside_the_item_it_started_in_is_corrupt():
    """The deltas of one answer's message, then another answer's: a change of item id inside the
    item, and text that does not end the finished item's."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = replay_inside_the_message(events)
    cut = next(i for i, e in enumerate(body) if e["type"] == "response.output_text.done")
    stitched = body[:1] + other_generation(body[1:])
    assert other_generation(body[1:])[0]["item_id"] == "m2" and cut > 1
    verdict = replay_verdict(renumbered(stitched, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.CORRUPT, verdict


@pytest.mark.parametrize("change", ["delta", "text done", "item done", "final"])
def test_a_replay_whose_item_contradicts_itself_is_corrupt(change):
    """The received end of the text must end every whole value the body then gives for it."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = orjson.loads(orjson.dumps(replay_inside_the_message(events)))
    for event in body:
        if change == "delta" and event["type"] == "response.output_text.delta":
            event["delta"] = event["delta"].replace("think", "thonk")
        elif change == "text done" and event["type"] == "response.output_text.done":
            event["text"] = "Paris, I thonk."
        elif change == "item done" and event["type"] == "response.output_item.done" and event["output_index"] == 1:
            event["item"]["content"][0]["text"] = "Paris, I thonk."
        elif change == "final" and event["type"] == "response.completed":
            event["response"]["output"][1]["content"][0]["text"] = "Paris, I thonk."
    verdict = replay_verdict(body)
    assert verdict.kind is VerdictKind.CORRUPT and "disagree" in verdict.reason, verdict


@pytest.mark.parametrize("item", ["reasoning", "call"])
def test_a_replay_inside_a_reasoning_item_or_a_tool_call_checks_them_as_well(item):
    events = three_items([REASONING, MESSAGE, CALL])
    kind = "response.reasoning_summary_text.delta" if item == "reasoning" else "response.function_call_arguments.delta"
    first = next(i for i, e in enumerate(events) if e["type"] == kind)
    body = events[first + 1:]
    whole = judged(framed(body))
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict
    if item == "call":
        [call] = whole.turn.tool_calls()
        assert (call.name, call.id, call.arguments) == ("get_capital", "call_1", {"country": "France"})
    altered = orjson.loads(orjson.dumps(body))
    last = max(i for i, e in enumerate(altered) if e["type"] == kind)
    altered[last]["delta"] = altered[last]["delta"].replace("ance", "ancia").replace("over", "under")  # the deltas alone
    verdict = replay_verdict(altered)
    assert verdict.kind is VerdictKind.CORRUPT and "disagree" in verdict.reason, verdict


@pytest.mark.parametrize("after", ["delta", "item done", "added"])
def test_the_item_a_replay_started_in_is_closed_by_its_done_as_any_item_is(after):
    events = three_items([REASONING, MESSAGE, CALL])
    done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done" and e["output_index"] == 1)
    body = events[done:done + 1]  # the replay starts at the message's done
    late = {"delta": {"type": "response.output_text.delta", "item_id": "m1", "output_index": 1, "content_index": 0, "delta": " Or Lyon."},
            "item done": events[done],
            "added": {"type": "response.output_item.added", "output_index": 1, "item": {**CALL, "status": "in_progress", "arguments": ""}}}[after]
    body = renumbered(body + [late] + events[done + 1:], events[done]["sequence_number"])
    verdict = replay_verdict(body)
    assert verdict.kind is VerdictKind.CORRUPT and "closed" in verdict.reason, verdict


def test_only_one_item_open_before_the_replays_first_event_and_none_after_the_body_starts_one():
    events = three_items([REASONING, MESSAGE, CALL])
    body = replay_inside_the_message(events)
    # a second item never added, after the first: two items cannot both be open when a replay starts
    intruder = {"type": "response.output_text.delta", "item_id": "m9", "output_index": 5, "content_index": 0, "delta": "Injected."}
    two = renumbered(body[:1] + [intruder] + body[1:], body[0]["sequence_number"])
    assert "output item 5 that was never added" in replay_verdict(two).reason
    # after the body added an item, an item it never added is never one begun before it
    added = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.added" and e["output_index"] == 2)
    late = renumbered(events[added:added + 1] + [intruder] + events[added + 1:], events[added]["sequence_number"])
    assert "output item 5 that was never added" in replay_verdict(late).reason
    # nor after its start events: a replay from response.in_progress has no item open at its start
    started = renumbered(events[1:2] + [intruder] + events[2:], 1)
    assert "output item 5 that was never added" in replay_verdict(started).reason


def test_a_replay_whose_item_is_never_given_whole_is_unknown_not_complete():
    """Deltas of the end of a text, then a finished item and a final response that carry no text
    for it: the turn would hold only the end of the answer."""
    events = three_items(None)
    body = orjson.loads(orjson.dumps(replay_inside_the_message(events)))
    body = [e for e in body if e["type"] not in ("response.output_text.done", "response.content_part.done")]
    for event in body:
        if event["type"] == "response.output_item.done" and event["output_index"] == 1:
            event["item"] = {**MESSAGE, "content": []}
    verdict = replay_verdict(renumbered(body, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.UNKNOWN and "only its end" in verdict.reason, verdict


def test_a_swap_tail_fault_served_as_a_resume_inside_an_item_is_corrupt(tmp_path):
    """streamtap's own replay: another answer's tail swapped in, served to a client that resumes
    (Last-Event-ID) inside the item where the swap is, is the stitch it is when served whole."""
    from replay_streams import write_recording

    from streamtap.replay.faults import parse_faults, plan
    from streamtap.replay.source import load_source

    events = three_items([REASONING, MESSAGE, CALL])
    mine = [sse(e, e["type"]) for e in events]
    theirs = [sse(e, e["type"]) for e in other_generation(events)]
    a = load_source(write_recording(tmp_path / "a.jsonl", "responses", mine))
    b = load_source(write_recording(tmp_path / "b.jsonl", "responses", theirs))
    swap_at = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta") + 2
    faults = parse_faults(f"swap-tail:with=b.jsonl,at={swap_at}")
    whole = plan(a, faults, others={"b.jsonl": b}).body
    assert judged(whole).verdict.kind is VerdictKind.CORRUPT
    resumed = plan(a, faults, others={"b.jsonl": b}, start_after=swap_at - 2).body
    verdict = judged(resumed).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert judged(plan(a, [], start_after=swap_at - 2).body).verdict.kind is VerdictKind.COMPLETE


# -- the item a replay starts in: what its events say it is, its id, its parts, the caps --------

def numbered(events: list[dict], start: int) -> bytes:
    return framed(renumbered(events, start))


def test_a_replay_item_that_streams_one_kind_and_is_done_as_another_is_corrupt():
    """Its output_item.added is before the body, but its events still say what it is: text events
    ended by a function call's done (another answer's tool call) are two items in one slot."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = replay_inside_the_message(events)
    text_done = next(i for i, e in enumerate(body) if e["type"] == "response.output_item.done")
    as_call = body[:text_done] + [{"type": "response.output_item.done", "output_index": 1, "item": {**CALL, "id": "m1"}},
                                  {"type": "response.completed", "response": response("r1", output=[REASONING, {**CALL, "id": "m1"}])}]
    verdict = replay_verdict(renumbered(as_call, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.CORRUPT and "two items in one slot" in verdict.reason, verdict
    both = body[:1] + [{"type": "response.function_call_arguments.delta", "item_id": "m1", "output_index": 1, "delta": "{}"}] + body[1:]
    verdict = replay_verdict(renumbered(both, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.CORRUPT and "two items in one slot" in verdict.reason, verdict


def test_a_replay_item_done_under_another_id_is_not_complete():
    """Its deltas carry one item id and its done another, with no .done between them: ids that
    rotate (some gateways) and another answer's done both look so, and the end of a text that is
    all the body holds cannot tell them apart."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = [e for e in replay_inside_the_message(events) if e["type"] not in ("response.output_text.done", "response.content_part.done")]
    for event in body:
        if event["type"] == "response.output_item.done" and event["output_index"] == 1:
            event["item"] = {**MESSAGE, "id": "m2", "content": [{**MESSAGE["content"][0], "text": "No, Lyon. Paris, I think."}]}
        if event["type"] == "response.completed":
            event["response"]["output"] = None
    verdict = replay_verdict(renumbered(body, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.UNKNOWN and "item id changed from m1 to m2" in verdict.reason, verdict


def test_a_replay_inside_a_custom_tool_call_keeps_its_free_text_input():
    call = {"type": "custom_tool_call", "id": "ct1", "call_id": "call_c1", "name": "write_sql", "status": "completed",
            "input": "SELECT * FROM users WHERE age > 25"}
    delta = {"type": "response.custom_tool_call_input.delta", "item_id": "ct1", "output_index": 0}
    body = [{**delta, "delta": "FROM users "}, {**delta, "delta": "WHERE age > 25"},
            {"type": "response.custom_tool_call_input.done", "item_id": "ct1", "output_index": 0, "input": call["input"]},
            {"type": "response.output_item.done", "output_index": 0, "item": call},
            {"type": "response.completed", "response": response("r1", output=[call])}]
    analysis = judged(numbered(body, 4))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    [block] = analysis.turn.tool_calls()
    assert (block.name, block.id, block.arguments, block.arguments_error) == ("write_sql", "call_c1", call["input"], None)


def test_a_replay_inside_an_mcp_calls_arguments_is_complete():
    mcp = {"id": "mcp1", "type": "mcp_call", "server_label": "dice", "name": "roll", "arguments": '{"expression":"2d4 + 1"}',
           "output": "4", "error": None}
    body = [{"type": "response.mcp_call_arguments.delta", "item_id": "mcp1", "output_index": 0, "delta": '+ 1"}'},
            {"type": "response.mcp_call_arguments.done", "item_id": "mcp1", "output_index": 0, "arguments": mcp["arguments"]},
            {"type": "response.mcp_call.completed", "item_id": "mcp1", "output_index": 0},
            {"type": "response.output_item.done", "output_index": 0, "item": mcp},
            {"type": "response.completed", "response": response("r1", output=[mcp])}]
    verdict = judged(numbered(body, 6)).verdict
    assert verdict.kind is VerdictKind.COMPLETE, verdict


CUSTOM = {"type": "custom_tool_call", "id": "ct1", "call_id": "call_c1", "name": "write_sql", "status": "completed",
          "input": "SELECT 1"}
MCP = {"id": "mcp1", "type": "mcp_call", "server_label": "dice", "name": "roll", "arguments": '{"expression":"2d4"}',
       "output": "4", "error": None, "status": "completed"}


def tool_stream(item: dict, deltas: list[str], done_value: str, after_done: list[str] = ()) -> bytes:
    """A whole response of one custom tool call or MCP call: its input or arguments streamed as
    ``deltas``, then its ``.done`` with ``done_value``, then ``after_done`` deltas."""
    kind, field = (("custom_tool_call_input", "input") if item["type"] == "custom_tool_call"
                   else ("mcp_call_arguments", "arguments"))
    where = {"item_id": item["id"], "output_index": 0}
    delta = [{"type": f"response.{kind}.delta", **where, "delta": d} for d in deltas]
    events = [{"type": "response.created", "response": response("r1", "in_progress", [])},
              {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress", field: ""}},
              *delta, {"type": f"response.{kind}.done", **where, field: done_value},
              *({"type": f"response.{kind}.delta", **where, "delta": d} for d in after_done),
              {"type": "response.output_item.done", "output_index": 0, "item": item},
              {"type": "response.completed", "response": response("r1", output=[item])}]
    return numbered(events, 0)


@pytest.mark.parametrize("item", [CUSTOM, MCP], ids=["custom", "mcp"])
def test_a_custom_or_mcp_tool_calls_input_is_closed_by_its_done_and_must_agree_with_it(item):
    """As a function call's arguments: its ``.done`` closes the input, and gives what the deltas grew."""
    value = item["input"] if item["type"] == "custom_tool_call" else item["arguments"]
    whole = judged(tool_stream(item, [value[:5], value[5:]], value))
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict
    assert judged(tool_stream(item, [], value)).verdict.kind is VerdictKind.COMPLETE  # a server that sends only the done
    grown = judged(tool_stream(item, [value[:5]], value[:5], after_done=[value[5:]])).verdict
    assert grown.kind is VerdictKind.CORRUPT and "was closed by" in grown.reason, grown
    other = judged(tool_stream(item, [value[:5] + "x"], value)).verdict
    assert other.kind is VerdictKind.CORRUPT and ("disagree" in other.reason or "differs" in other.reason), other


def test_under_a_cap_the_replay_items_whole_text_takes_the_place_of_its_end_not_more_room():
    """The end of the text the body held was counted against the turn's cap; the whole that
    replaces it must not be counted on top, or a later contradiction hides in what the cap drops
    and a call that fits is reported as beyond it."""
    from streamtap.providers import StreamSession

    def capped(body: bytes, **caps):
        session = StreamSession(RESPONSES, "sse", **caps)
        session.feed(body)
        return session.close()

    events = three_items([REASONING, MESSAGE, CALL])
    body = orjson.loads(orjson.dumps(replay_inside_the_message(events)))
    for event in body:
        if event["type"] == "response.output_item.done" and event["output_index"] == 1:
            event["item"]["content"][0]["text"] = "Lyon, I think."  # the .done said Paris
    verdict = capped(framed(body), text_cap=20).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "disagree" in verdict.reason, verdict
    call_from = next(i for i, e in enumerate(events) if e["type"] == "response.function_call_arguments.delta") + 1
    analysis = capped(framed(events[call_from:]), arguments_cap=len(CALL["arguments"]) + 2)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.tool_calls()[0].arguments == {"country": "France"}


def test_only_the_part_open_when_the_replay_started_holds_only_its_end():
    """A part the body adds, or one it never adds, must be whole from its own deltas."""
    events = three_items([REASONING, MESSAGE, CALL])
    summary_from = next(i for i, e in enumerate(events) if e["type"] == "response.reasoning_summary_text.delta") + 1
    second = [{"type": "response.reasoning_summary_part.added", "item_id": "rs1", "output_index": 0, "summary_index": 1,
               "part": {"type": "summary_text", "text": ""}},
              {"type": "response.reasoning_summary_text.delta", "item_id": "rs1", "output_index": 0, "summary_index": 1, "delta": "nd."},
              {"type": "response.reasoning_summary_text.done", "item_id": "rs1", "output_index": 0, "summary_index": 1, "text": "Second."}]
    done = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.done")
    for body in (events[summary_from:done] + second + events[done:],  # after the part open at the start
                 second + events[done:]):  # the replay's first event adds it
        verdict = replay_verdict(renumbered(body, events[summary_from]["sequence_number"]))
        assert verdict.kind is VerdictKind.CORRUPT and "disagree" in verdict.reason, verdict
    body = replay_inside_the_message(events)
    text_done = next(i for i, e in enumerate(body) if e["type"] == "response.content_part.done")
    unannounced = {"type": "response.output_text.delta", "item_id": "m1", "output_index": 1, "content_index": 1, "delta": "two."}
    body = body[:text_done + 1] + [unannounced] + body[text_done + 1:]
    verdict = replay_verdict(renumbered(body, body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.CORRUPT and "content part 1 of item 1 that was never added" in verdict.reason, verdict


def test_a_replay_that_starts_at_a_reasoning_parts_done_is_complete():
    """LM Studio streams reasoning as content parts of type reasoning_text: a replay from such a
    part's content_part.done holds reasoning, not a message, and is done as one."""
    text = "The user asks for the weather."
    item = {"id": "rs9", "type": "reasoning", "status": "completed", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    body = [{"type": "response.content_part.done", "item_id": "rs9", "output_index": 0, "content_index": 0,
             "part": {"type": "reasoning_text", "text": text}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": response("r1", output=[item])}]
    analysis = judged(numbered(body, 53))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert [b.text for b in analysis.turn.blocks if b.kind.value == "thinking"] == [text]


@pytest.mark.parametrize("ending", ["done, then incomplete", "incomplete only", "content filter"])
def test_a_replay_item_that_cannot_be_vouched_for_is_unknown_whatever_the_answer_says_ended_it(ending):
    """Stopped by a limit or filtered says what the turn is, as complete does: another answer's
    item (another id) after this replay's deltas makes any of them unknown."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = [e for e in replay_inside_the_message(events) if e["type"] == "response.output_text.delta"]
    theirs = {**MESSAGE, "id": "m2", "status": "incomplete", "content": [{**MESSAGE["content"][0], "text": "Lyon. Paris, I think."}]}
    reason = "content_filter" if ending == "content filter" else "max_output_tokens"
    incomplete = {"type": "response.incomplete", "response": {**response("r1", "incomplete", [REASONING, theirs]),
                                                             "incomplete_details": {"reason": reason}}}
    if ending == "done, then incomplete":
        body.append({"type": "response.output_item.done", "output_index": 1, "item": theirs})
    verdict = replay_verdict(renumbered(body + [incomplete], body[0]["sequence_number"]))
    assert verdict.kind is VerdictKind.UNKNOWN and "item id changed from m1 to m2" in verdict.reason, verdict
    assert verdict.evidence["was"] == ("filtered" if reason == "content_filter" else "stopped_by_limit")


def test_a_replay_item_whose_events_carry_no_id_cannot_be_tied_to_the_item_its_done_names():
    """Compatible servers may leave item_id out: the end of a text alone cannot tie the deltas to
    the done's item, which another answer's could be."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = []
    for event in replay_inside_the_message(events):
        if event["type"].startswith("response.output_text.") or event["type"] == "response.content_part.done":
            event = {k: v for k, v in event.items() if k != "item_id"}
        body.append(event)
    verdict = replay_verdict(body)
    assert verdict.kind is VerdictKind.UNKNOWN and "carry no item id" in verdict.reason, verdict


def test_a_replay_item_whose_first_event_carries_no_id_takes_the_id_of_the_next_one():
    """One event without item_id does not make the item unknown: the id its later events give is
    its id, to compare its done with."""
    events = three_items([REASONING, MESSAGE, CALL])
    body = replay_inside_the_message(events)
    body[0] = {k: v for k, v in body[0].items() if k != "item_id"}
    assert body[1].get("item_id") == "m1"
    verdict = replay_verdict(body)
    assert verdict.kind is VerdictKind.COMPLETE, verdict


# -- an event whose data holds no type ---------------------------------------------------------

def untyped(kind: str, **fields) -> bytes:
    return sse(fields, kind)


def sdk_kinds(body: bytes) -> list:
    return [event.type for event in sdk_client(body).responses.create(model="m", input="hi", stream=True)]


def test_a_terminal_event_without_type_in_its_data_is_no_terminal_as_the_sdk_reads_none():
    """The SDK takes an event's kind from its data, never from its event line: a response.completed
    so sent reaches the app as an event of no kind, and the stream helper raises for want of one."""
    body = start("resp_A") + output() + untyped("response.completed", response=response("resp_A", output=[ITEM]))
    assert sdk_kinds(body)[-1] is None and sdk_helper_fails(body)
    analysis = judged(body)
    assert analysis.verdict.kind is VerdictKind.TRUNCATED, analysis.verdict
    assert any("has no string type in its data" in note for note in analysis.turn.notes), analysis.turn.notes
    assert judged(whole("resp_A")).verdict.kind is VerdictKind.COMPLETE


def test_a_delta_without_type_in_its_data_is_not_read_into_the_text():
    """The app's text never holds it, so the final text, which does, contradicts the deltas."""
    body = (start("resp_A") + output().replace(
        ev("response.output_text.delta", item_id="m1", output_index=0, content_index=0, delta="Hello"),
        ev("response.output_text.delta", item_id="m1", output_index=0, content_index=0, delta="Hel")
        + untyped("response.output_text.delta", item_id="m1", output_index=0, content_index=0, delta="lo"))
        + completed("resp_A"))
    assert None in sdk_kinds(body)
    analysis = judged(body)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "disagree" in analysis.verdict.reason, analysis.verdict


def test_an_event_without_type_that_carries_nothing_leaves_the_answer_complete():
    body = start("resp_A") + output() + untyped("response.in_progress", note="x") + completed("resp_A")
    assert not sdk_helper_fails(body)
    analysis = judged(body)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
