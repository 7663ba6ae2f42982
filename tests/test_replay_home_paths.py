"""A recording path that starts with ~ names the home folder, in replay as in streamtap_dir: an
options file or a quoted argument reaches streamtap with the ~ no shell expanded."""

from __future__ import annotations

from replay_streams import openai_chat_frames, write_recording

from streamtap.replay.faults import parse_fault
from streamtap.replay.match import Library
from streamtap.replay.server import swap_recordings


def test_replay_paths_and_swap_tail_take_a_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "recs"
    folder.mkdir()
    write_recording(folder / "a.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    write_recording(tmp_path / "other.jsonl", "openai", openai_chat_frames(words=4, tool=False))
    library = Library.load(["~/recs"])
    assert [entry.source.path for entry in library.entries] == [str(folder / "a.jsonl")]
    swapped = swap_recordings([parse_fault("swap-tail:with=~/other.jsonl")], library)
    assert list(swapped) == ["~/other.jsonl"] and swapped["~/other.jsonl"].path == str(tmp_path / "other.jsonl")
