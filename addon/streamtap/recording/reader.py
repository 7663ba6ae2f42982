"""Read a recording back, and check it against itself.

A file whose writer stopped early (proxy killed, disk full) reads back with
``complete_file = False`` and a ``problem`` saying where it stops; it is never passed
off as a shorter complete turn. A file that is damaged in the middle raises.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

import zstandard

from .compress import read_bytes
from .writer import FORMAT, RecordingError, frame_sum


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
    wire_b64_parts: list[str] = field(default_factory=list, repr=False)

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
    def wire(self) -> bytes:
        """The body bytes as they crossed the network: the body itself unless it was content-encoded."""
        if not self.content_encoding:
            return self.body
        return b"".join(base64.b64decode(p) for p in self.wire_b64_parts)

    @property
    def verdict(self) -> dict[str, Any] | None:
        return (self.end or {}).get("verdict")


def _bytes_of(record: dict[str, Any]) -> bytes:
    if "raw" in record:
        return _typed(record, "raw", str, required=True).encode("utf-8")
    return base64.b64decode(_typed(record, "raw_b64", str) or "")


_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", (int, float): "a number"}


def _typed(record: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    """``record[name]`` when it has the type the format gives it (None when absent and optional).
    Raises ValueError otherwise: the caller names the line."""
    value = record.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name!r} is {orjson.dumps(value).decode()[:40]}, not {_NAMES[kind]}")
    return value


def _read_entry(entry: Any) -> tuple[int, int, float | None]:
    """One ``[wire_offset, length, t_ms]`` of a reads line."""
    if isinstance(entry, list) and len(entry) == 3:
        offset, length, t = entry
        if type(offset) is int and type(length) is int and (t is None or type(t) in (int, float)):
            return offset, length, t
    raise ValueError(f"a network read is {orjson.dumps(entry).decode()[:40]}, not [offset, length, t]")


def _recording_bytes(path: Path) -> bytes:
    """The recording's lines, decompressed for a ``.jsonl.zst``."""
    try:
        return read_bytes(path)
    except zstandard.ZstdError as exc:
        raise RecordingError(f"{path}: the zstd stream is damaged: {exc}") from None


def read_recording(path: str | os.PathLike[str]) -> Recording:
    """Parse a recording. Raises RecordingError when it is not one or is damaged mid-file."""
    path = Path(path)
    data = _recording_bytes(path)
    lines = data.split(b"\n")
    complete_file = True
    problem: str | None = None
    if lines and lines[-1] == b"":
        lines.pop()
    header: dict[str, Any] | None = None
    frames: list[Frame] = []
    segments: list[Frame] = []
    reads: list[tuple[int, int, float | None]] = []
    notes: list[dict[str, Any]] = []
    wire_parts: list[str] = []
    end: dict[str, Any] | None = None
    position = 0
    for number, line in enumerate(lines, start=1):
        is_last = number == len(lines)
        cut = is_last and not data.endswith(b"\n")
        try:
            if cut:
                raise ValueError("no newline")
            record = orjson.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except (ValueError, orjson.JSONDecodeError):
            if is_last:
                complete_file = False
                problem = f"recording incomplete at byte {position}: the last line is cut (the writer stopped mid-line)"
                break
            raise RecordingError(f"{path}: line {number} (byte {position}) is not a JSON object: the file is damaged") from None
        position += len(line) + 1
        kind = record.get("type")
        if number == 1:
            if kind != "header" or not str(record.get("format", "")).startswith("streamtap-recording/"):
                raise RecordingError(f"{path} is not a streamtap recording (line 1 is not a {FORMAT} header)")
            header = record
        elif end is not None:
            raise RecordingError(f"{path}: line {number} follows the end line")
        try:  # the fields the format types, so a damaged value fails here, naming its line
            if number == 1:
                for name in ("request", "response", "wire"):
                    _typed(record, name, dict)
                for name in ("dialect", "sentinel"):
                    _typed(record, name, str)
                _typed(record.get("response") or {}, "status", int)
                _typed(record.get("wire") or {}, "format", str)
            elif kind in ("frame", "raw", "tail"):
                segment = Frame(
                    kind=kind,
                    seq=_typed(record, "seq", int),
                    offset=_typed(record, "offset", int, required=True),
                    raw=_bytes_of(record),
                    t_ms=_typed(record, "t", (int, float)),
                    sum=_typed(record, "sum", str) or "",
                    event=_typed(record, "event", dict) or ({"reason": record["reason"]} if "reason" in record else {}),
                    line=number,
                )
                segments.append(segment)
                if kind == "frame":
                    frames.append(segment)
            elif kind == "reads":
                entries = _typed(record, "reads", list) or []
                reads.extend(_read_entry(entry) for entry in entries)
                if "wire_b64" in record:
                    wire_parts.append(_typed(record, "wire_b64", str, required=True))
            elif kind == "note":
                notes.append(record)
            elif kind == "end":
                _typed(record, "verdict", dict)
                _typed(record, "stream_end", str)
                end = record
            # unknown line types are skipped: a newer writer may add some
        except (ValueError, binascii.Error) as exc:
            raise RecordingError(f"{path}: line {number} is damaged: {exc}") from None
    if header is None:
        raise RecordingError(f"{path} is empty: recording incomplete at byte 0") if not data else RecordingError(
            f"{path}: recording incomplete at byte 0: the header line is cut"
        )
    if end is None and complete_file:
        complete_file = False
        problem = f"recording incomplete at byte {position}: no end line (the writer stopped before the stream ended)"
    return Recording(
        path=path,
        header=header,
        frames=frames,
        segments=segments,
        reads=reads,
        notes=notes,
        end=end,
        complete_file=complete_file,
        problem=problem,
        wire_b64_parts=wire_parts,
    )


def check_recording(recording: Recording) -> list[str]:
    """Everything in the recording that does not check out against itself (empty: all good)."""
    problems: list[str] = []
    if recording.problem:
        problems.append(recording.problem)
    expected_offset = 0
    expected_seq: int | None = None
    for s in recording.segments:
        where = f"line {s.line} ({s.kind} seq {s.seq})"
        if s.offset != expected_offset:
            problems.append(f"{where}: offset {s.offset}, expected {expected_offset} (bytes missing or overlapping)")
        if frame_sum(s.raw) != s.sum:
            problems.append(f"{where}: sum {s.sum} does not match its bytes ({frame_sum(s.raw)})")
        if s.seq is not None:
            if expected_seq is not None and s.seq != expected_seq:
                problems.append(f"{where}: sequence number {s.seq}, expected {expected_seq}")
            expected_seq = s.seq + 1
        expected_offset = s.offset + len(s.raw)
    wire_offset = 0
    for offset, length, _ in recording.reads:
        if offset != wire_offset:
            problems.append(f"network read at wire offset {offset}, expected {wire_offset}")
        wire_offset = offset + length
    end = recording.end
    if end is not None:
        body = recording.body
        if end.get("bytes") != len(body):
            problems.append(f"end line says {end.get('bytes')} body bytes, the frames hold {len(body)}")
        if end.get("sha256") != hashlib.sha256(body).hexdigest():
            problems.append("body sha256 differs from the end line's")
        if recording.reads and end.get("wire_bytes") != wire_offset:
            problems.append(f"end line says {end.get('wire_bytes')} wire bytes, the reads add up to {wire_offset}")
        if recording.content_encoding and end.get("wire_sha256") != hashlib.sha256(recording.wire).hexdigest():
            problems.append("wire sha256 differs from the end line's")
    return problems
