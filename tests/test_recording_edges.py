"""Recordings at the edges: a zstd stream cut after its last line, a file name that is not
UTF-8, a complete last line that is not a line of the format."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess

import provider_streams as streams
import pytest
import zstandard
from test_recording import sse_events
from test_report import STREAMTAP, streamtap

from streamtap.recording import RecordingWriter, read_recording
from streamtap.recording.compress import ZstdDamage, decompress_checked, decompress_file

BODY = streams.openai_chat(["The Danube", ", the Rhine", " and the Loire."])


def finished(directory, compress: str = "none"):
    """A complete answer's recording, a zstd block ended after each frame as the proxy does."""
    writer = RecordingWriter.create(directory, started=1_780_000_000.25, provider="openai-chat", flow_id="edge1", compress=compress)
    writer.header({"response": {"status": 200}, "dialect": "openai-chat", "wire": {"format": "sse", "content_encoding": None}})
    events, _ = sse_events(BODY)
    for event in events:
        writer.read(event.raw, event.start / 10)
        writer.frame(event, event.start / 10)
        writer.flush()
    name = "r.jsonl.zst" if compress == "zstd" else "r.jsonl"
    from streamtap.providers import StreamSession

    session = StreamSession("openai-chat")
    session.feed(BODY)
    turn = session.close().turn.to_dict()  # verify holds the end line's turn to the bytes
    return writer.finish({"verdict": {"kind": "complete", "reason": "ok"}, "turn": turn, "stream_end": "finished"}, directory / name)


def verify_json(*paths) -> tuple[int, list[dict], str]:
    result = streamtap("verify", "--json", *map(str, paths))
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_decompress_checked_says_whether_the_last_frame_ended(tmp_path):
    data = finished(tmp_path / "rec", compress="zstd").read_bytes()
    lines = decompress_file(io.BytesIO(data))
    assert decompress_checked(io.BytesIO(data)) == (lines, True)
    assert decompress_checked(io.BytesIO(data[:-2])) == (lines, False)  # its checksum cut: every line decodes
    assert decompress_checked(io.BytesIO(b"")) == (b"", True)
    with pytest.raises(ZstdDamage):
        decompress_checked(io.BytesIO(data + b"not zstd at all"))


def test_a_compressed_recording_cut_after_its_last_line_is_incomplete(tmp_path):
    whole = finished(tmp_path / "rec", compress="zstd")
    data = whole.read_bytes()
    cuts = tmp_path / "cuts"
    cuts.mkdir()
    for size in range(1, len(data)):  # every cut but the empty file (a raw body, judged unknown)
        (cuts / f"cut{size:05d}.jsonl.zst").write_bytes(data[:size])
    code, results, stderr = verify_json(whole, cuts)
    assert code == 1 and not stderr
    assert results[0]["problem"] is None and results[0]["verdict"]["kind"] == "complete"
    for size, result in enumerate(results[1:], start=1):
        assert result["file"].endswith(f"cut{size:05d}.jsonl.zst")
        assert result["problem"].startswith("recording incomplete at byte"), result
    for size in range(len(data) - 24, len(data)):
        with pytest.raises(zstandard.ZstdError):  # a strict decode agrees: the frame never ended
            zstandard.ZstdDecompressor().decompress(data[:size])
    assert "the zstd stream ends inside a frame" in results[-1]["problem"]
    rec = read_recording(cuts / f"cut{len(data) - 1:05d}.jsonl.zst")
    assert not rec.complete_file and rec.end is not None and rec.body == BODY


def test_a_file_name_that_is_not_utf8_is_written_escaped_in_json(tmp_path):
    source = finished(tmp_path / "rec")
    directory = tmp_path / "named"
    directory.mkdir()
    bad = directory / os.fsdecode(b"bad\xff\xfename.jsonl")
    shutil.copy(source, bad)
    shutil.copy(source, directory / "z_good.jsonl")  # judged after the bad name
    code, results, stderr = verify_json(directory)
    assert code == 0 and "Traceback" not in stderr
    assert [r["file"] for r in results] == [f"{directory}/bad\\xff\\xfename.jsonl", f"{directory}/z_good.jsonl"]
    show = streamtap("show", "--json", str(bad))
    assert show.returncode == 0 and "Traceback" not in show.stderr
    assert json.loads(show.stdout)["file"] == f"{directory}/bad\\xff\\xfename.jsonl"
    # a strict UTF-8 stdout (a locale other than C's) takes the plain lines too
    strict = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    plain = subprocess.run([*STREAMTAP, "verify", str(directory)], capture_output=True, text=True, env=strict, timeout=60)
    assert plain.returncode == 0 and plain.stdout.startswith(f"{directory}/bad\\xff\\xfename.jsonl: complete"), plain.stderr


