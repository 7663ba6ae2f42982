"""Content-Encoding decoders: incremental ones for a streamed answer (the Tap decodes a copy of
each read as it passes), and a bounded decode of a whole request body.

A request body is decoded only up to ``MAX_DECODED_BODY`` bytes: a prompt is megabytes, and a
small compressed body can expand to gigabytes (a compression bomb). Each algorithm's own
output limit stops it there (a layer of stacked codings a little past it), so little more than the
limit is ever produced.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable

MAX_DECODED_BODY = 64 * 1024 * 1024
_STEP = 1024 * 1024  # output produced per call while decoding a request body
# A streamed answer's read (and a compressed recording) is decoded in pieces of about this much:
# one 16 KiB read of zstd or brotli can hold gigabytes, and whoever takes the pieces holds one at a time
PIECE = 1024 * 1024

try:
    from compression import zstd as _zstd  # Python 3.14
except ImportError:
    from backports import zstd as _zstd

ZstdDamage = _zstd.ZstdError  # what damaged zstd data raises while it is decoded


class ContentDecodingError(ValueError):
    """A coding streamtap cannot undo: one it does not know, or bytes that are not in it.
    ``coding`` names the coding (of a stacked list, the one that failed)."""

    def __init__(self, coding: str, why: str, at: int | None = None) -> None:
        super().__init__(f"{coding}: {why}")
        self.coding, self.why = coding, why
        self.at = at  # the input byte found damaged, where the decoder can tell (gzip, deflate)


class _Decoder:
    """An incremental decoder of one coding. ``pieces`` and ``flush`` raise only
    ContentDecodingError; ``unfinished`` names the coding when its compressed stream has not
    reached its end marker (a gzip trailer, a zstd frame end...), so a cut there is seen."""

    coding = "?"

    def pieces(self, data: bytes, limit: int):
        """``data``'s decoded bytes in pieces of about ``limit`` at most, each produced when asked for."""
        try:
            yield from self._pieces(data, limit)
        except ContentDecodingError:
            raise
        except Exception as exc:  # each library's own error class
            raise ContentDecodingError(self.coding, f"{type(exc).__name__}: {exc}") from exc

    def _pieces(self, data: bytes, limit: int):
        out = self._decompress(data, limit)
        while True:
            if out:
                yield out
            out = self._more(limit)
            if not out:
                return

    def flush(self) -> bytes:
        """What the decoder still holds once every piece of every read was taken (little: the
        pieces drained the input)."""
        try:
            return self._flush()
        except Exception as exc:
            raise ContentDecodingError(self.coding, f"{type(exc).__name__}: {exc}") from exc

    def _flush(self) -> bytes:
        return b""

    def unfinished(self) -> str | None:
        return None if not self._fed or self._ended() else self.coding

    _fed = False  # any byte taken yet: no bytes at all hold no stream to end


