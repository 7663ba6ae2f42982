"""`streamtap sweep` at its edges: user mistakes refused before any run (one line, exit 2),
clients that exit oddly, leave processes behind or are interrupted, and recordings that are
not whole. Real processes against real replay servers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from replay_streams import openai_chat_frames, write_recording

from streamtap.replay.source import Source, load_source
from streamtap.replay.faults import FaultSpecError
from streamtap.replay.sweep import (
    CRASHED,
    INCONCLUSIVE,
    NOTICED,
    SILENT,
    WHOLE,
    classify,
    recording_problems,
    run_sweep,
    sweep_positions,
)

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]

# stdlib only (starts fast): asks the replay server, prints the answer, exits with argv[1] when
# the stream was cut (no [DONE]), else 0: a client that fails uncut makes the runs inconclusive
CLIENT = """
import http.client, json, os, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"content-type": "application/json"})
text, done = [], False
try:
    for line in conn.getresponse():
        done = done or line.startswith(b"data: [DONE]")
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice["delta"].get("content") or "")
except Exception:
    pass
print("".join(text))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and not done else 0)
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return write_recording(tmp_path_factory.mktemp("edges") / "twenty.jsonl", "openai", openai_chat_frames(words=12))


@pytest.fixture
def marker_client(tmp_path):
    """A client that leaves a file behind when it runs, and reads the answer without a word (a
    client that never asks for it is inconclusive): (command, the folder it writes to)."""
    ran = tmp_path / "ran"
    ran.mkdir()
    path = tmp_path / "marker.py"
    path.write_text(f"import os, urllib.request\nopen(os.path.join({str(ran)!r}, str(os.getpid())), 'w').close()\n"
                    "try:\n    urllib.request.urlopen(os.environ['STREAMTAP_BASE_URL'] + '/v1/chat/completions', b'{}').read()\n"
                    "except Exception:\n    pass\n")
    return [sys.executable, "-S", str(path)], ran


def streamtap_sweep(*args, timeout=120, **popen):
    return subprocess.run([*STREAMTAP, "sweep", *map(str, args)], capture_output=True, text=True, timeout=timeout, **popen)


def assert_refused(result, message):
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_positions_the_recording_does_not_have_are_refused_before_any_run(recording, tmp_path, marker_client):
    command, ran = marker_client
    plain = write_recording(tmp_path / "plain.jsonl", "openai", openai_chat_frames(words=12, tool=False))
    for rec, positions, message in [
        (recording, "event=999", "'cut:event=999': event 999 does not exist"),
        (recording, "events,byte=999999", "'cut:byte=999999': byte 999999 is past the end"),
        (plain, "at=tool-args", "'cut:at=tool-args': this sse recording has no tool-args position"),
    ]:
        assert_refused(streamtap_sweep(rec, "--positions", positions, "--", *command), message)
    assert not list(ran.iterdir()), "a client ran"


def test_a_recording_that_cannot_be_read_is_named_once_in_one_line(recording, tmp_path, marker_client):
    command, ran = marker_client
    headless = tmp_path / "headless.jsonl"
    headless.write_bytes(b"".join(Path(recording).read_bytes().splitlines(keepends=True)[1:]))
    for given, says in [
        (tmp_path, f"streamtap sweep: {tmp_path}: a folder; give one recording"),
        (headless, f"streamtap sweep: {headless}: line 1 is a frame line: the recording's header line is missing"),
    ]:
        result = streamtap_sweep(given, "--", *command)
        assert_refused(result, says)
        assert result.stderr.count(str(given)) == 1, result.stderr
    assert not list(ran.iterdir()), "a client ran"


def test_a_timeout_that_is_not_a_positive_number_is_refused(recording, marker_client):
    command, ran = marker_client
    for value in ("nan", "inf", "-1", "0"):
        assert_refused(streamtap_sweep(recording, "--timeout", value, "--", *command), "--timeout must be a number of seconds > 0")
    assert not list(ran.iterdir()), "a client ran"


def test_a_json_report_that_cannot_be_written_is_refused_before_any_run(recording, tmp_path, marker_client):
    command, ran = marker_client
    assert_refused(streamtap_sweep(recording, "--json", tmp_path, "--", *command), "Is a directory")
    assert_refused(streamtap_sweep(recording, "--json", "/proc/version", "--", *command), "--json /proc/version")
    assert not list(ran.iterdir()), "a client ran"
    # a path that can be written gets the report, though trying it first left nothing there
    report = tmp_path / "new" / "report.json"
    report.parent.mkdir()
    result = streamtap_sweep(recording, "--json", report, "--positions", "event=2", "--styles", "clean", "--", *command)
    assert result.returncode == 1, result.stderr  # the client prints nothing and exits 0: silent
    assert [run["spec"] for run in json.loads(report.read_text())["runs"]] == ["cut:event=2,style=clean"]


