"""A compressed answer that decodes to far more than it is on the wire (a decompression bomb)
is decoded only up to a bound, not recorded whole.

30 KB of zstd decoded to 1 GB of zeros and made a 6 GB recording (a zero byte is written as
``\\u0000``): one request could fill the disk the recordings live on. Past ``DECODED_BOUND``
decoded bytes that are also over ``DECODED_RATIO`` times the wire bytes, decoding stops as where a
coding cannot be undone: the recording keeps the rest of the wire undecoded, the verdict is
``unknown`` and says the bound, and ``streamtap verify`` agrees. The tests shrink the bound (it is
64 MiB); an answer as compressible as real ones (3-100x) is untouched by it.
"""

from __future__ import annotations

import gzip
import random
import zlib
from pathlib import Path

import pytest

import provider_streams as ps
from streamtap.commands.verify import judge_file
from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import StreamEnd
from streamtap.recording import read_recording
from streamtap.recording import content
from streamtap.recording.content import WireUndo
from test_tap_batching import flow_for

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd

ZEROS = 32_000_000
BOUND = 1 << 20


@pytest.fixture(autouse=True)
def small_bound(monkeypatch):
    """A bound of 1 MiB, weighed every KiB of wire: the test decodes a megabyte, not 64."""
    monkeypatch.setattr(content, "DECODED_BOUND", BOUND, raising=False)  # (raising=False: it runs, and fails, without a bound too)
    monkeypatch.setattr(content, "BOUND_SLICE", 1024, raising=False)


def _compressed_zeros(encoding: str) -> bytes:
    """32 MB of zeros compressed, without them all in memory."""
    block = b"\0" * (1 << 20)
    if encoding == "zstd":
        compressor = zstd.ZstdCompressor()
        return b"".join(compressor.compress(block) for _ in range(ZEROS // len(block))) + compressor.flush()
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = b"".join(compressor.compress(block) for _ in range(ZEROS // len(block)))
    return out + compressor.flush()


def _tap(tmp_path, encoding: str, reads: list[bytes]) -> dict:
    flow = flow_for("/v1/chat/completions", "text/event-stream")
    flow.response.headers["content-encoding"] = encoding
    tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)
    for read in reads:
        tap.arrived(read, None)
    return tap.finish(StreamEnd.FINISHED)


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_a_decompression_bomb_is_decoded_up_to_the_bound_and_judged_unknown(tmp_path, encoding):
    wire = _compressed_zeros(encoding)
    reads = [wire[at : at + 16384] for at in range(0, len(wire), 16384)]
    summary = _tap(tmp_path, encoding, reads)
    path = summary["recording"]
    # the body stops near the bound (as JSON, its zeros take 6 bytes each: 192 MB unbounded), the wire is kept whole
    assert Path(path).stat().st_size < 7 * 2 * BOUND + 4 * len(wire)
    assert summary["verdict"] == "unknown", summary
    reason = summary["reason"]
    assert f"{encoding} content-encoding was not undone past" in reason and "decompression bomb" in reason, reason
    recording = read_recording(path)
    assert recording.wire == wire and recording.body == b"\0" * len(recording.body)
    # cut at the bound itself: 1 MiB, or 1000x the wire of the first slices of a KiB that decoded past it
    assert f"past {len(recording.body)} decoded bytes" in reason and BOUND <= len(recording.body) <= 2 * BOUND
    judged = judge_file(Path(path), None, None)  # verify decodes the recorded wire with the same bound
    assert judged.analysis.verdict.kind.value == "unknown" and judged.analysis.verdict.reason == reason, judged


def test_where_decoding_stops_does_not_depend_on_the_reads():
    wire = _compressed_zeros("zstd")
    seen = set()
    for size in (1, 7, 1000, 1024, 16384, len(wire)):
        undo = WireUndo("zstd")
        decoded = 0
        for at in range(0, len(wire), size):
            decoded += sum(map(len, undo.pieces(wire[at : at + size])))
        decoded += sum(map(len, undo.finish_pieces()))
        assert undo.failure is not None and decoded == undo.decoded_bytes
        seen.add((decoded, undo.failure))
    assert len(seen) == 1, seen


def test_an_answer_ten_times_smaller_on_the_wire_is_untouched(tmp_path):
    rng = random.Random(3)
    words = [f"w{rng.randrange(50)} " for _ in range(60_000)]  # over the 1 MiB bound, chunks' JSON much alike
    body = ps.openai_chat(words)
    wire = gzip.compress(body, mtime=0)
    assert len(body) > 4 * BOUND and 10 < len(body) / len(wire) < 200  # (real streams: 3-70x)
    summary = _tap(tmp_path, "gzip", [wire[at : at + 4096] for at in range(0, len(wire), 4096)])
    assert summary["verdict"] == "complete" and not summary.get("errors"), summary
    assert read_recording(summary["recording"]).body == body
