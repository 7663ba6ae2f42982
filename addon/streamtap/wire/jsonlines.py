"""JSON framings: newline-delimited JSON (Ollama) and a streamed JSON array (Gemini's
``streamGenerateContent`` without ``alt=sse``).

Both yield one ``JSONValue`` per complete value, parsed with orjson, and keep the tiling
rule of every wire decoder: bytes that carry no value of their own (blank lines, the
array's ``[``, commas and whitespace) belong to the span of the value after them.

An unfinished value is never yielded: ``close()`` reports it as a ``Tail``, even when
the bytes would happen to parse (an NDJSON line without its newline, a number cut short
in an array). A value larger than ``max_event_size`` is reported as a non-fatal
``Malformed(OversizeError)`` with empty ``raw`` (its bytes were not kept) and decoding
carries on after it; the rule is positional (a value ending more than
``max_event_size`` bytes after its span starts), so chunking cannot change the result.
"""

from __future__ import annotations

import re

import orjson

from .errors import InvalidJSON, OversizeError
from .events import DEFAULT_MAX_EVENT, JSONValue, Malformed, Tail
from .partial_json import lenient_loads

_JSON_SPACE = b" \t\r\n"


def _oversize(limit: int, offset: int) -> OversizeError:
    return OversizeError(f"value longer than {limit} bytes, skipped", offset)


class NDJSONDecoder:
    """One JSON value per LF-terminated line (a CR before the LF is JSON whitespace).

    A line that is not JSON is a non-fatal ``Malformed(InvalidJSON)``; blank lines
    belong to the next value's span.
    """

    def __init__(self, max_event_size: int = DEFAULT_MAX_EVENT) -> None:
        if max_event_size < 1:
            raise ValueError("max_event_size must be at least 1")
        self.max_event_size = max_event_size
        self._seq = 0
        self._buf = bytearray()  # the unfinished line
        self._offset = 0  # absolute offset of _buf[0]
        self._span_start = 0
        self._head: list[bytes] = []  # blank lines already seen in the current span
        self._skipping = False  # dropping an oversize line up to its newline
        self._closed = False

    def feed(self, data: bytes) -> list[JSONValue | Malformed]:
        if self._closed:
            raise RuntimeError("feed() after close()")
        if 10 not in data:  # an int test is a plain memchr
            if self._skipping:
                self._offset += len(data)
            else:
                self._buf += data
                self._check_size()
            return []
        work = bytes(self._buf) + data if self._buf else bytes(data)
        self._buf.clear()
        base = self._offset
        lines = work.split(b"\n")
        rest = lines.pop()
        out: list = []
        seq = self._seq
        span_start = self._span_start
        limit = span_start + self.max_event_size - base  # relative: a line ending past it is oversize
        seg = 0  # where the current span's unsaved bytes begin in work
        pos = 0
        parse = loads
        for line in lines:
            end = pos + len(line) + 1
            if self._skipping or end > limit:
                self._skipping = False
                self._head.clear()
                event = Malformed(seq, span_start, base + end, b"", _oversize(self.max_event_size, span_start), False)
            elif not line or (line[0] in _JSON_SPACE and not line.strip(_JSON_SPACE)):
                pos = end  # a blank line: skipped before the parsers, whose refusals cost far more
                continue
            else:
                try:
                    value = parse(line)
                except orjson.JSONDecodeError as exc:
                    raw = self._raw(work, seg, end)
                    error = InvalidJSON(f"line is not JSON: {exc}", base + pos)
                    event = Malformed(seq, span_start, base + end, raw, error, False)
                else:
                    event = JSONValue(seq, span_start, base + end, self._raw(work, seg, end), value)
            out.append(event)
            seq += 1
            span_start = base + end
            limit = end + self.max_event_size
            seg = pos = end
        if pos > seg:
            self._head.append(work[seg:pos])
        self._seq = seq
        self._span_start = span_start
        self._offset = base + pos
        self._buf += rest
        self._check_size()
        return out

    def close(self) -> list[JSONValue | Malformed | Tail]:
        if self._closed:
            return []
        self._closed = True
        end = self._offset + len(self._buf)
        if self._skipping:
            error = OversizeError(
                f"value longer than {self.max_event_size} bytes, skipped; the stream ended inside it",
                self._span_start,
            )
            event = Malformed(self._seq, self._span_start, end, b"", error, False)
        elif self._head or self._buf:
            rest = bytes(self._buf)
            cut = bool(rest.strip(_JSON_SPACE))
            if not cut:
                reason = "only blank lines after the last value"
            elif _parses(rest):
                reason = "the last line has no newline: not a complete value, although it parses as JSON"
            else:
                reason = "the stream ended inside a line"
            event = Tail(self._seq, self._span_start, end, b"".join(self._head) + rest, reason, cut)
        else:
            return []
        self._seq += 1
        self._head.clear()
        self._buf.clear()
        return [event]

    def _raw(self, work: bytes, seg: int, end: int) -> bytes:
        if self._head:
            raw = b"".join(self._head) + work[seg:end]
            self._head.clear()
            return raw
        return work[seg:end]

    def _check_size(self) -> None:
        """Stop buffering an unfinished line that is already over the limit."""
        if self._offset + len(self._buf) - self._span_start > self.max_event_size:
            self._skipping = True
            self._offset += len(self._buf)
            self._buf.clear()
            self._head.clear()


