"""The fleet view reads a recording as `verify` does: one whose lines were converted to CR LF is
damaged, never a whole, complete recording; and a row's `day` is the day of its `started` as the
index stores it (to the microsecond)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).resolve().parents[1]
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]
NAME = "20261204T170733.542Z_openai-chat_complete_8e546580a39c.jsonl"  # named as the proxy names recordings


def streamtap(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*STREAMTAP, *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("converted", ["all lines", "last line"])
def test_a_recording_converted_to_crlf_is_damaged_for_report_index_and_verify(tmp_path, converted):
    lines = (REPO / "recordings" / "openai-chat.jsonl").read_bytes().splitlines(keepends=True)
    if converted == "all lines":
        lines = [line[:-1] + b"\r\n" for line in lines]
    else:
        lines[-1] = lines[-1][:-1] + b"\r\n"
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / NAME).write_bytes(b"".join(lines))

    verify = streamtap("verify", folder / NAME)
    assert verify.returncode == 2 and "CR LF" in verify.stderr, verify.stderr
    report = streamtap("report", "--json", folder)
    assert report.returncode == 1, report.stdout + report.stderr
    summary = json.loads(report.stdout)
    assert summary["incomplete_files"] == 1 and summary["verdicts"] == {}, summary
    index = streamtap("index", folder, "--out", tmp_path / "idx")
    assert index.returncode == 0, index.stderr
    row = duckdb.sql(
        f"SELECT verdict, file_complete FROM read_parquet('{tmp_path / 'idx'}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert row == [(None, False)], row


def test_a_start_half_a_microsecond_before_midnight_is_filed_under_the_day_its_timestamp_names(tmp_path):
    lines = (REPO / "recordings" / "openai-chat.jsonl").read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["started"] = 1796515199.9999996  # 2026-12-05 23:59:59.9999996 UTC: 2026-12-06 00:00:00 to the microsecond
    lines[0] = json.dumps(header, separators=(",", ":")).encode() + b"\n"
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "20261205T235959.999Z_openai-chat_complete_8e546580a39c.jsonl").write_bytes(b"".join(lines))
    index = streamtap("index", folder, "--out", tmp_path / "idx")
    assert index.returncode == 0, index.stderr
    [(day, started_day)] = duckdb.sql(
        f"SELECT CAST(day AS VARCHAR), CAST(CAST(started AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS DATE)::VARCHAR "
        f"FROM read_parquet('{tmp_path / 'idx'}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    assert day == started_day == "2026-12-06", (day, started_day)