def test_options_after_the_recording_without_dashes_are_a_usage_error(recording, marker_client):
    command, ran = marker_client
    for option in (["--no-progress"], ["--timeout=5"], ["-j4"], ["--no-prog"]):
        assert_refused(streamtap_sweep(recording, *option, *command), "put -- before the client")
    assert not list(ran.iterdir()), "a client ran"


def test_a_client_without_dashes_still_runs(tmp_path, marker_client):
    command, ran = marker_client
    tiny = write_recording(tmp_path / "tiny.jsonl", "openai", openai_chat_frames(words=1, tool=False))
    result = streamtap_sweep(tiny, *command)
    assert result.returncode == 1 and "silently accepted" in result.stdout, result.stderr
    assert list(ran.iterdir())


def test_exit_statuses_the_client_chose_are_noticed_signals_crash(recording, tmp_path):
    """The client is exec'd directly: a signal is a negative returncode; 255 (sys.exit(-1)) or
    any other status is the client's own answer."""
    assert classify(255, "", timed_out=False) == classify(130, "", timed_out=False) == NOTICED
    assert classify(-9, "", timed_out=False) == classify(127, "", timed_out=False) == CRASHED
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    for command, outcome, returncode in [
        ([client, "-1"], NOTICED, 255),
        ([client, "200"], NOTICED, 200),
        ([killed], CRASHED, -signal.SIGKILL),
    ]:
        result = streamtap_sweep(recording, "--json", "-", "--positions", "event=2", "--styles", "clean", "--", sys.executable, "-S", *command)
        [run] = json.loads(result.stdout)["runs"]
        assert (run["outcome"], run["returncode"]) == (outcome, returncode), run


