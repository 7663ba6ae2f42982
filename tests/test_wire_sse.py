"""SSEDecoder against the WHATWG event-stream rules, one test id per rule, plus
chunking-invariance properties, the cut-at-every-offset check, oversize handling
and invalid UTF-8 counting."""

from __future__ import annotations

import gc
import os
import re
import weakref
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compiled_loops_missing, feed_cycled, shared_files
from streamtap.wire import EventStreamDecoder, LongIdleRun, Malformed, OversizeError, SSEDecoder, SSEEvent, Tail, accel
from streamtap.wire import sse as sse_module


def decode(stream: bytes, chunks: list[int] | None = None, **kwargs) -> list:
    """Decode ``stream`` fed in pieces of the given sizes (cycled), or whole."""
    return feed_cycled(SSEDecoder(**kwargs), stream, chunks)


def triples(events: list) -> list[tuple]:
    return [(e.event, e.data, e.id) for e in events if isinstance(e, SSEEvent)]


def tails(events: list) -> list[Tail]:
    return [e for e in events if isinstance(e, Tail)]


# (rule, stream, expected (event, data, id) list, expected tail bytes or None)
SPEC_CASES = [
    ("line-end-lf", b"data: a\n\n", [("message", "a", "")], None),
    ("line-end-cr", b"data: a\r\r", [("message", "a", "")], None),
    ("line-end-crlf", b"data: a\r\n\r\n", [("message", "a", "")], None),
    ("line-ends-mixed", b"data: a\rdata: b\ndata: c\r\n\n", [("message", "a\nb\nc", "")], None),
    # LF CR is two line ends (an empty line follows), CR LF is one
    ("lf-then-cr-is-two-line-ends", b"data: a\n\rdata: b\n\n", [("message", "a", ""), ("message", "b", "")], None),
    ("crlf-is-one-line-end", b"data: a\r\ndata: b\r\n\r\n", [("message", "a\nb", "")], None),
    ("bom-stripped-at-start", b"\xef\xbb\xbfdata: a\n\n", [("message", "a", "")], None),
    # a second BOM is text: the field name becomes "\ufeffdata", an unknown field
    ("bom-only-once", b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n", [("message", "b", "")], None),
    ("bom-not-stripped-mid-stream", b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [("message", "a", "")], b"\xef\xbb\xbfdata: b\n\n"),
    ("comment-ignored", b": hello\ndata: a\n:\n\n", [("message", "a", "")], None),
    ("comment-only-event-not-dispatched", b": keep-alive\n\ndata: a\n\n", [("message", "a", "")], None),
    ("field-without-colon-data", b"data\n\n", [("message", "", "")], None),
    ("field-without-colon-data-twice", b"data\ndata\n\n", [("message", "\n", "")], None),
    ("field-without-colon-event", b"event\ndata: a\n\n", [("message", "a", "")], None),
    ("one-leading-space-stripped", b"data:  two\n\n", [("message", " two", "")], None),
    ("no-space-after-colon", b"data:a\n\n", [("message", "a", "")], None),
    ("only-space-stripped-not-tab", b"data:\tx\n\n", [("message", "\tx", "")], None),
    ("value-keeps-later-colons", b"data: a: b:c\n\n", [("message", "a: b:c", "")], None),
    ("multi-line-data-joined-by-lf", b"data: a\ndata: b\ndata:\n\n", [("message", "a\nb\n", "")], None),
    ("empty-data-line-dispatches", b"data:\n\n", [("message", "", "")], None),
    ("event-type", b"event: ping\ndata: a\n\n", [("ping", "a", "")], None),
    ("event-type-defaults-to-message", b"data: a\n\n", [("message", "a", "")], None),
    ("empty-event-type-is-message", b"event:\ndata: a\n\n", [("message", "a", "")], None),
    ("event-type-reset-after-dispatch", b"event: x\ndata: a\n\ndata: b\n\n", [("x", "a", ""), ("message", "b", "")], None),
    ("event-type-reset-after-empty-event", b"event: x\n\ndata: b\n\n", [("message", "b", "")], None),
    ("field-names-case-sensitive", b"Data: a\nDATA: b\ndata: c\n\n", [("message", "c", "")], None),
    ("unknown-field-ignored", b"foo: bar\ndata: a\n\n", [("message", "a", "")], None),
    ("id-set", b"id: 1\ndata: a\n\n", [("message", "a", "1")], None),
    ("id-persists-across-events", b"id: 1\ndata: a\n\ndata: b\n\n", [("message", "a", "1"), ("message", "b", "1")], None),
    ("id-empty-resets", b"id: 1\ndata: a\n\nid\ndata: b\n\n", [("message", "a", "1"), ("message", "b", "")], None),
    ("id-with-nul-ignored", b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", [("message", "a", "1"), ("message", "b", "1")], None),
    ("id-of-data-less-event-takes-effect", b"id: 9\n\ndata: a\n\n", [("message", "a", "9")], None),
    ("id-applies-to-its-own-event", b"data: a\nid: 5\n\n", [("message", "a", "5")], None),
    ("no-dispatch-without-data", b"event: x\nid: 1\nretry: 5\n\n", [], b"event: x\nid: 1\nretry: 5\n\n"),
    ("dispatch-on-blank-line-only", b"data: a\ndata: b\n", [], b"data: a\ndata: b\n"),
    ("unterminated-final-event-not-dispatched", b"data: a\n\ndata: b", [("message", "a", "")], b"data: b"),
    ("final-cr-is-a-line-end-at-close", b"data: a\n\r", [("message", "a", "")], None),
    ("blank-lines-between-events", b"\n\n\ndata: a\n\n\n\ndata: b\n\n", [("message", "a", ""), ("message", "b", "")], None),
]


@pytest.mark.parametrize(
    "stream,expected,tail", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES]
)
def test_spec_rule(stream: bytes, expected: list, tail: bytes | None) -> None:
    for chunks in (None, [1], [2], [3, 1]):
        events = decode(stream, chunks)
        assert triples(events) == expected, chunks
        assert [t.raw for t in tails(events)] == ([tail] if tail else []), chunks
        assert b"".join(e.raw for e in events) == stream


RETRY_CASES = [
    ("retry-digits", b"retry: 1500\ndata: a\n\n", 1500),
    ("retry-not-all-digits-ignored", b"retry: 15a\ndata: a\n\n", None),
    ("retry-signed-ignored", b"retry: -1\ndata: a\n\n", None),
    ("retry-empty-ignored", b"retry:\ndata: a\n\n", None),
    ("retry-non-ascii-digits-ignored", "retry: ١٢\ndata: a\n\n".encode(), None),
    ("retry-space-inside-ignored", b"retry: 1 5\ndata: a\n\n", None),
]


@pytest.mark.parametrize("stream,retry", [c[1:] for c in RETRY_CASES], ids=[c[0] for c in RETRY_CASES])
def test_retry_rule(stream: bytes, retry: int | None) -> None:
    decoder = SSEDecoder()
    (event,) = decoder.feed(stream)
    assert event.retry == retry
    assert decoder.retry == retry


def test_retry_of_data_less_event_is_reported_on_the_next_event_and_stays_set() -> None:
    decoder = SSEDecoder()
    first, second = decoder.feed(b"retry: 100\n\ndata: a\n\ndata: b\n\n")
    assert (first.retry, second.retry, decoder.retry) == (100, None, 100)


def test_cr_split_from_lf_across_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []  # CR LF: one line end, so no blank line yet
    assert decoder.feed(b"\r") == []  # held back: it may be the CR of a CRLF
    (event,) = decoder.feed(b"\n")
    assert (event.data, event.raw) == ("a", b"data: a\r\n\r\n")
    assert decoder.close() == []


def test_cr_at_chunk_end_waits_for_next_byte() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\r") == []  # CR alone might be the start of CRLF
    event, _ = decoder.feed(b"data: b\n\n")
    assert (event.data, event.raw) == ("a", b"data: a\n\r")


@pytest.mark.parametrize("cut", [1, 2])
def test_bom_split_across_chunks(cut: int) -> None:
    stream = b"\xef\xbb\xbfdata: a\n\n"
    decoder = SSEDecoder()
    events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
    assert triples(events) == [("message", "a", "")]
    assert events[0].raw == stream and events[0].start == 0


def test_partial_bom_at_close_is_a_tail() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef\xbb") == []
    (tail,) = decoder.close()
    assert isinstance(tail, Tail) and tail.raw == b"\xef\xbb"


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_partial_bom_at_close_meets_the_size_limit_like_any_bytes(limit: int) -> None:
    """Two bytes that could have begun a BOM are an unfinished line like any other: over the
    limit, they are an oversize event, not a Tail that kept them."""
    got = feed_cycled(SSEDecoder(max_event_size=limit), b"\xef\xbb")
    like = feed_cycled(SSEDecoder(max_event_size=limit), b"ab")
    assert [(type(e), e.start, e.end, len(e.raw)) for e in got] == [(type(e), e.start, e.end, len(e.raw)) for e in like]
    assert isinstance(got[0], Malformed if limit < 2 else Tail)


def test_spans_tile_comments_and_empty_events_into_the_next_event() -> None:
    stream = b": ping\n\nevent: x\n\nid: 3\ndata: a\n\n: trailing\n\n"
    events = decode(stream)
    event, tail = events
    assert (event.start, event.end) == (0, len(stream) - len(b": trailing\n\n"))
    assert event.raw == stream[: event.end]
    assert (tail.start, tail.end, tail.raw, tail.cut) == (event.end, len(stream), b": trailing\n\n", False)


def test_tail_reasons_distinguish_a_cut_from_padding() -> None:
    (cut_line,) = decode(b"data: a")
    (cut_event,) = decode(b"data: a\n")
    (padding,) = decode(b": keep-alive\n")
    assert cut_line.cut and cut_event.cut and not padding.cut
    assert "line" in cut_line.reason and "blank line" in cut_event.reason


def test_seq_counts_every_returned_event() -> None:
    events = decode(b"data: a\n\ndata: b\n\ndata: c")
    assert [e.seq for e in events] == [0, 1, 2]


def test_feed_after_close_raises() -> None:
    decoder = SSEDecoder()
    decoder.close()
    with pytest.raises(RuntimeError):
        decoder.feed(b"data: a\n\n")


# -- invalid UTF-8 -------------------------------------------------------------------


def test_invalid_utf8_replaced_and_counted_never_raised() -> None:
    stream = b"event: t\xff\ndata: a\xc3\ndata: \xe2\x82\nid: \x80\n\ndata: ok \xef\xbf\xbd\n\n"
    decoder = SSEDecoder()
    first, second = decoder.feed(stream)
    assert first.event == "t\ufffd"
    assert first.data == "a\ufffd\n\ufffd"  # a truncated sequence is one replacement
    assert first.id == "\ufffd"
    assert first.invalid_utf8 == 4
    assert second.data == "ok \ufffd" and second.invalid_utf8 == 0  # a real U+FFFD is not counted
    assert decoder.invalid_utf8 == 4


def test_invalid_utf8_counts_do_not_depend_on_chunking() -> None:
    stream = b"data: \xf0\x9f\x98\n\ndata: \xf0\x9f\x98\x80\xc0\xaf\n\ndata: \xff\xef\xbf\xbd\n\n"
    whole = decode(stream)
    assert [e.invalid_utf8 for e in whole] == [1, 2, 1]  # the last has one real U+FFFD
    assert decode(stream, [1]) == whole


# Lines whose value no event keeps: the SDKs still decode each strictly and raise on it.
NOT_UTF8_OUTSIDE_VALUES = [
    ("comment", b": keep-alive \xff\n\n"),
    ("comment-in-event", b": \xc3\n"),
    ("retry", b"retry: 1\xff\n\n"),
    ("unknown-field", b"x-note: \xe2\x82\n\n"),
    ("field-name", b"\xffdata: a\n\n"),
    ("id-with-nul", b"id: \x00\xff\n\n"),
    ("type-of-data-less-event", b"event: t\xff\n\n"),
    ("overridden-type", b"event: t\xff\nevent: t\n"),
]


@pytest.mark.parametrize("block", [c[1] for c in NOT_UTF8_OUTSIDE_VALUES], ids=[c[0] for c in NOT_UTF8_OUTSIDE_VALUES])
def test_invalid_utf8_outside_any_value_counts_in_the_next_event(block: bytes) -> None:
    """A comment, an ignored field, a value another replaced: no event holds their text, yet a
    byte there that is not UTF-8 makes the SDKs raise, so the event whose span holds it counts it,
    on every path and for any chunking."""
    event = b"event: t\ndata: a\n\n"
    stream = event + block + event * 3
    for decoder_class in (SSEDecoder, GeneralPathDecoder, PythonLoopDecoder):
        for chunks in (None, [1], [len(event) + 1], [len(event) + len(block)]):
            decoder = decoder_class()
            events = feed_cycled(decoder, stream, chunks)
            assert [e.invalid_utf8 for e in events] == [0, 1, 0, 0], (decoder_class, chunks)
            assert decoder.invalid_utf8 == 1
            assert triples(events)[1] == ("t", "a", "")


def test_invalid_utf8_is_counted_once_where_a_value_keeps_it() -> None:
    stream = b"event: t\xff\nid: \x80\ndata: \xff\n\n"
    decoder = SSEDecoder()
    (event,) = decoder.feed(stream)
    assert (event.event, event.id, event.data, event.invalid_utf8) == ("t\ufffd", "\ufffd", "\ufffd", 3)
    assert decoder.invalid_utf8 == 3


@pytest.mark.parametrize(
    "after,cut",
    [(b": bye \xff\n\n", False), (b"retry: \xff\n\n", False), (b": bye \xff\n", False), (b"data: \xff\n", True)],
)
def test_invalid_utf8_after_the_last_event_counts_in_the_decoder(after: bytes, cut: bool) -> None:
    """After the last event no event carries the count: the decoder's own does, and the tail
    says so."""
    stream = b"data: a\n\n" + after
    for chunks in (None, [1]):
        decoder = SSEDecoder()
        event, tail = feed_cycled(decoder, stream, chunks)
        assert event.invalid_utf8 == 0 and decoder.invalid_utf8 == 1
        assert (tail.raw, tail.cut) == (after, cut) and "not UTF-8" in tail.reason


def test_a_last_line_cut_inside_a_character_is_not_counted() -> None:
    """A cut stream may end inside a character: that is the cut, not a byte that is not UTF-8."""
    for after in (b": caf\xc3", b"data: caf\xc3"):
        decoder = SSEDecoder()
        event, tail = feed_cycled(decoder, b"data: a\n\n" + after, None)
        assert decoder.invalid_utf8 == 0 and "not UTF-8" not in tail.reason


# -- oversize -------------------------------------------------------------------------


def test_oversize_event_skipped_and_decoding_resumes() -> None:
    big = b"data: " + b"x" * 200 + b"\n" + b"data: y\n\n"
    stream = b"data: a\n\n" + big + b"data: b\n\n"
    for chunks in (None, [1], [7], [64]):
        events = decode(stream, chunks, max_event_size=100)
        a, bad, b = events
        assert (a.data, b.data) == ("a", "b")
        assert isinstance(bad, Malformed) and not bad.fatal
        assert isinstance(bad.error, OversizeError)
        assert (bad.start, bad.end, bad.raw) == (a.end, a.end + len(big), b"")
        assert bad.error.offset == a.end
        assert b.start == bad.end


def test_oversize_line_is_not_buffered() -> None:
    decoder = SSEDecoder(max_event_size=1000)
    decoder.feed(b"data: ")
    for _ in range(1000):
        assert decoder.feed(b"z" * 1000) == []
        assert len(decoder._buf) <= 1000  # memory stays bounded by the limit
    (bad,) = decoder.feed(b"\n\n")
    assert isinstance(bad, Malformed) and bad.end == 6 + 1000 * 1000 + 2
    (event,) = decoder.feed(b"data: after\n\n")
    assert event.data == "after" and event.start == bad.end


def test_oversize_at_close_is_reported() -> None:
    events = decode(b"data: " + b"x" * 50, max_event_size=10)
    (bad,) = events
    assert isinstance(bad, Malformed) and isinstance(bad.error, OversizeError)
    assert (bad.start, bad.end) == (0, 56)


def test_event_exactly_at_the_limit_is_kept() -> None:
    stream = b"data: 1234\n\n"
    (event,) = decode(stream, max_event_size=len(stream))
    assert isinstance(event, SSEEvent)
    (bad,) = decode(stream, max_event_size=len(stream) - 1)
    assert isinstance(bad, Malformed)


@pytest.mark.parametrize("shape", [b"data: %s\n\n", b"event: e\r\ndata:%s\r\n\r\n", b": c\ndata: %s\n\n"])
def test_limit_applies_to_every_event_of_a_run(shape: bytes) -> None:
    small, big = shape % b"a", shape % b"bb"
    stream = small + big + small
    for chunks in (None, [1]):
        events = decode(stream, chunks, max_event_size=len(small))
        assert [type(e).__name__ for e in events] == ["SSEEvent", "Malformed", "SSEEvent"], chunks
        assert events[1].end - events[1].start == len(big)


def test_limit_counts_comments_before_an_event_in_its_span() -> None:
    comment = b": " + b"c" * 6 + b"\n\n"  # fits the limit alone, not with the event after it
    event = b"event: e\ndata: 1\n\n"
    stream = comment + event * 4
    for chunks in (None, [len(comment), 1000], [1]):
        events = decode(stream, chunks, max_event_size=len(event) + 5)
        assert [type(e).__name__ for e in events] == ["Malformed"] + ["SSEEvent"] * 3, chunks
        assert (events[0].start, events[0].end) == (0, len(comment) + len(event))


def test_an_id_or_retry_in_an_oversize_event_takes_effect_as_the_sse_rules_and_the_sdk_apply_it() -> None:
    """The event is skipped for its size; its id lasts beyond it (the last event ID buffer), and the
    app's SDK, which has no size limit, gives the events after it that id. Its data and type are
    dropped with it, and an id line over the limit itself is not kept."""
    from openai._streaming import SSEDecoder as SDKDecoder

    stream = b"id: 1\ndata: a\n\ndata: " + b"x" * 50 + b"\nid: 2\nretry: 300\nevent: big\n\ndata: b\n\n"
    assert [(e.data, e.id) for e in SDKDecoder().iter_bytes(iter([stream]))][-1] == ("b", "2")
    for chunks in (None, [1], [5], [len(stream) - 25, 1]):
        decoder = SSEDecoder(max_event_size=30)
        events = decode_with(decoder, stream, chunks or [len(stream)])
        assert triples(events) == [("message", "a", "1"), ("message", "b", "2")], chunks
        assert decoder.retry == 300 and decoder.last_event_id == "2"
    too_long = b"data: " + b"x" * 50 + b"\nid: " + b"9" * 40 + b"\n\ndata: b\n\n"
    for chunks in (None, [1], [7]):
        assert triples(decode(too_long, chunks, max_event_size=30)) == [("message", "b", "")]


def test_a_comment_line_that_holds_a_field_is_noted() -> None:
    """A cut inside a keep-alive comment, the next line joined to it: the SSE rules skip the
    line, the field with it. Keep-alive comments, and values that hold "data:", are not noted."""
    head = b": OPENROUTER PROCESSING\n\ndata: {\"a\": \"data: x\"}\n\n"
    fused = b": OPENROUTER PROCdata: {\"b\"}\n\n"
    stream = head + fused + b": kevent: e\n\ndata: [DONE]\n\n"
    for chunks in (None, [1], [7], [len(head) + 3, 1000]):
        for decoder in (SSEDecoder(), GeneralPathDecoder(), SSEDecoder(note_other_lines=True)):
            events = decode_with(decoder, stream, chunks or [len(stream)])
            assert triples(events) == [("message", '{"a": "data: x"}', ""), ("message", "[DONE]", "")]
            assert decoder.first_fused_comment == (1, len(head) + len(b": OPENROUTER PROC"), "data"), chunks
            assert decoder.fused_comment_count == 2
    plain = SSEDecoder()
    decode_with(plain, head * 3, [5])
    assert plain.first_fused_comment is None and plain.fused_comment_count == 0


# -- properties -----------------------------------------------------------------------

LINE_ENDS = st.sampled_from([b"\n", b"\r", b"\r\n"])
VALUE_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12
)


