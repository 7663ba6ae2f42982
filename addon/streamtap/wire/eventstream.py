"""AWS event-stream (``application/vnd.amazon.eventstream``): a decoder and an encoder.

A message is ``total_length u32 | headers_length u32 | prelude_crc u32 | headers |
payload | message_crc u32``, big-endian, CRC-32 as in zlib. The decoder checks the
prelude CRC as soon as 12 bytes are present (a corrupted length must not make it wait
for bytes that never come), then the message CRC, then the header block. The first
violation stops it for good: a fatal ``Malformed`` names the error and its absolute
offset, and ``close()`` hands back every later byte as a ``Tail``. It never guesses
where the next message might start.

Errors and what they span: ``PreludeCRCMismatch`` (offset of the prelude CRC),
``InvalidMessageLength`` (total length under 16, or a headers length that does not fit;
offset of the length field) and ``OversizeError`` (over ``max_event_size``, or a payload
over botocore's 24 MiB) cover the 12 prelude bytes; ``MessageCRCMismatch`` (offset of the
message CRC), ``InvalidHeaders`` and ``DuplicateHeader`` (offset of the offending header
byte) cover the whole message.

Header values decode to Python values that remember their wire type, so decoded
headers compare equal to plain values and re-encode to the same bytes:

====  ==========  =================================================
type  name        Python value
====  ==========  =================================================
0/1   bool        ``True`` / ``False``
2     byte        ``Int8`` (an ``int``)
3     short       ``Int16`` (an ``int``)
4     integer     ``Int32`` (an ``int``)
5     long        ``Int64`` (an ``int``)
6     byte array  ``bytes``
7     string      ``str`` (strict UTF-8)
8     timestamp   ``Timestamp``: an ``int`` of milliseconds since the
                  Unix epoch; ``.datetime`` gives an aware UTC datetime
9     uuid        ``uuid.UUID``
====  ==========  =================================================

For ``encode_message`` a plain ``int`` becomes an ``Int32`` when it fits and an
``Int64`` otherwise, a ``datetime`` becomes a ``Timestamp``, ``bytearray`` and
``memoryview`` are byte arrays; wrap a value in ``Int8``/``Int16``/``Int32``/``Int64``/
``Timestamp`` to force its type.
"""

from __future__ import annotations

import operator
import struct
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zlib import crc32

from . import accel
from .errors import (
    DuplicateHeader,
    FramingError,
    InvalidHeaders,
    InvalidMessageLength,
    MessageCRCMismatch,
    OversizeError,
    PreludeCRCMismatch,
)
from .events import DEFAULT_MAX_EVENT, EventStreamMessage, Malformed, Tail

PRELUDE_LENGTH = 12
MIN_MESSAGE_LENGTH = 16  # prelude and message CRC, no headers, no payload
MAX_HEADERS_LENGTH = 128 * 1024  # the AWS SDKs' limit (botocore, Go)
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024  # botocore's limit (boto3 reads a payload up to it; Go's is 16 MiB)
# the longest message boto3 reads, whatever the caller allows (its memory bound is max_event_size)
MAX_MESSAGE_LENGTH = MIN_MESSAGE_LENGTH + MAX_HEADERS_LENGTH + MAX_PAYLOAD_LENGTH

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Int8(int):
    """A header value sent as type 2 (byte)."""

    __slots__ = ()
    type_code = 2


class Int16(int):
    """A header value sent as type 3 (short)."""

    __slots__ = ()
    type_code = 3


class Int32(int):
    """A header value sent as type 4 (integer)."""

    __slots__ = ()
    type_code = 4


class Int64(int):
    """A header value sent as type 5 (long)."""

    __slots__ = ()
    type_code = 5