def _alive(pid):
    """Running (a killed process can stay a zombie a while, until whoever adopted it reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_client_is_done_when_it_exits_whatever_holds_its_output(recording, tmp_path):
    """Its exit status counts once it exits: a process it left behind with its stdout does not
    make the run hang, nor the sweep wait for it. What it left ends with the run, in the client's
    own session or in a session of its own (out of reach of the client's process group)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    leaver = tmp_path / "leaver.py"
    leaver.write_text(
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(40)'], start_new_session=sys.argv[1] == 'away')\n"
        f"open(os.path.join({str(pids)!r}, sys.argv[1] + '-' + str(child.pid)), 'w').close()\n"
        "print('The weather in Paris is mild today, says the model')\n"
        "sys.exit(3)\n"
    )
    left = {}
    try:
        for where in ("away", "inside"):
            started = time.monotonic()
            result = streamtap_sweep(
                recording, "--json", "-", "--timeout", "8", "--positions", "event=2", "--styles", "clean",
                "--", sys.executable, "-S", leaver, where,
            )
            report = json.loads(result.stdout)
            [run] = report["runs"]
            # it exits 3 uncut too: its exit says nothing of the cut
            assert (run["outcome"], run["returncode"]) == (INCONCLUSIVE, 3) and report["baseline"]["returncode"] == 3, report
            assert "The weather in Paris" in run["output_tail"]
            assert time.monotonic() - started < 8, f"{where}: the sweep waited for what the client left behind"
        time.sleep(0.2)
        left = {name.name: int(name.name.split("-")[1]) for name in pids.iterdir()}
        alive = sorted(name.split("-")[0] for name, pid in left.items() if _alive(pid))
        assert len(left) == 4 and alive == [], alive  # the baseline's and the cut run's, both ways
    finally:
        for pid in left.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_interrupted_it_exits_130_and_keeps_the_runs_that_ended(recording, tmp_path):
    """Ctrl-C ends the runs in flight, and says what the ended ones found, in the table and in
    --json, as pytest does of the tests that ran: they took their time."""
    ended = tmp_path / "ended"
    ended.mkdir()
    client = tmp_path / "client.py"
    # 0.3 s a run: the 60 runs take 4.5 s on 4 jobs, so the signal below lands inside them
    client.write_text(f"import atexit, os, time\natexit.register(lambda: open(os.path.join({str(ended)!r}, str(os.getpid())), 'w').close())\n"
                      "time.sleep(0.3)\n" + CLIENT)
    report = tmp_path / "report.json"
    sweep = subprocess.Popen(
        [*STREAMTAP, "sweep", recording, "--no-progress", "--positions", "events", "--styles", "clean,abort,reset", "-j", "4",
         "--json", report, "--", sys.executable, "-S", client],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a suite started in the background ignores SIGINT, and a child inherits that: this
        # sweep stands for one started at a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(ended.iterdir())) < 3 and time.monotonic() < deadline:  # the uncut run and two cut ones
            time.sleep(0.05)
        time.sleep(0.2)  # for the sweep to take their ends
        sweep.send_signal(signal.SIGINT)
        out, err = sweep.communicate(timeout=30)
    finally:
        sweep.kill()
    assert sweep.returncode == 130, err
    assert "Traceback" not in err and "Exception" not in err, err
    data = json.loads(report.read_text())
    ran = len(data["runs"])
    assert 2 <= ran < 60 and data["planned"] == 60 and data["stopped_by"] == "SIGINT", (ran, data["planned"])
    assert f"stopped by SIGINT after {ran} of 60 runs" in err, err
    assert f"{ran} runs in " in out and sum(data["counts"].values()) == ran, out


def test_an_incomplete_recording_is_swept_with_a_warning(recording, tmp_path, marker_client):
    command, _ran = marker_client
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(recording.read_text().splitlines(keepends=True)[:8]))  # the writer stopped there
    result = streamtap_sweep(cut, "--positions", "event=2", "--styles", "clean", "--", *command)
    [warning] = result.stderr.splitlines()
    assert warning.startswith(f"streamtap sweep: warning: {cut}: recording incomplete at byte "), warning
    assert "served uncut, its stream is already truncated" in warning
    assert result.returncode == 1 and "1 runs" in result.stdout  # swept all the same
    whole = streamtap_sweep(recording, "--positions", "event=2", "--styles", "clean", "--", *command)
    assert whole.stderr == "" and whole.returncode == 1


def test_the_problems_the_sweep_warns_of_come_from_the_one_reading_of_the_recording(recording, tmp_path):
    """The warning describes the file the runs serve: found as it is loaded, not by reading it
    again later (when it may have changed, or be gone)."""
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(recording.read_text().splitlines(keepends=True)[:8]))
    source = load_source(cut, check=True)
    cut.unlink()
    problems = recording_problems(source)
    assert problems and problems[0].startswith("recording incomplete at byte "), problems
    assert problems[-1] == "served uncut, its stream is already truncated"
    assert load_source(recording, check=True).problems == [] and load_source(recording).problems is None


# --- a cut at the very end cuts nothing; a client that fails uncut proves nothing ----------


def test_a_position_at_the_very_end_is_refused_before_any_run(recording, tmp_path):
    source = load_source(recording)
    length = len(source.body)
    last = sum(1 for frame in source.frames if frame.seq is not None) - 1
    for item, message in [
        (f"byte={length}", f"'cut:byte={length}': byte {length} is the end of the body: nothing would be cut"),
        (f"event={last}", f"'cut:event={last}': event {last} is the last event: nothing would be cut"),
    ]:
        with pytest.raises(FaultSpecError, match=message):
            sweep_positions(source, item)
    assert sweep_positions(source, f"byte={length - 1},event={last - 1}") == [f"cut:byte={length - 1}", f"cut:event={last - 1}"]
    ran = tmp_path / "ran"
    marker = tmp_path / "marker.py"
    marker.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = streamtap_sweep(recording, "--positions", f"events,byte={length}", "--", sys.executable, "-S", marker)
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and "nothing would be cut" in line and "Traceback" not in result.stderr, result.stderr
    assert not ran.exists(), "a client ran"


def test_a_cut_run_that_still_got_a_complete_stream_is_never_silent(recording, tmp_path):
    answer = "The weather in Paris today is mild"
    assert classify(0, answer, timed_out=False, answer=answer, complete=True) == WHOLE
    assert classify(0, answer, timed_out=False, answer=answer) == SILENT
    assert classify(1, answer, timed_out=False, answer=answer, complete=True) == NOTICED
    # a cut that drops only a keep-alive comment after [DONE]: the client gets the whole stream
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    frames = openai_chat_frames()
    source = Source.from_frames([*frames, b": keep-alive\n\n"], wire="sse", dialect="openai-chat")
    cut = sum(map(len, frames))
    report = asyncio.run(run_sweep(source, [sys.executable, "-S", str(client)], positions=[f"cut:byte={cut}"], styles=("clean",), timeout=15))
    [run] = report.runs
    assert (run.verdict, run.outcome) == ("complete", WHOLE), run
    assert report.baseline.outcome == SILENT  # uncut, taking the whole answer is what it shows