@st.composite
def sse_streams(draw) -> bytes:
    """Random event streams: fields in random order, random line ends, comments,
    data-less events, an optional BOM, sometimes a random byte-level tail."""
    parts = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 6))):
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["data", "data", "event", "id", "retry", "comment", "bare", "junk"]))
            value = draw(VALUE_TEXT).encode()
            line = {
                "data": b"data:" + draw(st.sampled_from([b"", b" ", b"  "])) + value,
                "event": b"event: " + value,
                "id": b"id: " + value,
                "retry": b"retry: " + draw(st.sampled_from([b"10", b"x1", b""])),
                "comment": b":" + value,
                "bare": draw(st.sampled_from([b"data", b"id", b"event"])),
                "junk": b"x-" + value + b": y",
            }[kind]
            parts.append(line + draw(LINE_ENDS))
        parts.append(draw(LINE_ENDS))
    parts.append(draw(st.binary(max_size=10)))
    return b"".join(parts)


@st.composite
def chunkings(draw) -> list[int]:
    return draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))


def check_tiling(events: list, stream: bytes) -> None:
    pos = 0
    for seq, event in enumerate(events):
        assert event.seq == seq
        assert event.start == pos and event.end >= event.start
        assert event.raw == stream[event.start : event.end]
        pos = event.end
    assert pos == len(stream)


