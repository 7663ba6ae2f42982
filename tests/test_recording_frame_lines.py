"""The compiled frame lines (recording/_lines.c) write what the writer's Python loop writes, byte for byte.

The compiled loop takes the common frames and hands every other event back; these tests write
the same events with it and without it and compare the files, the writer's state after, and
what each raised."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtap.recording import RecordingError, check_recording, read_recording
from streamtap.recording import writer as writer_module
from streamtap.recording.writer import RecordingWriter
from streamtap.wire import EventStreamMessage, JSONValue, Malformed, SSEEvent, Tail
from streamtap.wire.errors import FramingError

pytestmark = pytest.mark.skipif(
    writer_module._frame_lines is None,
    reason="streamtap.recording._lines is not built (a C compiler and OpenSSL's headers are needed), "
    "or STREAMTAP_PURE_PYTHON is set: the writer runs its Python loop alone",
)

# bytes that stress the line: quotes, backslashes, every control character, DEL, UTF-8 of every
# length, and bytes that are not UTF-8 (a lone continuation, a surrogate, an overlong form, a cut sequence)
PIECES = [b'"', b"\\", b"\x7f", b"\xc3\xa9", b"\xe2\x80\xa8", b"\xf0\x9f\x98\x80", b"\x80", b"\xed\xa0\x80",
          b"\xc0\xaf", b"\xe2\x82", b"\xf4\x90\x80\x80", b"data: ", b"event: x\n", b"\n\n"] + [bytes([c]) for c in range(32)]
TEXT = st.text(st.one_of(st.sampled_from('"\\\x7f\u2028é😀 ab' + "".join(map(chr, range(32)))), st.characters(codec="utf-8")),
               max_size=40).map(str.encode)
raw_bytes = st.one_of(TEXT, TEXT, TEXT, st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=8)), max_size=12).map(b"".join))
HEADER_SETS = [
    {":event-type": "contentBlockDelta", ":content-type": "application/json", ":message-type": "event"},
    {":event-type": "messageStop", ":content-type": "application/json", ":message-type": "event"},
    {":event-type": "x", "flag": True},
    {":event-type": "x", "flag": 1},
    {":event-type": "x", "blob": b"\x00\xff"},
]


@st.composite
def batches(draw):
    """Events back to back from offset 0 (now and then one that does not follow), and their times."""
    specs = draw(st.lists(st.tuples(
        st.sampled_from(["sse"] * 4 + ["message"] * 4 + ["value", "value", "malformed", "tail", "gap"]),
        raw_bytes,
        st.sampled_from(["message", "message_start", "content_block_delta", "ping"]),
        st.sampled_from([""] * 6 + ["7", "long-id"]),
        st.sampled_from([None] * 6 + [3000]),
        st.sampled_from([0] * 6 + [2]),
        st.sampled_from([0] * 6 + list(range(1, len(HEADER_SETS)))),
        raw_bytes,
        st.sampled_from(["same", "same", "new", "none", "int"]),
    ), max_size=30))
    events, times, offset, last_t = [], [], 0, 0.0
    for seq, (kind, raw, sse_type, event_id, retry, invalid, headers, payload, when) in enumerate(specs):
        start = offset + 3 if kind == "gap" else offset
        if kind in ("sse", "gap"):
            events.append(SSEEvent(seq, start, start + len(raw), raw, sse_type, "", event_id, retry, invalid))
        elif kind == "message":
            events.append(EventStreamMessage(seq, start, start + len(raw), raw, dict(HEADER_SETS[headers]), payload))
        elif kind == "value":
            events.append(JSONValue(seq, start, start + len(raw), raw, None))
        elif kind == "malformed":
            events.append(Malformed(seq, start, start + len(raw), raw, FramingError("bad", start), False))
        else:
            events.append(Tail(seq, start, start + len(raw), raw, "cut"))
        offset = start + len(raw)
        last_t = {"same": last_t, "new": float(seq) + 0.25, "none": None, "int": seq}[when]
        times.append(last_t)
    return events, times


def written(path, events, times, compiled: bool, calls: int = 1) -> tuple[bytes, tuple, str | None]:
    saved = writer_module._frame_lines
    if not compiled:
        writer_module._frame_lines = None
    try:
        writer = RecordingWriter(path, fsync="never")
        raised = None
        try:
            size = -(-len(events) // calls) if events else 1
            for at in range(0, max(len(events), 1), size):
                writer.frames(events[at:at + size], times[at:at + size])
        except RecordingError as error:
            raised = f"{type(error).__name__}: {error}"
        writer.flush()
        state = (writer.offset, writer._frames, writer._sse_id, writer._body_hash.hexdigest())
        writer._file.close()
        return path.read_bytes(), state, raised
    finally:
        writer_module._frame_lines = saved


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches(), st.sampled_from([1, 2, 3, 30]))  # 30: one event a call, as a slow stream's reads come
def test_compiled_lines_match_the_python_loop(tmp_path_factory, batch, calls):
    events, times = batch
    folder = tmp_path_factory.mktemp("lines")
    compiled = written(folder / "c.jsonl", events, times, compiled=True, calls=calls)
    python = written(folder / "py.jsonl", events, times, compiled=False, calls=calls)
    assert compiled == python


def test_a_batch_of_many_blocks_is_written_as_the_python_loop_writes_it(tmp_path):
    """The compiled loop stops at each MiB of lines (a large batch is not held twice over in one
    buffer); the Python loop takes the event it stops at, and the lines and the hash come out whole."""
    events, offset = [], 0
    for seq in range(12_000):
        raw = b'data: {"n": %d, "text": "\\"quoted\\" \xc3\xa9"}\n\n' % seq
        events.append(SSEEvent(seq, offset, offset + len(raw), raw, "message", "", "", None, 0))
        offset += len(raw)
    times = [float(seq // 7) for seq in range(len(events))]
    compiled, python = written(tmp_path / "c.jsonl", events, times, True), written(tmp_path / "p.jsonl", events, times, False)
    assert len(compiled[0]) > 2 * (1 << 20) and compiled == python


def test_compiled_lines_take_the_common_frames():
    """The comparison above means something only if the compiled loop takes frames: a stream of
    plain SSE events and one of event-stream messages under one header set go to it whole."""
    headers = HEADER_SETS[0]
    sse = [SSEEvent(i, 10 * i, 10 * i + 10, b'data: {"a"}\n\n'[:10], "message", "", "", None, 0) for i in range(5)]
    messages = [EventStreamMessage(i, 10 * i, 10 * i + 10, b"\x00\x00\x00\x0a\xff\xfe\x01\x02\x03\x04", dict(headers), b"{}")
                for i in range(5)]
    writer_module._PLAIN_SSE.setdefault("message", b'{"sse":"message"}')
    no_time = object()  # as frames() begins: no time is encoded yet
    taken = writer_module._frame_lines(sse, [1.0] * 5, 0, 0, "", None, None, b"", no_time, b"")
    assert taken[0] == 5 and taken[5] == tuple(e.raw for e in sse) and taken[4].count(b'"t":1.0,') == 5
    known = writer_module._headers_json(headers)
    taken = writer_module._frame_lines(messages, [None] * 5, 0, 0, "", dict(headers), None, known, no_time, b"")
    assert taken[0] == 5 and taken[4].count(b'"t":null,') == 5


def test_compiled_loop_knows_utf8_as_python_does():
    """A value's bytes are written as text where they are UTF-8 and in base64 elsewhere: the
    compiled test of UTF-8 must agree with Python's decoder on every two-byte sequence and on the
    edges of every longer form (overlong, surrogate, past U+10FFFF, cut)."""
    def compiled_says_utf8(raw: bytes) -> bool:
        taken = writer_module._frame_lines([JSONValue(0, 0, len(raw), raw, None)], [None], 0, 0, "", None, None, b"", 0, b"")
        return taken[0] == 1

    def python_says_utf8(raw: bytes) -> bool:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    samples = [bytes([a, b]) for a in range(256) for b in range(256)]
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    samples += [bytes([lead, b, c]) for lead in range(0xE0, 0xF0) for b in edges for c in edges]
    samples += [bytes([lead, b, c, d]) for lead in range(0xF0, 0xF8) for b in edges for c in edges for d in (0x80, 0xBF, 0x7F)]
    samples += [s[:-1] for s in samples if len(s) > 2]
    disagree = [raw for raw in samples if compiled_says_utf8(raw) != python_says_utf8(raw)]
    assert not disagree, disagree[:10]


def test_compiled_lines_read_back_as_the_frames_written(tmp_path):
    """A recording written by the compiled loop reads back: each frame's bytes, sum and view."""
    body = b"".join(b'data: {"n": %d, "text": "\\"q\\" \\u00e9 \xc3\xa9"}\n\n' % i for i in range(50))
    from streamtap.wire import SSEDecoder

    events = SSEDecoder().feed(body)
    writer = RecordingWriter(tmp_path / "r.jsonl", fsync="never")
    writer.header({"request": {}, "response": {}, "dialect": "openai-chat", "wire": {"format": "sse"}})
    writer.frames(events, [float(i) for i in range(len(events))])
    path = writer.finish({"verdict": {"kind": "unknown"}, "stream_end": "finished"})
    recording = read_recording(path)
    assert recording.body == body and check_recording(recording) == []
    assert [segment.raw for segment in recording.segments] == [event.raw for event in events]
