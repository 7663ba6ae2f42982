"""User mistakes and odd surroundings at the command line: one line and exit 2 for a mistake,
never a traceback; exit codes a script can trust. Real processes, the installed console script."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import streamtap as streamtap_package

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


def test_a_report_larger_than_the_pipe_holds_says_its_output_was_closed(tmp_path):
    """One write of more than a pipe holds returns having written part when the reader leaves,
    without an error: the rest must not be dropped with an exit code that says nothing of it."""
    cut = Path(streamtap_package.__file__).parent / "data" / "demo" / "02_openai-cut_truncated.jsonl"
    header, rest = cut.read_bytes().split(b"\n", 1)
    for i in range(400):  # 400 recordings, not copies of one (a copy counts once): each of its own flow
        flow = json.dumps({**json.loads(header), "flow_id": f"flow-{i:03}"}).encode()
        (tmp_path / f"r{i:03}.jsonl").write_bytes(flow + b"\n" + rest)
    process = subprocess.Popen([str(STREAMTAP), "report", "--json", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(10)
    process.stdout.close()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 141, (process.returncode, err)
    whole = streamtap("report", "--json", tmp_path)
    assert whole.returncode == 1 and len(whole.stdout) > 128 * 1024  # more than a pipe holds: the case above


def test_a_recording_never_renamed_is_listed_with_its_verdict_and_why_it_is_not_whole(tmp_path):
    partial = tmp_path / "20261130T000000.000Z_anthropic_abcdefabcdef.partial.jsonl"
    shutil.copy(RECORDINGS / "anthropic.jsonl", partial)
    html = tmp_path / "report.html"
    got = streamtap("report", "--html", html, partial)
    assert got.returncode == 1, got.stderr
    listed = got.stdout.split("not complete (1):")[1]
    assert "complete (" in listed and "recording: never finished" in listed, got.stdout
    assert "never finished" in html.read_text()


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


def test_no_verb_writes_its_output_over_a_recording(tmp_path):
    """`report --html` and `sweep --json` name a file to write: a recording (an input of the same
    run or any other) is refused, one line, and left as it was."""
    recording = tmp_path / "a.jsonl"
    shutil.copy(RECORDINGS / "anthropic.jsonl", recording)
    before = recording.read_bytes()
    for verb, *args in (("report", "--html", recording, tmp_path), ("sweep", recording, "--positions", "event=1", "--json", recording, "--", "true")):
        got = streamtap(verb, *args)
        one_line_error(got, verb)
        assert "is a recording" in got.stderr and recording.read_bytes() == before, got.stderr
    html = tmp_path / "report.html"
    assert streamtap("report", "--html", html, tmp_path).returncode == 0 and html.read_text().startswith("<!doctype html>")


def test_a_recording_the_readers_take_is_never_written_over(tmp_path):
    """Not only as the writer formats one: re-serialized with spaces (verify judges it), or named
    as the proxy names recordings with its header line lost (report lists it as damaged)."""
    lines = (RECORDINGS / "openai-chat.jsonl").read_text().splitlines()
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text("\n".join(json.dumps(json.loads(line)) for line in lines) + "\n")
    assert streamtap("verify", spaced).returncode == 0  # a recording to the readers
    headless = tmp_path / "20261130T000000.000Z_openai-chat_complete_abcdefabcdef.jsonl"
    headless.write_text("\n".join(lines[1:]) + "\n")
    assert "header line is missing" in streamtap("report", headless).stdout  # listed as damaged
    for recording in (spaced, headless):
        before = recording.read_bytes()
        got = streamtap("report", "--html", recording, RECORDINGS / "anthropic.jsonl")
        one_line_error(got, "report")
        assert "is a recording" in got.stderr and recording.read_bytes() == before, got.stderr


def test_a_compressed_recording_of_any_name_is_never_written_over(tmp_path):
    """A zstd recording renamed (backup.zst) is not read as one, but it is one: `report --html
    backup.zst` wrote its page over it. A zstd file that holds no recording is written as asked."""
    import zstandard

    backup = tmp_path / "backup.zst"
    backup.write_bytes(zstandard.ZstdCompressor().compress((RECORDINGS / "openai-chat.jsonl").read_bytes()))
    before = backup.read_bytes()
    for verb, *args in (("report", "--html", backup, RECORDINGS), ("sweep", RECORDINGS / "openai-chat.jsonl", "--json", backup, "--", "true")):
        got = streamtap(verb, *args)
        one_line_error(got, verb)
        assert "is a recording" in got.stderr and backup.read_bytes() == before, got.stderr
    other = tmp_path / "notes.zst"
    other.write_bytes(zstandard.ZstdCompressor().compress(b'{"note": "not a recording"}\n'))
    assert streamtap("report", "--html", other, RECORDINGS).returncode == 0 and other.read_text().startswith("<!doctype html>")


def test_serve_says_what_a_swap_tail_recording_is_when_it_is_no_file(tmp_path):
    """It said "no recording 'X'" of a fifo, a folder or a device named X that is there."""
    fifo, folder = tmp_path / "tail.jsonl", tmp_path / "tails"
    os.mkfifo(fifo)
    folder.mkdir()
    for named, what in ((fifo, "a fifo"), (folder, "a folder"), (Path("/dev/null"), "a device")):
        got = streamtap("serve", "--fault", f"swap-tail:with={named}", RECORDINGS / "openai-chat.jsonl", timeout=30)
        one_line_error(got, "serve")
        assert f"{named}: {what}, not a recording file" in got.stderr and "no recording" not in got.stderr, got.stderr


@pytest.mark.parametrize("argv", [("verify", ""), ("show", ""), ("report", ""), ("report", "--html", "", "RECORDINGS"),
                                  ("index", "--out", "OUT", ""), ("serve", ""), ("import", ""), ("sweep", "", "--", "true"),
                                  ("sweep", "RECORDING", "--json", "", "--", "true"), ("import", "CAPTURE", "--out", ""),
                                  ("demo", "--dir", "")])
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(tmp_path, argv):
    """An unset shell variable gives "": searched, served or written, it would be the current folder."""
    names = {"RECORDINGS": RECORDINGS, "OUT": tmp_path / "index", "RECORDING": RECORDINGS / "openai-chat.jsonl",
             "CAPTURE": tmp_path / "capture.mitm"}
    got = streamtap(*[names.get(arg, arg) for arg in argv], cwd=tmp_path, timeout=30)
    assert got.returncode == 2 and "an empty name" in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert not list(tmp_path.iterdir())


def test_usage_mistakes_name_what_is_wrong(tmp_path):
    one_line_error(got := streamtap("index", "--out", "", RECORDINGS), "index")
    assert "empty name" in got.stderr and not list(tmp_path.iterdir())
    one_line_error(got := streamtap("sweep", RECORDINGS / "openai-chat.jsonl", "--jobs", "-1", "--", "true"), "sweep")
    assert "--jobs must be 0" in got.stderr and "--timeout" not in got.stderr, got.stderr
    fifo = tmp_path / "b.jsonl"
    os.mkfifo(fifo)
    one_line_error(got := streamtap("serve", fifo, timeout=10), "serve")
    assert "not a regular file" in got.stderr, got.stderr
    assert '"$(streamtap addon)"' in streamtap("import", "--help").stdout  # the addon's path wherever streamtap is installed
    assert "130 interrupted" in streamtap("--help").stdout


INTERRUPTED_WHILE_LOADING = """
import os, signal, sys, time
import streamtap.cli as cli
real = cli.build_parser
def build_parser(*args):  # Ctrl-C while the verb's modules load
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.3)
    return real(*args)
