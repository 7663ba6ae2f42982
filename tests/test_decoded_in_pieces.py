"""A content-encoded answer is decoded a bounded piece at a time.

One 16 KiB read of zstd or brotli can hold gigabytes (a gzip read, a thousand times its size).
The Tap took each read's whole decoded output at once and held several copies of it: a 200 MB
answer in one zstd frame peaked at about 1.4 GiB. The decoders now hand their output on in pieces
of about ``PIECE``, and the Tap, ``verify`` and ``import`` take one piece at a time.
"""

from __future__ import annotations

import gzip
import random
import re
import tracemalloc
import zlib

import brotli
import pytest

import provider_streams as ps
from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import StreamEnd
from streamtap.providers.judge import TEXT_CAP
from streamtap.recording import check_recording, read_recording
from streamtap.recording.content import PIECE, WireUndo
from test_tap_batching import flow_for

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd

ENCODE = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
    "gzip, br": lambda data: brotli.compress(gzip.compress(data)),
}


def long_answer(events: int) -> bytes:
    """An Anthropic answer of ``events`` text deltas of 64 KiB each: it compresses to almost nothing."""
    delta = ps._sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": "x" * 65536}})
    head = ps.anthropic_events("", "", {})[:1] + [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    tail = [{"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
            {"type": "message_stop"}]
    return b"".join(ps._sse(e["type"], e) for e in head) + delta * events + b"".join(ps._sse(e["type"], e) for e in tail)


@pytest.mark.parametrize("encoding", ["zstd", "br", "gzip"])
def test_one_read_that_decodes_to_32_mb_is_taken_in_bounded_memory(tmp_path, encoding):
    body = long_answer(500)
    wire = ENCODE[encoding](body)
    reads = [wire] if encoding != "gzip" else [wire[i : i + 16384] for i in range(0, len(wire), 16384)]
    assert max(map(len, reads)) <= 16384 and len(body) > 32_000_000
    flow = flow_for("/v1/messages", "text/event-stream")
    flow.response.headers["content-encoding"] = encoding
    tracemalloc.start()
    try:
        tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)
        for read in reads:
            tap.arrived(read, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # (not measured: the end line, whose JSON writer briefly takes ~15 bytes per character of the
    # TEXT_CAP text it writes, whatever the answer's length)
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "complete" and not summary.get("errors"), summary
    # the turn keeps TEXT_CAP characters; the decoded read is held a piece at a time, not whole
    assert peak < 3 * TEXT_CAP + 12 * PIECE, f"peak {peak / 2**20:.1f} MiB for a {len(body) / 2**20:.0f} MiB answer"
    recording = read_recording(summary["recording"])
    assert recording.body == body and recording.wire == wire and check_recording(recording) == []


@pytest.mark.parametrize("encoding", sorted(ENCODE))
@pytest.mark.parametrize("read_size", [997, 16384, None])
def test_the_pieces_are_the_whole_decoded_body_whatever_the_reads(encoding, read_size):
    rng = random.Random(5)
    body = b"".join(b"data: {\"n\": %d}\n\n" % rng.randrange(10**9) for _ in range(60_000)) + b"\0" * 3_000_000
    if encoding == "gzip":
        body_sent = body + b"data: {}\n\n"
        wire = gzip.compress(body) + gzip.compress(b"") + gzip.compress(b"data: {}\n\n")  # members, one of them empty
    elif encoding == "zstd":
        body_sent = body + b"data: {}\n\n"
        wire = zstd.compress(body) + zstd.compress(b"data: {}\n\n")  # two frames
    else:
        body_sent, wire = body, ENCODE[encoding](body)
    size = read_size or len(wire)
    undo, pieces = WireUndo(encoding), []
    for at in range(0, len(wire), size):
        pieces += undo.pieces(wire[at : at + size])
    pieces += undo.finish_pieces()
    assert undo.failure is None and undo.unfinished() is None
    assert b"".join(pieces) == body_sent
    assert all(pieces) and max(map(len, pieces)) <= 2 * PIECE  # (brotli's buffer stops at a block past the limit)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_coding_that_fails_after_its_first_pieces_says_where(encoding):
    """zstd names the read it failed in (it gives nothing of that read); gzip the damaged byte."""
    body = bytes(random.Random(1).randbytes(1000)) * 4000  # 4 MB that compress well
    wire = ENCODE[encoding](body)
    middle = len(wire) // 2
    wire = wire[:middle] + b"\xff" * 64 + wire[middle + 64 :]  # not a block either coding knows
    undo = WireUndo(encoding)
    first = b"".join(undo.pieces(wire[:100]))
    rest = b"".join(undo.pieces(wire[100:]))
    if encoding == "zstd":
        assert undo.failure is not None and "from wire byte 100 on" in undo.failure, undo.failure
    else:
        at = int(re.search(r"could not be undone at wire byte (\d+) \(", undo.failure or "")[1])
        assert middle <= at < middle + 64, (middle, undo.failure)
    decoded = first + rest
    assert body.startswith(decoded) and len(decoded) < len(body)
    assert b"".join(undo.pieces(b"more")) == b"" and b"".join(undo.finish_pieces()) == b""


def test_import_takes_a_capture_whose_body_decodes_to_64_mb_in_bounded_memory(tmp_path):
    """A capture holds the compressed body whole; import decoded it whole too (and joined it with
    what the decoder still held): it now takes it a piece at a time, as the Tap does."""
    from mitmproxy.test import tflow

    from streamtap.recording.importer import import_flow

    body = long_answer(1000)
    flow = tflow.tflow(resp=True)
    flow.request.host, flow.request.path = "api.anthropic.com", "/v1/messages"
    flow.request.content = b'{"model":"claude-test-4","stream":true,"max_tokens":10,"messages":[]}'
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.headers["content-encoding"] = "zstd"
    flow.response.raw_content = zstd.compress(body)
    (tmp_path / "out").mkdir()
    tracemalloc.start()
    try:
        result = import_flow(flow, tmp_path / "out", tmp_path / "capture.mitm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.verdict == "complete" and result.bytes == len(body), result
    # the end line's JSON writer takes ~15 bytes per character of the TEXT_CAP text it writes
    # (~64 MiB), whatever the answer's length; the 64 MiB body decoded whole took 250 MiB
    assert peak < 24 * TEXT_CAP, f"peak {peak / 2**20:.1f} MiB for a {len(body) / 2**20:.0f} MiB answer"
    recording = read_recording(result.path)
    assert recording.body == body and check_recording(recording) == []


@pytest.mark.parametrize("damage", ["trailer", "block"])
def test_a_damaged_gzip_answer_decodes_alike_for_any_reads(damage):
    """zlib gives nothing of a call it fails in: one read holding a damaged trailer CRC decoded to
    no byte at all, two reads to the whole answer, and each said another wire byte. The call is
    made again a byte at a time: the same bytes and the same damaged byte for any reads."""
    body = ps.openai_chat([f"word {i} " for i in range(20)])
    wire = bytearray(gzip.compress(body, mtime=0))
    if damage == "trailer":
        wire[-6] ^= 0xFF  # the CRC of the decoded bytes
    else:
        wire[len(wire) // 2] ^= 0xFF
    wire = bytes(wire)
    results = set()
    for size in (len(wire), len(wire) - 4, 7, 1):
        undo, pieces = WireUndo("gzip"), []
        for at in range(0, len(wire), size):
            pieces += undo.pieces(wire[at : at + size])
        pieces += undo.finish_pieces()
        results.add((b"".join(pieces), undo.failure))
    assert len(results) == 1, results
    [(decoded, failure)] = results
    assert failure is not None and "could not be undone at wire byte" in failure
    assert (decoded == body) == (damage == "trailer")  # (a flipped byte inside the deflate data decodes to other bytes)
