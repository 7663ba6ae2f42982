"""Review fixes to the fault catalog and the protocol positions: a swap-tail that has no tail to
swap in, ``between-blocks`` where no event boundary lies between the first two blocks, a turn
streamtap stops reading (past MAX_BLOCKS or MAX_CHOICES), control characters in a spec, and
numbers with leading zeros."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from replay_streams import openai_chat_frames, write_recording

from streamtap.providers import analyze_bytes
from streamtap.providers.session import MAX_BLOCKS
from streamtap.replay.faults import FaultSpecError, LiveFaults, parse_fault, parse_faults, plan, unfit_faults
from streamtap.replay.match import Library
from streamtap.replay.server import ServeOptions, ServerThread
from streamtap.replay.source import Source

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]


def serve_refuses(directory, fault: str) -> str:
    """`streamtap serve --fault` refused at start: exit 2 and one line on stderr (returned)."""
    result = subprocess.run([*STREAMTAP, "serve", str(directory), "--fault", fault], capture_output=True, text=True, timeout=20)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def live(spec: str, body: bytes, wire: str, dialect: str) -> tuple[bytes, list[str]]:
    faults = LiveFaults(parse_faults(spec), wire, dialect)
    out = b"".join(faults.feed(body) + faults.close())
    faults.ended()
    return out, faults.log


# --- swap-tail past the other recording's end -----------------------------------------------

LONG = openai_chat_frames(words=30)  # 38 events
SHORT = openai_chat_frames(words=3, tool=False)  # 6 events: role, 3 words, finish, [DONE]


def test_a_swap_tail_past_the_other_recordings_end_is_refused_not_served_as_a_plain_cut(tmp_path):
    long = Source.from_frames(LONG, wire="sse", dialect="openai-chat")
    short = Source.from_frames(SHORT, wire="sse", dialect="openai-chat", path="short.jsonl")
    others = {"short.jsonl": short}
    for at in (5, 20):  # its last event, and past its end
        spec = f"swap-tail:with=short.jsonl,at={at}"
        with pytest.raises(FaultSpecError, match=rf"short.jsonl has no tail after event {at} \(it has 6 events\); give at= below 5"):
            plan(long, parse_faults(spec), others=others)
        assert unfit_faults(parse_faults(spec), [long], others), spec
    swapped = plan(long, parse_faults("swap-tail:with=short.jsonl,at=4"), others=others)  # the tail is event 5
    assert swapped.body == b"".join(LONG[:5] + SHORT[5:])
    write_recording(tmp_path / "long.jsonl", "openai", LONG)
    write_recording(tmp_path / "short.jsonl", "openai", SHORT)
    # at=20 fits long.jsonl itself and short.jsonl has no event 20: the one recording it would swap on refuses it
    assert "has no tail after event 20" in serve_refuses(tmp_path, "swap-tail:with=short.jsonl,at=20")


# --- between-blocks -------------------------------------------------------------------------


def _gemini(parts: list[dict], finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": parts}} | ({"finishReason": finish} if finish else {})
    return b"data: " + json.dumps({"candidates": [candidate], "modelVersion": "gemini-test"}).encode() + b"\r\n\r\n"


PARIS = {"functionCall": {"name": "weather", "args": {"city": "Paris"}}}
ROME = {"functionCall": {"name": "weather", "args": {"city": "Rome"}}}


def blocks(body: bytes) -> int:
    return sum(len(choice.blocks) for choice in analyze_bytes(body, "gemini", wire="sse").turn.choices)


def test_between_blocks_is_not_present_when_one_event_opens_the_first_two_blocks():
    # event 0 opens the text block and the first call; event 1 opens the third block
    frames = [_gemini([{"text": "Checking both."}, PARIS]), _gemini([ROME]), _gemini([{"text": ""}], "STOP")]
    source = Source.from_frames(frames, wire="sse", dialect="gemini")
    assert blocks(b"".join(frames[:1])) == 2 and blocks(source.body) == 3
    reason = "no between-blocks position: event 0 opens the turn's first two blocks together"
    with pytest.raises(FaultSpecError, match=reason):
        plan(source, parse_faults("cut:at=between-blocks"))
    body, log = live("cut:at=between-blocks", source.body, "sse", "gemini")
    assert body == source.body and log == [f"not applied: cut:at=between-blocks: this stream has {reason}"]


def test_between_blocks_is_before_the_event_that_opens_the_second_block_even_with_more_of_the_first():
    # event 1 carries more of the text block and opens the call: the cut before it keeps one block
    frames = [_gemini([{"text": "He said "}]), _gemini([{"text": "then"}, PARIS]), _gemini([ROME]), _gemini([{"text": "."}], "STOP")]
    source = Source.from_frames(frames, wire="sse", dialect="gemini")
    cut = plan(source, parse_faults("cut:at=between-blocks"))
    assert cut.body == frames[0] and blocks(cut.body) == 1
    assert cut.log == [f"cut:at=between-blocks: clean cut at byte {len(frames[0])} (before event 1, which opens the turn's second block)"]
    assert live("cut:at=between-blocks", source.body, "sse", "gemini")[0] == frames[0]


# --- a turn streamtap stops reading ----------------------------------------------------------


def _chunk(delta: dict, finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}).encode() + b"\n\n"


CALLS = [{"index": i, "id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(MAX_BLOCKS + 4)]
UNREAD = {
    "blocks": ([_chunk({"role": "assistant", "content": ""}), _chunk({"tool_calls": CALLS}), _chunk({}, "tool_calls"), b"data: [DONE]\n\n"],
               f"the answer opened more than {MAX_BLOCKS} blocks; streamtap stopped assembling it at event 1"),
    "choices": ([_chunk({"role": "assistant", "content": "a"}), _chunk({"content": "b"}, index=200), _chunk({}, "stop"), b"data: [DONE]\n\n"],
                "choice index 200 is beyond the 128 choices streamtap assembles"),
}


@pytest.mark.parametrize("bound", UNREAD)
def test_before_terminal_is_not_present_once_streamtap_stops_reading_the_turn(bound, tmp_path):
    frames, why = UNREAD[bound]
    source = Source.from_frames(frames, wire="sse", dialect="openai-chat")
    assert analyze_bytes(source.body, "openai-chat", wire="sse").verdict.kind == "unknown"
    with pytest.raises(FaultSpecError, match=rf"has no before-terminal position: {why}"):
        plan(source, parse_faults("cut:at=before-terminal"))
    body, log = live("cut:at=before-terminal", source.body, "sse", "openai-chat")
    assert body == source.body and f"has no before-terminal position: {why}" in log[0]
    write_recording(tmp_path / "unread.jsonl", "openai", frames)
    assert f"has no before-terminal position: {why}" in serve_refuses(tmp_path, "cut:at=before-terminal")


# --- the spec parser --------------------------------------------------------------------------


@pytest.mark.parametrize("control", ["\n", "\r", "\r\n", "\x00", "\x1b", "\x7f", "\t"])
def test_a_control_character_in_a_spec_is_refused(control):
    spec = f"error:kind=openai,after=1,message=first line{control}second line"
    with pytest.raises(FaultSpecError, match=r"a fault spec cannot hold a control character \(.+ at character 44\)"):
        parse_faults(spec)


@pytest.mark.parametrize("text", ["cut:event=1\n", "\tcut:event=1", "cut:event=1;\ndrop:event=2", "cut:event=1;\n"])
def test_a_control_character_at_a_specs_ends_is_refused_not_stripped(text):
    with pytest.raises(FaultSpecError, match="a fault spec cannot hold a control character"):
        parse_faults(text)


def test_serve_refuses_a_fault_whose_message_would_break_the_response_head(tmp_path):
    write_recording(tmp_path / "openai.jsonl", "openai", openai_chat_frames())
    stderr = serve_refuses(tmp_path, "error:kind=openai,after=1,message=first line\r\nX-Injected: yes")
    assert "a fault spec cannot hold a control character ('\\r' at character 44)" in stderr


def test_numbers_with_leading_zeros_are_decimal_and_0x_is_hexadecimal():
    assert parse_fault("cut:event=007").params["event"] == 7
    assert parse_fault("cut:byte=0100").params["byte"] == 100
    assert parse_fault("stall:after=010,secs=1").params["after"] == 10
    assert parse_fault("corrupt:frame=1,byte=0x22").params["byte"] == 0x22
    assert parse_fault("cut:event=-1").params["event"] == -1
    for value in ("0o7", "0b1", "1.5", "0x"):
        with pytest.raises(FaultSpecError, match=r"event must be a number \(a whole one, in decimal digits or hexadecimal after 0x\)"):
            parse_fault(f"cut:event={value}")


def test_a_cut_at_a_zero_padded_event_is_served_over_http(tmp_path):
    frames = openai_chat_frames()
    write_recording(tmp_path / "openai.jsonl", "openai", frames)
    with ServerThread(Library.load([tmp_path]), ServeOptions(faults=parse_faults("cut:event=007"))) as server:
        response = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "gpt-4.1-nano", "stream": True,
                              "messages": [{"role": "user", "content": "Weather in Paris?"}]}, timeout=10)
    assert response.status_code == 200 and response.content == b"".join(frames[:8])


def test_corrupt_payload_hits_the_data_line_not_the_same_text_in_an_earlier_line():
    """The payload was found by searching for its text from the line start: an `id: 42` line
    before `data: 42` took the corrupted byte, and `event: done` before `data: done`."""
    from streamtap.replay.faults import parse_faults, plan
    from streamtap.replay.source import Source

    source = Source.from_frames([b"id: 42\r\ndata: 42\r\n\r\n", b"event: done\ndata: done\n\n"], wire="sse", dialect="unknown")
    body = plan(source, parse_faults("corrupt:frame=0,offset=0,byte=0x39;corrupt:frame=1,offset=1,byte=0x58")).body
    assert body == b"id: 42\r\ndata: 92\r\n\r\nevent: done\ndata: dXne\n\n"


def test_corrupt_payload_of_a_json_array_element_starts_after_its_separator():
    from streamtap.replay.faults import parse_faults, plan
    from streamtap.replay.source import Frame, Source, view_frame

    frames = [Frame(0, b'[{"a":1}', 0.0), Frame(1, b',\n {"b":2}', 0.0), Frame(None, b"]\n", 0.0)]
    source = Source(path="x", method="POST", url="/", request_body=None, status=200, headers=[], frames=frames, reads=[],
                    wire="json-array", dialect="gemini")
    assert plan(source, parse_faults("corrupt:frame=1,offset=0,byte=0x20")).body == b'[{"a":1},\n  "b":2}]\n'
    assert view_frame(b',\n {"b":2}', "json-array").data == {"b": 2}