class _Zlib(_Decoder):
    """gzip (``wbits`` 16+) or zlib. After its stream's end, what follows is another gzip member
    only when it begins with the gzip magic (another zlib stream, for deflate, only when it begins
    with a zlib header): decoded, and counted, since httpx decodes only the first one. Other bytes
    are a tail that httpx and urllib3 both ignore: ignored here too, and counted."""

    def __init__(self, wbits: int, coding: str = "gzip") -> None:
        self._d = zlib.decompressobj(wbits)
        self.coding = coding
        self._taken = 0  # input bytes given so far
        self._member_start = 0  # where the stream being decoded began, in input bytes
        self.later_stream_at: int | None = None  # where a later member that decodes to something began
        self.tail_at: int | None = None  # where an ignored tail began
        self._damaged: ContentDecodingError | None = None  # raised once what came before it was given

    def _decompress(self, data: bytes, limit: int) -> bytes:
        self._fed = self._fed or bool(data)
        self._taken += len(data)
        if self.tail_at is not None:
            return b""
        return self._later(self._inflate(data, limit))  # (after the end: kept as unused_data, taken by _more)

    def _inflate(self, data: bytes, limit: int) -> bytes:
        """``decompress(data, limit)`` of the stream being decoded (``data`` the last of the input
        taken). zlib gives nothing of a call it fails in, so what was decoded before a damaged byte
        would depend on how the bytes came in reads: the call is made again from the state before
        it, a byte at a time, and what those bytes decode to is given before the error, which names
        the damaged byte."""
        saved = self._d.copy()
        try:
            return self._d.decompress(data, limit)
        except zlib.error:
            self._d = saved
        out = []
        for at in range(len(data)):
            try:
                out.append(self._d.decompress(data[at : at + 1]))
            except zlib.error as exc:
                self._damaged = ContentDecodingError(self.coding, f"{type(exc).__name__}: {exc}", self._taken - len(data) + at)
                break
        return b"".join(out)

    def _later(self, out: bytes) -> bytes:
        if out and self._member_start and self.later_stream_at is None:
            self.later_stream_at = self._member_start
        return out

    def _more(self, limit: int) -> bytes:
        while True:
            if self._damaged is not None:
                raise self._damaged
            d = self._d
            if d.eof:  # (zlib leaves unconsumed_tail set at the end; unused_data holds what follows)
                rest = d.unused_data
                if len(rest) < 2 or self.tail_at is not None:
                    return b""  # (two bytes tell a member from a tail; a lone byte at the end is a tail)
                if not self._starts_stream(rest):
                    self.tail_at = self._taken - len(rest)
                    return b""
                self._member_start = self._taken - len(rest)
                self._d = zlib.decompressobj(self._d_wbits)
                out = self._inflate(rest, limit)
            elif d.unconsumed_tail:
                out = self._inflate(d.unconsumed_tail, limit)
            else:
                return b""
            if out:
                return self._later(out)

    _d_wbits = zlib.MAX_WBITS | 16

    def _starts_stream(self, rest: bytes) -> bool:
        return rest[:2] == b"\x1f\x8b"

    def ignored_tail(self) -> tuple[int, int] | None:
        """Where the bytes after the stream's end that were ignored begin, and how many they are."""
        if self.tail_at is not None:
            return self.tail_at, self._taken - self.tail_at
        rest = self._d.unused_data if self._d.eof else b""
        return (self._taken - len(rest), len(rest)) if rest else None  # a lone byte never told

    def _flush(self) -> bytes:
        return self._later(self._d.flush()) if self.tail_at is None else b""

    def _ended(self) -> bool:
        return self._d.eof


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and (data[0] & 0x0F) == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _Deflate(_Zlib):
    """HTTP "deflate" is zlib-wrapped by the spec, raw deflate in practice; accept both."""

    _d_wbits = zlib.MAX_WBITS

    def __init__(self) -> None:
        super().__init__(zlib.MAX_WBITS, "deflate")
        self._head: bytes | None = b""  # held until two bytes tell a zlib header from raw deflate

    def _decompress(self, data: bytes, limit: int) -> bytes:
        if self._head is not None:
            self._fed = self._fed or bool(data)
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = None
            if not _zlib_header(data):
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return super()._decompress(data, limit)

    def _starts_stream(self, rest: bytes) -> bool:
        return _zlib_header(rest)

    def _ended(self) -> bool:
        return self._head is None and self._d.eof


class _Brotli(_Decoder):
    coding = "br"

    def __init__(self) -> None:
        import brotli

        self._d = brotli.Decompressor()

    def _decompress(self, data: bytes, limit: int) -> bytes:
        self._fed = self._fed or bool(data)
        return self._d.process(data, output_buffer_limit=limit)

    def _more(self, limit: int) -> bytes:
        # (not can_accept_more_data(): it can say True while the decoder has more to write)
        return self._d.process(b"", output_buffer_limit=limit)

    def _ended(self) -> bool:
        return self._d.is_finished()


class ZstdFrames:
    """A zstd stream given in pieces, decoded frame after frame, in pieces of at most ``limit``
    bytes (a few bytes of zstd can decode to gigabytes): a Content-Encoding, and a compressed
    recording. ``frame_ended`` says whether the last frame begun was ended (its checksum read):
    a writer killed inside its last frame leaves one that never is, even when all of it decodes."""

    def __init__(self) -> None:
        self._stream = _zstd.ZstdDecompressor()
        self.frame_ended = True  # no frame begun yet: no bytes cut none

    def pieces(self, data: bytes, limit: int = PIECE):
        """``data`` decoded, each piece made when asked for; raises ``ZstdDamage`` on damaged data."""
        while True:
            if data:
                self.frame_ended = False
            out = self._stream.decompress(data, limit)
            data = b""
            if out:
                yield out
            if self._stream.eof:
                self.frame_ended = True
                data = self._stream.unused_data  # the next frame
                self._stream = _zstd.ZstdDecompressor()
                if not data:
                    return
            elif self._stream.needs_input:
                return


