"""The fleet view where paths and names are not the plain ones: an index kept under a folder
whose name looks like a partition, links in a folder of recordings, a model name holding a bare
CR in the CSV, and the HTML chart's time axis over many buckets."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess

from test_fleet_edges import STREAMTAP, recording, streamtap

DAY = 86400
START = 1796083200  # 2026-12-01 00:00 UTC


def test_an_index_under_a_folder_named_like_a_partition_reports_its_own_days_and_providers(tmp_path):
    """DuckDB's hive reading takes key=value from every folder of a file's path: an index kept
    under provider=team-a/ reported every recording as that provider's."""
    folder = tmp_path / "recordings"
    folder.mkdir()
    for i, dialect in enumerate(("anthropic", "openai-chat")):
        recording(folder, f"r{i}.jsonl", header={"started": START + i * DAY, "dialect": dialect})
    expected = json.loads(streamtap("report", "--json", folder).stdout)
    for parent in ("provider=team-a", "day=2020-01-01"):
        index = tmp_path / "lake" / parent / "idx"
        assert streamtap("index", folder, "--out", index).returncode == 0
        got = json.loads(streamtap("report", "--json", index).stdout)
        assert {k: v for k, v in got.items() if k != "sources"} == {k: v for k, v in expected.items() if k != "sources"}


def test_a_model_name_with_a_bare_cr_keeps_its_csv_row(tmp_path):
    for i, model in enumerate(("gpt\rx", "a\nb", "c,d")):
        recording(tmp_path, f"r{i}.jsonl", end={"turn.model": model})
    out = subprocess.run([*STREAMTAP, "report", "--csv", str(tmp_path)], capture_output=True, timeout=60)
    rows = list(csv.reader(io.StringIO(out.stdout.decode(), newline="")))
    assert len({len(row) for row in rows}) == 1 and len(rows) == 4, rows
    assert sorted(row[2] for row in rows[1:]) == ["a\nb", "c,d", "gpt\rx"]


def test_links_in_a_folder_are_followed_once(tmp_path):
    """A linked folder of recordings (another disk) was left out without a word; a link to a
    recording counted it twice; a link back up the tree is no loop."""
    disk = tmp_path / "disk2"
    disk.mkdir()
    for i in range(3):
        recording(disk, f"remote{i}.jsonl")
    folder = tmp_path / "recordings"
    (folder / "local").mkdir(parents=True)
    original = recording(folder / "local", "local.jsonl")
    (folder / "remote").symlink_to(disk)
    (folder / "latest.jsonl").symlink_to(original)
    (folder / "local" / "up").symlink_to(folder)
    report = streamtap("report", "--json", folder)
    assert json.loads(report.stdout)["recordings"] == 4, report.stderr
    index = tmp_path / "idx"
    assert streamtap("index", folder, "--out", index).returncode == 0
    assert json.loads(streamtap("report", "--json", index).stdout)["recordings"] == 4
    verified = streamtap("verify", folder)
    assert verified.stdout.count(": complete (") == 4, verified.stdout
    # given again by its real folder, or by name, a recording reached through a link is still one
    both = streamtap("report", "--json", folder, disk, original)
    assert json.loads(both.stdout)["recordings"] == 4, both.stderr
    assert streamtap("index", disk, "--out", index).returncode == 0
    assert json.loads(streamtap("report", "--json", index).stdout)["recordings"] == 4
    from streamtap.replay.match import Library

    assert len(Library.load([folder, disk, folder]).entries) == 4


