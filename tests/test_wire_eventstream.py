"""AWS event-stream decoder and encoder.

Oracles: botocore's EventStreamBuffer (what the AWS SDK accepts and rejects), crcmod
(an independent CRC-32), the official AWS codec vectors and the real Bedrock bodies
in ../shared/fixtures.
"""

from __future__ import annotations

import base64
import copy
import json
import pickle
import struct
import uuid
import zlib
from datetime import UTC, datetime

import crcmod.predefined
import pytest
from botocore import eventstream as boto
from conftest import chunked, compiled_loops_missing, feed_cycled, shared_files, shared_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtap.wire import (
    DuplicateHeader,
    EventStreamDecoder,
    EventStreamMessage,
    FramingError,
    Int8,
    Int16,
    Int32,
    Int64,
    InvalidHeaders,
    InvalidMessageLength,
    Malformed,
    MessageCRCMismatch,
    OversizeError,
    PreludeCRCMismatch,
    Tail,
    Timestamp,
    accel,
    encode_message,
)

crc32_oracle = crcmod.predefined.mkCrcFun("crc-32")

BEDROCK_BODIES = shared_files("*/bodies/**/*.bin")
CHUNK_SIZES = [1, 16, 64, 256, 1024, 4096, None]


def decode(data: bytes, chunk_size: int | None = None, **options) -> list:
    decoder = EventStreamDecoder(**options)
    events = []
    for chunk in chunked(data, chunk_size or max(len(data), 1)):
        events += decoder.feed(chunk)
    return events + decoder.close()


def decode_split(data: bytes, cuts: list[int]) -> list:
    decoder = EventStreamDecoder()
    events, last = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += decoder.feed(data[last:cut])
        last = cut
    return events + decoder.close()


def frame(total: int, headers_length: int, body: bytes) -> bytes:
    """A message with whatever prelude fields we choose and both CRCs made valid."""
    prelude = struct.pack(">II", total, headers_length)
    prelude += struct.pack(">I", zlib.crc32(prelude))
    return prelude + body + struct.pack(">I", zlib.crc32(prelude + body))


def type_code(value) -> int:
    if isinstance(value, bool):
        return 0 if value else 1
    for wrapper in (Int8, Int16, Int32, Int64, Timestamp):
        if type(value) is wrapper:
            return wrapper.type_code
    return {bytes: 6, str: 7, uuid.UUID: 9}[type(value)]


def assert_tiles(data: bytes, events: list) -> None:
    """The spans cover the stream exactly; only a stopped decoder's Tail may keep less than its
    span (the bytes past the limit that came after the error, which it counts, not keeps)."""
    offset = 0
    for seq, event in enumerate(events):
        assert (event.seq, event.start) == (seq, offset)
        if isinstance(event, Tail) and "not kept" in event.reason:
            assert data[event.start : event.end].startswith(event.raw) and len(event.raw) < event.end - event.start
        else:
            assert event.raw == data[event.start : event.end]
        offset = event.end
    assert offset == len(data)


def assert_crcs_by_oracle(message: EventStreamMessage) -> None:
    raw = message.raw
    total, headers_length, prelude_crc = struct.unpack(">III", raw[:12])
    assert total == len(raw)
    assert prelude_crc == crc32_oracle(raw[:8])
    assert struct.unpack(">I", raw[-4:])[0] == crc32_oracle(raw[:-4])


# -- the official AWS codec vectors ------------------------------------------------------

VECTOR_NAMES = ["all_headers", "empty_message", "int32_header", "payload_no_headers", "payload_one_str_header"]
NEGATIVE_NAMES = ["corrupted_header_len", "corrupted_headers", "corrupted_length", "corrupted_payload"]
DOCUMENTED_ERRORS = {
    "Prelude checksum mismatch": PreludeCRCMismatch,
    "Message checksum mismatch": MessageCRCMismatch,
}


def signed32(value: int) -> int:
    return struct.unpack(">i", struct.pack(">I", value))[0]


@pytest.mark.parametrize("name", VECTOR_NAMES)
@pytest.mark.parametrize("chunk_size", [1, None])
def test_positive_vector_decodes_to_documented_values(name, chunk_size):
    data = shared_path("fixtures", "aws-sdk-go", "encoded", "positive", name).read_bytes()
    expected = json.loads(shared_path("fixtures", "aws-sdk-go", "decoded", "positive", name).read_text())
    [message] = decode(data, chunk_size)
    assert isinstance(message, EventStreamMessage)
    total, headers_length, prelude_crc = struct.unpack(">III", message.raw[:12])
    assert (total, headers_length) == (expected["total_length"], expected["headers_length"])
    assert signed32(prelude_crc) == expected["prelude_crc"]
    assert signed32(struct.unpack(">I", message.raw[-4:])[0]) == expected["message_crc"]
    assert message.payload == base64.b64decode(expected["payload"])
    decoded = []
    for name_, value in message.headers.items():
        if isinstance(value, str):
            value = base64.b64encode(value.encode()).decode()
        elif isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        elif isinstance(value, uuid.UUID):
            value = base64.b64encode(value.bytes).decode()
        decoded.append({"name": name_, "type": type_code(message.headers[name_]), "value": value})
    assert decoded == expected["headers"]
    assert_crcs_by_oracle(message)
    assert encode_message(message.headers, message.payload) == data