class _Zstd(_Decoder):
    coding = "zstd"

    def __init__(self) -> None:
        self._frames = ZstdFrames()

    def _pieces(self, data: bytes, limit: int):
        self._fed = self._fed or bool(data)
        return self._frames.pieces(data, limit)

    def _ended(self) -> bool:
        return self._frames.frame_ended


class _Stacked:
    """Codings applied one after another (``Content-Encoding: gzip, br``): undone last first."""

    def __init__(self, decoders: list) -> None:
        self._decoders = decoders

    def pieces(self, data: bytes, limit: int, first: int = 0):
        """Each piece a coding gives goes through the codings after it before the next is asked for."""
        if first == len(self._decoders):
            yield data
            return
        for piece in self._decoders[first].pieces(data, limit):
            yield from self.pieces(piece, limit, first + 1)

    def flush_pieces(self, limit: int, first: int = 0):
        for i in range(first, len(self._decoders)):
            held = self._decoders[i].flush()
            if held:
                yield from self.pieces(held, limit, i + 1)

    def unfinished(self) -> str | None:
        """The first coding undone whose stream has not reached its end marker: the outermost cut."""
        return next(filter(None, (decoder.unfinished() for decoder in self._decoders)), None)


UNDO_FAILED_RAW = "decoded before the content-encoding could not be undone: no frame covers them"  # a raw line's why

# A body decoded past both bounds is taken for a decompression bomb (30 KB of zstd held 1 GB of zeros,
# a 6 GB recording of JSON escapes): decoding stops there as where a coding cannot be undone, and the
# wire bytes are still recorded. No real answer comes near: LLM streams compress about 3-10x (the
# fixtures at most ~70x), and an answer under 64 MiB is never stopped however well it compresses.
DECODED_BOUND = 64 * 1024 * 1024
DECODED_RATIO = 1000
# the wire is decoded in slices cut at multiples of this, and a slice's decoded bytes are weighed
# against the wire up to the slice's end: where decoding stops is then the same for any reads
BOUND_SLICE = 64 * 1024


