"""A stream cut inside a keep-alive comment and replayed from its first event: the replay's first
line joins the comment line ("': OPENROUTER PROCdata: {...}"), which the SSE rules and the SDK skip,
so the replay's first chunk is lost and nothing else shows the restart. The app gets the answer
twice: never complete."""

from __future__ import annotations

from conftest import shared_path

from streamtap.providers import Dialect, VerdictKind, analyze_bytes

ENDED = (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED)
COMMENT = b": OPENROUTER PROCESSING\n"


def test_a_real_body_cut_inside_a_comment_and_replayed_is_not_complete():
    body = shared_path("fixtures", "pydantic-ai", "bodies", "openrouter",
                       "test_openrouter_streaming_reasoning.0.sse").read_bytes()
    whole = analyze_bytes(body, Dialect.OPENAI_CHAT)
    assert whole.verdict.kind is VerdictKind.COMPLETE, whole.verdict  # the control: its comments are no doubt
    replay = body[body.index(b"data: "):]
    comments = [at for at in range(body.index(b"data: "), len(body)) if body.startswith(COMMENT, at)]
    assert len(comments) == 2  # OpenRouter waited twice after the answer began
    for comment in comments:
        for cut in range(comment + 1, comment + len(COMMENT)):  # the replay's "data:" joins the comment line
            stitched = body[:cut] + replay
            verdict = analyze_bytes(stitched, Dialect.OPENAI_CHAT).verdict
            assert verdict.kind is VerdictKind.UNKNOWN, (cut, verdict)
            assert "comment line holds a 'data' field" in verdict.reason and verdict.offset == cut, verdict
            for size in (1, 7, 64):  # for any chunking
                assert analyze_bytes(stitched, Dialect.OPENAI_CHAT, chunk_size=size).verdict == verdict

