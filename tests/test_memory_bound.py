"""What one turn keeps in memory: text and tool-call arguments up to a cap, the verdict unchanged.

The caps are StreamSession parameters (the proxy uses TEXT_CAP and ARGUMENTS_CAP); small caps
here exercise the same mechanism a 4 MiB text cap does on a long answer."""

from __future__ import annotations

import json
import tracemalloc

import pytest

import provider_streams as ps

from streamtap.providers import BlockKind, StreamEnd, StreamSession, VerdictKind
from streamtap.providers.judge import ARGUMENTS_CAP, TEXT_CAP

PIECES = ["abcdefghij" * 10] * 30  # 3000 characters of text in 30 events


def judge(body: bytes, dialect: str, end: StreamEnd = StreamEnd.FINISHED, **caps):
    session = StreamSession(dialect, keep_arrivals=False, **caps)
    session.feed(body)
    return session.close(end)


def text_blocks(turn):
    return [b for b in turn.blocks if b.kind is BlockKind.TEXT]


@pytest.mark.parametrize("dialect, body", [
    ("openai-chat", ps.openai_chat(PIECES)),
    ("openai-responses", ps.openai_responses(PIECES)),
    ("bedrock-converse", ps.bedrock_converse(PIECES, {"city": "Oslo"})),
    ("anthropic", ps.anthropic("", "".join(PIECES), {"city": "Oslo"})),
])
def test_text_beyond_the_cap_is_counted_not_kept_and_the_verdict_holds(dialect, body):
    analysis = judge(body, dialect, text_cap=1000)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict.reason
    block = text_blocks(analysis.turn)[0]
    assert block.text == "".join(PIECES)[:1000]
    assert block.extra["text_dropped_chars"] == 2000
    assert any("text beyond 1000 characters not kept in memory" in n and "recording holds every byte" in n
               for n in analysis.turn.notes)
    whole = judge(body, dialect, text_cap=None)
    assert text_blocks(whole.turn)[0].text == "".join(PIECES) and "text_dropped_chars" not in text_blocks(whole.turn)[0].extra


def test_the_text_cap_is_per_turn_across_blocks():
    events = ps.anthropic_events("t" * 600, "x" * 600, {"city": "Oslo"})
    body = b"".join(ps._sse(e["type"], e) for e in events)
    turn = judge(body, "anthropic", text_cap=1000).turn
    thinking, text = turn.blocks[0], turn.blocks[1]
    assert (thinking.text, text.text) == ("t" * 600, "x" * 400)
    assert text.extra["text_dropped_chars"] == 200 and "text_dropped_chars" not in thinking.extra


@pytest.mark.parametrize("dialect, body", [
    ("openai-chat", ps.openai_chat(PIECES, done=False)),
    ("openai-responses", ps.openai_responses(PIECES)[:-400]),
])
def test_a_cut_stream_longer_than_the_cap_is_truncated(dialect, body):
    analysis = judge(body, dialect, StreamEnd.UPSTREAM_RESET, text_cap=1000)
    assert analysis.verdict.kind is VerdictKind.TRUNCATED


def test_deltas_that_disagree_with_the_done_text_are_corrupt_beyond_the_cap():
    """The Responses API repeats the whole text at .done: a different length still shows."""
    body = ps.openai_responses(PIECES)
    whole = "".join(PIECES)
    body = body.replace(json.dumps(whole).encode(), json.dumps(whole + "!").encode())
    analysis = judge(body, "openai-responses", text_cap=1000)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict.reason
    same_length = body.replace(json.dumps(whole + "!").encode(), json.dumps("Z" + whole[1:]).encode())
    assert judge(same_length, "openai-responses", text_cap=1000).verdict.kind is VerdictKind.CORRUPT


def test_a_stream_that_contradicts_itself_is_corrupt_beyond_the_cap():
    events = ps.anthropic_events("", "x" * 3000, {"city": "Oslo"})
    events.insert(9, {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "late"}})
    body = b"".join(ps._sse(e["type"], e) for e in events)
    analysis = judge(body, "anthropic", text_cap=1000)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict.reason


HUGE_ARGS = {"rows": ["r" * 100] * 50}  # 5.5 KB of argument JSON