@pytest.mark.parametrize("name", NEGATIVE_NAMES)
@pytest.mark.parametrize("chunk_size", [1, 7, None])
def test_negative_vector_fails_with_documented_error(name, chunk_size):
    data = shared_path("fixtures", "aws-sdk-go", "encoded", "negative", name).read_bytes()
    documented = shared_path("fixtures", "aws-sdk-go", "decoded", "negative", name).read_text().strip()
    events = decode(data, chunk_size)
    assert isinstance(events[0], Malformed) and events[0].fatal
    assert type(events[0].error) is DOCUMENTED_ERRORS[documented]
    assert all(isinstance(event, Tail) for event in events[1:])
    assert_tiles(data, events)


def test_corrupted_length_is_rejected_without_waiting_for_more_bytes():
    # The vector claims 62 bytes and holds 61: the prelude CRC must fail at once.
    data = shared_path("fixtures", "aws-sdk-go", "encoded", "negative", "corrupted_length").read_bytes()
    decoder = EventStreamDecoder()
    [event] = decoder.feed(data[:12])
    assert isinstance(event.error, PreludeCRCMismatch) and event.error.offset == 8
    assert decoder.feed(data[12:]) == []
    [tail] = decoder.close()
    assert (tail.start, tail.end, tail.reason) == (12, 61, "decoder stopped at an error")


# -- the real Bedrock bodies --------------------------------------------------------------


