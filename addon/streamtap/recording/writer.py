"""Write one flow's recording: a JSONL file, append-only, one writer, secrets redacted.

The line layout is described in docs/recording-format.md. The writer keeps no frames in
memory: each line goes to a buffered file as it is made, and the running offset and
body hash are all it remembers (plus at most one small batch of network reads).
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from streamtap import __version__
from streamtap.providers.common import json_ready
from streamtap.wire import EventStreamMessage, JSONValue, Malformed, SSEEvent, Tail
from streamtap.wire.accel import pure_python_asked

from .redact import Redactor
from .compress import COMPRESSIONS, SUFFIX, ZstdLines

try:
    if pure_python_asked:
        raise ImportError("STREAMTAP_PURE_PYTHON is set")
    from ._lines import frame_lines as _frame_lines, setup as _setup_frame_lines
except ImportError:  # built without a C compiler (or OpenSSL's headers): frames() writes every line itself
    _frame_lines = _setup_frame_lines = None
compiled_lines = _frame_lines is not None

# /2: an SSE frame's view gives the event id where it changes (/1 gave it on every frame whose event
# has one, so a long id made the recording as many times larger as the stream has events)
FORMAT = "streamtap-recording/2"
FORMATS = ("streamtap-recording/1", FORMAT)  # the formats this streamtap reads
SUM_HEX = 16  # sha256 prefix length in a frame's "sum": 64 bits tell a wrong frame apart
# The proxy's note when it stopped handing a flow's reads to analysis: "... analysis fell behind
# at byte N", the recording's reads and frames stopping at wire byte N (docs/recording-format.md)
FELL_BEHIND = "analysis fell behind"
SUM_BYTES = SUM_HEX // 2
assert SUM_HEX == 16  # frames() writes "sum" with "%.16s" (the line cuts the hex digest, no slice per frame)
FSYNC_POLICIES = ("always", "end", "never")
PARTIAL_SUFFIX = ".partial.jsonl"
READS_PER_LINE = 256
WIRE_BYTES_PER_LINE = 16 * 1024
WRITE_BUFFER = 8 * 1024

_sha256 = hashlib.sha256
_hexlify = binascii.hexlify
_b64 = binascii.b2a_base64


class RecordingError(Exception):
    """A recording cannot be written or read as asked."""


class RecordingBusy(RecordingError):
    """Another writer holds the recording's lock."""


class SpanNotKept(RecordingError):
    """``events[index]`` does not carry all of its bytes from the recorded offset on: a decoder
    skipped an oversize event without keeping it, or some of its bytes are already recorded as
    ``raw`` lines. The caller, which has the bytes, records them (``raw``), then the event with
    none (``frames`` of ``event._replace(start=event.end, raw=b"")``). The events before
    ``index`` are written."""

    def __init__(self, index: int, offset: int) -> None:
        super().__init__(f"event {index} does not hold its bytes from offset {offset}")
        self.index = index


