"""The `--html` page of `streamtap report`: one self-contained file, charts as inline SVG.

No scripts and no external files: the page opens the same offline, in a mail attachment or
in a CI artifact viewer. Every text from a recording is escaped, for HTML and as the table
writes it (a right-to-left override as ``\u202e``: a model name must not read as another's; a
newline as ``\n``: HTML would show it as a space, and ``a\nb`` would read as ``a b``).
"""

from __future__ import annotations

import bisect
import calendar
import html
import math
import time
from typing import Any

from streamtap.cli import terminal_safe

from .report import GROUP_HEADERS

VERDICT_COLORS = {
    "complete": "#2e7d32",
    "stopped_by_limit": "#f9a825",
    "filtered": "#8e24aa",
    "errored": "#c62828",
    "truncated": "#ef6c00",
    "corrupt": "#5d4037",
    "unknown": "#9e9e9e",
}
OTHER_COLOR = "#607d8b"
PROVIDER_COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#4e342e", "#455a64"]
TTFT_EDGES_MS = [0, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800]  # doubling bins: TTFT spans orders of magnitude
LISTED = 200  # incomplete recordings listed on the page
MOST_BARS = 150  # buckets on a rate chart's axis: more would be thinner than a few pixels, and a coarser bucket is used
COARSER = {"hour": "day", "day": "week", "week": "month", "month": "year"}