cli.build_parser = build_parser
sys.exit(cli.main(["verify", sys.argv[1]]))
"""

# each program below defines run(args), the verb "slow", which this runs through cli.main
RUN_AS_A_VERB = """
verb = types.ModuleType("slow_verb")
verb.configure, verb.run = (lambda parser: None), run
sys.modules["slow_verb"] = verb
cli.VERBS["slow"] = ("slow_verb", "a long query")
sys.exit(cli.main(["slow"]))
"""

# DuckDB turns a Ctrl-C during a query into an exception of its own when it notices it (on a
# terminal, and not every time: a test cannot wait on that), and so does an interrupt() of the
# query, which it always honours: the same error reaches the CLI either way.
INTERRUPTED_IN_A_QUERY = """
import sys, threading, types
import duckdb
import streamtap.cli as cli
def run(args):  # a query interrupted, as in report and index
    con = duckdb.connect()
    threading.Timer(0.3, con.interrupt).start()
    con.execute("SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3").fetchall()
    return 0
""" + RUN_AS_A_VERB

# A real Ctrl-C (SIGINT) during a query: report and index run theirs under queries_stop_on_ctrl_c,
# whose watcher interrupts the query at once (the query alone runs for minutes).
CTRL_C_IN_A_QUERY = """
import os, signal, sys, threading, types
import streamtap.cli as cli
from streamtap.recording import fleet
def run(args):
    with cli.queries_stop_on_ctrl_c():
        con = fleet.connect()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        con.execute("SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3").fetchall()
    return 0