@settings(max_examples=100)
@given(stream=sse_streams(), chunks=chunkings())
def test_any_chunking_gives_the_one_shot_result(stream: bytes, chunks: list[int]) -> None:
    whole = decode(stream)
    assert decode(stream, chunks) == whole
    check_tiling(whole, stream)


@settings(max_examples=100)
@given(stream=st.binary(max_size=200), chunks=chunkings())
def test_arbitrary_bytes_never_raise_and_tile(stream: bytes, chunks: list[int]) -> None:
    whole = decode(stream)
    assert decode(stream, chunks) == whole
    check_tiling(whole, stream)


@settings(max_examples=100)
@given(stream=sse_streams(), chunks=chunkings(), limit=st.integers(1, 40))
def test_oversize_handling_is_chunking_invariant(stream: bytes, chunks: list[int], limit: int) -> None:
    whole = decode(stream, max_event_size=limit)
    assert decode(stream, chunks, max_event_size=limit) == whole
    pos = 0
    for event in whole:
        assert event.start == pos
        pos = event.end
        if isinstance(event, Malformed) and isinstance(event.error, LongIdleRun):
            # comments or blank lines alone, cut off before the line that took them past the limit (a BOM's
            # 3 bytes join the first span unweighed)
            assert 0 < event.end - event.start <= max(limit, 3) and event.raw == b""
        elif isinstance(event, Malformed):
            assert event.end - event.start > limit and event.raw == b""
        else:
            assert event.end - event.start <= limit
    assert pos == len(stream)


