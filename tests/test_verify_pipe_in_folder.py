"""A pipe among the stream files of a folder is never read (it would block) and never passed over
in silence: verify says it on stderr and exits 2, as for a folder it cannot read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_pipe_in_a_folder_is_said_and_the_rest_judged(tmp_path):
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", tmp_path / "a.jsonl")
    os.mkfifo(tmp_path / "f.sse")
    got = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "a.jsonl: complete" in got.stdout
    assert f"{tmp_path / 'f.sse'}: not a file" in got.stderr
