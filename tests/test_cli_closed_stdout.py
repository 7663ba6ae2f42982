"""A verb started with stdout closed (``>&-``, as a script that wants only the exit code may do)
writes nowhere and still says its verdict in the exit code, with no traceback; and a folder
whose name is not UTF-8 is named as the reason its recordings are skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]


def closed_stdout(*args) -> subprocess.CompletedProcess:
    return subprocess.run(STREAMTAP + [*map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=60, pass_fds=(), preexec_fn=lambda: os.close(1))


def open_stdout(*args) -> subprocess.CompletedProcess:
    return subprocess.run(STREAMTAP + [*map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [("verify", "--json"), ("show", "--json"), ("report",), ("report", "--json"),
                                  ("report", "--csv"), ("verify",), ("show",)])
@pytest.mark.parametrize("cut", [False, True])
def test_a_closed_stdout_keeps_the_exit_code_and_gives_no_traceback(tmp_path, args, cut):
    folder = tmp_path / "rec"
    folder.mkdir()
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", folder / "whole.jsonl")
    if cut:
        data = (REPO / "recordings" / "openai-chat.jsonl").read_bytes()
        (folder / "cut.jsonl").write_bytes(data[: len(data) // 2])
    closed, expected = closed_stdout(*args, folder), open_stdout(*args, folder)
    assert "Traceback" not in closed.stderr, closed.stderr
    assert closed.returncode == expected.returncode, (closed.returncode, expected.returncode, closed.stderr)
    assert expected.returncode == (1 if cut and args[0] != "show" else 0)  # show: 0 once every input was shown


def test_a_folder_whose_name_is_not_utf8_is_named_as_the_reason(tmp_path):
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/nu\xfe"))
    folder.mkdir()
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", folder / "whole.jsonl")
    got = open_stdout("report", tmp_path)
    assert "a folder on its path is not UTF-8" in got.stderr and "its name is not UTF-8" not in got.stderr, got.stderr
    assert "Traceback" not in got.stderr
