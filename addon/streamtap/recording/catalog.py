"""One row per recording, read from its header and end lines only: the unit of the fleet view
(``streamtap report``, ``streamtap index``).

The end line is found from the end of the file, so a 100 MB recording costs two short reads,
not a parse of every frame. The row trusts what the writer put in the end line; ``verify``
is the command that rechecks the frames against it.
"""

from __future__ import annotations

import calendar
import errno
import fcntl
import io
import math
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from streamtap.providers.model import model_of

from .compress import READ_SIZE, SUFFIX, ZstdDamage, ZstdFrames, is_compressed
from .reader import (
    CONVERTED, FORMAT_MARK, MAX_LINE_BYTES, STREAM_ENDS, VERDICT_KINDS, HeaderCut, check_end, check_header, counted, header_damage,
    line_json, one_of,
)
from .writer import FORMATS, PARTIAL_SUFFIX, RecordingError

RECORDING_SUFFIXES = (".jsonl", ".jsonl" + SUFFIX)
# How a finished recording is named (writer.final_name, plus .zst when compressed): stamp, provider,
# verdict and flow id, none of which holds "_". A file so named is a recording even when cut in its header.
FINAL_NAME = re.compile(r"\d{8}T\d{6}\.\d{3}Z_[^_/]+_[^_/]+_[^_/]+\.jsonl(\.zst)?\Z")
# What every name the proxy and `streamtap import` give begins with (writer.partial_name and
# final_name): the UTC start (writer.stamp) and the provider
NAME_START = re.compile(r"(\d{8}T\d{6})\.(\d{3})Z_([^_/]+)_")
# The provider of a recording whose header names a provider outside ASCII (only a hand-made one
# does: the proxy writes dialect names). DuckDB's partition folder percent-encodes each UTF-8
# byte, which Spark and Hive read back as one character each: every engine reads this instead.
OTHER_PROVIDER = "other"
# A longer provider name is OTHER_PROVIDER too: its partition folder, percent-encoded (3 bytes a
# character at most), must fit the file systems' 255-byte name limit
MAX_PROVIDER_NAME = 80
# Hive (and Spark with Hive's catalog) reads a partition folder of this name as NULL, not as the name
HIVE_NULL_PARTITION = "__hive_default_partition__"
NEVER_RENAMED = ("never finished: its end line is there, but its writer stopped before renaming it "
                 "from .partial (it may not have reached the disk)")
HEAD_BLOCK = 32 * 1024  # most recordings fit whole: one read
TAIL_BLOCK = 64 * 1024
SCAN_BLOCK = 8 * 1024 * 1024  # the largest block read looking for a long last line's start
# A line longer than the format allows (MAX_LINE_BYTES, which a header holding a large request
# stays under too) is damage here as in verify: the verbs never disagree on a file
TOO_LONG = f"is longer than {MAX_LINE_BYTES} bytes, the longest line the format allows"
# The range of `started` every engine reading the index takes (years 1970 to 9999, in seconds):
# a time in milliseconds, say, would otherwise make a day partition like day=58888-01-09.
LAST_START = 253402300799
# bounds of the integer columns (a value outside is a damaged recording, not a row to cast)
INTEGER_RANGES = {"INTEGER": (-(2**31), 2**31 - 1), "BIGINT": (-(2**63), 2**63 - 1)}

# the columns of a row, in order, with their DuckDB types (the index's Parquet schema)
COLUMNS: dict[str, str] = {
    "started": "TIMESTAMPTZ",
    "day": "DATE",
    "provider": "VARCHAR",
    "model": "VARCHAR",
    "verdict": "VARCHAR",
    "reason": "VARCHAR",
    "stream_end": "VARCHAR",
    "status": "INTEGER",
    "ttft_ms": "DOUBLE",
    "duration_ms": "DOUBLE",
    "bytes": "BIGINT",
    "events": "BIGINT",
    "input_tokens": "BIGINT",
    "output_tokens": "BIGINT",
    "cache_read_tokens": "BIGINT",
    "cache_write_tokens": "BIGINT",
    "reasoning_tokens": "BIGINT",
    "path": "VARCHAR",
    "sha256": "VARCHAR",
    "flow_id": "VARCHAR",
    "host": "VARCHAR",
    "url_path": "VARCHAR",
    "method": "VARCHAR",
    "file_complete": "BOOLEAN",
    "problem": "VARCHAR",
    "recording_bytes": "BIGINT",
}