@settings(max_examples=100)
@given(stream=sse_streams())
def test_one_byte_chunks(stream: bytes) -> None:
    assert decode(stream, [1]) == decode(stream)


# -- cut at every offset --------------------------------------------------------------

CONSTRUCTED_STREAM = (
    b"\xef\xbb\xbf: constructed Anthropic-style stream with every line-end kind\r\n\r\n"
    b'event: message_start\r\ndata: {"type":"message_start","message":{"id":"msg_1"}}\r\n\r\n'
    b"event: ping\ndata: {\"type\": \"ping\"}\n\n"
    b'event: content_block_delta\rdata: {"type":"content_block_delta","delta":{"text":"h\xc3\xa9"}}\r\r'
    b"id: 42\nretry: 300\n\n: keep-alive\n\n"
    b'event: content_block_delta\ndata: {"type":"content_block_delta",\ndata: "delta":{"text":"!"}}\n\n'
    b'event: message_stop\r\ndata: {"type":"message_stop"}\r\n\r\n'
)


def realistic_streams() -> list[tuple[str, bytes]]:
    found = shared_files("anthropic-sdk-python/streaming/*.txt")[:1] + shared_files("**/*.sse")[:1]
    streams = [(f"shared:{p.name}", p.read_bytes()[:6000]) for p in found]
    return streams + [("constructed", CONSTRUCTED_STREAM)]


@pytest.mark.parametrize("name,stream", realistic_streams(), ids=lambda v: v if isinstance(v, str) else "")
def test_cut_at_every_offset_yields_a_prefix_and_no_partial_event(name: str, stream: bytes) -> None:
    full = [e for e in decode(stream) if isinstance(e, SSEEvent)]
    assert full
    for cut in range(len(stream) + 1):
        events = decode(stream[:cut])
        assert b"".join(e.raw for e in events) == stream[:cut]
        dispatched = [e for e in events if isinstance(e, SSEEvent)]
        assert [decoded(e) for e in dispatched] == [decoded(e) for e in full[: len(dispatched)]], cut
        # never a partial event: each dispatched event is whole, blank line included;
        # only a cut between the CR and LF of a CRLF may end the last one a byte early
        # (a CR at the end of the stream is a line end of its own)
        for event, whole in zip(dispatched, full):
            assert event.raw == whole.raw or (
                event.end == cut == whole.end - 1 and whole.raw.endswith(b"\r\n")
            ), cut
        # and nothing complete is held back: the next full event did not fit in the cut
        if len(dispatched) < len(full):
            assert full[len(dispatched)].end > cut


def decoded(event: SSEEvent) -> tuple:
    return (event.seq, event.start, event.event, event.data, event.id, event.retry, event.invalid_utf8)


# -- an independent oracle for the fast paths -----------------------------------------


def reference_decode(stream: bytes) -> list[tuple]:
    """A plain whole-stream reading of the WHATWG rules, written straight from the spec
    (no incremental state, no fast paths): (event, data, id, start, end) per event."""
    pos = 3 if stream.startswith(b"\xef\xbb\xbf") else 0
    events, data, event_type, last_id, span_start = [], [], "", "", 0
    for m in re.finditer(rb"\r\n|\r|\n", stream):
        line, pos = stream[pos : m.start()], m.end()
        if not line:
            if data:
                events.append((event_type or "message", "\n".join(data), last_id, span_start, pos))
                span_start = pos
            data, event_type = [], ""
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        text = value.decode("utf-8", "replace")
        if name == b"data":
            data.append(text)
        elif name == b"event":
            event_type = text
        elif name == b"id" and b"\0" not in value:
            last_id = text
    return events


