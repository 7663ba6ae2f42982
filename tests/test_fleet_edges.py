"""`streamtap report` and `index` over folders a user really has: odd files beside the
recordings, damaged or cut ones, values no engine's column takes. One bad file never costs the
report its other rows, never a traceback, and never an exit code that says all is well."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import orjson
import pytest

REPO = Path(__file__).resolve().parents[1]
GOOD = REPO / "recordings" / "anthropic.jsonl"  # a bundled recording, judged complete in its end line
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]


def streamtap(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*STREAMTAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def recording(folder: Path, name: str, *, header: dict | None = None, end: dict | None = None, last: bytes | None = None) -> Path:
    """A copy of the bundled recording judged complete in its end line, with fields of its header
    or end line replaced (dotted keys reach into the end line), or its last line replaced by ``last``."""
    lines = GOOD.read_bytes().splitlines(keepends=True)
    if header:
        lines[0] = orjson.dumps({**orjson.loads(lines[0]), **header}) + b"\n"
    end = {"verdict": {"kind": "complete", "reason": "the model finished"}, **(end or {})}
    if end:
        record = orjson.loads(lines[-1])
        for key, value in end.items():
            target = record
            *parents, leaf = key.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
        lines[-1] = orjson.dumps(record) + b"\n"
    if last is not None:
        lines[-1] = last
    path = folder / name
    path.write_bytes(b"".join(lines))
    return path


def judged(*paths: Path | str) -> dict:
    out = streamtap("report", "--json", *paths)
    assert "Traceback" not in out.stderr, out.stderr
    return {"code": out.returncode, "report": json.loads(out.stdout) if out.stdout else None, "stderr": out.stderr}


@pytest.mark.parametrize(
    "header, end",
    [
        (None, {"turn.usage.output": 1e300}),  # (a fraction's type: verify says so too)
        ({"response": {"status": 10**10}}, None),
        ({"started": 1_796_159_328_715}, None),  # milliseconds: year 58888
        ({"started": -1e12}, None),
    ],
)
def test_a_value_no_column_takes_makes_that_recording_damaged_not_the_report(tmp_path, header, end):
    recording(tmp_path, "good.jsonl")
    bad = recording(tmp_path, "bad.jsonl", header=header, end=end)
    got = judged(tmp_path)
    assert got["code"] == 1, got  # one recording is not judged: not all complete
    report = got["report"]
    assert report["recordings"] == 2 and report["verdicts"] == {"complete": 1}
    [listed] = report["incomplete"]
    # as the row's checks say it, or as verify's reading of the header does
    assert listed["path"] == str(bad) and listed["problem"].startswith(("damaged: its ", "damaged: line 1 is damaged: ")), listed
    index = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert index.returncode == 0 and "Traceback" not in index.stderr, index.stderr
    days = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert all(len(day) == len("day=2026-12-01") for day in days), days  # no day=58888-01-09


@pytest.mark.parametrize("end", [{"turn.usage.input": 2**63}, {"turn.usage.output": 2**64 - 1}], ids=["input", "output"])
def test_a_token_count_no_column_takes_is_left_null_and_the_turn_counts(tmp_path, end):
    """A provider's count past 2^63 (verify passes the recording: nothing in it is damaged) made
    the recording "incomplete (damaged)" in report and index, its complete turn left uncounted."""
    recording(tmp_path, "good.jsonl")
    recording(tmp_path, "odd.jsonl", end=end)
    got = judged(tmp_path)
    assert got["code"] == 0 and got["report"]["verdicts"] == {"complete": 2} and not got["report"]["incomplete"], got
    index = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert index.returncode == 0, index.stderr
    rows = duckdb.sql(f"select verdict, input_tokens, output_tokens, problem from read_parquet('{tmp_path / 'idx'}/**/*.parquet', "
                      "hive_partitioning=true) order by input_tokens nulls first").fetchall()
    assert [row[0] for row in rows] == ["complete", "complete"] and all(row[3] is None for row in rows), rows
    column = 1 if "turn.usage.input" in end else 2
    assert sorted(row[column] is None for row in rows) == [False, True], rows


def test_damaged_cut_and_unjudged_recordings_in_a_folder_make_the_report_say_not_complete(tmp_path):
    recording(tmp_path, "good.jsonl")
    recording(tmp_path, "damaged.jsonl", last=b"[1, 2, 3]\n")  # a whole last line that is no end line object
    recording(tmp_path, "newer.jsonl", header={"format": "streamtap-recording/3"})
    (tmp_path / "killed.partial.jsonl").write_bytes(GOOD.read_bytes()[:40])  # cut inside its header
    (tmp_path / "never-began.partial.jsonl").write_bytes(b"")
    recording(tmp_path, "unjudged.jsonl", end={"verdict": None})
    (tmp_path / "notes.jsonl").write_text('{"a": 1}\n')  # some other program's JSON lines: not a recording
    got = judged(tmp_path)
    assert got["code"] == 1
    report = got["report"]
    assert report["recordings"] == 6 and report["verdicts"] == {"complete": 1}
    problems = {Path(item["path"]).name: item["problem"] for item in report["incomplete"]}
    assert problems["damaged.jsonl"].startswith("damaged: the last line")
    assert problems["newer.jsonl"] == "damaged: the recording is streamtap-recording/3, this streamtap reads streamtap-recording/1 and streamtap-recording/2"
    assert problems["killed.partial.jsonl"].startswith("recording incomplete at byte")
    assert problems["never-began.partial.jsonl"].startswith("recording incomplete at byte 0")
    assert "notes.jsonl" not in problems and "skipped 1 file(s)" in got["stderr"]
    recording(tmp_path, "only.jsonl")
    for name in ("damaged.jsonl", "newer.jsonl", "killed.partial.jsonl", "never-began.partial.jsonl", "unjudged.jsonl", "notes.jsonl"):
        (tmp_path / name).unlink()
    assert judged(tmp_path)["code"] == 0  # every recording complete


def test_a_recording_whose_header_is_damaged_or_lost_is_listed_as_damaged_as_verify_says(tmp_path):
    """Not skipped as another program's file: a damaged recording makes the report say not complete."""
    lines = GOOD.read_bytes().splitlines(keepends=True)
    (tmp_path / "lost.jsonl").write_bytes(b"".join(lines[1:]))  # its first line is a frame line
    (tmp_path / "flipped.jsonl").write_bytes(lines[0].replace(b'"type":"header"', b'"type":"heXder"') + b"".join(lines[1:]))
    (tmp_path / "broken.jsonl").write_bytes(lines[0][:-2] + b" x\n" + b"".join(lines[1:]))  # no longer JSON
    (tmp_path / "20261130T050000.000Z_anthropic_complete_bbbbbbbbbbbb.jsonl").write_bytes(b'{"a": 1}\n' + b"".join(lines[1:]))
    recording(tmp_path, "good.jsonl")
    (tmp_path / "notes.jsonl").write_text('{"type": "frame", "seq": 1}\n')  # another program's: no recording's line
    got = judged(tmp_path)
    assert got["code"] == 1, got
    problems = {Path(item["path"]).name: item["problem"] for item in got["report"]["incomplete"]}
    assert problems == {
        "lost.jsonl": "damaged: line 1 is a frame line: the recording's header line is missing",
        "flipped.jsonl": "damaged: line 1 is a damaged recording header (not a JSON object of the format's fields)",
        "broken.jsonl": "damaged: line 1 is a damaged recording header (not a JSON object of the format's fields)",
        "20261130T050000.000Z_anthropic_complete_bbbbbbbbbbbb.jsonl": "damaged: line 1 is not a recording header",
    }
    assert "skipped 1 file(s)" in got["stderr"] and "notes.jsonl" in got["stderr"], got["stderr"]
    verified = streamtap("verify", tmp_path / "lost.jsonl", tmp_path / "flipped.jsonl", tmp_path / "good.jsonl")
    assert verified.returncode == 2 and "good.jsonl: complete" in verified.stdout, verified
    assert "lost.jsonl: cannot read recording: line 1 is a frame line" in verified.stderr, verified.stderr
    assert "flipped.jsonl: cannot read recording: line 1 is a damaged recording header" in verified.stderr
    index = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert index.returncode == 0, index.stderr
    assert judged(tmp_path / "idx")["report"]["incomplete_files"] == 4


