"""Memory of the SSE decoder and of a session, per read, for shapes that grew it with the read or the
event: blank lines the SDKs dispatch on (each was a note of its own, kept until the read was decoded:
~118 bytes per blank line byte), and events of many data lines or many reads (an object per line or
read, and a list of every line of the read: 10-30 times the event's size). The notes of a run of
blank lines are one note, a session decodes a long read (a recorded frame) a slice at a time, a long
read is split into lines a window at a time, and the data values and bytes of a long event are
joined into one bytearray. What each gives must not change: the same events, notes and verdicts,
compiled or not, for any chunking."""

from __future__ import annotations

import tracemalloc
from contextlib import contextmanager

import pytest
from conftest import feed_cycled
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wire_sse import GeneralPathDecoder, chunkings, lf_streams, sse_streams
from test_wire_sse_sdk import each_empty_dispatch

from streamtap.providers import StreamSession
from streamtap.providers.session import BODY_SLICE
from streamtap.wire import SSEDecoder
from streamtap.wire import sse as sse_module

START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
         b'"role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,'
         b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n')


def peak_and_held(work) -> tuple[int, int]:
    """The most bytes allocated at once while ``work()`` runs, and the bytes still held after it."""
    tracemalloc.start()
    try:
        work()
        held, peak = tracemalloc.get_traced_memory()
        return peak, held
    finally:
        tracemalloc.stop()


class LoggingDecoder(SSEDecoder):
    """Logs every blank line the SDKs dispatch on, one by one, as the line path finds them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.logged: list[tuple[int, int, str | None]] = []

    def _empty_dispatch(self, seq: int, offset: int, type_: bytes) -> None:
        self.logged.append((seq, offset, sse_module._type_name(type_)[0] if type_ else None))
        super()._empty_dispatch(seq, offset, type_)


class PythonDecoder(SSEDecoder):
    """Every loop in Python, as with STREAMTAP_PURE_PYTHON=1."""

    feed = SSEDecoder._feed
    _compiled_run = None


@contextmanager
def small_windows(lines_at_once: int, pieces_listed: int):
    """Long-read windows and lists of data values and reads of these sizes, so short streams cross them."""
    saved = sse_module._LINES_AT_ONCE, sse_module._PIECES_LISTED
    sse_module._LINES_AT_ONCE, sse_module._PIECES_LISTED = lines_at_once, pieces_listed
    try:
        yield
    finally:
        sse_module._LINES_AT_ONCE, sse_module._PIECES_LISTED = saved


# -- blank lines the SDKs dispatch on ------------------------------------------------------------


def test_a_read_of_blank_lines_after_an_id_holds_one_note_for_them() -> None:
    """150,000 blank lines after an ``id:`` in one read: 18 MB of notes until the read was decoded;
    now one note that counts them."""
    body = b"id: 1\n" + b"\n" * 150_000
    decoder = SSEDecoder(keep_all_empty_dispatches=True)
    peak, held = peak_and_held(lambda: decoder.feed(body))
    # it still holds the blank lines' bytes (the next event's span begins with them), and splits
    # a window of them (64 KiB: 64 Ki lines) into lines at a time
    assert held < 2 * len(body) and peak < 2 * len(body) + 1024 * 1024, (peak, held)
    assert decoder.empty_dispatches == [(0, 6, None, 150_000, 1)]
    assert decoder.empty_dispatch_count == 150_000


@pytest.mark.parametrize("line_end", [b"\n", b"\r", b"\r\n"])
def test_runs_of_blank_lines_are_noted_as_runs_at_their_offsets(line_end: bytes) -> None:
    """Blank lines in a row, a keep-alive comment repeated, an empty event repeated: a run each,
    whose blank lines are where the line path found them."""
    stream = (b"id: 1" + line_end + line_end * 5 + (b":" + line_end * 2) * 4 + (b"event: ping" + line_end * 2) * 3
              + b"data: x" + line_end * 2 + line_end * 2)
    decoder = LoggingDecoder(keep_all_empty_dispatches=True)
    feed_cycled(decoder, stream)
    assert each_empty_dispatch(decoder.empty_dispatches) == decoder.logged
    e = len(line_end)
    assert [(seq, name, count, step) for seq, _, name, count, step in decoder.empty_dispatches] == [
        (0, None, 5, e), (0, None, 4, 1 + 2 * e), (0, "ping", 3, 11 + 2 * e), (1, None, 2, e),
    ]
    for _, offset, _ in decoder.logged:
        assert stream[offset : offset + 1] in (b"\n", b"\r")


@st.composite
def blank_line_streams(draw) -> bytes:
    """Random streams, after an id (every blank line is then an empty dispatch), with runs in them."""
    end = draw(st.sampled_from([b"\n", b"\r", b"\r\n"]))
    runs = [draw(st.sampled_from([end, b":" + end + end, b"event: ping" + end + end, b"retry: 1" + end + end]))
            * draw(st.integers(1, 6)) for _ in range(draw(st.integers(0, 4)))]
    return b"id: 1" + end + draw(sse_streams()) + b"".join(runs) + draw(sse_streams())


@settings(max_examples=150)
@given(stream=st.one_of(blank_line_streams(), sse_streams()), chunks=chunkings())
def test_the_notes_are_every_blank_line_once_for_any_chunking_and_emptying(stream: bytes, chunks: list[int]) -> None:
    """Run or not, the notes stand for every blank line the line path found, in order, fed whole
    or in pieces, with the list kept or emptied after every read (as the session does)."""
    whole = LoggingDecoder(keep_all_empty_dispatches=True)
    feed_cycled(whole, stream)
    assert each_empty_dispatch(whole.empty_dispatches) == whole.logged
    emptied, taken, pos, i = LoggingDecoder(keep_all_empty_dispatches=True), [], 0, 0
    while pos < len(stream):
        emptied.feed(stream[pos : pos + chunks[i % len(chunks)]])
        taken += each_empty_dispatch(emptied.empty_dispatches)
        emptied.empty_dispatches.clear()
        pos, i = pos + chunks[i % len(chunks)], i + 1
    emptied.close()
    taken += each_empty_dispatch(emptied.empty_dispatches)
    assert taken == emptied.logged == whole.logged
    # the first few notes, kept by a decoder not told to keep all: the first blank lines
    few = SSEDecoder()
    feed_cycled(few, stream, chunks)
    kept = each_empty_dispatch(few.empty_dispatches)
    assert kept == whole.logged[: len(kept)] and len(few.empty_dispatches) <= 16
    assert few.empty_dispatch_count == len(whole.logged)


def test_a_session_holds_one_slices_notes_however_long_the_read() -> None:
    """A recorded frame of 512 KiB of blank lines at uneven distances (no run longer than two), fed
    whole as verify and show feed it: the session decodes it a slice at a time and offers each
    slice's notes before the next, so what it holds does not grow with the frame (it held 18 MB)."""
    body = START + b"id: 1\n" + b":\n\n:x\n\n" * 75_000
    session = StreamSession("anthropic", keep_arrivals=False, one_response=True)
    peak, _ = peak_and_held(lambda: session.feed(body))
    assert peak < 4 * 1024 * 1024, peak
    assert len(body) > 8 * BODY_SLICE


