"""A recording is born locked: a report or index run beside a live proxy never makes its writer
fail, nor reads a file being created as a dead, empty recording. And an end line whose verdict
kind or stream end is none of the format's is a damaged recording in the fleet view, as in
``verify``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from streamtap.recording.catalog import find_recordings, recording_row
from streamtap.recording.fleet import Loaded, read_rows
from streamtap.recording.writer import RecordingBusy, RecordingError, RecordingWriter, final_name

REPO = Path(__file__).resolve().parents[1]
GOOD = REPO / "recordings" / "anthropic.jsonl"  # a bundled recording, judged complete in its end line
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]
RACE_SECONDS = 3.0  # the unlocked window used to be hit many times a second
STARTED = 1_780_000_000.25
END = {"verdict": {"kind": "complete", "reason": "the model finished"}, "stream_end": "finished"}


def write_one(folder: Path, flow_id: str, *, finished_in: Path, compress: str = "none") -> Path:
    writer = RecordingWriter.create(folder, started=STARTED, provider="openai-chat", flow_id=flow_id, compress=compress)
    writer.header({"dialect": "openai-chat", "started": STARTED, "flow_id": flow_id})
    final = finished_in / (final_name(STARTED, "openai-chat", "complete", flow_id) + writer.suffix)
    return writer.finish(END, final)


# The proxy's side, in a process of its own as a live proxy is: recordings made one after the
# other for a while, each finished into another folder; prints how many, and the refusals.
PROXY = """
import json, sys, time
from pathlib import Path
from streamtap.recording.writer import RecordingBusy, RecordingWriter, final_name
live, finished, seconds = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
started, written, refused = 1_780_000_000.25, 0, []
end = {"verdict": {"kind": "complete", "reason": "the model finished"}, "stream_end": "finished"}
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    written += 1
    flow_id, compress = f"{written:012x}", "zstd" if written % 2 else "none"  # both are created alike
    try:
        writer = RecordingWriter.create(
            live, started=started, provider="openai-chat", flow_id=flow_id, compress=compress, fsync="never"
        )
    except RecordingBusy as exc:
        refused.append(str(exc))
        continue
    writer.header({"dialect": "openai-chat", "started": started, "flow_id": flow_id})
    writer.finish(end, finished / (final_name(started, "openai-chat", "complete", flow_id) + writer.suffix))
print(json.dumps({"written": written, "refused": refused}))
"""


def test_a_report_beside_a_live_proxy_neither_fails_its_writer_nor_reads_a_file_being_created(tmp_path):
    """A proxy's create/finish loop against the reads report and index make. Finished recordings
    move to another folder, so every file the reader finds is one a live writer holds: each must
    be left out as being written, never read (an empty file as "incomplete at byte 0", say), and
    the reader's lock probe must never refuse the writer."""
    live, finished = tmp_path / "live", tmp_path / "finished"
    live.mkdir()
    finished.mkdir()
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(live), str(finished), str(RACE_SECONDS)], stdout=subprocess.PIPE, text=True
    )
    rows, unreadable, skipped, busy = [], [], [], 0
    try:
        while proxy.poll() is None:
            loaded = Loaded()
            rows += read_rows(find_recordings([live]), loaded=loaded)
            unreadable += loaded.unreadable
            skipped += loaded.skipped
            busy += len(loaded.busy)
    finally:
        out, _ = proxy.communicate(timeout=60)
    assert proxy.returncode == 0
    made = json.loads(out)
    assert made["refused"] == [], f"{len(made['refused'])} of {made['written']} writers refused, first: {made['refused'][0]}"
    assert [row["problem"] for row in rows] == [], f"{len(rows)} rows read from files being written"
    assert unreadable == [] and skipped == [], (unreadable[:3], skipped[:3])
    assert busy > 0, made["written"]  # the reader met files being written: the race was run
    assert len(list(finished.iterdir())) == made["written"]
    assert list(live.iterdir()) == []  # no file left under a temporary name


@pytest.mark.parametrize("compress", ["none", "zstd"])
def test_a_second_writer_on_the_same_name_fails_loudly_and_leaves_the_first_intact(tmp_path, compress):
    first = RecordingWriter.create(tmp_path, started=STARTED, provider="openai-chat", flow_id="abc123", compress=compress)
    first.header({"dialect": "openai-chat", "started": STARTED})
    first.flush()
    with pytest.raises(RecordingBusy, match="is being written by another writer"):
        RecordingWriter.create(tmp_path, started=STARTED, provider="openai-chat", flow_id="abc123", compress=compress)
    assert sorted(tmp_path.iterdir()) == [first.path]  # the refused one left nothing, not even its temporary name
    first.finish(END)
    row = recording_row(first.path)
    assert (row["verdict"], row["stream_end"], row["events"]) == ("complete", "finished", 0)
    with pytest.raises(RecordingError, match="append-only"):  # its writer is gone, its lines stay
        RecordingWriter(first.path, compress=compress)
    assert sorted(tmp_path.iterdir()) == [first.path]


def test_a_finished_recording_leaves_no_temporary_name_and_an_empty_leftover_is_taken(tmp_path):
    done = write_one(tmp_path, "feed", finished_in=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [done.name]
    leftover = tmp_path / "left.jsonl"  # what a writer that stopped before its first line leaves
    leftover.touch()
    writer = RecordingWriter(leftover)
    writer.header({})
    writer.finish(END)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([done.name, "left.jsonl"])
    (tmp_path / "taken").mkdir()  # a name no file can be opened at: the create fails after its link did not
    with pytest.raises(IsADirectoryError):
        RecordingWriter(tmp_path / "taken")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([done.name, "left.jsonl", "taken"])


def bundled_with_end(folder: Path, name: str, **fields) -> Path:
    lines = GOOD.read_bytes().splitlines(keepends=True)
    end = orjson.loads(lines[-1])
    end.update(fields)
    lines[-1] = orjson.dumps(end) + b"\n"
    path = folder / name
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"verdict": {"kind": "Complete", "reason": "x"}}, "damaged: its verdict's 'kind' is \"Complete\", not one of"),
        ({"stream_end": "finished_ok"}, "damaged: its end line's 'stream_end' is \"finished_ok\", not one of"),
    ],
)
def test_a_verdict_kind_or_stream_end_outside_the_format_is_a_damaged_recording(tmp_path, fields, problem):
    bundled_with_end(tmp_path, "good.jsonl")
    bad = bundled_with_end(tmp_path, "bad.jsonl", **fields)
    verified = subprocess.run([*STREAMTAP, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 2, verified  # the format's reader rejects the line
    out = subprocess.run([*STREAMTAP, "report", "--json", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr  # damaged: not all complete
    report = json.loads(out.stdout)
    assert report["recordings"] == 2 and report["verdicts"] == {"complete": 1}  # no verdict named "Complete"
    assert "finished_ok" not in report["stream_end"]
    [listed] = report["incomplete"]
    assert listed["path"] == str(bad) and listed["problem"].startswith(problem), listed
    named = subprocess.run([*STREAMTAP, "report", str(bad)], capture_output=True, text=True, timeout=60)
    # named, a damaged recording is listed as one found in a folder is: one bad file in a glob costs no report
    assert named.returncode == 1 and "Traceback" not in named.stderr, named.stderr
    assert "damaged" in named.stdout, named.stdout