def test_an_index_written_into_a_folder_of_recordings_hides_none_of_them(tmp_path):
    """`index DIR/live --out DIR`, then more recordings in DIR: `report DIR` counts the index's
    rows and the recordings it does not hold, each once."""
    (tmp_path / "live").mkdir()
    recording(tmp_path / "live", "indexed.jsonl")
    index = streamtap("index", tmp_path / "live", "--out", tmp_path)
    assert index.returncode == 0, index.stderr
    assert judged(tmp_path)["report"]["recordings"] == 1
    recording(tmp_path, "later.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    got = judged(tmp_path)
    assert got["code"] == 1 and got["report"]["recordings"] == 2, got
    assert got["report"]["verdicts"] == {"complete": 1, "truncated": 1}


def test_a_model_name_with_a_newline_or_an_escape_keeps_the_text_table_whole(tmp_path):
    recording(tmp_path, "odd.jsonl", end={"turn.model": "gpt\nnew\x1b[31m", "verdict": {"kind": "truncated", "reason": "cut\rhere"}})
    table = streamtap("report", tmp_path)
    assert table.returncode == 1 and "\x1b" not in table.stdout and "\r" not in table.stdout, repr(table.stdout)
    assert "anthropic gpt\\nnew\\x1b[31m" in table.stdout and "truncated: cut\\rhere" in table.stdout, table.stdout
    as_json = json.loads(streamtap("report", "--json", tmp_path).stdout)
    assert as_json["by_model"][0]["model"] == "gpt\nnew\x1b[31m"  # the data itself is kept as it is


def test_an_escaped_model_name_keeps_its_row_under_the_headings(tmp_path):
    """The table measures its columns on the text it shows: a right-to-left override is written as
    six characters (\\u202e), and the row's figures stay under their headings."""
    recording(tmp_path, "plain.jsonl", end={"turn.model": "gpt-4.1-mini"})
    recording(tmp_path, "rtl.jsonl", end={"turn.model": "gpt\u202eevil"})
    lines = streamtap("report", tmp_path).stdout.splitlines()
    header = next(line for line in lines if line.startswith("provider model"))
    rows = [line for line in lines[lines.index(header) + 1 :] if line.startswith("anthropic ")][:2]
    assert len(rows) == 2 and any("\\u202e" in row for row in rows), lines
    end = header.index("recordings") + len("recordings")  # each row holds one recording, right-aligned under it
    assert all(row[end - 2 : end] == " 1" for row in rows), [header, *rows]


def test_the_html_page_never_says_every_turn_is_complete_when_none_was_judged(tmp_path):
    lines = GOOD.read_bytes().splitlines(keepends=True)
    (tmp_path / "recs").mkdir()
    (tmp_path / "recs" / "killed.jsonl").write_bytes(b"".join(lines[:4]))  # no end line: no verdict
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path / "recs").returncode == 1
    assert "No turn was judged" in page.read_text() and "is complete." not in page.read_text()
    recording(tmp_path / "recs", "good.jsonl")
    assert streamtap("report", "--html", page, tmp_path / "recs").returncode == 1
    assert "Every judged turn is complete, but not every recording was judged: 1 recording(s) read were not judged" in page.read_text()


