"""Server-Sent Events (``text/event-stream``) per the WHATWG HTML event-stream rules.

The decoder works on bytes, not text: CR and LF never occur inside a UTF-8 multibyte
sequence, so splitting lines on bytes and decoding each field value afterwards gives
the same characters as decoding the whole stream first, and it keeps exact offsets.

Rules that matter on the wire, all applied here:

* Lines end in LF, CR or CRLF, mixed freely. A CR that ends the data seen so far is
  held back until the next byte (or ``close()``) says whether an LF follows it, so a
  CRLF split between two reads is one line end, not two.
* One UTF-8 BOM is dropped at the very start of the stream only; its bytes belong to
  the first event's span.
* ``:`` starts a comment. A line without ``:`` is a field with an empty value. One
  space after the colon is dropped. ``data`` lines join with LF. An ``id`` holding
  NUL is ignored; the last ID persists from event to event. ``retry`` counts only
  when it is all ASCII digits.
* A blank line dispatches the event, unless no ``data`` line came (then nothing is
  dispatched, but an ``id`` in it still took effect). The type defaults to
  ``message``.
* At ``close()`` an event without its blank line is NOT dispatched: it comes back as
  a ``Tail`` with its bytes.

Where the Python SDKs (openai, anthropic, httpx-sse) depart from these rules in a way an
app notices, the decoder still follows the rules and notes the difference: they dispatch
an event with empty data at a blank line that ends a block with no data line but an event
type or a valid retry, and at every blank line once an ID was set. Those blank lines are
listed in ``empty_dispatches``, a run of them as one note (the first few notes, or, for a caller
that takes them after every read, all); the dialect decides what its SDK makes of them.

Spans tile the stream: comments, keep-alives and data-less events belong to the span
of the next dispatched event. ``SSEEvent.retry`` is the last valid ``retry`` inside
the event's span. Invalid UTF-8 is replaced where it lands in a value, and every
sequence that is not UTF-8 in a line of the event's span is counted in its
``invalid_utf8``: comments, ignored fields and overridden values too, as the SDKs
decode every line strictly and raise on any of them. The decoder's ``invalid_utf8``
counts the whole stream, the lines after the last event too (no event carries those;
the ``Tail``'s reason says so), but not an unfinished last line, which a cut may have
split inside a character.

A span that grows beyond ``max_event_size`` is not buffered: the decoder drops it,
skips to the next blank line and reports the whole skipped run as one non-fatal
``Malformed(OversizeError)`` whose ``raw`` is empty (its bytes were not kept; ``end -
start`` says how many there were). The rule is positional (a line ending more than
``max_event_size`` bytes after the span start is where skipping begins), so the
result does not depend on how the bytes were chunked. An ``id`` or ``retry`` line
inside it (within the limit itself) still takes effect, as the SSE rules and the
SDKs apply it: the id outlasts its event, and the events after it carry it.
Comments and blank lines alone make no event: when a line takes a span that holds
nothing else past the limit, the span so far is reported as a non-fatal
``Malformed(LongIdleRun)`` (``raw`` empty) and a new span starts at that line, so the
event after a long run of keep-alives is decoded as it came.

Speed comes from doing per-event work in C where the stream allows it. A read of
the stream nearly every provider sends (LF line ends, ``event: T`` + ``data: D`` or
``data: D`` alone, then a blank line) is cut into events in one pass of the compiled
loop (``_accel.c``), or, without it, by one regular-expression scan (``_lf_run``); a
run of such events with CRLF, or with keep-alive comments in between, is cut up with
joins, splits and maps over the whole run; anything else takes the line-by-line path,
which implements every rule. Tests hold the shortcuts to the line-by-line path
(``_shortcuts = False``), the compiled loop to the Python one, and all paths to a
plain reading of the spec.
"""

from __future__ import annotations

import re
from itertools import accumulate, chain, repeat
from itertools import count as count_from
from operator import add, index

from . import accel
from .errors import LongIdleRun, OversizeError
from .events import DEFAULT_MAX_EVENT, Malformed, SSEEvent, Tail

_BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"(\r\n|\r|\n)")
_plus_one = (1).__add__
# a field's start inside a ":" comment line, which no keep-alive comment holds: a cut inside a comment
# joined to the next line ("data: ..." or "event: ...") makes one
_FUSED_FIELD = re.compile(rb"(data|event):")
# one whole event of the common LF-only shape: (its bytes, its type or b"", its data)
_LF_EVENT = re.compile(rb"((?:event: ([^\n]*)\n)?data: ([^\n]*)\n\n)")
_type_names: dict[bytes, str] = {b"": "message"}


_new = tuple.__new__  # builds an event from a tuple of its fields, in C (see events.py)
_decode = bytes.decode
_join = b"".join  # joins a bytearray and bytes in one copy each (bytes(buf) + data copies buf twice)


def _text(value: bytes) -> tuple[str, int]:
    """Decode UTF-8 with replacement; also return how many replacements were made."""
    try:
        return value.decode(), 0
    except UnicodeDecodeError:
        text = value.decode("utf-8", "replace")
        # A U+FFFD that was genuinely in the stream is not a replacement.
        return text, text.count("\ufffd") - value.count(b"\xef\xbf\xbd")