""" + RUN_AS_A_VERB


def on_a_terminal(args: list[str], timeout: float = 60) -> tuple[int | None, str]:
    """Run ``args`` with a terminal for its stdin, stdout and stderr, where a Ctrl-C comes from
    (DuckDB looks for one during a query only there); its exit code and everything it wrote."""
    master, slave = pty.openpty()
    process = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout
    try:
        while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child is gone, and the terminal with it
                break
            if not chunk:
                break
            output += chunk
        else:
            process.kill()
        process.wait(timeout=10)
    finally:
        os.close(master)
    return process.returncode, output.decode(errors="replace")


def test_ctrl_c_while_a_verb_loads_or_while_duckdb_queries_exits_130_without_a_traceback():
    for code in (INTERRUPTED_WHILE_LOADING, INTERRUPTED_IN_A_QUERY, CTRL_C_IN_A_QUERY):
        returncode, output = on_a_terminal([sys.executable, "-c", code, str(RECORDINGS)], timeout=30)
        assert returncode == 130 and "Traceback" not in output, (returncode, output)


# DuckDB looks for a pending Ctrl-C itself during a query, most of the time (of six SIGINTs sent
# to queries here, one went unnoticed for 8 s and more). Run in another thread, where Python never
# tells it, the query is stopped only by the watcher: what it does, seen alone.
WATCHER_ALONE = """
import os, signal, sys, threading, time
signal.signal(signal.SIGINT, lambda *_: None)  # the main thread takes the signal and goes on
import streamtap.cli as cli
from streamtap.recording import fleet
outcome = []
def query(con):
    try:
        con.execute("SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 3").fetchall()
        outcome.append("finished")
    except Exception as exc:
        outcome.append(type(exc).__name__)
with cli.queries_stop_on_ctrl_c():
    worker = threading.Thread(target=query, args=(fleet.connect(),), daemon=True)
    worker.start()
    time.sleep(0.5)
    started = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)
    worker.join(20)
print(outcome, round(time.monotonic() - started, 1))
"""


def test_ctrl_c_reaches_a_query_that_duckdb_would_not_stop():
    got = subprocess.run([sys.executable, "-c", WATCHER_ALONE], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    outcome, seconds = got.stdout.strip().splitlines()[-1].rsplit(" ", 1)  # after any progress bar
    assert outcome == "['InterruptException']" and float(seconds) < 5, got.stdout


def test_a_raw_body_whose_first_event_is_larger_than_the_sniffed_start_is_still_recognised(tmp_path):
    """An image-generating Gemini model's first chunk can be megabytes: the dialect is in it."""
    image = {"inlineData": {"mimeType": "image/png", "data": "A" * (1_500_000)}}
    first = {"candidates": [{"content": {"parts": [image], "role": "model"}}], "responseId": "r1"}
    last = {"candidates": [{"content": {"parts": [{"text": "Here it is."}], "role": "model"}, "finishReason": "STOP"}],
            "responseId": "r1", "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 7}}
    body = tmp_path / "image.sse"
    body.write_bytes(b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in (first, last)))
    got = streamtap("verify", body)
    assert got.returncode == 0 and ": complete (gemini, sniffed" in got.stdout, (got.stdout, got.stderr)