def test_the_html_page_shows_recorded_names_as_the_table_does_and_its_axis_where_its_lines_are(tmp_path):
    """A right-to-left override made a model's name read as another's on the page (the table
    writes it \\u202e); a long name pushed every row's figures off screen; the TTFT axis's middle
    line, at half of one turn, was labelled 0."""
    recording(tmp_path, "rtl.jsonl", end={"turn.model": "\u202eonan-1.4-tpg"})
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path).returncode == 0
    html = page.read_text()
    assert "\u202e" not in html and "\\u202eonan-1.4-tpg" in html
    assert "overflow-wrap:anywhere" in html
    ttft = html[html.index('aria-label="TTFT distribution"'):]
    assert re.findall(r'text-anchor="end">([^<]*)<', ttft)[:3] == ["0", "0.5", "1"]


def _css_rules(html: str) -> dict[str, str]:
    """The page's style: each selector (of a comma list) to its declarations, joined."""
    style = html[html.index("<style>") + len("<style>") : html.index("</style>")]
    rules: dict[str, str] = {}
    for selectors, declarations in re.findall(r"([^{}]+)\{([^{}]*)\}", style):
        for selector in selectors.split(","):
            rules[selector.strip()] = rules.get(selector.strip(), "") + declarations + ";"
    return rules


