"""OpenAI Chat Completions and Responses: real captures, constructed edge cases, cuts, and the SDK as oracle."""

from __future__ import annotations

import json
import re

import httpx
import openai
import orjson
import pytest
from provider_streams import (
    C,
    E,
    F,
    L,
    T,
    X,
    chunk_lines,
    cassette_responses,
    cut_points,
    frame_chat,
    frame_responses,
    openai_responses,
    sse_spans,
    vercel,
)
from conftest import FIXTURES, shared_files, shared_path
from test_responses_client_executed_calls import sdk_client_calls

from streamtap.providers import (
    BlockKind,
    Dialect,
    StreamEnd,
    StreamSession,
    analyze_bytes,
    detect_dialect,
    sniff_dialect,
)

CHAT, RESPONSES = Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES

# Raw captured bodies (MANIFEST.md): dialect and what the capture is known to hold.
BODIES = {
    "pydantic-ai/bodies/openai-chat/test_openai_moderation_stream.0.sse": (CHAT, C, "end_turn"),
    "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.0.sse": (CHAT, C, "tool_use"),
    "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse": (CHAT, C, "end_turn"),
    "pydantic-ai/bodies/groq/test_tool_use_failed_error_streaming.0.sse": (CHAT, E, "error"),  # event: error mid-stream
    "pydantic-ai/bodies/groq/test_tool_use_failed_error_streaming.1.sse": (CHAT, C, "tool_use"),
    "pydantic-ai/bodies/groq/test_tool_use_failed_error_streaming.2.sse": (CHAT, C, "end_turn"),
    "pydantic-ai/bodies/openrouter/test_openrouter_stream_error.0.sse": (CHAT, E, "error"),  # error chunk, then [DONE]
    "pydantic-ai/bodies/openrouter/test_openrouter_streaming_reasoning.0.sse": (CHAT, C, "end_turn"),
    "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse": (CHAT, C, "tool_use"),
    "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.1.sse": (CHAT, C, "tool_use"),
    "openllmetry/bodies/openai_chat_stream_tool_call.0.sse": (CHAT, C, "tool_use"),
    # ends "data: [DONE]\n" with no blank line: the SSE rules never dispatch that event, so the body was cut
    "vercel-ai/openai-compatible/anthropic-fallback-tool-call.sse": (CHAT, T, "tool_use"),  # its finish_reason came; only the blank line after [DONE] did not
    "pydantic-ai/bodies/openai-responses/test_background_mode_streaming_starting_after_vcr.0.sse": (RESPONSES, C, "end_turn"),
    "pydantic-ai/bodies/openai-responses/test_background_mode_streaming_starting_after_vcr.1.sse": (RESPONSES, C, "end_turn"),
    "pydantic-ai/bodies/openai-responses/test_openai_responses_stream.0.sse": (RESPONSES, C, "tool_use"),
    "pydantic-ai/bodies/openai-responses/test_openai_responses_stream.1.sse": (RESPONSES, C, "end_turn"),
    "pydantic-ai/bodies/openai-responses/test_openai_responses_streaming_usage.0.sse": (RESPONSES, C, "tool_use"),
    "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.0.sse": (RESPONSES, C, "tool_use"),
    "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.1.sse": (RESPONSES, C, "tool_use"),
    "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.2.sse": (RESPONSES, C, "end_turn"),
}

# vercel-ai chunk lists (payloads only), re-framed as SSE: constructed framing, real payloads.
CHAT_CHUNKS = {
    "openai/chat/openai-text.chunks.txt": (C, "end_turn"),
    "openai/chat/azure-model-router.1.chunks.txt": (C, "end_turn"),
    "openai/completion/openai-completion-text.chunks.txt": (L, "max_tokens"),  # cut by max_tokens (length)
    "xai/xai-text.chunks.txt": (C, "end_turn"),
    "xai/xai-tool-call.chunks.txt": (C, "tool_use"),
    "openai-compatible/xai-text.chunks.txt": (C, "end_turn"),
    "openai-compatible/xai-tool-call.chunks.txt": (C, "tool_use"),
    "mistral/mistral-text.chunks.txt": (C, "end_turn"),
    "mistral/mistral-reasoning.chunks.txt": (C, "end_turn"),
    "mistral/mistral-tool-call.chunks.txt": (C, "tool_use"),
    "mistral/mistral-incremental-tool-call.chunks.txt": (C, "tool_use"),
    "groq/groq-tool-call.chunks.txt": (C, "tool_use"),
    "deepseek/deepseek-reasoning.chunks.txt": (C, "end_turn"),
    "deepseek/deepseek-tool-call.chunks.txt": (C, "tool_use"),
}
RESPONSES_CHUNKS = {
    "azure/azure-text.1.chunks.txt": (C, "end_turn"),
    "azure/azure-tool-call.1.chunks.txt": (C, "tool_use"),
    "openai/responses/openai-error.1.chunks.txt": (E, "error"),  # error event then response.failed
    "openai/responses/github-copilot-id-rotation.1.chunks.txt": (C, "end_turn"),
    "openai/responses/openai-file-search-tool.1.chunks.txt": (C, "end_turn"),
    "openai/responses/openai-web-search-tool.1.chunks.txt": (C, "end_turn"),
    "openai/responses/openai-tool-search.1.chunks.txt": (C, "tool_use"),
    "openai/responses/openai-image-generation-tool.1.chunks.txt": (C, "end_turn"),
    "openai/responses/openai-mcp-tool-approval.1.chunks.txt": (C, "tool_use"),  # the app must approve the MCP call
    "openai/responses/openai-local-shell-tool.1.chunks.txt": (C, "tool_use"),  # the app runs the shell command
    "openai/responses/openai-shell-local-multiturn.1.chunks.txt": (C, "end_turn"),
    "openai/responses/openai-shell-container-multiturn.1.chunks.txt": (C, "end_turn"),
    "openai/responses/programmatic-tool-calling.1.chunks.txt": (C, "tool_use"),
    "open-responses/lmstudio-tool-call.1.chunks.txt": (C, "tool_use"),
    "open-responses/openai-pdf-input-file.1.chunks.txt": (C, "end_turn"),
}


def _shared_or_skip() -> None:
    shared_path("fixtures", "MANIFEST.md")


@pytest.mark.parametrize("name", sorted(BODIES))
def test_captured_body(name):
    body = shared_path("fixtures", name).read_bytes()
    dialect, kind, stop = BODIES[name]
    assert sniff_dialect(body).dialect is dialect
    analysis = analyze_bytes(body, dialect)
    assert analysis.verdict.kind is kind, analysis.verdict
    assert analysis.turn.stop_reason == stop
    assert analysis.verdict.seq is not None and analysis.verdict.offset is not None
    # the same bytes in small network reads give the same turn and verdict
    again = analyze_bytes(body, dialect, chunk_size=7)
    assert again.turn.to_dict() == analysis.turn.to_dict()
    assert again.verdict.to_dict() == analysis.verdict.to_dict()


def test_every_openai_style_body_is_covered():
    _shared_or_skip()
    listed = set(BODIES)
    for pattern in ("*/bodies/**/*.sse", "vercel-ai/openai-compatible/*.sse"):
        for path in shared_files(pattern):
            name = str(path.relative_to(FIXTURES))
            if name.startswith(("pydantic-ai/bodies/anthropic/", "openllmetry/bodies/anthropic_")):
                continue
            if "/google/" in name:
                continue
            assert name in listed, f"{name} has no expectation"


@pytest.mark.parametrize("name", sorted(CHAT_CHUNKS))
def test_chat_chunk_lists_reframed(name):
    path = vercel(*name.split("/"))
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_chat(chunk_lines(path))
    kind, stop = CHAT_CHUNKS[name]
    assert sniff_dialect(body).dialect is CHAT
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is kind, analysis.verdict
    assert analysis.turn.stop_reason == stop
    blocks = analysis.turn.blocks
    assert blocks, "no content assembled"
    if stop == "tool_use":
        calls = analysis.turn.tool_calls()
        assert calls and all(c.arguments is not None and c.name for c in calls)
    # routing by the event's own tag: thinking never follows answer text in these captures
    kinds = [b.kind for b in blocks]
    if BlockKind.THINKING in kinds and BlockKind.TEXT in kinds:
        assert kinds.index(BlockKind.THINKING) < kinds.index(BlockKind.TEXT)


