"""`streamtap index`: real traffic through mitmdump, indexed to hive-partitioned Parquet, read
back with DuckDB (always) and Spark (where Java and pyspark are installed); incremental runs."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import duckdb
import pytest

from fleet_traffic import drive
from test_fleet_edges import STREAMTAP, judged, recording
from test_report import streamtap
from upstream import Mitmdump, Upstream


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("index")) as mitm:
            mitm.upstream = upstream
            recordings = drive(mitm)
    return mitm.record_dir, recordings


def plain_recordings(tmp_path: Path, count: int) -> Path:
    """A folder ``recs`` of ``count`` recordings of the default shape, named in order."""
    folder = tmp_path / "recs"
    folder.mkdir()
    for i in range(count):
        recording(folder, f"r{i:04d}.jsonl")
    return folder


def test_the_query_the_help_prints_runs_as_printed(tmp_path):
    """It was wrapped into the paragraph around it, and a line break inside its string made the
    pasted command a SyntaxError."""
    import sys

    folder = plain_recordings(tmp_path, 3)
    assert streamtap("index", str(folder), "--out", str(tmp_path / "idx")).returncode == 0
    helped = subprocess.run([*STREAMTAP, "index", "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "80"})
    command = next(line.strip() for line in helped.stdout.splitlines() if "import duckdb" in line)
    assert command.startswith('python -c "'), command
    command = command.replace("python", f"'{sys.executable}'", 1).replace("DIR", "idx")
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0 and "complete" in ran.stdout and "3" in ran.stdout, ran.stdout + ran.stderr


def read_index(out: Path) -> dict[str, dict]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rel = con.sql(f"SELECT * FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)")
    return {row["path"]: row for row in (dict(zip(rel.columns, values)) for values in rel.fetchall())}


def file_hashes(out: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*.parquet")}


def test_rows_match_the_recordings(recorded, tmp_path):
    record_dir, recordings = recorded
    out = tmp_path / "idx"
    run = streamtap("index", str(record_dir), "--out", str(out))
    assert run.returncode == 0, run.stderr
    rows = read_index(out)
    assert len(rows) == len(recordings)
    for rec in recordings:
        row = rows[str(rec.path.resolve())]
        turn, usage = rec.end["turn"], rec.end["turn"]["usage"]
        assert row["provider"] == rec.header["dialect"]
        assert row["verdict"] == rec.verdict["kind"] and row["reason"] == rec.verdict["reason"]
        assert row["stream_end"] == rec.end["stream_end"]
        assert row["status"] == rec.header["response"]["status"]
        assert row["bytes"] == len(rec.body) and row["sha256"] == hashlib.sha256(rec.body).hexdigest()
        assert row["events"] == len(rec.segments)  # frames and a cut tail: the wire events the Tap counted
        assert row["ttft_ms"] == rec.end["ttft_ms"] and row["duration_ms"] == rec.end["duration_ms"]
        assert row["input_tokens"] == usage["input"] and row["output_tokens"] == usage["output"]
        assert row["flow_id"] == rec.header["flow_id"]
        assert row["started"].timestamp() == pytest.approx(rec.header["started"], abs=1e-6)
        assert row["day"].isoformat() == row["started"].date().isoformat()
        assert row["url_path"].startswith("/s/fleet-") and row["host"] == "127.0.0.1"
        assert row["model"] == (turn["model"] or rec.header["request"]["body"].get("model") or "amazon.nova-lite-v1:0")
        assert row["file_complete"] is True
        partition = out / f"day={row['day'].isoformat()}" / f"provider={row['provider']}"
        assert any(partition.glob("*.parquet")), partition


def test_incremental_runs_add_only_new_recordings(recorded, tmp_path):
    record_dir, recordings = recorded
    out = tmp_path / "idx"
    first = [str(r.path) for r in recordings[:4]]
    assert streamtap("index", *first, "--out", str(out)).returncode == 0
    before = file_hashes(out)
    assert len(read_index(out)) == 4
    second = streamtap("index", str(record_dir), "--out", str(out))
    assert second.returncode == 0 and f"{len(recordings) - 4} new recording(s) indexed, 4 already" in second.stderr
    after = file_hashes(out)
    assert {k: after[k] for k in before} == before, "an existing Parquet file was rewritten"
    rows = read_index(out)
    assert len(rows) == len(recordings)  # no path twice
    third = streamtap("index", str(record_dir), "--out", str(out))
    assert "0 new recording(s)" in third.stderr and file_hashes(out) == after


def test_recordings_moved_or_copied_since_they_were_indexed_count_once(recorded, tmp_path):
    """An index keeps the row of every path it read: a folder of recordings archived elsewhere and
    indexed again, or the same recording given in two places, is one row and one recording."""
    _record_dir, recordings = recorded
    live, archive, copy = tmp_path / "live", tmp_path / "archive", tmp_path / "copy"
    live.mkdir()
    for r in recordings[:3]:
        shutil.copy(r.path, live)
    out = tmp_path / "idx"
    assert streamtap("index", str(live), "--out", str(out)).returncode == 0
    shutil.move(live, archive)
    again = streamtap("index", str(archive), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert "0 new recording(s) indexed, 3 already in" in again.stderr and "3 already under another path" in again.stderr
    assert row_counts(out) == (3, 3)  # as Spark or Trino read it
    assert judged(out)["report"]["recordings"] == judged(out, str(archive))["report"]["recordings"] == 3
    shutil.copytree(archive, copy)
    assert judged(str(archive), str(copy))["report"]["recordings"] == 3
    both = tmp_path / "idx2"
    assert streamtap("index", str(archive), str(copy), "--out", str(both)).returncode == 0
    assert row_counts(both) == (3, 3)


def row_counts(out: Path) -> tuple[int, int]:
    """(rows, distinct paths) as the README's DuckDB query reads the index."""
    return duckdb.sql(f"SELECT count(*), count(DISTINCT path) FROM read_parquet('{out}/**/*.parquet')").fetchall()[0]


