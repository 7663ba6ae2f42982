"""Protocol positions (providers/positions.py) on every real capture in ../shared/fixtures.

Each position is checked against what it claims to be, with the verdict layer as the judge:
``between-blocks`` is where the turn's second block opens, ``before-terminal`` is where the
stream stops being judged truncated, ``tool-args`` keeps the first character of a value
that begins a tool call's final arguments (or, where no event carries their beginning, of a
string value in them), and so on.
"""

from __future__ import annotations

import json
from json.decoder import scanstring

import pytest
from conftest import shared_files

from streamtap.providers import StreamSession, VerdictKind, analyze_bytes, sniff_dialect
from streamtap.providers.positions import POSITION_NAMES, find_positions
from streamtap.replay.faults import FaultSpecError, LiveFaults, parse_faults, plan
from streamtap.replay.source import Frame, Source
from streamtap.wire import Tail


def _captures() -> list[tuple[str, bytes]]:
    raw = shared_files("*/bodies/**/*.*") + shared_files("anthropic-sdk-python/**/*.txt") + shared_files("anthropic-sdk-python/**/*.sse")
    out = [(f"{p.parent.name}/{p.name}", p.read_bytes()) for p in raw]
    for path in shared_files("vercel-ai/**/*.chunks.txt"):  # payloads only: framed as SSE data events
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        out.append((f"{path.parent.name}/{path.name}", b"".join(b"data: " + line + b"\n\n" for line in lines)))
    return out


CAPTURES = _captures()


class Stream:
    """A capture as the replay layer holds it: pieces that tile the body, each an event or not."""

    def __init__(self, body: bytes, dialect: str | None = None, wire: str | None = None) -> None:
        detection = sniff_dialect(body)
        self.dialect, self.wire, self.body = dialect or detection.dialect, wire or detection.wire, body
        session = StreamSession(self.dialect, self.wire)
        events = session.feed(body) + session.close().events
        self.pieces = [(e.raw, not isinstance(e, Tail)) for e in events]
        self.events: list[tuple[int, int]] = []  # (start, end) of each event
        pos = 0
        for raw, is_event in self.pieces:
            if is_event:
                self.events.append((pos, pos + len(raw)))
            pos += len(raw)

    def judged(self, end: int):
        return analyze_bytes(self.body[:end], self.dialect, wire=self.wire)

    def blocks(self, end: int) -> int:
        return sum(len(choice.blocks) for choice in self.judged(end).turn.choices)


def holds(stream: Stream, name: str, event: int, offset: int) -> bool:
    """Whether ``offset`` (inside event ``event``) is the position ``name`` says it is."""
    start, end = stream.events[event]
    body = stream.body
    if not start <= offset <= end:
        return False
    if name == "escaped-quote":
        return body[offset - 2 : offset] == b'\\"' and b'\\"' not in body[:start] + body[start : offset - 1]
    if name == "prelude":
        return offset - start == 6
    if name == "crc":
        return end - offset == 2
    if name == "between-blocks":
        return offset == start and stream.blocks(start) >= 1 and stream.blocks(end) > stream.blocks(start)
    if name == "before-terminal":
        unfinished = (VerdictKind.TRUNCATED, VerdictKind.CORRUPT)
        return offset == start and stream.judged(start).verdict.kind in unfinished and stream.judged(end).verdict.kind not in unfinished
    assert name == "tool-args"
    turn = stream.judged(len(body)).turn
    arguments = [b.arguments_raw for c in turn.choices for b in c.blocks if b.arguments_raw]
    if not arguments:
        return False
    if stream.wire == "eventstream":  # inside the payload of a message, past its headers
        return start + 12 < offset < end - 4
    text = body.decode("utf-8", "surrogateescape")
    at = len(body[: offset - 1].decode("utf-8", "surrogateescape"))  # the character before the cut
    if text[at - 1] == '"':  # one byte into a string: the value begins the arguments
        value, _ = scanstring(text, at)
        if bool(value) and any(a.startswith(value) for a in arguments):
            return True
        # or, where no event carries their beginning, it is a string value in them (Gemini's
        # partialArgs stream each value apart, by its JSON path)
        return bool(value) and any(json.dumps(value) in a or json.dumps(value, ensure_ascii=False) in a for a in arguments)
    value, _ = json.JSONDecoder().raw_decode(text, at - 1 if text[at - 1] in "{[" else at)
    return any(json.loads(a) == value for a in arguments)