@st.composite
def provider_streams(draw) -> bytes:
    """Streams shaped like real providers (runs of event+data or data-only events, one
    line-end style) with occasional oddities that force the slow path."""
    end = draw(st.sampled_from([b"\n", b"\r\n", b"\n", b"\r\n", b"\r"]))
    shapes = st.sampled_from(
        ["event", "event", "data", "data", "comment", "id", "multi", "nospace", "nospace-data", "blank"]
    )
    parts = []
    for i in range(draw(st.integers(0, 30))):
        payload = b'{"i":%d,"t":"%s"}' % (i, draw(VALUE_TEXT).encode())
        shape = draw(shapes)
        block = {
            "event": [b"event: t" + str(i % 3).encode(), b"data: " + payload],
            "data": [b"data: " + payload],
            "comment": [b": keep-alive"],
            "id": [b"id: " + str(i).encode(), b"data: " + payload],
            "multi": [b"data: a", b"data: " + payload],
            "nospace": [b"event:x", b"data:" + payload],
            "nospace-data": [b"data:" + payload],
            "blank": [],
        }[shape]
        parts.append(b"".join(line + end for line in block) + end)
    return b"".join(parts) + draw(st.sampled_from([b"", b"data: cut", b"event: x" + end]))


@settings(max_examples=100)
@given(stream=provider_streams(), chunks=st.lists(st.sampled_from([1, 2, 3, 50, 300, 1500, 4096]), min_size=1, max_size=4))
def test_fast_paths_agree_with_a_plain_reading_of_the_spec(stream: bytes, chunks: list[int]) -> None:
    expected = reference_decode(stream)
    for events in (decode(stream), decode(stream, chunks)):
        got = [(e.event, e.data, e.id, e.start, e.end) for e in events if isinstance(e, SSEEvent)]
        assert got == expected
        check_tiling(events, stream)


@settings(max_examples=100)
@given(stream=provider_streams(), chunks=st.lists(st.sampled_from([1, 7, 50, 300, 1500]), min_size=1, max_size=4))
def test_every_event_is_dispatched_by_the_read_that_completes_it(stream: bytes, chunks: list[int]) -> None:
    """A proxy must not sit on finished events: after each read, exactly the events the
    bytes so far complete have come out (a final CR may be the first half of a CRLF,
    so it cannot end a line yet)."""
    decoder = SSEDecoder()
    got: list = []
    pos = i = 0
    while pos < len(stream):
        pos += chunks[i % len(chunks)]
        i += 1
        got += [e for e in decoder.feed(stream[pos - chunks[(i - 1) % len(chunks)] : pos]) if isinstance(e, SSEEvent)]
        seen = stream[:pos]
        expected = reference_decode(seen[:-1] if seen.endswith(b"\r") else seen)
        assert [(e.event, e.data, e.id, e.start, e.end) for e in got] == expected


# -- the shortcuts against the general line-by-line path -------------------------------


class GeneralPathDecoder(SSEDecoder):
    """The same decoder with every shortcut off: each byte takes the line-by-line path."""

    _shortcuts = False


class PythonLoopDecoder(SSEDecoder):
    """The shortcuts on, the fastest one run in Python rather than by the compiled loop."""

    _compiled_run = None


@st.composite
def lf_streams(draw) -> bytes:
    """Mostly the LF-only shape the fastest path takes, with the oddities that must send it
    back to the general path: a CR, a comment, an id, two data lines, no space after the
    colon, a stray blank line, invalid UTF-8 (in a comment too), an empty type, a value with a
    leading space."""
    parts = [b"\xef\xbb\xbf"] if draw(st.integers(0, 9)) == 0 else []
    for i in range(draw(st.integers(0, 25))):
        value = draw(VALUE_TEXT).encode()
        shape = draw(st.sampled_from(
            ["typed", "typed", "typed", "data", "data", "data", "cr", "comment", "id", "retry", "two-data",
             "nospace", "blank", "bad-utf8", "bad-comment", "bad-retry", "empty-type", "spaced", "junk",
             "id-then-comment", "dataless", "fused-comment",
             "new-type", "bad-type", "long-type"]
        ))  # fmt: skip
        parts.append({
            "typed": b"event: t%d\ndata: %s\n\n" % (i % 3, value),
            "data": b"data: %s\n\n" % value,
            "cr": b"data: %s\r\n\r\n" % value,
            "comment": b": keep-alive\n\n",
            "id": b"id: %d\ndata: %s\n\n" % (i, value),
            "retry": b"retry: 5\nevent: r\ndata: %s\n\n" % value,
            "two-data": b"data: a\ndata: %s\n\n" % value,
            "nospace": b"event:x\ndata:%s\n\n" % value,
            "blank": b"\n",
            "bad-utf8": b"data: \xff%s\n\n" % value,
            "bad-comment": b": keep-alive \xff\n\n",
            "bad-retry": b"retry: 1\xff\nevent: r\ndata: %s\n\n" % value,
            "empty-type": b"event: \ndata: %s\n\n" % value,
            "spaced": b"event:  t\ndata:  %s\n\n" % value,
            "junk": b"x: %s\n" % value,
            "id-then-comment": b"id: %d\ndata: %s\n\n: keep-alive\n\n" % (i, value),
            "dataless": b"event: error\n\n",
            "fused-comment": b": keep-alivdata: %s\n\n" % value,
            # types the decoder has not named yet, and ones it never keeps named (not UTF-8, long)
            "new-type": b"event: fresh%d\ndata: %s\n\n" % (draw(st.integers(0, 10**9)), value),
            "bad-type": b"event: t\xff\ndata: %s\n\n" % value,
            "long-type": b"event: %s\ndata: %s\n\n" % (b"L" * 70, value),
        }[shape])  # fmt: skip
    return b"".join(parts) + draw(st.sampled_from([b"", b"data: cut", b"event: x\n", b"data: x\n"]))


def decode_with(decoder: SSEDecoder, stream: bytes, chunks: list[int]) -> list:
    return feed_cycled(decoder, stream, chunks)


@settings(max_examples=300)
@given(
    stream=st.one_of(lf_streams(), provider_streams(), sse_streams()),
    chunks=st.lists(st.sampled_from([1, 2, 3, 5, 9, 50, 137, 300, 1500, 4096, 16384]), min_size=1, max_size=5),
    limit=st.sampled_from([16 * 1024 * 1024, 16 * 1024 * 1024, 40, 100, 300]),
)
def test_shortcuts_give_what_the_general_path_gives(stream: bytes, chunks: list[int], limit: int) -> None:
    """Every field of every event, tail and error, for any chunking and size limit; the compiled
    loop runs first, with no event type named yet, so it also meets types it must hand back."""
    forget_type_names()
    compiled = decode_noting(SSEDecoder(max_event_size=limit), stream, chunks)
    general = decode_noting(GeneralPathDecoder(max_event_size=limit), stream, [len(stream) or 1])
    assert compiled == general and classes(compiled[0]) == classes(general[0])
    assert decode_noting(GeneralPathDecoder(max_event_size=limit), stream, chunks) == general
    assert decode_noting(SSEDecoder(max_event_size=limit), stream, [len(stream) or 1]) == general
    assert decode_noting(PythonLoopDecoder(max_event_size=limit), stream, chunks) == general