def judged(session: StreamSession, stream: bytes, reads: list[int] | None, grouped: bool = False):
    """What the assembler was offered, and the verdict, for ``stream`` fed in these reads (whole: None)."""
    offered = []
    feed = session._assembler.feed

    def offer(event, t):
        offered.append(tuple(event))
        feed(event, t)

    session._assembler.feed = offer
    pieces, pos, i = [], 0, 0
    while pos < len(stream):
        size = reads[i % len(reads)] if reads else len(stream)
        pieces.append(stream[pos : pos + size])
        pos, i = pos + size, i + 1
    if grouped:
        for at in range(0, len(pieces), 3):
            session.feed_reads(pieces[at : at + 3], [1.0] * len(pieces[at : at + 3]))
    else:
        for piece in pieces:
            session.feed(piece, 1.0)
    analysis = session.close("finished")
    verdict = analysis.verdict
    return offered, (verdict.kind, verdict.reason, verdict.offset, verdict.evidence), analysis.wire_events


@pytest.mark.parametrize("dialect", ["anthropic", "openai-chat", "openai-responses"])
def test_a_session_offers_the_same_empty_events_however_the_stream_is_read(dialect: str) -> None:
    """Runs of blank lines across slice and read boundaries: each blank line is still offered to the
    assembler on its own, at its own offset, and the verdict is the same, whole (decoded a slice at
    a time), read in pieces, or in groups of reads (feed_reads)."""
    stream = (START + b"id: 1\n" + b"\n" * (BODY_SLICE + 3) + b":\n\n" * 5000 + b"event: ping\n\n" * 3000
              + b"data: {}\n\n" + b"\r\n" * 7000 + b"\n")
    logged = LoggingDecoder()
    feed_cycled(logged, stream)
    expected = judged(StreamSession(dialect, keep_arrivals=False, one_response=True), stream, None)
    offered_empty = [(seq, start, name) for seq, start, end, _, name, *_ in expected[0] if start == end]
    assert offered_empty == [(seq, offset, name or "message") for seq, offset, name in logged.logged]
    assert len(offered_empty) > BODY_SLICE + 15_000
    for reads, grouped in (([7], False), ([1000, 1], False), ([BODY_SLICE + 1], False), ([5000, 3], True)):
        session = StreamSession(dialect, keep_arrivals=False, one_response=True)
        assert judged(session, stream, reads, grouped) == expected, (reads, grouped)


