"""Read a recording back, and check it against itself.

A recording is read one line at a time (``RecordingLines``): memory stays bounded by the
longest line the format allows (``MAX_LINE_BYTES``), not by the file. Every field the format
defines is checked as its line is read; a line that contradicts the format or its own bytes
raises ``RecordingError`` naming the line. What only the whole file can show (sums, sequence,
offsets, counts and hashes against the end line) is collected by ``RecordingCheck`` as
problems, line by line too.

A file whose writer stopped early (proxy killed, disk full) reads back with
``complete_file = False`` and a ``problem`` saying where it stops; it is never passed
off as a shorter complete turn. A file that is damaged in the middle raises.

``read_recording`` gathers everything into one ``Recording`` for callers that need the
frames at hand (replay); ``verify`` and ``show`` walk the lines instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from streamtap.providers import StreamEnd, VerdictKind
from streamtap.providers.common import dumps
from streamtap.wire import DEFAULT_MAX_EVENT, JSONValue, SSEEvent, Tail

from .compress import frames_ended, open_lines
from .content import content_encoded
from .writer import FELL_BEHIND, FORMAT, FORMATS, SUM_HEX, RecordingError, _described, _escaped, frame_sum

# The longest line a writer can produce: a frame holds at most one event of max_event bytes
# (a larger one is reported as malformed, never kept whole). Its bytes appear twice at most
# (``raw`` and an event-stream ``payload``), and JSON escaping turns a control byte into six
# (\u00XX), so 12 bytes per event byte, plus room for the other fields. A header keeps the
# request body only up to a size that fits too (header.MAX_RECORDED_BODY). `report` and `index`
# take no longer line either, so every verb calls the same files damaged.
MAX_LINE_BYTES = 12 * DEFAULT_MAX_EVENT + 2**20

READ_PIECE = 1024 * 1024  # a line longer than this is read in pieces of this size

_SUM = re.compile(rb"[0-9a-f]{%d}" % SUM_HEX)
_SHA256 = re.compile(rb"[0-9a-f]{64}")
# A first line that is a JSON object naming the recording format is a recording's header, whole,
# cut or damaged (report, index and verify sort the files they are given by this mark)
# (a JSON member, spaces allowed as JSON allows them: the mark quoted inside an answer's JSON text has its quotes escaped)
FORMAT_MARK = re.compile(rb'"format"[ \t]*:[ \t]*"streamtap-recording/')
CONVERTED = "ends in CR LF; the format ends lines with LF alone (was the file converted?)"
# The lines that follow a recording's header, by type, with fields each always has: a file whose
# first line is one of them is a recording that lost its header, not another program's JSON lines
BODY_LINE_FIELDS = {
    "frame": ("seq", "offset", "len", "sum"),
    "tail": ("seq", "offset", "len", "sum"),
    "raw": ("offset", "len", "sum", "why"),
    "reads": ("reads",),
    "note": ("kind", "message"),
    "end": ("frames", "bytes", "sha256"),
}
STREAM_ENDS = frozenset(e.value for e in StreamEnd)
VERDICT_KINDS = frozenset(k.value for k in VerdictKind)


def open_recording(path: str | os.PathLike[str]) -> BinaryIO:
    """The recording's bytes, as a binary file object read from the start.

    The one place that knows how a recording is stored on disk."""
    return open_lines(path)


# What the json module writes and orjson refuses to read. The writer writes a line with the json
# module where orjson cannot write it (nested deeper than 254 levels, an integer past 64 bits, as
# the SDKs' json.loads reads tool arguments and usage); that line can hold what orjson refuses:
# deeper than the 1024 levels it reads, an integer past a double's range, and a float that is not
# finite (a tool argument of 1e400, json.loads's inf) as NaN or Infinity. Nothing else is read
# with the json module: a line orjson refuses for any other reason is damaged.
_PAST_ORJSON = ("depth limit exceeded", "number is infinity when parsed as double")
_NOT_FINITE = re.compile("Infinity|NaN")  # where orjson stops at one (after the minus of -Infinity)


def line_json(line: bytes) -> Any:
    """A recording line's JSON value; raises ValueError. Read with orjson, and with the json
    module only where a line the writer wrote with it holds what orjson refuses (``_PAST_ORJSON``,
    ``_NOT_FINITE``); a line is at most MAX_LINE_BYTES, and an integer at most the 4300 digits
    Python reads."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as refused:
        try:
            text = line.decode("utf-8")
            if str(refused).startswith(_PAST_ORJSON) or _NOT_FINITE.match(text, refused.pos):
                return json.loads(text)
        except (ValueError, RecursionError):  # (not UTF-8 is a ValueError too)
            pass
        raise refused from None