@pytest.mark.parametrize("name", sorted(RESPONSES_CHUNKS))
def test_responses_chunk_lists_reframed(name):
    path = vercel(*name.split("/"))
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_responses(chunk_lines(path))
    kind, stop = RESPONSES_CHUNKS[name]
    assert sniff_dialect(body).dialect is RESPONSES
    analysis = analyze_bytes(body, RESPONSES)
    assert analysis.verdict.kind is kind, analysis.verdict
    assert analysis.turn.stop_reason == stop


def test_responses_error_capture_names_the_error():
    path = vercel("openai", "responses", "openai-error.1.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    analysis = analyze_bytes(frame_responses(chunk_lines(path)), RESPONSES)
    assert analysis.verdict.kind is E
    assert "insufficient_quota" in analysis.verdict.reason
    assert analysis.turn.error["code"] == "insufficient_quota"


def test_trimmed_capture_is_a_sequence_gap():
    """openai-phase was trimmed by its recorders: sequence_number jumps 5 -> 41. That is lost events."""
    path = vercel("openai", "responses", "openai-phase.1.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    analysis = analyze_bytes(frame_responses(chunk_lines(path)), RESPONSES)
    assert analysis.verdict.kind is X
    assert "sequence_number jumped from 5 to 41" in analysis.verdict.reason
    assert analysis.verdict.seq == 6  # the seventh SSE event is where it stopped making sense


def test_several_responses_back_to_back_are_flagged_and_each_part_is_complete():
    """Documented behaviour: one body = one response. A second response after the terminal event is corrupt;
    split at the terminal events, each response is complete on its own."""
    path = vercel("openai", "responses", "openai-reasoning-encrypted-content.1.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    lines = chunk_lines(path)
    whole = analyze_bytes(frame_responses(lines), RESPONSES)
    assert whole.verdict.kind is X and "after the response was closed by response.completed" in whole.verdict.reason
    parts, current = [], []
    for line in lines:
        current.append(line)
        if orjson.loads(line)["type"] in ("response.completed", "response.incomplete", "response.failed"):
            parts.append(current)
            current = []
    assert len(parts) == 4 and not current
    stops = [analyze_bytes(frame_responses(p), RESPONSES) for p in parts]
    assert all(a.verdict.kind is C for a in stops), [a.verdict for a in stops]
    assert [a.turn.stop_reason for a in stops].count("tool_use") >= 1


def test_cassette_requests_detect_the_dialect():
    _shared_or_skip()
    captured = [
        c
        for c in cassette_responses("pydantic-ai/cassettes/**/*.yaml") + cassette_responses("openllmetry/cassettes/openai*.yaml")
        if "/chat/completions" in c.request.url or "/responses" in c.request.url
    ]
    assert len(captured) >= 15
    for item in captured:
        detection = detect_dialect(item.request, item.content_type)
        expected = CHAT if "/chat/completions" in item.request.url else RESPONSES
        assert detection.dialect is expected, item.name
        assert detection.wire == "sse"
        analysis = analyze_bytes(item.body, detection.dialect, wire=detection.wire, http_status=item.status)
        wanted = E if ("stream_error" in item.name or "failed_error_streaming.yaml#0" in item.name) else C
        assert analysis.verdict.kind is wanted, (item.name, analysis.verdict)


# ---------------------------------------------------------------------------------------
# constructed streams (shapes from provider-streams.md §1 and §2; no capture exists)


def chat_chunk(delta=None, finish=None, index=0, **extra) -> dict:
    chunk = {"id": "chatcmpl-c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
             "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish}]}
    chunk.update(extra)
    return chunk


def sse_data(*objects, done=True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objects)
    return body + (b"data: [DONE]\n\n" if done else b"")


def test_constructed_mid_stream_error_then_done_is_errored():
    body = sse_data(
        chat_chunk({"role": "assistant", "content": "Hel"}),
        {"error": {"message": "The server had an error processing your request.", "type": "server_error", "param": None, "code": None}},
    )
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is E
    assert "server had an error" in analysis.verdict.reason
    assert analysis.verdict.seq == 1
    assert analysis.turn.text() == "Hel"


def test_constructed_done_without_finish_reason_is_truncated():
    analysis = analyze_bytes(sse_data(chat_chunk({"content": "Hi"})), CHAT)
    assert analysis.verdict.kind is T
    assert "finish_reason" in analysis.verdict.reason


def test_constructed_finish_without_done_is_truncated_but_content_complete():
    analysis = analyze_bytes(sse_data(chat_chunk({"content": "Hi"}), chat_chunk(finish="stop"), done=False), CHAT)
    assert analysis.verdict.kind is T
    assert analysis.verdict.evidence["content_complete"] is True


def test_constructed_n2_choices_each_with_its_finish_reason():
    body = sse_data(
        chat_chunk({"content": "A"}, index=0),
        chat_chunk({"content": "B"}, index=1),
        chat_chunk({"content": "a"}, index=0),
        chat_chunk(finish="stop", index=0),
        chat_chunk(finish="length", index=1),
    )
    analysis = analyze_bytes(body, CHAT)
    assert [analysis.turn.text(i) for i in (0, 1)] == ["Aa", "B"]
    assert [c.stop_reason for c in analysis.turn.choices] == ["stop", "length"]
    assert analysis.verdict.kind is L  # judged by the worst choice
    one_missing = sse_data(chat_chunk({"content": "A"}, index=0), chat_chunk({"content": "B"}, index=1), chat_chunk(finish="stop"))
    assert analyze_bytes(one_missing, CHAT).verdict.kind is T


def _n2(choice_0: list[dict], choice_1: list[dict], finishes: tuple[str, str]) -> bytes:
    """Two choices, each with its deltas and its finish_reason."""
    chunks = [chat_chunk(delta, index=0) for delta in choice_0] + [chat_chunk(delta, index=1) for delta in choice_1]
    return sse_data(*chunks, chat_chunk(finish=finishes[0], index=0), chat_chunk(finish=finishes[1], index=1))


def _call(name: str, arguments: str) -> dict:
    return {"tool_calls": [{"index": 0, "id": f"call_{name}", "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


def test_each_choice_that_says_it_called_a_tool_must_hold_a_call():
    """With n > 1 each choice is an answer of its own: another choice's stop or call does not
    explain a choice that finished with tool_calls and holds none."""
    alone = analyze_bytes(_n2([{"content": "Sunny."}], [{"content": "Let me check."}], ("stop", "tool_calls")), CHAT).verdict
    assert alone.kind is X and "choice 1's stop reason tool_calls" in alone.reason, alone
    assert alone.evidence["choice"] == 1
    beside_a_call = _n2([_call("f", "{}")], [{"content": "Let me check."}], ("tool_calls", "tool_calls"))
    verdict = analyze_bytes(beside_a_call, CHAT).verdict
    assert verdict.kind is X and verdict.evidence["choice"] == 1, verdict
    after_a_limit = _n2([{"content": "Cut"}], [{"content": "Let me check."}], ("length", "tool_calls"))
    assert analyze_bytes(after_a_limit, CHAT).verdict.kind is X
    both_called = _n2([_call("f", "{}")], [_call("g", '{"a": 1}')], ("tool_calls", "tool_calls"))
    assert analyze_bytes(both_called, CHAT).verdict.kind is C


def test_a_tool_call_that_does_not_parse_is_excused_only_by_its_own_choices_limit():
    broken_at_stop = _n2([{"content": "Cut"}], [_call("f", '{"a":')], ("length", "stop"))
    verdict = analyze_bytes(broken_at_stop, CHAT).verdict
    assert verdict.kind is X and "invalid argument JSON" in verdict.reason and verdict.evidence["choice"] == 1, verdict
    cut_by_its_limit = _n2([{"content": "Done."}], [_call("f", '{"a":')], ("stop", "length"))
    verdict = analyze_bytes(cut_by_its_limit, CHAT).verdict
    assert verdict.kind is L and verdict.evidence["cut_tool_calls"] == [[1, 0]], verdict


def test_constructed_refusal_and_content_filter_are_filtered():
    refusal = sse_data(chat_chunk({"refusal": "I can't help with that."}), chat_chunk(finish="stop"))
    analysis = analyze_bytes(refusal, CHAT)
    assert analysis.verdict.kind is F
    assert analysis.turn.blocks[0].kind is BlockKind.REFUSAL
    assert analyze_bytes(sse_data(chat_chunk({"content": "x"}), chat_chunk(finish="content_filter")), CHAT).verdict.kind is F


def test_a_tool_index_reused_for_a_new_call_is_two_calls_and_corrupt_for_the_one_the_sdk_makes_of_them():
    """A gateway's parallel calls on one index: the turn keeps both, but the openai SDK (its stream
    helper, and the raw loop that joins fragments by index) hands the app one call, under the joined
    ids and names, whose arguments do not parse. The app's call is not the answer: corrupt, naming
    what the app gets."""
    call = lambda **f: _chunk({"tool_calls": [{"index": 0, "type": "function", **f}]})  # noqa: E731
    body = _chat(call(id="call_a", function={"name": "get_weather", "arguments": '{"city":"Paris"}'}),
                 call(id="call_b", function={"name": "get_time", "arguments": '{"tz":"CET"}'}), _chunk({}, "tool_calls"))
    joined = _run_chat_sdk(body).choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in joined] == [
        ("call_acall_b", "get_weatherget_time", '{"city":"Paris"}{"tz":"CET"}')]  # what the app gets
    analysis = analyze_bytes(body, CHAT)
    assert [(c.id, c.name, c.arguments) for c in analysis.turn.tool_calls()] == [
        ("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {"tz": "CET"})]
    verdict = analysis.verdict
    assert verdict.kind is X, verdict
    assert "index 0 of choice 0 reused for a new call" in verdict.reason and "call_acall_b" in verdict.reason
    assert "get_weatherget_time" in verdict.reason and verdict.evidence["ids"] == ["call_a", "call_b"]


@pytest.mark.parametrize("calls", [[{"index": 1}], [{}], [{"index": 1}, {"index": 0}]],
                         ids=["gap", "no index", "reversed"])
def test_a_tool_call_the_sdk_stream_helper_fails_on_says_so(calls):
    """Compatible servers (Mistral's, an Anthropic fallback) send such calls: a raw stream's app may
    join them, the openai SDK's stream helper raises. The turn keeps them and says so."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    chunks = [chat_chunk({"tool_calls": [{**where, "id": f"call_{n}", "type": "function",
                                          "function": {"name": "read_file", "arguments": '{"path":"a"}'}}]})
              for n, where in enumerate(calls)] + [chat_chunk(finish="tool_calls")]
    analysis = analyze_bytes(sse_data(*chunks), CHAT)
    assert analysis.verdict.kind is C and len(analysis.turn.tool_calls()) == len(calls), analysis.verdict
    from openai._models import construct_type  # how the SDK builds a chunk from the wire: unvalidated

    state = ChatCompletionStreamState()
    with pytest.raises((IndexError, TypeError)):
        for chunk in chunks:
            state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=chunk))
    assert any("stream helper raises" in note for note in analysis.turn.notes), analysis.turn.notes
    whole = [chat_chunk({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                                         "function": {"name": "read_file", "arguments": "{}"}}]}), chat_chunk(finish="tool_calls")]
    assert not [n for n in analyze_bytes(sse_data(*whole), CHAT).turn.notes if "stream helper" in n]  # the control


def test_an_audio_answer_keeps_its_transcript_as_the_text_the_sdk_hands_the_app():
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    chunks = [chat_chunk({"role": "assistant", "audio": {"id": "audio_1", "transcript": "The answer is 42.\n"}}),
              chat_chunk({"audio": {"data": "UklGRg==", "transcript": "DONE"}}),
              chat_chunk({"audio": {"expires_at": 1770000000}}), chat_chunk(finish="stop")]
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    transcript = state.current_completion_snapshot.choices[0].message.audio.transcript
    analysis = analyze_bytes(sse_data(*chunks), CHAT)
    assert analysis.turn.text() == transcript == "The answer is 42.\nDONE"
    assert analyze_bytes(sse_data(*chunks), CHAT, sentinel="DONE").verdict.kind is C  # its last line is the transcript's


def test_constructed_tool_calls_by_index_and_invalid_arguments():
    call = lambda i, **f: chat_chunk({"tool_calls": [{"index": i, **f}]})  # noqa: E731
    good = sse_data(
        chat_chunk({"content": "Let me check."}),
        call(0, id="call_A", type="function", function={"name": "get_weather", "arguments": ""}),
        call(1, id="call_B", type="function", function={"name": "get_time", "arguments": "{}"}),
        call(0, function={"arguments": '{"city":'}),
        call(0, function={"arguments": '"Paris"}'}),
        chat_chunk(finish="tool_calls"),
        {"id": "chatcmpl-c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}},
    )
    analysis = analyze_bytes(good, CHAT)
    assert analysis.verdict.kind is C and analysis.turn.stop_reason == "tool_use"
    calls = analysis.turn.tool_calls()
    assert [(c.id, c.name, c.arguments) for c in calls] == [("call_A", "get_weather", {"city": "Paris"}), ("call_B", "get_time", {})]
    assert calls[0].arguments_raw == '{"city":"Paris"}'
    assert (analysis.turn.usage.input, analysis.turn.usage.output, analysis.turn.usage.total) == (3, 5, 8)
    bad = sse_data(call(0, id="call_A", function={"name": "f", "arguments": '{"city": "Par'}), chat_chunk(finish="tool_calls"))
    verdict = analyze_bytes(bad, CHAT).verdict
    assert verdict.kind is X and "invalid argument JSON" in verdict.reason
    # the same call cut by max tokens: the limit explains the broken JSON
    limited = analyze_bytes(bad.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"length"'), CHAT)
    assert limited.verdict.kind is L and limited.verdict.evidence["cut_tool_calls"] == [[0, 0]]
    assert limited.turn.tool_calls()[0].arguments_raw == '{"city": "Par' and limited.turn.tool_calls()[0].arguments_error


def test_constructed_reasoning_deltas_are_thinking_text_between_calls_stays_two_blocks():
    body = sse_data(
        chat_chunk({"reasoning_content": "think "}),
        chat_chunk({"reasoning": "more"}),
        chat_chunk({"content": "first"}),
        chat_chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
        chat_chunk({"content": "second"}),
        chat_chunk(finish="tool_calls"),
    )
    turn = analyze_bytes(body, CHAT).turn
    assert [(b.kind, b.text) for b in turn.blocks if b.kind is not BlockKind.TOOL_CALL] == [
        (BlockKind.THINKING, "think more"), (BlockKind.TEXT, "first"), (BlockKind.TEXT, "second")
    ]
    assert [b.kind for b in turn.blocks] == [BlockKind.THINKING, BlockKind.TEXT, BlockKind.TOOL_CALL, BlockKind.TEXT]


def test_constructed_unparseable_event_json_is_corrupt():
    body = sse_data(chat_chunk({"content": "a"})) .replace(b"data: [DONE]", b'data: {"choices": [ broken\n\ndata: [DONE]')
    verdict = analyze_bytes(body, CHAT).verdict
    assert verdict.kind is X and "not JSON" in verdict.reason and verdict.seq == 1


def responses_stream(*events: dict) -> bytes:
    out = []
    for number, event in enumerate(events):
        event = {"sequence_number": number, **event}
        out.append(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
    return b"".join(out)


def message_events(text_parts: list[str]) -> list[dict]:
    item = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    events = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "model": "gpt-test", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": ""}},
    ]
    events += [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": p} for p in text_parts]
    return events


@pytest.mark.parametrize(
    ("reason", "kind", "stop"),
    [("max_output_tokens", L, "max_tokens"), ("content_filter", F, "filtered")],
)
def test_constructed_response_incomplete(reason, kind, stop):
    events = message_events(["Once upon", " a time"]) + [
        {"type": "response.incomplete", "response": {"id": "resp_1", "status": "incomplete", "incomplete_details": {"reason": reason},
                                                      "output": [], "usage": {"input_tokens": 5, "output_tokens": 16, "total_tokens": 21}}},
    ]
    analysis = analyze_bytes(responses_stream(*events), RESPONSES)
    assert analysis.verdict.kind is kind
    assert analysis.turn.stop_reason == stop
    assert analysis.turn.text() == "Once upon a time"  # partial output kept
    assert analysis.turn.usage.output == 16


def test_constructed_responses_failed_without_error_event():
    events = message_events(["x"]) + [{"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "boom"}}}]
    analysis = analyze_bytes(responses_stream(*events), RESPONSES)
    assert analysis.verdict.kind is E and "boom" in analysis.verdict.reason


def test_constructed_responses_corruptions():
    base = message_events(["Hi"])
    # a delta for an item that was never added
    stray = base + [{"type": "response.output_text.delta", "item_id": "msg_9", "output_index": 4, "content_index": 0, "delta": "x"}]
    assert analyze_bytes(responses_stream(*stray), RESPONSES).verdict.kind is X
    # disorder: a sequence number repeats
    body = responses_stream(*base).replace(b'"sequence_number":3', b'"sequence_number":2')
    verdict = analyze_bytes(body, RESPONSES).verdict
    assert verdict.kind is X and "went back" in verdict.reason
    # a function call that never finished, yet the response claims completion
    call = [
        {"type": "response.created", "response": {"id": "r", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": '{"a":'},
        {"type": "response.completed", "response": {"id": "r", "status": "completed", "output": None}},
    ]
    verdict = analyze_bytes(responses_stream(*call), RESPONSES).verdict
    assert verdict.kind is X and "never done" in verdict.reason and verdict.seq == 3
    # a message item started and never stopped, yet the response claims completion
    unclosed = base + [{"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": None}}]
    verdict = analyze_bytes(responses_stream(*unclosed), RESPONSES).verdict
    assert verdict.kind is X and "output item 0 (message) was added and never done" in verdict.reason
    # cut mid-arguments by max_output_tokens: stopped by the limit, the partial call kept
    limited = call[:3] + [{"type": "response.incomplete", "response": {"id": "r", "status": "incomplete",
                                                                       "incomplete_details": {"reason": "max_output_tokens"}}}]
    analysis = analyze_bytes(responses_stream(*limited), RESPONSES)
    assert analysis.verdict.kind is L and analysis.turn.tool_calls()[0].arguments_raw == '{"a":'
    # the same stream cut before the terminal event is a cut, not corruption
    assert analyze_bytes(responses_stream(*base), RESPONSES).verdict.kind is T


def _numbers_taken_off(body: bytes, events: int) -> bytes:
    """``body`` with the sequence_number taken off its first ``events`` events."""
    parts = body.split(b"\n\n")
    for i in range(events):
        parts[i] = re.sub(rb'"sequence_number":\d+,', b"", parts[i])
    return b"\n\n".join(parts)


def test_numbering_that_begins_after_unnumbered_events_must_begin_at_their_count():
    done = [{"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": "Hi"},
            {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0,
             "part": {"type": "output_text", "text": "Hi"}},
            {"type": "response.output_item.done", "output_index": 0,
             "item": {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": "Hi"}]}},
            {"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": None}}]
    whole = responses_stream(*message_events(["Hi"]), *done)
    assert analyze_bytes(whole, RESPONSES).verdict.kind is C
    # the first two events unnumbered, the third says 2: where it stands, nothing lost
    assert analyze_bytes(_numbers_taken_off(whole, 2), RESPONSES).verdict.kind is C
    # the third event dropped: the fourth says 3 after two events
    events = whole.split(b"\n\n")
    lost = _numbers_taken_off(b"\n\n".join(events[:2] + events[3:]), 2)
    verdict = analyze_bytes(lost, RESPONSES).verdict
    assert verdict.kind is X and "sequence_number begins at 3 after 2 event(s) without one" in verdict.reason
    assert verdict.evidence["unnumbered"] == 2


def test_a_stitch_joined_inside_an_event_is_not_taken_for_rotating_ids():
    """A cut inside an event of one answer (no numbers), then the inside of another answer's
    event (numbered) that happens to leave a line that parses: the garbled id is no rotation."""
    folder = ("fixtures", "pydantic-ai", "bodies", "openai-responses")
    head = shared_path(*folder, "test_openai_responses_stream.0.sse").read_bytes()
    tail = shared_path(*folder, "test_openai_responses_streaming_usage.0.sse").read_bytes()
    assert analyze_bytes(head, RESPONSES).verdict.kind is C and analyze_bytes(tail, RESPONSES).verdict.kind is C
    cut = head.index(b'"type":"response.in_progress"')
    cut = head.index(b'"id":"resp_', cut) + 20  # inside the in_progress id
    done = tail.index(b"event: response.output_item.done")
    join = tail.index(b'"encrypted_content":"', done) + 40  # inside the done reasoning item's encrypted content
    stitched = head[:cut] + tail[join:]
    verdict = analyze_bytes(stitched, RESPONSES).verdict
    assert verdict.kind is not C, verdict.reason


# ---------------------------------------------------------------------------------------
# cuts: every event boundary and sampled offsets inside events


def _cut_bodies():
    cases = []
    for name in ("openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse",
                 "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse",
                 "pydantic-ai/bodies/openrouter/test_openrouter_streaming_reasoning.0.sse"):
        cases.append((name, CHAT))
    for name in ("pydantic-ai/bodies/openai-responses/test_openai_responses_stream.0.sse",
                 "pydantic-ai/bodies/openai-responses/test_openai_responses_streaming_usage.0.sse",
                 "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.2.sse"):
        cases.append((name, RESPONSES))
    return cases


@pytest.mark.parametrize(("name", "dialect"), _cut_bodies())
def test_cut_anywhere_is_never_complete(name, dialect):
    body = shared_path("fixtures", name).read_bytes()
    assert analyze_bytes(body, dialect).verdict.kind is C
    points = cut_points(body, sse_spans(body), inside_per_event=2)
    assert len(points) > 10
    for point in points:
        for end in (StreamEnd.FINISHED, StreamEnd.UPSTREAM_RESET):
            verdict = analyze_bytes(body[:point], dialect, end=end).verdict
            assert verdict.kind in (T, X), (point, verdict)
            assert verdict.offset is not None and verdict.offset <= point


def test_cut_long_capture_at_every_boundary():
    path = vercel("openai", "chat", "openai-text.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_chat(chunk_lines(path))
    spans = sse_spans(body)
    assert len(spans) > 300
    for point in cut_points(body, spans, inside_per_event=0):
        verdict = analyze_bytes(body[:point], CHAT).verdict
        assert verdict.kind is T, (point, verdict)


def test_client_abort_is_said_not_to_be_the_providers_fault():
    body = shared_path("fixtures", "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse").read_bytes()
    verdict = analyze_bytes(body[: len(body) // 2], CHAT, end=StreamEnd.CLIENT_ABORTED).verdict
    assert verdict.kind is T
    assert "not the provider's fault" in verdict.reason
    assert verdict.evidence["end"] == "client_aborted"


# ---------------------------------------------------------------------------------------
# the official SDK as the reference: the same bytes served to it in process by httpx's
# MockTransport (no socket needed: the SDK's stream parsing is the reference here, not under test)


def _client(body: bytes) -> openai.OpenAI:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(upstream)))


def _chat_sdk_cases():
    cases = [(n, None) for n, (d, k, _) in BODIES.items() if d is CHAT and k is C and n not in SDK_REFUSES]
    cases += [(None, n) for n, (k, _) in CHAT_CHUNKS.items() if n.startswith(("openai/chat", "xai", "groq", "deepseek", "openai-compatible"))]
    return cases


# Streams the SDK's stream helpers refuse (their own limits, not stream faults); streamtap judges them
# complete above. Checked here so a future SDK that accepts them shows up.
SDK_REFUSES = {
    # tool call at index 1 with no index 0 (text came first): the helper indexes a list by tool index
    "vercel-ai/openai-compatible/anthropic-fallback-tool-call.sse": IndexError,
    # a resumed background stream starts after response.created (starting_after=0)
    "pydantic-ai/bodies/openai-responses/test_background_mode_streaming_starting_after_vcr.1.sse": RuntimeError,
    # ids rotate between lifecycle events behind GitHub Copilot
    "openai/responses/github-copilot-id-rotation.1.chunks.txt": RuntimeError,
}


def _body(body_name, chunks_name, frame):
    if body_name:
        return shared_path("fixtures", body_name).read_bytes()
    path = vercel(*chunks_name.split("/"))
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return frame(chunk_lines(path))


@pytest.mark.parametrize("name", sorted(SDK_REFUSES))
def test_streams_the_sdk_refuses_are_still_judged(name):
    responses = "responses" in name
    body = _body(None if name.endswith(".txt") else name, name if name.endswith(".txt") else None,
                 frame_responses if responses else frame_chat)
    with pytest.raises(SDK_REFUSES[name]):
        client = _client(body)
        if responses:
            with client.responses.stream(model="m", input="hi") as stream:
                for _ in stream:
                    pass
        else:
            with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
                for _ in stream:
                    pass
    expected = BODIES.get(name, (None, C))[1]
    assert analyze_bytes(body, RESPONSES if responses else CHAT).verdict.kind is expected


@pytest.mark.parametrize(("body_name", "chunks_name"), _chat_sdk_cases())
def test_chat_completions_equal_the_sdk_stream_helper(body_name, chunks_name):
    body = _body(body_name, chunks_name, frame_chat)
    with _client(body).chat.completions.stream(model="gpt-test", messages=[{"role": "user", "content": "hi"}]) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    turn = analyze_bytes(body, CHAT).turn
    assert len(final.choices) == len(turn.choices)
    for choice in final.choices:
        assert (choice.message.content or "") == turn.text(choice.index)
        assert choice.finish_reason == turn.choices[choice.index].stop_reason
        ours = turn.tool_calls(choice.index)
        theirs = choice.message.tool_calls or []
        assert [(c.id, c.function.name, c.function.arguments) for c in theirs] == [(c.id, c.name, c.arguments_raw) for c in ours]
    if final.usage is None:
        # the helper overwrites usage with a later chunk's "usage": null (moderation chunk after the usage chunk);
        # streamtap keeps the one usage the provider sent
        assert turn.usage.total is None or b'"usage":null' in body[body.rindex(b'"total_tokens"'):]
    else:
        assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (
            turn.usage.input, turn.usage.output, turn.usage.total)


def test_sdk_and_streamtap_agree_on_an_in_band_error():
    body = shared_path("fixtures", "pydantic-ai/bodies/openrouter/test_openrouter_stream_error.0.sse").read_bytes()
    with pytest.raises(openai.APIError, match="Token limit reached"):
        with _client(body).chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
            for _ in stream:
                pass
    assert analyze_bytes(body, CHAT).verdict.kind is E


def _responses_sdk_cases():
    cases = [(n, None) for n, (d, k, _) in BODIES.items() if d is RESPONSES and k is C and n not in SDK_REFUSES]
    cases += [(None, n) for n, (k, _) in RESPONSES_CHUNKS.items() if k is C and n not in SDK_REFUSES]
    return cases


@pytest.mark.parametrize(("body_name", "chunks_name"), _responses_sdk_cases())
def test_responses_equal_the_sdk_stream_helper(body_name, chunks_name):
    body = _body(body_name, chunks_name, frame_responses)
    with _client(body).responses.stream(model="gpt-test", input="hi") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    turn = analyze_bytes(body, RESPONSES).turn
    assert final.output_text == turn.text()
    sdk_calls = [(o.call_id, o.name, o.arguments) for o in final.output if o.type == "function_call"]
    assert sdk_calls == [(b.id, b.name, b.arguments_raw) for b in turn.tool_calls() if "item" not in b.extra]
    # the items the app runs or answers (a shell command, an MCP approval, ...): under the id it answers with
    app_items = sdk_client_calls(final)
    assert app_items == [(b.id, b.name, b.arguments) for b in turn.tool_calls() if "item" in b.extra]
    assert final.status == turn.stop_reason_raw
    assert (turn.stop_reason == "tool_use") == bool(sdk_calls or app_items)
    # the reasoning signatures are the final response's, as the SDK keeps them
    sdk_signatures = [o.encrypted_content for o in final.output if o.type == "reasoning" and o.encrypted_content]
    ours = [b.signature for b in turn.blocks if b.kind is BlockKind.THINKING and b.signature]
    assert list(dict.fromkeys(ours)) == sdk_signatures
    if final.usage is not None:
        assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (
            turn.usage.input, turn.usage.output, turn.usage.total)
        assert final.usage.output_tokens_details.reasoning_tokens == turn.usage.reasoning


def test_session_feed_returns_events_and_times_them():
    body = shared_path("fixtures", "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse").read_bytes()
    session = StreamSession(CHAT)
    events, t = [], 0.25
    for i in range(0, len(body), 100):
        events += session.feed(body[i : i + 100], t)
        t += 0.01
    analysis = session.close()
    assert b"".join(e.raw for e in events + analysis.events) == body
    timing = analysis.turn.timing
    assert timing.first_byte == 0.25 and timing.last_byte == pytest.approx(t - 0.01)
    assert len(timing.arrivals) == len(events) + len(analysis.events)
    assert timing.arrivals == sorted(timing.arrivals)
    assert timing.first_byte <= timing.first_content <= timing.last_byte


def test_two_generations_stitched_together_are_corrupt():
    """Head of one real capture, tail of another (a retry spliced onto a cut stream): the chunk id changes."""
    a = shared_path("fixtures", "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.0.sse").read_bytes()
    b = shared_path("fixtures", "openllmetry/bodies/openai_chat_stream_parallel_tool_calls.1.sse").read_bytes()
    cut_a, cut_b = sse_spans(a)[5][1], sse_spans(b)[5][1]
    stitched = a[:cut_a] + b[cut_b:]
    verdict = analyze_bytes(stitched, CHAT).verdict
    assert verdict.kind is X and "chunk id changed" in verdict.reason
    assert verdict.seq == 6 and verdict.offset == cut_a
    assert (verdict.evidence["first_seq"], verdict.evidence["first_offset"]) == (0, 0)  # both events named
    # Azure's preamble chunk with an empty id is not a change of generation
    path = vercel("openai", "chat", "azure-model-router.1.chunks.txt")
    if path.exists():
        assert analyze_bytes(frame_chat(chunk_lines(path)), CHAT).verdict.kind is C


def test_responses_reasoning_signature_is_the_final_responses_as_the_sdk_keeps_it():
    """The encrypted reasoning is re-issued in response.completed; the SDK's final response holds that one."""
    body = shared_path("fixtures", "pydantic-ai/bodies/openai-responses/test_openai_responses_streaming_usage.0.sse").read_bytes()
    with _client(body).responses.stream(model="gpt-test", input="hi") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    sdk = [o.encrypted_content for o in final.output if o.type == "reasoning" and o.encrypted_content]
    turn = analyze_bytes(body, RESPONSES).turn
    ours = [b.signature for b in turn.blocks if b.kind is BlockKind.THINKING and b.signature]
    assert sdk and ours and set(ours) == set(sdk)
    # output_item.done carried another encryption of the same reasoning: kept as an earlier signature
    assert any(b.extra.get("earlier_signatures") for b in turn.blocks if b.kind is BlockKind.THINKING)


def _sse_events(body: bytes) -> list:
    from streamtap.wire import SSEDecoder, SSEEvent

    decoder = SSEDecoder()
    return [e for e in decoder.feed(body) + decoder.close() if isinstance(e, SSEEvent)]


def _unnumbered(body: bytes) -> bytes:
    """The same events without sequence_number, as some compatible servers send them."""
    out = []
    for event in _sse_events(body):
        obj = orjson.loads(event.data)
        obj.pop("sequence_number", None)
        out.append(b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n")
    return b"".join(out)


@pytest.mark.parametrize("fault", ["drop", "duplicate", "reorder"])
@pytest.mark.parametrize("numbered", [True, False], ids=["sequence_number", "no sequence_number"])
def test_responses_text_delta_lost_repeated_or_reordered_in_flight_is_corrupt(fault, numbered):
    """streamtap's own faults on a real capture: with sequence_number the gap or step back shows; without it,
    the deltas disagree with output_text.done and with the final response."""
    from streamtap.replay.faults import parse_faults, plan
    from streamtap.replay.source import Source

    body = shared_path("fixtures", "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.2.sse").read_bytes()
    if not numbered:
        body = _unnumbered(body)
    assert analyze_bytes(body, RESPONSES).verdict.kind is C
    events = _sse_events(body)
    objects = [orjson.loads(e.data) for e in events]
    deltas = [i for i, o in enumerate(objects) if o["type"] == "response.output_text.delta"]
    n = next(i for i in deltas if i + 1 in deltas and objects[i]["delta"] != objects[i + 1]["delta"] and objects[i]["delta"])
    source = Source.from_frames([e.raw for e in events], wire="sse", dialect="openai-responses")
    served = plan(source, parse_faults(f"{fault}:event={n}")).body
    verdict = analyze_bytes(served, RESPONSES).verdict
    assert verdict.kind is X, verdict
    if numbered:
        assert "sequence_number" in verdict.reason
    else:
        assert "the deltas disagree with response.output_text.done at block" in verdict.reason
        before = len("".join(objects[i]["delta"] for i in deltas if i < n).encode())
        assert before <= verdict.evidence["byte"] <= before + len((objects[n]["delta"] + objects[n + 1]["delta"]).encode())


def test_responses_final_snapshot_disagreeing_with_the_deltas_is_corrupt():
    """Only the final response names the text (no .done event carries it): a lost delta shows against it."""
    body = shared_path("fixtures", "pydantic-ai/bodies/bedrock-mantle/test_reused_tool_call_ids__stream.2.sse").read_bytes()
    kept = []
    for event in _sse_events(_unnumbered(body)):
        obj = orjson.loads(event.data)
        if obj["type"] in ("response.output_text.done", "response.content_part.done"):
            continue
        if obj["type"] == "response.output_item.done":
            obj["item"].pop("content", None)
        kept.append(b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n")
    assert analyze_bytes(b"".join(kept), RESPONSES).verdict.kind is C
    deltas = [i for i, raw in enumerate(kept) if b'"response.output_text.delta"' in raw]
    lost = b"".join(raw for i, raw in enumerate(kept) if i != deltas[2])
    verdict = analyze_bytes(lost, RESPONSES).verdict
    assert verdict.kind is X and "the deltas disagree with the final response at block" in verdict.reason, verdict


def test_azure_preamble_chunk_with_an_empty_model_does_not_hide_the_model():
    """Azure's first chunk has model "", object "" and no choices; the SDK skips it."""
    preamble = {"id": "", "object": "", "created": 0, "model": "", "choices": [], "prompt_filter_results": []}
    body = sse_data(preamble, chat_chunk({"role": "assistant", "content": "Hi"}, model="gpt-5-nano-2025-08-07"),
                    chat_chunk(finish="stop", model="gpt-5-nano-2025-08-07"))
    analysis = analyze_bytes(body, CHAT)
    assert analysis.turn.model == "gpt-5-nano-2025-08-07" and analysis.verdict.kind is C


def responses_events(*middle: dict, output: list) -> bytes:
    events = [{"type": "response.created", "response": {"id": "resp_r", "status": "in_progress", "output": []}},
              *middle,
              {"type": "response.completed", "response": {"id": "resp_r", "status": "completed", "output": output}}]
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps({**e, "sequence_number": n}))
                    for n, e in enumerate(events))


def test_a_responses_refusal_is_filtered_as_on_chat_completions():
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    item = {"id": "msg_r", "type": "message", "role": "assistant", "status": "completed", "content": [refusal]}
    body = responses_events(
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_r", "content_index": 0,
         "part": {"type": "refusal", "refusal": ""}},
        {"type": "response.refusal.delta", "output_index": 0, "item_id": "msg_r", "content_index": 0, "delta": refusal["refusal"]},
        {"type": "response.refusal.done", "output_index": 0, "item_id": "msg_r", "content_index": 0, "refusal": refusal["refusal"]},
        {"type": "response.content_part.done", "output_index": 0, "item_id": "msg_r", "content_index": 0, "part": refusal},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        output=[item],
    )
    analysis = analyze_bytes(body, RESPONSES)
    assert [b.kind for b in analysis.turn.blocks] == [BlockKind.REFUSAL]
    assert analysis.turn.stop_reason == "refusal" and analysis.verdict.kind is F, analysis.verdict


@pytest.mark.parametrize("arguments, parsed", [('{"x": 1e400}', {"x": float("inf")}), ('{"a": 1', None),
                                               ('{"s": "Paris \\ud83d"}', {"s": "Paris \ufffd"})])
def test_tool_arguments_the_sdks_parse_are_parsed_and_others_are_corrupt(arguments, parsed):
    """A number past a double is infinity to json.loads (what apps call on the arguments the SDK
    hands them); orjson refuses it. json.loads reads a lone surrogate escape (an emoji cut in half)
    too: no UTF-8 text can hold it, so the parsed arguments hold U+FFFD in its place, and a note says
    so, as for event JSON; ``arguments_raw`` keeps the escape."""
    call = {"tool_calls": [{"index": 0, "id": "call_A", "type": "function", "function": {"name": "f", "arguments": arguments}}]}
    body = sse_data(chat_chunk(call), chat_chunk(finish="tool_calls"))
    analysis = analyze_bytes(body, CHAT)
    assert analysis.turn.blocks[0].arguments == parsed and analysis.turn.blocks[0].arguments_raw == arguments
    assert (analysis.verdict.kind is C) == (parsed is not None), analysis.verdict
    assert any("lone surrogate" in note for note in analysis.turn.notes) == ("ud83d" in arguments)
    sdk_arguments = _run_chat_sdk(body).choices[0].message.tool_calls[0].function.arguments
    assert sdk_arguments == arguments
    if parsed is not None:
        assert json.loads(sdk_arguments).keys() == parsed.keys()  # what the app reads
    else:
        with pytest.raises(ValueError):
            json.loads(sdk_arguments)


# -- blocks the HTML rules do not dispatch, but the SDK does, with empty data ------------------

CHAT_BODY = "pydantic-ai/bodies/openai-chat/test_run_stream_sync_streams_real_model.1.sse"


@pytest.mark.parametrize("block", [b"event: x\n\n", b"retry: 10\n\n", b"data:\n\n", b"id: 1\n\n: keep-alive\n\n"],
                         ids=["event-only", "retry-only", "empty-data", "keep-alive-once-an-id-was-set"])
def test_blocks_the_sdk_dispatches_with_empty_data_are_corrupt(block: bytes) -> None:
    """The openai SDK dispatches these with data "" and fails to parse it as JSON: the app sees a
    JSON error, so the verdict is not complete, however the bytes are read."""
    body = shared_path("fixtures", CHAT_BODY).read_bytes()
    cut = body.index(b"data: ", len(body) // 2)
    body = body[:cut] + block + body[cut:]
    with pytest.raises(ValueError):  # json.JSONDecodeError
        with _client(body).chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
            for _ in stream:
                pass
    verdicts = [analyze_bytes(body, CHAT, chunk_size=size).verdict for size in (None, 1, 5)]
    session = StreamSession(CHAT)
    session.feed_reads([body[:cut - 3], body[cut - 3 : cut + 2], body[cut + 2 :]], [1.0, 2.0, 3.0])
    verdicts.append(session.close().verdict)
    for verdict in verdicts:
        assert verdict.kind is X, verdict
        assert "openai SDK" in verdict.reason and cut <= verdict.offset < cut + len(block)


def test_a_data_less_block_after_done_is_still_after_the_response() -> None:
    body = shared_path("fixtures", CHAT_BODY).read_bytes()
    assert analyze_bytes(body, CHAT).verdict.kind is C
    verdict = analyze_bytes(body + b"event: x\n\n", CHAT).verdict
    assert verdict.kind is X and "after the response was closed by data: [DONE]" in verdict.reason


# -- what the SDK stops at, or fails on -----------------------------------------------------------


def frame_responses_text() -> bytes:
    return openai_responses(["Hel", "lo"])


def _run_responses_sdk(body: bytes):
    with _client(body).responses.stream(model="m", input="hi") as stream:
        for _ in stream:
            pass
        return stream.get_final_response()


def test_responses_done_after_completed_is_the_transports_end() -> None:
    body = frame_responses_text() + b"data: [DONE]\n\n"
    assert _run_responses_sdk(body).output_text == "Hello"
    assert analyze_bytes(body, RESPONSES).verdict.kind is C


def test_responses_done_before_completed_ends_the_stream_for_the_sdk() -> None:
    body = frame_responses_text()
    cut = body.index(b"event: response.completed")
    early = body[:cut] + b"data: [DONE]\n\n" + body[cut:]
    with pytest.raises(RuntimeError, match="response.completed"):
        _run_responses_sdk(early)
    verdict = analyze_bytes(early, RESPONSES).verdict
    assert verdict.kind is X and "closed by data: [DONE]" in verdict.reason, verdict
    assert analyze_bytes(body[:cut] + b"data: [DONE]\n\n", RESPONSES).verdict.kind is T


def _chat(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(delta: dict, finish: str | None = None, index=0) -> dict:
    return {**CHUNK, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def _run_chat_sdk(body: bytes):
    with _client(body).chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def test_chat_done_with_a_leading_space_is_data_the_sdk_fails_to_parse() -> None:
    body = _chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({}, "stop")).replace(
        b"data: [DONE]", b"data:  [DONE]")
    with pytest.raises(ValueError):
        _run_chat_sdk(body)
    assert analyze_bytes(body, CHAT).verdict.kind is X


def test_chat_choice_index_null_is_corrupt_as_the_sdk_fails_on_it() -> None:
    body = _chat(_chunk({"role": "assistant", "content": "Hi"}, index=None), _chunk({}, "stop"))
    with pytest.raises(TypeError):
        _run_chat_sdk(body)
    verdict = analyze_bytes(body, CHAT).verdict
    assert verdict.kind is X and "index null" in verdict.reason, verdict


def test_chat_tool_call_without_its_opening_chunk_is_corrupt() -> None:
    """OpenAI opens every call with one fragment holding its id and name; a call whose fragments
    begin without a name lost that chunk, and the app has no function to call."""
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    arguments = {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}
    whole = _chat(_chunk({"role": "assistant"}), _chunk({"tool_calls": [opening]}), _chunk({"tool_calls": [arguments]}),
                  _chunk({}, "tool_calls"))
    assert analyze_bytes(whole, CHAT).verdict.kind is C
    lost = _chat(_chunk({"role": "assistant"}), _chunk({"tool_calls": [arguments]}), _chunk({}, "tool_calls"))
    assert _run_chat_sdk(lost).choices[0].message.tool_calls[0].function.name in (None, "")
    verdict = analyze_bytes(lost, CHAT).verdict
    assert verdict.kind is X and "without a function name" in verdict.reason, verdict


def test_chat_tool_call_name_in_two_fragments_is_joined_as_the_sdk_joins_it() -> None:
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_", "arguments": ""}}
    rest = {"index": 0, "function": {"name": "weather", "arguments": "{}"}}
    body = _chat(_chunk({"role": "assistant"}), _chunk({"tool_calls": [opening]}), _chunk({"tool_calls": [rest]}),
                 _chunk({}, "tool_calls"))
    sdk_call = _run_chat_sdk(body).choices[0].message.tool_calls[0]
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C
    assert analysis.turn.tool_calls()[0].name == sdk_call.function.name == "get_weather"


def _repeated(**again) -> bytes:
    """A call whose later fragment sends ``again`` (its id, its name) a second time."""
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    arguments = {"index": 0, **{k: v for k, v in again.items() if k == "id"},
                 "function": {"arguments": "{}", **{k: v for k, v in again.items() if k == "name"}}}
    return _chat(_chunk({"role": "assistant"}), _chunk({"tool_calls": [opening]}), _chunk({"tool_calls": [arguments]}),
                 _chunk({}, "tool_calls"))


@pytest.mark.parametrize("again", [{"name": "get_weather"}, {"id": "call_1", "name": "get_weather"}],
                         ids=["name", "id and name"])
def test_chat_tool_call_name_repeated_on_a_later_fragment_is_corrupt_for_the_name_the_sdk_joins(again) -> None:
    """vLLM-style servers (Fireworks) and the LiteLLM proxy repeat the name on every fragment, as a
    chunk sent twice does: the turn keeps the call, but the openai SDK joins every name fragment, so
    the app's call names a tool the stream never called (and its arguments, whole, go to it)."""
    body = _repeated(**again)
    sdk_call = _run_chat_sdk(body).choices[0].message.tool_calls[0]
    assert sdk_call.function.name == "get_weatherget_weather"
    analysis = analyze_bytes(body, CHAT)
    assert [(c.id, c.name, c.arguments) for c in analysis.turn.tool_calls()] == [("call_1", "get_weather", {})]
    assert analysis.verdict.kind is X, analysis.verdict
    assert "get_weatherget_weather" in analysis.verdict.reason


def test_chat_tool_call_id_repeated_on_a_later_fragment_keeps_the_call_and_says_what_the_sdk_makes_of_it() -> None:
    """An id repeated alone leaves the app's call whole: the openai SDK joins the id (call_1call_1),
    and the app answers under, and sends back, that id; the tool and its arguments are the stream's."""
    body = _repeated(id="call_1")
    sdk_call = _run_chat_sdk(body).choices[0].message.tool_calls[0]
    assert (sdk_call.id, sdk_call.function.name, sdk_call.function.arguments) == ("call_1call_1", "get_weather", "{}")
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert [(c.id, c.name, c.arguments) for c in analysis.turn.tool_calls()] == [("call_1", "get_weather", {})]
    assert any("repeated on later fragments" in note and "the openai SDK joins" in note for note in analysis.turn.notes)


def test_chat_tool_call_name_given_again_with_the_id_is_joined_as_the_sdk_joins_it() -> None:
    """A later fragment that repeats the id and brings another name: the SDK joins the name, and so
    does the turn (only a name sent again whole is the repeat that is corrupt)."""
    body = _repeated(id="call_1", name="_now")
    sdk_call = _run_chat_sdk(body).choices[0].message.tool_calls[0]
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert analysis.turn.tool_calls()[0].name == sdk_call.function.name == "get_weather_now"


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_a_data_less_block_is_judged_where_it_came_whatever_the_line_ends(line_end: bytes) -> None:
    """With CR line ends the last event is dispatched only at close (its CR could start a CRLF);
    the block before it must still be judged before it, not after [DONE]."""
    body = _chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({}, "stop"))
    body = body.replace(b"data: [DONE]", b"retry: 3000\n\ndata: [DONE]").replace(b"\n", line_end)
    for size in (None, 1):
        verdict = analyze_bytes(body, CHAT, chunk_size=size).verdict
        assert verdict.kind is X and "has no data line" in verdict.reason, (size, verdict)


def test_an_error_block_without_data_counts_after_any_number_of_others() -> None:
    """Every block without data is judged, not only the first few: an ``event: error`` after 100
    others is the same error as after one, however the bytes are read."""
    head = _chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({}, "stop"))
    cut = head.index(b"data: ", 1)

    def verdicts(before: bytes) -> list:
        body = head[:cut] + before + b"event: error\n\n" + head[cut:]
        found = [analyze_bytes(body, CHAT, chunk_size=size).verdict for size in (None, 1, 7)]
        session = StreamSession(CHAT)
        session.feed_reads([body[:cut + 3], body[cut + 3 :]], [1.0, 2.0])
        found.append(session.close().verdict)
        return [(verdict.kind, verdict.offset - len(before), verdict.reason) for verdict in found]

    one = verdicts(b"event: ping\n\n")
    assert one[0][0] is E and len(set(one)) == 1, one
    many = b"event: ping\n\n" * 100
    assert verdicts(many) == one


def test_chat_tool_call_name_fragments_are_kept_within_a_bound() -> None:
    opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    more = {"index": 0, "function": {"name": "n" * 100, "arguments": ""}}
    body = _chat(_chunk({"role": "assistant"}), _chunk({"tool_calls": [opening]}),
                 *(_chunk({"tool_calls": [more]}) for _ in range(5)), _chunk({}, "tool_calls"))
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is X and "longer than 256" in analysis.verdict.reason, analysis.verdict
    assert len(analysis.turn.tool_calls()[0].name) <= 256


def test_a_finish_reason_that_came_is_the_turns_stop_reason_though_done_did_not():
    """The SDK hands the app each chunk's finish_reason: without [DONE] the turn is truncated, and
    its stop reason is still the one that came (it was left null, though the verdict named it)."""
    body = sse_data(chat_chunk({"role": "assistant", "content": "Hi"}), chat_chunk(finish="length"), done=False)
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is T and analysis.verdict.evidence["content_complete"] is True
    assert (analysis.turn.stop_reason_raw, analysis.turn.stop_reason) == ("length", "max_tokens")
    cut = analyze_bytes(sse_data(chat_chunk({"role": "assistant", "content": "Hi"}), done=False), CHAT)
    assert cut.verdict.kind is T and cut.turn.stop_reason is None


def test_a_lone_surrogate_escape_the_sdk_reads_is_not_corrupt_and_reads_alike_however_chunked():
    """A server that splits an emoji's UTF-16 pair across chunks sends each half as a lone escape;
    the SDK's json module reads both, so the answer arrived. The turn holds U+FFFD for each half."""
    halves = [chat_chunk({"role": "assistant", "content": ""})]
    body = sse_data(*halves, done=False) + b'data: {"id":"chatcmpl-c","object":"chat.completion.chunk","created":1,"model":"gpt-test",' \
        b'"choices":[{"index":0,"delta":{"content":"\\ud83d"},"finish_reason":null}]}\n\n' \
        + sse_data(chat_chunk({"content": "ok"}), chat_chunk(finish="stop"))
    stream = _client(body).chat.completions.create(model="gpt-test", messages=[], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "\ud83dok"
    for size in (None, 1, 7):
        analysis = analyze_bytes(body, CHAT, chunk_size=size)
        assert analysis.verdict.kind is C, analysis.verdict
        assert analysis.turn.text() == "\ufffdok" and any("lone surrogate" in n for n in analysis.turn.notes)
    responses = responses_stream(*message_events(["a"])).replace(b'"delta":"a"', b'"delta":"\\udc00"')
    assert "lone surrogate" in " ".join(analyze_bytes(responses, RESPONSES).turn.notes)
    gemini = b'data: {"candidates":[{"content":{"parts":[{"text":"\\ud83d"}],"role":"model"},"finishReason":"STOP"}]}\r\n\r\n'
    assert analyze_bytes(gemini, Dialect.GEMINI).verdict.kind is C  # google-genai reads it with json.loads too


# -- tool arguments of only JSON whitespace: no JSON value, not "no arguments" ---------------------

@pytest.mark.parametrize("whitespace", [" ", "\n", "\t\r\n "], ids=["space", "LF", "mixed"])
def test_chat_tool_arguments_of_only_json_whitespace_are_corrupt_as_json_loads_refuses_them(whitespace):
    """The SDK hands the arguments over as a string; an app skips empty ones (no parameters) and
    calls json.loads on the rest, which refuses whitespace alone."""
    def body(arguments: str) -> bytes:
        opening = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "now", "arguments": ""}}
        return _chat(_chunk({"role": "assistant", "tool_calls": [opening]}),
                     _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}), _chunk({}, "tool_calls"))

    sdk_arguments = _run_chat_sdk(body(whitespace)).choices[0].message.tool_calls[0].function.arguments
    assert sdk_arguments == whitespace
    with pytest.raises(ValueError):
        json.loads(sdk_arguments)
    analysis = analyze_bytes(body(whitespace), CHAT)
    assert analysis.verdict.kind is X and "invalid argument JSON" in analysis.verdict.reason, analysis.verdict
    assert (analysis.turn.blocks[0].arguments, analysis.turn.blocks[0].arguments_raw) == (None, whitespace)
    empty = analyze_bytes(body(""), CHAT)  # no fragment at all: a tool without parameters
    assert empty.verdict.kind is C and empty.turn.blocks[0].arguments == {}


@pytest.mark.parametrize("whitespace", [" ", "\n"], ids=["space", "LF"])
def test_responses_tool_arguments_of_only_json_whitespace_are_corrupt_as_json_loads_refuses_them(whitespace):
    added = {"id": "fc_1", "type": "function_call", "status": "in_progress", "call_id": "call_1", "name": "now",
             "arguments": ""}
    done = {**added, "status": "completed", "arguments": whitespace}
    body = responses_events(
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0, "delta": whitespace},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 0, "arguments": whitespace},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        output=[done])
    sdk_arguments = _run_responses_sdk(body).output[0].arguments
    assert sdk_arguments == whitespace
    with pytest.raises(ValueError):
        json.loads(sdk_arguments)
    verdict = analyze_bytes(body, RESPONSES).verdict
    assert verdict.kind is X and "invalid argument JSON" in verdict.reason, verdict


# -- a UTF-8 BOM at byte 0: the SSE rules drop it, the openai SDK keeps it --------------------------

BOM = b"\xef\xbb\xbf"


def test_a_bom_before_the_first_chunks_data_line_loses_that_chunk_in_the_sdk() -> None:
    """The SDK reads the first line's field as '\\ufeffdata', which it ignores: the first chunk (here
    the role and the first words) never reaches the app."""
    body = _chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({"content": " there"}), _chunk({}, "stop"))
    assert _run_chat_sdk(body).choices[0].message.content == "Hi there"
    assert _run_chat_sdk(BOM + body).choices[0].message.content == " there"
    for size in (None, 1, 2, 5):
        verdict = analyze_bytes(BOM + body, CHAT, chunk_size=size).verdict
        assert verdict.kind is X and "BOM" in verdict.reason and (verdict.seq, verdict.offset) == (0, 0), (size, verdict)
    # before a comment the BOM costs the SDK nothing
    kept = BOM + b": keep-alive\n\n" + body
    assert _run_chat_sdk(kept).choices[0].message.content == "Hi there"
    assert analyze_bytes(kept, CHAT).verdict.kind is C


def test_a_bom_before_the_first_events_data_line_loses_response_created_but_not_before_its_event_line() -> None:
    """The SDK parses every event's data whatever its name: a BOM that hides the event line costs
    nothing, one that hides the data line loses response.created, and the SDK's stream helper fails."""
    body = frame_responses_text()
    assert body.startswith(b"event: response.created\n")
    assert _run_responses_sdk(BOM + body).output_text == "Hello"
    assert analyze_bytes(BOM + body, RESPONSES).verdict.kind is C
    data_first = BOM + body[len(b"event: response.created\n"):]
    with pytest.raises(RuntimeError, match="response.created"):
        _run_responses_sdk(data_first)
    for size in (None, 1, 4):
        verdict = analyze_bytes(data_first, RESPONSES, chunk_size=size).verdict
        assert verdict.kind is X and "BOM" in verdict.reason and (verdict.seq, verdict.offset) == (0, 0), (size, verdict)