def test_a_client_that_fails_without_any_cut_makes_the_sweep_inconclusive_not_a_pass(recording):
    broken = [sys.executable, "-S", "-c", "import streamtap_review_module_not_installed"]
    result = streamtap_sweep(recording, "--positions", "event=2,event=5", "--", *broken)
    assert result.returncode == 1, (result.stdout, result.stderr)
    summary = result.stdout.splitlines()
    assert summary[-2].endswith("0 silently accepted partial output, 0 noticed, 0 hung, 0 crashed, 4 inconclusive"), result.stdout
    assert summary[-1].startswith("inconclusive: without any cut the client was noticed (exit 1)"), result.stdout
    report = json.loads(streamtap_sweep(recording, "--json", "-", "--positions", "event=2", "--", *broken).stdout)
    assert report["baseline_failed"] is True and {r["outcome"] for r in report["runs"]} == {INCONCLUSIVE}


def test_a_client_that_prints_without_end_costs_the_sweep_no_more_than_its_head_and_tail(recording, tmp_path):
    """Its whole output was kept and read: 300 MB printed took the sweep to about 1 GB. The first
    and the last OUTPUT_KEPT bytes are kept, which is all the checks read."""
    from streamtap.replay.sweep import OUTPUT_KEPT

    loud = tmp_path / "loud.py"
    loud.write_text(
        "import sys\n"
        "line = b'x' * 1023 + b'\\n'\n"
        "for _ in range(4 * 1024):\n"  # 4 MiB: past the head and the tail kept
        "    sys.stdout.buffer.write(line)\n"
        "print('Error: the answer stopped early')\n"
    )
    result = streamtap_sweep(recording, "--json", "-", "--positions", "event=2", "--styles", "clean", "--", sys.executable, "-S", loud)
    report = json.loads(result.stdout)
    [run] = report["runs"]
    # (it says so uncut too: inconclusive) the tail it printed last is what the run kept
    assert run["returncode"] == 0 and run["output_tail"].endswith("Error: the answer stopped early\n"), run
    from streamtap.replay.sweep import _Output

    kept = _Output()
    read_end, write_end = os.pipe()

    async def drain():
        loop = asyncio.get_running_loop()
        loop.add_reader(read_end, kept.take, read_end)
        writing = loop.run_in_executor(None, os.write, write_end, b"h" * OUTPUT_KEPT + b"m" * 100 + b"t" * OUTPUT_KEPT)
        await writing  # (a pipe holds 64 KiB: written while read)
        os.close(write_end)
        await asyncio.wait_for(kept.ended.wait(), 10)

    os.set_blocking(read_end, False)
    asyncio.run(drain())
    os.close(read_end)
    assert kept.text() == "h" * OUTPUT_KEPT + "\n[... 100 bytes of output left out ...]\n" + "t" * OUTPUT_KEPT


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("echo hi\n", "cannot start the client './client.sh': Exec format error (a script needs a #! line"),
        ("#!/nonexistent/interp\necho hi\n", "cannot start the client './client.sh': its #! interpreter '/nonexistent/interp' does not exist"),
    ],
)
def test_a_client_found_but_not_startable_is_refused_before_any_cut_run(recording, tmp_path, script, says):
    """`which` finds it, but exec cannot start it: every run was counted crashed (exit 1), the cause
    only in --json."""
    client = tmp_path / "client.sh"
    client.write_text(script)
    client.chmod(0o755)
    report = tmp_path / "report.json"
    result = streamtap_sweep(recording, "--json", report, "--positions", "event=1", "--", "./client.sh", cwd=tmp_path)
    assert_refused(result, says)
    assert result.stdout == "" and not report.exists()


def test_a_style_named_twice_is_run_once(recording, marker_client):
    command, ran = marker_client
    result = streamtap_sweep(recording, "--styles", "clean,abort,clean", "--positions", "event=1,event=2", "--json", "-", "--", *command)
    report = json.loads(result.stdout)
    assert [run["spec"] for run in report["runs"]] == [
        "cut:event=1,style=clean", "cut:event=1,style=abort", "cut:event=2,style=clean", "cut:event=2,style=abort",
    ]  # fmt: skip
    assert sum(report["counts"].values()) == 4 and len(list(ran.iterdir())) == 1 + 4  # the uncut run, then the cuts