class NotARecording(RecordingError):
    """The file is not a streamtap recording (or its header line is unreadable)."""


@dataclass(slots=True)
class Found:
    path: Path
    named: bool  # given by name (a mistake in it is the user's to hear about) or found in a directory
    unreadable: str | None = None  # a folder that could not be searched, and why: its recordings are unknown


def files_under(folder: Path, suffixes: tuple[str, ...], *, real: bool = False) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The files below ``folder`` (recursively) whose names end in one of ``suffixes``, and each
    folder in it that could not be read, with why. The one folder walk of ``verify``, ``report``,
    ``index`` and the replay library; each decides what an unreadable folder means to it.
    ``real``: each file by its real path, so that one recording reached through several paths
    (a link, and the folder it is in, given too) is one path wherever it was found."""
    unreadable: list[tuple[Path, str]] = []
    # Symbolic links are followed (a folder of recordings on another disk), and each file and
    # folder is taken once, by its real path: a link to a recording is not a second one, and a
    # link back up the tree is not a loop. A file keeps the name it was found by, its own where
    # the tree holds both (linked folders are walked after the rest), else the first link's.
    found: dict[str, tuple[bool, str]] = {}  # real path -> (found through a link, the name found by)
    root = os.path.realpath(folder)
    walked, pending, linked = {root}, [(str(folder), root, False)], []
    while pending or linked:
        if not pending:  # the tree is walked: now the folders it links to, that it does not hold
            linked.sort()
            directory, where = linked.pop(0)
            if where not in walked:
                walked.add(where)
                pending.append((directory, where, True))
            continue
        directory, where, via_link = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as error:
            unreadable.append((Path(error.filename or directory), error.strerror or str(error)))
            continue
        for entry in entries:
            link = entry.is_symlink()
            target = os.path.realpath(entry.path) if link else os.path.join(where, entry.name)
            if _is_dir(entry):
                if link:
                    linked.append((entry.path, target))
                elif target not in walked:
                    walked.add(target)
                    pending.append((entry.path, target, via_link))
            elif entry.name.endswith(suffixes):
                if link and not os.path.exists(target):  # dangling: what cannot be read is the name it was found by
                    target = entry.path
                seen = (via_link or link, entry.path)
                if found.get(target, seen) >= seen:
                    found[target] = seen
    if real:
        return [Path(target if os.path.exists(target) else name) for target, (_, name) in found.items()], unreadable
    return [Path(name) for _, name in found.values()], unreadable


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link: one stat for it, none for the rest (the listing's type)
    except OSError:
        return False


def find_recordings(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Found]:
    """The recording files among ``paths``, as absolute paths: files as given, directories
    searched recursively for ``*.jsonl`` and ``*.jsonl.zst`` (sorted, so the order is the same on
    every run); a folder that cannot be searched comes as a ``Found`` that says why. Raises
    FileNotFoundError for a path that does not exist."""
    for raw in paths:
        path = Path(raw)
        try:
            is_folder = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError as error:
            if missing(path):
                raise FileNotFoundError(f"{path}: no such file or directory") from None
            # there, but not to be looked at (a folder on its way that may not be searched): its
            # recording is unknown, as one found in a folder that cannot be read; the run goes on
            yield Found(path.resolve(), named=True, unreadable=f"cannot read this recording: {error.strerror or error}")
            continue
        if is_folder:
            # resolved once: resolving each file costs a stat per folder level
            files, unreadable = files_under(path.resolve(), RECORDING_SUFFIXES, real=True)
            # a file that is no regular file is skipped later, and said so
            found = [Found(file, named=False) for file in files]
            found += (Found(folder, named=False, unreadable=f"cannot read this folder: {why}") for folder, why in unreadable)
            yield from sorted(found, key=lambda item: item.path)
        else:
            yield Found(path.resolve(), named=True)


def missing(path: str | os.PathLike[str]) -> bool:
    """Whether nothing is at ``path``, as ``Path.exists`` says (a dangling link, a loop of links),
    but for a path that may not be looked at (a folder on its way that may not be searched): it
    is there, only unreadable, where ``Path.exists`` raises and ``os.path.exists`` says False.
    Raises the OSError of a path that cannot be one (a name too long)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError as error:
        if error.errno == errno.ELOOP:
            return True
        if error.errno in (errno.EACCES, errno.EPERM):
            return False
        raise
    return False