def loads(data: bytes | bytearray, exact_integers: bool = False) -> object:
    """One JSON value, as the providers' clients read it (``lenient_loads``); ``NaN`` and
    ``Infinity``, which no JSON holds, stay refused. Every line is read, so an integer past
    64 bits is exact only when asked: a provider asks again for the lines that hold arguments."""
    return lenient_loads(data, parse_constant=_no_constant, exact_integers=exact_integers)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _parses(data: bytes) -> bool:
    try:
        loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def element_framed(raw: bytes, first: bool) -> bytes:
    """A JSON-array element's raw bytes (``JSONValue.raw``: the ``[`` or ``,`` before it, then the
    element) with the opener its place in an array needs: ``[`` first, ``,`` after. An element
    moved, repeated or left out by a fault keeps the array whole. Anything else is given back."""
    opener = len(raw) - len(raw.lstrip(_JSON_SPACE))
    if raw[opener : opener + 1] == (b"," if first else b"["):
        return raw[:opener] + (b"[" if first else b",") + raw[opener + 1 :]
    return raw


# JSONArrayDecoder scanner states
_OPEN, _FIRST, _VALUE, _AFTER, _NEXT, _DONE, _STOPPED = range(7)
_CONTAINER, _STRING, _ATOM = range(3)
_STRUCTURE = re.compile(rb'["{}\[\]]')  # what matters outside strings inside a container
_STRING_SPECIAL = re.compile(rb'["\\]')
_NOT_SPACE = re.compile(rb"[^ \t\r\n]")
_ATOM_END = re.compile(rb"[ \t\r\n,\]]")