# A column of recorded text (.text) breaks anywhere, so that a long unbroken name or reason
# wraps; its min-width keeps the table from squeezing it to a character a line to make room for
# another (the first, a name, and the last, a reason, wider: a phone's width still holds the four
# of the Not complete table). A table wider than the page scrolls in its own box (.scroll), the
# page stays put; the charts scale down to a phone's width (their viewBox).
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212121;max-width:1100px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right;vertical-align:top}
.text{text-align:left;overflow-wrap:anywhere;min-width:6ch}.text:first-child,.text:last-child{min-width:12ch}
td.path{font-family:monospace;font-size:12px}
svg{max-width:100%;height:auto}
@media (max-width:480px){body{margin:12px}td,th{padding:3px 5px}}
h3,.legend span{overflow-wrap:anywhere}
.legend span{display:inline-block;margin-right:14px}.swatch{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
svg text{font:11px system-ui,sans-serif;fill:#424242}
.left-out{font-weight:bold;color:#c62828}
"""


def escape(text: str) -> str:
    return html.escape(terminal_safe(text, one_line=True))


def _color(verdict: str) -> str:
    return VERDICT_COLORS.get(verdict, OTHER_COLOR)


def _slot(t: int, bucket: str) -> int:
    """The number of the bucket holding time ``t`` (UTC), counted so that buckets next to each
    other in time have numbers next to each other: the charts' x axis."""
    if bucket == "hour":
        return t // 3600
    days = t // 86400
    if bucket == "day":
        return days
    if bucket == "week":
        return (days + 3) // 7  # weeks from Monday: 1970-01-01 was a Thursday
    year, month = time.gmtime(t)[:2]
    return year * 12 + month - 1 if bucket == "month" else year


def _slot_start(slot: int, bucket: str) -> int:
    if bucket == "hour":
        return slot * 3600
    if bucket == "day":
        return slot * 86400
    if bucket == "week":
        return (slot * 7 - 3) * 86400
    year, month = (slot // 12, slot % 12 + 1) if bucket == "month" else (slot, 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def _bucket_label(t: int, bucket: str) -> str:
    return time.strftime({"hour": "%m-%d %H:00", "month": "%Y-%m", "year": "%Y"}.get(bucket, "%Y-%m-%d"), time.gmtime(t))


def _bucket_name(t: int, bucket: str) -> str:
    """A bucket in a bar's tooltip: a week is named by its Monday."""
    return ("week of " if bucket == "week" else "") + _bucket_label(t, bucket)


def coarsened(bucket: str, series: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """``series`` in the finest bucket (from ``bucket`` up: day, week, month, year) whose axis,
    from the first turn to the last, holds at most MOST_BARS buckets. Each coarser bucket is
    counted from ``series`` itself: a week's Monday may lie in the month before its days."""
    def span(bucket: str) -> int:
        slots = [_slot(item["t"], bucket) for item in series]
        return max(slots) - min(slots) + 1

    coarse = bucket
    while series and coarse in COARSER and span(coarse) > MOST_BARS:
        coarse = COARSER[coarse]
    if coarse == bucket:
        return bucket, series
    merged: dict[tuple[int, str, str], int] = {}
    for item in series:
        key = (_slot_start(_slot(item["t"], coarse), coarse), item["provider"], item["verdict"])
        merged[key] = merged.get(key, 0) + item["count"]
    return coarse, [{"t": t, "provider": p, "verdict": v, "count": n} for (t, p, v), n in sorted(merged.items())]


def verdict_rate_chart(provider: str, bucket: str, series: list[dict[str, Any]], axis: tuple[int, int] | None = None) -> str:
    """Stacked bars: for each time bucket, the share of each verdict among the provider's turns.
    Each bar stands at its bucket's place on ``axis`` (the first and last bucket numbers, one axis
    for every provider's chart, so that they line up); a bucket without turns is a gap."""
    buckets: dict[int, dict[str, int]] = {}
    for item in series:
        if item["provider"] == provider:
            buckets.setdefault(_slot(item["t"], bucket), {})[item["verdict"]] = item["count"]
    first, last = axis or (min(buckets, default=0), max(buckets, default=0))
    width, height, left, bottom, top = 640, 196, 44, 50, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    step = plot_w / (last - first + 1)
    bar = max(min(step * 0.8, 60), 1)
    # one label every `every` buckets, so that labels (about 6.6 px a character at the axis's
    # 11 px, and a gap) never run into each other; each bar's tooltip names its own bucket
    label_px = len(_bucket_label(_slot_start(first, bucket), bucket)) * 6.6 + 8
    every = max(math.ceil(label_px / step), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="verdict rate over time, {escape(provider)}, by {bucket}">']
    _gridlines(parts, width, left, top, plot_h, lambda share: f"{share * 100:.0f}%")
    for slot in range(first, last + 1, every):
        middle = left + (slot - first + 0.5) * step
        if middle + (label_px - 8) / 2 > width:  # it would be cut at the chart's edge
            break
        label = _bucket_label(_slot_start(slot, bucket), bucket)
        parts.append(f'<text x="{middle:.1f}" y="{height - bottom + 16}" text-anchor="middle">{escape(label)}</text>')
    for slot, counts in sorted(buckets.items()):
        total = sum(counts.values())
        x = left + (slot - first) * step + (step - bar) / 2
        y = top + plot_h
        name = _bucket_name(_slot_start(slot, bucket), bucket)
        for verdict in sorted(counts, key=lambda v: (v != "complete", v)):
            h = plot_h * counts[verdict] / total
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{_color(verdict)}">'
                f"<title>{escape(name)}: {escape(verdict)} {counts[verdict]} of {total}</title></rect>"
            )
    what = "week (from Monday)" if bucket == "week" else bucket
    parts.append(f'<text x="{width - 10}" y="{height - 6}" text-anchor="end">one bar per {what}, UTC</text></svg>')
    return "".join(parts)


def _short(ms: int) -> str:
    return f"{ms / 1000:g}k" if ms >= 1000 else str(ms)


def ttft_histogram(values: list[tuple[str, float]], providers: list[str]) -> str:
    """Turns per TTFT bin (doubling widths), stacked by provider."""
    labels = [f"{_short(a)}–{_short(b)}" for a, b in zip(TTFT_EDGES_MS, TTFT_EDGES_MS[1:])] + [f"≥{_short(TTFT_EDGES_MS[-1])}"]
    counts = [[0] * len(providers) for _ in labels]
    for provider, ttft in values:
        index = max(bisect.bisect_right(TTFT_EDGES_MS, ttft) - 1, 0)
        counts[index][providers.index(provider)] += 1
    width, height, left, bottom, top = 640, 200, 44, 34, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    tallest = max((sum(c) for c in counts), default=0) or 1
    step = plot_w / len(labels)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             'aria-label="TTFT distribution">']
    _gridlines(parts, width, left, top, plot_h, lambda share: f"{tallest * share:g}")  # (half of 1 turn: 0.5)
    for i, label in enumerate(labels):
        x, y = left + i * step + step * 0.1, top + plot_h
        for p, n in enumerate(counts[i]):
            if not n:
                continue
            h = plot_h * n / tallest
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.8:.1f}" height="{h:.1f}" fill="{PROVIDER_COLORS[p % len(PROVIDER_COLORS)]}">'
                f"<title>{escape(providers[p])}: {n} turns with TTFT {escape(label)} ms</title></rect>"
            )
        parts.append(f'<text x="{left + i * step + step / 2:.1f}" y="{height - bottom + 16}" text-anchor="middle">{escape(label)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">TTFT, ms</text></svg>')
    return "".join(parts)


def _legend(items: list[tuple[str, str]]) -> str:
    return '<p class="legend">' + "".join(f'<span><i class="swatch" style="background:{c}"></i>{escape(name)}</span>' for name, c in items) + "</p>"


def _rows(headers: list[str], rows: list[list[Any]], text_columns: tuple[int, ...] = (0,), path_column: int | None = None) -> str:
    """A table whose ``text_columns`` (and ``path_column``) hold text, left-aligned and wrapped;
    the others figures. It scrolls sideways on its own when the page is narrower than its figures."""
    def css(i: int) -> str:
        return ' class="text path"' if i == path_column else ' class="text"' if i in text_columns else ""

    head = "".join(f"<th{css(i)}>{escape(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{css(i)}>{escape(str(c))}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _groups(groups: list[dict[str, Any]], keys: list[str]) -> str:
    return _rows(
        [" ".join(keys), *GROUP_HEADERS],
        [
            [" ".join(str(g[k]) if g[k] is not None else "-" for k in keys), g["recordings"], g["verdicts"].get("complete", 0),
             sum(n for k, n in g["verdicts"].items() if k != "complete"), g["not_judged"], _pct(g["not_complete_rate"]),
             *(_ms(v) for v in g["ttft_ms"].values()), *(_ms(v) for v in g["duration_ms"].values())]
            for g in groups
        ],
    )


# the kinds of report["left_out"]: the page's heading for each (what it means for the figures)
# and its column's
LEFT_OUT_HEADINGS = {
    "unreadable": ("Could not be read (the recordings in it, or its verdict, are unknown)", "path: why"),
    "busy": ("Still being written by a live proxy", "recording"),
    "skipped": ("Skipped: not recordings, or cannot be read", "path: why"),
}


def _left_out_section(left_out: dict[str, dict[str, Any]]) -> str:
    """What the figures above do not count, each kind listed: the page is read without the stderr
    that named them (a mail, a CI artifact)."""
    total = sum(kind["count"] for kind in left_out.values())
    if not total:
        return ""
    parts = [f"<h2>Left out ({total})</h2>"]
    for key, (heading, column) in LEFT_OUT_HEADINGS.items():
        kind = left_out[key]
        if kind["count"]:
            more = f"<p>… and {kind['count'] - LISTED} more (streamtap report --json lists all).</p>" if kind["count"] > LISTED else ""
            parts.append(f"<h3>{escape(heading)} ({kind['count']})</h3>{_rows([column], [[item] for item in kind['items'][:LISTED]], path_column=0)}{more}")
    return "".join(parts)


def _all_judged_complete(not_judged: int, not_counted: str) -> str:
    """That every judged turn is complete, never alone when some recordings were not judged: those
    read but cut, damaged or without a verdict, and those left out."""
    unjudged = []
    if not_judged:
        unjudged.append(f"{not_judged} recording(s) read were not judged (cut, damaged or without a verdict: listed under Not complete)")
    if not_counted:
        unjudged.append(f"left out {not_counted}")
    if not unjudged:
        return "Every judged turn is complete."
    return f"Every judged turn is complete, but not every recording was judged: {'; '.join(unjudged)}."


def render_html(data: dict[str, Any], bucket: str, series: list[dict[str, Any]], ttft: list[tuple[str, float]]) -> str:
    providers = [g["provider"] for g in data["by_provider"]]
    verdicts_seen = list(dict.fromkeys(item["verdict"] for item in series))
    bucket, series = coarsened(bucket, series)
    slots = [_slot(item["t"], bucket) for item in series]
    axis = (min(slots), max(slots)) if slots else None
    charts = "".join(
        f"<h3>{escape(p)}</h3>{verdict_rate_chart(p, bucket, series, axis)}" for p in providers if any(s["provider"] == p for s in series)
    )
    incomplete = data["incomplete"]
    from .report import left_out_summary, verdict_and_why

    listed = [[item["path"], verdict_and_why(item)[0], item["stream_end"] or "-", verdict_and_why(item)[1]] for item in incomplete[:LISTED]]
    more = f"<p>… and {len(incomplete) - LISTED} more (streamtap report --json lists all).</p>" if len(incomplete) > LISTED else ""
    judged = sum(data["verdicts"].values())
    not_counted = left_out_summary(data)
    no_reasons = ("<p>No turn was judged: no recording holds a verdict.</p>" if not judged
                  else f"<p>{escape(_all_judged_complete(data['recordings'] - judged, not_counted))}</p>")
    left_out_line = f'<p class="left-out">Left out: {escape(not_counted)} (listed below).</p>' if not_counted else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>streamtap report</title><style>{STYLE}</style></head><body>
<h1>streamtap report: {data['recordings']} recordings</h1>
<p>{escape((data['first'] or '-')[:19].replace("T", " "))} … {escape((data['last'] or '-')[:19].replace("T", " "))} UTC{f"; {data['incomplete_files']} recording file(s) incomplete" if data['incomplete_files'] else ""}</p>
{left_out_line}
<h2>Verdicts</h2>
{_rows(["verdict", "count", "rate"], [[k, n, _pct(data["rates"].get(k))] for k, n in data["verdicts"].items()])}
<h2>Verdict rate over time, per provider (by {bucket})</h2>
{_legend([(v, _color(v)) for v in sorted(verdicts_seen, key=lambda v: (v != "complete", v))])}
{charts or "<p>No judged turns.</p>"}
<h2>TTFT distribution</h2>
{_legend([(p, PROVIDER_COLORS[i % len(PROVIDER_COLORS)]) for i, p in enumerate(providers)])}
{ttft_histogram(ttft, providers) if ttft else "<p>No turn has a TTFT.</p>"}
<p>TTFT ms: {" ".join(f"{q} {_ms(v)}" for q, v in data["ttft_ms"].items())}; duration ms: {" ".join(f"{q} {_ms(v)}" for q, v in data["duration_ms"].items())}</p>
<h2>By provider</h2>{_groups(data["by_provider"], ["provider"])}
<h2>By model</h2>{_groups(data["by_model"], ["provider", "model"])}
<h2>By day</h2>{_groups(data["by_day"], ["day"])}
<h2>Stream ends</h2>
{_rows(["stream end", "count"], [[k, n] for k, n in data["stream_end"].items()])}
<h2>Most frequent reasons</h2>
{_rows(["count", "verdict", "reason"], [[r["count"], r["verdict"], r["reason"] or "-"] for r in data["reasons"]], text_columns=(1, 2)) if data["reasons"] else no_reasons}
<h2>Not complete ({len(incomplete)})</h2>
{_rows(["recording", "verdict", "stream end", "why"], listed, text_columns=(1, 2, 3), path_column=0) if listed else "<p>None of the recordings read.</p>" if not_counted else "<p>None.</p>"}{more}
{_left_out_section(data["left_out"])}
</body></html>
"""


def _gridlines(parts: list[str], width: int, left: int, top: int, plot_h: float, label) -> None:
    """Horizontal lines at 0, half and full height, each labelled ``label(share)`` on the axis."""
    for share in (0, 0.5, 1):
        y = top + plot_h * (1 - share)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label(share)}</text>')