def complete_lines_not_utf8(stream: bytes) -> int:
    """A plain reading of what the SDKs refuse: every complete line, decoded on its own."""
    lines = re.split(rb"\r\n|\r|\n", stream)[:-1]
    return sum(line.decode("utf-8", "replace").count("\ufffd") - line.count("\ufffd".encode()) for line in lines)


@settings(max_examples=200)
@given(stream=st.one_of(sse_streams(), lf_streams()), chunks=chunkings())
def test_the_stream_count_is_every_complete_line_that_is_not_utf8(stream: bytes, chunks: list[int]) -> None:
    """Whatever line holds them, and whether or not an event follows."""
    for decoder in (SSEDecoder(), GeneralPathDecoder()):
        feed_cycled(decoder, stream, chunks)
        assert decoder.invalid_utf8 == complete_lines_not_utf8(stream)


def forget_type_names() -> None:
    """Empty the decoders' shared cache of event names, as a fresh process has it."""
    names = sse_module._type_names
    names.clear()
    names[b""] = "message"


def classes(events: list) -> list:
    """Each event's class and its fields' classes: equal named tuples may still be different things."""
    return [(type(event), tuple(map(type, event))) for event in events]


def decode_noting(decoder: SSEDecoder, stream: bytes, chunks: list[int]) -> tuple:
    """The events, and what the decoder noted of the blank lines the SDKs dispatch on and of the
    comment lines that hold a field."""
    events = feed_cycled(decoder, stream, chunks)
    return (events, decoder.empty_dispatches, decoder.empty_dispatch_count, decoder.first_fused_comment,
            decoder.fused_comment_count)


def test_the_lf_shortcut_takes_the_common_shapes() -> None:
    """The differential test above means something only if the shortcuts run: a plain
    LF-only stream, fed in pieces of any size, never takes the line-by-line path."""
    stream = b"".join(
        b"event: content_block_delta\ndata: {\"i\": %d}\n\n" % i if i % 2 else b"data: {\"i\": %d}\n\n" % i
        for i in range(200)
    )

    class ShortcutOnly(SSEDecoder):
        def _lines(self, work: bytes, final: bool, out: list) -> None:
            if work and not final:
                raise AssertionError(f"line-by-line path taken for {work[:40]!r}")
            super()._lines(work, final, out)

    class PythonShortcutOnly(ShortcutOnly):
        _compiled_run = None

    expected = decode_with(GeneralPathDecoder(), stream, [len(stream)])
    assert len(expected) == 200
    one_per_read = [len(event.raw) for event in expected]  # as a proxy relays them
    for reads in ([1500], one_per_read, [7, 300, 16384]):
        assert decode_with(ShortcutOnly(), stream, reads) == expected
        assert decode_with(PythonShortcutOnly(), stream, reads) == expected


def test_the_compiled_loop_dispatches_the_common_shapes() -> None:
    """And the compiled loop, where this install has it, is what takes them (the Python loop
    beside it then only names a new event type)."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    dispatched = []

    def counting_run(*args):
        events = accel.sse_lf_events(*args)
        if isinstance(events, list):
            dispatched.extend(events)
        return events

    class Counted(SSEDecoder):
        _compiled_run = staticmethod(counting_run)

    stream = b"".join(b"event: content_block_delta\ndata: {\"i\": %d}\n\n" % i for i in range(300))
    forget_type_names()
    events = decode_with(Counted(), stream, [1500])
    assert events == decode_with(GeneralPathDecoder(), stream, [len(stream)])
    # the first read names the type (the compiled loop handed it back); every later one is compiled
    first = next(i for i, event in enumerate(events) if event.end > 1500)
    assert dispatched == events[first:]


class PythonFeedDecoder(SSEDecoder):
    feed = SSEDecoder._feed  # what the compiled feed stands in for


def feed_alongside(compiled, python, stream: bytes, chunks: list[int]) -> None:
    """Both decoders fed the same reads: the same events from each read, and the same state after it."""
    pos = i = 0
    while pos < len(stream):
        piece = stream[pos : pos + chunks[i % len(chunks)]]
        assert compiled.feed(piece) == python.feed(piece)
        assert (compiled.offset, compiled._buf, compiled._buf_room, compiled._quick, compiled._between_events) == (
            python.offset, python._buf, python._buf_room, python._quick, python._between_events
        )
        pos, i = pos + len(piece), i + 1
    assert compiled.close() == python.close()


@settings(max_examples=300)
@given(
    stream=st.one_of(lf_streams(), provider_streams(), sse_streams()),
    chunks=st.lists(st.sampled_from([1, 1, 2, 3, 7, 50, 300]), min_size=1, max_size=4),
    limit=st.sampled_from([16 * 1024 * 1024, 40, 100, 300]),
)
def test_the_compiled_feed_gives_what_the_python_feed_gives(stream: bytes, chunks: list[int], limit: int) -> None:
    """Read by read, for any chunking and size limit: the compiled feed appends a read only where
    ``_feed`` would have appended it and returned nothing."""
    compiled, python = SSEDecoder(max_event_size=limit), PythonFeedDecoder(max_event_size=limit)
    feed_alongside(compiled, python, stream, chunks)
    assert (compiled.empty_dispatches, compiled.empty_dispatch_count) == (python.empty_dispatches, python.empty_dispatch_count)


def test_the_compiled_feed_takes_reads_that_end_no_event() -> None:
    """One-byte reads of a provider's stream enter Python only at the first byte and at the line
    end that ends each event: the differential test above compares something only if the compiled
    feed takes the rest."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    entered = []

    class Counted(SSEDecoder):
        def _feed(self, data: bytes) -> list:
            entered.append(data)
            return super()._feed(data)

    stream = b"".join(b"event: content_block_delta\ndata: {\"i\": %d, \"text\": \"some words\"}\n\n" % i for i in range(100))
    events = feed_cycled(Counted(), stream, [1])
    assert events == decode(stream)
    assert entered[0] == stream[:1] and set(entered[1:]) == {b"\n"} and len(entered) == 1 + stream.count(b"\n\n")


def test_the_compiled_feed_stops_at_the_event_size_limit() -> None:
    """An event that never ends, in one-byte reads: the compiled feed appends no further than
    ``_feed`` would, which drops the event at the read that crosses the limit (memory stays bounded)."""
    stream = b"data: one\n\ndata: " + b"x" * 500
    compiled, python = SSEDecoder(max_event_size=100), PythonFeedDecoder(max_event_size=100)
    feed_alongside(compiled, python, stream, [1])
    decoder = SSEDecoder(max_event_size=100)
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        assert len(decoder._buf) <= 100


