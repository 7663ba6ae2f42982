"""Memory per stream stays bounded for shapes that grew it: Gemini partialArgs (each part may name a
new path, which makes an object per step, or an array index that makes its slots), Anthropic event names that differ from their
type, unmodelled delta types and fields, `verify`'s list of event arrivals, OpenAI Chat usage chunks
under ever new unusable choice indexes, and OpenAI Responses output items (MAX_ITEMS) and closed
units (Judge.MAX_CLOSED_UNITS). Each is fed at two sizes; what the open stream holds must not grow
with the second."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from streamtap.commands.verify import VERIFY_KEEPS
from streamtap.providers import StreamSession, VerdictKind
from streamtap.providers.judge import Judge
from streamtap.providers.openai_responses import MAX_ITEMS
from streamtap.providers.turn import Dialect, Turn

CAP = 50_000  # the session's arguments cap for these tests (the proxy's is 4 Mi characters)


def held_after(session: StreamSession, chunks) -> int:
    """Bytes the open session holds after ``chunks``, fed 64 KiB at a time."""
    tracemalloc.start()
    try:
        buf = bytearray()
        for chunk in chunks:
            buf += chunk
            if len(buf) > 65536:
                session.feed(bytes(buf))
                buf.clear()
        session.feed(bytes(buf))
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def gemini(part: dict, finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": [part]}, "index": 0, **({"finishReason": finish} if finish else {})}
    return b"data: " + json.dumps({"candidates": [candidate]}).encode() + b"\n\n"


def partial_args(count: int, path: str):
    for i in range(count):
        yield gemini({"functionCall": {"partialArgs": [{"jsonPath": path.format(i=i), "stringValue": "v"}], "willContinue": True}})


@pytest.mark.parametrize("path", ["$.k{i}[9000]", "$.k{i}", "$.a.b{i}"], ids=["array-index", "new-key", "deep-key"])
def test_gemini_partial_args_are_charged_to_the_arguments_cap(path):
    held = []
    for count in (2_000, 8_000):
        session = StreamSession("gemini", "sse", keep_arrivals=False, arguments_cap=CAP)
        session.feed(gemini({"functionCall": {"name": "f", "willContinue": True}}))
        held.append(held_after(session, partial_args(count, path)))
        session.feed(gemini({"functionCall": {}}) + gemini({"text": ""}, "STOP"))
        analysis = session.close()
        assert analysis.verdict.kind is not VerdictKind.COMPLETE, analysis.verdict  # arguments not kept whole
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


@pytest.mark.parametrize("depth", [0, 40, 400])
def test_gemini_partial_args_are_charged_for_each_object_their_path_makes(depth):
    """A part whose path is new below its first step makes an object per step: each is charged, so
    what the call holds stays within a few bytes per character of the cap whatever the paths' depth
    (charged for their text alone, 400-step paths held 85 bytes per character)."""
    session = StreamSession("gemini", "sse", keep_arrivals=False, arguments_cap=CAP)
    session.feed(gemini({"functionCall": {"name": "f", "willContinue": True}}))
    held = held_after(session, partial_args(2_000, "$.k{i}" + ".a" * depth))
    assert held < 8 * CAP, held / CAP


def anthropic(name: str, payload: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


START = [
    anthropic("message_start", {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "c",
                                                                      "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}),
    anthropic("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
]
SHAPES = {
    "renamed": lambda i: f'event: e{i}\ndata: {{"type":"ping"}}\n\n'.encode(),
    "delta-types": lambda i: anthropic("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": f"d{i}_delta", "x": "v"}}),
    "delta-fields": lambda i: anthropic("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", f"f{i}": "v"}}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_anthropic_names_and_unmodelled_deltas_do_not_grow_the_turn(shape):
    held = []
    for count in (5_000, 20_000):
        session = StreamSession("anthropic", "sse", keep_arrivals=False)
        session.feed(b"".join(START))
        held.append(held_after(session, (SHAPES[shape](i) for i in range(count))))
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def test_verify_keeps_no_arrival_per_event():
    """One float per event would grow verify's memory with the recording (the README says it does not)."""
    session = StreamSession("openai-chat", "sse", **VERIFY_KEEPS)
    session.feed(b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n' * 100, 0.5)
    assert session.close().turn.timing.arrivals in ([], None)


def chat_usage(index: int, count: int) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": index, "delta": {"content": "x"}}],
             "usage": {"prompt_tokens": 1, "completion_tokens": count}}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_chat_usage_counts_are_kept_per_choice_not_per_unusable_index():
    """Every unusable index (-1, -2, ...) is choice 0: its usage count is kept once, not once per index."""
    held = []
    for count in (5_000, 20_000):
        session = StreamSession("openai-chat", "sse", keep_arrivals=False)
        held.append(held_after(session, (chat_usage(-(i + 1), i + 1) for i in range(count))))
        assert session.close().verdict.kind is VerdictKind.TRUNCATED  # no finish_reason, no [DONE]
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def responses(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def responses_items(count: int, text: bool = False, completed: bool = True):
    """A Responses stream of ``count`` message items (each with one text part when ``text``)."""
    numbers = iter(range(10**9))

    def event(kind: str, **fields) -> bytes:
        return responses({"type": kind, "sequence_number": next(numbers), **fields})

    def message(i: int) -> dict:
        parts = [{"type": "output_text", "text": "w", "annotations": []}] if text else []
        return {"id": f"msg_{i}", "type": "message", "status": "completed", "role": "assistant", "content": parts}

    yield event("response.created", response={"id": "resp_1", "status": "in_progress", "output": []})
    for i in range(count):
        yield event("response.output_item.added", output_index=i, item={**message(i), "content": []})
        if text:
            part = {"output_index": i, "item_id": f"msg_{i}", "content_index": 0}
            yield event("response.content_part.added", **part, part={"type": "output_text", "text": "", "annotations": []})
            yield event("response.output_text.delta", **part, delta="w")
            yield event("response.output_text.done", **part, text="w")
            yield event("response.content_part.done", **part, part=message(i)["content"][0])
        yield event("response.output_item.done", output_index=i, item=message(i))
    if completed:
        output = [message(i) for i in range(count)]
        yield event("response.completed", response={"id": "resp_1", "status": "completed", "output": output})


def judge_responses(chunks) -> object:
    session = StreamSession("openai-responses", "sse", keep_arrivals=False)
    session.feed(b"".join(chunks))
    return session.close()


def test_responses_items_within_the_bound_still_complete():
    """MAX_ITEMS items, each with a text part, closes about three units per item: still judged."""
    analysis = judge_responses(responses_items(MAX_ITEMS, text=True))
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
    assert len(analysis.turn.blocks) == MAX_ITEMS


def test_responses_items_past_the_bound_are_unknown_and_stop_growing():
    analysis = judge_responses(responses_items(MAX_ITEMS + 500))
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN, verdict.reason
    assert f"the answer added more than {MAX_ITEMS} output items" in verdict.reason
    assert verdict.evidence["max_items"] == MAX_ITEMS
    assert verdict.seq == 1 + 2 * MAX_ITEMS  # the output_item.added past the bound
    held = []
    for count in (MAX_ITEMS + 1_000, 4 * MAX_ITEMS):
        session = StreamSession("openai-responses", "sse", keep_arrivals=False)
        held.append(held_after(session, responses_items(count, completed=False)))
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def test_responses_parts_closed_without_end_stay_within_the_closed_units_bound():
    """Closing parts an item never had is corrupt at the first; every later one must not cost memory."""
    def parts_done(count: int):
        yield from responses_items(1, completed=False)
        for i in range(count):
            yield responses({"type": "response.content_part.done", "sequence_number": 3 + i, "output_index": 0,
                             "content_index": i + 1, "part": {"type": "output_text", "text": ""}})

    held = []
    for count in (Judge.MAX_CLOSED_UNITS + 4_000, 3 * Judge.MAX_CLOSED_UNITS):
        session = StreamSession("openai-responses", "sse", keep_arrivals=False)
        held.append(held_after(session, parts_done(count)))
        assert session.close().verdict.kind is VerdictKind.CORRUPT  # the first such part decides
    assert held[1] < held[0] * 1.5 + 256 * 1024, held


def test_judge_keeps_at_most_max_closed_units_and_halts_past_them():
    judge = Judge(Turn(Dialect.OPENAI_RESPONSES))
    for i in range(Judge.MAX_CLOSED_UNITS + 10):
        judge.close(f"block {i}", "stop", i, i * 10)
    assert len(judge.closed_units) == Judge.MAX_CLOSED_UNITS
    assert judge.halt_verdict is not None and judge.halt_verdict.kind is VerdictKind.UNKNOWN
    assert f"closed more than {Judge.MAX_CLOSED_UNITS} units" in judge.halt_verdict.reason
    assert judge.halt_verdict.seq == Judge.MAX_CLOSED_UNITS  # the first unit past the bound
    judge.close("block 0", "stop", 0, 0)  # a unit closed already costs nothing
    assert judge.is_closed("block 0") and judge.reopened("block 0", "a delta", 99, 990)


def test_responses_items_only_the_terminal_event_lists_past_the_bound_are_unknown():
    """A final response listing more items than MAX_ITEMS that the stream never announced stops there too
    (empty ones: they make no block, so MAX_BLOCKS does not stop them)."""
    items = [{"id": f"msg_{i}", "type": "message", "role": "assistant", "content": []} for i in range(MAX_ITEMS + 10)]
    analysis = judge_responses([
        responses({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "output": []}}),
        responses({"type": "response.completed", "sequence_number": 1,
                   "response": {"id": "resp_1", "status": "completed", "output": items}}),
    ])
    assert analysis.verdict.kind is VerdictKind.UNKNOWN, analysis.verdict.reason
    assert f"the answer added more than {MAX_ITEMS} output items" in analysis.verdict.reason
