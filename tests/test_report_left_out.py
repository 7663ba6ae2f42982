"""What `report` and `index` leave out is said where their readers look: the `--json` object and
the HTML page are read without the stderr (a CI artifact, a mail), so they name what could not be
read or is still being written. Names and recorded text on stderr are escaped, a folder holding
only recordings being written is no usage error for either verb, and an `--out` DuckDB cannot
write is refused up front. Real processes: the console script over real files."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path

from test_fleet_edges import STREAMTAP, recording, streamtap, unprivileged

PARTIAL = "20261130T044352.188Z_anthropic_36f20a9a1536.partial.jsonl"  # as a live proxy names the file it writes
LOCKED = "20261130T050000.000Z_anthropic_complete_aaaaaaaaaaaa.jsonl"  # a recording by its name


def held(path: Path) -> int:
    """Hold ``path`` as a live proxy's writer holds its file (until the fd is closed)."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_json_text_and_page_name_the_recordings_and_folders_that_could_not_be_read(tmp_path):
    """README: such a run exits 1 "since its recordings are unknown"; the page said "Every judged
    turn is complete" and the JSON nothing, as if the readable ones were all."""
    folder = tmp_path / "rec"
    folder.mkdir()
    recording(folder, "good.jsonl")
    locked = recording(folder, LOCKED)
    hidden = folder / "hidden"
    hidden.mkdir()
    recording(hidden, "unseen.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    page = tmp_path / "report.html"
    locked.chmod(0)
    hidden.chmod(0)
    try:
        as_json = subprocess.run(unprivileged("report", "--json", folder), capture_output=True, text=True, timeout=60)
        table = subprocess.run(unprivileged("report", "--html", page, folder), capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o644)
        hidden.chmod(0o700)
    assert as_json.returncode == table.returncode == 1, (as_json.stderr, table.stderr)
    report = json.loads(as_json.stdout)
    assert report["recordings"] == 1 and report["verdicts"] == {"complete": 1}  # the keys there were are as they were
    unreadable = report["left_out"]["unreadable"]
    assert unreadable["count"] == 2, report["left_out"]
    assert sorted(unreadable["items"]) == [f"{locked}: cannot read this recording: Permission denied",
                                           f"{hidden}: cannot read this folder: Permission denied"]
    assert report["left_out"]["busy"] == report["left_out"]["skipped"] == {"count": 0, "items": []}
    first_line = table.stdout.splitlines()[0]
    assert "left out: 2 recording(s) or folder(s) that could not be read" in first_line, table.stdout
    html = page.read_text()
    assert "<p>Every judged turn is complete.</p>" not in html
    assert "Every judged turn is complete, but not every recording was judged" in html
    assert "Left out: 2 recording(s) or folder(s) that could not be read" in html
    assert f"{locked}: cannot read this recording" in html and f"{hidden}: cannot read this folder" in html


def test_a_page_over_recordings_that_all_could_not_be_read_says_so(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    locked = recording(folder, LOCKED)
    page = tmp_path / "report.html"
    locked.chmod(0)
    try:
        got = subprocess.run(unprivileged("report", "--html", page, folder), capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o644)
    assert got.returncode == 1, got.stderr
    html = page.read_text()
    assert "<h1>streamtap report: 0 recordings</h1>" in html
    assert "Left out: 1 recording(s) or folder(s) that could not be read" in html and str(locked) in html


def test_recordings_still_being_written_are_counted_as_left_out_and_never_called_complete(tmp_path):
    recording(tmp_path, "done.jsonl")
    partial = recording(tmp_path, PARTIAL)
    page = tmp_path / "report.html"
    writer = held(partial)
    try:
        as_json = streamtap("report", "--json", tmp_path)
        on_page = streamtap("report", "--html", page, tmp_path)
    finally:
        os.close(writer)
    assert as_json.returncode == on_page.returncode == 0, as_json.stderr  # left out: no exit code changes
    left_out = json.loads(as_json.stdout)["left_out"]
    assert left_out["busy"] == {"count": 1, "items": [str(partial)]}, left_out
    assert "left out: 1 recording(s) a live proxy is still writing" in on_page.stdout.splitlines()[0]
    html = page.read_text()
    assert "<p>Every judged turn is complete.</p>" not in html and str(partial) in html
    assert "Still being written by a live proxy (1)" in html


def test_files_that_are_not_recordings_are_counted_in_the_json(tmp_path):
    recording(tmp_path, "good.jsonl")
    (tmp_path / "notes.jsonl").write_text('{"note": 1}\n')
    got = streamtap("report", "--json", tmp_path)
    assert got.returncode == 0, got.stderr
    skipped = json.loads(got.stdout)["left_out"]["skipped"]
    assert skipped["count"] == 1 and skipped["items"][0].startswith(f"{tmp_path / 'notes.jsonl'}: "), skipped


def only_being_written(tmp_path: Path) -> tuple[Path, Path]:
    """A folder holding one recording a live proxy writes, and that file."""
    live = tmp_path / "live"
    live.mkdir()
    return live, recording(live, PARTIAL)


def test_only_recordings_being_written_is_no_usage_error_for_report(tmp_path):
    """A proxy's first minutes: report said "no recordings under" (exit 2), where index said 0 added."""
    live, partial = only_being_written(tmp_path)
    writer = held(partial)
    try:
        reported = streamtap("report", "--json", live)
    finally:
        os.close(writer)
    assert reported.returncode == 0, reported.stderr  # as index: nothing is wrong with the command
    report = json.loads(reported.stdout)
    assert report["recordings"] == 0 and report["left_out"]["busy"]["count"] == 1


def test_an_index_run_over_only_recordings_being_written_leaves_an_index_report_reads(tmp_path):
    """It exited 0 but left no folder, so the `report idx/` after it was a usage error."""
    live, partial = only_being_written(tmp_path)
    out = tmp_path / "idx"
    writer = held(partial)
    try:
        indexed = streamtap("index", live, "--out", out)
    finally:
        os.close(writer)
    assert indexed.returncode == 0 and "0 new recording(s) indexed" in indexed.stderr, indexed.stderr
    assert out.is_dir() and not list(out.rglob("*.parquet")) and (out / ".streamtap-index").is_file()
    empty = streamtap("report", "--json", out)
    assert empty.returncode == 0 and json.loads(empty.stdout)["recordings"] == 0, empty.stderr
    both = streamtap("report", "--json", out, live)  # the writer is gone now: a recording without its end line
    assert both.returncode == 1 and json.loads(both.stdout)["incomplete_files"] == 1, both.stderr
    later = streamtap("index", live, "--out", out)  # the empty index takes rows as any does
    assert later.returncode == 0 and "1 new recording(s) indexed, 0 already in" in later.stderr, later.stderr
    assert json.loads(streamtap("report", "--json", out).stdout)["recordings"] == 1
    assert not (out / ".streamtap-index").exists()  # its layout says what it is now


def test_a_mistyped_folder_is_still_a_usage_error_and_leaves_no_index(tmp_path):
    (tmp_path / "empty").mkdir()
    got = streamtap("report", tmp_path / "empty")
    assert got.returncode == 2 and "no recordings under" in got.stderr, got.stderr
    got = streamtap("index", tmp_path / "empty", "--out", tmp_path / "idx")
    assert got.returncode == 2 and not (tmp_path / "idx").exists(), got.stderr


ESCAPES = "\x1b[2J\x1b]0;PWNED\x07"  # clears the screen, sets the window title, rings the bell


def no_raw_escapes(got: subprocess.CompletedProcess) -> None:
    assert "\x1b" not in got.stderr and "\x07" not in got.stderr, repr(got.stderr)
    assert "\\x1b[2J\\x1b]0;PWNED\\x07" in got.stderr, got.stderr  # written as verify writes it


def test_file_names_in_a_folder_reach_stderr_escaped(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    recording(folder, "good.jsonl")
    (folder / f"{ESCAPES}x.jsonl").write_text('{"a": 1}\n')  # skipped: not a recording
    writer = held(recording(folder, f"{ESCAPES}{PARTIAL}"))  # left out: being written
    try:
        runs = [streamtap("report", folder), streamtap("index", folder, "--out", tmp_path / "idx")]
    finally:
        os.close(writer)
    for got in runs:
        assert got.returncode == 0, got.stderr
        assert "skipped 1 file(s)" in got.stderr and "left out 1 recording(s)" in got.stderr, got.stderr
        no_raw_escapes(got)


def test_a_recordings_own_header_text_in_its_problem_is_written_escaped(tmp_path):
    newer = recording(tmp_path, "fmt.jsonl", header={"format": f"streamtap-recording/9{ESCAPES}"})
    listed = streamtap("report", newer)  # a damaged recording: listed, not complete
    assert listed.returncode == 1 and "Traceback" not in listed.stderr, listed.stderr
    assert "\x1b" not in listed.stdout and "\x07" not in listed.stdout, repr(listed.stdout)
    assert "\\x1b[2J\\x1b]0;PWNED\\x07" in listed.stdout, listed.stdout  # written as verify writes it
    indexed = streamtap("index", newer, "--out", tmp_path / "idx")  # an index holds it; it judges nothing
    assert indexed.returncode == 0 and "\x1b" not in indexed.stdout + indexed.stderr, indexed


def test_an_out_path_with_a_backslash_is_refused_before_anything_is_made(tmp_path):
    """DuckDB's writer takes a backslash for a separator: it failed ("Failed to create directory
    bs/idx/.staging-…") after making the folder's lock."""
    (tmp_path / "rec").mkdir()
    recording(tmp_path / "rec", "good.jsonl")
    named = tmp_path / "a\\b"
    for out in (tmp_path / "bs\\idx", named / "idx"):
        got = streamtap("index", tmp_path / "rec", "--out", out)
        assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
        assert "takes a backslash in the path for a folder separator" in got.stderr, got.stderr
        assert not out.exists() and not named.exists()
    named.mkdir()
    inside = subprocess.run([*STREAMTAP, "index", str(tmp_path / "rec"), "--out", "idx"], capture_output=True, text=True,
                            timeout=60, cwd=named)
    assert inside.returncode == 0, inside.stderr  # relative, from inside the folder whose name has one, as README says
    assert json.loads(streamtap("report", "--json", named / "idx").stdout)["recordings"] == 1