@pytest.mark.parametrize("chunk", [1, 7, 300])
def test_the_compiled_feed_keeps_a_long_event_of_many_lines_no_further_than_python(chunk: int) -> None:
    """Between events, the compiled feed holds lines of an unfinished event whole only up to the
    4 KiB ``_feed`` holds them; past that the line path takes them, in both alike."""
    line = b"data: " + b"w" * 1000 + b"\n"
    stream = b"data: first\n\nevent: long\n" + line * 6 + b"\n" + b"data: after\n\n"
    compiled, python = SSEDecoder(), PythonFeedDecoder()
    feed_alongside(compiled, python, stream, [chunk])
    assert [event.data for event in decode(stream, [chunk])] == ["first", "\n".join(["w" * 1000] * 6), "after"]


def test_the_compiled_feed_holds_an_unfinished_event_up_to_exactly_4_kib() -> None:
    """The line end that takes a held event one byte past ``_HOLD`` goes to the line path, as in ``_feed``."""
    stream = b"data: a\n\n" + b"data: " + b"w" * 4090 + b"\n" + b"data: b\n\n"
    feed_alongside(SSEDecoder(), PythonFeedDecoder(), stream, [9, 4096, 1, 100])


def test_the_compiled_feeds_mirror_the_python_constants() -> None:
    """The C gates repeat a few of the decoders' constants: they must be the same numbers."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    from streamtap.wire import _accel
    from streamtap.wire import eventstream

    assert (_accel.SSE_HOLD, _accel.PRELUDE_LENGTH, _accel.MIN_MESSAGE_LENGTH, _accel.MAX_HEADERS_LENGTH,
            _accel.MAX_PAYLOAD_LENGTH) == (sse_module._HOLD, eventstream.PRELUDE_LENGTH, eventstream.MIN_MESSAGE_LENGTH,
                                           eventstream.MAX_HEADERS_LENGTH, eventstream.MAX_PAYLOAD_LENGTH)


def fed_a_first_read(decoder_class: type) -> SSEDecoder | EventStreamDecoder:
    """A decoder past its first read, which Python takes: the reads of ``SHORT_READS``, which
    complete nothing, then go to its compiled feed."""
    decoder = decoder_class()
    decoder.feed(b"data: a\n\n" if decoder_class is SSEDecoder else b"\x00")
    return decoder


SHORT_READS = [pytest.param(SSEDecoder, b"par", b"tial", id="sse"), pytest.param(EventStreamDecoder, b"\x00", b"\x00", id="event-stream")]


@pytest.mark.parametrize(("decoder_class", "read", "next_read"), SHORT_READS)
def test_the_empty_list_a_caller_holds_or_filled_is_never_given_again(decoder_class, read, next_read) -> None:
    """The compiled feed gives its empty list of events again only once the caller let go of it
    and left it empty: a list still held, or filled, is the caller's."""
    decoder = fed_a_first_read(decoder_class)
    held = decoder.feed(read)
    filled = decoder.feed(next_read)
    assert filled == [] and filled is not held
    filled.append("dropped filled")
    del filled
    assert decoder.feed(next_read) == [] and held == []


@pytest.mark.parametrize(("decoder_class", "read", "next_read"), SHORT_READS)
def test_the_compiled_feed_gives_its_empty_list_again_once_let_go(decoder_class, read, next_read) -> None:
    """A 1-byte read costs a new list less: the one freed by the caller comes back."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    decoder = fed_a_first_read(decoder_class)
    first = id(decoder.feed(read))
    taken = []  # a list freed at the line above would be made again here (CPython keeps freed lists for reuse)
    assert id(decoder.feed(next_read)) == first and id(taken) != first


@pytest.mark.parametrize(("decoder_class", "read", "next_read"), SHORT_READS)
def test_a_decoder_inside_its_own_empty_list_is_collected(decoder_class, read, next_read) -> None:
    """The compiled feed keeps the empty list it gave; the garbage collector sees that reference,
    so a cycle through it (a caller storing the decoder in the list) is freed."""
    decoder = fed_a_first_read(decoder_class)
    decoder.feed(read).append(decoder)  # the list is dropped filled: the decoder keeps it, and the list the decoder
    gone = weakref.ref(decoder)
    del decoder
    gc.collect()
    assert gone() is None


def test_an_event_size_limit_beyond_any_length_is_kept() -> None:
    """The compiled base keeps the room left for an event in a machine word: a larger limit means no limit."""
    stream = b"data: x\n\n" * 3 + b"data: unfinished"
    assert decode(stream, [1], max_event_size=1 << 70) == decode(stream)
    # and a room below any length: every read is over it, as in Python (no wrap-around in C)
    compiled, python = SSEDecoder(), PythonFeedDecoder()
    for decoder in (compiled, python):
        decoder.feed(b"data: x\n\ndata: y")
        decoder._buf_room = -(1 << 70)
    feed_alongside(compiled, python, b"yy\n\ndata: z\n\n", [1])


@pytest.mark.parametrize("limit", [1e6, "100"])
def test_an_event_size_limit_that_is_no_int_is_refused(limit) -> None:
    """In both builds alike (the compiled base keeps the limit as an int)."""
    from streamtap.wire import EventStreamDecoder

    for decoder in (SSEDecoder, EventStreamDecoder):
        with pytest.raises(TypeError):
            decoder(limit)


def test_a_copied_decoder_goes_on_alone() -> None:
    """copy.deepcopy, as fault positions and prefix probes take it mid-stream: the compiled base's
    fields are copied too, and the copy shares no buffer with the original."""
    import copy

    stream, rest, other = b"event: a\ndata: one\n\ndata: tw", b"o\n\ndata: three\n\n", b"x\n\n"
    decoder = SSEDecoder()
    first = decoder.feed(stream)
    twin = copy.deepcopy(decoder)
    assert twin._buf == decoder._buf and twin._buf is not decoder._buf
    assert (twin._buf_room, twin._quick, twin._between_events) == (decoder._buf_room, decoder._quick, decoder._between_events)
    mine = decoder.feed(other) + decoder.close()  # the original goes on first, elsewhere
    assert first + twin.feed(rest) + twin.close() == decode(stream + rest)
    assert first + mine == decode(stream + other)


def test_the_compiled_loops_are_built() -> None:
    """The project's own install compiles them: a build that silently left them out would
    leave the differential tests above comparing the Python loop with itself."""
    if accel.pure_python_asked:
        pytest.skip(compiled_loops_missing())
    assert accel.compiled, compiled_loops_missing()
    from streamtap.wire import _accel

    source = Path(accel.__file__).with_name("_accel.c")
    if source.exists():  # a checkout: the module built from it must not be older (make reinstalls)
        assert Path(_accel.__file__).stat().st_mtime >= source.stat().st_mtime, (
            "streamtap/wire/_accel.c changed after its module was built: run `make .venv/.installed` (or make test)"
        )


# -- the lines a client that reads only "data: " lines would trip on -------------------------------


def other_lines_by_reading(stream: bytes) -> list[tuple[int, bytes]]:
    """A plain reading: every complete line (after one leading BOM) that is neither blank nor a
    ``data: `` line, with its offset."""
    pos = 3 if stream.startswith(b"\xef\xbb\xbf") else 0
    found = []
    for match in re.finditer(rb"([^\r\n]*)(\r\n|\r|\n)", stream[pos:]):
        line = match.group(1)
        if line and not line.startswith(b"data: "):
            found.append((pos + match.start(), line))
    return found


@settings(max_examples=150)
@given(stream=sse_streams(), chunks=chunkings())
def test_other_lines_are_every_line_but_blank_and_data_lines(stream: bytes, chunks: list[int]) -> None:
    decoder = SSEDecoder(note_other_lines=True)
    events = feed_cycled(decoder, stream, chunks)
    expected = other_lines_by_reading(stream)
    assert decoder.other_line_count == len(expected)
    assert [(offset, line) for _, offset, line in decoder.other_lines] == expected[:256]  # streams here are small
    assert events == decode(stream)  # noting changes nothing else
    assert SSEDecoder().other_lines == []  # and is off unless asked for


def test_streamtap_pure_python_runs_the_python_loops() -> None:
    """STREAMTAP_PURE_PYTHON=1 leaves the compiled loops out, and the decoders give the same events."""
    import subprocess
    import sys

    program = (
        "from streamtap.wire import SSEDecoder, EventStreamDecoder, accel, encode_message\n"
        "assert not accel.compiled and SSEDecoder._compiled_run is None and EventStreamDecoder._compiled_frames is None\n"
        "assert SSEDecoder.feed is SSEDecoder._feed and EventStreamDecoder.feed is EventStreamDecoder._feed\n"
        "sse = b''.join(b'event: e\\ndata: %d\\n\\n' % i for i in range(50))\n"
        "body = b''.join(encode_message({':event-type': 'chunk'}, b'%d' % i) for i in range(50))\n"
        "print(repr((SSEDecoder().feed(sse), EventStreamDecoder().feed(body))))\n"
    )
    env = {**os.environ, "STREAMTAP_PURE_PYTHON": "1"}
    pure = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert pure.returncode == 0, pure.stderr
    from streamtap.wire import EventStreamDecoder, encode_message

    sse = b"".join(b"event: e\ndata: %d\n\n" % i for i in range(50))
    body = b"".join(encode_message({":event-type": "chunk"}, b"%d" % i) for i in range(50))
    assert pure.stdout.strip() == repr((SSEDecoder().feed(sse), EventStreamDecoder().feed(body)))


def compiled_run(work: bytes, **state):
    """accel.sse_lf_events on ``work`` (up to its last blank line) with a fresh decoder's state."""
    fields = {"seq": 0, "span_start": 0, "offset": 0, "before": 0, "limit": 1 << 24, "last_event_id": "",
              "span_retry": None, "prefix": b""} | state
    done = work.rfind(b"\n\n") + 2
    return accel.sse_lf_events(
        work, done, fields["seq"], fields["span_start"], fields["offset"], fields["before"], fields["limit"],
        fields["last_event_id"], fields["span_retry"], fields["prefix"], sse_module._type_names, SSEEvent,
    )


