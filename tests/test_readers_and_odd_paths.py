"""Readers never cost a recording its note, odd links are no recordings, and a URL's tabs hide no secret.

- A report or index holds a shared lock while it reads a recording; a worker noting why a dead
  writer's recording stops waits for such readers instead of giving the note up.
- A link that leads nowhere (its target missing, under a file, or in a loop) is skipped, as the
  README says of dangling links; it does not make report exit 1.
- URL parsers drop tabs and line breaks wherever they stand, so a secret's name split by one is
  still the secret's name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamtap.recording.catalog import unless_being_written
from streamtap.recording.redact import Redactor
from streamtap.recording.writer import RecordingWriter, note_unfinished

REPO = Path(__file__).resolve().parent.parent
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]


def unfinished(folder: Path) -> Path:
    """A recording whose writer stopped without its end line (and let go of the lock)."""
    path = folder / "20261205T090000.000Z_openai-chat_aaaaaaaaaaaa.partial.jsonl"
    writer = RecordingWriter(path)
    writer.header({"dialect": "openai-chat", "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions"}})
    writer.read(b"data: {}\n\n", 1.0)
    writer._file.flush()
    writer._file.close()  # the process is gone: its lock with it
    return path


def test_a_note_waits_for_a_reader_instead_of_giving_up(tmp_path):
    path = unfinished(tmp_path)
    reading = threading.Event()

    def read_slowly():
        with unless_being_written(path) as readable:
            assert readable
            reading.set()
            time.sleep(0.5)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    assert reading.wait(5)
    started = time.monotonic()
    assert note_unfinished(path, "streamtap_error", "the worker died")
    assert time.monotonic() - started >= 0.3  # it waited for the reader to let go
    reader.join()
    assert json.loads(path.read_bytes().splitlines()[-1])["message"] == "the worker died"


def test_a_note_still_leaves_a_file_a_writer_holds(tmp_path):
    path = tmp_path / "20261205T090000.000Z_openai-chat_bbbbbbbbbbbb.partial.jsonl"
    writer = RecordingWriter(path)
    writer.header({"dialect": "openai-chat", "request": {"method": "POST", "url": "https://api.openai.com/v1/chat/completions"}})
    started = time.monotonic()
    assert not note_unfinished(path, "streamtap_error", "too soon")
    assert time.monotonic() - started < 1  # a writer's lock is no reader's: no waiting
    writer.finish({"verdict": {"kind": "unknown", "reason": "test"}, "stream_end": "finished"})


@pytest.mark.parametrize("make_link", ["missing", "under_a_file", "loop"])
def test_a_link_that_leads_nowhere_is_skipped(tmp_path, make_link):
    folder = tmp_path / "rec"
    folder.mkdir()
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", folder / "whole.jsonl")
    if make_link == "missing":
        (folder / "gone.jsonl").symlink_to(tmp_path / "nothing.jsonl")
    elif make_link == "under_a_file":
        (tmp_path / "a-file").write_text("x")
        (folder / "under.jsonl").symlink_to(tmp_path / "a-file" / "x.jsonl")
    else:
        (folder / "loop1.jsonl").symlink_to(folder / "loop2.jsonl")
        (folder / "loop2.jsonl").symlink_to(folder / "loop1.jsonl")
    got = subprocess.run([*STREAMTAP, "report", "--json", str(folder)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    assert report["verdicts"] == {"complete": 1} and report["left_out"]["unreadable"]["count"] == 0


@pytest.mark.parametrize("url, expected", [
    ("https://host/x?ap\ti_key=s", "https://host/x?api_key=[redacted]"),
    ("https:/\t/user:pw@host/x", "https://[redacted]@host/x"),
    ("ht\ttps://user:pw@host/x", "https://[redacted]@host/x"),
    ("https://host/x?key=\nabc&q=1", "https://host/x?key=[redacted]&q=1"),
])
def test_a_tab_or_line_break_in_a_url_hides_no_secret(url, expected):
    assert Redactor((), ()).url(url) == expected


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_a_time_that_is_no_finite_number_is_damage_not_a_time_that_hides_others_going_back(tmp_path, value):
    """The writer's fallback to the json module (for what orjson refuses) reads NaN, which every
    comparison lets through: later frames' times set to 0 then went unnoticed."""
    lines = (REPO / "recordings" / "anthropic.jsonl").read_text().splitlines(keepends=True)
    frames = [i for i, line in enumerate(lines) if line.startswith('{"type":"frame"')]
    edited = list(lines)
    edited[frames[5]] = json.dumps({**json.loads(lines[frames[5]]), "t": "T"}, separators=(",", ":")).replace('"T"', value) + "\n"
    for i in frames[6:]:
        edited[i] = json.dumps({**json.loads(lines[i]), "t": 0}, separators=(",", ":")) + "\n"
    path = tmp_path / "forged.jsonl"
    path.write_text("".join(edited))
    result = subprocess.run([*STREAMTAP, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"line {frames[5] + 1} is damaged: 't' is" in result.stderr and "finite number" in result.stderr, result.stderr