def header_damage(first_line: bytes) -> str | None:
    """What is wrong with a first line that is no recording header but still marks a
    recording (its header damaged, or lost), or None for a line of some other file."""
    if FORMAT_MARK.search(first_line):  # (also where its first bytes were lost or overwritten)
        return "line 1 is a damaged recording header (not a JSON object of the format's fields)"
    try:
        record = orjson.loads(first_line)
    except orjson.JSONDecodeError:
        return None
    kind = record.get("type") if isinstance(record, dict) else None
    fields = BODY_LINE_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields and all(name in record for name in fields):
        return f"line 1 is a {kind} line: the recording's header line is missing"
    return None


class HeaderCut(RecordingError):
    """The file ends before its header line does: its writer stopped at once (a killed proxy)."""


@dataclass(slots=True)
class Frame:
    """One stretch of the body: a decoded frame, unframed bytes (``raw``) or the cut ``tail``."""

    kind: str  # "frame" | "raw" | "tail"
    seq: int | None
    offset: int
    raw: bytes
    t_ms: float | None
    sum: str
    event: dict[str, Any] = field(default_factory=dict)
    line: int = 0  # 1-based line number in the file, for messages

    @property
    def end(self) -> int:
        return self.offset + len(self.raw)


@dataclass(slots=True)
class NetworkReads:
    """One ``reads`` line: network reads as (wire offset, length, ms since response start)."""

    reads: list[tuple[int, int, float | None]]
    wire: bytes | None  # the encoded bytes of these reads, when the body was content-encoded
    line: int = 0


# -- field checks: each raises ValueError with what is wrong; the caller names the line --------

_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", (int, float): "a number"}


def _shown(value: Any) -> str:
    return dumps(value)[:40]


def _typed(record: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    """``record[name]`` when it has the type the format gives it (None when absent and optional)."""
    value = record.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name!r} is {_shown(value)}, not {_NAMES[kind]}")
    return value


def counted(record: dict[str, Any], name: str, *, required: bool = False) -> int | None:
    """A count or position: an integer, never negative."""
    value = _typed(record, name, int, required=required)
    if value is not None and value < 0:
        raise ValueError(f"{name!r} is {value}, not a count (negative)")
    return value


def _time(record: dict[str, Any], name: str) -> float | None:
    value = _typed(record, name, (int, float))
    if value is not None and not 0 <= value < math.inf:  # NaN too, which no comparison would catch later
        raise ValueError(f"{name!r} is {value}: a time since the response started is a finite number, never negative")
    return value


def one_of(record: dict[str, Any], name: str, allowed: frozenset[str], *, required: bool = False) -> str | None:
    value = _typed(record, name, str, required=required)
    if value is not None and value not in allowed:
        raise ValueError(f"{name!r} is {_shown(value)}, not one of {', '.join(sorted(allowed))}")
    return value


def _hex(record: dict[str, Any], name: str, pattern: re.Pattern[bytes], digits: int, *, required: bool) -> str | None:
    value = _typed(record, name, str, required=required)
    if value is not None and not pattern.fullmatch(value.encode("utf-8", "replace")):
        raise ValueError(f"{name!r} is {_shown(value)}, not {digits} lowercase hex digits")
    return value