class Timestamp(int):
    """A header value sent as type 8: milliseconds since the Unix epoch."""

    __slots__ = ()
    type_code = 8

    @classmethod
    def from_datetime(cls, moment: datetime) -> Timestamp:
        if moment.tzinfo is None:
            raise ValueError("a timestamp header needs an aware datetime")
        return cls((moment - _EPOCH) // timedelta(milliseconds=1))

    @property
    def datetime(self) -> datetime:
        """The moment as an aware UTC datetime; ValueError for one outside the years 1 to 9999,
        which a datetime cannot hold (the wire's int64 can: the int is the value)."""
        try:
            return _EPOCH + timedelta(milliseconds=int(self))
        except OverflowError:
            raise ValueError(f"timestamp {int(self)} ms is outside the years a datetime holds (1 to 9999)") from None


_unpack_prelude = struct.Struct(">III").unpack_from
_unpack_u32 = struct.Struct(">I").unpack_from
_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_i8 = struct.Struct(">b").unpack_from
_unpack_i16 = struct.Struct(">h").unpack_from
_unpack_i32 = struct.Struct(">i").unpack_from
_unpack_i64 = struct.Struct(">q").unpack_from

# type code -> (width, unpack, wrapper) for the fixed-width value types
_FIXED = {
    2: (1, _unpack_i8, Int8),
    3: (2, _unpack_i16, Int16),
    4: (4, _unpack_i32, Int32),
    5: (8, _unpack_i64, Int64),
    8: (8, _unpack_i64, Timestamp),
}

# Bedrock sends the same header block on every frame of a stream; parsing it once and
# reusing the result is most of the speed-up over botocore. Keys are the block's bytes,
# values are never handed out (callers get a copy), so a caller cannot corrupt them.
_HEADER_CACHE: dict[bytes, dict[str, Any]] = {}
_HEADER_CACHE_ENTRIES = 256
_HEADER_CACHE_MAX_BLOCK = 1024


def parse_headers(block: bytes, offset: int = 0) -> dict[str, Any]:
    """Decode one header block; ``offset`` is where the block sits in the stream.

    Raises ``InvalidHeaders`` or ``DuplicateHeader`` naming the offending byte.
    """
    headers: dict[str, Any] = {}
    size = len(block)
    i = 0
    while i < size:
        header_start = i
        name_end = i + 1 + block[i]
        if name_end >= size:  # the name, and a type byte after it, must fit
            raise InvalidHeaders("header name or type runs past the header block", offset + i)
        try:
            name = block[i + 1 : name_end].decode()
        except UnicodeDecodeError:
            raise InvalidHeaders("header name is not UTF-8", offset + i + 1) from None
        kind = block[name_end]
        i = name_end + 1
        if kind == 7 or kind == 6:
            if i + 2 > size:
                raise InvalidHeaders("header value length runs past the header block", offset + i)
            value_end = i + 2 + _unpack_u16(block, i)[0]
            if value_end > size:
                raise InvalidHeaders(f"header {name!r} value runs past the header block", offset + i)
            value: Any = block[i + 2 : value_end]
            if kind == 7:
                try:
                    value = value.decode()
                except UnicodeDecodeError:
                    raise InvalidHeaders(f"header {name!r} string is not UTF-8", offset + i + 2) from None
            i = value_end
        elif kind == 0 or kind == 1:
            value = kind == 0
        elif kind == 9:
            if i + 16 > size:
                raise InvalidHeaders(f"header {name!r} uuid value runs past the header block", offset + i)
            value = uuid.UUID(bytes=block[i : i + 16])
            i += 16
        elif kind in _FIXED:
            width, unpack, wrapper = _FIXED[kind]
            if i + width > size:
                raise InvalidHeaders(f"header {name!r} value runs past the header block", offset + i)
            value = wrapper(unpack(block, i)[0])
            i += width
        else:
            raise InvalidHeaders(f"header {name!r} has unknown value type {kind}", offset + name_end)
        if name in headers:
            raise DuplicateHeader(f"header {name!r} appears twice", offset + header_start)
        headers[name] = value
    return headers


# Preludes repeat too (a stream's frames come in a few hundred sizes). A prelude whose 12
# bytes were checked before is known good: same bytes, same CRC, same verdict. Only
# preludes within the protocol's bounds are kept; each decoder still applies its own limit.
_PRELUDE_CACHE: dict[bytes, tuple[int, int, int]] = {}
_PRELUDE_CACHE_ENTRIES = 2048


def _remember_prelude(prelude: bytes, total: int, headers_length: int, prelude_crc: int) -> None:
    if total <= MAX_MESSAGE_LENGTH:
        if len(_PRELUDE_CACHE) >= _PRELUDE_CACHE_ENTRIES:
            _PRELUDE_CACHE.clear()
        _PRELUDE_CACHE[prelude] = total, headers_length, prelude_crc


# A frame layout: prelude -> (total length, headers end, CRC of prelude and header block,
# that block, its headers). A frame whose prelude is known and whose next bytes are that
# block is checked by one CRC over its payload, continued from the stored CRC (the message
# CRC runs over prelude, block and payload), and its headers need no parsing. Bedrock
# repeats one block per event type and a few hundred frame sizes, so nearly every frame
# takes this path. Values are never handed out: callers get a copy of the headers.
_LAYOUTS: dict[bytes, tuple[int, int, int, bytes, dict[str, Any]]] = {}


def _parse_and_cache(block: bytes, offset: int) -> dict[str, Any]:
    headers = parse_headers(block, offset)
    if len(block) <= _HEADER_CACHE_MAX_BLOCK:
        if len(_HEADER_CACHE) >= _HEADER_CACHE_ENTRIES:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[block] = headers
    return headers


class EventStreamDecoder(accel.EventStreamFeed):
    """Sans-IO decoder: ``feed(bytes) -> [EventStreamMessage | Malformed]``, ``close() -> [Tail]``.

    Unconsumed bytes wait in one bytearray (appending is amortised O(1)); the frame loop
    runs only once the next message is whole, so one-byte reads stay linear in the
    stream length and cost a single comparison each. Where this install has ``_accel``,
    ``feed`` is compiled: a read of bytes that leaves ``_buffer`` short of ``_need``, or
    completes a prelude ``_decode`` would accept but not its message (then ``_need`` becomes the
    message's length, as there), is appended without entering Python, and every other read goes
    to ``_feed``. The compiled base holds ``_buffer``, ``_need``, ``max_message_length`` and
    ``_decoding``; the Python code reads and writes them as attributes.
    """

    _compiled_frames = accel.eventstream_known_frames  # None: _decode runs in Python (tests compare the two)

    def __init__(self, max_event_size: int = DEFAULT_MAX_EVENT) -> None:
        max_event_size = operator.index(max_event_size)  # an int in both builds (the compiled base keeps one)
        if max_event_size < 1:
            raise ValueError("max_event_size must be at least 1")
        self.max_message_length = min(max_event_size, MAX_MESSAGE_LENGTH)
        self._seq = 0
        self._buffer = bytearray()  # bytes not yet part of an event
        self._offset = 0  # stream offset of self._buffer[0]
        self._need = PRELUDE_LENGTH  # len(self._buffer) the next step needs
        self._decoding = True  # neither stopped at an error nor closed
        self._stopped = False
        self._closed = False
        self._dropped_after_stop = 0

    def _feed(self, data: bytes) -> list[EventStreamMessage | Malformed]:
        buffer = self._buffer
        buffer += data
        if len(buffer) < self._need:  # the common case for small reads: one comparison
            return []
        return self._decode()

    if accel.EventStreamFeed is object:
        feed = _feed

    __getstate__, __setstate__ = accel.copied_with(accel.EventStreamFeed)

    def close(self) -> list[Tail]:
        if self._closed:
            return []
        self._closed = True
        self._decoding = False
        self._need = 0  # every later feed goes to _decode, which drops it
        rest = bytes(self._buffer)
        self._buffer = bytearray()
        if not rest:
            return []
        if self._stopped:
            reason = "decoder stopped at an error"
            if self._dropped_after_stop:
                reason += f"; {self._dropped_after_stop} later bytes were not kept (over max_event_size)"
        elif len(rest) < PRELUDE_LENGTH:
            reason = f"prelude needs {PRELUDE_LENGTH} bytes, {len(rest)} arrived"
        else:
            reason = f"message needs {_unpack_u32(rest)[0]} bytes, {len(rest)} arrived"
        # the span covers the bytes dropped after the error too, so that spans tile the stream
        dropped = self._dropped_after_stop if self._stopped else 0
        tail = Tail(self._seq, self._offset, self._offset + len(rest) + dropped, rest, reason)
        self._seq += 1
        return [tail]

    def _decode(
        self,
        checksum=crc32,
        unpack_prelude=_unpack_prelude,
        unpack_u32=_unpack_u32,
        new=tuple.__new__,
        message_class=EventStreamMessage,
        cache=_HEADER_CACHE,
        preludes=_PRELUDE_CACHE,
    ) -> list[EventStreamMessage | Malformed]:
        # The hot path of the whole proxy for Bedrock. Helpers arrive as default
        # arguments (free locals). A frame of a known layout (see _LAYOUTS) costs one dict
        # lookup, one CRC over its payload and building the message tuple: no other
        # Python-level call.
        if not self._decoding:
            if self._closed:
                self._buffer.clear()
            else:
                self._keep_after_stop()
            return []
        head = bytes(self._buffer)  # slices of bytes are bytes: one copy per feed
        last_start = len(head) - PRELUDE_LENGTH  # where the last whole prelude could start
        size = len(head)
        pos = 0
        base = self._offset
        seq = self._seq
        limit = self.max_message_length
        events: list[EventStreamMessage | Malformed] = []
        append = events.append
        need = PRELUDE_LENGTH
        layouts = _LAYOUTS
        get_layout = layouts.get
        error: FramingError | None = None
        compiled_frames = self._compiled_frames
        while pos <= last_start:
            if compiled_frames is not None:  # the frames of known layout, in C; then one more here
                pos = compiled_frames(head, pos, base, self._seq, limit, layouts, message_class, events)
                seq = self._seq + len(events)
                if pos > last_start:
                    break
            prelude = head[pos : pos + 12]
            layout = get_layout(prelude)
            if layout is not None and head.startswith(layout[3], pos + 12):
                total, headers_end, prefix_crc, _, headers = layout
                end = pos + total
                if end > size or total > limit:
                    if total > limit:
                        error = self._length_error(total, headers_end - 12, base + pos)
                        end = pos + PRELUDE_LENGTH
                    else:
                        need = total
                    break
                payload = head[pos + headers_end : end - 4]
                if checksum(payload, prefix_crc) != unpack_u32(head, end - 4)[0]:
                    error = MessageCRCMismatch("message checksum mismatch", base + end - 4)
                    break
            else:
                known = preludes.get(prelude)
                if known is None:
                    total, headers_length, prelude_crc = unpack_prelude(prelude)
                    if checksum(prelude[:8]) != prelude_crc:
                        error = PreludeCRCMismatch("prelude checksum mismatch", base + pos + 8)
                        end = pos + PRELUDE_LENGTH
                        break
                    if not (
                        MIN_MESSAGE_LENGTH <= total <= limit
                        and headers_length <= total - MIN_MESSAGE_LENGTH
                        and headers_length <= MAX_HEADERS_LENGTH
                        and total - MIN_MESSAGE_LENGTH - headers_length <= MAX_PAYLOAD_LENGTH
                    ):
                        error = self._length_error(total, headers_length, base + pos)
                        end = pos + PRELUDE_LENGTH
                        break
                    _remember_prelude(prelude, total, headers_length, prelude_crc)
                else:
                    total, headers_length, prelude_crc = known
                    if total > limit:
                        error = self._length_error(total, headers_length, base + pos)
                        end = pos + PRELUDE_LENGTH
                        break
                end = pos + total
                if end > size:
                    need = total
                    break
                headers_end = 12 + headers_length
                block = head[pos + 12 : pos + headers_end]
                # the message CRC runs over prelude, header block and payload
                prefix_crc = checksum(block, checksum(prelude))
                payload = head[pos + headers_end : end - 4]
                if checksum(payload, prefix_crc) != unpack_u32(head, end - 4)[0]:
                    error = MessageCRCMismatch("message checksum mismatch", base + end - 4)
                    break
                headers = cache.get(block)
                if headers is None:
                    try:
                        headers = _parse_and_cache(block, base + pos + 12)
                    except InvalidHeaders as header_error:
                        error = header_error
                        break
                if len(block) <= _HEADER_CACHE_MAX_BLOCK:
                    if len(layouts) >= _PRELUDE_CACHE_ENTRIES:
                        layouts.clear()
                    layouts[prelude] = total, headers_end, prefix_crc, block, headers
            append(new(message_class, (seq, base + pos, base + end, head[pos:end], headers.copy(), payload)))
            seq += 1
            pos = end
        if error is not None:
            # Stop for good: report the bad unit, keep what follows it for close().
            append(Malformed(seq, base + pos, base + end, head[pos:end], error, True))
            seq += 1
            pos = end
            self._decoding = False
            self._stopped = True
        del self._buffer[:pos]
        self._offset = base + pos
        self._seq = seq
        self._need = need
        if self._stopped:
            self._keep_after_stop()  # after setting _need: it sets its own, for the bound on what is kept
        return events

    def _length_error(self, total: int, headers_length: int, offset: int) -> FramingError:
        if total < MIN_MESSAGE_LENGTH:
            return InvalidMessageLength(
                f"total length {total} is below the {MIN_MESSAGE_LENGTH}-byte minimum", offset
            )
        if total > self.max_message_length:
            return OversizeError(
                f"message of {total} bytes is over the {self.max_message_length}-byte limit", offset
            )
        if headers_length > total - MIN_MESSAGE_LENGTH:
            return InvalidMessageLength(
                f"headers length {headers_length} does not fit a {total}-byte message", offset + 4
            )
        if headers_length > MAX_HEADERS_LENGTH:
            return InvalidMessageLength(
                f"headers length {headers_length} is over the {MAX_HEADERS_LENGTH}-byte limit", offset + 4
            )
        payload_length = total - MIN_MESSAGE_LENGTH - headers_length
        return OversizeError(f"payload of {payload_length} bytes is over the {MAX_PAYLOAD_LENGTH}-byte limit", offset)

    def _keep_after_stop(self) -> None:
        # Memory stays bounded after a fatal error: at most max_event_size bytes are kept,
        # and feed() only calls here once that bound is passed.
        excess = len(self._buffer) - self.max_message_length
        if excess > 0:
            self._dropped_after_stop += excess
            del self._buffer[self.max_message_length :]
        self._need = self.max_message_length + 1


# encoding ------------------------------------------------------------------------

_pack_prelude = struct.Struct(">II").pack
_pack_u32 = struct.Struct(">I").pack
_pack_u16 = struct.Struct(">H").pack
_INT_RANGES = {2: (8, ">b"), 3: (16, ">h"), 4: (32, ">i"), 5: (64, ">q"), 8: (64, ">q")}


def _encode_value(name: str, value: Any) -> bytes:
    if isinstance(value, bool):
        return b"\x00" if value else b"\x01"
    if isinstance(value, datetime):
        value = Timestamp.from_datetime(value)
    if isinstance(value, int):
        kind = getattr(type(value), "type_code", None)
        if kind is None:
            kind = 4 if -(2**31) <= value < 2**31 else 5
        bits, fmt = _INT_RANGES[kind]
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"header {name!r}: {value} does not fit type {kind}")
        return bytes((kind,)) + struct.pack(fmt, value)
    if isinstance(value, str):
        return b"\x07" + _length_prefixed(name, value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return b"\x06" + _length_prefixed(name, bytes(value))
    if isinstance(value, uuid.UUID):
        return b"\x09" + value.bytes
    raise TypeError(f"header {name!r}: no event-stream type for {type(value).__name__}")


def _length_prefixed(name: str, value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"header {name!r}: value of {len(value)} bytes is over 65535")
    return _pack_u16(len(value)) + value


def encode_headers(headers: dict[str, Any]) -> bytes:
    parts = []
    for name, value in headers.items():
        encoded_name = name.encode()
        if len(encoded_name) > 255:
            raise ValueError(f"header name {name[:40]!r}... is over 255 bytes")
        parts.append(bytes((len(encoded_name),)) + encoded_name + _encode_value(name, value))
    return b"".join(parts)


def encode_message(headers: dict[str, Any], payload: bytes = b"") -> bytes:
    """One event-stream message with both CRCs; header types as in the module docstring."""
    block = encode_headers(headers)
    if len(block) > MAX_HEADERS_LENGTH:
        raise ValueError(f"header block of {len(block)} bytes is over {MAX_HEADERS_LENGTH}")
    if len(payload) > MAX_PAYLOAD_LENGTH:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_LENGTH}")
    total = MIN_MESSAGE_LENGTH + len(block) + len(payload)
    prelude = _pack_prelude(total, len(block))
    prelude += _pack_u32(crc32(prelude))
    body = prelude + block + bytes(payload)
    return body + _pack_u32(crc32(body))
