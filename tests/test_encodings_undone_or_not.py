"""A body whose Content-Encoding cannot be undone, or whose compressed stream stops before its
end marker, is never told as a clean answer.

- The live Tap records all it decoded (the event in progress too), and says where the coding
  failed; ``streamtap verify`` judges such a recording ``unknown``; ``streamtap serve`` refuses it
  at start (it would serve the decoded prefix, or nothing, as a clean answer the client never got).
- A compressed stream cut inside its end marker (a gzip trailer, a zstd checksum) decodes to a
  whole body: the verdict says the coding was cut, and a ``complete`` one becomes ``unknown``.
- ``streamtap import`` records such flows as the Tap does, not skips them.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib

import brotli
import httpx
import pytest
from provider_streams import openai_chat
from upstream import CHAT, Mitmdump, Script, Upstream, find_recording

from streamtap.recording import check_recording, read_recording

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd

BODY = openai_chat([f"word {i} " for i in range(40)])
CUT_AT = BODY.index(b"\n\n", len(BODY) // 2) - 7  # inside an event: the event in progress when the coding fails


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)  # the same bytes every time


def _gzip_parts(parts: list[bytes]) -> list[bytes]:
    """One gzip stream, each part's bytes sync-flushed (servers flush per event); the last ends it."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [compressor.compress(part) + compressor.flush(zlib.Z_SYNC_FLUSH) for part in parts[:-1]]
    return out + [compressor.compress(parts[-1]) + compressor.flush()]


