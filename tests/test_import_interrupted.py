"""`streamtap import` run again after an import that was stopped midway (Ctrl-C, a kill), or
while another import writes into the same folder.

A stopped import can leave a flow's recording as `..._<id>.partial.jsonl`. Importing the
capture again must import that flow anew (the capture still holds it) and say so, never crash
on the leftover; a file that another process is writing, or one that a proxy (not an import)
left, is left as it is and the flow is listed as skipped (exit 1). Everything runs as real
processes: the CLI, a second writer holding its lock, a Ctrl-C.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from interception import openai_chat_stream

FLOWS = 3


def streamtap_import(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamtap.cli", "import", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def write_capture(path: Path, answers: int, words: int = 2) -> None:
    """A capture of ``answers`` streamed OpenAI chat answers of ``words`` words each."""
    from mitmproxy import io
    from mitmproxy.test import tflow

    with path.open("wb") as file:
        writer = io.FlowWriter(file)
        for n in range(answers):
            flow = tflow.tflow(resp=True)
            flow.request.host, flow.request.path = "api.openai.com", "/v1/chat/completions"
            flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
            flow.response.headers["content-type"] = "text/event-stream"
            flow.response.content = openai_chat_stream([f"answer {n}", *[" word"] * (words - 1)])
            writer.add(flow)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr


def imported(tmp_path: Path) -> tuple[Path, Path]:
    """A capture and a folder holding its recordings, as a first import wrote them."""
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    write_capture(capture, FLOWS)
    first = streamtap_import(capture, "--out", out, "-q")
    assert first.returncode == 0, first.stderr
    assert len(list(out.glob("*_complete_*.jsonl"))) == FLOWS
    return capture, out


def unfinish(final: Path, keep: str) -> Path:
    """Turn a finished recording back into what an import killed while writing it leaves: the
    partial name, and the lines up to the cut (``keep``)."""
    lines = final.read_bytes().splitlines(keepends=True)
    content = {
        "frames": b"".join(lines[:-1]),  # all but the end line
        "header-without-newline": lines[0].rstrip(b"\n"),  # the writer buffers the newline
        "nothing": b"",
    }[keep]
    stamp, provider, _verdict, flow = final.name.removesuffix(".jsonl").split("_")
    partial = final.with_name(f"{stamp}_{provider}_{flow}.partial.jsonl")
    partial.write_bytes(content)
    final.unlink()
    return partial


@pytest.mark.parametrize("keep", ["frames", "header-without-newline", "nothing"])
def test_a_flow_a_killed_import_left_unfinished_is_imported_again(tmp_path, keep):
    capture, out = imported(tmp_path)
    partial = unfinish(sorted(out.glob("*.jsonl"))[1], keep)

    again = streamtap_import(capture, "--out", out, "-q")
    no_traceback(again)
    assert again.returncode == 0, again.stderr
    assert not partial.exists() and not list(out.glob("*.partial.jsonl*"))
    assert len(list(out.glob("*_complete_*.jsonl"))) == FLOWS
    assert again.stdout.count("already imported") == FLOWS - 1
    said = [line for line in again.stderr.splitlines() if str(partial) in line]
    assert len(said) == 1 and "importing the flow again" in said[0], again.stderr


def test_ctrl_c_leaves_nothing_a_second_import_trips_on(tmp_path):
    """A real Ctrl-C (SIGINT) while flows are being written; then the same import again."""
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    write_capture(capture, 60, words=3000)  # long answers: most of the time goes to writing them
    process = subprocess.Popen(
        [sys.executable, "-m", "streamtap.cli", "import", str(capture), "--out", str(out), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while len(list(out.glob("*.jsonl"))) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 130, stderr
    assert not list(out.glob("*.partial.jsonl")), "an interrupted import left an unfinished recording"

    again = streamtap_import(capture, "--out", out, "-q")
    no_traceback(again)
    assert again.returncode == 0, again.stderr
    assert len(list(out.glob("*_complete_*.jsonl"))) == 60


HOLD = """
import sys, time
from streamtap.recording.writer import RecordingWriter
writer = RecordingWriter(sys.argv[1])
writer.header({"imported_from": "another-import.mitm"})  # as another import writes one
writer.flush()
print("holding", flush=True)
time.sleep(60)
"""


def test_a_file_another_writer_holds_is_left_alone_and_the_others_imported(tmp_path):
    capture, out = imported(tmp_path)
    partial = unfinish(sorted(out.glob("*.jsonl"))[0], "nothing")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(partial)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        held = partial.read_bytes()

        busy = streamtap_import(capture, "--out", out)
        no_traceback(busy)
        assert busy.returncode == 1, busy.stderr  # some skipped
        skipped = [line for line in busy.stdout.splitlines() if line.startswith("skipped ")]
        assert len(skipped) == 1 and str(partial) in skipped[0] and "being written" in skipped[0], busy.stdout
        assert busy.stdout.count("already imported") == FLOWS - 1
        assert partial.read_bytes() == held
    finally:
        holder.kill()
        holder.wait()

    after = streamtap_import(capture, "--out", out, "-q")  # its writer gone: the flow is imported again
    no_traceback(after)
    assert after.returncode == 0, after.stderr
    assert len(list(out.glob("*_complete_*.jsonl"))) == FLOWS and not partial.exists()


def test_two_imports_into_one_folder_at_once_write_every_flow_once(tmp_path):
    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    write_capture(capture, 40, words=300)
    command = [sys.executable, "-m", "streamtap.cli", "import", str(capture), "--out", str(out), "-q"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=120) for run in runs]
    for run, (stdout, stderr) in zip(runs, results):
        assert "Traceback" not in stderr, stderr
        assert run.returncode in (0, 1), stderr  # 1: flows the other import was writing are skipped
        for line in stdout.splitlines():
            assert " complete " in line or "already imported" in line or "being written" in line, line
    assert len(list(out.glob("*_complete_*.jsonl"))) == 40 and not list(out.glob("*.partial.jsonl"))


def test_a_proxys_unfinished_recording_of_the_flow_is_kept(tmp_path):
    """A `.partial.jsonl` whose header names no capture is a proxy's recording cut short:
    evidence, which an import does not remove."""
    capture, out = imported(tmp_path)
    partial = unfinish(sorted(out.glob("*.jsonl"))[2], "frames")
    lines = partial.read_bytes().splitlines(keepends=True)
    header = orjson.loads(lines[0])
    del header["imported_from"]
    proxys = orjson.dumps(header) + b"\n" + b"".join(lines[1:])
    partial.write_bytes(proxys)

    again = streamtap_import(capture, "--out", out, "-q")
    no_traceback(again)
    assert again.returncode == 1, again.stderr
    skipped = [line for line in again.stdout.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1 and "no import wrote" in skipped[0], again.stdout
    assert partial.read_bytes() == proxys