def test_a_second_index_run_waits_for_the_run_holding_the_folder_and_adds_nothing_twice(tmp_path):
    """A run holds DIR/.streamtap-index.lock (flock) from reading the paths indexed until its
    files are in place. Here the test is that first run: it holds the lock, indexes the
    recordings meanwhile, and lets go; the second run, started in between, must wait, say so
    once, and then find them indexed."""
    from streamtap.recording import fleet
    from streamtap.recording.catalog import find_recordings

    recordings = plain_recordings(tmp_path, 3)
    out = tmp_path / "idx"
    out.mkdir()
    first = os.open(out / ".streamtap-index.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(first, fcntl.LOCK_EX)
    try:
        second = subprocess.Popen([*STREAMTAP, "index", str(recordings), "--out", str(out)], stderr=subprocess.PIPE, text=True)
        said = second.stderr.readline()  # its first word: that it waits (or, not waiting, its summary)
        con = fleet.connect()
        fleet.load_rows(con, fleet.read_rows(find_recordings([recordings])), "new_rows")
        fleet.write_index(con, out, "new_rows")
    finally:
        os.close(first)
    rest = second.communicate(timeout=60)[1]
    assert said == f"streamtap index: another index run holds {out}; waiting for it to finish\n", said + rest
    assert second.returncode == 0 and "another index run" not in rest, rest
    assert "0 new recording(s) indexed, 3 already in" in rest, rest
    assert row_counts(out) == (3, 3)


def test_an_index_run_paused_or_killed_while_it_writes_leaves_the_index_whole(tmp_path):
    """DuckDB writes a run's files in a hidden staging folder, renamed into their partitions
    once whole: a report while the run is stopped reads what the index held, and a run killed
    there leaves nothing torn; the next run removes its staging folder and adds its
    recordings, each once. Many days make many partition files, so the run is caught writing."""
    recordings = tmp_path / "recs"
    recordings.mkdir()
    recording(recordings, "first.jsonl", header={"started": 1_700_000_000})
    out = tmp_path / "idx"
    assert streamtap("index", str(recordings), "--out", str(out)).returncode == 0
    before = {Path(folder, name) for folder, _, names in os.walk(out) for name in names}
    for day in range(1, 151):
        recording(recordings, f"r{day:03d}.jsonl", header={"started": 1_700_000_000 + day * 86400})
    run = subprocess.Popen([*STREAMTAP, "index", str(recordings), "--out", str(out)], stderr=subprocess.DEVNULL)
    try:
        while run.poll() is None:  # until it writes its first file
            if any(Path(folder, name) not in before and name != ".streamtap-index.lock"
                   for folder, _, names in os.walk(out) for name in names):
                run.send_signal(signal.SIGSTOP)
                break
        during = judged(out)
        assert during["code"] in (0, 1) and 1 <= during["report"]["recordings"] <= 151, during
    finally:
        run.kill()
        run.wait()
    after_kill = judged(out)
    assert after_kill["code"] in (0, 1), after_kill
    again = streamtap("index", str(recordings), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert row_counts(out) == (151, 151)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the killed run's staging folder is gone
    assert judged(out)["report"]["recordings"] == 151


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_an_index_run_ended_by_sigterm_leaves_no_folder_and_no_temporary_file(tmp_path, signum):
    """What `timeout`, cron and systemd send ended Python at once: the --out folder the run made
    stayed with only its lock file, and the rows file in the temporary folder (~0.7 KB a recording)
    stayed for good. It now unwinds as Ctrl-C does."""
    recordings = plain_recordings(tmp_path, 1500)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = tmp_path / "idx"
    run = subprocess.Popen([*STREAMTAP, "index", str(recordings), "--out", str(out)], stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(temporary)})
    try:
        while run.poll() is None and not any(temporary.glob("streamtap-*/rows.jsonl")):
            pass
        assert run.poll() is None, "the run ended before it wrote its rows: give it more recordings"
        run.send_signal(signum)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signum and "Traceback" not in err, err
    assert not out.exists() and list(temporary.iterdir()) == []


def test_an_index_run_under_nohup_survives_the_hang_up(tmp_path):
    """`nohup` ignores SIGHUP, which Python inherits: the verbs took it over all the same, so a
    nohup'd run ended at the terminal's hang-up (exit 129)."""
    recordings = plain_recordings(tmp_path, 1500)
    out = tmp_path / "idx"
    run = subprocess.Popen([*STREAMTAP, "index", str(recordings), "--out", str(out)], stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        while run.poll() is None and not (out / ".streamtap-index.lock").exists():
            pass
        run.send_signal(signal.SIGHUP)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert row_counts(out) == (1500, 1500)


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed (scripts/system-deps.sh installs it)")
def test_an_index_run_syncs_its_files_before_their_renames_and_the_renames_after_in_two_calls(tmp_path):
    """Durable without a journal commit per partition: one syncfs before the first file is
    renamed into its partition (their bytes), one after the last (the renames), on Linux."""
    recordings = tmp_path / "recs"
    recordings.mkdir()
    for day in range(30):
        recording(recordings, f"r{day:02d}.jsonl", header={"started": 1_700_000_000 + day * 86400})
    out, trace = tmp_path / "idx", tmp_path / "trace"
    run = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,syncfs,sync,rename,renameat,renameat2",
         *STREAMTAP, "index", str(recordings), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    calls = []
    for line in trace.read_text().splitlines():
        name = line.split(maxsplit=1)[1].split("(", 1)[0]
        if not name.startswith("rename"):
            calls.append(name)
        elif f'"{out}/day=' in line:  # a file renamed into its partition (not the interpreter's own renames)
            calls.append("rename")
    assert calls == ["syncfs", *["rename"] * 30, "syncfs"], calls
    assert row_counts(out) == (30, 30)


def test_without_syncfs_each_file_and_partition_is_synced_before_and_after_the_renames(tmp_path, monkeypatch):
    from streamtap.recording import fleet
    from streamtap.recording.catalog import find_recordings

    recordings = tmp_path / "recs"
    recordings.mkdir()
    for day in range(3):
        recording(recordings, f"r{day}.jsonl", header={"started": 1_700_000_000 + day * 86400})
    synced = []
    real_rename = os.rename
    monkeypatch.setattr(fleet, "_syncfs", None)
    monkeypatch.setattr(fleet, "_sync", lambda path: synced.append(Path(path)))
    monkeypatch.setattr(fleet.os, "rename", lambda a, b: (synced.append(("renamed", Path(b))), real_rename(a, b)))
    con = fleet.connect()
    fleet.load_rows(con, fleet.read_rows(find_recordings([recordings])), "new_rows")
    out = tmp_path / "idx"
    fleet.write_index(con, out, "new_rows")
    staged, renamed, partitions = synced[:3], synced[3:6], synced[6:]
    assert all(p.suffix == ".staged" for p in staged) and [r[0] for r in renamed] == ["renamed"] * 3, synced
    assert len(partitions) == 3 and {r[1].parent for r in renamed} == set(partitions)
    assert row_counts(out) == (3, 3)


def test_report_over_the_index_equals_the_report_over_the_recordings(recorded, tmp_path):
    record_dir, _ = recorded
    out = tmp_path / "idx"
    assert streamtap("index", str(record_dir), "--out", str(out)).returncode == 0
    from_files = streamtap("report", "--json", str(record_dir))
    from_index = streamtap("report", "--json", str(out))
    assert from_index.returncode == from_files.returncode == 1
    assert json.loads(from_index.stdout) == json.loads(from_files.stdout)


def test_a_recording_being_written_is_left_out_until_its_writer_is_gone(recorded, tmp_path):
    from streamtap.recording import RecordingWriter

    record_dir, recordings = recorded
    live = tmp_path / "live"
    writer = RecordingWriter.create(live, started=recordings[0].header["started"], provider="openai-chat", flow_id="0123456789abcdef")
    writer.header({k: v for k, v in recordings[0].header.items() if k not in ("type", "format", "streamtap")})
    writer.flush()
    out = tmp_path / "idx"
    run = streamtap("index", str(live), "--out", str(out))
    assert run.returncode == 0 and "left out 1 recording(s) a live proxy is still writing" in run.stderr
    assert not list(out.rglob("*.parquet"))
    writer.close()  # as after a kill: no end line, no lock
    streamtap("index", str(live), "--out", str(out))
    [row] = read_index(out).values()
    assert row["verdict"] is None and row["file_complete"] is False and "no end line" in row["problem"]


def test_spark_reads_the_index_unchanged(recorded, tmp_path):
    if shutil.which("java") is None:
        pytest.skip("no Java runtime: Spark needs one (apt-get install default-jre-headless)")
    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("pyspark is not installed (it is no dependency of streamtap: pip install pyspark to run this check)")
    from pyspark.sql import SparkSession

    record_dir, recordings = recorded
    out = tmp_path / "idx"
    assert streamtap("index", str(record_dir), "--out", str(out)).returncode == 0
    spark = (
        SparkSession.builder.master("local[1]").appName("streamtap-index-test")
        .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    try:
        spark.sql(f"CREATE TABLE recordings USING parquet LOCATION '{out}'")
        spark.sql("MSCK REPAIR TABLE recordings")
        counts = {row["verdict"]: row["n"] for row in spark.sql("SELECT verdict, count(*) AS n FROM recordings GROUP BY verdict").collect()}
        expected: dict[str, int] = {}
        for rec in recordings:
            expected[rec.verdict["kind"]] = expected.get(rec.verdict["kind"], 0) + 1
        assert counts == expected
        providers = {row["provider"] for row in spark.sql("SELECT DISTINCT provider FROM recordings").collect()}
        assert providers == {r.header["dialect"] for r in recordings}
        [row] = spark.sql("SELECT min(started) AS first, sum(bytes) AS total FROM recordings").collect()
        assert row["total"] == sum(len(r.body) for r in recordings)
    finally:
        spark.stop()


def test_a_partial_recording_an_import_replaced_since_is_counted_once(tmp_path):
    """A stopped import leaves a flow's .partial.jsonl, which an index run records; the import run
    again removes it and imports the flow anew. The index keeps the row of the file it read (its
    files are never rewritten), but the flow is one recording, complete: the report over the
    index, or over the index and the folder before the next index run, says so as the report over
    the folder does."""
    from test_import_interrupted import FLOWS, imported, streamtap_import, unfinish

    capture, recordings = imported(tmp_path)
    partial = unfinish(sorted(recordings.glob("*.jsonl"))[1], "frames")
    out = tmp_path / "idx"
    assert streamtap("index", str(recordings), "--out", str(out)).returncode == 0
    stopped = json.loads(streamtap("report", "--json", str(out)).stdout)
    assert stopped["recordings"] == FLOWS and [Path(i["path"]).name for i in stopped["incomplete"]] == [partial.name]
    assert streamtap_import(capture, "--out", recordings, "-q").returncode == 0 and not partial.exists()

    from_folder = streamtap("report", "--json", str(recordings))
    not_indexed_yet = streamtap("report", "--json", str(out), str(recordings))
    assert streamtap("index", str(recordings), "--out", str(out)).returncode == 0
    assert row_counts(out) == (FLOWS + 1, FLOWS + 1)  # the partial's row stays in its file
    from_index = streamtap("report", "--json", str(out))
    for report in (from_folder, not_indexed_yet, from_index):
        assert report.returncode == 0, report.stdout
        data = json.loads(report.stdout)
        assert data["recordings"] == FLOWS and data["verdicts"] == {"complete": FLOWS} and data["incomplete"] == []
    assert json.loads(from_index.stdout) == json.loads(from_folder.stdout)


def test_only_a_partial_whose_own_flow_has_a_finished_recording_in_its_folder_is_dropped():
    """The flow is the name's folder, start and flow part (writer.partial_name, final_name), as the
    import that replaces the file finds it; the provider may differ, as detection may settle."""
    from streamtap.recording import fleet

    names = {
        "/r/20261130T120000.000Z_anthropic_aaaaaaaaaaaa.partial.jsonl": False,  # replaced below
        "/r/20261130T120000.000Z_openai-chat_complete_aaaaaaaaaaaa.jsonl": True,
        "/r/20261130T120001.000Z_anthropic_bbbbbbbbbbbb.partial.jsonl.zst": False,  # replaced, compressed
        "/r/20261130T120001.000Z_anthropic_truncated_bbbbbbbbbbbb.jsonl.zst": True,
        "/r/20261130T120002.000Z_anthropic_cccccccccccc.partial.jsonl": True,  # another flow part
        "/r/20261130T120002.000Z_anthropic_complete_cccccccccccc-2.jsonl": True,
        "/r/20261130T120003.000Z_anthropic_dddddddddddd.partial.jsonl": True,  # another start
        "/r/20261130T120004.000Z_anthropic_complete_dddddddddddd.jsonl": True,
        "/r/a/20261130T120005.000Z_anthropic_eeeeeeeeeeee.partial.jsonl": True,  # another folder
        "/r/b/20261130T120005.000Z_anthropic_complete_eeeeeeeeeeee.jsonl": True,
        "/r/20261130T120006.000Z_anthropic_ffffffffffff.partial.jsonl": True,  # alone: a killed proxy's
    }
    con = fleet.connect()
    con.execute("CREATE TABLE recordings AS SELECT unnest(?) AS path", [list(names)])
    fleet.drop_replaced(con)
    assert {path for (path,) in con.execute("SELECT path FROM recordings").fetchall()} == {p for p, kept in names.items() if kept}


def test_report_and_index_hold_one_row_at_a_time_and_say_how_far_they_are(tmp_path, monkeypatch, capsys):
    """Each recording's row goes to DuckDB's file as it is read (30k recordings held as rows took
    ~5.5 KB each), and a run longer than a second says on stderr, every second or so, how many
    recordings it has read, as `import` says its flows: 1M recordings take minutes."""
    import itertools
    import types
    import weakref

    from streamtap import cli
    from streamtap.recording import fleet

    recordings = plain_recordings(tmp_path, 30)
    alive = most = 0

    class Row(dict):  # a dict that can be watched: one alive at a time, or all of them?
        __slots__ = ("__weakref__",)

    def gone() -> None:
        nonlocal alive
        alive -= 1

    def watched(path):
        nonlocal alive, most
        row = Row(real_row(path))
        weakref.finalize(row, gone)
        alive += 1
        most = max(most, alive)
        return row

    real_row = fleet.recording_row
    monkeypatch.setattr(fleet, "recording_row", watched)
    clock = itertools.count(0, 0.25)  # a quarter of a second per recording read
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=lambda: next(clock)), raising=False)
    for verb in (["report", str(recordings)], ["index", str(recordings), "--out", str(tmp_path / "idx")]):
        most = 0
        assert cli.main(verb) == 0
        said = capsys.readouterr().err
        assert most <= 2, (verb[0], most)
        progress = re.findall(rf"^streamtap {verb[0]}: (\d+) recordings read \((\d+) s\)$", said, re.MULTILINE)
        assert len(progress) >= 5 and int(progress[-1][0]) > int(progress[0][0]), said
    assert row_counts(tmp_path / "idx") == (30, 30)


def test_parquet_files_not_of_the_index_layout_are_refused_without_a_traceback(tmp_path):
    """A file whose column is of another type stops a report halfway, and Spark or Trino cannot read
    the folder as one table: report and index refuse it (exit 2). So is a day folder that names no date."""
    recs = plain_recordings(tmp_path, 2)
    good = tmp_path / "idx"
    assert streamtap("index", str(recs), "--out", str(good)).returncode == 0
    files = sorted(good.rglob("*.parquet"))
    other_type, no_date = tmp_path / "other" / "day=2026-12-01" / "provider=x", tmp_path / "nodate" / "day=garbage" / "provider=x"
    for folder, replace in ((other_type, "path || '.other' AS path, 'fast' AS ttft_ms"), (no_date, "path || '.moved' AS path")):
        folder.mkdir(parents=True)
        duckdb.sql(f"COPY (SELECT * REPLACE ({replace}) FROM read_parquet('{files[0]}')) TO '{folder}/r.parquet'")
    for args in (["report", str(tmp_path / "other")], ["report", str(tmp_path / "other"), str(recs)],
                 ["index", str(recs), "--out", str(tmp_path / "other")],
                 ["report", str(tmp_path / "nodate"), str(good)], ["report", str(tmp_path / "nodate"), str(recs)],
                 ["index", str(recs), "--out", str(tmp_path / "nodate")]):
        out = streamtap(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr)
        assert "its Parquet files are not a streamtap index" in out.stderr, (args, out.stderr)
    assert "column ttft_ms is stored as BYTE_ARRAY" in streamtap("report", str(tmp_path / "other")).stderr
    assert "its day folder names no date" in streamtap("report", str(tmp_path / "nodate")).stderr
    for refused in ("other", "nodate"):
        assert len(list((tmp_path / refused).rglob("*.parquet"))) == 1  # index added nothing to it