def test_the_html_page_fits_a_phone_and_a_long_unbroken_reason_wraps_in_its_column(tmp_path):
    """The page had no viewport (a phone drew it 980 px wide and shrank it) and charts of a fixed
    640 px; the first column broke anywhere with no least width, so the table squeezed it to one
    character a line while a reason without a space (a URL, base64) pushed the table thousands
    of pixels past the page, right-aligned: its start was off screen."""
    reason = "stream error: Invalid signature " + "QUJD" * 100
    recording(tmp_path, "cut.jsonl", end={"verdict": {"kind": "errored", "reason": reason}})
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path).returncode == 1
    html = page.read_text()
    rules = _css_rules(html)
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    svgs = re.findall(r"<svg [^>]*>", html)
    assert len(svgs) == 2 and all(re.search(r'width="(\d+)" height="(\d+)" viewBox="0 0 \1 \2"', svg) for svg in svgs), svgs
    assert "max-width:100%" in rules["svg"] and "height:auto" in rules["svg"]
    # a cell that may break anywhere keeps a least width, or the table squeezes it to a character
    breaking = [selector for selector, declarations in rules.items() if "overflow-wrap:anywhere" in declarations]
    assert breaking and all("min-width:" in rules[selector] for selector in breaking if selector not in ("h3", ".legend span")), rules
    # every table scrolls in its own box, never the page
    assert html.count("<table>") == html.count('<div class="scroll"><table>') > 0 and "overflow-x:auto" in rules[".scroll"]
    # the reason, and the path, are left-aligned text that wraps
    not_complete = html[html.index("<h2>Not complete") :]
    why = re.search(r'<td class="([^"]+)">' + re.escape(reason) + "</td>", not_complete)
    path = re.search(r'<td class="([^"]+)">[^<]*cut\.jsonl</td>', not_complete)
    for cell in (why, path):
        assert cell and "text" in cell[1].split(), not_complete
    assert "text-align:left" in rules[".text"] and "overflow-wrap:anywhere" in rules[".text"]


def test_the_html_page_keeps_apart_names_that_differ_by_a_newline_or_a_tab(tmp_path):
    """A newline or a tab in a model name or reason was written raw: HTML shows it as a space,
    so "gpt-4.1\\nnano" and "gpt-4.1 nano" were two rows that read the same. The table writes
    them ``\\n``; so does the page."""
    recording(tmp_path, "a.jsonl", end={"turn.model": "gpt-4.1 nano"})
    recording(tmp_path, "b.jsonl", end={"turn.model": "gpt-4.1\nnano", "verdict": {"kind": "truncated", "reason": "cut:\nno [DONE]"}})
    recording(tmp_path, "c.jsonl", end={"turn.model": "gpt-4.1\tnano"})
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path).returncode == 1
    html = page.read_text()
    by_model = html[html.index("<h2>By model</h2>") : html.index("<h2>By day</h2>")]
    names = [" ".join(cell.split()) for cell in re.findall(r"<tr><td[^>]*>([^<]*)</td>", by_model)]  # as a browser shows them
    assert sorted(names) == ["anthropic gpt-4.1 nano", "anthropic gpt-4.1\\nnano", "anthropic gpt-4.1\\tnano"], names
    assert "cut:\\nno [DONE]" in html and "\t" not in html
    assert "anthropic gpt-4.1\\nnano" in streamtap("report", tmp_path).stdout  # as the table writes it


