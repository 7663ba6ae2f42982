"""Compressed recordings: the same JSON lines in a zstd stream (``.jsonl.zst``), written with
zstandard and read a bounded piece at a time (``content.ZstdFrames``, Python's own zstd reader).

Crash honesty carries over. Each time the writer hands lines to the OS (a flush, every
0.1 s while a stream is open) the compressor ends a zstd *block*: everything written so far
decodes, and the stream keeps its context, so the ratio stays that of one stream. The end
line ends the zstd *frame* (with its checksum) before the disk sync. A file cut anywhere (the
proxy killed) decodes to a prefix of the lines, whose last line is cut or which has no end
line, or else its frame never ended (cut after the end line's block, as in its checksum): it
reads as "recording incomplete", never as a shorter complete turn. DuckDB's ``read_json``
reads the files in place.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import zstandard

from .content import ZstdDamage, ZstdFrames

SUFFIX = ".zst"
COMPRESSIONS = ("none", "zstd")
LEVEL = 3  # zstd's default: ~300 MB/s on one core here, far above a proxy's recording rate
READ_SIZE = 1 << 20


class ZstdLines:
    """A binary file for the writer's lines that compresses them into ``raw`` (an open file).

    ``flush`` ends a block (decodable, context kept); ``end_frame`` ends the frame."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._zstd = zstandard.ZstdCompressor(level=LEVEL, write_checksum=True).stream_writer(raw, closefd=False)
        self._frame_open = False  # lines written since the last frame ended

    def write(self, data: bytes) -> int:
        self._frame_open = True
        return self._zstd.write(data)

    def flush(self) -> None:
        self._zstd.flush(zstandard.FLUSH_BLOCK)
        self._raw.flush()

    def end_frame(self) -> None:
        self._zstd.flush(zstandard.FLUSH_FRAME)
        self._raw.flush()
        self._frame_open = False

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        try:
            if self._frame_open:  # a recording closed without its end line still ends its frame
                self._zstd.flush(zstandard.FLUSH_FRAME)
        finally:
            self._raw.close()  # not the compressor's close: it would append an empty frame


def is_compressed(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(SUFFIX)


def decompress_checked(handle: BinaryIO) -> tuple[bytes, bool]:
    """Every byte the zstd stream in ``handle`` decodes to (all its frames, and the decodable
    part of a last frame the writer never ended), and whether that last frame ended (True for
    an empty file). Raises one of ``ZstdDamage`` on damaged data."""
    out = []
    frames = ZstdFrames()
    while data := handle.read(READ_SIZE):
        out += frames.pieces(data)
    return b"".join(out), frames.frame_ended


def decompress_file(handle: BinaryIO) -> bytes:
    """Every byte the zstd stream in ``handle`` decodes to: all its frames, and the decodable
    part of a last frame the writer never ended. Raises one of ``ZstdDamage`` on damaged data."""
    return decompress_checked(handle)[0]


class _ZstdRaw(io.RawIOBase):
    """The decoded bytes of a zstd file, read as they are asked for (bounded memory: a piece of
    the decoded stream at a time): every frame, and the decodable part of a last frame the
    writer never ended."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._frames = ZstdFrames()
        self._pieces = iter(())
        self._pending = b""
        self._at = 0  # (an offset into _pending: slicing off what was read copies the rest each time)

    @property
    def frame_ended(self) -> bool:
        return self._frames.frame_ended

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._pending):
            try:
                piece = next(self._pieces, None)
            except ZstdDamage as exc:
                raise OSError(f"the zstd stream is damaged: {exc}") from None
            if piece is None:
                data = self._handle.read(READ_SIZE)
                if not data:
                    return 0
                self._pieces = self._frames.pieces(data)
                continue
            self._pending, self._at = piece, 0
        size = min(len(buffer), len(self._pending) - self._at)
        buffer[:size] = memoryview(self._pending)[self._at : self._at + size]
        self._at += size
        return size

    def close(self) -> None:
        self._handle.close()
        super().close()


def open_lines(path: str | os.PathLike[str]) -> BinaryIO:
    """A recording's lines as a binary file, decompressed as read when the name ends in ``.zst``."""
    handle = open(path, "rb")
    return io.BufferedReader(_ZstdRaw(handle), READ_SIZE) if is_compressed(path) else handle  # type: ignore[return-value]


def frames_ended(lines: BinaryIO) -> bool:
    """Whether a file from ``open_lines``, read to its end, ended the last zstd frame it began
    (always True for an uncompressed one)."""
    raw = getattr(lines, "raw", None)
    return not isinstance(raw, _ZstdRaw) or raw.frame_ended


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A recording's lines as bytes, decompressed when the name ends in ``.zst``."""
    with open(path, "rb") as handle:
        return decompress_file(handle) if is_compressed(path) else handle.read()


__all__ = [
    "COMPRESSIONS",
    "SUFFIX",
    "ZstdLines",
    "ZstdDamage",
    "ZstdFrames",
    "decompress_checked",
    "decompress_file",
    "frames_ended",
    "is_compressed",
    "open_lines",
    "read_bytes",
]