_HEADER_START = b'{"type":"header",'  # how the writer begins every recording (orjson, no spaces)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CRLF = b"\r\n"
_FIRST_LINE_READ = 1 << 20  # enough of a first line to tell a header, damaged or not, from other files


def is_recording_file(path: str | os.PathLike[str]) -> bool:
    """Does ``path`` hold a recording, whole or damaged, as the readers take one (a header line,
    a zstd stream named ``.jsonl.zst``, a proxy's recording name, or a first line that marks a
    damaged or lost header), or a zstd stream of another name whose first line is one of those
    (a compressed recording renamed: the readers would not take it, but it is one all the same)?
    For the verbs that write a file: they never overwrite one."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as handle:
            head = handle.readline(_FIRST_LINE_READ)
    except OSError:
        return False
    if head.startswith(_HEADER_START) or recording_name(Path(path)):
        return True
    if head.startswith(_ZSTD_MAGIC):
        if os.fspath(path).endswith(RECORDING_SUFFIXES[1]):
            return True  # read as a recording by its name, damaged or not
        # a compressed recording under another name (backup.zst) is one all the same: by its first line
        try:
            with open(path, "rb") as handle:
                head = _first_zstd_line(handle)
        except OSError:
            return False
        if head.startswith(_HEADER_START):
            return True
    return header_damage(head.rstrip(b"\r\n")) is not None


def _first_zstd_line(handle: BinaryIO) -> bytes:
    """The first line the zstd stream in ``handle`` decodes to, up to _FIRST_LINE_READ bytes of
    it, from as much of the file at most (a stream of empty frames costs no more); what decoded
    before damage, if any."""
    frames, line, read = ZstdFrames(), bytearray(), 0
    try:
        while b"\n" not in line and len(line) < _FIRST_LINE_READ and read < _FIRST_LINE_READ:
            data = handle.read(READ_SIZE)
            if not data:
                break
            read += len(data)
            for piece in frames.pieces(data):
                line += piece
                if b"\n" in piece or len(line) >= _FIRST_LINE_READ:
                    break
    except ZstdDamage:
        pass
    return bytes(line[:_FIRST_LINE_READ]).split(b"\n", 1)[0]


def recording_name(path: Path) -> bool:
    """Whether the file is named as a proxy names the recordings it writes."""
    return is_partial(path) or FINAL_NAME.match(path.name) is not None


def is_recording(path: Path, first_line: bytes) -> bool:
    """Whether a file is a streamtap recording, whole or damaged, by its name and its first line
    (its header or a damaged one, both carrying the format's mark, or the line that followed a
    lost header)."""
    return recording_name(path) or header_damage(first_line) is not None or first_line.startswith(_HEADER_START)


def name_start(path: Path) -> tuple[float, str] | None:
    """The UTC start and the provider a recording's name holds when the proxy or ``streamtap
    import`` named it, else None: what dates and files a recording whose header cannot say (a
    killed proxy's leftover, a damaged one), rather than the day it was copied."""
    match = NAME_START.match(path.name) if recording_name(path) else None
    if match is None:
        return None
    try:
        when = calendar.timegm(time.strptime(match[1], "%Y%m%dT%H%M%S")) + int(match[2]) / 1000
    except (ValueError, OverflowError):  # digits that are no date: a name that only looks like one
        return None
    return (when, match[3]) if 0 <= when <= LAST_START else None


def is_partial(path: Path) -> bool:
    """Named as a writer names a recording until it is finished (renaming it is the writer's last act)."""
    return path.name.endswith((PARTIAL_SUFFIX, PARTIAL_SUFFIX + SUFFIX))


def never_renamed(path: Path, has_end: bool) -> str | None:
    """The problem of a recording whose end line is there but whose name is still .partial: its
    writer died at the very end (its sync may not have happened either), so it is not vouched
    for as complete. The same rule for ``verify`` and the fleet view (``report``, ``index``)."""
    return NEVER_RENAMED if has_end and is_partial(path) else None


@contextmanager
def unless_being_written(path: Path) -> Iterator[bool]:
    """False while a writer holds the recording's lock (a stream still open in a live proxy), or
    its writer renamed or removed it since its folder was listed; else True, with a shared lock
    held until the block ends, so no writer changes the file while it is read.

    A killed proxy's lock is gone with it, so its ``.partial`` file is not being written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a fifo must not hold us
    except FileNotFoundError:
        fd, readable = None, os.path.lexists(path)  # a dangling link is the reading's to report
    except OSError:
        fd, readable = None, True  # the reading says why it cannot be read
    if fd is None:
        yield readable
        return
    try:
        yield _locked_as_named(fd, path)
    finally:
        os.close(fd)  # closing drops a lock taken here


def _locked_as_named(fd: int, path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # a file system without locks: read it as it is
    try:  # locked, but still the file of that name (its writer may have renamed it before the lock)?
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False


def open_bytes(path: Path) -> tuple[BinaryIO, bool]:
    """The recording's lines as a seekable binary file (unbuffered: the reads below are few and
    large), and whether its last zstd frame ended (True for a file that is not compressed). A
    ``.jsonl.zst`` has no index of its frames: it is decoded through once, keeping its first
    line and its last (``_Ends``), so that a small file that decodes to gigabytes costs no more."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # before opening it: a fifo would wait for a writer, a device never end
        raise NotARecording(f"{path} is not a regular file")
    handle = open(path, "rb", buffering=0)
    if not is_compressed(path):
        return handle, True  # type: ignore[return-value]
    with handle:
        try:
            ends = _Ends.of(handle)  # type: ignore[arg-type]
        except ZstdDamage as exc:
            raise RecordingError(f"the zstd stream is damaged: {exc}") from None
    return ends, ends.frame_ended  # type: ignore[return-value]