def stamp(epoch: float) -> str:
    """A UTC timestamp that sorts as text: 20260130T061502.123Z."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def _name_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text) or "unknown"


def partial_name(started: float, provider: str, flow_id: str) -> str:
    return f"{stamp(started)}_{_name_part(provider)}_{_name_part(flow_id.replace("-", "")[:12])}{PARTIAL_SUFFIX}"


def partial_recordings(directory: str | os.PathLike[str], started: float, flow_id: str) -> list[Path]:
    """The partial recordings in ``directory`` of the flow ``flow_id`` tapped at ``started``,
    whatever provider its detection settled on: how a recording is found when the process that
    made it died before saying its name."""
    pattern = f"{stamp(started)}_*_{_name_part(flow_id.replace("-", "")[:12])}{PARTIAL_SUFFIX}"
    try:
        return sorted([*Path(directory).glob(pattern), *Path(directory).glob(pattern + SUFFIX)])
    except OSError:
        return []


def final_name(started: float, provider: str, verdict: str, flow_id: str) -> str:
    return f"{stamp(started)}_{_name_part(provider)}_{_name_part(verdict)}_{_name_part(flow_id.replace("-", "")[:12])}.jsonl"


def frame_sum(raw: bytes) -> str:
    return _sha256(raw).digest()[:SUM_BYTES].hex()


def _raw_field(raw: bytes | memoryview) -> dict[str, str]:
    try:
        return {"raw": str(raw, "utf-8")}
    except UnicodeDecodeError:
        return {"raw_b64": base64.b64encode(raw).decode("ascii")}


def _plain_header_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # uuid, datetime


def describe(event: Any, previous_id: str = "") -> dict[str, Any]:
    """The decoded view of a wire event, for people and tools reading the recording.

    The raw bytes are on the same line already; this adds what framing found in them. An SSE
    event's id is given where it differs from ``previous_id``, the id in effect at the event
    before: it persists from event to event, and written on every frame one long id would make
    the recording as many times larger as the stream has events."""
    if isinstance(event, SSEEvent):
        out: dict[str, Any] = {"sse": event.event}
        if event.id != previous_id:
            out["id"] = event.id
        if event.retry is not None:
            out["retry"] = event.retry
        if event.invalid_utf8:
            out["invalid_utf8"] = event.invalid_utf8
        return out
    if isinstance(event, EventStreamMessage):
        out = {"headers": {k: _plain_header_value(v) for k, v in event.headers.items()}}
        try:
            out["payload"] = event.payload.decode("utf-8")
        except UnicodeDecodeError:
            out["payload_b64"] = base64.b64encode(event.payload).decode("ascii")
        return out
    if isinstance(event, JSONValue):
        return {"json": True}
    if isinstance(event, Malformed):
        return {"malformed": event.error.message, "error": type(event.error).__name__, "fatal": event.fatal}
    return {}


_PLAIN_SSE: dict[str, bytes] = {}  # event type -> its description, for the common SSE event without a new id or retry


_HEADERS: dict[tuple, bytes] = {}  # event-stream header set -> its JSON (a stream repeats a few sets)

if _setup_frame_lines is not None:
    _setup_frame_lines(SSEEvent, EventStreamMessage, JSONValue, orjson.dumps, _PLAIN_SSE)


def _escaped(value: Any) -> Any:
    """``value`` with every text that holds bytes not UTF-8 (mitmproxy keeps them as surrogate
    escapes, which JSON cannot carry) written with those bytes as ``\\xNN``, and every NaN or
    infinity as null, as orjson writes it, for the json module to write what orjson cannot (parsed
    tool arguments nested past its depth, integers past 64 bits)."""
    return json_ready(value, _escaped_text)


# a surrogate that stands for no byte (mitmproxy's escapes are U+DC80..U+DCFF): half an emoji,
# from a JSON escape ("\ud83d") in text a caller parsed
_NOT_A_BYTE = re.compile(r"[\ud800-\udc7f\udd00-\udfff]")


def _escaped_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # a line that cannot be written loses the recording: any other lone surrogate as \uXXXX
        text = _NOT_A_BYTE.sub(lambda char: f"\\u{ord(char[0]):04x}", text)
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def _value_types(headers: dict[str, Any]) -> tuple[type, ...] | None:
    """The types of a header set's values, which its equality does not tell apart (``True == 1``,
    written ``true`` and ``1``); None for a set of texts, whose equality already does."""
    types = tuple(map(type, headers.values()))
    return None if all(kind is str for kind in types) else types


def _headers_json(headers: dict[str, Any]) -> bytes:
    """``orjson.dumps`` of an event-stream header set as ``describe`` gives it, cached (a stream repeats a few)."""
    try:
        key = tuple(headers.items()), tuple(map(type, headers.values()))
        cached = _HEADERS.get(key)
    except TypeError:  # an unhashable value
        key, cached = None, None
    if cached is None:
        cached = orjson.dumps({k: _plain_header_value(v) for k, v in headers.items()})
        if key is not None and len(_HEADERS) < 1024:
            _HEADERS[key] = cached
    return cached


def _described(event: Any, previous_id: str = "") -> bytes:
    """``orjson.dumps(describe(event, previous_id))`` for all but event-stream messages (``frames``
    writes those itself), plain SSE descriptions cached: this runs once per event."""
    if type(event) is SSEEvent and event.id == previous_id and event.retry is None and not event.invalid_utf8:
        cached = _PLAIN_SSE.get(event.event)
        if cached is None:
            cached = orjson.dumps({"sse": event.event})
            if len(_PLAIN_SSE) < 1024:
                _PLAIN_SSE[event.event] = cached
        return cached
    description = describe(event, previous_id)
    try:
        return orjson.dumps(description)
    except TypeError:  # a retry past 64 bits, which the SSE rules take: written as the json module writes it
        return json.dumps(_escaped(description), ensure_ascii=False, separators=(",", ":")).encode()


_NO_T = object()  # no event's t is this: the first event of a call encodes its own

END_LINE_START = b'{"type":"end"'  # how the writer begins an end line (orjson, no spaces)


def note_unfinished(path: str | os.PathLike[str], kind: str, message: str, t_ms: float | None = None) -> bool:
    """Append a note to a recording whose writer is gone (a killed process), saying why it stops.

    A line the writer left half written is cut off first: it holds no complete record, and a
    line after it would otherwise read as garbage. False, doing nothing, when a writer still
    holds the file, it is compressed (a torn zstd frame cannot be cut back to a line), or it
    has no whole line yet: a note would then stand where the header belongs, and the file,
    which reads as one whose writer stopped at once, would no longer read as a recording. Nor
    after an end line (the writer stopped before its rename): nothing may follow it."""
    if str(path).endswith(SUFFIX):
        return False
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        if not lock_unless_written(fd):
            return False
        size = os.fstat(fd).st_size
        whole = _line_start(fd, size)  # where the last complete line ends
        if not whole:
            return False
        last = _line_start(fd, whole - 1)
        if os.pread(fd, len(END_LINE_START), last) == END_LINE_START:
            return False  # the writer stopped between its end line and the rename: the recording says all
        line = orjson.dumps({"type": "note", "kind": kind, "message": message, "t": t_ms}) + b"\n"
        if whole - last == len(line) and os.pread(fd, len(line), last) == line:
            return True  # said already (by a worker that died before it could say it had)
        if whole < size:
            os.ftruncate(fd, whole)
        os.pwrite(fd, line, whole)
        return True
    finally:
        os.close(fd)


READERS_WAIT = 10.0  # seconds a writer gone waits for readers (report, index) to let go of its file


def lock_unless_written(fd: int) -> bool:
    """The exclusive lock on a recording whose writer may be gone; False while a writer holds it.

    A reader (report, index) holds a shared lock while it reads the file, so a taken lock alone
    does not mean a writer: when a shared lock can be had, only readers hold it, and they let go
    within moments; this waits for them (at most ``READERS_WAIT``)."""
    deadline = time.monotonic() + READERS_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused only while a writer holds it
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _line_start(fd: int, end: int) -> int:
    """Where the line holding byte ``end - 1`` of the file begins: just after the newline before ``end``."""
    while end:
        start = max(0, end - (1 << 20))
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


# The name a writer's file has before it is linked to its recording's name: hidden, in the
# recording's folder (a link cannot cross file systems), and ending in none of the suffixes
# report, index, verify, import or replay look for, so no reader ever lists or locks it.
CREATING_PREFIX = ".streamtap-creating-"
# what os.link raises on a file system without hard links (vfat, some network mounts)
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
_TAKE_ATTEMPTS = 3  # a name taken, then freed (its writer renamed it) before it could be opened: try again


def _open_locked(path: str) -> int:
    """``path``, empty, opened for appending with the exclusive lock held.

    The file is born locked: made and locked under a hidden name, then linked to ``path``. A
    file opened first and locked after would stand unlocked in between, where a reader (report,
    index) takes it for a dead, empty recording, and its probe of the lock makes this writer fail."""
    for _ in range(_TAKE_ATTEMPTS):
        try:
            return _born_locked(path)
        except FileExistsError:
            fd = _take_unwritten(path, create=False)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            fd = _take_unwritten(path, create=True)  # the open-then-lock way: the one left there
        if fd is not None:
            return fd
    raise RecordingBusy(f"{path} is being written by another writer")


def _born_locked(path: str) -> int:
    """A new file at ``path`` that was locked before it had that name; FileExistsError when the name is taken."""
    creating = os.path.join(os.path.dirname(path), f"{CREATING_PREFIX}{secrets.token_hex(8)}")
    fd = os.open(creating, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (no one else knows this name: never refused)
            os.link(creating, path)  # unlike a rename, never replaces a file that has the name
        finally:
            os.unlink(creating)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take_unwritten(path: str, *, create: bool) -> int | None:
    """``path``, there already, locked and empty (a writer that stopped before its first line left
    it), or made now where hard links are missing. RecordingBusy while a writer holds it,
    RecordingError when it holds lines; None when the name no longer leads to it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RecordingBusy(f"{path} is being written by another writer") from None
    try:
        same = os.path.samestat(os.stat(path), os.fstat(fd))  # not removed (or replaced) before the lock was ours
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
        return None
    if os.fstat(fd).st_size:
        os.close(fd)
        raise RecordingError(f"{path} already holds a recording (recordings are append-only, one writer each)")
    return fd