def _b64(record: dict[str, Any], name: str) -> bytes:
    text = _typed(record, name, str, required=True)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{name!r} is not valid base64") from None


def _headers(part: dict[str, Any], side: str) -> None:
    pairs = _typed(part, "headers", list)
    for pair in pairs or ():
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError(f"a {side} header is {_shown(pair)}, not a [name, value] pair")


def check_header(record: dict[str, Any]) -> None:
    """Raises ValueError naming the first header field of the wrong type or value."""
    for name in ("request", "response", "wire"):
        _typed(record, name, dict)
    for name in ("dialect", "sentinel", "streamtap", "flow_id", "why"):
        _typed(record, name, str)
    for name in ("started", "request_started"):
        _typed(record, name, (int, float))
    if "streamed" in record and not isinstance(record["streamed"], bool):
        raise ValueError(f"'streamed' is {_shown(record['streamed'])}, not true or false")
    if counted(record, "max_event_size") == 0:
        raise ValueError("'max_event_size' is 0, not a size")
    request, response = record.get("request") or {}, record.get("response") or {}
    status = _typed(response, "status", int)
    if status is not None and not 100 <= status <= 599:
        raise ValueError(f"'status' is {status}, not an HTTP status")
    for part, side in ((request, "request"), (response, "response")):
        for name in ("http_version", "reason", "method", "url"):
            _typed(part, name, str)
        _headers(part, side)
    if "body_b64" in request:
        _b64(request, "body_b64")
    omitted = _typed(request, "body_omitted", dict)
    if omitted is not None:  # a body too large to keep: its length and hash as sent
        counted(omitted, "bytes", required=True)
        _hex(omitted, "sha256", _SHA256, 64, required=True)
        _typed(omitted, "reason", str)
    wire = record.get("wire") or {}
    _typed(wire, "format", str)
    _typed(wire, "content_encoding", str)


def _segment(record: dict[str, Any], kind: str, number: int) -> Frame:
    seq = counted(record, "seq", required=kind == "frame")
    offset = counted(record, "offset", required=True)
    if ("raw" in record) == ("raw_b64" in record):
        raise ValueError("a body line holds its bytes in exactly one of 'raw' and 'raw_b64'")
    raw = _typed(record, "raw", str, required=True).encode("utf-8") if "raw" in record else _b64(record, "raw_b64")
    t_ms = _time(record, "t")
    length = counted(record, "len", required=True)
    if length != len(raw):
        raise ValueError(f"'len' is {length}, but the line holds {len(raw)} bytes")
    digest = _hex(record, "sum", _SUM, SUM_HEX, required=True)
    if kind == "raw":
        _typed(record, "why", str)
    if kind == "tail":
        _typed(record, "reason", str)
    event = _typed(record, "event", dict) or ({"reason": record["reason"]} if "reason" in record else {})
    return Frame(kind=kind, seq=seq, offset=offset, raw=raw, t_ms=t_ms, sum=digest, event=event, line=number)


def _read_entry(entry: Any) -> tuple[int, int, float | None]:
    """One ``[wire_offset, length, t_ms]`` of a reads line."""
    if isinstance(entry, list) and len(entry) == 3:
        offset, length, t = entry
        if type(offset) is int and type(length) is int and (t is None or type(t) in (int, float)):
            if offset >= 0 and length >= 0 and (t is None or t >= 0):
                return offset, length, t
    raise ValueError(f"a network read is {_shown(entry)}, not [offset, length, t]")


def _network_reads(record: dict[str, Any], number: int) -> NetworkReads:
    reads = [_read_entry(entry) for entry in _typed(record, "reads", list, required=True)]
    wire = None
    if "wire_b64" in record:
        wire = _b64(record, "wire_b64")
        if len(wire) != sum(length for _, length, _ in reads):
            raise ValueError(f"'wire_b64' holds {len(wire)} bytes, its reads add up to {sum(n for _, n, _ in reads)}")
    return NetworkReads(reads, wire, number)