def _type_name(value: bytes) -> tuple[str, int]:
    name = _type_names.get(value)
    if name is not None:
        return name, 0
    name, bad = _text(value)
    if not bad and len(value) <= 64 and len(_type_names) < 512:
        _type_names[value] = name
    return name, bad


def _clean_type_names(types) -> list[str] | None:
    """The event names of ``types`` (raw ``event:`` values), or None when one holds bytes that
    are not UTF-8 (the line path counts those replacements)."""
    names = list(map(_type_names.get, types))
    if None in names:
        for i, type_ in enumerate(types):
            if names[i] is None:
                names[i], bad = _type_name(type_)
                if bad:
                    return None
    return names


def _first_event_end(work: bytes) -> int:
    """Where the first blank line in ``work`` (which starts at a line start) ends, when
    the line ends are all LF or all CRLF; else 0."""
    if 13 not in work:
        if work[:1] == b"\n":
            return 1
        found = work.find(b"\n\n")
        return found + 2 if found >= 0 else 0
    if work.count(b"\r\n") == work.count(13) == work.count(10):
        if work[:2] == b"\r\n":
            return 2
        found = work.find(b"\r\n\r\n")
        return found + 4 if found >= 0 else 0
    return 0


_FIELD, _RETRY_FIELD = 1, 2  # SSEDecoder._fields: a field line since the last blank line; one was a valid retry
_KEPT_EMPTY_DISPATCHES = 16
_UNKNOWN_VALUE_KEPT = 4096  # bytes of the first unknown field's value kept: an error's JSON fits
_OTHER_LINES_KEPT = 64 * 1024  # bytes of SSEDecoder.other_lines kept: a provider's raw error JSON fits...
_OTHER_LINES_MAX = 256  # ...in at most this many lines


def _long_idle_run(seq: int, start: int, end: int, limit: int) -> Malformed:
    error = LongIdleRun(f"{end - start} bytes of comments or blank lines alone, which the next line would take past "
                        f"the {limit}-byte limit, skipped as the SSE rules skip them", start)
    return Malformed(seq, start, end, b"", error, fatal=False)


def _line_start(work: bytes, end: int, line: bytes) -> int:
    """Where ``line``, whose line end ends at ``end`` in ``work``, starts."""
    return end - len(line) - (2 if work[end - 2 : end] == b"\r\n" else 1)


_LINES_AT_ONCE = 64 * 1024  # bytes of a read split into lines at once: one object per line of them
_PIECES_LISTED = 16  # data values, or reads, of an unfinished event kept one by one before _join_in_place


def _join_in_place(pieces: list, sep: bytes) -> None:
    """Make ``pieces`` one bytearray of them all (``sep`` between them), grown in place from then
    on: an event of many lines, or one that came in many reads, holds one object, not one per
    line or read. (``bytes.join`` takes a bytearray among the bytes it joins.)"""
    head = pieces[0]
    if type(head) is not bytearray:
        head = bytearray(head)
    head += sep
    head += sep.join(pieces[1:])
    pieces[:] = (head,)


_HOLD = 4096  # an unfinished event up to this size is kept unparsed until it completes


def _is_event_start(work: bytes, before: int, limit: int) -> bool:
    """Is ``work`` the start of one event, not yet ended, small enough to keep whole?"""
    if not work or len(work) > _HOLD or before + len(work) > limit:
        return False
    if 13 not in work:
        return work[0] != 10 and work.find(b"\n\n") < 0  # find: "in" is slower on bytes
    return (
        work.count(b"\r\n") == work.count(13) == work.count(10)
        and not work.startswith(b"\r\n")
        and work.find(b"\r\n\r\n") < 0
    )