def body_id(path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.fixture(scope="module")
def bedrock_bodies():
    if not BEDROCK_BODIES:
        shared_path("fixtures")
    assert len(BEDROCK_BODIES) == 24
    return {body_id(path): path.read_bytes() for path in BEDROCK_BODIES}


def test_every_bedrock_body_decodes_completely_at_every_chunk_size(bedrock_bodies):
    for name, data in bedrock_bodies.items():
        whole = decode(data)
        assert whole and all(isinstance(event, EventStreamMessage) for event in whole), name
        assert_tiles(data, whole)
        for message in whole:
            assert_crcs_by_oracle(message)
            assert message.headers[":message-type"] == "event"
            assert encode_message(message.headers, message.payload) == message.raw
        for size in CHUNK_SIZES[:-1]:
            assert decode(data, size) == whole, (name, size)


def test_bedrock_bodies_match_botocore(bedrock_bodies):
    for name, data in bedrock_bodies.items():
        ours = [(event.headers, event.payload) for event in decode(data, 1024)]
        assert ours == botocore_decode(data, [1024 * i for i in range(1, len(data) // 1024 + 1)])[0], name


def test_cut_at_every_offset_yields_exactly_a_prefix(bedrock_bodies):
    data = bedrock_bodies["bodies/invoke_stream_with_content__anthropic.claude.0.bin"]
    whole = decode(data)
    assert len(whole) > 5
    for cut in range(len(data) + 1):
        events = decode(data[:cut])
        complete = [message for message in whole if message.end <= cut]
        assert events[: len(complete)] == complete
        rest = events[len(complete) :]
        if complete and complete[-1].end == cut or cut == 0:
            assert rest == []
        else:
            [tail] = rest
            assert isinstance(tail, Tail) and tail.end == cut
            assert tail.raw == data[tail.start : cut]
            needed = whole[len(complete)].end - whole[len(complete)].start
            have = cut - tail.start
            if have < 12:
                assert tail.reason == f"prelude needs 12 bytes, {have} arrived"
            else:
                assert tail.reason == f"message needs {needed} bytes, {have} arrived"


# -- botocore as an oracle on generated streams --------------------------------------------

header_names = st.text(min_size=0, max_size=12).filter(lambda name: len(name.encode()) <= 255)
header_values = st.one_of(
    st.booleans(),
    st.integers(-(2**7), 2**7 - 1).map(Int8),
    st.integers(-(2**15), 2**15 - 1).map(Int16),
    st.integers(-(2**31), 2**31 - 1).map(Int32),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.binary(max_size=40),
    st.text(max_size=40),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    st.uuids(),
)
messages = st.tuples(
    st.dictionaries(header_names, header_values, max_size=6), st.binary(max_size=200)
)
streams = st.lists(messages, min_size=1, max_size=5)


def botocore_decode(data: bytes, cuts: list[int]):
    """(messages, exception or None) as botocore's EventStreamBuffer sees them."""
    buffer = boto.EventStreamBuffer()
    found, last = [], 0
    try:
        for cut in sorted(set(cuts)) + [len(data)]:
            buffer.add_data(data[last:cut])
            last = cut
            for message in buffer:
                found.append((message.headers, message.payload))
    except Exception as error:  # botocore raises assorted types; the test maps them
        return found, error
    return found, None


def comparable(headers: dict) -> dict:
    # botocore hands out a uuid as its 16 bytes; every other value compares as is.
    return {name: value.bytes if isinstance(value, uuid.UUID) else value for name, value in headers.items()}


def our_error_for(botocore_error: Exception) -> tuple[type[FramingError], ...]:
    if isinstance(botocore_error, boto.ChecksumMismatch):
        return (PreludeCRCMismatch, MessageCRCMismatch)
    if isinstance(botocore_error, boto.DuplicateHeader):
        return (DuplicateHeader,)
    if isinstance(botocore_error, boto.InvalidHeadersLength):
        return (InvalidMessageLength,)
    if isinstance(botocore_error, boto.InvalidPayloadLength):
        return (OversizeError,)
    # struct.error (a value cut short), KeyError (unknown type), UnicodeDecodeError
    if isinstance(botocore_error, struct.error | KeyError | UnicodeDecodeError | IndexError):
        return (InvalidHeaders,)
    raise AssertionError(f"unexpected botocore error {botocore_error!r}")


def compare_with_botocore(data: bytes, cuts: list[int]) -> list:
    ours = decode_split(data, cuts)
    theirs, their_error = botocore_decode(data, cuts)
    good = [event for event in ours if isinstance(event, EventStreamMessage)]
    bad = [event for event in ours if isinstance(event, Malformed)]
    assert [(comparable(m.headers), m.payload) for m in good] == [(comparable(h), p) for h, p in theirs]
    if their_error is None:
        assert bad == []
    else:
        assert len(bad) == 1 and isinstance(bad[0].error, our_error_for(their_error))
    assert ours == decode(data)  # and chunking does not matter
    assert_tiles(data, ours)
    return ours


cut_lists = st.lists(st.integers(0, 3000), max_size=12)


@given(streams, cut_lists)
def test_generated_streams_decode_like_botocore(stream, cuts):
    data = b"".join(encode_message(headers, payload) for headers, payload in stream)
    ours = compare_with_botocore(data, cuts)
    assert [(m.headers, m.payload) for m in ours] == stream
    for message, (headers, _) in zip(ours, stream, strict=True):
        assert [type_code(v) for v in message.headers.values()] == [type_code(v) for v in headers.values()]
        assert_crcs_by_oracle(message)


@given(streams, st.data(), cut_lists)
def test_flipped_bytes_are_rejected_like_botocore(stream, data, cuts):
    encoded = [encode_message(headers, payload) for headers, payload in stream]
    body = bytearray(b"".join(encoded))
    where = data.draw(st.integers(0, len(body) - 1), label="flipped byte")
    body[where] ^= data.draw(st.integers(1, 255), label="xor mask")
    ours = compare_with_botocore(bytes(body), cuts)
    [bad] = [event for event in ours if isinstance(event, Malformed)]
    # the flipped byte's own message is the one rejected, by the CRC that covers the byte
    start = 0
    while start + len(encoded[0]) <= where:
        start += len(encoded.pop(0))
    assert bad.start == start
    in_prelude = where - start < 12
    assert isinstance(bad.error, PreludeCRCMismatch if in_prelude else MessageCRCMismatch)


@given(streams, st.data(), cut_lists)
def test_rewritten_lengths_with_a_valid_prelude_crc_are_judged_like_botocore(stream, data, cuts):
    # Lengths under 16 and headers lengths past the message are named departures, tested
    # one by one below; every other length a prelude can claim is judged like botocore.
    body = b"".join(encode_message(headers, payload) for headers, payload in stream)
    total = data.draw(st.integers(16, len(body) + 40), label="total length")
    headers_length = data.draw(st.integers(0, total - 16), label="headers length")
    prelude = struct.pack(">II", total, headers_length)
    stream_bytes = prelude + struct.pack(">I", zlib.crc32(prelude)) + body[12:]
    ours = compare_with_botocore(stream_bytes, cuts)
    if total > len(stream_bytes):
        [tail] = ours
        assert tail.reason == f"message needs {total} bytes, {len(stream_bytes)} arrived"


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.data())
def test_mangled_header_blocks_with_valid_crcs_are_judged_like_botocore(message, data):
    headers, payload = message
    block = bytearray(encode_message(headers, b"")[12:-4])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        if block:
            block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
    headers_length = data.draw(st.sampled_from([len(block), max(len(block) - 1, 0), len(block) + 1]))
    body = bytes(block) + payload
    stream = frame(16 + len(body), min(headers_length, len(body)), body)
    ours = decode(stream)
    theirs, their_error = botocore_decode(stream, [])
    bad = [event for event in ours if isinstance(event, Malformed)]
    # Named departure: botocore slices a string, byte-array or uuid value that runs past the
    # header block short instead of rejecting it (it may then trip on a later header, or
    # accept); the declared width is the rule, so we reject at that value.
    departure = bool(bad) and "value runs past the header block" in bad[0].error.message
    if their_error is not None:
        assert len(bad) == 1
        assert isinstance(bad[0].error, our_error_for(their_error)) or departure
    elif bad:
        assert departure
    else:
        assert [(comparable(m.headers), m.payload) for m in ours] == [(comparable(h), p) for h, p in theirs]


# -- bounds, stop-and-keep, limits ----------------------------------------------------------


@pytest.mark.parametrize("total", [0, 1, 11, 12, 15])
def test_total_length_below_sixteen_is_invalid(total):
    # botocore takes total=12 as an empty message and leaves the rest (named departure).
    stream = frame(total, 0, b"") + encode_message({"a": "b"}, b"x")
    events = decode(stream, 1)
    assert isinstance(events[0].error, InvalidMessageLength) and events[0].error.offset == 0
    assert (events[0].start, events[0].end) == (0, 12)
    assert isinstance(events[1], Tail) and events[1].raw == stream[12:]


def test_headers_length_beyond_the_message_is_invalid():
    body = encode_message({"name": "value"}, b"payload")[12:-4]
    stream = frame(16 + len(body), len(body) + 1, body)
    [bad, tail] = decode(stream)
    assert isinstance(bad.error, InvalidMessageLength) and bad.error.offset == 4
    assert tail.raw == stream[12:]


def test_message_over_the_limit_is_rejected_on_its_prelude():
    prelude_only = frame(16 * 1024 * 1024 + 1, 0, b"")[:12]
    [bad] = EventStreamDecoder().feed(prelude_only)
    assert isinstance(bad.error, OversizeError)
    message = encode_message({"a": "b"}, b"x" * 100)
    [small_limit_bad, _] = decode(message, max_event_size=100)
    assert isinstance(small_limit_bad.error, OversizeError)
    assert decode(message, max_event_size=len(message))[0].payload == b"x" * 100


def test_messages_up_to_botocores_payload_limit_decode_when_max_event_size_allows_them():
    """The decoder held every message to 16 MiB, whatever max_event_size allowed; botocore reads a
    payload up to 24 MiB (and headers up to 128 KiB), so that is the bound, and one byte more is not."""
    big = 64 * 2**20
    headers = {":event-type": "contentBlockDelta"}
    block = encode_message(headers, b"")[12:-4]
    for payload_length, readable in ((17 * 2**20, True), (24 * 2**20, True), (24 * 2**20 + 1, False)):
        payload = b"x" * payload_length
        message = frame(16 + len(block) + payload_length, len(block), block + payload)
        buffer = boto.EventStreamBuffer()
        buffer.add_data(message)
        if readable:
            assert [m.payload for m in buffer] == [payload]
            for chunk_size in (None, 2**20):
                [event] = decode(message, chunk_size, max_event_size=big)
                assert event.headers == headers and event.payload == payload
            [bad, _] = decode(message)  # the default 16 MiB bound still holds
            assert isinstance(bad.error, OversizeError)
        else:
            with pytest.raises(boto.InvalidPayloadLength):
                list(buffer)
            [bad, _] = decode(message, max_event_size=big)
            assert isinstance(bad.error, OversizeError) and (bad.start, bad.end) == (0, 12)
            with pytest.raises(ValueError):
                encode_message(headers, payload)


def test_a_prelude_seen_before_still_meets_each_decoders_limit():
    message = encode_message({"seen": "before"}, b"y" * 200)
    assert isinstance(decode(message)[0], EventStreamMessage)  # the prelude is now known
    [bad, _] = decode(message, max_event_size=100)
    assert isinstance(bad.error, OversizeError) and (bad.start, bad.end) == (0, 12)


def test_duplicate_header_names_are_rejected_at_the_second_header():
    block = b"\x01a\x00" + b"\x01b\x01" + b"\x01a\x01"
    stream = encode_message({}, b"") + frame(16 + len(block), len(block), block)
    [first, bad] = decode(stream, 3)
    assert isinstance(bad.error, DuplicateHeader)
    assert bad.error.offset == 16 + 12 + 6
    assert (bad.start, bad.end) == (16, len(stream))


@pytest.mark.parametrize(
    "block, offset",
    [
        (b"\x05ab", 0),  # name runs past the block
        (b"\x01a", 0),  # no type byte
        (b"\x01a\x0a", 2),  # unknown type 10
        (b"\x01a\x04\x00\x00", 3),  # int32 cut short
        (b"\x01a\x07\x00\x05abc", 3),  # string longer than the block
        (b"\x01a\x09" + b"\x00" * 15, 3),  # uuid cut short
        (b"\x01a\x07\x00\x02\xff\xfe", 5),  # string not UTF-8
        (b"\x02\xc3\x28\x00", 1),  # name not UTF-8
    ],
)
def test_header_values_must_fit_their_declared_width(block, offset):
    [bad] = decode(frame(16 + len(block), len(block), block))
    assert type(bad.error) is InvalidHeaders
    assert bad.error.offset == 12 + offset


def test_after_an_error_feed_returns_nothing_and_memory_stays_bounded():
    decoder = EventStreamDecoder(max_event_size=64)
    [bad] = decoder.feed(b"\x00" * 12)  # prelude CRC of zeros is not zero
    assert isinstance(bad.error, PreludeCRCMismatch)
    assert decoder.feed(b"y" * 50) == [] and decoder.feed(b"z" * 50) == []
    [tail] = decoder.close()
    assert (tail.start, tail.raw) == (12, b"y" * 50 + b"z" * 14)
    assert "36 later bytes were not kept" in tail.reason
    assert decoder.close() == [] and decoder.feed(b"more") == []


@pytest.mark.parametrize("limit", [1, 5, 11, 12, 13, 64])
def test_what_is_kept_after_an_error_does_not_depend_on_the_reads_even_under_a_prelude_limit(limit):
    """A limit below the 12 bytes of a prelude once let the reads decide how much was kept."""
    stream = b"\x00" * 12 + b"ABCDE"  # a prelude whose CRC fails, then fewer bytes than a prelude
    results = {str(sizes): feed_cycled(EventStreamDecoder(max_event_size=limit), stream, sizes)
               for sizes in (None, [1], [12, 5], [13], [3, 7])}  # fmt: skip
    assert len(set(map(repr, results.values()))) == 1, results
    [bad, tail] = results["None"]
    assert isinstance(bad.error, PreludeCRCMismatch)
    assert tail.raw == stream[12 : 12 + min(limit, 5)]


def test_an_event_stream_limit_under_one_byte_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        EventStreamDecoder(max_event_size=0)


def test_returned_headers_cannot_corrupt_the_next_message():
    message = encode_message({":event-type": "chunk", "n": Int32(1)}, b"{}")
    first = decode(message)[0]
    first.headers[":event-type"] = "changed"
    assert decode(message)[0].headers == {":event-type": "chunk", "n": 1}


# -- the encoder -----------------------------------------------------------------------------


def test_encoder_produces_all_ten_types_and_round_trips():
    moment = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    ident = uuid.UUID("01020304-0506-0708-090a-0b0c0d0e0f10")
    headers = {
        "t": True, "f": False, "i8": Int8(-128), "i16": Int16(32767), "i32": Int32(-5),
        "i64": Int64(2**62), "bin": b"\x00\xff", "str": "h\u00e9", "ts": moment, "id": ident,
    }  # fmt: skip
    data = encode_message(headers, b"payload")
    [message] = decode(data, 1)
    assert [type_code(value) for value in message.headers.values()] == list(range(10))
    assert message.headers["ts"] == 1714979289123 and message.headers["ts"].datetime == moment
    assert message.headers["id"] == ident and message.payload == b"payload"
    assert encode_message(message.headers, message.payload) == data
    assert_crcs_by_oracle(message)
    # botocore reads the same values
    [(their_headers, payload)] = botocore_decode(data, [])[0]
    assert their_headers == comparable({**message.headers, "ts": 1714979289123})


def test_plain_ints_pick_int32_or_int64():
    [message] = decode(encode_message({"small": 7, "big": 2**40}, b""))
    assert (type(message.headers["small"]), type(message.headers["big"])) == (Int32, Int64)


@pytest.mark.parametrize(
    "headers",
    [{"x": Int8(128)}, {"x": Int16(-(2**15) - 1)}, {"x": 2**63}, {"x": "s" * 65536}, {"n" * 256: True}, {"x": 1.5}],
)
def test_encoder_refuses_values_the_format_cannot_carry(headers):
    with pytest.raises((ValueError, TypeError)):
        encode_message(headers, b"")


@pytest.mark.timeout(60)
def test_one_byte_reads_of_a_large_message_stay_linear():
    # Joining the buffer on every read would copy ~5e11 bytes here and time out.
    message = encode_message({":event-type": "chunk"}, b"p" * (1024 * 1024))
    decoder = EventStreamDecoder()
    events = []
    for index in range(len(message)):
        events += decoder.feed(message[index : index + 1])
    assert [event.raw for event in events] == [message] and decoder.close() == []


def test_a_frame_layout_learnt_at_the_protocol_limit_still_obeys_a_lower_limit() -> None:
    """Frame layouts are remembered across decoders; a decoder with a lower limit must
    still reject a frame over it, even one whose layout another decoder learnt."""
    headers = {":event-type": "chunk", ":message-type": "event"}
    frames = [encode_message(headers, b'{"n":%d}' % i + b"x" * 200) for i in range(3)]
    body = b"".join(frames)
    assert [type(e) for e in decode(body)] == [EventStreamMessage] * 3  # layouts learnt
    events = decode(body, max_event_size=len(frames[0]) - 1)
    assert isinstance(events[0], Malformed) and isinstance(events[0].error, OversizeError)
    assert events[0].start == 0 and events[0].end == 12


def test_a_repeated_prelude_with_a_different_header_block_is_decoded_afresh() -> None:
    """Two frames with the same prelude bytes (same sizes) but different header blocks:
    the second must get its own headers, not the remembered ones."""
    first = encode_message({":event-type": "aaaa"}, b"{}")
    second = encode_message({":event-type": "bbbb"}, b"{}")
    assert first[:12] == second[:12] and first != second
    for body, types in ((first + second, ["aaaa", "bbbb"]), (second + first + second, ["bbbb", "aaaa", "bbbb"])):
        events = decode(body)
        assert all(isinstance(e, EventStreamMessage) for e in events)
        assert [e.headers[":event-type"] for e in events] == types


# -- the compiled loop against the Python loop ------------------------------------------------


class PythonLoopDecoder(EventStreamDecoder):
    _compiled_frames = None


LAYOUT_HEADERS = [
    {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
    {":message-type": "event", ":event-type": "metadata"},
    {},
]


@st.composite
def repeated_layouts(draw) -> bytes:
    """Streams whose frames repeat a few layouts (header block and size), as Bedrock's do,
    so the compiled loop takes most of them; maybe with one byte flipped, maybe cut short."""
    sizes = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    frames = [
        encode_message(draw(st.sampled_from(LAYOUT_HEADERS)), bytes([i % 256]) * draw(st.sampled_from(sizes)))
        for i in range(draw(st.integers(1, 30)))
    ]
    body = bytearray(b"".join(frames))
    if draw(st.booleans()):
        body[draw(st.integers(0, len(body) - 1))] ^= draw(st.integers(1, 255))
    return bytes(body[: draw(st.integers(0, len(body)))] if draw(st.booleans()) else body)


@settings(max_examples=300)
@given(
    stream=repeated_layouts(),
    chunks=st.lists(st.sampled_from([1, 5, 12, 13, 40, 100, 1500, 16384]), min_size=1, max_size=4),
    limit=st.sampled_from([16 * 1024 * 1024, 16 * 1024 * 1024, 30, 60, 90]),
)
def test_the_compiled_loop_gives_what_the_python_loop_gives(stream: bytes, chunks: list[int], limit: int) -> None:
    """Every message, error and tail, for any chunking and limit, the layouts learnt or not."""
    python = feed_cycled(PythonLoopDecoder(limit), stream, chunks)
    compiled = feed_cycled(EventStreamDecoder(limit), stream, chunks)
    assert compiled == python
    # equal named tuples may still be different things: the classes must match too
    assert [(type(e), tuple(map(type, e))) for e in compiled] == [(type(e), tuple(map(type, e))) for e in python]
    assert feed_cycled(EventStreamDecoder(limit), stream, [len(stream) or 1]) == python
    assert_tiles(stream, python)


class PythonFeedDecoder(EventStreamDecoder):
    feed = EventStreamDecoder._feed  # what the compiled feed stands in for


@settings(max_examples=300)
@given(
    stream=repeated_layouts(),
    chunks=st.lists(st.sampled_from([1, 1, 2, 5, 11, 12, 13, 40]), min_size=1, max_size=4),
    limit=st.sampled_from([16 * 1024 * 1024, 30, 60, 90]),
)
def test_the_compiled_feed_gives_what_the_python_feed_gives(stream: bytes, chunks: list[int], limit: int) -> None:
    """Read by read, for any chunking and limit: the compiled feed appends a read only where
    ``_feed`` would have appended it and returned nothing."""
    compiled, python = EventStreamDecoder(limit), PythonFeedDecoder(limit)
    pos = i = 0
    while pos < len(stream):
        piece = stream[pos : pos + chunks[i % len(chunks)]]
        assert compiled.feed(piece) == python.feed(piece)
        assert (compiled._buffer, compiled._need, compiled.max_message_length) == (python._buffer, python._need, python.max_message_length)
        pos, i = pos + len(piece), i + 1
    assert compiled.close() == python.close()


def test_the_compiled_feed_takes_reads_that_complete_no_message() -> None:
    """One-byte reads enter Python once a message, when it is whole: the read that completes a
    valid prelude only sets ``_need``, in C too."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    entered = []

    class Counted(EventStreamDecoder):
        def _feed(self, data: bytes) -> list:
            entered.append(data)
            return super()._feed(data)

    body = b"".join(encode_message(LAYOUT_HEADERS[0], b'{"i":%d}' % i) for i in range(50))
    events = feed_cycled(Counted(), body, [1])
    assert events == feed_cycled(EventStreamDecoder(), body) and len(events) == 50
    assert len(entered) == 50


@pytest.mark.parametrize(
    "total, headers_length",
    [(40, 30), (200_000, 140_000), (13, 0), (64, 4), (100, 0)],
    ids=["headers-longer-than-the-message", "headers-over-128-KiB", "under-the-minimum", "fits", "no-headers"],
)
def test_a_prelude_is_judged_on_the_read_that_completes_it_for_any_chunking(total: int, headers_length: int) -> None:
    """A prelude with valid CRCs whose lengths break a rule is refused as soon as it is whole,
    not when its message would be: a stream cut after it gives the same error whether the prelude
    came in one read or byte by byte (the compiled feed checks every rule before it takes a prelude)."""
    cut = frame(total, headers_length, b"h" * (total - 16))[:30]
    whole = decode(cut)
    assert decode(cut, 1) == decode(cut, 5) == decode(cut, 13) == whole
    for stream in (cut, cut[:12]):  # and a stream that ends with the prelude
        for size in (1, 5, 12):
            compiled, python = EventStreamDecoder(), PythonFeedDecoder()
            for at in range(0, len(stream), size):
                assert compiled.feed(stream[at : at + size]) == python.feed(stream[at : at + size])
                assert compiled._need == python._need
            assert compiled.close() == python.close()
    bad = whole[0]
    if headers_length > total - 16 or headers_length > 128 * 1024:
        assert isinstance(bad, Malformed) and (bad.start, bad.end) == (0, 12), whole
    else:
        assert isinstance(bad, Tail) and bad.raw == cut, whole


@pytest.mark.parametrize("size", [1, 5, 12, 100])
def test_a_payload_over_botocores_limit_is_refused_on_its_prelude_under_a_larger_event_limit(size: int) -> None:
    """``streamtap_max_event`` may allow messages past 24 MiB; the payload is still held to what
    botocore reads, in C as in Python: refused as soon as the prelude is whole, not left waiting
    for 24 MiB that a cut stream never brings (truncated instead of corrupt)."""
    from streamtap.wire.eventstream import MAX_HEADERS_LENGTH, MAX_PAYLOAD_LENGTH, MIN_MESSAGE_LENGTH

    total = MIN_MESSAGE_LENGTH + MAX_PAYLOAD_LENGTH + 1
    prelude = struct.pack(">II", total, 0)
    stream = prelude + struct.pack(">I", zlib.crc32(prelude)) + b"x" * 1000
    limit = MIN_MESSAGE_LENGTH + MAX_HEADERS_LENGTH + MAX_PAYLOAD_LENGTH + (8 << 20)
    compiled, python = EventStreamDecoder(limit), PythonFeedDecoder(limit)
    got = []
    for at in range(0, len(stream), size):
        piece = compiled.feed(stream[at : at + size])
        assert piece == python.feed(stream[at : at + size]) and compiled._need == python._need
        got += piece
    assert compiled.close() == python.close()
    assert isinstance(got[0], Malformed) and isinstance(got[0].error, OversizeError), got
    assert "payload" in str(got[0].error)


def test_the_compiled_frame_loop_refuses_a_layout_whose_lengths_do_not_add_up() -> None:
    """A cached layout is checked without adding two of its numbers: a header end near the top
    of a machine word once wrapped round the check and sent zlib reading far past the buffer
    (run apart: a crash must fail this test, not the test process)."""
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    script = (
        "from streamtap.wire import _accel\n"
        "from streamtap.wire.events import EventStreamMessage\n"
        "head = bytes(range(40))\n"
        "for headers_end in (2**63 - 1, 2**63 - 4, 11, 13, 17):\n"
        "    layouts = {head[:12]: (20, headers_end, 0, b'', {})}\n"
        "    events = []\n"
        "    assert _accel.eventstream_known_frames(head, 0, 0, 0, 1 << 20, layouts, EventStreamMessage, events) == 0\n"
        "    assert events == []\n"
    )
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, (run.returncode, run.stderr)


def test_a_stopped_decoder_takes_no_prelude_in_c_whatever_its_limit_becomes() -> None:
    """After a fatal error the buffer holds no message start, even where ``_need`` is a prelude's
    length (a limit of 11 stops at 12): raising ``max_message_length`` then changes nothing the
    compiled feed does that ``_feed`` would not."""
    message = encode_message({"a": 1}, b"x" * 80)
    compiled, python = EventStreamDecoder(11), PythonFeedDecoder(11)
    for decoder in (compiled, python):
        assert decoder.feed(message[:12])[0].fatal and decoder._need == 12
        decoder.max_message_length = 1000
    for piece in (message[:12], message[12:]):
        assert compiled.feed(piece) == python.feed(piece)
        assert (compiled._buffer, compiled._need) == (python._buffer, python._need)
    assert compiled.close() == python.close()


def test_a_copied_decoder_goes_on_alone() -> None:
    """copy.deepcopy mid-message copies the compiled base's fields, and shares no buffer."""
    import copy

    body = b"".join(encode_message(LAYOUT_HEADERS[0], b'{"i":%d}' % i) for i in range(3))
    decoder = EventStreamDecoder()
    first = decoder.feed(body[:40])
    twin = copy.deepcopy(decoder)
    assert twin._buffer == decoder._buffer and twin._buffer is not decoder._buffer
    assert (twin._need, twin.max_message_length, twin._decoding) == (decoder._need, decoder.max_message_length, decoder._decoding)
    mine = decoder.feed(b"\0" * 100) + decoder.close()  # the original goes on first, elsewhere
    assert first + twin.feed(body[40:]) + twin.close() == feed_cycled(EventStreamDecoder(), body)
    assert first + mine == feed_cycled(EventStreamDecoder(), body[:40] + b"\0" * 100)


def test_the_compiled_loop_takes_frames_of_a_known_layout() -> None:
    if not accel.compiled:
        pytest.skip(compiled_loops_missing())
    taken = []

    def counting_frames(head, pos, base, first_seq, limit, layouts, message_class, events):
        before = len(events)
        stop = accel.eventstream_known_frames(head, pos, base, first_seq, limit, layouts, message_class, events)
        taken.extend(events[before:])
        return stop

    class Counted(EventStreamDecoder):
        _compiled_frames = staticmethod(counting_frames)

    body = b"".join(encode_message(LAYOUT_HEADERS[0], b'{"bytes":"eyJ0eXBlIjoicGluZyJ9"}') for _ in range(200))
    events = feed_cycled(Counted(), body, [1500])
    assert events == feed_cycled(PythonLoopDecoder(), body, [1500])
    assert len(taken) >= 190 and all(event in events for event in taken)


def test_a_stopped_decoders_tail_spans_the_bytes_it_dropped() -> None:
    """After a CRC error, more than the limit arrives: the Tail keeps the limit's worth and counts the rest."""
    good = encode_message({":event-type": "chunk"}, b"x" * 40)
    bad = bytearray(good)
    bad[-1] ^= 1
    body = good + bytes(bad) + good * 10
    events = feed_cycled(EventStreamDecoder(max_event_size=100), body, [len(body)])
    assert [type(e).__name__ for e in events] == ["EventStreamMessage", "Malformed", "Tail"]
    assert events[-1].end == len(body) and "660 later bytes were not kept" in events[-1].reason
    assert_tiles(body, events)


@pytest.mark.parametrize("error", [cls("what went wrong", 1234) for cls in (
    FramingError, OversizeError, PreludeCRCMismatch, MessageCRCMismatch, InvalidMessageLength, InvalidHeaders, DuplicateHeader)])
def test_a_framing_error_survives_a_copy(error):
    """A session is copied mid-stream (fault positions): a Malformed event it holds must copy too."""
    for copied in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error), copy.copy(error)):
        assert copied == error and str(copied) == str(error) and copied.offset == 1234


def test_a_timestamp_outside_what_a_datetime_holds_says_so():
    assert Timestamp(2**62) == 2**62
    with pytest.raises(ValueError, match="outside the years a datetime holds"):
        Timestamp(2**62).datetime