def _check_note(record: dict[str, Any]) -> None:
    _typed(record, "kind", str, required=True)
    _typed(record, "message", str)
    _time(record, "t")


_FELL_BEHIND_AT = re.compile(re.escape(FELL_BEHIND) + r" at byte (\d+)$")


def analysis_stopped(end: dict[str, Any]) -> tuple[int, str] | None:
    """The wire byte where the proxy stopped handing the flow to analysis, where the recording's
    bytes stop though the stream went on, and why (its end line's ``streamtap_errors``); None
    when it did not stop."""
    for error in end.get("streamtap_errors") or ():
        found = _FELL_BEHIND_AT.search(error) if isinstance(error, str) else None
        if found:
            return int(found.group(1)), error.removeprefix("analysis: ")
    return None


def check_end(record: dict[str, Any]) -> None:
    """An end line's fields as the format has them: raises ValueError naming the first that is not."""
    verdict = _typed(record, "verdict", dict)
    if verdict is not None:
        one_of(verdict, "kind", VERDICT_KINDS, required=True)
        _typed(verdict, "reason", str)
        counted(verdict, "seq")
        counted(verdict, "offset")
    _typed(record, "turn", dict)
    # every writer has written it, and verify judges the body under it: one missing would read as
    # "finished" and could call an answer the upstream cut complete
    one_of(record, "stream_end", STREAM_ENDS, required=True)
    _typed(record, "error", str)
    _typed(record, "injected_fault", str)
    _typed(record, "streamtap_errors", list)
    for name in ("frames", "bytes", "wire_bytes"):
        counted(record, name, required=True)
    counted(record, "events")  # (what metrics and the index count: absent in a file written before every end line had it)
    _hex(record, "sha256", _SHA256, 64, required=True)
    _hex(record, "wire_sha256", _SHA256, 64, required=True)
    for name in ("duration_ms", "ttft_ms"):
        _time(record, name)


# -- the line walk ------------------------------------------------------------------------------