class _Ends(io.RawIOBase):
    """A decoded zstd recording's first line (and up to HEAD_BLOCK after it) and its last line,
    at their offsets: what ``read_ends`` reads of a file. Reads go to the head; the last line
    is ``last`` (from ``last_start``), ``size`` the decoded length."""

    def __init__(self, head: bytes, last: bytes, last_start: int, size: int, frame_ended: bool) -> None:
        self.head, self.last, self.last_start, self.size, self.frame_ended = head, last, last_start, size, frame_ended
        self.position = 0

    @classmethod
    def of(cls, handle: BinaryIO) -> _Ends:
        frames = ZstdFrames()
        head, head_limit = bytearray(), MAX_LINE_BYTES + HEAD_BLOCK
        line, line_start = bytearray(), 0  # the line being decoded
        last, last_start = b"", 0  # the last whole line so far
        size = 0
        while data := handle.read(READ_SIZE):
            for piece in frames.pieces(data):
                if len(head) < head_limit:
                    head += piece[: head_limit - len(head)]
                    if head_limit > MAX_LINE_BYTES and (newline := head.find(b"\n")) >= 0:
                        head_limit = newline + 1 + HEAD_BLOCK
                        del head[head_limit:]
                end = piece.rfind(b"\n")
                if end < 0:
                    line += piece
                else:
                    before = piece.rfind(b"\n", 0, end)
                    if before < 0:
                        last, last_start = bytes(line + piece[: end + 1]), line_start
                    else:
                        last, last_start = piece[before + 1 : end + 1], size + before + 1
                    line, line_start = bytearray(piece[end + 1 :]), size + end + 1
                if len(line) > MAX_LINE_BYTES:  # no reader takes such a line; a decompression bomb makes one
                    raise RecordingError(f"the line at byte {line_start} {TOO_LONG}")
                size += len(piece)
        if line:  # the file ends inside a line
            last, last_start = bytes(line), line_start
        return cls(bytes(head), last, last_start, size, frames.frame_ended)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence] + offset
        return self.position

    def readinto(self, buffer) -> int:
        """From the head only: the lines between the first and the last are not kept."""
        taken = self.head[self.position : self.position + len(buffer)]
        buffer[: len(taken)] = taken
        self.position += len(taken)
        return len(taken)