@pytest.mark.parametrize("last", [b"[1,2,3]\n", b'"end"\n', b'{"type": "end", oops}\n'])
def test_a_complete_last_line_that_is_no_json_object_leaves_the_file_unjudged(tmp_path, last):
    source = finished(tmp_path / "rec")
    lines = source.read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(b"".join(lines[:-1]) + last)
    code, results, stderr = verify_json(damaged, source)
    assert code == 2 and [r["file"] for r in results] == [str(source)]
    assert f"line {len(lines)} (byte " in stderr and "is not a JSON object" in stderr and "the file is damaged" in stderr
    assert "the last line is cut" not in stderr


def test_a_last_line_without_its_newline_is_still_cut(tmp_path):
    source = finished(tmp_path / "rec")
    lines = source.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[:-1]) + b"[1,2,3]")
    rec = read_recording(cut)
    assert not rec.complete_file and "the last line is cut" in rec.problem


def _edited(directory, edit) -> list[str]:
    """The problems check_recording finds in a finished recording after ``edit`` of its lines."""
    from streamtap.recording import check_recording

    path = finished(directory)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return check_recording(read_recording(path))


def test_edits_the_checks_missed_are_found(tmp_path):
    """The first frame's seq was never compared (0 expected); a network read's time could go back;
    an empty body's wire hash was not compared with the body's."""
    def first_seq(lines):
        next(line for line in lines if line.get("type") == "frame")["seq"] = 5

    def read_back(lines):
        reads = [line for line in lines if line.get("type") == "reads"]
        reads[-1]["reads"][-1][2] = 0

    assert _edited(tmp_path / "a", lambda lines: None) == []
    assert any("sequence number 5, expected 0" in p for p in _edited(tmp_path / "b", first_seq))
    assert any("arrival time 0 ms is before" in p for p in _edited(tmp_path / "c", read_back))

    empty = RecordingWriter(tmp_path / "empty.jsonl")
    empty.header({"response": {"status": 200}, "dialect": "openai-chat", "wire": {"format": "sse", "content_encoding": None}})
    path = empty.finish({"verdict": {"kind": "truncated", "reason": "no event"}, "stream_end": "finished"})
    from streamtap.recording import check_recording

    assert check_recording(read_recording(path)) == []
    *lines, end = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in lines) + json.dumps({**json.loads(end), "wire_sha256": "f" * 64}) + "\n")
    assert any("wire sha256 differs from the body's" in p for p in check_recording(read_recording(path)))


def test_a_text_with_a_lone_surrogate_is_written_escaped_not_lost(tmp_path):
    """A lone surrogate that is no byte mitmproxy escaped (half an emoji) reached a line: the
    line could not be written, and the recording was lost; it is written as its escape."""
    writer = RecordingWriter.create(tmp_path, started=1_780_000_000.25, provider="openai-chat", flow_id="edge2")
    writer.header({"request": {"method": "POST", "url": "http://x/v1?a=\udcff", "headers": [["x-note", "\ud83d"]]},
                   "response": {"status": 200}})
    writer.note("error", "half an emoji: \ud83d\udcff")
    writer.close()
    lines = [json.loads(line) for line in writer.path.read_bytes().decode("utf-8").splitlines()]
    assert lines[0]["request"]["url"] == "http://x/v1?a=\\xff" and lines[0]["request"]["headers"] == [["x-note", "\\ud83d"]]
    assert lines[1]["message"] == "half an emoji: \\ud83d\\xff"


@pytest.mark.parametrize("compress", ["none", "zstd"])
def test_close_on_a_full_disk_closes_the_file_and_never_raises(tmp_path, compress):
    """Lines still buffered when the disk is full: the file's close fails its flush but closes
    its descriptor; the writer then asked that closed file for its descriptor (ValueError)."""
    writer = RecordingWriter.create(tmp_path, started=1_780_000_000.25, provider="openai-chat", flow_id="edge3", compress=compress)
    writer.header({"response": {"status": 200}, "wire": {"format": "sse", "content_encoding": None}})
    writer.flush()
    fd = writer._file.fileno()
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, fd)  # every later write gets ENOSPC, as on a full disk
    os.close(full)
    writer.note("error", "buffered, not yet written")
    writer.close()
    assert writer.closed
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