def test_a_recording_cut_inside_its_header_is_listed_as_incomplete_as_verify_says(tmp_path):
    """A finished recording (plain or compressed) cut inside its header line is a recording cut,
    not another program's file: report and index list it as incomplete, as verify judges it."""
    import zstandard

    whole = recording(tmp_path, "whole.jsonl").read_bytes()
    header_end = whole.index(b"\n")
    named = tmp_path / "20261130T050000.000Z_anthropic_complete_bbbbbbbbbbbb.jsonl"  # how the writer names a finished one
    named.write_bytes(whole[: header_end // 2])
    compressed = tmp_path / "20261130T050001.000Z_anthropic_complete_cccccccccccc.jsonl.zst"
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(whole)
    compressed.write_bytes(frame[: len(frame) // 2])  # inside its one block: no line decodes
    copied = tmp_path / "copied.jsonl"  # not so named, but it begins as a recording's header
    copied.write_bytes(whole[: whole.index(b'"streamtap-recording/') + 40])
    (tmp_path / "notes.jsonl").write_text('{"a": 1, "b"')  # another program's line, cut: still no recording
    got = judged(tmp_path)
    assert got["code"] == 1, got
    problems = {Path(item["path"]).name: item["problem"] for item in got["report"]["incomplete"]}
    assert problems == {
        named.name: "recording incomplete at byte 0: the header line is cut",
        compressed.name: "recording incomplete at byte 0: the zstd stream ends before its first line decodes",
        copied.name: "recording incomplete at byte 0: the header line is cut",
    }
    assert got["report"]["recordings"] == 4 and "skipped 1 file(s)" in got["stderr"] and "notes.jsonl" in got["stderr"]
    verified = streamtap("verify", named, compressed, copied)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    for name, problem in problems.items():
        assert f"{name}: unknown" in verified.stdout and f"(recording: {problem})" in verified.stdout, verified.stdout
    index = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert index.returncode == 0 and "4 new recording(s) indexed" in index.stderr, index.stderr
    rows = {Path(path).name: (complete, problem) for path, complete, problem in
            duckdb.sql(f"SELECT path, file_complete, problem FROM read_parquet('{tmp_path}/idx/**/*.parquet')").fetchall()}
    assert {name: rows[name] for name in problems} == {name: (False, problem) for name, problem in problems.items()}


def test_a_partial_recording_with_its_end_line_is_not_complete_unless_its_writer_still_holds_it(tmp_path):
    """A .partial.jsonl that has its end line lost its writer before the rename (its last act):
    verify says it never finished, and report and index agree. One a live writer still holds
    is in progress, and left out."""
    recording(tmp_path, "done.jsonl")
    partial = recording(tmp_path, "20261130T044352.188Z_anthropic_36f20a9a1536.partial.jsonl")
    got = judged(tmp_path)
    assert got["code"] == 1, got
    report = got["report"]
    assert report["recordings"] == 2 and report["incomplete_files"] == 1
    [listed] = report["incomplete"]
    assert listed["path"] == str(partial) and listed["verdict"] == "complete"  # the verdict it holds stands
    verified = streamtap("verify", partial)
    assert verified.returncode == 1 and f"(recording: {listed['problem']})" in verified.stdout, (listed, verified.stdout)
    assert listed["problem"].startswith("never finished: its end line is there")
    index = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert index.returncode == 0, index.stderr
    assert judged(tmp_path / "idx")["report"] == report  # the index keeps it as not whole
    writer = os.open(partial, os.O_RDONLY)
    fcntl.flock(writer, fcntl.LOCK_EX)  # as a live proxy's writer holds its file
    try:
        live = judged(tmp_path)
    finally:
        os.close(writer)
    assert live["code"] == 0 and live["report"]["recordings"] == 1, live
    assert "left out 1 recording(s) a live proxy is still writing" in live["stderr"]


def test_names_and_files_that_are_no_recordings_are_refused_or_skipped_without_a_traceback(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    good = recording(folder, "good.jsonl")
    shutil.copy(good, os.fsencode(folder) + b"/bad\xff\xfename.jsonl")
    os.mkfifo(folder / "fifo.jsonl")
    (folder / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    got = judged(folder)  # the fifo must not hang it (the timeout would raise)
    assert got["code"] == 0 and got["report"]["recordings"] == 1, got
    assert "skipped 3 file(s)" in got["stderr"], got["stderr"]
    for named in (folder / "fifo.jsonl", os.fsencode(folder) + b"/bad\xff\xfename.jsonl"):
        out = subprocess.run([*map(os.fsencode, STREAMTAP), b"report", os.fsencode(named)], capture_output=True, timeout=30)
        assert out.returncode == 2 and b"Traceback" not in out.stderr, out.stderr
    index = streamtap("index", folder, "--out", tmp_path / "idx")
    assert index.returncode == 0 and "1 new recording(s)" in index.stderr, index.stderr


def test_an_index_out_folder_that_cannot_be_or_is_not_an_index_is_a_clear_error(tmp_path):
    recording(tmp_path, "good.jsonl")
    (tmp_path / "afile").write_text("x")
    for out in ("/dev/null/idx", tmp_path / "afile" / "sub"):
        got = streamtap("index", tmp_path / "good.jsonl", "--out", out)
        assert got.returncode == 2 and got.stderr.startswith("streamtap index: --out") and "Traceback" not in got.stderr, got.stderr
    stray = tmp_path / "stray" / "day=2026-01-01" / "provider=x"
    stray.mkdir(parents=True)
    import duckdb

    duckdb.sql(f"COPY (SELECT 1 AS other) TO '{stray / 'data.parquet'}' (FORMAT PARQUET)")
    for args in (("index", tmp_path / "good.jsonl", "--out", tmp_path / "stray"), ("report", tmp_path / "stray")):
        got = streamtap(*args)
        assert got.returncode == 2 and "its Parquet files are not a streamtap index" in got.stderr, got.stderr


def test_an_index_folder_named_with_glob_characters_is_read_as_named(tmp_path):
    """DuckDB reads a path as a glob pattern: an index in idx[1] must not read idx1 (nor fail,
    read as a pattern that matches nothing)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    recording(tmp_path / "a", "one.jsonl")
    recording(tmp_path / "a", "two.jsonl")
    cut = recording(tmp_path / "b", "three.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    assert streamtap("index", tmp_path / "a", "--out", tmp_path / "idx1").returncode == 0
    for out in (tmp_path / "idx[1]", tmp_path / "run[x]", tmp_path / "i?x*{a,b}"):
        first = streamtap("index", tmp_path / "b", "--out", out)
        assert first.returncode == 0 and "1 new recording(s) indexed" in first.stderr, first.stderr
        again = streamtap("index", tmp_path / "b", "--out", out)
        assert again.returncode == 0 and "0 new recording(s) indexed, 1 already in" in again.stderr, again.stderr
        got = judged(out)
        assert got["code"] == 1 and got["report"]["recordings"] == 1, got
        assert [item["path"] for item in got["report"]["incomplete"]] == [str(cut)]
    assert judged(tmp_path / "idx1")["report"]["recordings"] == 2


def test_an_index_given_twice_or_two_indexes_of_the_same_recordings_count_each_recording_once(tmp_path):
    recordings = tmp_path / "recs"
    recordings.mkdir()
    recording(recordings, "one.jsonl")
    recording(recordings, "two.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    for out in ("idx", "idx2"):
        assert streamtap("index", recordings, "--out", tmp_path / out).returncode == 0
    for args in ((tmp_path / "idx", f"{tmp_path / 'idx'}/"), (tmp_path / "idx", tmp_path / "idx2"),
                 (tmp_path / "idx2", recordings, tmp_path / "idx")):
        got = judged(*args)
        assert got["code"] == 1 and got["report"]["recordings"] == 2, (args, got["report"]["recordings"])
        assert got["report"]["verdicts"] == {"complete": 1, "truncated": 1}
    [written] = (tmp_path / "idx").rglob("*.parquet")  # both rows in one file, as two runs at once once made
    shutil.copy(written, written.with_name("recordings_copy.parquet"))
    assert judged(tmp_path / "idx")["report"]["recordings"] == 2


def test_an_index_inside_the_folder_of_recordings_does_not_hide_them(tmp_path):
    recording(tmp_path, "one.jsonl")
    assert streamtap("index", tmp_path, "--out", tmp_path / "idx").returncode == 0
    recording(tmp_path, "two.jsonl")
    assert judged(tmp_path)["report"]["recordings"] == 2  # the folder is read as recordings, not as the index
    assert judged(tmp_path / "idx")["report"]["recordings"] == 1


def test_a_compressed_recording_cut_in_its_last_frame_checksum_is_not_complete_in_the_report(tmp_path):
    import zstandard

    lines = recording(tmp_path, "plain.jsonl").read_bytes()
    (tmp_path / "plain.jsonl").unlink()
    whole = zstandard.ZstdCompressor(write_checksum=True).compress(lines)
    (tmp_path / "whole.jsonl.zst").write_bytes(whole)
    assert judged(tmp_path)["code"] == 0
    (tmp_path / "whole.jsonl.zst").write_bytes(whole[:-2])  # every line decodes; the checksum is cut
    got = judged(tmp_path)
    assert got["code"] == 1 and got["report"]["incomplete_files"] == 1
    assert got["report"]["incomplete"][0]["problem"].endswith("the zstd stream ends inside a frame")


def test_indexing_a_folder_without_recordings_is_a_usage_error_as_for_report(tmp_path):
    (tmp_path / "none").mkdir()
    (tmp_path / "some").mkdir()
    recording(tmp_path / "some", "one.jsonl")
    assert streamtap("index", tmp_path / "some", "--out", tmp_path / "idx").returncode == 0
    for folder in (tmp_path / "none", tmp_path / "idx"):  # an empty folder; an index given as the input
        got = streamtap("index", folder, "--out", tmp_path / "other")
        assert got.returncode == 2 and got.stderr.startswith("streamtap index: no recordings under"), got.stderr
        assert not (tmp_path / "other").exists()
    again = streamtap("index", tmp_path / "some", "--out", tmp_path / "idx")  # all indexed already: fine
    assert again.returncode == 0 and "0 new recording(s) indexed, 1 already in" in again.stderr, again.stderr


def test_the_bundled_sample_recordings_carry_their_verdicts_as_the_tap_writes_them():
    got = streamtap("report", "--json", REPO / "recordings")
    assert got.returncode == 0, got.stdout + got.stderr
    assert json.loads(got.stdout)["verdicts"] == {"complete": 2}
    verified = streamtap("verify", REPO / "recordings")
    assert verified.returncode == 0 and verified.stdout.count(": complete (") == 2, verified.stdout


def unprivileged(*args) -> list[str]:
    """The command, run so that file permissions bind it even as root (which this CI is)."""
    command = [*STREAMTAP, *map(str, args)]
    if os.geteuid() != 0:
        return command
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: a folder's permissions cannot be made to bind")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]


def test_a_folder_that_cannot_be_read_is_said_and_keeps_report_and_index_from_passing(tmp_path):
    """Its recordings are unknown: report cannot say every recording is complete, nor index that
    it holds them all, and serve does not start without them."""
    recording(tmp_path, "seen.jsonl")
    locked = tmp_path / "locked"
    locked.mkdir()
    recording(locked, "hidden.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    locked.chmod(0)
    try:
        for args in (("report", tmp_path), ("index", tmp_path, "--out", tmp_path.parent / f"{tmp_path.name}-idx"),
                     ("serve", tmp_path)):  # serve refuses at start: a recording a client expects may be in it
            got = subprocess.run(unprivileged(*args), capture_output=True, text=True, timeout=60)
            assert got.returncode == (2 if args[0] == "serve" else 1), (args[0], got.returncode, got.stderr)
            assert f"{locked}: cannot read this folder: Permission denied" in got.stderr, got.stderr
            assert "Traceback" not in got.stderr
    finally:
        locked.chmod(0o700)


def test_a_recording_named_in_a_glob_that_cannot_be_read_costs_the_others_nothing(tmp_path):
    """report/index given `folder/*.jsonl` with another user's 0600 file among them: the run
    stopped with exit 2 and a raw errno line, reporting and indexing nothing."""
    seen = recording(tmp_path, "seen.jsonl")
    hidden = recording(tmp_path, "hidden.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    hidden.chmod(0)
    try:
        for args in (("report", "--json", seen, hidden), ("index", seen, hidden, "--out", tmp_path.parent / f"{tmp_path.name}-idx")):
            got = subprocess.run(unprivileged(*args), capture_output=True, text=True, timeout=60)
            assert got.returncode == 1, (args[0], got.returncode, got.stderr)
            assert f"{hidden}: cannot read this recording: Permission denied" in got.stderr, got.stderr
            assert "Traceback" not in got.stderr and "Errno" not in got.stderr, got.stderr
            if args[0] == "report":
                assert json.loads(got.stdout)["verdicts"] == {"complete": 1}, got.stdout
    finally:
        hidden.chmod(0o600)


def test_a_folder_or_recording_named_behind_a_folder_that_cannot_be_searched_is_said_and_the_run_goes_on(tmp_path):
    """Named on the command line, not found inside another folder: `report good locked` and
    `report good locked/x.jsonl` stopped at the look for an index mark or at the file's existence
    (Permission denied, exit 2, no report), where the same folder found inside another is said
    and the run goes on (exit 1)."""
    good = tmp_path / "good"
    good.mkdir()
    recording(good, "seen.jsonl")
    locked = tmp_path / "locked"
    locked.mkdir()
    hidden = recording(locked, "hidden.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    locked.chmod(0)
    try:
        for named, says in ((locked, f"{locked}: cannot read this folder: Permission denied"),
                            (hidden, f"{hidden}: cannot read this recording: Permission denied")):
            for args in (("report", "--json", good, named), ("index", good, named, "--out", tmp_path / f"idx-{named.name}")):
                got = subprocess.run(unprivileged(*args), capture_output=True, text=True, timeout=60)
                assert got.returncode == 1, (args, got.returncode, got.stderr)
                assert says in got.stderr and "Traceback" not in got.stderr, got.stderr
                if args[0] == "report":
                    assert json.loads(got.stdout)["verdicts"] == {"complete": 1}, got.stdout
                else:
                    assert "1 new recording(s) indexed" in got.stderr, got.stderr
    finally:
        locked.chmod(0o700)


def _file_size_limit(size: int):
    """For preexec_fn: no file written past ``size`` bytes (EFBIG, Python ignores SIGXFSZ), a full
    disk for one process that needs no mount."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_a_page_that_cannot_be_written_keeps_the_table_the_finding_and_the_file_it_would_replace(tmp_path):
    """`report --html` on a full disk: the table was never printed and the exit 2 hid the turns
    found not complete; a page already there was left cut short."""
    recording(tmp_path, "whole.jsonl")
    recording(tmp_path, "cut.jsonl", end={"verdict": {"kind": "truncated", "reason": "cut"}})
    got = streamtap("report", "--html", "/dev/full", tmp_path)
    assert got.returncode == 2, (got.returncode, got.stderr)
    assert "not complete (1):" in got.stdout, got.stdout  # the table, whole
    assert got.stderr.count("\n") == 1 and "--html /dev/full: No space left on device" in got.stderr, got.stderr
    assert "found: 1 of 2 recording(s) not judged complete (exit 1 but for this)" in got.stderr, got.stderr
    page = tmp_path / "page.html"
    page.write_text("the page of yesterday\n")
    got = subprocess.run([*STREAMTAP, "report", "--html", page, tmp_path], capture_output=True, text=True, timeout=60,
                         preexec_fn=_file_size_limit(3000))  # the rows DuckDB reads fit, the page (~5 KB) does not
    assert got.returncode == 2 and "File too large" in got.stderr and "(exit 1 but for this)" in got.stderr, got.stderr
    assert page.read_text() == "the page of yesterday\n"  # as it was, not cut short
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.jsonl", "page.html", "whole.jsonl"]  # no temporary file left
    assert streamtap("report", "--html", page, tmp_path).returncode == 1 and page.read_text().startswith("<!doctype html>")