class SSEDecoder(accel.SSEFeed):
    """Incremental ``text/event-stream`` decoder: ``feed(bytes)`` and ``close()``.

    ``feed`` is compiled where this install has ``_accel``: a read without CR that ``_feed`` would
    only append (``_quick``, ``_buf`` stays within ``_buf_room``, and the read has no LF, or,
    ``_between_events``, makes no blank line and ``_buf`` stays within ``_HOLD``) is appended
    without entering Python, and every other read goes to ``_feed``. The compiled base holds
    those four fields; the Python code below reads and writes them as attributes all the same.
    """

    _shortcuts = True  # False: every byte takes the general line-by-line path (tests compare the two)
    _compiled_run = accel.sse_lf_events  # None: _lf_run runs in Python (tests compare the two)

    def __init__(
        self, max_event_size: int = DEFAULT_MAX_EVENT, *, note_other_lines: bool = False,
        keep_all_empty_dispatches: bool = False,
    ) -> None:
        """``note_other_lines``: also list every line that is neither blank nor ``data: `` + value
        (comments, other fields, ``data:`` without its space, stray text) in ``other_lines``, for a
        client that reads nothing else as SSE (google-genai). Every byte then takes the line path.

        ``keep_all_empty_dispatches``: note every blank line the SDKs dispatch (``empty_dispatches``),
        not only the first few, for a caller that empties the list after every ``feed``: a read then
        leaves at most one note per few bytes it brought (one for a run of blank lines), as it leaves
        at most one event per few bytes, and what the caller judges from the notes does not depend
        on how the stream was read."""
        max_event_size = index(max_event_size)  # an int in both builds (the compiled base keeps one)
        if max_event_size < 1:
            raise ValueError("max_event_size must be at least 1")
        self.max_event_size = max_event_size
        self.note_other_lines = note_other_lines
        if note_other_lines:
            self._shortcuts = False  # the bulk paths take comments and fields without looking at them
        # (seq of the event whose span holds it, offset, the line): the first _OTHER_LINES_MAX lines
        # within _OTHER_LINES_KEPT bytes are kept, all are counted
        self.other_lines: list[tuple[int, int, bytes]] = []
        self.other_line_count = 0
        self._other_kept = 0
        # lines of a field the SSE rules ignore (not data, event, id or retry), which no provider
        # sends, but a cut event's bytes joined to the next line make: (seq, offset, the name) of
        # the first, and how many
        self.first_unknown_field: tuple[int, int, str, str] | None = None  # (..., its value's start)
        self.unknown_field_count = 0
        self._unknown: tuple[bytes, bytes] | None = None  # the field line just read: name, value
        # comment lines that hold a field's start (": OPENROUTER PROCdata: {..."): a cut inside a
        # comment joined to the next line, whose field the SSE rules skip with the comment: (seq,
        # offset of the field, its name) of the first, and how many
        self.first_fused_comment: tuple[int, int, str] | None = None
        self.fused_comment_count = 0
        self.invalid_utf8 = 0  # sequences not UTF-8 over the whole stream, after the last event too
        self.last_event_id = ""  # the last event ID buffer, persists across events
        self.retry: int | None = None  # the stream's reconnection time, once set
        self._seq = 0
        self._offset = 0  # absolute offset of _buf[0]
        # bytes not parsed yet: the unfinished line (maybe ending in a held-back CR), or
        # a small unfinished event kept whole
        self._buf = bytearray()
        self._parts: list[bytes] = []  # processed bytes of the current span (see _join_in_place)
        self._span_start = 0
        self._buf_room = max_event_size  # len(_buf) beyond which the span is oversize
        self._data: list[bytes] = []  # the event's data values so far (see _join_in_place)
        self._type = b""
        self._fields = 0  # a non-data field line since the last blank line: _FIELD, or _RETRY_FIELD for a valid retry
        # Blank lines where WHATWG dispatches nothing but the Python SDKs (openai, anthropic,
        # httpx-sse) dispatch an event with empty data: the block had no data line but an event
        # type or a valid retry, or an event ID was ever set (they test the persisted ID buffer).
        # Each note is a run of them: (seq of the event whose span holds them, offset of the first
        # one's blank line, their type or None, how many, how far apart): the k-th (from 0) is at
        # offset + k * step. The first few notes are kept (all of them with
        # keep_all_empty_dispatches), every blank line is counted (empty_dispatch_count).
        self.empty_dispatches: list[tuple[int, int, str | None, int, int]] = []
        self.empty_dispatch_count = 0
        self._empty_kept = None if keep_all_empty_dispatches else _KEPT_EMPTY_DISPATCHES
        self._span_retry: int | None = None
        self._span_invalid = 0
        self._skipping = False  # inside an oversize span: dropping bytes to the next blank line
        self._skip_partial = False  # the dropped unfinished line had bytes
        self._bom_pending = True
        self._quick = False  # feed may just append: no pending BOM, CR, skip or close
        self._between_events = False  # no event half parsed: _buf holds a whole event's start
        self._closed = False

    @property
    def offset(self) -> int:
        """Bytes fed so far."""
        return self._offset + len(self._buf)

    def _feed(self, data: bytes) -> list[SSEEvent | Malformed]:
        if type(data) is not bytes:  # a memoryview has no find(), and every read must decode alike
            data = bytes(data)
        if self._quick and 13 not in data:  # int tests: memchr, cheap ("in" with bytes is not)
            buf = self._buf
            # no line ends, or (between events) no blank line: nothing can complete yet
            if 10 not in data or (
                self._between_events
                and data.find(b"\n\n") < 0
                and (data[0] != 10 or buf[-1:] != b"\n")
                and len(buf) + len(data) <= _HOLD
            ):
                buf += data
                if len(buf) > self._buf_room:
                    return self._overflow()
                return []
            if self._between_events and self._shortcuts and 13 not in buf:  # a held CRLF's halves
                events = self._lf_run(_join((buf, data)) if buf else bytes(data))
                if events is not None:
                    return events
        if self._closed:
            raise RuntimeError("feed() after close()")
        if not data:
            return []
        if self._bom_pending:
            data = bytes(self._buf) + data
            self._buf.clear()
            if len(data) < 3 and _BOM.startswith(data):
                self._buf += data
                return []
            self._bom_pending = False
            if data.startswith(_BOM):
                self._parts.append(_BOM)
                self._offset = 3
                self._buf_room = self.max_event_size - 3
                data = data[3:]
            if self._shortcuts and 13 not in data:  # the first read: nothing pending yet
                self._quick = self._between_events = True  # the general path resets both
                events = self._lf_run(bytes(data))
                if events is not None:
                    return events
        if self._skipping and 10 not in data and 13 not in data and not self._buf and (
                self._skip_partial or len(data) > self.max_event_size or not _may_be_applied_while_skipping(bytes(data[:5]))):
            self._offset += len(data)
            self._skip_partial = True
            return []
        if self._buf:
            data = _join((self._buf, data))
            self._buf.clear()
        return self._process(bytes(data), final=False)

    if accel.SSEFeed is object:
        feed = _feed

    __getstate__, __setstate__ = accel.copied_with(accel.SSEFeed)

    def close(self) -> list[SSEEvent | Malformed | Tail]:
        if self._closed:
            return []
        self._closed = True
        self._quick = False
        out: list = []
        if self._buf:
            work = bytes(self._buf)
            self._buf.clear()
            self._bom_pending = False  # a stream shorter than a BOM: its bytes are not one
            out = self._process(work, final=True)
            del work  # an unfinished last line is in _buf again: not held twice
        end = self._offset + len(self._buf)
        if self._skipping:
            error = OversizeError(
                f"event longer than {self.max_event_size} bytes, skipped; the stream ended inside it",
                self._span_start,
            )
            out.append(Malformed(self._seq, self._span_start, end, b"", error, fatal=False))
        elif self._parts or self._buf:
            unended = bool(self._buf)
            if unended:
                self._parts.append(bytes(self._buf))
                self._buf.clear()  # (a long last line is not held three times)
            raw = b"".join(self._parts)
            if unended:
                reason, cut = "the stream ended inside a line: the last event was not dispatched", True
            elif self._data or self._type or self._fields:
                reason, cut = "no blank line after the last event: it was not dispatched", True
            else:
                reason, cut = "only comments or data-less events after the last event", False
            # no event carries what was not UTF-8 in the lines after the last one (the unfinished
            # line aside: a cut may split a character), so only the stream's count does
            invalid = self._span_invalid + sum(_text(value)[1] for value in self._data if not value.isascii())
            self._data.clear()
            if invalid:
                self.invalid_utf8 += invalid
                reason += f"; {invalid} sequence(s) in its lines are not UTF-8"
            out.append(Tail(self._seq, self._span_start, end, raw, reason, cut))
        else:
            return out
        self._seq += 1
        self._parts.clear()
        self._buf.clear()
        self._offset = end
        return out

    def _process(self, work: bytes, final: bool) -> list[SSEEvent | Malformed]:
        """Decode every complete line of ``work``, which starts at a line start."""
        out: list = []
        if self._shortcuts and not self._skipping and self._pending():
            # finish the event the last read left half done, then take the fast path
            done = _first_event_end(work)
            if done:
                self._lines(work[:done], False, out)
                work = work[done:]
        if self._shortcuts and not (self._skipping or self._pending()):
            done = self._common_events(work, out)
            if done:
                work = work[done:]
                self._offset += done
            if not final and _is_event_start(work, self._offset - self._span_start, self.max_event_size):
                # keep a small unfinished event whole, so the next read starts at an
                # event boundary and takes the fast path
                self._buf += work
                self._buf_room = self._span_start + self.max_event_size - self._offset
                self._quick = self._between_events = True
                return out
        self._lines(work, final, out)
        self._between_events = self._quick and not self._pending()
        return out

    def _pending(self) -> bool:
        """An event is half read: a data or event line, bytes that were not UTF-8, or a retry (the
        SDKs dispatch on its blank line; the line path notes that) came since the last blank line."""
        return bool(self._data or self._type or self._span_invalid) or self._fields == _RETRY_FIELD

    def _lf_run(self, work: bytes) -> list[SSEEvent | Malformed] | None:
        """The fastest path, for the stream nearly every provider sends: LF line ends, and
        each event ``event: T`` + ``data: D`` (or ``data: D`` alone), spelled with the
        space, then a blank line. ``work`` starts at an event boundary (nothing pending).
        The compiled loop, or else one regular-expression scan, cuts every complete event of
        ``work`` into its bytes, type and data; when the events tile everything up to the
        last blank line, they are dispatched here and an unfinished event after them is kept
        whole for the next read. Anything else (a comment, an ``id``, two data lines, no
        space, a lone blank line, invalid UTF-8, an oversize event) returns None, and the
        caller takes the general path with nothing changed. The compiled loop answers the
        same list or None, or False when an event type has no name yet: the Python code
        below then names it (and judges the read itself)."""
        done = work.rfind(b"\n\n") + 2
        if done < 2:
            return None
        before = self._offset - self._span_start  # bytes of the first event's span already seen
        limit = self.max_event_size
        if self._compiled_run is not None:
            events = self._compiled_run(
                work, done, self._seq, self._span_start, self._offset, before, limit, self.last_event_id,
                self._span_retry, b"".join(self._parts), _type_names, SSEEvent,
            )  # fmt: skip
            if events is None:
                return None
            if events is not False:  # False: a new event type, which the Python loop names
                self._parts.clear()
                self._seq += len(events)
                return self._dispatched(events, work, done)
        if work.find(b"\n\n") + 2 == done:  # one event: the usual read when a proxy relays as sent
            if before + done > limit:
                return None  # the line path reports oversize events
            return self._lf_one(work, done)
        found = _LF_EVENT.findall(work, 0, done)
        if not found:
            return None
        raws, types, values = zip(*found)
        sizes = list(map(len, raws))
        if sum(sizes) != done:  # something else sits between the events
            return None
        if before + done > limit and (before + sizes[0] > limit or max(sizes) > limit):
            return None  # the line path reports oversize events
        names = _clean_type_names(types)
        if names is None:
            return None  # the line path counts the replacements
        try:
            texts = list(map(_decode, values))  # cheaper than decoding one LF join and splitting it
        except UnicodeDecodeError:
            return None  # the line path counts the replacements
        base = self._offset
        bounds = list(accumulate(sizes, initial=base))
        bounds[0] = self._span_start
        if self._parts:
            raws = [b"".join(self._parts) + raws[0], *raws[1:]]
            self._parts.clear()
        seq = self._seq
        events = list(
            map(
                _new, repeat(SSEEvent), zip(
                    count_from(seq), bounds, bounds[1:], raws, names, texts,
                    repeat(self.last_event_id), chain((self._span_retry,), repeat(None)), repeat(0),
                ),
            )
        )
        self._seq = seq + len(events)
        return self._dispatched(events, work, done)

    def _lf_one(self, work: bytes, done: int) -> list[SSEEvent | Malformed] | None:
        """``_lf_run`` for a read that completes exactly one event (ending at ``done``):
        the same checks, by hand, which costs less than the scan for a single event."""
        if work.startswith(b"data: "):
            if work.find(b"\n", 6) != done - 2:
                return None  # more than one line
            type_ = b""
            value = work[6 : done - 2]
        elif work.startswith(b"event: "):
            type_end = work.find(b"\n", 7)
            data_at = type_end + 1
            if not work.startswith(b"data: ", data_at) or work.find(b"\n", data_at) != done - 2:
                return None
            type_ = work[7:type_end]
            value = work[data_at + 6 : done - 2]
        else:
            return None
        name = _type_names.get(type_)
        if name is None:
            name, bad = _type_name(type_)
            if bad:
                return None  # the line path counts the replacements
        try:
            text = value.decode()
        except UnicodeDecodeError:
            return None  # the line path counts the replacements
        raw = work if done == len(work) else work[:done]
        if self._parts:
            raw = b"".join(self._parts) + raw
            self._parts.clear()
        event = _new(
            SSEEvent,
            (self._seq, self._span_start, self._offset + done, raw, name, text, self.last_event_id, self._span_retry, 0),
        )
        self._seq += 1
        return self._dispatched([event], work, done)

    def _dispatched(self, events: list, work: bytes, done: int) -> list[SSEEvent | Malformed]:
        """After the shortcut dispatched the events of ``work[:done]``: move past them and keep
        what follows (the start of the next event) for the next read."""
        self._span_start = self._offset = self._offset + done
        self._span_retry = None
        self._fields = 0
        limit = self.max_event_size
        buf = self._buf
        buf.clear()
        if done < len(work):
            rest = work[done:]
            if len(rest) <= _HOLD and len(rest) <= limit:
                buf += rest  # the start of the next event (it holds no blank line), kept whole
            else:
                events += self._process(rest, final=False)
        self._buf_room = limit + self._span_start - self._offset
        return events

    def _overflow(self) -> list[SSEEvent | Malformed]:
        """The buffer outgrew the size limit: decode the complete lines it holds, then
        skip what is left of the oversize event."""
        work = bytes(self._buf)
        self._buf.clear()
        out: list = []
        self._lines(work, False, out)
        self._between_events = self._quick and not self._pending()
        return out

    def _lines(self, work: bytes, final: bool, out: list, at_once: bool = False) -> None:
        """The line-by-line path: every rule, any line ends.

        A long read is split into lines a window at a time (``_lines_by_window``; ``at_once``: this
        is one), and the data values and the bytes of an event that outlasts a read are joined into
        one bytearray once there are many (``_join_in_place``), so none holds an object per line."""
        if len(work) > _LINES_AT_ONCE and not at_once:
            self._lines_by_window(work, final, out)
            return
        base = self._offset
        if 13 in work:
            pieces = _LINE_END.split(work)
            rest = pieces.pop()
            if not final and not rest and work[-1] == 13:  # a CR whose LF may follow
                pieces.pop()
                rest = pieces.pop() + b"\r"
            lines = pieces[0::2]
            ends = accumulate(map(add, map(len, lines), map(len, pieces[1::2])))
        else:
            lines = work.split(b"\n")
            rest = lines.pop()
            ends = accumulate(map(_plus_one, map(len, lines)))

        seq = self._seq
        span_start = self._span_start
        limit = span_start + self.max_event_size - base  # a line ending past this is oversize
        data = self._data
        type_ = self._type
        skipping = self._skipping
        partial = self._skip_partial
        if skipping:
            limit = -1
        seg = 0  # where the current span's unsaved bytes begin in work
        for line, end in zip(lines, ends):
            if end > limit and not (skipping or data or type_ or self._fields):
                # comments or blank lines alone outgrew the limit: no event, which the SSE rules skip. Reported
                # apart (their bytes not kept), and a span starts again at this line, so the event after them is judged
                begins = _line_start(work, end, line)
                if base + begins > span_start:
                    out.append(_long_idle_run(seq, span_start, base + begins, self.max_event_size))
                    seq += 1
                    span_start = base + begins
                    seg = begins
                    limit = begins + self.max_event_size
                    self._parts.clear()
            if end > limit:
                if not skipping:
                    skipping = True
                    limit = -1
                    data = []
                    type_ = b""
                    self._fields = 0
                    self._span_retry = None
                    self._span_invalid = 0
                    self._parts.clear()
                if not line and not partial:
                    error = OversizeError(
                        f"event longer than {self.max_event_size} bytes, skipped", span_start
                    )
                    out.append(Malformed(seq, span_start, base + end, b"", error, fatal=False))
                    seq += 1
                    span_start = base + end
                    seg = end
                    skipping = False
                    self._fields = 0
                    self._span_retry = None
                    limit = end + self.max_event_size
                elif not partial and (line[:2] == b"id" or line[:5] == b"retry") and len(line) <= self.max_event_size:
                    # the SSE rules apply an id or a retry wherever it stands, and the id outlasts its event:
                    # the events after this skipped one carry it, as the app's do
                    self._field(line, data, type_)
                    self._unknown = None  # (a longer name that begins so: not reported from a skipped event)
                partial = False
                continue
            if not line:
                if data:
                    if len(data) == 1:
                        payload = data[0]
                    elif type(data[0]) is bytearray:  # joined in place (many lines): decoded there, not copied
                        _join_in_place(data, b"\n")
                        payload = data[0]
                    else:
                        payload = b"\n".join(data)
                    try:
                        text = payload.decode()
                        bad = 0
                    except UnicodeDecodeError:
                        text, bad = _text(payload)
                    data = []
                    payload = None  # (the values freed before the event's bytes are joined)
                    name = _type_names.get(type_)
                    if name is None:
                        name = _type_name(type_)[0]  # its line was counted when read
                    bad += self._span_invalid
                    if self._parts:
                        self._parts.append(work[seg:end])
                        raw = b"".join(self._parts)
                        self._parts.clear()
                    else:
                        raw = work[seg:end]
                    out.append(
                        _new(SSEEvent, (
                            seq, span_start, base + end, raw, name, text,
                            self.last_event_id, self._span_retry, bad,
                        ))
                    )
                    if bad:
                        self.invalid_utf8 += bad
                        self._span_invalid = 0
                    seq += 1
                    span_start = base + end
                    seg = end
                    limit = end + self.max_event_size
                    self._span_retry = None
                elif type_ or self.last_event_id or self._fields == _RETRY_FIELD:
                    self._empty_dispatch(seq, base + _line_start(work, end, line), type_)
                type_ = b""
                self._fields = 0
            elif line.startswith(b"data:"):
                if line[5:6] == b" ":
                    data.append(line[6:])
                else:
                    data.append(line[5:])
                    if self.note_other_lines:
                        self._other_line(seq, base, work, end, line)
            else:
                if self.note_other_lines:
                    self._other_line(seq, base, work, end, line)
                if not line.isascii():
                    # the SDKs decode every line strictly, a comment or an ignored field too
                    self._span_invalid += _text(line)[1]
                if line.startswith(b"event:"):
                    type_ = line[7:] if line[6:7] == b" " else line[6:]
                elif line[0] != 58:  # not a ":" comment
                    type_ = self._field(line, data, type_)
                    if self._unknown is not None:
                        self._unknown_field(seq, base + _line_start(work, end, line))
                else:
                    field = _FUSED_FIELD.search(line)
                    if field is not None:
                        self._fused_comment(seq, base + _line_start(work, end, line), field)
        if len(data) > _PIECES_LISTED:  # an event of many lines, not ended in this read
            _join_in_place(data, b"\n")  # (an LF ends bytes that are not UTF-8 as a value's end does)
        done = len(work) - len(rest)  # the bytes whose lines were taken
        if skipping:
            if not partial and len(rest) <= self.max_event_size and _may_be_applied_while_skipping(rest):
                kept = rest  # an id or retry line the next read may end, applied then, as whole in one read
            else:
                kept = b"\r" if rest[-1:] == b"\r" else b""
            self._skip_partial = partial or len(rest) > len(kept)
            self._offset = base + len(work) - len(kept)
            self._buf += kept
        else:
            self._skip_partial = False
            if seg < done:
                self._parts.append(work[seg:done])
                if len(self._parts) > _PIECES_LISTED:  # an event that came in many reads
                    _join_in_place(self._parts, b"")
            self._offset = base + done
            self._buf += rest
        self._seq = seq
        self._span_start = span_start
        self._data = data
        self._type = type_
        self._skipping = skipping
        self._buf_room = span_start + self.max_event_size - self._offset
        if not skipping and len(self._buf) > self._buf_room:
            if not (data or type_ or self._fields) and self._offset > span_start:
                # the unfinished line outgrew the limit after comments or blank lines alone: as above, before it
                out.append(_long_idle_run(seq, span_start, self._offset, self.max_event_size))
                self._seq = seq + 1
                self._span_start = self._offset
                self._parts.clear()
                self._buf_room = self.max_event_size
            if len(self._buf) > self._buf_room:  # (the line alone is over the limit)
                self._start_skipping(bytes(self._buf))
        self._quick = not (self._skipping or self._closed) and self._buf[-1:] != b"\r"

    def _lines_by_window(self, work: bytes, final: bool, out: list) -> None:
        """``_lines`` of a long read, a window of about ``_LINES_AT_ONCE`` bytes at a time, each but
        the last ending at an LF (a line end, whether a CR comes before it or not): as if the read
        had come in those pieces, which the line path takes alike."""
        size = len(work)
        done = 0
        while done + _LINES_AT_ONCE < size:
            cut = work.rfind(b"\n", done, done + _LINES_AT_ONCE)
            if cut < 0:
                cut = work.find(b"\n", done + _LINES_AT_ONCE)  # a line longer than a window: whole
            if cut < 0 or cut + 1 == size:
                break
            self._lines(work[done : cut + 1], final, out, True)
            done = cut + 1
        self._lines(work[done:] if done else work, final, out, True)

    def _common_events(self, work: bytes, out: list) -> int:
        """The fast path: dispatch the run of common-shape events at the start of
        ``work`` and return how many bytes they took (the line path does the rest).

        Nearly every provider sends ``[event: T]`` + one ``data: D`` line + a blank
        line, all with LF or all with CRLF, sometimes with ``:`` keep-alive blocks in
        between. When ``work`` uses one line end throughout, splitting on a doubled
        line end cuts it into events at C speed. The caller ensures that no event is
        half read (no data or event type pending).
        """
        if 13 not in work:
            sep, nl, step = b"\n\n", 10, 2
        elif work.count(b"\r\n") == work.count(13) == work.count(10):
            sep, nl, step = b"\r\n\r\n", 13, 4
        else:
            return 0  # mixed or lone-CR line ends: the line path
        blocks = work.split(sep)
        blocks.pop()  # not followed by a blank line (yet)
        if not blocks:
            return 0
        half = step // 2
        if len(blocks) > 2:  # the set-up of the uniform path pays off over a few events
            done = self._uniform_events(work, blocks, sep[:half], out)
            if done:
                return done
        names = _type_names
        max_size = self.max_event_size
        last_id = self.last_event_id
        base = self._offset
        seq = self._seq
        start = self._span_start
        limit = start + max_size - base
        head = b"".join(self._parts)  # comments etc. already seen in this span
        retry = self._span_retry
        seg = pos = 0  # seg: where the current span begins in work
        for block in blocks:
            end = pos + len(block) + step
            if end > limit:
                break  # the line path reports oversize events
            if not block:
                if last_id:
                    break  # the SDKs dispatch an empty event here: the line path notes it
                pos = end  # a second blank line: no event, same span
                continue
            first = block[0]
            if first == 100 and block.startswith(b"data:"):  # "d"
                if nl in block:
                    break  # several lines
                name = "message"
                payload = block[6:] if block[5:6] == b" " else block[5:]
            elif first == 101 and block.startswith(b"event:"):  # "e"
                cut = block.find(nl, 6)
                data_at = cut + half
                if cut < 0 or not block.startswith(b"data:", data_at) or block.find(nl, data_at) >= 0:
                    break
                type_ = block[7:cut] if block[6] == 32 else block[6:cut]
                name = names.get(type_)
                if name is None:
                    name, bad = _type_name(type_)
                    if bad:
                        break  # the line path counts the replacements
                data_at += 5
                payload = block[data_at + 1 :] if block[data_at : data_at + 1] == b" " else block[data_at:]
            elif first == 58 and nl not in block and not last_id and block.isascii() and not _FUSED_FIELD.search(block):
                # a ":" comment line (the line path counts bytes that are not UTF-8, and notes a field in it): no
                # event, same span
                pos = end
                continue
            else:
                break
            try:
                text = payload.decode()
            except UnicodeDecodeError:
                break  # the line path counts the replacements
            if head:
                raw = head + work[seg:end]
                head = b""
            else:
                raw = work[seg:end]
            start_abs, start = start, base + end
            event = _new(SSEEvent, (seq, start_abs, start, raw, name, text, last_id, retry, 0))
            out.append(event)
            retry = None
            seq += 1
            seg = pos = end
            limit = end + max_size
        if not seg:
            return 0
        self._parts.clear()
        self._seq = seq
        self._span_start = start
        self._span_retry = retry
        self._fields = 0
        return seg

    def _uniform_events(self, work: bytes, blocks: list[bytes], line_end: bytes, out: list) -> int:
        """The fastest path: every block is ``event: T`` + ``data: D`` (or every block is
        ``data: D``), spelled with the space. Then whole-run joins, splits and maps in C
        do the parsing, and only building the events is left to a Python loop. Returns
        the bytes consumed, or 0 when the run is not uniform."""
        count = len(blocks)
        term = len(line_end)
        first = blocks[0]
        if first.startswith(b"event: "):
            lines = work.split(line_end, 3 * count)  # the run's lines, then the rest
            if len(lines) <= 3 * count or any(lines[2 : 3 * count : 3]):
                return 0
            # no line holds an LF, so an LF join splits back exactly at line starts
            types = b"\n".join(lines[0 : 3 * count : 3])[7:].split(b"\nevent: ")
            if len(types) != count:
                return 0
            names = _clean_type_names(types)
            if names is None:
                return 0
            data_lines = lines[1 : 3 * count : 3]
        elif first.startswith(b"data: "):
            lines = work.split(line_end, 2 * count)
            if len(lines) <= 2 * count or any(lines[1 : 2 * count : 2]):
                return 0
            names = repeat("message")
            data_lines = lines[0 : 2 * count : 2]
        else:
            return 0
        joined = b"\n".join(data_lines)
        if not joined.startswith(b"data: "):
            return 0
        try:
            texts = joined.decode()[6:].split("\ndata: ")
        except UnicodeDecodeError:
            return 0  # the line path counts the replacements
        if len(texts) != count:
            return 0
        sizes = list(map((2 * term).__add__, map(len, blocks)))
        ends = list(accumulate(sizes))
        base = self._offset
        before = base - self._span_start  # bytes of the first event's span already seen
        if before + ends[-1] > self.max_event_size:  # some event may be oversize
            if before + sizes[0] > self.max_event_size or max(sizes) > self.max_event_size:
                return 0  # the line path reports oversize events
        raws = list(map(work.__getitem__, map(slice, chain((0,), ends), ends)))
        if self._parts:
            raws[0] = b"".join(self._parts) + raws[0]
        ends_abs = list(map(base.__add__, ends))
        starts_abs = chain((self._span_start,), ends_abs)
        events = list(
            map(
                _new, repeat(SSEEvent), zip(
                    count_from(self._seq), starts_abs, ends_abs, raws, names, texts,
                    repeat(self.last_event_id), chain((self._span_retry,), repeat(None)), repeat(0),
                ),
            )
        )
        out += events
        self._parts.clear()
        self._seq += count
        self._span_start = ends_abs[-1]
        self._span_retry = None
        self._fields = 0
        return ends[-1]

    def _field(self, line: bytes, data: list[bytes], type_: bytes) -> bytes:
        """Apply a field line other than the common ``data:``/``event:`` forms."""
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if name == b"data":
            data.append(value)
            return type_
        if name == b"event":
            return value
        if not self._fields:
            self._fields = _FIELD
        if name == b"id":
            if 0 not in value:
                self.last_event_id = _text(value)[0]  # _lines counted its line's invalid bytes
        elif name == b"retry":
            if value.isdigit():  # bytes.isdigit is ASCII-only
                try:
                    self.retry = self._span_retry = int(value)
                except ValueError:  # over Python's int-from-text digit limit: absurd, ignore
                    pass
            if _sdk_takes_retry(value):
                self._fields = _RETRY_FIELD
        else:
            self._unknown = (name, value)
        return type_

    def _unknown_field(self, seq: int, offset: int) -> None:
        (name, value), self._unknown = self._unknown, None
        self.unknown_field_count += 1
        if self.first_unknown_field is None:
            self.first_unknown_field = (seq, offset, _type_name(name[:40])[0], _type_name(value[:_UNKNOWN_VALUE_KEPT])[0])

    def _fused_comment(self, seq: int, line_start: int, field: re.Match) -> None:
        self.fused_comment_count += 1
        if self.first_fused_comment is None:
            self.first_fused_comment = (seq, line_start + field.start(), field[1].decode())

    def _empty_dispatch(self, seq: int, offset: int, type_: bytes) -> None:
        self.empty_dispatch_count += 1
        name = _type_name(type_)[0] if type_ else None
        notes = self.empty_dispatches
        # (only while the notes hold every blank line so far: the first few notes stay the first ones)
        if notes and (self._empty_kept is None or sum(note[3] for note in notes) == self.empty_dispatch_count - 1):
            # a blank line as far after the last noted one as that is after the one before it, in
            # the same span and of the same type (a run of blank lines, a keep-alive comment
            # repeated): the last note counts it, so a read of many takes one note, not one each
            last_seq, first, last_name, count, step = notes[-1]
            if last_seq == seq and last_name == name and (count == 1 or offset == first + count * step):
                notes[-1] = (seq, first, name, count + 1, offset - first if count == 1 else step)
                return
        if self._empty_kept is None or len(notes) < self._empty_kept:
            notes.append((seq, offset, name, 1, 0))

    def _other_line(self, seq: int, base: int, work: bytes, end: int, line: bytes) -> None:
        self.other_line_count += 1
        if self._other_kept < _OTHER_LINES_KEPT and len(self.other_lines) < _OTHER_LINES_MAX:
            kept = line[: _OTHER_LINES_KEPT - self._other_kept]
            self._other_kept += len(kept) + 1
            self.other_lines.append((seq, base + _line_start(work, end, line), kept))

    def _start_skipping(self, pending: bytes) -> None:
        """The unfinished line in ``_buf`` already makes the span oversize: drop it (an id or retry
        line within the limit is kept, to be applied once ended, as ``_lines`` keeps one)."""
        if len(pending) <= self.max_event_size and _may_be_applied_while_skipping(pending):
            kept = pending
        else:
            kept = b"\r" if pending[-1:] == b"\r" else b""
        self._skipping = True
        self._skip_partial = len(pending) > len(kept)
        self._offset += len(pending) - len(kept)
        self._buf.clear()
        self._buf += kept
        self._parts.clear()
        self._data = []
        self._type = b""
        self._fields = 0
        self._span_retry = None
        self._span_invalid = 0
        self._quick = False


def _may_be_applied_while_skipping(line: bytes) -> bool:
    """Whether a line (or the start of one) is, or may grow into, an ``id`` or ``retry`` field: the
    SSE rules apply those even inside an event skipped for its size."""
    return b"id".startswith(line[:2]) or b"retry".startswith(line[:5])


def _sdk_takes_retry(value: bytes) -> bool:
    """Whether the SDKs' decoders (openai, anthropic, httpx-sse) take this retry value, and so
    dispatch an event at the block's blank line: they test ``int()`` of the text, which takes
    more than the spec's digits (a sign, spaces, underscores, non-ASCII digits)."""
    try:
        int(value.decode("utf-8", "replace"))
    except ValueError:
        return False
    return True
