"""`streamtap report`: real traffic through mitmdump, then the report checked against the
recordings read back one by one with the reader (a different path: every frame parsed)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fleet_traffic import drive
from upstream import Mitmdump, Upstream

STREAMTAP = [sys.executable, "-m", "streamtap.cli"]


def streamtap(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*STREAMTAP, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(recording folder, the recordings read back) after the fleet traffic."""
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("report")) as mitm:
            mitm.upstream = upstream
            recordings = drive(mitm)
    return mitm.record_dir, recordings


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (what quantile_cont computes)."""
    values = sorted(values)
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def test_json_report_matches_the_recordings(recorded):
    record_dir, recordings = recorded
    out = streamtap("report", "--json", str(record_dir))
    assert out.returncode == 1, out.stderr  # some turns are not complete
    report = json.loads(out.stdout)
    verdicts = Counter(r.verdict["kind"] for r in recordings)
    assert report["verdicts"] == dict(verdicts)
    assert {"complete", "truncated", "stopped_by_limit", "errored"} <= set(verdicts)
    assert report["recordings"] == len(recordings)
    assert report["stream_end"] == dict(Counter(r.end["stream_end"] for r in recordings))
    assert report["stream_end"]["upstream_reset"] >= 1
    for name in ("ttft_ms", "duration_ms"):
        values = [r.end[name] for r in recordings if r.end.get(name) is not None]
        for q, key in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            assert report[name][key] == pytest.approx(quantile(values, q), abs=0.001)
    by_provider = {g["provider"]: g for g in report["by_provider"]}
    assert set(by_provider) == {r.header["dialect"] for r in recordings}
    for provider, group in by_provider.items():
        mine = [r for r in recordings if r.header["dialect"] == provider]
        assert group["recordings"] == len(mine)
        assert group["verdicts"] == dict(Counter(r.verdict["kind"] for r in mine))
    models = {(g["provider"], g["model"]): g["recordings"] for g in report["by_model"]}
    assert models[("openai-chat", "gpt-fleet-a")] == 4  # three complete, one cut
    assert models[("bedrock-converse", "amazon.nova-lite-v1:0")] == 1  # named by the request path: the answer names none
    not_complete = {str(r.path.resolve()) for r in recordings if r.verdict["kind"] != "complete"}
    assert {item["path"] for item in report["incomplete"]} == not_complete
    reasons = Counter((r.verdict["kind"], r.verdict["reason"]) for r in recordings if r.verdict["kind"] != "complete")
    assert {(x["verdict"], x["reason"]): x["count"] for x in report["reasons"]} == dict(reasons)


def test_the_report_needs_no_time_zone_database(recorded):
    """Windows, Alpine and slim images have no IANA zone files (and streamtap does not depend on
    the tzdata package): the report gives its times all the same, in UTC, as it does with them."""
    record_dir, _ = recorded
    with_zones = streamtap("report", "--json", str(record_dir))
    env = {**os.environ, "PYTHONTZPATH": "/nonexistent"}
    without = subprocess.run([*STREAMTAP, "report", "--json", str(record_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert without.returncode == with_zones.returncode == 1, without.stderr
    report = json.loads(without.stdout)
    assert report == json.loads(with_zones.stdout)
    assert report["first"].endswith("+00:00") and report["incomplete"][0]["started"].endswith("+00:00"), report["first"]


def test_table_and_csv(recorded):
    record_dir, recordings = recorded
    table = streamtap("report", str(record_dir))
    assert table.returncode == 1, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"{len(recordings)} recordings, ")
    complete = sum(r.verdict["kind"] == "complete" for r in recordings)
    assert any(line.split() == ["complete", str(complete), f"{complete / len(recordings) * 100:.1f}%"] for line in lines)
    for r in recordings:
        if r.verdict["kind"] != "complete":
            assert f"  {r.path.resolve()}: {r.verdict['kind']}" in table.stdout
    out = streamtap("report", "--csv", str(record_dir))
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert sum(int(row["recordings"]) for row in rows) == len(recordings)
    for kind in ("complete", "truncated", "errored"):
        assert sum(int(row[kind]) for row in rows) == sum(r.verdict["kind"] == kind for r in recordings)


def test_reads_only_the_header_and_end_lines(recorded, tmp_path):
    """A line damaged mid-file makes the reader raise; the report never reads it. A file whose
    end line was cut (a killed proxy) is listed as an incomplete recording, not as a shorter turn."""
    from streamtap.recording import RecordingError, read_recording

    record_dir, recordings = recorded
    damaged = tmp_path / "damaged.jsonl"
    lines = recordings[0].path.read_bytes().split(b"\n")
    lines[1] = b"{not json"
    damaged.write_bytes(b"\n".join(lines))
    with pytest.raises(RecordingError):
        read_recording(damaged)
    cut = tmp_path / "cut.jsonl"
    data = recordings[0].path.read_bytes()
    cut.write_bytes(data[: data.rindex(b'{"type":"end"') + 30])
    out = streamtap("report", "--json", str(damaged), str(cut))
    report = json.loads(out.stdout)
    assert report["recordings"] == 2 and report["incomplete_files"] == 1
    assert report["verdicts"] == {recordings[0].verdict["kind"]: 1}
    [listed] = [item for item in report["incomplete"] if item["path"] == str(cut.resolve())]
    assert listed["verdict"] is None and listed["problem"].startswith("recording incomplete at byte")
    assert out.returncode == 1


def test_usage_errors_are_one_line(tmp_path):
    missing = streamtap("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    other = tmp_path / "body.jsonl"
    other.write_text('{"model":"x","done":true}\n')
    not_recording = streamtap("report", str(other))
    assert not_recording.returncode == 2 and "not a streamtap recording" in not_recording.stderr
    assert "Traceback" not in not_recording.stderr
    empty = streamtap("report", str(tmp_path))
    assert empty.returncode == 2 and "no recordings" in empty.stderr


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_html_page_renders_in_headless_chromium(recorded, tmp_path):
    record_dir, recordings = recorded
    page = tmp_path / "report.html"
    out = streamtap("report", "--html", str(page), str(record_dir))
    assert out.returncode == 1, out.stderr
    html = page.read_text()
    assert "<script" not in html.lower() and "src=" not in html and "href=" not in html  # self-contained
    assert html.count("<svg") == 1 + len({r.header["dialect"] for r in recordings})  # one rate chart per provider + the TTFT histogram
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); the page was checked without a browser")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<rect") >= len(recordings) // 2 and "TTFT distribution" in dom.stdout
    shot = Path(os.environ.get("STREAMTAP_SCREENSHOT_DIR", tmp_path)) / "report.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1100,1400", page.as_uri()], capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page with charts, not a blank one