def test_the_time_axis_labels_of_the_html_chart_never_overlap(tmp_path):
    for days in (3, 10, 12, 40):
        folder = tmp_path / f"d{days}"
        folder.mkdir()
        for i in range(days):
            recording(folder, f"r{i}.jsonl", header={"started": START + i * DAY})
        page = folder / "report.html"
        assert streamtap("report", "--html", page, folder).returncode == 0
        svg = page.read_text().split("verdict rate over time", 1)[1].split("</svg>", 1)[0]
        labels = [(float(x), text) for x, text in re.findall(r'<text x="([\d.]+)" y="\d+" text-anchor="middle">([^<]+)<', svg)]
        assert labels and labels[0][1] in ("2026-12-01", "12-01 00:00"), labels
        # 10 characters of the 11 px axis font take about 60 px
        assert all(b[0] - a[0] >= 66 for a, b in zip(labels, labels[1:])), (days, labels)
        assert len(labels) >= min(days, 4), (days, labels)


def _bars(page_text: str) -> dict[str, dict[str, float]]:
    """Each rate chart's bars: provider -> the bar's bucket (its tooltip's) -> its x."""
    charts = re.findall(r'aria-label="verdict rate over time, ([^,"]+)[^"]*">(.*?)</svg>', page_text)
    return {provider: {title: float(x) for x, title in re.findall(r'<rect x="([\d.]+)"[^>]*><title>([^<:]+):', svg)} for provider, svg in charts}


def test_the_html_charts_place_each_bar_at_its_time_on_one_axis_for_every_provider(tmp_path):
    """Bars stood side by side in the order of the buckets that had turns: a provider seen on the
    third and the tenth day had its two bars next to each other mid-chart, in line with another
    provider's days, and a gap in time did not show. Each chart's axis runs from the first turn
    of all providers to the last, so the same day is at the same x in each."""
    for day in range(10):
        recording(tmp_path, f"a{day}.jsonl", header={"started": START + day * DAY + 3600})
    for day in (2, 9):
        recording(tmp_path, f"o{day}.jsonl", header={"started": START + day * DAY + 7200, "dialect": "openai-chat"})
    page = tmp_path / "report.html"
    assert streamtap("report", "--html", page, tmp_path).returncode == 0
    bars = _bars(page.read_text())
    days = [f"2026-12-{day:02d}" for day in range(1, 11)]
    assert sorted(bars["anthropic"]) == days and sorted(bars["openai-chat"]) == [days[2], days[9]], bars
    step = bars["anthropic"][days[1]] - bars["anthropic"][days[0]]
    assert step > 0 and all(abs(bars["anthropic"][day] - (bars["anthropic"][days[0]] + i * step)) < 0.2 for i, day in enumerate(days))
    assert bars["openai-chat"] == {day: bars["anthropic"][day] for day in (days[2], days[9])}  # one axis: the same day, the same x


def test_the_html_charts_take_weeks_or_months_when_days_would_be_too_many_bars(tmp_path):
    """1,100 days made 1,100 bars thinner than a pixel; the bucket is coarsened until the axis
    holds at most 150, and the chart says which."""
    for span, bucket, buckets in ((400, "week", ["week of 2026-11-30", "week of 2027-01-04"]), (1099, "month", ["2026-12", "2027-02", "2029-12"])):
        folder = tmp_path / str(span)
        folder.mkdir()
        for i, day in enumerate((0, 35 if bucket == "week" else 62, span)):
            recording(folder, f"r{i}.jsonl", header={"started": START + day * DAY})
        page = folder / "report.html"
        assert streamtap("report", "--html", page, folder).returncode == 0
        text = page.read_text()
        assert f"Verdict rate over time, per provider (by {bucket})" in text and f"one bar per {bucket}" in text
        bars = _bars(text)["anthropic"]
        assert sorted(bars)[: len(buckets)] == buckets and len(bars) == 3, bars
        width = float(re.search(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', text.split("verdict rate over time", 1)[1])[1])
        assert width >= 3, width  # at most 150 buckets on the axis
        first, middle, last = sorted(bars.values())
        weeks_or_months = (5, 57) if bucket == "week" else (2, 36)
        assert abs((middle - first) / (last - first) - weeks_or_months[0] / weeks_or_months[1]) < 0.01, bars  # placed by time