def _damaged_gzip() -> tuple[list[bytes], int]:
    """The reads of a gzip body damaged after ``CUT_AT`` decoded bytes: a block header of 0xff
    (a reserved block type) right after a flush. Also the wire byte where the damaged read starts."""
    first, second, rest = _gzip_parts([BODY[: CUT_AT // 2], BODY[CUT_AT // 2 : CUT_AT], BODY[CUT_AT:]])
    return [first, second, b"\xff" * 16 + rest], len(first) + len(second)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtap.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _verify(path) -> tuple[int, dict]:
    result = _cli("verify", "--json", path)
    return result.returncode, json.loads(result.stdout)


def _serve_refuses(path) -> str:
    """``streamtap serve FILE`` must refuse the file before it listens: exit 2, one line on stderr."""
    process = subprocess.Popen([sys.executable, "-m", "streamtap.cli", "serve", "--port", "0", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.terminate()
        out, err = process.communicate(timeout=10)
        raise AssertionError(f"streamtap serve served {path.name} (it listened at {out.strip()!r}) instead of refusing it")
    assert process.returncode == 2, (process.returncode, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and path.name in lines[0], err
    return lines[0]


def _post(url: str) -> bytes:
    """The answer's bytes as the client got them (not decoded: the client here takes the wire)."""
    with httpx.stream("POST", url, json={"model": "gpt-test-1", "stream": True, "messages": []}, timeout=30) as response:
        return b"".join(response.iter_raw())


LIVE = {  # name: (wire reads, response headers)
    "lying": ([BODY], [("content-encoding", "gzip")]),  # says gzip, sends the plain body
    "damaged": (_damaged_gzip()[0], [("content-encoding", "gzip")]),
    "custom": ([_gz(BODY)], [("content-encoding", "x-custom")]),  # a coding streamtap does not know
    "trailer": ([_gz(BODY)[:-3]], [("content-encoding", "gzip")]),  # 3 bytes of the gzip trailer missing
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Each LIVE answer through a real mitmdump with the Tap: {name: recording path}."""
    work = tmp_path_factory.mktemp("live")
    with Upstream() as upstream:
        for name, (reads, headers) in LIVE.items():
            upstream.add(name, Script(b"".join(reads), chunks=reads, gap=0.3, headers=headers))
        with Mitmdump(upstream.url, work / "mitm") as mitm:
            for name, (reads, _) in LIVE.items():
                assert _post(f"{mitm.url}/s/{name}{CHAT}") == b"".join(reads)  # the client got the wire as sent
            return {name: find_recording(mitm.record_dir, name).path for name in LIVE}


def test_the_tap_records_all_it_decoded_and_where_the_coding_failed(live):
    reads, failed_at = _damaged_gzip()
    rec = read_recording(live["damaged"])
    assert rec.wire == b"".join(reads)
    assert rec.body == BODY[:CUT_AT]  # the event in progress when decoding failed is recorded too
    assert rec.segments[-1].kind == "raw" and rec.segments[-1].raw == BODY[BODY.rindex(b"\n\n", 0, CUT_AT) + 2 : CUT_AT]
    assert rec.verdict["kind"] == "unknown"
    assert rec.verdict["reason"].startswith(f"the gzip content-encoding could not be undone at wire byte {failed_at} (")
    assert check_recording(rec) == []


@pytest.mark.parametrize("name, coding, where", [
    ("lying", "gzip", "at wire byte 1 ("),  # (zlib checks the gzip magic at its second byte)
    ("damaged", "gzip", f"at wire byte {_damaged_gzip()[1]} ("),
    ("custom", "x-custom", "from wire byte 0 on"),
])
def test_verify_judges_a_coding_not_undone_unknown(live, name, coding, where):
    code, judged = _verify(live[name])
    assert judged["verdict"]["kind"] == "unknown", judged["verdict"]
    assert judged["verdict"]["reason"].startswith(f"the {coding} content-encoding could not be undone {where}")
    assert judged["problem"] is None  # the recording's own verdict agrees
    assert code == 1


def test_an_unknown_coding_records_no_encoded_bytes_as_the_body(live):
    rec = read_recording(live["custom"])
    assert rec.body == b"" and rec.wire == _gz(BODY)
    assert rec.verdict["reason"] == "the x-custom content-encoding could not be undone from wire byte 0 on (a coding streamtap does not know)"


@pytest.mark.parametrize("name", ["lying", "damaged", "custom"])
def test_serve_refuses_a_recording_whose_coding_was_not_undone(live, name):
    line = _serve_refuses(live[name])
    assert "content-encoding could not be undone" in line


def test_a_gzip_trailer_cut_short_is_not_complete_live_nor_in_verify(live):
    rec = read_recording(live["trailer"])
    note = f"the gzip stream ended before its end marker at wire byte {len(_gz(BODY)) - 3}"
    assert rec.body == BODY and rec.end["stream_end"] == "finished"  # the decoded body is whole
    assert rec.verdict["kind"] == "unknown" and rec.verdict["reason"].startswith(note)
    assert rec.verdict["evidence"]["unfinished_coding"] == note and note in rec.end["turn"]["notes"]
    code, judged = _verify(live["trailer"])
    assert (judged["verdict"]["kind"], judged["problem"], code) == ("unknown", None, 1)
    assert judged["verdict"]["evidence"]["unfinished_coding"] == note


def _zstd_checked(body: bytes) -> bytes:
    return zstd.compress(body, options={zstd.CompressionParameter.checksum_flag: True})


def _brotli_unfinished(body: bytes) -> bytes:
    compressor = brotli.Compressor()
    return compressor.process(body) + compressor.flush()  # no finish(): the last meta-block never comes


CUT_BEFORE_END = {  # coding: (wire whose decoding is BODY but whose stream never reaches its end marker)
    "gzip": _gz(BODY)[:-3],
    "deflate": zlib.compress(BODY)[:-2],
    "zstd": _zstd_checked(BODY)[:-3],
    "br": _brotli_unfinished(BODY),
    "gzip, br": brotli.compress(_gz(BODY)[:-3]),
}
WHOLE = {"gzip": _gz(BODY), "deflate": zlib.compress(BODY)[2:-4], "zstd": _zstd_checked(BODY),
         "br": brotli.compress(BODY), "gzip, br": brotli.compress(_gz(BODY))}


@pytest.mark.parametrize("size", [1, 2, 7, None])
@pytest.mark.parametrize("encoding", sorted(CUT_BEFORE_END))
def test_the_decoders_tell_a_stream_cut_before_its_end_marker_whatever_the_reads(encoding, size):
    from streamtap.recording.content import WireUndo

    for wire, cut in ((CUT_BEFORE_END[encoding], True), (WHOLE[encoding], False)):
        undo = WireUndo(encoding)
        reads = [wire] if size is None else [wire[i : i + size] for i in range(0, len(wire), size)]
        assert b"".join(piece for read in reads for piece in undo.pieces(read)) + b"".join(undo.finish_pieces()) == BODY
        assert undo.failure is None
        coding = "gzip" if encoding == "gzip, br" else encoding
        expected = f"the {coding} stream ended before its end marker at wire byte {len(wire)}" if cut else None
        assert undo.unfinished() == expected


def _capture(path, flows: dict[str, tuple[bytes, str]]) -> None:
    """A mitmproxy capture (what ``mitmdump -w`` writes) of one streamed answer per name."""
    from mitmproxy import io
    from mitmproxy.test import tflow

    with path.open("wb") as file:
        writer = io.FlowWriter(file)
        for name, (wire, encoding) in flows.items():
            flow = tflow.tflow(resp=True)
            flow.request.host, flow.request.path = "api.openai.com", f"/s/{name}/v1/chat/completions"
            flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
            flow.response.headers["content-type"] = "text/event-stream"
            flow.response.headers["content-encoding"] = encoding
            flow.response.raw_content = wire
            writer.add(flow)


def test_import_records_what_the_tap_records_for_a_coding_not_undone(live, tmp_path):
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    _capture(capture, {"lying": (BODY, "gzip"), "custom": (_gz(BODY), "x-custom")})
    result = _cli("import", capture, "--out", out)
    assert "skipped" not in result.stdout, result.stdout
    for name in ("lying", "custom"):
        [path] = [p for p in out.glob("*_unknown_*.jsonl") if f"/s/{name}/".encode() in p.read_bytes().split(b"\n", 1)[0]]
        imported, tapped = read_recording(path), read_recording(live[name])
        assert (imported.body, imported.wire) == (tapped.body, tapped.wire)
        assert [(s.kind, s.raw) for s in imported.segments] == [(s.kind, s.raw) for s in tapped.segments]
        assert (imported.verdict["kind"], imported.verdict["reason"]) == (tapped.verdict["kind"], tapped.verdict["reason"])
        assert imported.end["streamtap_errors"] == tapped.end["streamtap_errors"]
        assert check_recording(imported) == []
        assert _verify(path)[1]["verdict"]["kind"] == "unknown"
        _serve_refuses(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_coding_not_undone_ends_with_every_field_live_and_imported(live, tmp_path):
    """Readers such as DuckDB take the end lines' fields as one shape: a flow whose coding could not
    be undone has them too, counting the events framed before the failure, the proxy's and the import's alike."""
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    _capture(capture, {name: (b"".join(LIVE[name][0]), "gzip" if name != "custom" else "x-custom")
                       for name in ("lying", "damaged", "custom")})
    assert _cli("import", capture, "--out", out).returncode == 0
    for name in ("lying", "damaged", "custom"):
        [path] = [p for p in out.glob("*_unknown_*.jsonl") if f"/s/{name}/".encode() in p.read_bytes().split(b"\n", 1)[0]]
        imported, tapped = read_recording(path), read_recording(live[name])
        for rec in (imported, tapped):
            assert rec.end["turn"] is None and rec.end["ttft_ms"] is None, (name, rec.end)
            assert rec.verdict["seq"] is None and rec.verdict["offset"] is None, (name, rec.verdict)
            assert rec.end["events"] == len(rec.frames), (name, rec.end)
        assert sorted(imported.end) == sorted(tapped.end) and sorted(imported.verdict) == sorted(tapped.verdict)
        if name != "damaged":  # (a capture keeps one read: the import's decoding fails at its start)
            assert imported.end["events"] == tapped.end["events"]
        [note] = [n for n in tapped.notes if n["kind"] == "streamtap_error"]
        assert isinstance(note["t"], float), note  # the proxy knows when; only an import does not
    assert read_recording(live["damaged"]).end["events"] > 0  # (the events before the damage)


def test_import_says_a_cut_coding_and_keeps_other_verdicts(tmp_path):
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    half = _zstd_checked(BODY)
    _capture(capture, {"trailer": (half[:-3], "zstd"), "middle": (_gz(BODY)[: len(_gz(BODY)) // 2], "gzip")})
    result = _cli("import", capture, "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    by_name = {}
    for path in out.glob("*.jsonl"):
        rec = read_recording(path)
        by_name[rec.header["request"]["url"].split("/s/")[1].split("/")[0]] = rec
    trailer, middle = by_name["trailer"], by_name["middle"]
    assert trailer.body == BODY and trailer.verdict["kind"] == "unknown"
    assert trailer.verdict["evidence"]["unfinished_coding"] == f"the zstd stream ended before its end marker at wire byte {len(half) - 3}"
    assert middle.verdict["kind"] == "truncated"  # kept, with the note
    assert middle.verdict["evidence"]["unfinished_coding"].startswith("the gzip stream ended before its end marker")
    assert middle.verdict["evidence"]["unfinished_coding"] in middle.end["turn"]["notes"]
    for rec in (trailer, middle):
        code, judged = _verify(rec.path)
        assert judged["problem"] is None and judged["verdict"]["kind"] == rec.verdict["kind"] and code == 1