@pytest.mark.parametrize("dialect, body", [
    ("anthropic", ps.anthropic("", "hi", HUGE_ARGS)),
    ("bedrock-converse", ps.bedrock_converse(["hi"], HUGE_ARGS)),
])
def test_tool_arguments_beyond_the_cap_are_not_judged_complete(dialect, body):
    analysis = judge(body, dialect, arguments_cap=1000)
    verdict = analysis.verdict
    assert verdict.kind is VerdictKind.UNKNOWN
    assert "1000 characters kept in memory" in verdict.reason and "streamtap verify" in verdict.reason
    call = next(b for b in analysis.turn.blocks if b.kind is BlockKind.TOOL_CALL)
    assert len(call.arguments_raw) == 1000 and call.arguments is None and call.arguments_error is None
    assert call.extra["arguments_dropped_chars"] == len(json.dumps(HUGE_ARGS)) - 1000
    kept = judge(body, dialect, arguments_cap=None)  # what verify does: every argument is parsed
    assert kept.verdict.kind is VerdictKind.COMPLETE
    assert next(b for b in kept.turn.blocks if b.kind is BlockKind.TOOL_CALL).arguments == HUGE_ARGS


def test_huge_tool_arguments_that_do_not_parse_are_corrupt_when_kept():
    body = ps.anthropic("", "hi", HUGE_ARGS).replace(b'r\\"]}', b'r\\"]')  # the closing brace is gone
    assert judge(body, "anthropic", arguments_cap=1000).verdict.kind is VerdictKind.UNKNOWN
    assert judge(body, "anthropic", arguments_cap=None).verdict.kind is VerdictKind.CORRUPT


