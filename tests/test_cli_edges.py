"""User mistakes and odd surroundings at the command line: one line and exit 2 for a mistake,
never a traceback; exit codes a script can trust. Real processes, the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

STREAMTAP = Path(sys.executable).with_name("streamtap")
RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def streamtap(*args, timeout: float = 60, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(STREAMTAP), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess, verb: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.startswith(f"streamtap {verb}: "), result.stderr


def test_output_closed_before_the_verb_finished_is_not_a_success(tmp_path):
    """`streamtap verify DIR | head -1` under `set -o pipefail`: the verdicts that never reached
    the reader cannot be vouched for, so the exit code is the shell's for SIGPIPE, not 0."""
    for i in range(200):
        shutil.copy(RECORDINGS / "anthropic.jsonl", tmp_path / f"r{i:03}.jsonl")
    for verb in ("verify", "show"):
        process = subprocess.Popen([str(STREAMTAP), verb, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout.readline()
        process.stdout.close()  # the reader leaves, as head does
        _, err = process.communicate(timeout=60)
        assert process.returncode == 141, (verb, process.returncode, err)
        assert b"Traceback" not in err and b"Exception ignored" not in err, err


def test_a_name_the_file_system_refuses_is_one_line_for_every_verb(tmp_path):
    """A name over the file system's 255 bytes raises ENAMETOOLONG from a mere exists()."""
    long = tmp_path / ("x" * 300)
    for verb, *rest in (("verify",), ("show",), ("report",), ("serve",), ("import",), ("index", "--out", tmp_path / "idx")):
        got = streamtap(verb, long, *rest)
        one_line_error(got, verb)
        assert "File name too long" in got.stderr, got.stderr
    judged = streamtap("verify", long, RECORDINGS / "anthropic.jsonl")  # the other inputs are still judged
    assert judged.returncode == 2 and "anthropic.jsonl: complete" in judged.stdout, judged


def test_an_import_out_folder_the_file_system_refuses_is_one_line(tmp_path):
    capture = tmp_path / "empty.mitm"
    capture.write_bytes(b"")
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile" / "sub", "/proc/no-such-import"):
        got = streamtap("import", capture, "--out", out)
        one_line_error(got, "import")


def test_serve_refuses_faults_that_fit_one_by_one_but_not_together():
    """Each fits the recording alone; the error after event 3 ends the stream before event 20."""
    got = streamtap("serve", "--fault", "error:kind=openai,after=3;cut:event=20", RECORDINGS / "openai-chat.jsonl", timeout=30)
    one_line_error(got, "serve")
    assert "together (error:kind=openai,after=3; cut:event=20)" in got.stderr and "event 20 does not exist" in got.stderr
