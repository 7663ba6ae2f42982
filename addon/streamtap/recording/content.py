"""Content-Encoding decoders: incremental ones for a streamed answer (the Tap decodes a copy of
each read as it passes), and a bounded decode of a whole request body.

A request body is decoded only up to ``MAX_DECODED_BODY`` bytes: a prompt is megabytes, and a
small compressed body can expand to gigabytes (a compression bomb). Each algorithm's own
output limit stops it there, so no more than the limit is ever produced.
"""

from __future__ import annotations

import zlib

MAX_DECODED_BODY = 64 * 1024 * 1024
_STEP = 1024 * 1024  # output produced per call while decoding a request body


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._d = zlib.decompressobj(wbits)

    def decompress(self, data: bytes) -> bytes:
        out = self._d.decompress(data)
        while self._d.eof and self._d.unused_data:  # concatenated gzip members
            rest = self._d.unused_data
            self._d = zlib.decompressobj(zlib.MAX_WBITS | 32)
            out += self._d.decompress(rest)
        return out

    def flush(self) -> bytes:
        return self._d.flush()


class _Deflate(_Zlib):
    """HTTP "deflate" is zlib-wrapped by the spec, raw deflate in practice; accept both."""

    def __init__(self) -> None:
        super().__init__(zlib.MAX_WBITS)
        self._head: bytes | None = b""  # held until two bytes tell a zlib header from raw deflate

    def decompress(self, data: bytes) -> bytes:
        if self._head is not None:
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = None
            if (data[0] & 0x0F) != 8 or (data[0] << 8 | data[1]) % 31:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return super().decompress(data)


class _Brotli:
    def __init__(self) -> None:
        import brotli

        self._d = brotli.Decompressor()

    def decompress(self, data: bytes) -> bytes:
        return self._d.process(data)

    def flush(self) -> bytes:
        return b""


class _Zstd:
    def __init__(self) -> None:
        try:
            from compression import zstd  # Python 3.14
        except ImportError:
            from backports import zstd
        self._zstd = zstd
        self._d = zstd.ZstdDecompressor()

    def decompress(self, data: bytes) -> bytes:
        if self._d.eof and data:  # the last frame ended with the read before: this one starts the next
            self._d = self._zstd.ZstdDecompressor()
        out = self._d.decompress(data)
        while self._d.eof and self._d.unused_data:  # several frames in one read
            rest = self._d.unused_data
            self._d = self._zstd.ZstdDecompressor()
            out += self._d.decompress(rest)
        return out

    def flush(self) -> bytes:
        return b""


class _Stacked:
    """Codings applied one after another (``Content-Encoding: gzip, br``): undone last first."""

    def __init__(self, decoders: list) -> None:
        self._decoders = decoders

    def decompress(self, data: bytes) -> bytes:
        for decoder in self._decoders:
            data = decoder.decompress(data) if data else b""
        return data

    def flush(self) -> bytes:
        out = b""
        for decoder in self._decoders:
            out = (decoder.decompress(out) if out else b"") + decoder.flush()
        return out


def _codings(encoding: str | None) -> list[str]:
    """The codings a Content-Encoding value names, in the order applied, less ``identity``
    (which changes nothing): ``" Identity, GZIP"`` gives ``["gzip"]``."""
    named = (coding.strip() for coding in (encoding or "").lower().split(","))
    return [coding for coding in named if coding not in ("", "identity")]


def content_encoded(encoding: str | None) -> bool:
    """Whether a body sent with this Content-Encoding differs from its decoded bytes: the one
    rule the Tap, ``streamtap import`` and the reader share on whether the wire bytes are kept
    apart from the body (``identity`` or an empty value: no)."""
    return bool(_codings(encoding))


def content_decoder(encoding: str | None):
    """An incremental decoder for a Content-Encoding, None for identity; ValueError when unknown."""
    codings = _codings(encoding)
    if len(codings) > 1:
        return _Stacked([_decoder(coding) for coding in reversed(codings)])
    return _decoder(codings[0]) if codings else None


def _decoder(encoding: str):
    encoding = encoding.strip()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return _Deflate()
    if encoding == "br":
        return _Brotli()
    if encoding == "zstd":
        return _Zstd()
    raise ValueError(f"content-encoding {encoding!r} is not supported")


def decoded_body(raw: bytes, encoding: str | None, limit: int = MAX_DECODED_BODY) -> bytes | None:
    """``raw`` decoded from its Content-Encoding; None when the encoding is unknown (or a list),
    the bytes are damaged, or they decode to more than ``limit`` bytes."""
    if not content_encoded(encoding):
        return raw
    encoding = (encoding or "").strip().lower()
    try:
        if encoding in ("gzip", "x-gzip"):
            return _zlib_bounded(raw, zlib.MAX_WBITS | 16, limit)
        if encoding == "deflate":
            zlib_wrapped = len(raw) >= 2 and (raw[0] & 0x0F) == 8 and (raw[0] << 8 | raw[1]) % 31 == 0
            return _zlib_bounded(raw, zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS, limit)
        if encoding == "br":
            return _brotli_bounded(raw, limit)
        if encoding == "zstd":
            return _zstd_bounded(raw, limit)
    except Exception:  # damaged bytes, in each library's own error class
        return None
    return None


def _zlib_bounded(raw: bytes, wbits: int, limit: int) -> bytes | None:
    out = bytearray()
    rest = raw
    while rest:
        d = zlib.decompressobj(wbits)
        data = rest
        while True:
            out += d.decompress(data, _STEP)
            if len(out) > limit:
                return None
            data = d.unconsumed_tail
            if not data:
                break
        if not d.eof:
            return None  # cut short
        rest = d.unused_data if wbits & 16 else b""  # concatenated gzip members
    return bytes(out)


def _brotli_bounded(raw: bytes, limit: int) -> bytes | None:
    import brotli

    d = brotli.Decompressor()
    out = bytearray(d.process(raw, output_buffer_limit=_STEP))
    while len(out) <= limit and not d.is_finished():
        more = d.process(b"", output_buffer_limit=_STEP)
        if not more:
            return None  # cut short: no more output without more input
        out += more
    return bytes(out) if len(out) <= limit else None


def _zstd_bounded(raw: bytes, limit: int) -> bytes | None:
    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        from backports import zstd
    out = bytearray()
    rest = raw
    while rest:  # one frame after another
        d = zstd.ZstdDecompressor()
        out += d.decompress(rest, _STEP)
        while not d.eof and len(out) <= limit:
            if d.needs_input:
                return None  # cut short
            out += d.decompress(b"", _STEP)
        if len(out) > limit:
            return None
        rest = d.unused_data
    return bytes(out)
