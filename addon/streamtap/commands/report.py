"""`streamtap report PATH...`: verdicts, stream ends, latency and reasons across many recordings.

Each recording costs its header line and its end line (found from the end of the file);
the figures are computed by an embedded DuckDB. A folder written by `streamtap index` is read
as it is (its Parquet files), without opening a recording.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

import orjson

from streamtap.cli import (
    EXIT_FINDING, EXIT_OK, Progress, UsageError, json_for_stdout, named_path, queries_stop_on_ctrl_c, refuse_recording_as_output, say,
    terminal_safe, write_file, write_out,
)
from streamtap.recording import RecordingError

# streamtap.recording.fleet (DuckDB, ~0.15 s to import) is imported where used, so that
# `streamtap report --help` does not pay for it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "PATH is a recording, a folder searched recursively for recordings (*.jsonl, *.jsonl.zst), or a folder "
        "written by `streamtap index` (read from its Parquet files). Examples: "
        "`streamtap report recordings/live/`, `streamtap report --json recordings/ | jq .verdicts`, "
        "`streamtap report --html report.html idx/`. Recordings a live proxy is still writing are left out (and change no exit code). "
        "What was left out (unreadable, still being written, not a recording) is counted in the table's first line, "
        "in --json's \"left_out\" and on the --html page. "
        "Exit codes: 0 every recording whole and judged complete, 1 any not (a turn not complete, a recording cut, damaged or without a verdict, "
        "or a folder or recording that could not be read), 2 usage error (no recordings under the paths given, among them; "
        "also an --html page that could not be written, which leaves the file as it was: the table is printed all the same, "
        "and the error line says what the report found and the exit code it would have had)."
    )
    parser.add_argument("paths", nargs="+", type=named_path, metavar="PATH", help="recordings, folders of recordings, or index folders")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the whole report as one JSON object (its \"verdicts\" maps each verdict to its count)")
    output.add_argument("--csv", action="store_true", help="print one CSV row per day, provider and model: verdict counts, recordings not judged, rates, TTFT and duration quantiles")
    parser.add_argument("--html", type=named_path, metavar="FILE",
                        help="also write a self-contained HTML page with charts (no scripts, no external files); "
                             "'-' prints the page instead of the table")
    parser.add_argument("--limit", type=int, default=20, metavar="N", help="incomplete recordings listed in the table (default 20; --json lists all)")


def load(con, paths: list[str], verb: str = "report", loaded=None) -> int:
    """Fill the table ``recordings`` from the inputs; returns the number of rows. ``loaded``
    (a ``fleet.Loaded``) learns what was left out. No recordings at all is a usage error (a
    mistyped folder), unless an index was named or recordings were there but left out."""
    from streamtap.recording import fleet
    from streamtap.recording.catalog import RECORDING_SUFFIXES, files_under, find_recordings, missing

    import duckdb

    indexes, others = [], []
    for raw in paths:
        path = Path(raw)
        if missing(path):  # one that cannot be looked at is there: its reading names it, and the run goes on
            raise UsageError(f"{path}: no such file or directory")
        (indexes if is_index(path) else others).append(raw)
    unique: dict[Path, str] = {}
    for raw in indexes:
        unique.setdefault(Path(raw).resolve(), raw)  # a folder given twice (idx and idx/) is read once
    indexes = list(unique.values())
    # an index written into a folder of recordings (index DIR/live --out DIR): the ones it does
    # not hold are read too, never hidden behind it
    others += [raw for raw in indexes if files_under(Path(raw), RECORDING_SUFFIXES)[0]]
    try:
        if indexes and not others and len(indexes) == 1:
            return fleet.open_index(con, Path(indexes[0]))
        indexed = set().union(*(fleet.indexed_paths(con, Path(d)) for d in indexes))  # a recording in an index counts once
    except duckdb.Error as exc:
        raise UsageError(not_an_index(indexes, exc)) from None
    loaded = loaded if loaded is not None else fleet.Loaded()
    filled = [Path(d) for d in indexes if fleet.index_files(Path(d))]  # an empty index has no file to select from
    rows = fleet.iter_rows(find_recordings(others), skip=indexed, loaded=loaded, progress=Progress(verb, "recordings read"))
    try:
        fleet.load_rows(con, rows, "loaded_rows" if filled else "recordings")
    except (RecordingError, OSError) as exc:  # a missing file, or a named file that is not a recording
        raise UsageError(str(exc)) from None
    warn(loaded, verb)
    if filled:
        try:  # (a day folder that names no date, say)
            con.execute(f"CREATE TEMP TABLE recordings AS SELECT * FROM loaded_rows UNION ALL BY NAME {fleet.select_index(filled)}")
        except duckdb.Error as exc:
            raise UsageError(not_an_index(filled, exc)) from None
    # an index's row of a .partial whose flow was finished since, maybe in the folder, and of a
    # recording moved since it was indexed, read again at its new place
    fleet.drop_stale(con)
    total = con.execute("SELECT count(*) FROM recordings").fetchone()[0]
    if not (total or indexes or loaded.unreadable or loaded.busy):
        raise UsageError(f"no recordings under {' '.join(paths)}")
    return total


def is_index(path: Path) -> bool:
    """A folder `streamtap index` wrote: its Parquet layout, or the mark every run leaves (an
    index run that found only recordings still being written leaves an empty index)."""
    from streamtap.recording import fleet

    from .index import INDEX_MARK

    try:
        return path.is_dir() and bool(fleet.index_files(path) or (path / INDEX_MARK).is_file())
    except OSError:  # a folder that cannot be read: searched as one, which says so and goes on
        return False


def not_an_index(folders: list, exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{', '.join(map(str, folders))}: its Parquet files are not a streamtap index ({first})"


def warn(loaded, verb: str) -> None:
    """Say on stderr, briefly, what was left out (names escaped: a shared folder's file names are
    anyone's text)."""
    if loaded.skipped:
        say(verb, f"skipped {len(loaded.skipped)} file(s) that are not recordings or cannot be read, e.g. {loaded.skipped[0]}")
    if loaded.busy:
        say(verb, f"left out {len(loaded.busy)} recording(s) a live proxy is still writing, e.g. {loaded.busy[0]}")
    for unknown in loaded.unreadable:  # each: a folder whose recordings, or a recording whose verdict, is unknown
        say(verb, unknown)


def left_out(loaded) -> dict[str, dict[str, Any]]:
    """What the report could not count, for its readers without the stderr (a JSON consumer, the
    page in a mail): each kind's count and items, as stderr says them (``PATH: why``; a busy
    recording as its path). A name that is not UTF-8 is written with escapes (``bad\\xffname``),
    as verify's JSON writes it: JSON cannot hold its bytes."""
    from streamtap.recording.reader import shown_path

    def kind(items: list[str]) -> dict[str, Any]:
        return {"count": len(items), "items": [shown_path(item) for item in items]}

    return {
        "unreadable": kind(loaded.unreadable),  # folders not searched, recordings not read: their verdicts are unknown
        "busy": kind(loaded.busy),  # a live proxy is still writing them
        "skipped": kind(loaded.skipped),  # files in folders that are not recordings
    }


def left_out_summary(data: dict[str, Any]) -> str:
    """One phrase naming what was left out, "" when nothing was."""
    kinds = data["left_out"]
    parts = []
    if kinds["unreadable"]["count"]:
        parts.append(f"{kinds['unreadable']['count']} recording(s) or folder(s) that could not be read, their verdicts unknown")
    if kinds["busy"]["count"]:
        parts.append(f"{kinds['busy']['count']} recording(s) a live proxy is still writing")
    if kinds["skipped"]["count"]:
        parts.append(f"{kinds['skipped']['count']} file(s) that are not recordings or cannot be read")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    with queries_stop_on_ctrl_c():  # which loads DuckDB first, with Ctrl-C held
        from streamtap.recording import fleet

        page_out = args.html == "-"
        if page_out and (args.json or args.csv):
            raise UsageError(f"--html - prints the page, and {'--json' if args.json else '--csv'} prints to stdout too: "
                             "name a file for the page")
        if args.html and not page_out:
            refuse_recording_as_output("--html", args.html)
        con = fleet.connect()
        loaded = fleet.Loaded()
        load(con, args.paths, loaded=loaded)
        data = {**fleet.report(con), "left_out": left_out(loaded)}
        html_failed = None
        if args.html:  # written before stdout, which a reader may close (| head): the page is still made
            from .report_html import render_html

            page = render_html(data, *fleet.time_series(con), fleet.ttft_values(con))
            try:
                if not page_out:
                    write_file(args.html, page)
            except OSError as exc:
                html_failed = exc.strerror or str(exc)
    if page_out:
        write_out(page, encoding="utf-8")  # the page says it is UTF-8
    elif args.json:
        write_out(json_for_stdout(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()) + "\n")
    elif args.csv:
        write_csv(data, sys.stdout, for_terminal=sys.stdout.isatty())
    else:
        write_out(terminal_safe(render_table(data, args.limit)))  # a model name with a newline keeps its row
    # every recording whole and judged complete: a damaged, cut or unjudged one is not, nor is
    # one that could not be read, and a folder that could not be read may hold any
    all_complete = (data["recordings"] == data["verdicts"].get("complete", 0) and not data["incomplete_files"]
                    and not loaded.unreadable)
    found = EXIT_OK if all_complete else EXIT_FINDING
    if html_failed:  # exit 2, as for any file that cannot be written, but the report's own finding is said: it is not lost
        raise UsageError(f"--html {args.html}: {html_failed}; the page was not written. The report (printed above) found: "
                         f"{finding(data, len(loaded.unreadable))} (exit {found} but for this)")
    return found


def finding(data: dict[str, Any], unreadable: int) -> str:
    """What the exit code of a report says, in words."""
    not_complete = data["recordings"] - data["verdicts"].get("complete", 0)
    parts = [f"{not_complete} of {data['recordings']} recording(s) not judged complete"] if not_complete else []
    if data["incomplete_files"]:
        parts.append(f"{data['incomplete_files']} recording file(s) incomplete")
    if unreadable:
        parts.append(f"{unreadable} folder(s) or recording(s) that could not be read")
    return ", ".join(parts) or "every recording whole and judged complete"


# --- text ------------------------------------------------------------------------------------


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _when(iso: str | None) -> str:
    return iso[:19].replace("T", " ") if iso else "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _cell(value: Any) -> str:
    """A value on one line of the table: a model name or reason is the provider's or the client's text,
    escaped before the columns are measured, so that an escape does not push the row's numbers aside."""
    return terminal_safe(str(value)).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [headers, *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return lines


def _group_rows(groups: list[dict[str, Any]], keys: list[str]) -> list[list[Any]]:
    return [
        [
            " ".join(str(g[k] if g[k] is not None else "-") for k in keys),
            g["recordings"],
            g["verdicts"].get("complete", 0),
            sum(n for kind, n in g["verdicts"].items() if kind != "complete"),
            g["not_judged"],
            _percent(g["not_complete_rate"]),
            _ms(g["ttft_ms"]["p50"]),
            _ms(g["ttft_ms"]["p95"]),
            _ms(g["ttft_ms"]["p99"]),
            _ms(g["duration_ms"]["p50"]),
            _ms(g["duration_ms"]["p95"]),
            _ms(g["duration_ms"]["p99"]),
        ]
        for g in groups
    ]


# "not judged": cut, damaged or without a verdict; "% not complete": of the judged turns (the verdict
# table's "rate" is each verdict's share, so this one says which share it is)
GROUP_HEADERS = ["recordings", "complete", "not complete", "not judged", "% not complete", "ttft p50", "p95", "p99",
                 "duration p50", "p95", "p99"]


def render_table(data: dict[str, Any], limit: int) -> str:
    not_counted = left_out_summary(data)
    out = [
        f"{data['recordings']} recordings, {_when(data['first'])} .. {_when(data['last'])} UTC"
        + (f"; {data['incomplete_files']} recording file(s) incomplete" if data["incomplete_files"] else "")
        + (f"; left out: {not_counted} (named on stderr)" if not_counted else ""),
        "",
    ]
    out += _table(["verdict", "count", "rate"], [[k, n, _percent(data["rates"].get(k))] for k, n in data["verdicts"].items()])
    for title, key, keys in (("provider", "by_provider", ["provider"]), ("provider model", "by_model", ["provider", "model"]), ("day", "by_day", ["day"])):
        out += ["", *_table([title, *GROUP_HEADERS], _group_rows(data[key], keys))]
    out += ["", "stream end: " + (", ".join(f"{k} {n}" for k, n in data["stream_end"].items()) or "-")]
    out.append(
        "ttft ms: " + " ".join(f"{q} {_ms(v)}" for q, v in data["ttft_ms"].items())
        + "   duration ms: " + " ".join(f"{q} {_ms(v)}" for q, v in data["duration_ms"].items())
    )
    if data["reasons"]:
        out += ["", "most frequent reasons (not complete):"]
        out += [f"  {r['count']:>6}  {r['verdict']}: {_cell(r['reason'] or '-')}" for r in data["reasons"]]
    incomplete = data["incomplete"]
    if incomplete:
        out += ["", f"not complete ({len(incomplete)}):"]
        for item in incomplete[:limit]:
            what, why = verdict_and_why(item)
            end = f" [{item['stream_end']}]" if item["stream_end"] not in (None, "finished") else ""
            out.append(f"  {_cell(item['path'])}: {what}{end} ({_cell(why)})")
        if len(incomplete) > limit:
            out.append(f"  ... and {len(incomplete) - limit} more (--limit N, or --json for all)")
    return "\n".join(out) + "\n"


def verdict_and_why(item: dict[str, Any]) -> tuple[str, str]:
    """What to say about a recording in the not-complete list, and why."""
    if item["verdict"] is not None:
        if item["problem"]:  # a verdict kept by a recording that is not whole (never renamed): both, as verify says
            return item["verdict"], f"{item['reason'] or '-'}; recording: {item['problem']}"
        return item["verdict"], item["reason"] or "-"
    if item["problem"]:
        return "recording incomplete", item["problem"]
    return "no verdict", "the end line holds no verdict"


# --- CSV ---------------------------------------------------------------------------------------


def write_csv(data: dict[str, Any], stream, for_terminal: bool = False) -> None:
    """One row per day, provider and model. Recorded text (a model name) is written exact, as
    data, unless ``for_terminal``: CSV has no escapes of its own, so on a terminal what it would
    act on (ESC, BEL) is written as the table writes it."""
    from streamtap.recording.fleet import VERDICT_ORDER

    def text(value: str) -> str:
        return terminal_safe(value) if for_terminal else value

    kinds = list(dict.fromkeys([*VERDICT_ORDER, *data["verdicts"]]))
    # RFC 4180's CRLF: the writer quotes a field holding any character of the line end, so with LF
    # alone a model name holding a bare CR went out unquoted and split its row in every reader
    writer = csv.writer(stream, lineterminator="\r\n")
    writer.writerow(
        ["day", "provider", "model", "recordings", *kinds, "not_judged", "not_complete_rate", "incomplete_files",
         "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99", "duration_ms_p50", "duration_ms_p95", "duration_ms_p99"]
    )
    for g in data["by_day_provider_model"]:
        writer.writerow(
            [g["day"], text(g["provider"]), text(g["model"] or ""), g["recordings"], *(g["verdicts"].get(k, 0) for k in kinds),
             g["not_judged"], "" if g["not_complete_rate"] is None else g["not_complete_rate"], g["incomplete_files"],
             *("" if v is None else v for v in g["ttft_ms"].values()), *("" if v is None else v for v in g["duration_ms"].values())]
        )
