"""An answer whose end signal arrived in an HTTP body that was then cut before its end (a reset
before the chunked terminator, a Content-Length not reached, or the proxy's own end).

The anthropic SDK, boto3, google-genai, the ollama client and the openai SDK for Responses read the
body to its end, so they raise on the cut (APIConnectionError, ProtocolError, ...): the app gets an
exception, not the answer, and the turn is `truncated` with `content_complete` in the evidence.
The openai SDK stops reading Chat Completions at `[DONE]` and closes the response, so a cut after it
never reaches the app: that turn keeps its word, with a note.

A client that went away after the end signal, before the body ended, is the same case seen from
the other side: where its SDK reads on to the body's end, it left waiting (a timeout) or broke
out of its loop, and the answer is `unknown`."""

from __future__ import annotations

import orjson
import pytest
from provider_streams import (
    anthropic, bedrock_converse, bedrock_invoke, frame_gemini_array, frame_gemini_sse, openai_chat, openai_responses,
)

from streamtap.providers import Dialect, StreamEnd, VerdictKind, analyze_bytes

C, T, L, F, E = (VerdictKind.COMPLETE, VerdictKind.TRUNCATED, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED,
                 VerdictKind.ERRORED)
CUT_ENDS = (StreamEnd.UPSTREAM_RESET, StreamEnd.PROXY_ENDED)

GEMINI_TEXT = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Once upon a time"}]}, "index": 0}]}


def _gemini_last(reason: str) -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": reason, "index": 0}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 9, "totalTokenCount": 13}}


def _ollama(done_reason: str) -> bytes:
    lines = [{"model": "llama3.2", "created_at": "t", "response": "The sky", "done": False},
             {"model": "llama3.2", "created_at": "t", "response": " is blue.", "done": True, "done_reason": done_reason,
              "prompt_eval_count": 26, "eval_count": 290}]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


WHOLE = {  # (dialect, wire, body) of answers that end properly, judged complete on a clean end
    "anthropic": (Dialect.ANTHROPIC, None, anthropic("hmm", "Let me check.", {"city": "Paris"})),
    "bedrock-invoke": (Dialect.BEDROCK_INVOKE, None, bedrock_invoke("hmm", "Let me check.", {"city": "Paris"})),
    "bedrock-converse": (Dialect.BEDROCK_CONVERSE, None, bedrock_converse(["Let me ", "check."], {"city": "Paris"})),
    "openai-responses": (Dialect.OPENAI_RESPONSES, None, openai_responses(["Hello", " there."])),
    "gemini-sse": (Dialect.GEMINI, "sse", frame_gemini_sse([orjson.dumps(GEMINI_TEXT), orjson.dumps(_gemini_last("STOP"))])),
    "gemini-json-array": (Dialect.GEMINI, "json-array",
                          frame_gemini_array([orjson.dumps(GEMINI_TEXT), orjson.dumps(_gemini_last("STOP"))])),
    "ollama": (Dialect.OLLAMA, None, _ollama("stop")),
}


@pytest.mark.parametrize("name", WHOLE)
@pytest.mark.parametrize("end", CUT_ENDS, ids=str)
def test_an_answer_that_ended_in_a_body_cut_before_its_end_is_truncated(name, end):
    dialect, wire, body = WHOLE[name]
    clean = analyze_bytes(body, dialect, wire=wire, one_response=True)
    assert clean.verdict.kind is C, clean.verdict
    cut = analyze_bytes(body, dialect, wire=wire, end=end, one_response=True)
    verdict = cut.verdict
    assert verdict.kind is T, verdict
    assert verdict.evidence["content_complete"] is True
    assert verdict.evidence["was"] == "complete" and verdict.evidence["end"] == end.value
    assert "the HTTP body was cut before its end" in verdict.reason and "raises" in verdict.reason
    assert clean.verdict.reason in verdict.reason  # what the events said is kept
    assert verdict.offset == len(body)  # where the bytes stopped
    # not the provider's fault when the proxy ended it; a reset is not said to be either way
    assert verdict.evidence.get("provider_fault") is (False if end is StreamEnd.PROXY_ENDED else None)
    # the turn is what the events gave (the stop reason the SDK would have handed over, had it not raised)
    assert cut.turn.to_dict() == clean.turn.to_dict()


@pytest.mark.parametrize("name", WHOLE)
def test_a_client_that_went_away_after_the_end_signal_before_the_body_ended_is_unknown(name):
    """These SDKs read on after the end signal, to the body's end: a client that left before it
    gave up waiting (a read timeout raised in the app), or broke out of its loop at the end
    signal (the whole answer in hand). The proxy cannot tell which."""
    dialect, wire, body = WHOLE[name]
    clean = analyze_bytes(body, dialect, wire=wire, one_response=True).verdict
    left = analyze_bytes(body, dialect, wire=wire, end=StreamEnd.CLIENT_ABORTED, one_response=True).verdict
    assert clean.kind is C and left.kind is VerdictKind.UNKNOWN, left
    assert left.evidence["was"] == "complete" and left.evidence["left_before_body_end"] is True
    assert "the client went away before the HTTP body ended" in left.reason and clean.reason in left.reason


def test_a_chat_completions_client_that_went_away_after_done_got_the_answer():
    """The openai SDK closes the response itself at [DONE]: leaving is what it does."""
    body = openai_chat(["Hello", " there."])
    assert analyze_bytes(body, Dialect.OPENAI_CHAT, end=StreamEnd.CLIENT_ABORTED).verdict.kind is C
    limited = analyze_bytes(openai_chat(["Hel"], finish="length"), Dialect.OPENAI_CHAT, end=StreamEnd.CLIENT_ABORTED)
    assert limited.verdict.kind is L


