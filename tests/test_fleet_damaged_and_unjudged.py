"""`streamtap report` and `index` over what a fleet really holds: a damaged recording named in a
shell glob, recordings cut or without a verdict in the group tables, end-line values the format
forbids, a killed proxy's leftovers dated by their names, recorded text in `--csv` on a terminal,
a provider name no engine reads alike. The real console script, on copies of a bundled recording."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess

import duckdb
import pytest

from test_fleet_edges import GOOD, STREAMTAP, recording, streamtap

GROUPS = ("by_provider", "by_model", "by_day", "by_day_provider_model")


def report_json(*paths) -> tuple[int, dict]:
    got = streamtap("report", "--json", *paths)
    assert "Traceback" not in got.stderr, got.stderr
    assert got.stdout, (got.returncode, got.stderr)  # no report at all: the run stopped
    return got.returncode, json.loads(got.stdout)


def index_rows(folder) -> list[tuple]:
    return duckdb.sql(
        f"SELECT regexp_extract(path, '[^/]*$') AS name, day, provider, file_complete, problem, bytes, ttft_ms "
        f"FROM read_parquet('{folder}/**/*.parquet', hive_partitioning = true) ORDER BY name"
    ).fetchall()


# --- 1. a damaged recording named on the command line -----------------------------------------


@pytest.mark.parametrize(
    "damage, problem",
    [
        ({"header": {"format": "streamtap-recording/3"}}, "damaged: the recording is streamtap-recording/3"),
        ({"last": b"[1, 2, 3]\n"}, "damaged: the last line"),  # its end line broken
    ],
)
def test_a_damaged_recording_named_among_others_is_listed_and_the_others_reported_and_indexed(tmp_path, damage, problem):
    """`report DIR/*.jsonl`: one damaged file in the glob is listed, as in a folder (exit 1), and
    does not cost the others their report or their index rows."""
    good = [recording(tmp_path, "a.jsonl"), recording(tmp_path, "b.jsonl")]
    bad = recording(tmp_path, "c.jsonl", **damage)
    code, report = report_json(*good, bad)
    assert code == 1
    assert report["recordings"] == 3 and report["verdicts"] == {"complete": 2}
    [listed] = report["incomplete"]
    assert listed["path"] == str(bad) and listed["problem"].startswith(problem), listed
    indexed = streamtap("index", *good, bad, "--out", tmp_path / "idx")
    assert indexed.returncode == 0 and "Traceback" not in indexed.stderr, indexed.stderr  # as a folder's damaged one
    rows = index_rows(tmp_path / "idx")
    assert [(name, complete) for name, _, _, complete, *_ in rows] == [("a.jsonl", True), ("b.jsonl", True), ("c.jsonl", False)]


def test_a_named_file_that_is_not_a_recording_is_still_a_usage_error(tmp_path):
    recording(tmp_path, "a.jsonl")
    (tmp_path / "notes.jsonl").write_text('{"a": 1}\n')  # another program's JSON lines
    for got in (streamtap("report", tmp_path / "a.jsonl", tmp_path / "notes.jsonl"),
                streamtap("index", tmp_path / "a.jsonl", tmp_path / "notes.jsonl", "--out", tmp_path / "idx")):
        assert got.returncode == 2 and "is not a streamtap recording" in got.stderr, got.stderr
    assert not (tmp_path / "idx").exists()


# --- 2. cut and unjudged recordings in the group tables ---------------------------------------


def _fleet_with_cut_and_unjudged(folder):
    for number in range(3):
        recording(folder, f"good{number}.jsonl")
    recording(folder, "noverdict.jsonl", end={"verdict": None})
    lines = GOOD.read_bytes().splitlines(keepends=True)
    (folder / "killed.jsonl").write_bytes(b"".join(lines[:10]))  # a killed proxy's leftover: no end line


def test_every_group_counts_its_cut_and_unjudged_recordings(tmp_path):
    """Each group's verdicts and its recordings not judged add up to its recordings: a provider
    whose streams a killed proxy cut does not read as all complete."""
    _fleet_with_cut_and_unjudged(tmp_path)
    code, report = report_json(tmp_path)
    assert code == 1
    for key in GROUPS:
        for group in report[key]:
            assert sum(group["verdicts"].values()) + group["not_judged"] == group["recordings"], (key, group)
    [provider] = report["by_provider"]
    assert (provider["recordings"], provider["verdicts"], provider["not_judged"]) == (5, {"complete": 3}, 2)

    table = streamtap("report", tmp_path).stdout
    header = next(line for line in table.splitlines() if line.startswith("provider "))
    row = next(line for line in table.splitlines() if line.startswith("anthropic "))
    assert header.split()[1:6] == ["recordings", "complete", "not", "complete", "not"] and "not judged" in header
    assert row.split()[1:5] == ["5", "3", "0", "2"], row  # recordings, complete, not complete, not judged

    [csv_row] = csv.DictReader(io.StringIO(streamtap("report", "--csv", tmp_path).stdout))
    assert (csv_row["recordings"], csv_row["complete"], csv_row["not_judged"]) == ("5", "3", "2")


def test_the_html_page_says_some_recordings_were_not_judged(tmp_path):
    (tmp_path / "recs").mkdir()
    _fleet_with_cut_and_unjudged(tmp_path / "recs")
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path / "recs").returncode == 1
    text = page.read_text()
    by_provider = text[text.index("<h2>By provider</h2>") : text.index("<h2>By model</h2>")]
    assert "<th>not judged</th>" in by_provider and '<td class="text">anthropic</td><td>5</td><td>3</td><td>0</td><td>2</td>' in by_provider
    assert "Every judged turn is complete." not in text  # never alone: 2 were not judged
    assert "Every judged turn is complete, but not every recording was judged: 2 recording(s) read were not judged" in text


# --- 3. end-line values the format forbids ----------------------------------------------------


@pytest.mark.parametrize(
    "end, problem",
    [
        ({"ttft_ms": -5_000_000, "duration_ms": -1e9}, "damaged: its end line's 'duration_ms' is -1000000000.0: a time"),
        ({"bytes": -1}, "damaged: its end line's 'bytes' is -1, not a count"),
        ({"events": -3}, "damaged: its end line's 'events' is -3, not a count"),
        ({"turn.usage.output": -7}, "damaged: its end line's usage 'output' is -7, not a count"),
        ({"ttft_ms": "30"}, "damaged: its end line's 'ttft_ms' is \"30\", not a number"),
    ],
)
def test_an_end_line_value_verify_rejects_makes_the_recording_damaged_in_report_and_index(tmp_path, end, problem):
    good = recording(tmp_path, "good.jsonl")
    bad = recording(tmp_path, "bad.jsonl", end=end)
    if "turn.usage.output" not in end:  # (verify judges usage against the bytes, not on its own)
        assert streamtap("verify", bad).returncode == 2  # the format's reader rejects it
    code, report = report_json(tmp_path)
    assert code == 1
    assert report["recordings"] == 2 and report["verdicts"] == {"complete": 1}
    [listed] = report["incomplete"]
    assert listed["path"] == str(bad) and listed["problem"].startswith(problem), listed
    _, alone = report_json(good)
    assert report["ttft_ms"] == alone["ttft_ms"] and report["duration_ms"] == alone["duration_ms"]  # no negative figures
    assert streamtap("index", tmp_path, "--out", tmp_path / "idx").returncode == 0
    rows = {name: (complete, size, ttft) for name, _, _, complete, _, size, ttft in index_rows(tmp_path / "idx")}
    assert rows["bad.jsonl"] == (False, None, None)


def damaged_header(**fields) -> dict:
    """The bundled recording's header with fields replaced (dotted keys reach into it)."""
    import orjson

    header = orjson.loads(GOOD.read_bytes().split(b"\n", 1)[0])
    for key, value in fields.items():
        *parents, leaf = key.split(".")
        target = header
        for parent in parents:
            target = target[parent]
        target[leaf] = value
    return header


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"response.status": "200"}, """damaged: line 1 is damaged: 'status' is "200", not an integer"""),
        ({"request": "x"}, """damaged: line 1 is damaged: 'request' is "x", not an object"""),
        ({"dialect": 5}, "damaged: line 1 is damaged: 'dialect' is 5, not a string"),
        ({"wire.format": ["sse"]}, "damaged: line 1 is damaged: 'format' is "),
        ({"request.headers": [["authorization"]]}, "damaged: line 1 is damaged: a request header is "),
    ],
)
def test_a_header_value_verify_rejects_makes_the_recording_damaged_in_report_and_index(tmp_path, fields, problem):
    """A header field of the wrong type is damage, as verify says, not a value to leave out of
    the row while the verdict is counted complete."""
    recording(tmp_path, "good.jsonl")
    bad = recording(tmp_path, "bad.jsonl", header=damaged_header(**fields))
    verified = streamtap("verify", bad)
    assert verified.returncode == 2 and problem.removeprefix("damaged: ") in verified.stdout + verified.stderr
    code, report = report_json(tmp_path)
    assert code == 1
    assert report["recordings"] == 2 and report["verdicts"] == {"complete": 1}
    [listed] = report["incomplete"]
    assert listed["path"] == str(bad) and listed["problem"].startswith(problem), listed
    assert streamtap("index", tmp_path, "--out", tmp_path / "idx").returncode == 0
    rows = {name: complete for name, _, _, complete, *_ in index_rows(tmp_path / "idx")}
    assert rows == {"good.jsonl": True, "bad.jsonl": False}