class RecordingLines:
    """A recording, line by line: ``header`` once opened, then frames, raw and tail lines
    (``Frame``), ``NetworkReads`` and notes (dicts) in file order; ``end``, ``complete_file``
    and ``problem`` once the walk is over.

        with RecordingLines(path) as lines:
            for item in lines: ...

    Raises RecordingError for a file that is not a recording or is damaged before its last line.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self.header: dict[str, Any] = {}
        self.end: dict[str, Any] | None = None
        self.complete_file = True
        self.problem: str | None = None
        self._file: BinaryIO | None = None
        self._number = 0  # lines read so far
        self._position = 0  # bytes of complete lines read so far

    def open(self) -> RecordingLines:
        """Open the file and read its header (``with`` does this too)."""
        if self._file is None:
            self._file = open_recording(self.path)
            try:
                self._read_header()
            except BaseException:
                self.close()
                raise
        return self

    def __enter__(self) -> RecordingLines:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _damaged(self, number: int, what: str) -> RecordingError:
        return RecordingError(f"{self.path}: line {number} {what}")

    def _next_line(self) -> bytes | bytearray:
        """The next line with its newline; b"" at the end; a cut last line without one.

        Read in pieces, so that a line over the limit costs no more than the limit."""
        assert self._file is not None
        line: bytes | bytearray = self._file.readline(READ_PIECE)
        if line and not line.endswith(b"\n") and len(line) == READ_PIECE:
            line = bytearray(line)
            while not line.endswith(b"\n") and len(line) <= self.max_line_bytes:
                piece = self._file.readline(min(READ_PIECE, self.max_line_bytes + 1 - len(line)))
                if not piece:
                    break
                line += piece
        if line:
            self._number += 1
        if len(line) > self.max_line_bytes:
            raise self._damaged(
                self._number, f"(byte {self._position}) is longer than {self.max_line_bytes} bytes, "
                "the longest line the format allows: the file is damaged or not a recording"
            )  # fmt: skip
        return line

    def _no_crlf(self, line: bytes) -> None:
        if line.endswith(b"\r\n"):
            raise self._damaged(self._number, CONVERTED)

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any]:
        """One complete line as a JSON object; raises ValueError."""
        if not (line.startswith(b"{") and line.endswith(b"}\n")):
            raise ValueError("is not a JSON object alone on its line")
        record = line_json(line)
        if not isinstance(record, dict):
            raise ValueError("is not a JSON object")
        return record

    def _read_header(self) -> None:
        line = self._next_line()
        if not line:
            why = "the file is empty" if frames_ended(self._file) else "the zstd stream ends before its first line decodes"
            raise HeaderCut(f"{self.path}: recording incomplete at byte 0: {why}")
        if not line.endswith(b"\n"):
            raise HeaderCut(f"{self.path}: recording incomplete at byte 0: the header line is cut")
        self._no_crlf(line)
        try:
            record = self._parse(line)
        except ValueError:
            record = None
        if record is None or record.get("type") != "header" or not str(record.get("format", "")).startswith("streamtap-recording/"):
            damage = header_damage(line)
            if damage:
                raise RecordingError(f"{self.path}: {damage}")
            raise RecordingError(f"{self.path} is not a streamtap recording (line 1 is not a {FORMAT} header)")
        if record["format"] not in FORMATS:
            raise RecordingError(f"{self.path}: line 1: the recording is {record['format']}, this streamtap reads "
                                 f"{' and '.join(FORMATS)}")
        try:
            check_header(record)
        except ValueError as exc:
            raise self._damaged(1, f"is damaged: {exc}") from None
        self.header = record
        self._position = len(line)

    def _cut(self, why: str) -> None:
        self.complete_file = False
        self.problem = f"recording incomplete at byte {self._position}: {why}"

    def __iter__(self) -> Iterator[Frame | NetworkReads | dict[str, Any]]:
        if self._file is None:
            raise RuntimeError("RecordingLines is read inside a with block")
        while line := self._next_line():
            number = self._number
            if not line.endswith(b"\n"):  # readline stops short of a newline only at the end of the file
                self._cut("the last line is cut (the writer stopped mid-line)")
                return
            self._no_crlf(line)
            try:
                record = self._parse(line)
            except ValueError as exc:  # its newline says the writer finished it, even as the last line
                message = str(exc) if str(exc).startswith("is ") else "is not a JSON object"
                raise self._damaged(number, f"(byte {self._position}) {message}: the file is damaged") from None
            if self.end is not None:
                raise self._damaged(number, "follows the end line")
            kind = record.get("type")
            try:
                if kind in ("frame", "raw", "tail"):
                    item: Any = _segment(record, kind, number)
                elif kind == "reads":
                    item = _network_reads(record, number)
                elif kind == "note":
                    _check_note(record)
                    item = record
                elif kind == "end":
                    check_end(record)
                    self.end, item = record, None
                elif kind == "header":
                    raise ValueError("is a second header (a recording has one, on line 1)")
                elif not isinstance(kind, str):
                    raise ValueError(f"'type' is {_shown(kind)}, not a line type")
                else:  # a type this reader does not know: a newer writer may add some
                    item = None
            except (ValueError, binascii.Error) as exc:
                message = str(exc)
                raise self._damaged(number, message if message.startswith("is a ") else f"is damaged: {message}") from None
            self._position += len(line)
            if item is not None:
                yield item
        if self.end is None and self.complete_file:
            self._cut("no end line (the writer stopped before the stream ended)")
        elif self.complete_file and not frames_ended(self._file):
            self._cut("the zstd stream ends inside a frame (the writer stopped before ending it)")


# -- the whole recording at hand ----------------------------------------------------------------


@dataclass(slots=True)
class Recording:
    path: Path
    header: dict[str, Any]
    frames: list[Frame]  # decoded frames only, in order
    segments: list[Frame]  # everything that makes up the body, in order (frames, raw, tail)
    reads: list[tuple[int, int, float | None]]  # network reads: (wire offset, length, ms since response start)
    notes: list[dict[str, Any]]
    end: dict[str, Any] | None
    complete_file: bool
    problem: str | None  # why the file is incomplete, when it is
    wire_parts: list[bytes] = field(default_factory=list, repr=False)

    @property
    def tail(self) -> Frame | None:
        return next((s for s in reversed(self.segments) if s.kind == "tail"), None)

    @property
    def body(self) -> bytes:
        """The response body (after content decoding), rebuilt from the recorded bytes."""
        return b"".join(s.raw for s in self.segments)

    @property
    def content_encoding(self) -> str | None:
        return (self.header.get("wire") or {}).get("content_encoding")

    @property
    def encoded(self) -> bool:
        """Whether the body was content-encoded: its wire bytes are then kept apart from it."""
        return content_encoded(self.content_encoding)

    @property
    def wire(self) -> bytes:
        """The body bytes as they crossed the network: the body itself unless it was content-encoded."""
        if not self.encoded:
            return self.body
        return b"".join(self.wire_parts)

    @property
    def verdict(self) -> dict[str, Any] | None:
        return (self.end or {}).get("verdict")


def read_recording(path: str | os.PathLike[str]) -> Recording:
    """Parse a recording into memory. Raises RecordingError when it is not one or is damaged mid-file."""
    segments: list[Frame] = []
    reads: list[tuple[int, int, float | None]] = []
    notes: list[dict[str, Any]] = []
    wire_parts: list[bytes] = []
    with RecordingLines(path) as lines:
        for item in lines:
            if isinstance(item, Frame):
                segments.append(item)
            elif isinstance(item, NetworkReads):
                reads.extend(item.reads)
                if item.wire is not None:
                    wire_parts.append(item.wire)
            else:
                notes.append(item)
    return Recording(
        path=lines.path,
        header=lines.header,
        frames=[s for s in segments if s.kind == "frame"],
        segments=segments,
        reads=reads,
        notes=notes,
        end=lines.end,
        complete_file=lines.complete_file,
        problem=lines.problem,
        wire_parts=wire_parts,
    )


class RecordingCheck:
    """What a recording's lines say about each other, checked as they go by: ``segment`` and
    ``reads`` for each line in order, then ``finish`` with the end line gives the problems."""

    def __init__(self, content_encoding: str | None = None) -> None:
        self.content_encoding = content_encoding
        self.encoded = content_encoded(content_encoding)  # (identity is no encoding: no wire kept apart)
        self.problems: list[str] = []
        self._offset = 0
        self._seq = 0  # frames and tails count from 0
        self._frames = 0
        self._tails = 0  # (the end line's events are the frames plus a cut tail)
        self._body_hash = hashlib.sha256()
        self._wire_offset = 0
        self._wire_hash = hashlib.sha256()
        self._any_reads = False
        self._t_ms: float | None = None  # the latest arrival time so far: times never go back
        self._read_t_ms: float | None = None  # the same for the network reads, which replay's timing follows

    def segment(self, s: Frame) -> None:
        where = f"line {s.line} ({s.kind} seq {s.seq})"
        if s.offset != self._offset:
            self.problems.append(f"{where}: offset {s.offset}, expected {self._offset} (bytes missing or overlapping)")
        if frame_sum(s.raw) != s.sum:
            self.problems.append(f"{where}: sum {s.sum} does not match its bytes ({frame_sum(s.raw)})")
        if s.seq is not None:
            if s.seq != self._seq:
                self.problems.append(f"{where}: sequence number {s.seq}, expected {self._seq}")
            self._seq = s.seq + 1
        if s.t_ms is not None:
            if self._t_ms is not None and s.t_ms < self._t_ms:
                self.problems.append(f"{where}: arrival time {s.t_ms:g} ms is before the {self._t_ms:g} ms of a line before it")
            self._t_ms = max(s.t_ms, self._t_ms or 0.0)
        if s.kind == "frame":
            self._frames += 1
        elif s.kind == "tail":
            self._tails += 1
        self._offset = s.offset + len(s.raw)
        self._body_hash.update(s.raw)

    def reads(self, reads: list[tuple[int, int, float | None]], wire: bytes | None = None) -> None:
        self._any_reads = self._any_reads or bool(reads)
        for offset, length, t_ms in reads:
            if offset != self._wire_offset:
                self.problems.append(f"network read at wire offset {offset}, expected {self._wire_offset}")
            if t_ms is not None:
                if self._read_t_ms is not None and t_ms < self._read_t_ms:
                    self.problems.append(f"network read at wire offset {offset}: arrival time {t_ms:g} ms is before "
                                         f"the {self._read_t_ms:g} ms of a read before it")
                self._read_t_ms = t_ms  # (each read against the one before it: one edit, one problem)
            self._wire_offset = offset + length
        if wire is not None:
            self._wire_hash.update(wire)

    def finish(self, end: dict[str, Any] | None) -> list[str]:
        problems = self.problems
        if end is not None:
            if end.get("frames") is not None and end.get("frames") != self._frames:
                problems.append(f"end line says {end.get('frames')} frames, the file holds {self._frames}")
            events = self._frames + self._tails
            if end.get("events") is not None and end.get("events") != events:  # (absent in an old file)
                held = f"{self._frames} frames" + (f" and {self._tails} tail{'s' * (self._tails > 1)}" if self._tails else "")
                problems.append(f"end line says {end.get('events')} events, the file holds {held}")
            if end.get("bytes") != self._offset:
                problems.append(f"end line says {end.get('bytes')} body bytes, the frames hold {self._offset}")
            if end.get("sha256") != self._body_hash.hexdigest():
                problems.append("body sha256 differs from the end line's")
            wired = self._any_reads or end.get("wire_bytes")  # (a writer given no reads keeps no wire)
            if wired and end.get("wire_bytes") != self._wire_offset:
                reads = f"the reads add up to {self._wire_offset}" if self._any_reads else "the file holds no network reads"
                problems.append(f"end line says {end.get('wire_bytes')} wire bytes, {reads}")
            if self.encoded and end.get("wire_sha256") != self._wire_hash.hexdigest():
                problems.append("wire sha256 differs from the end line's")
            # (an empty body came as no wire bytes: its hashes are equal too)
            if (wired or self._offset == 0) and not self.encoded and end.get("wire_sha256") != end.get("sha256"):
                problems.append("wire sha256 differs from the body's, and the body was not content-encoded")
        return problems


class EventViews:
    """Each frame line's ``event`` against the view the writer gives the event its bytes decode to:
    a view its own bytes contradict is damage, as a ``len`` that is not theirs is.

    ``frame`` takes each body line before its bytes go to the decoder, ``decoded`` the events
    they gave (and those the decoder's close gave); both raise RecordingError naming the first
    frame whose view differs. A frame's event comes with its own bytes, or with the next line's
    where the decoder must see a byte past it (an SSE line that ends in a lone CR); an event
    skipped for its size comes at the end of its ``raw`` lines, before its frame. So two frames
    and one event wait at most. A frame and an event that never pair up (frames lost or moved,
    bytes recorded ``raw`` after the proxy's analysis failed) are left to the sums, offsets and
    verdict to tell."""

    def __init__(self, path: str | os.PathLike[str], format: str = FORMAT) -> None:
        self.path = path
        # the format's rule for an SSE event's id: given where it changes (/2), or wherever the
        # event has one (/1: as if the id before every event were none)
        self._ids_where_changed = format != "streamtap-recording/1"
        self._frames: deque[Frame] = deque(maxlen=2)  # frames whose event has not come yet
        self._event: Any = None  # the last event that came before its frame, with the SSE id before it
        self._sse_id = ""  # the SSE event id in effect at the last event decoded

    def frame(self, line: Frame) -> None:
        if line.kind != "frame":
            return
        waiting = self._event
        if waiting is not None and waiting[0].seq == line.seq:
            self._event = None
            self._compare(line, *waiting)
        else:
            self._frames.append(line)

    def decoded(self, events: Sequence[Any]) -> None:
        frames = self._frames
        for event in events:
            previous_id = self._sse_id if self._ids_where_changed else ""
            if type(event) is SSEEvent:
                self._sse_id = event.id
            while frames and frames[0].seq < event.seq:  # (its event never came)
                frames.popleft()
            if frames and frames[0].seq == event.seq:
                self._compare(frames.popleft(), event, previous_id)
            else:
                self._event = event, previous_id

    def _compare(self, frame: Frame, event: Any, previous_id: str) -> None:
        # the same unit holds the same bytes: an event skipped for its size holds none, as its frame does
        # (its bytes are in the raw lines before it); a frame that holds them anyway, or a tail, is not it
        if frame.end != event.end or len(frame.raw) != len(event.raw) or type(event) is Tail:
            return
        recorded = frame.event
        kind = type(event)
        if kind is SSEEvent and not event.invalid_utf8:  # the common events, without building their view
            id_, retry = event.id, event.retry
            has_id = id_ != previous_id
            if (len(recorded) == 1 + has_id + (retry is not None) and recorded.get("sse") == event.event
                    and (not has_id or recorded.get("id") == id_)
                    and (retry is None or (type(recorded.get("retry")) is int and recorded["retry"] == retry))):
                return
        elif kind is JSONValue:
            if len(recorded) == 1 and recorded.get("json") is True:
                return
        # the writer's own bytes, read back as a reader reads them (a retry past 64 bits becomes a float)
        written = line_json(_described(event, previous_id))
        if _view_json(recorded) != _view_json(written):
            raise RecordingError(f"{self.path}: line {frame.line} is damaged: {_view_difference(recorded, written)}")


def _view_difference(recorded: dict[str, Any], written: dict[str, Any]) -> str:
    """The first member where a frame's ``event`` and the view its bytes give differ, said
    (``'event.headers.:event-type'``)."""
    name = "event"
    while isinstance(recorded, dict) and isinstance(written, dict):
        key = next((k for k in dict.fromkeys([*written, *recorded]) if k not in recorded or k not in written
                    or _view_json(recorded[k]) != _view_json(written[k])), None)  # fmt: skip
        if key is None:
            break
        name = f"{name}.{key}"
        if key not in recorded or key not in written:
            return (f"its '{name}' is {_shown(recorded[key]) if key in recorded else 'missing'}, "
                    f"its bytes give {_shown(written[key]) if key in written else 'none'}")  # fmt: skip
        recorded, written = recorded[key], written[key]
    return f"its '{name}' is {_shown(recorded)}, its bytes give {_shown(written)}"


def _view_json(view: Any) -> bytes:
    """``view`` as JSON that tells apart what equality does not (``true`` and ``1``), in any key order."""
    try:
        return orjson.dumps(view, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer past 64 bits, text holding bytes that are not UTF-8
        return json.dumps(_escaped(view), sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def check_recording(recording: Recording) -> list[str]:
    """Everything in the recording that does not check out against itself (empty: all good)."""
    check = RecordingCheck(recording.content_encoding)
    for s in recording.segments:
        check.segment(s)
    check.reads(recording.reads, recording.wire if recording.encoded else None)
    problems = check.finish(recording.end)
    return [recording.problem, *problems] if recording.problem else problems


def shown_path(path: str | os.PathLike[str]) -> str:
    """The path as JSON and a strict UTF-8 terminal can take it: the bytes of a name that are not
    UTF-8 (which Python keeps as lone surrogates) become escapes, ``bad\\xffname.jsonl``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