def test_a_client_command_in_the_place_of_the_recording_is_said_of_the_recording(tmp_path):
    """`sweep -- python x.py`: argparse takes python for the recording; the user hears of that,
    not that x.py cannot be started."""
    result = streamtap_sweep("--", "python", "x.py", cwd=tmp_path)
    assert_refused(result, "streamtap sweep: python: no such recording file (streamtap sweep REC.jsonl [OPTIONS] -- CLIENT_CMD ...)")


def test_a_recording_behind_a_folder_that_cannot_be_searched_is_said_so_not_missing(recording, tmp_path, marker_client):
    """os.path.exists says False for a file it may not look at: "no such recording file" sent
    the user looking for a file that is there."""
    from test_fleet_edges import unprivileged

    command, ran = marker_client
    locked = tmp_path / "locked"
    locked.mkdir()
    hidden = locked / "x.jsonl"
    hidden.write_bytes(Path(recording).read_bytes())
    locked.chmod(0)
    try:
        got = subprocess.run(unprivileged("sweep", hidden, "--", *command), capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o700)
    assert_refused(got, f"streamtap sweep: {hidden}: Permission denied")
    assert not list(ran.iterdir()), "a client ran"


def test_a_fifo_or_a_device_given_as_the_recording_is_refused_before_it_is_opened(tmp_path, marker_client):
    """A fifo blocked the sweep for ever (waiting for a writer), /dev/zero read ~200 MB before it
    was refused; every other verb refuses them at once."""
    command, ran = marker_client
    fifo = tmp_path / "rec.jsonl"
    os.mkfifo(fifo)
    for given in (fifo, "/dev/zero"):
        assert_refused(streamtap_sweep(given, "--", *command, timeout=20), f"streamtap sweep: {given}: not a regular file")
    assert not list(ran.iterdir()), "a client ran"


@pytest.mark.parametrize("words", [["--help"], ["--help", "--"], ["-h", "--"], ["--timeout", "5", "--he", "--"]])
def test_help_asked_after_the_recording_is_the_whole_help(recording, marker_client, words):
    """`sweep REC --help` was called a client command, and `sweep REC --help -- cmd` an
    unrecognized argument: help is shown wherever it is asked, as every other verb does."""
    command, ran = marker_client
    got = streamtap_sweep(recording, *words, *(command if words[-1] == "--" else []))
    assert got.returncode == 0 and got.stderr == "", (got.returncode, got.stderr)
    assert got.stdout.startswith("usage: streamtap sweep") and "exit code: 0 every cut was noticed" in got.stdout, got.stdout
    assert not list(ran.iterdir()), "a client ran"


def test_an_option_after_the_recording_that_is_wrong_is_one_line(recording, marker_client):
    """It printed argparse's usage and error, then a line of its own: three lines for one mistake."""
    command, ran = marker_client
    assert_refused(streamtap_sweep(recording, "--bogus", "--", *command), "unrecognized arguments: --bogus")
    assert_refused(streamtap_sweep(recording, "--timeout", "soon", "--", *command), "argument --timeout: invalid float value: 'soon'")
    assert_refused(streamtap_sweep(recording, "--json", "--", *command), "argument --json: expected one argument")
    assert not list(ran.iterdir()), "a client ran"