def test_the_compiled_loop_keeps_its_contract() -> None:
    """A list of events for the common shapes, False for a type not named yet, None for what the
    Python fast path would refuse too."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    forget_type_names()
    work = b"event: a\ndata: one\n\ndata: two\n\nevent: a\ndata: x"
    assert compiled_run(work) is False  # "a" is not named yet
    sse_module._type_name(b"a")
    # 4 bytes of the first span (a comment) came in an earlier read: they lead its raw bytes
    events = compiled_run(work, seq=7, span_start=96, offset=100, last_event_id="id9", span_retry=3000, prefix=b": c\n")
    assert events == [
        SSEEvent(7, 96, 120, b": c\nevent: a\ndata: one\n\n", "a", "one", "id9", 3000, 0),
        SSEEvent(8, 120, 131, b"data: two\n\n", "message", "two", "id9", None, 0),
    ]
    assert classes(events) == classes([SSEEvent(0, 0, 0, b"", "", "", "", 0, 0), SSEEvent(0, 0, 0, b"", "", "", "", None, 0)])
    for refused in (b"data: a\n\n: c\n\n", b"data:x\n\n", b"data: \xff\n\n", b"event: a\n\n", b"id: 1\ndata: a\n\n"):
        assert compiled_run(refused) is None, refused
    assert compiled_run(b"data: 12345\n\n", limit=12) is None  # oversize: the line path reports it
    assert compiled_run(b"data: 12345\n\n", limit=13) is not None
    assert compiled_run(b"data: 1\n\n", before=5, limit=12) is None  # the span began in an earlier read


@pytest.mark.parametrize("limit", [2**63, 2**64 + 5, 10**30])
def test_a_limit_beyond_64_bits_decodes_as_no_limit(limit: int) -> None:
    """Python ints have no range; the compiled loop must not bring one in (a recording's header can
    carry any max_event_size)."""
    stream = b"event: e\ndata: hi\n\n" * 5
    assert decode_with(SSEDecoder(max_event_size=limit), stream, [7]) == decode_with(SSEDecoder(), stream, [7])
    assert decode_with(PythonLoopDecoder(max_event_size=limit), stream, [7]) == decode_with(SSEDecoder(), stream, [7])


@pytest.mark.parametrize("idle", [b": keep-alive\n", b"\n", b":\r\n"], ids=["comments", "blank lines", "crlf comments"])
def test_keep_alives_alone_past_the_limit_are_no_oversize_event(idle):
    """Comments and blank lines belong to the next event's span, and were weighed with it: a run
    of keep-alives past the limit made the event after them oversize, skipped to the next blank
    line (with comments, that event too), and the stream judged corrupt. They are reported apart,
    the span starts again before the line that took it past the limit, and the event is decoded."""
    limit = 100
    body = b"data: one\n\n" + idle * (3 * limit // len(idle)) + b"data: two\n\n"
    for chunks in ([len(body)], [1], [7, 3]):
        events = decode(body, chunks, max_event_size=limit)
        assert [e.data for e in events if isinstance(e, SSEEvent)] == ["one", "two"], (chunks, events)
        idle_runs = [e for e in events if isinstance(e, Malformed)]
        assert idle_runs and all(isinstance(e.error, LongIdleRun) and not e.fatal for e in idle_runs), idle_runs
        assert [(e.start, e.end) for e in events] == [(e.start, e.end) for e in decode(body, max_event_size=limit)]