def test_a_cut_or_damaged_recording_is_never_given_the_verdict_its_held_bytes_read_as(tmp_path):
    """Cut right after the terminal frame (a proxy killed before its end line), or with a frame's
    byte changed: the bytes held read as complete, yet they are not the stream that came."""
    lines = (RECORDINGS / "anthropic.jsonl").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]))  # every frame, the end line lost
    changed = tmp_path / "changed.jsonl"
    frame = json.loads(lines[3])
    frame["raw"] = frame["raw"].replace("wants", "WANTS")  # a thinking delta's text
    changed.write_text("".join(lines[:3] + [json.dumps(frame) + "\n"] + lines[4:]))
    for path, said in ((cut, "no end line"), (changed, "sum")):
        got = streamtap("verify", path)
        assert got.returncode == 1 and f"{path}: unknown (anthropic) the recording is cut or damaged" in got.stdout, got.stdout
        assert said in got.stdout and "read as complete" in got.stdout, got.stdout
        shown = streamtap("show", path)
        assert "verdict   UNKNOWN" in shown.stdout and "COMPLETE" not in shown.stdout, shown.stdout
    whole = streamtap("verify", RECORDINGS / "anthropic.jsonl")
    assert whole.returncode == 0 and ": complete (anthropic)" in whole.stdout  # the control


@pytest.mark.parametrize("damage", ["first byte lost", "first bytes zeroed", "cut inside the header"])
def test_a_recording_under_another_name_with_its_header_damaged_is_a_damaged_recording(tmp_path, damage):
    """Never a raw body: its first line still names the format, or begins as every header does."""
    data = (RECORDINGS / "anthropic.jsonl").read_bytes()
    damaged = {"first byte lost": data[1:], "first bytes zeroed": b"\0" * 16 + data[16:], "cut inside the header": data[:30]}[damage]
    path = tmp_path / "rec.jsonl"
    path.write_bytes(damaged)
    got = streamtap("verify", path)
    out = got.stdout + got.stderr
    assert got.returncode in (1, 2) and "recording" in out and "raw" not in out and "sniffed" not in out, out


def test_demo_into_a_folder_it_cannot_write_says_so_at_once(tmp_path):
    """It went on for 45 s of failed calls and ended in a verify usage error."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    command = [str(STREAMTAP), "demo", "--dir", str(folder)]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: a folder's permissions cannot be made to bind")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]
    started = time.monotonic()
    got = subprocess.run(command, capture_output=True, text=True, timeout=60)
    one_line_error(got, "demo")
    assert "Permission denied" in got.stderr and time.monotonic() - started < 15, got.stderr


def test_a_recording_whose_frame_times_go_back_is_damaged(tmp_path):
    """Replay paces by the frames' times, and a stall shows only in them: a time edited back is
    no recording of a stream that came."""
    lines = (RECORDINGS / "openai-chat.jsonl").read_text().splitlines(keepends=True)
    frame = json.loads(lines[4])
    assert frame["type"] == "frame" and frame["t"] > 0
    frame["t"] = 0
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(lines[:4] + [json.dumps(frame) + "\n"] + lines[5:]))
    got = streamtap("verify", edited)
    assert got.returncode == 1 and ": unknown (openai-chat)" in got.stdout and "arrival time 0 ms is before" in got.stdout, got.stdout


# Ctrl-C while DuckDB imports a module by itself (zoneinfo, for a query's first timestamp): DuckDB
# fails the query with an error of its own, which quotes the KeyboardInterrupt's traceback.
CTRL_C_IN_AN_IMPORT_DUCKDB_MAKES = """
import sys, types
import duckdb
import streamtap.cli as cli
class CtrlCInZoneinfo:
    def find_spec(self, name, path=None, target=None):
        if name == "zoneinfo":
            raise KeyboardInterrupt