class JSONArrayDecoder:
    """Elements of one top-level JSON array, each yielded when its last byte arrives.

    An incremental scanner tracks strings, escapes and nesting depth, so each byte is
    looked at once however the stream is chunked; orjson then parses the element. A
    syntax error (no ``[`` first, garbage between elements, an element orjson rejects,
    bytes after the closing ``]``) is a fatal ``Malformed(InvalidJSON)``: the decoder
    stops and ``close()`` returns the later bytes as a ``Tail``. ``finished`` says
    whether the closing ``]`` arrived; without it the array was cut.
    """

    def __init__(self, max_event_size: int = DEFAULT_MAX_EVENT) -> None:
        if max_event_size < 1:
            raise ValueError("max_event_size must be at least 1")
        self.max_event_size = max_event_size
        self.finished = False  # the closing "]" arrived
        self._seq = 0
        self._buf = bytearray()  # bytes from the span start (only the current chunk while skipping)
        self._base = 0  # absolute offset of _buf[0]
        self._pos = 0  # scan position in _buf
        self._span_start = 0
        self._state = _OPEN
        self._kind = _CONTAINER
        self._value_start = 0  # absolute offset of the current element's first byte
        self._depth = 0
        self._in_string = False
        self._escaped = False  # a backslash ended the data seen so far
        self._skipping = False
        self._dropped = 0  # bytes after a stop that were not kept
        self._closed = False

    def feed(self, data: bytes) -> list[JSONValue | Malformed]:
        if self._closed:
            raise RuntimeError("feed() after close()")
        if self._state == _STOPPED:
            room = self.max_event_size - len(self._buf)
            self._dropped += max(0, len(data) - max(room, 0))
            self._buf += data[: max(room, 0)]
            return []
        self._buf += data
        out: list = []
        self._scan(out)
        if self._state != _STOPPED:
            if self._skipping:
                self._base += len(self._buf)
                self._buf.clear()
                self._pos = 0
            elif self._base + len(self._buf) - self._span_start > self.max_event_size:
                self._skipping = True
                self._base += len(self._buf)
                self._buf.clear()
                self._pos = 0
        return out

    def close(self) -> list[JSONValue | Malformed | Tail]:
        if self._closed:
            return []
        self._closed = True
        out: list = []
        end = self._base + len(self._buf) + (self._dropped if self._state == _STOPPED else 0)
        if self._skipping:
            error = OversizeError(
                f"value longer than {self.max_event_size} bytes, skipped; the stream ended inside it",
                self._span_start,
            )
            out.append(Malformed(self._seq, self._span_start, end, b"", error, False))
        elif end > self._span_start:
            raw = bytes(self._buf)
            cut = True
            if self._state == _STOPPED:
                reason = "decoder stopped at an error"
                if self._dropped:
                    reason += f"; {self._dropped} later bytes were not kept (over max_event_size)"
            elif self._state == _DONE:
                reason, cut = "the closing bracket and whitespace after the last element", False
            elif self._state == _VALUE:
                reason = "no closing ']': the stream ended inside an element"
            elif self._state == _OPEN:
                reason = "no '[': the array never started"
            else:
                reason = "no closing ']': the stream ended between elements"
            out.append(Tail(self._seq, self._span_start, end, raw, reason, cut))
        else:
            return out
        self._seq += 1
        self._buf.clear()
        return out

    def _scan(self, out: list) -> None:
        buf = self._buf
        size = len(buf)
        i = self._pos
        state = self._state
        while i < size:
            if state == _VALUE:
                i = self._scan_value(buf, i, size)
                if self._depth or self._in_string or self._kind == _ATOM and i >= size:
                    break  # the element continues in the next chunk
                self._emit_value(buf, i, out)
                if self._state == _STOPPED:
                    return
                buf = self._buf
                size = len(buf)
                i = self._pos
                state = self._state
                continue
            m = _NOT_SPACE.search(buf, i)
            if m is None:
                i = size
                break
            i = m.start()
            c = buf[i]
            if state == _OPEN:
                if c != 91:  # "["
                    out.append(self._stop(i + 1, i, "the body does not start with '['"))
                    return
                state = _FIRST
            elif state == _DONE:
                out.append(self._stop(i + 1, i, "data after the closing ']'"))
                return
            elif state == _AFTER:
                if c == 44:  # ","
                    state = _NEXT
                elif c == 93:  # "]"
                    state = _DONE
                    self.finished = True
                else:
                    found = chr(c)
                    out.append(self._stop(i + 1, i, f"expected ',' or ']' after an element, found {found!r}"))
                    return
            elif c == 93 and state == _FIRST:
                state = _DONE
                self.finished = True
            elif c in (44, 93):  # "," or "]" where an element must start
                out.append(self._stop(i + 1, i, f"expected an element, found {chr(c)!r}"))
                return
            else:
                state = _VALUE
                self._value_start = self._base + i
                self._depth = 0
                self._in_string = False
                self._escaped = False
                if c in (123, 91):  # "{" or "["
                    self._kind = _CONTAINER
                    self._depth = 1
                elif c == 34:  # '"'
                    self._kind = _STRING
                    self._in_string = True
                else:
                    self._kind = _ATOM
                self._state = state
                i += 1
                continue
            i += 1
        self._pos = i
        self._state = state

    def _scan_value(self, buf: bytearray, i: int, size: int) -> int:
        """Advance through the current element; return where scanning stopped (just
        after the element when it is complete)."""
        if self._kind == _ATOM:
            m = _ATOM_END.search(buf, i)
            return size if m is None else m.start()
        if self._escaped:
            self._escaped = False
            i += 1
        depth = self._depth
        in_string = self._in_string
        while i < size:
            if in_string:
                m = _STRING_SPECIAL.search(buf, i)
                if m is None:
                    i = size
                    break
                j = m.start()
                if buf[j] == 92:  # a backslash escapes the next byte
                    if j + 1 >= size:
                        self._escaped = True
                        i = size
                        break
                    i = j + 2
                    continue
                in_string = False
                i = j + 1
                if depth == 0:  # a top-level string element
                    break
            else:
                m = _STRUCTURE.search(buf, i)
                if m is None:
                    i = size
                    break
                j = m.start()
                c = buf[j]
                i = j + 1
                if c == 34:
                    in_string = True
                elif c == 123 or c == 91:
                    depth += 1
                else:
                    depth -= 1
                    if depth == 0:
                        break
        self._depth = depth
        self._in_string = in_string
        return i

    def _emit_value(self, buf: bytearray, end: int, out: list) -> None:
        """The element ending at ``end`` (relative) is complete: yield or report it."""
        base = self._base
        start = self._value_start - base
        if self._skipping:
            error = _oversize(self.max_event_size, self._span_start)
            out.append(Malformed(self._seq, self._span_start, base + end, b"", error, False))
            self._skipping = False
        elif base + end - self._span_start > self.max_event_size:
            error = _oversize(self.max_event_size, self._span_start)
            out.append(Malformed(self._seq, self._span_start, base + end, b"", error, False))
        else:
            try:
                value = loads(buf[start:end])
            except orjson.JSONDecodeError as exc:
                out.append(self._stop(end, start, f"array element is not JSON: {exc}"))
                return
            raw = bytes(buf[self._span_start - base : end])
            out.append(JSONValue(self._seq, self._span_start, base + end, raw, value))
        self._seq += 1
        self._span_start = base + end
        del buf[: max(end, 0)]
        self._base = base + max(end, 0)
        self._pos = 0
        self._state = _AFTER

    def _stop(self, end: int, offset: int, message: str) -> Malformed:
        """A syntax error: report the span up to relative ``end`` and stop for good."""
        base = self._base
        # past the size limit the bytes were (or, chunked otherwise, would have been) dropped
        oversize = self._skipping or base + end - self._span_start > self.max_event_size
        raw = b"" if oversize else bytes(self._buf[self._span_start - base : end])
        error = InvalidJSON(message, base + offset)
        event = Malformed(self._seq, self._span_start, base + end, raw, error, True)
        self._seq += 1
        self._span_start = base + end
        del self._buf[: max(end, 0)]
        self._base = base + max(end, 0)
        self._pos = 0
        self._state = _STOPPED
        self._skipping = False
        if len(self._buf) > self.max_event_size:  # memory stays bounded after a stop
            self._dropped += len(self._buf) - self.max_event_size
            del self._buf[self.max_event_size :]
        return event