# -- events of many data lines -------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"data:\n", b"data: x\n", b'data: {"a": 12345678}\n'])
def test_an_event_of_many_data_lines_costs_about_its_size(line: bytes) -> None:
    """One event of 3 MB of data lines, in one read or in 64 KiB reads: a few times its size at
    most (was 8-23 times: a list of every line of the read, and an object per data line)."""
    body = line * (3_000_000 // len(line)) + b"\n"
    for reads in (None, [65536]):
        decoder = SSEDecoder()
        events = []
        peak, _ = peak_and_held(lambda: events.extend(feed_cycled(decoder, body, reads)))
        (event,) = events
        value = line[6:-1] if line[5:6] == b" " else line[5:-1]
        assert event.data == "\n".join([value.decode()] * (len(body) // len(line))) and event.raw == body
        assert peak < 4 * len(body), (reads, peak / len(body))


def test_an_event_read_a_line_at_a_time_costs_about_its_size() -> None:
    """A server that flushes every line: the event's bytes so far were kept as one object per read
    (6 times its size, and 10 more to join them); now in one bytearray."""
    decoder = SSEDecoder()
    reads = 125_000
    events = []

    def read_line_by_line() -> None:
        for i in range(reads):
            events.extend(decoder.feed(b"data: %d\n" % (i % 10)))  # a new object per read, as reads are
        events.extend(decoder.feed(b"\n"))

    peak, _ = peak_and_held(read_line_by_line)
    (event,) = events
    assert len(event.raw) == 8 * reads + 1 and event.data.count("\n") == reads - 1
    assert peak < 4 * len(event.raw), peak / len(event.raw)


def test_a_session_fed_a_frame_of_many_data_lines_costs_about_its_size() -> None:
    """The same through a session fed one recorded frame whole (as verify does), where the dialect
    makes little of the data: a few times the frame (was 18 times)."""
    body = b"data:\n" * 500_000 + b"\n"
    session = StreamSession("openai-chat", keep_arrivals=False, one_response=True)
    peak, _ = peak_and_held(lambda: session.feed(body))
    assert peak < 4 * len(body), peak / len(body)


# -- the same results, compiled or not, windows or not, for any chunking ------------------------


def decoded(decoder: SSEDecoder, stream: bytes, reads: list[int] | None) -> tuple:
    events = feed_cycled(decoder, stream, reads)
    return events, each_empty_dispatch(decoder.empty_dispatches), decoder.empty_dispatch_count, decoder.invalid_utf8


LONG_SHAPES = {
    "blank lines after an id": b"id: 1\n" + b"\n" * 70_000 + b"data: a\n\n" + b"\r\n" * 30_000 + b"\r",
    "keep-alives after an id": b"id: 1\n" + b": ka\n\n" * 12_000 + b"event: ping\n\n" * 6000 + b"data: b\n\n",
    "data lines": b"event: e\n" + b"data: x\n" * 20_000 + b"data:\xff\n" + b"data\n" * 9000 + b"\n" + b"data: y\n" * 9,
    "crlf data lines": b"data: x\r\n" * 30_000 + b"\r\n" + b"data:\r" * 30_000 + b"\r",
    "a long line": b"data: " + b"x" * 200_000 + b"\n: " + b"y" * 100_000 + b"\n\n" + b"id: " + b"z" * 70_000,
}


@pytest.mark.parametrize("shape", sorted(LONG_SHAPES))
def test_long_shapes_decode_alike_compiled_or_not_for_any_chunking(shape: str) -> None:
    """Reads longer than a window and events longer than the data values kept one by one: the same
    events, notes and counts from the compiled feed, the Python loops and the line path alone, whole
    or in pieces."""
    stream = LONG_SHAPES[shape]
    expected = decoded(SSEDecoder(), stream, None)
    assert expected[0]
    for cls in (SSEDecoder, PythonDecoder, GeneralPathDecoder):
        for reads in (None, [BODY_SLICE], [4096, 1], [997]):
            assert decoded(cls(), stream, reads) == expected, (cls.__name__, reads)
    assert decoded(SSEDecoder(max_event_size=100_000), stream, None) == decoded(
        GeneralPathDecoder(max_event_size=100_000), stream, [999])


@settings(max_examples=150)
@given(stream=st.one_of(sse_streams(), lf_streams(), blank_line_streams()), chunks=chunkings(),
       limit=st.sampled_from([16 * 1024 * 1024, 10, 40]))
def test_windows_and_joined_data_values_change_nothing(stream: bytes, chunks: list[int], limit: int) -> None:
    """A long read split into lines a window at a time, and the data values of an event moved into
    one bytearray, give what splitting at once and listing every value gave: here with windows and
    lists so small that every stream crosses them."""
    expected = decoded(GeneralPathDecoder(max_event_size=limit), stream, None)
    with small_windows(lines_at_once=8, pieces_listed=1):
        assert decoded(GeneralPathDecoder(max_event_size=limit), stream, None) == expected
        assert decoded(SSEDecoder(max_event_size=limit), stream, chunks) == expected
        assert decoded(PythonDecoder(max_event_size=limit), stream, chunks) == expected