sys.modules.pop("zoneinfo", None)
sys.meta_path.insert(0, CtrlCInZoneinfo())
def run(args):
    duckdb.connect().execute("SELECT TIMESTAMPTZ '2026-11-30 12:00:00+00'").fetchone()
    return 0
""" + RUN_AS_A_VERB


def test_ctrl_c_while_duckdb_imports_a_module_itself_exits_130_without_a_traceback():
    got = subprocess.run([sys.executable, "-c", CTRL_C_IN_AN_IMPORT_DUCKDB_MAKES], capture_output=True, text=True, timeout=60)
    assert got.returncode == 130 and "Traceback" not in got.stderr, (got.returncode, got.stderr)
    from streamtap import cli
    import duckdb

    quoting = duckdb.InvalidInputException("Conversion Error: could not convert 'KeyboardInterrupt' to a date")
    assert not cli._interrupted(quoting)  # recorded text that names it is no Ctrl-C


# Every module each import brings in, whether Ctrl-C (SIGINT) was held meanwhile, and whether the
# main thread imported it; then the code given, in a fresh interpreter (no DuckDB loaded yet).
IMPORTS_SEEN = """
import json, signal, sys, threading
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        held = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        seen.append((name, held, threading.current_thread() is threading.main_thread()))
sys.meta_path.insert(0, Watch())
try:
    exec(sys.argv[1])
finally:
    print(json.dumps(seen))
"""


def imports_seen(code: str, *args) -> list[tuple[str, bool, bool]]:
    got = subprocess.run([sys.executable, "-c", IMPORTS_SEEN, code, *map(str, args)], capture_output=True, text=True, timeout=60)
    return [tuple(item) for item in json.loads(got.stdout.strip().splitlines()[-1])]


# C extensions (and the module DuckDB imports by itself) that an interrupt while they set
# themselves up can crash: nanobind aborts on an interrupted DuckDB import, or on a second one
DELICATE = {"duckdb", "_duckdb", "zoneinfo", "zstandard", "orjson"}


def test_report_and_index_load_duckdb_with_ctrl_c_held_and_the_watcher_imports_nothing(tmp_path):
    for verb in (["report", RECORDINGS], ["index", RECORDINGS, "--out", tmp_path / "idx"]):
        code = f"from streamtap.cli import main; main({list(map(str, verb))!r})"
        seen = imports_seen(code)
        assert {name for name, _, _ in seen} >= {"duckdb", "zoneinfo"}, seen
        assert [(name, held) for name, held, _ in seen if name in DELICATE and not held] == [], verb
    # Ctrl-C in the interruptible section: the watcher interrupts the queries, importing nothing
    code = """
import os, signal, time
import streamtap.cli as cli
try:
    with cli.queries_stop_on_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
except KeyboardInterrupt:
    pass