def test_openai_chat_tool_arguments_beyond_the_cap():
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    args = json.dumps(HUGE_ARGS)
    chunks = [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]
    chunks += [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 500]}}]}}
               for i in range(0, len(args), 500)]
    chunks.append({"index": 0, "delta": {}, "finish_reason": "tool_calls"})
    body = b"".join(ps._sse(None, {**base, "choices": [c]}) for c in chunks) + b"data: [DONE]\n\n"
    assert judge(body, "openai-chat").verdict.kind is VerdictKind.COMPLETE
    small = judge(body, "openai-chat", arguments_cap=1000)
    assert small.verdict.kind is VerdictKind.UNKNOWN and "streamtap verify" in small.verdict.reason
    cut = judge(body.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"length"'), "openai-chat", arguments_cap=1000)
    assert cut.verdict.kind is VerdictKind.STOPPED_BY_LIMIT


def test_a_48_mb_answer_takes_a_bounded_amount_of_memory():
    """750 text events of 64 KiB: the turn keeps TEXT_CAP characters, not the answer (140 MiB before)."""
    piece = "x" * 65536
    event = ps._sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": piece}})
    head = ps.anthropic_events("", "", {})[:1] + [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    tail = [{"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
            {"type": "message_stop"}]
    tracemalloc.start()
    try:
        session = StreamSession("anthropic", keep_arrivals=False)
        session.feed(b"".join(ps._sse(e["type"], e) for e in head))
        for _ in range(750):
            session.feed(event)
        session.feed(b"".join(ps._sse(e["type"], e) for e in tail))
        analysis = session.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    assert len(analysis.turn.blocks[0].text) == TEXT_CAP
    assert analysis.turn.blocks[0].extra["text_dropped_chars"] == 750 * 65536 - TEXT_CAP
    assert peak < 3 * TEXT_CAP + 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert ARGUMENTS_CAP >= TEXT_CAP


def _record(path, body: bytes, dialect: str, **caps) -> str:
    """A recording written as the proxy writes it, judged with ``caps``; returns the recorded verdict."""
    from streamtap.recording import RecordingWriter

    writer = RecordingWriter(path)
    writer.header({"dialect": dialect, "wire": {"format": "sse", "content_encoding": None},
                   "request": {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "headers": []},
                   "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]}})
    session = StreamSession(dialect, keep_arrivals=False, **caps)
    for i in range(0, len(body), 65536):
        writer.read(body[i:i + 65536], 1.0)
        for event in session.feed(body[i:i + 65536], 0.001):
            writer.frame(event, 1.0)
    analysis = session.close()
    for event in analysis.events:
        writer.frame(event, 1.0)
    writer.finish({"verdict": analysis.verdict.to_dict(), "stream_end": "finished", "turn": analysis.turn.to_dict()})
    return analysis.verdict.kind.value


def streamtap_cli(*args):
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run([str(Path(sys.executable).with_name("streamtap")), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_verify_judges_the_arguments_the_proxy_could_not_keep(tmp_path):
    """The proxy says unknown (arguments beyond its cap); verify parses them all and says complete,
    without calling the recording's own verdict a contradiction."""
    path = tmp_path / "args.jsonl"
    assert _record(path, ps.anthropic("", "hi", HUGE_ARGS), "anthropic", arguments_cap=1000) == "unknown"
    out = streamtap_cli("verify", path)
    assert out.returncode == 0 and ": complete " in out.stdout and "recording says" not in out.stdout, out.stdout
    broken = tmp_path / "broken.jsonl"  # the same, with arguments that do not parse: corrupt, exit 1
    body = ps.anthropic("", "hi", HUGE_ARGS).replace(b'r\\"]}', b'r\\"]')
    assert _record(broken, body, "anthropic", arguments_cap=1000) == "unknown"
    out = streamtap_cli("verify", broken)
    assert out.returncode == 1 and ": corrupt " in out.stdout, out.stdout


def test_show_prints_every_byte_of_text_the_proxy_did_not_keep(tmp_path):
    text = "lorem ipsum " * (TEXT_CAP // 12 + 50_000) + "THE-END"
    path = tmp_path / "long.jsonl"
    assert _record(path, ps.anthropic("", text, {"city": "Oslo"}), "anthropic") == "complete"
    out = streamtap_cli("show", "--width", "0", path)
    assert out.returncode == 0 and "THE-END" in out.stdout and out.stdout.count("lorem ipsum") >= TEXT_CAP // 12 + 50_000
    verify = streamtap_cli("verify", "--json", path)
    block = json.loads(verify.stdout)["turn"]["choices"][0]["blocks"][1]
    assert len(block["text"]) == TEXT_CAP and block["extra"]["text_dropped_chars"] == len(text) - TEXT_CAP


def test_an_unmodelled_delta_beside_a_block_grows_in_bounded_memory():
    """A delta type this version does not model keeps its strings in block.extra, within the text cap."""
    events = ps.anthropic_events("", "hi", {"city": "Oslo"})
    extra = [{"type": "content_block_delta", "index": 1, "delta": {"type": "future_delta", "note": "n" * 300}}] * 10
    events[8:8] = extra  # inside the text block, before its stop
    body = b"".join(ps._sse(e["type"], e) for e in events)
    whole = judge(body, "anthropic", text_cap=None).turn.blocks[1]
    assert whole.extra["note"] == "n" * 3000 and whole.text == "hi"
    capped = judge(body, "anthropic", text_cap=1000)
    block = capped.turn.blocks[1]
    assert block.extra["note"] == "n" * 998 and block.extra["note_dropped_chars"] == 2002
    assert capped.verdict.kind is VerdictKind.COMPLETE


def test_citations_per_block_are_kept_up_to_a_bound():
    from streamtap.providers.judge import MAX_LISTED

    events = ps.anthropic_events("", "hi", {"city": "Oslo"})
    cite = {"type": "content_block_delta", "index": 1,
            "delta": {"type": "citations_delta", "citation": {"type": "char_location", "cited_text": "c"}}}
    events[8:8] = [cite] * (MAX_LISTED + 5)
    analysis = judge(b"".join(ps._sse(e["type"], e) for e in events), "anthropic")
    block = analysis.turn.blocks[1]
    assert len(block.citations) == MAX_LISTED and block.extra["citations_dropped"] == 5
    assert analysis.verdict.kind is VerdictKind.COMPLETE
    assert any(f"citations beyond {MAX_LISTED} per block not kept" in n for n in analysis.turn.notes)


@pytest.mark.parametrize("dialect, build", [("anthropic", ps.anthropic_with_blocks), ("openai-chat", ps.openai_chat_with_tool_calls)])
def test_a_turn_that_opens_more_blocks_than_the_bound_is_unknown_and_stops_growing(dialect, build):
    from streamtap.providers.session import MAX_BLOCKS

    within = judge(build(MAX_BLOCKS), dialect)
    assert within.verdict.kind is VerdictKind.COMPLETE, within.verdict
    assert len(within.turn.blocks) == MAX_BLOCKS
    over = judge(build(MAX_BLOCKS + 500), dialect)
    assert over.verdict.kind is VerdictKind.UNKNOWN, over.verdict
    assert f"more than {MAX_BLOCKS} blocks" in over.verdict.reason
    assert len(over.turn.blocks) == MAX_BLOCKS + 1  # assembly stopped at the block past the bound
