"""A response cut and then replayed from its start in the same body (a naive resume or retry)
must never be complete: the app got its text, thinking or tool calls twice.

Chat Completions servers that name the role on every chunk, or put content in the role chunk,
and Gemini, whose chunks repeat the same responseId, give no second-generation signal of their
own; the replay brings back the chunks the body began with, byte for byte and in order (in Chat
Completions the first three, from the third chunk on: a server whose chunks carry nothing that
changes sends a refrain's chunks again byte for byte, so an earlier repeat proves nothing). A cut
inside the next event's field name fuses with the replay's first line into a line of a field no
provider sends, which the SDK skips."""

from __future__ import annotations

import orjson
import pytest
from conftest import shared_path

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import SSEDecoder

BODIES = "fixtures", "pydantic-ai", "bodies"
ENDED = (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED)


def event_ends(body: bytes) -> list[int]:
    return [event.end for event in SSEDecoder().feed(body)]


@pytest.mark.parametrize(("dialect", "parts"), [
    (Dialect.GEMINI, ("google", "test_google_streaming_tool_call_thought_signature.0.sse")),
    (Dialect.GEMINI, ("google", "test_google_model_stream.0.sse")),
    (Dialect.OPENAI_CHAT, ("openrouter", "test_openrouter_streaming_reasoning.0.sse")),
    (Dialect.OPENAI_CHAT, ("openai-chat", "test_run_stream_sync_streams_real_model.1.sse")),
], ids=lambda value: value[-1] if isinstance(value, tuple) else value.value)
def test_a_real_body_replayed_after_a_cut_at_any_event_boundary_is_not_complete(dialect, parts):
    body = shared_path(*BODIES, *parts).read_bytes()
    whole = analyze_bytes(body, dialect)
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict  # the control
    for cut in event_ends(body)[:-1]:
        stitched = analyze_bytes(body[:cut] + body, dialect)
        if stitched.turn.blocks == whole.turn.blocks:
            continue  # nothing of the answer came before the cut: the app's turn is whole
        assert stitched.verdict.kind not in ENDED, (cut, stitched.verdict)


def test_a_cut_inside_the_next_field_name_fused_with_the_replay_is_not_complete():
    """The cut leaves "d" of the next "data:", and the replay's first line joins it: "ddata: ...",
    which the SSE rules skip, so the replay's role chunk is never seen."""
    body = shared_path(*BODIES, "openai-chat", "test_run_stream_sync_streams_real_model.1.sse").read_bytes()
    told_by_the_field = 0
    for cut in event_ends(body)[1:-1]:
        fused = body[: cut + 1] + body
        assert fused[cut:].startswith(b"ddata: ")
        verdict = analyze_bytes(fused, Dialect.OPENAI_CHAT).verdict
        assert verdict.kind not in ENDED, (cut, verdict)
        if verdict.kind is VerdictKind.UNKNOWN:  # (after the finish chunk, content again is corrupt)
            assert "field 'ddata'" in verdict.reason and verdict.offset == cut, verdict
            told_by_the_field += 1
        for size in (1, 7, 64):  # the wire finding holds for any chunking
            assert analyze_bytes(fused, Dialect.OPENAI_CHAT, chunk_size=size).verdict == verdict
    assert told_by_the_field >= 5


def chat_chunk(content: str, **extra) -> bytes:
    return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "sonar",
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, **extra}]})


def sse(chunks: list[bytes]) -> bytes:
    return b"".join(b"data: " + chunk + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def test_a_server_that_names_the_role_on_every_chunk_is_judged_by_whole_runs_of_its_first_chunks():
    answer = [chat_chunk("The"), chat_chunk(" answer"), chat_chunk(" is The"), chat_chunk(".", finish_reason="stop")]
    assert analyze_bytes(sse(answer), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    # a token that recurs, or an empty chunk sent many times, is no replay
    recurring = [chat_chunk(""), chat_chunk("The"), chat_chunk(""), chat_chunk(""), chat_chunk("The"),
                 chat_chunk(".", finish_reason="stop")]
    assert analyze_bytes(sse(recurring), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    # a refrain from the very start, as Ollama's /v1 sends it (the role on every chunk, the time in
    # whole seconds): its chunks come again byte for byte, and it is no replay
    refrain = [chat_chunk(text) for text in ("Hello", "\n", "Hello", "\n", "Hello")] + [chat_chunk("", finish_reason="stop")]
    assert analyze_bytes(sse(refrain), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    # from the third chunk on, the first three (all different) coming back in a row are the start again
    verdict = analyze_bytes(sse(answer[:3] + answer), Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "come again, byte for byte" in verdict.reason, verdict
    assert verdict.seq == 3


def test_a_completion_token_count_that_falls_is_a_second_generation():
    """Perplexity counts the generation on every chunk: a replay's count starts over."""
    counted = [chat_chunk(text, usage=None) for text in ("The", " answer", ".")]
    counted = [orjson.dumps({**orjson.loads(chunk), "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
               for n, chunk in enumerate(counted, 1)]
    last = orjson.loads(counted[-1])
    last["choices"][0]["finish_reason"] = "stop"
    counted[-1] = orjson.dumps(last)
    assert analyze_bytes(sse(counted), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    retried = [counted[1].replace(b"answer", b"reply")] + counted  # a different first token: no byte-equal start
    verdict = analyze_bytes(sse(retried), Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "completion_tokens falls from 2" in verdict.reason and verdict.seq == 1, verdict


def test_vllm_counts_each_choice_on_its_own_chunks():
    """With n=2 and continuous usage, vLLM's chunk for choice 1 carries choice 1's count, lower than
    choice 0's before it: no second generation."""
    def counted(index: int, text: str, n: int, finish: str | None = None) -> bytes:
        return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                             "choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
    chunks = [counted(0, "A", 1), counted(0, "B", 2), counted(1, "C", 1), counted(1, "D", 2, "stop"), counted(0, "", 3, "stop")]
    chunks.append(orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}))
    assert analyze_bytes(sse(chunks), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    falls = chunks[:2] + [counted(0, "A", 1)]  # choice 0 counting again from 1
    verdict = analyze_bytes(sse(falls), Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "completion_tokens falls" in verdict.reason, verdict


def test_an_sse_error_line_is_the_servers_error():
    """Old llama.cpp servers write their error as an `error:` field, which the SDK skips: the answer
    just stops for the app, but the server said it failed."""
    body = (b"data: " + chat_chunk("Hi") + b"\n\n"
            + b'error: {"code":500,"message":"context shift is disabled","type":"server_error"}\n\ndata: [DONE]\n\n')
    analysis = analyze_bytes(body, Dialect.OPENAI_CHAT)
    assert analysis.verdict.kind is VerdictKind.ERRORED and "context shift is disabled" in analysis.verdict.reason, analysis.verdict
    assert analysis.turn.error["message"] == "context shift is disabled"


def test_a_doubt_leaves_a_cut_stream_truncated():
    answer = [chat_chunk("The"), chat_chunk(" answer"), chat_chunk(".", finish_reason="stop")]
    cut = b"".join(b"data: " + chunk + b"\n\n" for chunk in answer[:1] + answer[:2])
    verdict = analyze_bytes(cut, Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.TRUNCATED, verdict