"""
    seen = imports_seen(code)
    assert "streamtap.recording.fleet" in {name for name, _, _ in seen}
    assert [name for name, _, main_thread in seen if not main_thread] == [], seen


DEMO = Path(streamtap_package.__file__).parent / "data" / "demo"
DEMO_TABLE_ROW = "03_anthropic-cut_truncated.jsonl: truncated"  # a line of report's table for DEMO


def test_an_html_page_to_a_pipe_or_to_the_file_stdout_writes_is_written_there(tmp_path):
    """`report --html /dev/stdout | wc -c` and `--html >(wc -c)`: a pipe's /dev/stdout leads to no
    file (pipe:[N]), and the page was never made (No such file or directory). `--html /dev/stdout
    > out.txt`: the file the shell opened was renamed over, and the table that follows lost."""
    piped = streamtap("report", "--html", "/dev/stdout", DEMO)
    assert piped.returncode == 1 and piped.stdout.startswith("<!doctype html>"), piped.stderr
    assert piped.stdout.index("</html>") < piped.stdout.index(DEMO_TABLE_ROW), piped.stdout[-400:]
    read_end, write_end = os.pipe()  # a process substitution: a pipe of its own, named /dev/fd/N
    with os.fdopen(read_end, "rb") as reader:
        process = subprocess.Popen([str(STREAMTAP), "report", "--html", f"/dev/fd/{write_end}", DEMO], pass_fds=(write_end,),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(write_end)
        page = reader.read()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and page.startswith(b"<!doctype html>") and page.rstrip().endswith(b"</html>"), err
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        redirected = subprocess.run([str(STREAMTAP), "report", "--html", "/dev/stdout", DEMO], stdout=stdout,
                                    stderr=subprocess.PIPE, text=True, timeout=60)
        opened = os.fstat(stdout.fileno())
    written = out.read_text()
    assert redirected.returncode == 1 and os.path.samestat(opened, out.stat()), redirected.stderr  # not renamed over
    assert written.startswith("<!doctype html>") and written.index("</html>") < written.index(DEMO_TABLE_ROW), written[-400:]


def test_an_html_page_to_dash_is_printed_instead_of_the_table_as_sweeps_json_is(tmp_path):
    """`--html -` wrote a file named "-" in the working folder, where `sweep --json -` prints."""
    printed = streamtap("report", "--html", "-", DEMO, cwd=tmp_path)
    assert printed.returncode == 1, printed.stderr
    assert printed.stdout.startswith("<!doctype html>") and printed.stdout.rstrip().endswith("</html>")
    assert DEMO_TABLE_ROW not in printed.stdout and list(tmp_path.iterdir()) == []
    for other in ("--json", "--csv"):
        refused = streamtap("report", "--html", "-", other, DEMO, cwd=tmp_path)
        one_line_error(refused, "report")
        assert refused.returncode == 2 and f"--html - prints the page, and {other} prints to stdout too" in refused.stderr
        assert refused.stdout == "" and list(tmp_path.iterdir()) == []


def test_an_html_page_over_another_users_file_open_to_all_in_a_sticky_folder_is_written(tmp_path):
    """/tmp: the temporary file is made, but only the owner may rename over that user's file
    (EPERM), where writing it in place, as 0.x did, is allowed."""
    from test_fleet_edges import unprivileged

    if os.geteuid() != 0:
        pytest.skip("another user's file cannot be made without root (chown)")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    shared = sticky / "shared.html"
    shared.write_text("another user's page\n")
    shared.chmod(0o666)
    os.chown(shared, 65534, 65534)
    os.chown(sticky, 65534, 65534)  # the folder's owner may rename over any file in it, as root owns /tmp
    got = subprocess.run(unprivileged("report", "--html", shared, DEMO), capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got.stderr
    assert shared.read_text().startswith("<!doctype html>") and shared.stat().st_uid == 65534
    assert [path.name for path in sticky.iterdir()] == ["shared.html"]  # no temporary file left


def test_an_html_page_over_a_read_only_file_is_refused_as_before(tmp_path):
    """A 0444 file in a folder that may be written: the rename would replace it where opening it
    for writing is refused (as Path.write_text did, and as the shell's `>` does)."""
    from test_fleet_edges import unprivileged

    page = tmp_path / "page.html"
    page.write_text("kept\n")
    page.chmod(0o444)
    got = subprocess.run(unprivileged("report", "--html", page, DEMO), capture_output=True, text=True, timeout=60)
    one_line_error(got, "report")
    assert f"--html {page}: Permission denied; the page was not written" in got.stderr, got.stderr
    assert page.read_text() == "kept\n" and stat.S_IMODE(page.stat().st_mode) == 0o444


def test_every_verb_s_help_names_the_exit_codes_every_verb_has():
    """serve left out 129 and 141, import, report and index listed only 0/1/2, demo only 0 and addon 0/141."""
    from streamtap.cli import VERBS

    for verb in VERBS:
        said = " ".join(streamtap(verb, "--help").stdout.split())
        for code in ("3 on an internal error", "130 when interrupted", "141 when its output was closed", "143 or 129"):
            assert code in said, (verb, code)