# --- 4. a killed proxy's leftovers dated and filed by their names -----------------------------


def test_a_leftover_named_by_the_proxy_is_dated_and_filed_by_its_name_not_its_mtime(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    recording(folder, "20251130T120000.000Z_anthropic_complete_aaaaaaaaaaaa.jsonl")
    empty = folder / "20251130T120001.250Z_anthropic_bbbbbbbbbbbb.partial.jsonl"  # killed before its header
    empty.write_bytes(b"")
    cut = folder / "20251130T120002.000Z_openai-chat_complete_cccccccccccc.jsonl"  # cut inside its header
    cut.write_bytes(GOOD.read_bytes()[:100])
    newer = recording(folder, "20251129T235959.999Z_gemini_complete_dddddddddddd.jsonl", header={"format": "streamtap-recording/3"})
    no_start = recording(folder, "20251128T080000.000Z_anthropic_complete_eeeeeeeeeeee.jsonl",
                         header={"started": None, "request_started": None})  # its header names its provider
    (tmp_path / "copies").mkdir()
    other = recording(tmp_path / "copies", "copied.jsonl", header={"format": "streamtap-recording/3"})  # not the proxy's name
    os.utime(other, (1_700_000_000, 1_700_000_000))  # 2023-11-14
    code, report = report_json(folder, tmp_path / "copies")
    assert code == 1
    listed = {os.path.basename(item["path"]): (item["started"], item["provider"]) for item in report["incomplete"]}
    assert listed == {
        empty.name: ("2025-11-30T12:00:01.250000+00:00", "anthropic"),
        cut.name: ("2025-11-30T12:00:02+00:00", "openai-chat"),
        newer.name: ("2025-11-29T23:59:59.999000+00:00", "gemini"),
        other.name: ("2023-11-14T22:13:20+00:00", "unknown"),
    }
    assert report["verdicts"] == {"complete": 2}  # the one without a start time is whole: judged, dated by its name
    assert report["first"] == "2023-11-14T22:13:20+00:00" and report["last"] == "2025-11-30T12:00:02+00:00"
    assert {g["day"] for g in report["by_day"]} == {"2023-11-14", "2025-11-28", "2025-11-29", "2025-11-30"}
    assert streamtap("index", folder, tmp_path / "copies", "--out", tmp_path / "idx").returncode == 0
    partitions = {(name, str(day), provider) for name, day, provider, *_ in index_rows(tmp_path / "idx")}
    assert (empty.name, "2025-11-30", "anthropic") in partitions
    assert (cut.name, "2025-11-30", "openai-chat") in partitions
    assert (no_start.name, "2025-11-28", "anthropic") in partitions
    assert (other.name, "2023-11-14", "unknown") in partitions


# --- 5. recorded text in --csv on a terminal --------------------------------------------------

CONTROLS = "gpt\x1b]0;PWNED\x07\x1b[2J"


def _on_a_terminal(*args) -> str:
    """What the command writes to stdout when stdout is a terminal (a pseudo-terminal)."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen([*STREAMTAP, *map(str, args)], stdout=follower, stderr=subprocess.PIPE)
    finally:
        os.close(follower)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
    process.communicate(timeout=60)
    return out.decode()


def test_csv_escapes_a_recorded_terminal_control_on_a_terminal_and_keeps_it_exact_as_data(tmp_path):
    recording(tmp_path, "m.jsonl", end={"turn.model": CONTROLS})
    shown = _on_a_terminal("report", "--csv", tmp_path)
    assert "recordings" in shown and "\x1b" not in shown and "\x07" not in shown, repr(shown)
    assert "gpt\\x1b]0;PWNED\\x07\\x1b[2J" in shown  # as the table writes it
    piped = streamtap("report", "--csv", tmp_path).stdout  # a file or a pipe: the data, exact
    [row] = csv.DictReader(io.StringIO(piped))
    assert row["model"] == CONTROLS


# --- 6. a provider name no engine reads alike -------------------------------------------------


def test_a_provider_name_outside_ascii_is_reported_and_indexed_as_other(tmp_path):
    """DuckDB percent-encodes each UTF-8 byte of a partition value, which Spark reads back as one
    character each: "mistral-ü" would be "mistral-Ã¼" there. An ASCII name is kept."""
    recording(tmp_path, "u.jsonl", header={"dialect": "mistral-ü"})
    recording(tmp_path, "a.jsonl", header={"dialect": "my-llm"})
    _, report = report_json(tmp_path)
    assert [g["provider"] for g in report["by_provider"]] == ["my-llm", "other"]
    assert streamtap("index", tmp_path, "--out", tmp_path / "idx").returncode == 0
    folders = sorted(p.name for p in (tmp_path / "idx").glob("day=*/provider=*"))
    assert folders == ["provider=my-llm", "provider=other"]
    _, indexed = report_json(tmp_path / "idx")
    assert [g["provider"] for g in indexed["by_provider"]] == ["my-llm", "other"]


def test_a_provider_named_as_hives_null_partition_is_indexed_as_other(tmp_path):
    """Hive's catalog (the README's CREATE EXTERNAL TABLE with MSCK REPAIR) reads a partition folder
    named __HIVE_DEFAULT_PARTITION__ as NULL, where DuckDB and Spark's own reader give the name."""
    recording(tmp_path, "h.jsonl", header={"dialect": "__HIVE_DEFAULT_PARTITION__"})
    recording(tmp_path, "a.jsonl", header={"dialect": "my-llm"})
    assert streamtap("index", tmp_path, "--out", tmp_path / "idx").returncode == 0
    folders = sorted(p.name for p in (tmp_path / "idx").glob("day=*/provider=*"))
    assert folders == ["provider=my-llm", "provider=other"]
    _, report = report_json(tmp_path)
    assert [g["provider"] for g in report["by_provider"]] == ["my-llm", "other"]


@pytest.mark.parametrize("name", ["p" * 300, "/" * 81])
def test_a_provider_name_too_long_for_a_partition_folder_is_indexed_as_other(tmp_path, name):
    """A folder name holds 255 bytes: one such header failed the whole index, every other
    recording's row with it, as a usage error."""
    recording(tmp_path, "long.jsonl", header={"dialect": name})
    recording(tmp_path, "a.jsonl", header={"dialect": "p" * 80})  # the longest name kept
    result = streamtap("index", tmp_path, "--out", tmp_path / "idx")
    assert result.returncode == 0, result.stderr
    folders = sorted(p.name for p in (tmp_path / "idx").glob("day=*/provider=*"))
    assert folders == ["provider=other", "provider=" + "p" * 80]
    _, report = report_json(tmp_path)
    assert sorted(g["provider"] for g in report["by_provider"]) == ["other", "p" * 80]