def test_a_json_report_that_fails_to_be_written_after_the_runs_keeps_the_finding_and_the_file(recording, tmp_path, marker_client):
    """A full disk found once the sweep is done: its exit 2 hid the silent runs, and the report
    file was left empty or cut short."""
    import resource

    command, ran = marker_client
    sweep = ("--positions", "event=2", "--styles", "clean")
    got = streamtap_sweep(recording, *sweep, "--json", "/dev/full", "--", *command)
    assert "1 silently accepted partial output" in got.stdout, got.stdout  # the table, whole
    assert_refused(got, "--json /dev/full: No space left on device")
    assert "found: 1 silent, 0 hung, 0 crashed (exit 1 but for this)" in got.stderr, got.stderr
    report = tmp_path / "report.json"
    report.write_text("the report of yesterday\n")
    got = streamtap_sweep(recording, *sweep, "--json", report, "--", *command,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200)))  # Python ignores SIGXFSZ: EFBIG
    assert_refused(got, f"--json {report}: File too large")
    assert "(exit 1 but for this)" in got.stderr, got.stderr
    assert report.read_text() == "the report of yesterday\n"  # as it was, not cut short
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_json_report_to_stdout_a_pipe_or_the_file_it_writes_to_follows_the_table(recording, tmp_path, marker_client):
    """`sweep --json /dev/stdout ... | jq` and `> out.txt`: a pipe's /dev/stdout leads to no file
    (pipe:[N]), and the report was refused (No such file or directory); the file the shell opened
    was renamed over, and the table before the report lost."""
    command, ran = marker_client
    args = (recording, "--json", "/dev/stdout", "--positions", "event=2", "--styles", "clean", "--", *command)
    piped = streamtap_sweep(*args)
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        redirected = subprocess.run([*STREAMTAP, "sweep", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                                    text=True, timeout=120)
        opened = os.fstat(stdout.fileno())
    assert os.path.samestat(opened, out.stat())  # written where the shell opened it, not renamed over
    for result, written in ((piped, piped.stdout), (redirected, out.read_text())):
        assert result.returncode == 1, result.stderr  # the client prints nothing and exits 0: silent
        table, _, report = written.partition("\n{\n")
        assert "cut:event=2   SILENT" in table, written
        assert [run["spec"] for run in json.loads("{\n" + report)["runs"]] == ["cut:event=2,style=clean"]


def test_an_error_answer_is_swept_with_a_warning_and_its_failures_are_not_blamed_on_the_client(tmp_path):
    """A recording of an in-stream error (OpenRouter's 'Token limit reached'): a correct client
    raises on it uncut, and the sweep said to fix the client or its environment, with no warning."""
    frames = openai_chat_frames(words=6, tool=False)[:3] + [b'data: {"error":{"message":"Token limit reached","code":400}}\n\n']
    errored = write_recording(tmp_path / "errored.jsonl", "openai", frames)
    assert "an error answer (errored)" in recording_problems(load_source(errored, check=True))[-1]
    raising = [sys.executable, "-S", "-c", "raise SystemExit(1)"]
    result = streamtap_sweep(errored, "--positions", "event=1", "--styles", "clean", "--", *raising)
    [warning] = result.stderr.splitlines()
    assert "served uncut, its stream is an error answer (errored)" in warning, warning
    assert result.stdout.splitlines()[-1].endswith("the recording is an error answer, which a client may well fail on: "
                                                   "sweep a recording of a whole answer"), result.stdout


def test_the_clients_get_no_credential_of_the_user_s(recording, tmp_path, monkeypatch):
    """The sweep swapped in stand-in keys, but left ANTHROPIC_AUTH_TOKEN (the anthropic SDK sends it
    as a bearer token beside the key) and AWS_BEARER_TOKEN_BEDROCK (boto3's Bedrock API key, used
    instead of the stand-in AWS keys) in the client's environment."""
    secrets = {"ANTHROPIC_AUTH_TOKEN": "user-token-1", "AWS_BEARER_TOKEN_BEDROCK": "user-token-2",
               "AWS_SESSION_TOKEN": "user-token-3", "OPENAI_API_KEY": "user-token-4", "ANTHROPIC_API_KEY": "user-token-5"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    seen = tmp_path / "env.txt"
    client = [sys.executable, "-S", "-c", f"import os; open({str(seen)!r}, 'a').write(repr(sorted(os.environ.items())))"]
    result = streamtap_sweep(recording, "--positions", "event=2", "--styles", "clean", "--", *client)
    assert result.returncode in (0, 1), result.stderr
    assert seen.exists() and not any(value in seen.read_text() for value in secrets.values()), seen.read_text()[:500]


def test_stopped_before_any_run_ended_it_keeps_the_json_report_already_there(recording, tmp_path):
    """Nothing ran to its end: an empty report must not take the place of an earlier one."""
    started = tmp_path / "started"
    client = tmp_path / "hang.py"
    client.write_text(f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(60)\n")
    report = tmp_path / "report.json"
    report.write_text('{"earlier": true}\n')
    sweep = subprocess.Popen(
        [*STREAMTAP, "sweep", recording, "--no-progress", "--positions", "event=2", "--styles", "clean", "--timeout", "60",
         "--json", report, "--", sys.executable, "-S", client],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sweep.send_signal(signal.SIGTERM)
        out, err = sweep.communicate(timeout=30)
    finally:
        sweep.kill()
    assert sweep.returncode == 143 and "stopped by SIGTERM after 0 of 1 runs" in err, err
    assert report.read_text() == '{"earlier": true}\n' and out == ""