@pytest.mark.skipif(not CAPTURES, reason="../shared/fixtures is absent")
def test_positions_on_every_capture_are_what_they_claim():
    names = set()
    for name, body in CAPTURES:
        stream = Stream(body)
        for p in find_positions(stream.pieces, stream.dialect, stream.wire):
            names.add(p.name)
            assert holds(stream, p.name, p.event, p.offset), (name, p)
            if p.name != "tool-args":  # the check can fail: a byte off is not the position
                assert not holds(stream, p.name, p.event, p.offset + 1), (name, p)
    assert len(CAPTURES) > 150 and names == set(POSITION_NAMES)


def _source(stream: Stream, name: str) -> Source:
    frames = [Frame(0 if is_event else None, raw, 0.0) for raw, is_event in stream.pieces]
    return Source(name, "POST", "/", None, 200, [], frames, [], stream.wire, str(stream.dialect))


TOOL_CAPTURES = [(n, b) for n, b in CAPTURES if b'arguments' in b or b'partial_json' in b or b'toolUse' in b or b'functionCall' in b]


@pytest.mark.skipif(not TOOL_CAPTURES, reason="../shared/fixtures is absent")
def test_live_cuts_land_where_replay_cuts_on_every_capture_with_tool_calls():
    """Live, the arguments of a call may be known only once its block closed (Anthropic): the
    events since the call opened are held back meanwhile, so the cut lands where replay puts it.
    Positions are those of the stream as served: after a duplicated or reordered event too."""
    checked = 0
    for name, body in TOOL_CAPTURES:
        stream = Stream(body)
        source = _source(stream, name)
        for spec in ("cut:at=tool-args", "cut:at=between-blocks,style=abort", "duplicate:event=2;cut:at=between-blocks", "reorder:event=3;cut:at=escaped-quote"):
            try:
                expected = plan(source, parse_faults(spec))
            except FaultSpecError:  # this capture has no such position
                continue
            live = LiveFaults(parse_faults(spec), stream.wire, stream.dialect)
            out = []
            for i in range(0, len(body), 4096):
                out += live.feed(body[i : i + 4096])
            out += live.close()
            assert b"".join(out) == expected.body, (name, spec)
            assert live.log[-1] == expected.log[-1], (name, spec)  # the cut, in the same words (replay also logs faults the cut preempted)
            checked += 1
    assert checked > 20