def test_the_same_verdict_for_any_chunking():
    body = anthropic("hmm", "Let me check.", {"city": "Paris"})
    whole = analyze_bytes(body, Dialect.ANTHROPIC, end=StreamEnd.UPSTREAM_RESET)
    for size in (1, 7, 64):
        split = analyze_bytes(body, Dialect.ANTHROPIC, end=StreamEnd.UPSTREAM_RESET, chunk_size=size)
        assert split.verdict.to_dict() == whole.verdict.to_dict()


@pytest.mark.parametrize("end", CUT_ENDS, ids=str)
def test_chat_completions_cut_after_done_stays_complete_with_a_note(end):
    """The openai SDK breaks at [DONE] and closes the response: the app has the whole answer."""
    body = openai_chat(["Hello", " there."])
    verdict = analyze_bytes(body, Dialect.OPENAI_CHAT, end=end).verdict
    assert verdict.kind is C, verdict
    assert verdict.evidence["body_cut_after_end_signal"] is True and verdict.evidence["end"] == end.value
    assert "the HTTP body was cut after data: [DONE], where the SDK stops reading" in verdict.reason
    limited = analyze_bytes(openai_chat(["Hel"], finish="length"), Dialect.OPENAI_CHAT, end=end).verdict
    assert limited.kind is L and limited.evidence["body_cut_after_end_signal"] is True


@pytest.mark.parametrize("end", (StreamEnd.FINISHED, *CUT_ENDS), ids=str)
@pytest.mark.parametrize("one_response", [False, True])
def test_chat_completions_cut_inside_a_comment_after_done_stays_complete(end, one_response):
    """A keep-alive comment after [DONE], whole or cut, never reaches the app: the SDK stopped at
    [DONE]. Data after it is still judged (an event begun there is another answer's)."""
    body = openai_chat(["Hello", " there."])
    whole = analyze_bytes(body + b": keep-alive\n\n", Dialect.OPENAI_CHAT, end=end, one_response=one_response).verdict
    for chunk_size in (None, 1):
        cut = analyze_bytes(body + b": keep-al", Dialect.OPENAI_CHAT, end=end, one_response=one_response,
                            chunk_size=chunk_size).verdict
        assert cut.kind is whole.kind is C, cut
        assert cut.evidence["comment_cut_after_end_signal"] == 9 and "where the SDK had stopped reading" in cut.reason
    event_begun = analyze_bytes(body + b"data: {", Dialect.OPENAI_CHAT, end=end, one_response=one_response).verdict
    assert event_begun.kind in (T, VerdictKind.CORRUPT), event_begun
    anthropic_body = WHOLE["anthropic"][2] + b": keep-al"  # the anthropic SDK reads to the end of the body
    assert analyze_bytes(anthropic_body, Dialect.ANTHROPIC, end=end).verdict.kind is T


def test_chat_completions_without_done_is_truncated_as_before():
    verdict = analyze_bytes(openai_chat(["Hello"], done=False), Dialect.OPENAI_CHAT, end=StreamEnd.UPSTREAM_RESET).verdict
    assert verdict.kind is T and verdict.evidence["content_complete"] is True
    assert "body_cut_after_end_signal" not in verdict.evidence and "was" not in verdict.evidence


@pytest.mark.parametrize(("reason", "was"), [("MAX_TOKENS", L), ("SAFETY", F)])
def test_a_limit_or_a_filter_in_a_cut_body_is_truncated_too(reason, was):
    """The SDK raises before the app sees the stop reason, as for a finished answer."""
    body = frame_gemini_sse([orjson.dumps(GEMINI_TEXT), orjson.dumps(_gemini_last(reason))])
    assert analyze_bytes(body, Dialect.GEMINI).verdict.kind is was
    verdict = analyze_bytes(body, Dialect.GEMINI, end=StreamEnd.UPSTREAM_RESET).verdict
    assert verdict.kind is T and verdict.evidence["was"] == was.value and verdict.evidence["content_complete"] is True
    limited = analyze_bytes(_ollama("length"), Dialect.OLLAMA, end=StreamEnd.PROXY_ENDED).verdict
    assert limited.kind is T and limited.evidence["was"] == L.value and limited.evidence["provider_fault"] is False


def test_the_providers_own_error_keeps_its_word_in_a_cut_body():
    """The SDK raises the provider's error at its event, before it reads to the cut."""
    body = frame_gemini_sse([orjson.dumps(GEMINI_TEXT),
                             orjson.dumps({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}})])
    verdict = analyze_bytes(body, Dialect.GEMINI, end=StreamEnd.UPSTREAM_RESET).verdict
    assert verdict.kind is E and "overloaded" in verdict.reason


@pytest.mark.parametrize("end", CUT_ENDS)
def test_responses_from_a_server_that_sends_done_stays_complete_when_cut_after_it(end):
    """OpenAI sends no [DONE] for Responses, some compatible servers do: the openai SDK stops there too."""
    body = openai_responses(["Hello", " there."])
    assert analyze_bytes(body, Dialect.OPENAI_RESPONSES, end=end).verdict.kind is T
    verdict = analyze_bytes(body + b"data: [DONE]\n\n", Dialect.OPENAI_RESPONSES, end=end).verdict
    assert verdict.kind is C and verdict.evidence["body_cut_after_end_signal"] is True, verdict