def _last_line(handle: BinaryIO, size: int) -> tuple[bytes, int]:
    """The file's last line (with its newline, if it has one) and the byte where it starts. Its
    start is looked for backwards in growing blocks, which are not kept (an end line holds the
    whole answer's text), and the line read once found: a line longer than the format allows is
    refused holding one block at most."""
    block, position, start = TAIL_BLOCK, size, 0
    while position > 0:
        step = min(block, position)
        position -= step
        handle.seek(position)
        data = handle.read(step)
        cut = data.rfind(b"\n", 0, size - 1 - position)  # (the file's last byte may be the line's own newline)
        if cut >= 0:
            start = position + cut + 1
            if position + step == size:  # the whole line is in this block
                return data[cut + 1 :], start
            break
        if size - position > MAX_LINE_BYTES:
            raise RecordingError(f"the last line (before byte {size}) {TOO_LONG}")
        block = min(2 * block, SCAN_BLOCK)
    if size - start > MAX_LINE_BYTES:  # (counted with its newline, as the first line is)
        raise RecordingError(f"the last line (byte {start} on) {TOO_LONG}")
    handle.seek(start)
    return handle.read(size - start), start


def _json_line(line: bytes) -> dict[str, Any] | None:
    try:
        record = line_json(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_ends(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str | None, int]:
    """(header, end line or None, why the file is incomplete or None, size of the lines). A
    recording still named .partial has its end line and a problem both.

    A small file takes one read; a large one a read at each end."""
    handle, frame_ended = open_bytes(path)
    with handle:
        head = handle.read(HEAD_BLOCK)
        while b"\n" not in head and head.startswith(b"{") and len(head) <= MAX_LINE_BYTES:
            # a long request in the header: read on to its line end, or one byte past the limit
            more = handle.read(min(max(len(head), HEAD_BLOCK), MAX_LINE_BYTES + 1 - len(head)))
            if not more:
                break
            head += more
        first = head[: head.find(b"\n") + 1] or head
        if len(first) > MAX_LINE_BYTES:
            raise RecordingError(f"line 1 {TOO_LONG}")
        cut_in_first_line = not first.endswith(b"\n") and handle.seek(0, os.SEEK_END) == len(head)
        if cut_in_first_line and _header_cut(path, head, frame_ended):
            why = ("the zstd stream ends before its first line decodes" if not head and not frame_ended
                   else "the file is empty" if not head else "the header line is cut")
            raise HeaderCut(f"recording incomplete at byte 0: {why}")  # as verify says it
        header = _json_line(first) if first.endswith(b"\n") else None
        if header is None or header.get("type") != "header" or not str(header.get("format", "")).startswith(
            "streamtap-recording/"
        ):
            damage = header_damage(first)
            if damage or recording_name(path):  # a recording all the same: damaged, so listed, never skipped
                raise RecordingError(damage or "line 1 is not a recording header")
            raise NotARecording(f"{path} is not a streamtap recording (line 1 is not a recording header)")
        if header["format"] not in FORMATS:
            raise RecordingError(f"the recording is {header['format']}, this streamtap reads {' and '.join(FORMATS)}")
        if first.endswith(CRLF):
            raise RecordingError(f"line 1 {CONVERTED}")
        try:  # as verify reads it: a field of the wrong type is damage, not a value to leave out
            check_header(header)
        except ValueError as exc:
            raise RecordingError(f"line 1 is damaged: {exc}") from None
        size = handle.seek(0, os.SEEK_END)
        if size == len(first):
            return header, None, f"recording incomplete at byte {size}: no end line", size
        if size <= len(head):  # the whole file is in hand
            start = head.rfind(b"\n", 0, len(head) - 1) + 1
            last = head[start:]
        elif isinstance(handle, _Ends):
            last, start = handle.last, handle.last_start
        else:
            last, start = _last_line(handle, size)
    if not last.endswith(b"\n"):
        return header, None, f"recording incomplete at byte {start}: the last line is cut (the writer stopped mid-line)", size
    if last.endswith(CRLF):
        raise RecordingError(f"the last line (byte {start}) {CONVERTED}")
    end = _json_line(last)
    if end is None:
        raise RecordingError(f"the last line (byte {start}) is not a JSON object")
    if end.get("type") != "end":
        return header, None, f"recording incomplete at byte {size}: no end line (the writer stopped before the stream ended)", size
    if not frame_ended:  # every line is there, but the file was cut after them (in the frame's checksum, say)
        return header, None, f"recording incomplete at byte {size}: the zstd stream ends inside a frame", size
    return header, end, never_renamed(path, has_end=True), size  # a .partial name: the verdict stands, not vouched for


def _header_cut(path: Path, head: bytes, frame_ended: bool) -> bool:
    """Whether a file that ends inside its first line is a recording cut in its header (listed as
    incomplete) rather than some other program's file (skipped): its name is a recording's, it
    begins as a recording's header, or it is a zstd stream cut before a line decodes (as
    ``verify`` reads each)."""
    if recording_name(path):
        return True
    if not head:
        return not frame_ended
    return head.lstrip().startswith(b"{") and FORMAT_MARK.search(head) is not None


def _number(value: Any) -> int | float | None:
    return value if type(value) in (int, float) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def recording_row(path: Path) -> dict[str, Any]:
    """The row of one recording (the keys of COLUMNS; ``started`` as epoch seconds, ``day`` as
    YYYY-MM-DD in UTC). Raises NotARecording or RecordingError."""
    header, end, problem, size = read_ends(path)
    request = header.get("request") if isinstance(header.get("request"), dict) else {}
    response = header.get("response") if isinstance(header.get("response"), dict) else {}
    end = end or {}
    verdict = end.get("verdict") if isinstance(end.get("verdict"), dict) else {}
    turn = end.get("turn") if isinstance(end.get("turn"), dict) else {}
    usage = turn.get("usage") if isinstance(turn.get("usage"), dict) else {}
    url = _text(request.get("url")) or ""
    try:
        parts = urlsplit(url)
        host, url_path = parts.hostname, parts.path
    except ValueError:
        host, url_path = None, None
    named = name_start(path)
    started = _number(header.get("started")) or _number(header.get("request_started"))
    if started is None:
        started = named[0] if named else path.stat().st_mtime
    events = _number(end.get("events"))
    if events is None:
        events = _number(end.get("frames"))
    if not 0 <= started <= LAST_START:
        raise RecordingError(f"its start time {started} is not seconds since 1970 (at most year 9999)")
    _check_names(verdict, end)
    _check_end_line(end)
    row = {
        "started": started,
        "day": _day(started),
        "provider": _provider(_text(header.get("dialect")) or (named[1] if named else None)),
        "model": model_of(_text(turn.get("model")), url, request.get("body")),
        "verdict": _text(verdict.get("kind")),
        "reason": _text(verdict.get("reason")),
        "stream_end": _text(end.get("stream_end")),
        "status": _number(response.get("status")),
        "ttft_ms": _number(end.get("ttft_ms")),
        "duration_ms": _number(end.get("duration_ms")),
        "bytes": _number(end.get("bytes")),
        "events": events,
        "input_tokens": _number(usage.get("input")),
        "output_tokens": _number(usage.get("output")),
        "cache_read_tokens": _number(usage.get("cache_read")),
        "cache_write_tokens": _number(usage.get("cache_write")),
        "reasoning_tokens": _number(usage.get("reasoning")),
        "path": str(path),  # absolute: find_recordings resolved it
        "sha256": _text(end.get("sha256")),
        "flow_id": _text(header.get("flow_id")),
        "host": host,
        "url_path": url_path,
        "method": _text(request.get("method")),
        "file_complete": problem is None,
        "problem": problem,
        "recording_bytes": path.stat().st_size if is_compressed(path) else size,
    }
    _check_values(row)
    return row


def _day(started: float) -> str:
    """The UTC day of ``started`` as the index's timestamp has it: to the microsecond, rounded."""
    return time.strftime("%Y-%m-%d", time.gmtime(round(started, 6)))


def _check_names(verdict: dict[str, Any], end: dict[str, Any]) -> None:
    """The verdict kind and stream end are among the format's names, as ``verify`` requires: any
    other text is a damaged line, never a verdict of its own to count."""
    try:
        one_of(verdict, "kind", VERDICT_KINDS)
    except ValueError as exc:
        raise RecordingError(f"its verdict's {exc}") from None
    try:
        one_of(end, "stream_end", STREAM_ENDS)
    except ValueError as exc:
        raise RecordingError(f"its end line's {exc}") from None


USAGE_COUNTS = ("input", "output", "cache_read", "cache_write", "reasoning")  # the turn's usage the row takes


def _check_end_line(end: dict[str, Any]) -> None:
    """The end line's fields as ``verify`` checks them (counts and sizes never negative, times
    never negative, a number where the format has one), and the usage counts the row takes: a
    line that breaks them is damaged, its values no figures to count. A cut recording has none."""
    if not end:
        return
    try:
        check_end(end)
    except ValueError as exc:
        raise RecordingError(f"its end line's {exc}") from None
    usage = end["turn"].get("usage") if isinstance(end.get("turn"), dict) else None
    try:
        for name in USAGE_COUNTS if isinstance(usage, dict) else ():
            counted(usage, name)
    except ValueError as exc:
        raise RecordingError(f"its end line's usage {exc}") from None


def _provider(name: str | None) -> str:
    """The provider as every engine reads the index's partition folder (OTHER_PROVIDER)."""
    if not name:
        return "unknown"
    if not name.isascii() or len(name) > MAX_PROVIDER_NAME or name.lower() == HIVE_NULL_PARTITION:
        return OTHER_PROVIDER
    return name


def _check_values(row: dict[str, Any]) -> None:
    """Every value fits its column's type, so one damaged recording cannot fail a whole report
    or index in the engine's cast; integral floats become ints. A token count no column takes
    (a provider's count past 2^63) is left NULL, as the metrics leave one past 2^53 out. (The header's values were checked
    as verify checks them, the status among them.)"""
    for name, kind in COLUMNS.items():
        value = row[name]
        if value is None or type(value) not in (int, float):
            continue
        if kind in INTEGER_RANGES:
            low, high = INTEGER_RANGES[kind]
            if type(value) is float and value.is_integer() and low <= value <= high:
                row[name] = value = int(value)
            if type(value) is not int or not low <= value <= high:
                if name.endswith("_tokens"):  # the provider's count, not the recording's damage: the turn still counts
                    row[name] = None
                    continue
                raise RecordingError(f"its {name} {value!r} is not a {kind.lower()} value")
        elif not math.isfinite(value):
            raise RecordingError(f"its {name} {value!r} is not a finite number")


def damaged_row(path: Path, problem: str) -> dict[str, Any]:
    """The row of a recording that cannot be read as one (cut before its header was whole, a
    newer format, values out of range): counted, listed with its problem, never judged. Dated and
    filed by its name when the proxy named it, else by its last change."""
    try:
        info = path.stat()
        started, size = info.st_mtime, info.st_size
    except OSError:
        started, size = 0.0, None
    named = name_start(path)
    if named:
        started = named[0]
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        started=started, day=_day(started), provider=_provider(named[1] if named else None),
        path=str(path), file_complete=False, problem=problem, recording_bytes=size,
    )  # fmt: skip
    return row