def test_a_dialect_the_old_shape_tables_never_knew_has_every_position():
    """Ollama's NDJSON (tool arguments as an object, "done": true at the end) was in no table
    of per-dialect shapes; its assembler's turn is enough."""
    base = {"model": "llama3", "created_at": "2026-01-01T00:00:00Z"}
    lines = [base | {"message": {"role": "assistant", "content": w}, "done": False} for w in ["The ", 'weather "is"', " fine"]]
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    lines.append(base | {"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "done": False})
    lines.append(base | {"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"})
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    stream = Stream(body, "ollama", "ndjson")
    found = {p.name: p for p in find_positions(stream.pieces, "ollama", "ndjson")}
    assert set(found) == {"tool-args", "escaped-quote", "between-blocks", "before-terminal"}
    for p in found.values():
        assert holds(stream, p.name, p.event, p.offset), p
    assert body[: found["tool-args"].offset].endswith(b'"arguments": {')
    assert (found["between-blocks"].event, found["before-terminal"].event) == (3, 4)


def _chat(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _call(index: int, name: str | None = None, arguments: str = "") -> dict:
    call = {"index": index, "function": {"arguments": arguments}}
    if name:
        call |= {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"tool_calls": [call]}


def test_a_tool_call_without_arguments_is_given_up_not_waited_for():
    """Live, the events of a call are held until its arguments are known; a call that never has
    any (a tool without parameters) is given up when the next block opens: the cut lands in the
    next call's arguments, and nothing was held back longer than that."""
    frames = [
        _chat({"role": "assistant", "content": ""}),
        _chat(_call(0, "now")),  # no parameters: its arguments stay empty
        _chat(_call(1, "weather")),
        _chat(_call(1, arguments='{"city"')),
        _chat(_call(1, arguments=': "Paris"}')),
        _chat({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    source = Source.from_frames(frames, wire="sse", dialect="openai-chat")
    expected = plan(source, parse_faults("cut:at=tool-args"))
    assert expected.body == b"".join(frames[:3]) + frames[3][: frames[3].index(b'"{') + 2]
    live = LiveFaults(parse_faults("cut:at=tool-args"), "sse", "openai-chat")
    sent = [b"".join(live.feed(frame)) for frame in frames]
    assert sent[:2] == [frames[0], b""]  # the first call is held while its arguments may still come
    assert sent[2] == frames[1]  # given up when the second call opened
    assert b"".join(sent) == expected.body and live.end == "clean"

    without = [frames[0], frames[1], _chat({}, "tool_calls"), b"data: [DONE]\n\n"]
    with pytest.raises(FaultSpecError, match="no tool-args position"):
        plan(Source.from_frames(without, wire="sse", dialect="openai-chat"), parse_faults("cut:at=tool-args"))
    live = LiveFaults(parse_faults("cut:at=tool-args"), "sse", "openai-chat")
    sent = [b"".join(live.feed(frame)) for frame in without]
    assert sent == [without[0], b"", b"", b"".join(without[1:])]  # released when the turn ended
    assert live.close() == [] and live.end is None


def test_a_session_that_cannot_be_copied_costs_the_turn_positions_only():
    """Fail open: positions that need the turn are given up (nothing stays held), the rest remain."""
    import threading

    from streamtap.providers.positions import PositionFinder

    finder = PositionFinder("openai-chat", "sse")
    frames = [_chat({"role": "assistant", "content": 'say \\"hi\\"'}), _chat(_call(0, "now"))]
    finder.event(frames[0])
    finder._session.lock = threading.Lock()  # deepcopy cannot copy a lock
    found = finder.event(frames[1])
    assert [p.name for p in finder.found.values()] == ["escaped-quote"] and found == []
    assert finder.holding is None and not finder.wanted & {"tool-args", "between-blocks", "before-terminal"}


def test_arguments_streamed_value_by_value_are_cut_inside_their_first_value():
    """Gemini's partialArgs stream a call's arguments value by value, by JSON path, into an
    object its first event gives as `{}`: no event carries their beginning, the first value is
    where the cut lands, and the call cut there is not finished."""
    found = [(name, body) for name, body in CAPTURES if name == "google/google-stream-tool-call-arguments.chunks.txt"]
    if not found:
        pytest.skip("../shared/fixtures is absent")
    stream = Stream(found[0][1])
    (position,) = find_positions(stream.pieces, stream.dialect, stream.wire, only="tool-args")
    assert position.event == 1 and stream.body[: position.offset].endswith(b'"stringValue":"B'), position
    assert stream.judged(position.offset).verdict.kind is VerdictKind.TRUNCATED


def _gemini(parts: list[dict], finish: str | None = None) -> bytes:
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0, **({"finishReason": finish} if finish else {})}
    return b"data: " + json.dumps({"candidates": [candidate], "modelVersion": "gemini-test"}).encode() + b"\r\n\r\n"


CALL = {"functionCall": {"name": "get_temperature", "args": {"city": "Paris"}}}


@pytest.mark.parametrize("frames", [
    [_gemini([{"text": "Let me look."}]), _gemini([CALL], "STOP")],
    [_gemini([CALL], "STOP")],
    [_gemini([{"text": "Let me look."}]), _gemini([CALL]), _gemini([{"text": ""}], "STOP")],
], ids=["text-then-call-with-finish", "call-with-finish", "call-then-finish"])  # fmt: skip
def test_a_call_that_comes_with_the_finish_has_its_tool_args_position(frames):
    """Gemini sends its last call in the chunk that carries finishReason: the call is this turn's,
    and the cut lands inside its arguments, in replay and live alike."""
    stream = Stream(b"".join(frames), "gemini", "sse")
    (position,) = find_positions(stream.pieces, "gemini", "sse", only="tool-args")
    assert holds(stream, "tool-args", position.event, position.offset), position
    assert stream.body[: position.offset].endswith(b'"args": {'), position
    source = Source.from_frames(frames, wire="sse", dialect="gemini")
    expected = plan(source, parse_faults("cut:at=tool-args"))
    assert expected.body == stream.body[: position.offset]
    live = LiveFaults(parse_faults("cut:at=tool-args"), "sse", "gemini")
    assert b"".join(b"".join(live.feed(frame)) for frame in frames) + b"".join(live.close()) == expected.body


def test_a_call_after_the_turn_ended_is_no_position_of_the_turn():
    frames = [_gemini([{"text": "Done."}], "STOP"), _gemini([CALL], "STOP")]  # stitched on after the finish
    assert find_positions(Stream(b"".join(frames), "gemini", "sse").pieces, "gemini", "sse", only="tool-args") == []


def test_the_real_gemini_call_sent_with_its_finish_has_a_tool_args_position():
    found = [body for name, body in CAPTURES if name == "google/test_google_model_iter_stream.1.sse"]
    if not found:
        pytest.skip("../shared/fixtures is absent")
    stream = Stream(found[0])
    (position,) = find_positions(stream.pieces, stream.dialect, stream.wire, only="tool-args")
    assert holds(stream, "tool-args", position.event, position.offset), position