class RecordingWriter:
    """Appends the lines of one recording. Not thread-safe: one flow, one writer.

    ``path`` must not hold a recording yet; an exclusive lock, held from before the file has
    that name until it is closed (``finish``, or ``sync_and_close`` after ``finish(sync=False)``),
    makes a second writer fail with RecordingBusy instead of interleaving lines.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: str = "end",
        redact: Iterable[str] = (),
        redact_allow: Iterable[str] = (),
        encoded: bool = False,
        compress: str = "none",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise RecordingError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        if compress not in COMPRESSIONS:
            raise RecordingError(f"compression must be one of {', '.join(COMPRESSIONS)}, not {compress!r}")
        # kept as text: CPython 3.12 before 3.12.6 interns every part of every Path it parses for good,
        # so each recording's own name made into a Path stayed in the process (200-400 bytes a flow)
        self.file_path = os.fspath(path)
        self.fsync = fsync
        self.redact = tuple(redact)
        self.redactor = Redactor(self.redact, redact_allow)
        self.encoded = encoded  # wire bytes differ from the body (content-encoding): keep them too
        fd = _open_locked(self.file_path)
        # a small buffer: the adapter flushes at least every 0.1 s anyway, and an open
        # stream's memory must stay small
        self._file = os.fdopen(fd, "ab", buffering=WRITE_BUFFER)
        self.compressed = compress == "zstd"
        self.suffix = SUFFIX if self.compressed else ""  # after .jsonl in the file's names
        if self.compressed:
            self._file = ZstdLines(self._file)
        self._offset = 0
        self._body_hash = hashlib.sha256()
        self._frames = 0
        self._sse_id = ""  # the SSE event id in effect at the last frame (a view gives it where it changes)
        # the last event-stream header set framed, its value types (_value_types) and its JSON: the
        # next call's messages mostly repeat it, and the compiled frame_lines takes only those
        self._headers: tuple[Any, Any, bytes] = (None, None, b"")
        self._wire_offset = 0
        self._wire_hash = hashlib.sha256()
        self._reads: list[list[float]] = []
        self._wire_pending = bytearray()
        self.closed = False

    @classmethod
    def create(
        cls, directory: str | os.PathLike[str], *, started: float, provider: str, flow_id: str, **kwargs: Any
    ) -> RecordingWriter:
        directory = os.fspath(directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        suffix = SUFFIX if kwargs.get("compress") == "zstd" else ""
        return cls(os.path.join(directory, partial_name(started, provider, flow_id) + suffix), **kwargs)

    @property
    def offset(self) -> int:
        """Body bytes recorded so far."""
        return self._offset

    def _line(self, record: dict[str, Any]) -> None:
        try:
            line = orjson.dumps(record)
        except TypeError:  # a text holding bytes that are not UTF-8 (a header, the URL): kept escaped
            escaped = _escaped(record)
            try:
                line = orjson.dumps(escaped)
            except TypeError:  # nested deeper than orjson writes (255 levels), e.g. parsed tool arguments
                line = json.dumps(escaped, ensure_ascii=False, separators=(",", ":")).encode()
        self._file.write(line)  # (two writes, not line + b"\n": a raw line can be the event limit's size)
        self._file.write(b"\n")
        if self.fsync == "always":
            self._file.flush()
            os.fsync(self._file.fileno())

    def header(self, fields: dict[str, Any]) -> None:
        """Line 1. ``request``/``response`` header pairs, the URL and the request body are redacted here."""
        record: dict[str, Any] = {"type": "header", "format": FORMAT, "streamtap": __version__}
        record.update(fields)
        for side in ("request", "response"):
            part = record.get(side)
            if isinstance(part, dict):
                record[side] = self.redactor.request_part(part)
        if self.redactor.extra or self.redactor.allow:  # so a replay outside the proxy redacts as it did
            record["redaction"] = {"redact": sorted(self.redactor.extra), "redact_allow": sorted(self.redactor.allow)}
        self._line(record)

    def _body(self, start: int, raw: bytes) -> None:
        if start != self._offset:
            raise RecordingError(f"bytes at offset {start} do not follow the recorded {self._offset}")
        self._offset += len(raw)
        self._body_hash.update(raw)

    def frame(self, event: Any, t_ms: float | None) -> None:
        """One decoded wire event (SSEEvent, EventStreamMessage, JSONValue, Malformed)."""
        self.frames((event,), (t_ms,))

    def frames(self, events: Sequence[Any], t_ms: Sequence[float | None]) -> None:
        """Wire events in order, ``t_ms[i]`` the time of ``events[i]``: their lines in one write.

        This runs once per event in the analysis worker, its largest cost, so the lines are
        assembled by hand (the same JSON as ``describe`` and ``_raw_field`` give, byte for byte on
        the common paths), and the compiled ``frame_lines`` (``_lines.c``), where this install has
        it, writes the common frames; every other event comes to the loop here."""
        if not events:  # a read that ended no event
            return
        compiled = _frame_lines
        at = 0
        if compiled is not None and self.fsync != "always" and len(events) == len(t_ms):
            # the common call (in the worker: one read's events): all of them compiled, without the loop's set-up
            last_headers, last_types, headers_json = self._headers
            at, offset, _, _, block, raws = compiled(
                events, t_ms, 0, self._offset, self._sse_id, last_headers, last_types, headers_json, _NO_T, b""
            )
            if at:
                self._offset = offset
                self._frames += at
                self._body_hash.update(raws[0] if len(raws) == 1 else b"".join(raws))
                self._file.write(block)
                if at == len(events):
                    return
        self._frames_from(at, events, t_ms)

    def _frames_from(self, at: int, events: Sequence[Any], t_ms: Sequence[float | None]) -> None:
        """``frames`` from ``events[at]`` on: past the events the compiled lines took at its start."""
        sync_each = self.fsync == "always"
        lines: list[bytes] = []
        write = self._file.write
        offset = self._offset
        hashed: list[bytes] = []  # frame bytes for the body hash, one update per batch
        dumps = orjson.dumps
        last_t: Any = lines  # no t is this object: the first event encodes its t
        t_field = b""
        # event-stream messages in a row mostly repeat one header set, and its value types, where
        # equal sets may differ in them (_value_types)
        last_headers, last_types, headers_json = self._headers
        plain_sse = _PLAIN_SSE
        sse_id = self._sse_id
        compiled = None if sync_each else _frame_lines
        count = min(len(events), len(t_ms))
        try:
            while at < count:
                if compiled is not None:
                    taken_from = at
                    at, offset, last_t, t_field, block, raws = compiled(
                        events, t_ms, at, offset, sse_id, last_headers, last_types, headers_json, last_t, t_field
                    )
                    if block:
                        lines.append(block)
                        hashed += raws
                        self._frames += at - taken_from
                    if at == count:
                        break
                event, t = events[at], t_ms[at]
                at += 1
                kind = type(event)
                if (kind is Malformed or kind is Tail) and (
                    event.start < offset or len(event.raw) != event.end - event.start
                ):
                    raise SpanNotKept(at - 1, offset)
                if kind is Tail:
                    if lines:
                        write(b"".join(lines))
                        lines = []
                    if hashed:
                        self._body_hash.update(b"".join(hashed))
                        hashed = []
                    self._offset = offset
                    self.tail(event, t)
                    offset = self._offset
                    continue
                raw = event.raw
                if event.start != offset:
                    raise RecordingError(f"bytes at offset {event.start} do not follow the recorded {offset}")
                if t is not last_t:
                    last_t, t_field = t, dumps(t)
                digest = _hexlify(_sha256(raw).digest())  # the line keeps its first SUM_HEX digits
                if kind is EventStreamMessage:
                    # the prelude's CRC bytes make raw binary: test validity without raising
                    text = raw.decode("utf-8", "ignore")
                    if len(text.encode("utf-8")) == len(raw):
                        raw_field = b'"raw":' + dumps(text)
                    else:
                        raw_field = b'"raw_b64":"' + _b64(raw, newline=False) + b'"'
                    headers = event.headers
                    if headers != last_headers or (
                        last_types is not None and tuple(map(type, headers.values())) != last_types
                    ):
                        headers_json = _headers_json(headers)
                        last_headers, last_types = headers, _value_types(headers)
                    payload = event.payload
                    if payload.isascii():
                        payload_field = b'"payload":' + dumps(payload.decode("ascii"))
                    else:
                        try:
                            payload_field = b'"payload":' + dumps(payload.decode("utf-8"))
                        except UnicodeDecodeError:
                            payload_field = b'"payload_b64":"' + _b64(payload, newline=False) + b'"'
                    lines.append(
                        b'{"type":"frame","seq":%d,"offset":%d,"len":%d,"sum":"%.16s","t":%s,%s,"event":{"headers":%s,%s}}\n'
                        % (event.seq, offset, len(raw), digest, t_field, raw_field, headers_json, payload_field)
                    )
                else:
                    if kind is SSEEvent:
                        if event.id == sse_id and event.retry is None and not event.invalid_utf8:
                            described = plain_sse.get(event.event) or _described(event, sse_id)
                        else:
                            described = _described(event, sse_id)
                            sse_id = event.id
                    else:
                        described = _described(event)
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        lines.append(
                            b'{"type":"frame","seq":%d,"offset":%d,"len":%d,"sum":"%.16s","t":%s,"raw_b64":"%s","event":%s}\n'
                            % (event.seq, offset, len(raw), digest, t_field, _b64(raw, newline=False), described)
                        )
                    else:
                        lines.append(
                            b'{"type":"frame","seq":%d,"offset":%d,"len":%d,"sum":"%.16s","t":%s,"raw":%s,"event":%s}\n'
                            % (event.seq, offset, len(raw), digest, t_field, dumps(text), described)
                        )
                offset += len(raw)
                hashed.append(raw)
                self._frames += 1
                if sync_each:
                    write(lines.pop())
                    self._file.flush()
                    os.fsync(self._file.fileno())
        finally:
            self._offset = offset
            self._sse_id = sse_id
            self._headers = (last_headers, last_types, headers_json)
            if hashed:
                self._body_hash.update(b"".join(hashed))
            if lines:
                write(b"".join(lines))

    def tail(self, event: Tail, t_ms: float | None) -> None:
        """Bytes at the end that formed no frame: a cut event, kept as they came."""
        self._body(event.start, event.raw)
        record = {
            "type": "tail",
            "seq": event.seq,
            "offset": event.start,
            "len": len(event.raw),
            "sum": frame_sum(event.raw),
            "t": t_ms,
            **_raw_field(event.raw),
            "reason": event.reason,
        }
        self._line(record)

    def raw_lines(self, data: bytes | memoryview, t_ms: float | None, line_bytes: int, why: str) -> None:
        """``data`` as raw lines of at most ``line_bytes`` each, so no line outgrows what a reader takes."""
        view = memoryview(data)
        for at in range(0, len(view), line_bytes):
            self.raw(view[at : at + line_bytes], t_ms, why)

    def unkept(self, event: Any, data: bytes | memoryview, t_ms: float | None, line_bytes: int, why: str) -> None:
        """An event the decoder skipped without keeping its bytes (``SpanNotKept``): ``data``, its
        bytes from this writer's offset on, as raw lines, then the event itself with none."""
        self.raw_lines(data, t_ms, line_bytes, why)
        self.frames((event._replace(start=event.end, raw=b""),), (t_ms,))

    def raw(self, data: bytes | memoryview, t_ms: float | None, why: str) -> None:
        """Body bytes recorded without framing (analysis was switched off for this flow, or an
        event outgrew the limit: then ``data`` may be a view, which is not copied)."""
        start = self._offset
        self._body(start, data)
        self._line(
            {"type": "raw", "offset": start, "len": len(data), "sum": frame_sum(data), "t": t_ms, **_raw_field(data), "why": why}
        )

    def read(self, data: bytes, t_ms: float | None) -> None:
        """One network read as the proxy received it (before any content decoding)."""
        self.reads((data,), (t_ms,))

    def reads(self, chunks: Sequence[bytes], t_ms: Sequence[float | None]) -> None:
        """Network reads in order, ``t_ms[i]`` the arrival of ``chunks[i]``."""
        records = self._reads
        offset = self._wire_offset
        if not self.encoded:  # the common case: no wire copy to keep, one hash update
            self._wire_hash.update(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            for data, t in zip(chunks, t_ms):
                records.append([offset, len(data), t])
                offset += len(data)
                if len(records) >= READS_PER_LINE:
                    self._wire_offset = offset
                    self._flush_reads()
                    records = self._reads
            self._wire_offset = offset
            return
        for data, t in zip(chunks, t_ms):
            records.append([offset, len(data), t])
            offset += len(data)
            self._wire_hash.update(data)
            self._wire_pending += data
            if len(records) >= READS_PER_LINE or len(self._wire_pending) >= WIRE_BYTES_PER_LINE:
                self._wire_offset = offset
                self._flush_reads()
                records = self._reads
        self._wire_offset = offset

    def _flush_reads(self) -> None:
        if not self._reads:
            return
        record: dict[str, Any] = {"type": "reads", "reads": self._reads}
        if self.encoded:
            record["wire_b64"] = base64.b64encode(bytes(self._wire_pending)).decode("ascii")
            self._wire_pending.clear()
        self._reads = []
        self._line(record)

    def note(self, kind: str, message: str, t_ms: float | None = None) -> None:
        """Evidence worth keeping in line order: an error streamtap hit, a fault applied."""
        self._line({"type": "note", "kind": kind, "message": message, "t": t_ms})

    def flush(self) -> None:
        """Hand buffered lines to the OS, so a killed proxy loses nothing already seen."""
        self._file.flush()

    def finish(
        self, end: dict[str, Any], final_path: str | os.PathLike[str] | None = None, *, sync: bool = True
    ) -> Path:
        """Write the end line, sync per policy, close, and move to ``final_path``.

        ``sync=False`` leaves the sync and the close to ``sync_and_close``, which the caller
        runs where a disk sync cannot delay traffic (the name is final already: a crash before
        the sync leaves a file that reads back as incomplete, never as a wrong one).

        ``end`` must say how the stream ended (``stream_end``): the readers refuse an end line
        without it, since the body would otherwise be judged as though the upstream had ended it."""
        if not isinstance(end.get("stream_end"), str):
            raise RecordingError("an end line needs stream_end (finished, upstream_reset, client_aborted or proxy_ended)")
        self._flush_reads()
        record: dict[str, Any] = {"type": "end"}
        record.update(end)
        record.update(
            frames=self._frames,
            bytes=self._offset,
            sha256=self._body_hash.hexdigest(),
            wire_bytes=self._wire_offset,
            wire_sha256=self._wire_hash.hexdigest(),
        )
        self._line(record)
        if self.compressed:
            self._file.end_frame()  # a complete zstd frame holds the end line before any sync
        self._file.flush()
        if sync and self.fsync != "never":
            os.fsync(self._file.fileno())
        if final_path is not None:
            final_path = os.fspath(final_path)
            os.rename(self.file_path, final_path)  # the lock belongs to the open file, not the name
            self.file_path = final_path
        if sync:
            self.close()
        return self.path

    @property
    def path(self) -> Path:
        """Where the recording is (``file_path``, as text, for code that runs once per flow)."""
        return Path(self.file_path)

    def sync_and_close(self) -> None:
        """After ``finish(sync=False)``: sync per policy, then close (dropping the lock)."""
        try:
            if self.fsync != "never" and not self.closed:
                os.fsync(self._file.fileno())
        finally:
            self.close()

    def close(self) -> None:
        """Stop writing without an end line: the recording stays marked incomplete."""
        if self.closed:
            return
        self.closed = True
        try:
            self._file.close()  # flushes; closing the fd drops the lock
        except OSError:  # the flush failed (a full disk): the fd must close all the same, or the lock stays held
            try:
                os.close(self._file.fileno())
            except (OSError, ValueError):  # ValueError: the file closed its fd despite the failed flush
                pass