class WireUndo:
    """A content-encoded body's wire bytes undone read by read, as the Tap, ``streamtap import``,
    ``verify`` and ``serve`` all take them, so that they agree on what a recording's coding
    allowed: ``failure`` says where it could not be undone (then nothing more is decoded),
    ``unfinished()`` whether its compressed stream stopped before its end marker."""

    def __init__(self, encoding: str | None) -> None:
        self.wire_bytes = 0  # taken so far
        self.decoded_bytes = 0  # given so far
        self.failure: str | None = None
        self.encoding = encoding
        self._decoder = None
        try:
            self._decoder = content_decoder(encoding)
        except ContentDecodingError as exc:
            self.failure = _undo_failed(exc, 0)

    def pieces(self, data: bytes):
        """``data``'s decoded bytes in pieces of at most about ``PIECE``, none once the coding
        could not be undone. A read that fails gives the pieces before its failure, so that the
        Tap, ``import`` and ``verify`` decode the same reads to the same bytes."""
        start = self.wire_bytes
        self.wire_bytes += len(data)
        return self._decoded(self._slices(data, start), start)

    def _slices(self, data: bytes, start: int):
        """``data`` cut where the wire crosses a multiple of ``BOUND_SLICE``: each part's decoding
        step with the wire offset its slice ends at."""
        at = 0
        while at < len(data):
            slice_end = ((start + at) // BOUND_SLICE + 1) * BOUND_SLICE
            part = data[at : slice_end - start]
            yield slice_end, lambda decoder, part=part: decoder.pieces(part, PIECE)
            at += len(part)

    def finish_pieces(self):
        """What the decoder still holds at the end of the wire bytes."""
        def held(decoder):
            if isinstance(decoder, _Stacked):
                return decoder.flush_pieces(PIECE)
            return iter((decoder.flush(),))
        slice_end = max(1, -(-self.wire_bytes // BOUND_SLICE)) * BOUND_SLICE  # the last byte's slice
        return self._decoded([(slice_end, held)], self.wire_bytes)

    def _decoded(self, steps, start: int):
        if self.failure is not None or self._decoder is None:
            return
        try:
            for slice_end, step in steps:
                allowed = max(DECODED_BOUND, DECODED_RATIO * slice_end)
                for piece in step(self._decoder):
                    if not piece:
                        continue
                    if self.decoded_bytes + len(piece) > allowed:
                        # cut at the bound itself, not where a piece happens to end
                        yield from self._bomb(piece[: allowed - self.decoded_bytes], allowed, slice_end)
                        return
                    self.decoded_bytes += len(piece)
                    yield piece
        except ContentDecodingError as exc:
            # a single coding's damaged byte is a wire byte; a stacked one's is a byte decoded by the others
            wire_at = exc.at if exc.at is not None and not isinstance(self._decoder, _Stacked) else None
            self.failure = _undo_failed(exc, start if wire_at is None else wire_at, exact=wire_at is not None)

    def _bomb(self, last: bytes, allowed: int, slice_end: int):
        self.decoded_bytes += len(last)
        self.failure = (f"the {self.encoding} content-encoding was not undone past {allowed} decoded bytes, "
                        f"made from at most {slice_end} wire bytes: a decompression bomb? (streamtap stops "
                        f"decoding past {DECODED_BOUND} bytes and {DECODED_RATIO}x the wire bytes; "
                        f"the rest of the wire is kept undecoded)")
        self._decoder = None  # its window and buffers are not needed any more
        if last:
            yield last

    def unfinished(self) -> str | None:
        """Said of a body whose compressed stream stopped before its end marker (a cut inside a
        gzip trailer or a zstd frame): its decoded bytes may be whole, its coding is not."""
        coding = self._decoder.unfinished() if self._decoder is not None and self.failure is None else None
        if coding is None:
            return None
        return f"the {coding} stream ended before its end marker at wire byte {self.wire_bytes}"

    def later_stream(self) -> tuple[str, str] | None:
        """Said of a body holding a second gzip member (or deflate stream) that decodes to something,
        and why a client may not have read it; None when there is none."""
        for layer, decoder in self._zlib_layers():
            if decoder.later_stream_at is not None:
                where = self._where(layer, decoder.later_stream_at)
                if isinstance(decoder, _Deflate):
                    return (f"the deflate body holds more than one deflate stream: a second one begins at {where}",
                            "but httpx and urllib3 (boto3) decode only the first deflate stream and drop the rest")
                return (f"the {decoder.coding} body holds more than one gzip member: a second one begins at {where}",
                        "but httpx-based clients (the openai and anthropic SDKs) decode only the first gzip member "
                        "and drop the rest (urllib3, as boto3 uses it, decodes them all)")
        return None

    def ignored_tail(self) -> str | None:
        """Said of bytes after the end of a gzip or deflate stream that start no other one: httpx
        and urllib3 ignore them, and so does this decoding."""
        for layer, decoder in self._zlib_layers():
            tail = decoder.ignored_tail()
            if tail is not None:
                at, count = tail
                return (f"{count} byte{'s' if count != 1 else ''} after the end of the {decoder.coding} stream, "
                        f"from {self._where(layer, at)} on, were ignored, as httpx and urllib3 ignore them")
        return None

    def _zlib_layers(self):
        """Each gzip or deflate layer with its place among the codings undone (0: the one on the wire)."""
        if self._decoder is None or self.failure is not None:
            return []
        decoders = self._decoder._decoders if isinstance(self._decoder, _Stacked) else [self._decoder]
        return [(layer, decoder) for layer, decoder in enumerate(decoders) if isinstance(decoder, _Zlib)]

    def _where(self, layer: int, at: int) -> str:
        if layer == 0:
            return f"wire byte {at}"
        return f"byte {at} of the {self._decoder._decoders[layer - 1].coding}-decoded bytes"


def _undo_failed(exc: ContentDecodingError, at: int, exact: bool = False) -> str:
    """Said from the damaged byte where the decoder names it (gzip and deflate, for any reads), else
    from the start of the read whose decoding failed: brotli and zstd give nothing of a read they
    fail in, and the Tap, ``import`` and ``verify`` then agree on the byte for the same reads."""
    if exact:
        return f"the {exc.coding} content-encoding could not be undone at wire byte {at} ({exc.why})"
    return f"the {exc.coding} content-encoding could not be undone from wire byte {at} on ({exc.why})"


class WireBodyCheck:
    """Whether a content-encoded recording's body is its wire bytes decoded, fed as its lines go
    by (in bounded memory): ``wire`` with each network read, ``body`` with each frame's bytes."""

    def __init__(self, encoding: str | None) -> None:
        self.encoding = encoding
        self.undo = WireUndo(encoding)
        self._decoded, self._body = hashlib.sha256(), hashlib.sha256()
        self._decoded_bytes = self._body_bytes = 0

    def wire(self, data: bytes) -> None:
        for piece in self.undo.pieces(data):
            self._took_decoded(piece)

    def body(self, data: bytes) -> None:
        self._body.update(data)
        self._body_bytes += len(data)

    def _took_decoded(self, data: bytes) -> None:
        self._decoded.update(data)
        self._decoded_bytes += len(data)

    def problem(self) -> str | None:
        """Once every line is fed: where the coding could not be undone, or how its decoding
        differs from the body; None when the body is the wire decoded."""
        for piece in self.undo.finish_pieces():
            self._took_decoded(piece)
        if self.undo.failure:
            return self.undo.failure
        if self._decoded.digest() == self._body.digest():
            return None
        decoded = self._decoded_bytes
        what = f"{decoded} bytes" if decoded != self._body_bytes else f"{decoded} other bytes"
        return (f"the body is not its wire bytes undone from their {self.encoding} content-encoding: "
                f"they decode to {what}, the body holds {self._body_bytes}")


def judge_unfinished_coding(verdict, turn, note: str, end=None):
    """``verdict`` for a body whose compressed stream stopped before its end marker (``note``):
    a ``complete`` one becomes ``unknown`` (a client that checks the end, as httpx does for zstd,
    failed on it); any other kind keeps its word. The turn notes it, the evidence says it. Where the
    stream ``end`` is the client leaving, every kind keeps its word: a client that closes the
    response once it has read the answer (the openai SDK at ``[DONE]``) never waits for the end
    marker, so whether it came is a matter of read timing, not of the answer."""
    from streamtap.providers import StreamEnd

    if end == StreamEnd.CLIENT_ABORTED:
        return _noted(verdict, turn, note, "unfinished_coding")
    return _doubted(verdict, turn, note, "unfinished_coding", "which the cut coding cannot vouch for")


def judge_coding_streams(verdict, turn, undo: WireUndo):
    """``verdict`` for a body whose decoding found a second gzip member or deflate stream: all of it
    is decoded, yet a common client reads only the first, so a ``complete``, ``stopped_by_limit`` or
    ``filtered`` one becomes ``unknown`` (the app may have got a cut answer without an error); any
    other kind keeps its word, noted. Bytes after a stream's end that start none are only noted."""
    from streamtap.providers import VerdictKind

    tail = undo.ignored_tail()
    if tail is not None:
        verdict = _noted(verdict, turn, tail, "ignored_coding_tail")
    later = undo.later_stream()
    if later is None:
        return verdict
    note, why = later
    return _doubted(verdict, turn, note, "later_coding_stream", why,
                    (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED))


def judge_unaccepted_coding(verdict, turn, encoding: str | None, accept_encoding: str | None):
    """``verdict`` for a body in ``encoding`` whose request sent ``accept_encoding``: where that did not
    accept the coding (``unaccepted_coding``), a ``complete`` one becomes ``unknown``, since a client that
    decodes only what it asked for (botocore reads event streams undecoded) got bytes it cannot read,
    while one that decodes any coding (httpx) got the answer; any other kind keeps its word, noted."""
    note = unaccepted_coding(encoding, accept_encoding)
    if note is not None:
        return _doubted(verdict, turn, note, "unaccepted_coding", "but only a client that decodes a coding it did "
                        "not ask for can read it")
    if "x-gzip" in _codings(encoding):
        # accepted as gzip's alias, yet httpx knows no x-gzip decoder and hands the app the gzip bytes
        note = ("the response is x-gzip-encoded, which httpx-based clients (the openai and anthropic SDKs) do not "
                "decode: they hand the app the compressed bytes")
        return _doubted(verdict, turn, note, "undecoded_coding", "but only a client that decodes x-gzip "
                        "(urllib3, as boto3 uses it) can read it")
    return verdict


def judge_undelivered(verdict, turn, undelivered: int):
    """``verdict`` for an answer whose last ``undelivered`` bytes the client never got (mitmproxy
    dropped what it held for a slow HTTP/2 reader), read from a recording that holds them: a
    ``complete``, ``stopped_by_limit`` or ``filtered`` one becomes ``unknown`` (the end that made it
    so may be among the lost bytes); any other kind keeps its word, noted, with ``undelivered_bytes``."""
    note = (f"the client did not get the last {undelivered} bytes: mitmproxy held them for a client that read "
            "slowly and dropped them when the upstream reset the stream; the recording holds every byte the upstream sent")
    verdict.evidence = {**verdict.evidence, "undelivered_bytes": undelivered}
    return _maybe_not_delivered(verdict, turn, note)


def judge_held_for_a_slow_reader(verdict, turn):
    """``verdict`` for an answer a capture holds whole, whose HTTP/2 client may not have got its
    last bytes: mitmproxy drops what it holds for a client that reads slowly when the upstream
    resets the stream, and a capture does not say how much that was (the Tap counts it live,
    ``judge_undelivered``). A ``complete``, ``stopped_by_limit`` or ``filtered`` one becomes ``unknown``."""
    note = ("the upstream reset the stream, and mitmproxy drops what it still holds for an HTTP/2 client when it "
            "does: the capture does not say whether the client got the last bytes (the live tap counts them)")
    return _maybe_not_delivered(verdict, turn, note)


def _maybe_not_delivered(verdict, turn, note: str):
    """``verdict`` noted, and ``unknown`` where it read the answer as whole (the end that made it so
    may be among the bytes the client never got)."""
    from streamtap.providers import VerdictKind

    _note_once(turn, note)
    return _unknown_instead(verdict, (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT, VerdictKind.FILTERED),
                            lambda kind: f"{note}: the recording reads as {kind} ({verdict.reason})", "recording_read_as")


def _note_once(turn, note: str) -> None:
    if note not in turn.notes:
        turn.notes.append(note)


def _noted(verdict, turn, note: str, key: str):
    _note_once(turn, note)
    verdict.evidence = {**verdict.evidence, key: note}
    return verdict


def _doubted(verdict, turn, note: str, key: str, why: str, kinds=None):
    """``verdict`` noted, and made ``unknown`` when of one of ``kinds`` (only ``complete`` by default)."""
    from streamtap.providers import VerdictKind

    verdict = _noted(verdict, turn, note, key)
    return _unknown_instead(verdict, kinds or (VerdictKind.COMPLETE,),
                            lambda kind: f"{note}: the decoded body reads as {kind}, {why}", "decoded_body_read_as")


def _unknown_instead(verdict, kinds, reason: Callable[[str], str], read_as: str):
    """``verdict`` as it is unless of one of ``kinds``: then ``unknown``, with ``reason(its kind)``
    and that kind in the evidence under ``read_as``."""
    from streamtap.providers import Verdict, VerdictKind

    if verdict.kind not in kinds:
        return verdict
    kind = verdict.kind.value
    return Verdict(VerdictKind.UNKNOWN, reason(kind), verdict.seq, verdict.offset, {**verdict.evidence, read_as: kind})


def delimited_by_length(content_length: str | None, transfer_encoding: str | None) -> bool:
    """Whether an HTTP/1 response body is delimited by its Content-Length: one is given and the
    body is not chunked (which overrides it, RFC 9112 §6.3)."""
    return content_length is not None and "chunked" not in (transfer_encoding or "").lower()


_CODING_ALIASES = {"x-gzip": "gzip", "x-compress": "compress"}


def unaccepted_coding(encoding: str | None, accept_encoding: str | None) -> str | None:
    """What to say of a response whose Content-Encoding names a coding that its request's
    Accept-Encoding did not accept (RFC 9110 §12.5.3: listed with q=0, or neither listed nor
    covered by ``*``; an empty value accepts none), or None. A request without Accept-Encoding
    accepts any coding. A q-value that does not parse is taken as accepting: only a clear refusal
    is reported."""
    codings = _codings(encoding)
    if accept_encoding is None or not codings:
        return None
    weights: dict[str, bool] = {}
    for item in accept_encoding.lower().split(","):
        name, *params = (part.strip() for part in item.split(";"))
        if name:
            weights[_CODING_ALIASES.get(name, name)] = not any(_is_zero_q(param) for param in params)
    refused = [coding for coding in codings if not weights.get(_CODING_ALIASES.get(coding, coding), weights.get("*", False))]
    if not refused:
        return None
    return (f"the response is {'+'.join(codings)}-encoded, and its request's Accept-Encoding "
            f"({accept_encoding.strip() or 'empty'}) does not accept {', '.join(refused)}")


def _is_zero_q(param: str) -> bool:
    key, _, value = param.partition("=")
    if key.strip() != "q":
        return False
    try:
        return float(value.strip()) == 0
    except ValueError:
        return False


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
    """An incremental decoder for a Content-Encoding, None for identity; ContentDecodingError
    (a ValueError) when it names a coding streamtap does not know."""
    codings = _codings(encoding)
    if len(codings) > 1:
        return _Stacked([_decoder(coding) for coding in reversed(codings)])
    return _decoder(codings[0]) if codings else None


def _decoder(encoding: str):
    encoding = encoding.strip()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(zlib.MAX_WBITS | 16, encoding)
    if encoding == "deflate":
        return _Deflate()
    if encoding == "br":
        return _Brotli()
    if encoding == "zstd":
        return _Zstd()
    raise ContentDecodingError(encoding, "a coding streamtap does not know")


# The most codings a request body's Content-Encoding may stack for streamtap to undo them: each one
# undone costs a pass over up to ``limit`` bytes, and no client stacks more than two
MAX_STACKED_CODINGS = 4


def decoded_body(raw: bytes, encoding: str | None, limit: int = MAX_DECODED_BODY) -> bytes | None:
    """``raw`` decoded from its Content-Encoding (stacked codings such as ``gzip, br`` undone last
    first); None when a coding is unknown, the bytes are damaged, they decode to more than ``limit``
    bytes, or more than ``MAX_STACKED_CODINGS`` codings are stacked."""
    codings = _codings(encoding)
    if len(codings) > MAX_STACKED_CODINGS:
        return None
    # A layer between two codings (the gzip of "gzip, br") is the body compressed: a little larger
    # than the body when that does not compress, so only the body itself is held to ``limit``, the
    # layers before it to a little more. Memory stays bounded: one layer decodes into the next, so
    # at most two are held, each within ``layer_limit``.
    layer_limit = limit + limit // 64 + 1024
    for undone, coding in enumerate(reversed(codings), start=1):  # listed in the order they were applied
        undo = _BOUNDED_DECODERS.get(coding)
        if undo is None:
            return None
        try:
            raw = undo(raw, limit if undone == len(codings) else layer_limit)
        except Exception:  # damaged bytes, in each library's own error class
            return None
        if raw is None:
            return None
    return raw


def _gzip_bounded(raw: bytes, limit: int) -> bytes | None:
    return _zlib_bounded(raw, zlib.MAX_WBITS | 16, limit)


def _deflate_bounded(raw: bytes, limit: int) -> bytes | None:
    zlib_wrapped = len(raw) >= 2 and (raw[0] & 0x0F) == 8 and (raw[0] << 8 | raw[1]) % 31 == 0
    return _zlib_bounded(raw, zlib.MAX_WBITS if zlib_wrapped else -zlib.MAX_WBITS, limit)


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
    out = bytearray()
    rest = raw
    while rest:  # one frame after another
        d = _zstd.ZstdDecompressor()
        out += d.decompress(rest, _STEP)
        while not d.eof and len(out) <= limit:
            if d.needs_input:
                return None  # cut short
            out += d.decompress(b"", _STEP)
        if len(out) > limit:
            return None
        rest = d.unused_data
    return bytes(out)


_BOUNDED_DECODERS = {
    "gzip": _gzip_bounded,
    "x-gzip": _gzip_bounded,
    "deflate": _deflate_bounded,
    "br": _brotli_bounded,
    "zstd": _zstd_bounded,
}
