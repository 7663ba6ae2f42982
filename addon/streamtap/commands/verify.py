"""`streamtap verify FILE...`: one line per file, exit 0 only when every turn is complete.

Also home of the input loading that `show` shares: raw bodies (`.sse`, `.ndjson`,
`.bin`/`.eventstream`, `.json` array, anything else sniffed) and streamtap recordings
(detected by their header line, read with `streamtap.recording.read_recording`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from streamtap.cli import EXIT_FINDING, EXIT_OK, UsageError
from streamtap.providers import Analysis, Dialect, StreamEnd, StreamSession, sniff_dialect

HELP = "Judge captured streams: one line per file; exit 0 only if every turn is complete."

PROVIDERS = [d.value for d in Dialect if d is not Dialect.UNKNOWN]

EXTENSION_WIRE = {
    ".sse": "sse",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
    ".bin": "eventstream",
    ".eventstream": "eventstream",
    ".json": "json-array",
}

RECORDING_MARK = b'"streamtap-recording/'


@dataclass(slots=True)
class Judged:
    path: Path
    analysis: Analysis
    dialect: Dialect
    how: str  # how the dialect was chosen: "--provider", "sniffed: ...", "recording header"
    source: str  # "raw body" | "recording"
    problem: str | None = None  # e.g. an incomplete recording file


def add_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="raw response bodies or streamtap recordings")
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        metavar="NAME",
        help=f"dialect of raw bodies: {', '.join(PROVIDERS)} (default: sniffed from the content, and said so)",
    )
    parser.add_argument("--sentinel", metavar="LINE", help="exact last line the answer must end with; missing => truncated")
    parser.add_argument("--json", action="store_true", help="print one JSON object per file (turn and verdict)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Verdicts: complete, truncated, stopped_by_limit, filtered, errored, corrupt, unknown. "
        "Exit codes: 0 every file complete, 1 any file not complete, 2 usage error."
    )
    add_input_options(parser)


def judge_files(args: argparse.Namespace) -> list[Judged]:
    paths = [Path(p) for p in args.files]
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file")
        if not path.is_file():
            raise UsageError(f"{path}: not a file")
    return [judge_file(path, args.provider, args.sentinel) for path in paths]


def judge_file(path: Path, provider: str | None, sentinel: str | None) -> Judged:
    if path.name.endswith(".jsonl.zst"):  # a compressed recording (raw bodies are given uncompressed)
        return _judge_recording(path, sentinel)
    data = path.read_bytes()
    if data[:200].lstrip().startswith(b"{") and RECORDING_MARK in data.split(b"\n", 1)[0]:
        return _judge_recording(path, sentinel)
    wire = EXTENSION_WIRE.get(path.suffix.lower())
    if provider:
        dialect, how = Dialect(provider), "--provider"
        if wire is None:
            wire = sniff_dialect(data).wire
    else:
        detection = sniff_dialect(data)
        dialect, how = detection.dialect, detection.why
        wire = wire if wire and (wire == detection.wire or detection.dialect is Dialect.UNKNOWN) else detection.wire
    if dialect is Dialect.GEMINI and wire not in ("sse", "json-array"):
        wire = "sse"
    session = StreamSession(dialect, wire, sentinel=sentinel)
    session.feed(data)
    return Judged(path, session.close(StreamEnd.FINISHED), dialect, how, "raw body")


def _judge_recording(path: Path, sentinel: str | None) -> Judged:
    from streamtap.recording import check_recording, read_recording

    try:
        recording = read_recording(path)
    except Exception as exc:  # a damaged file is the user's input problem, said in one line
        raise UsageError(f"{path}: cannot read recording: {exc}") from None
    header = recording.header
    problems = check_recording(recording)  # sums, sequence, offsets, body hash; the cut-file problem first
    if sentinel is None:
        sentinel = header.get("sentinel")  # judge with the sentinel the proxy used
    try:
        dialect = Dialect(header.get("dialect") or "unknown")
    except ValueError:
        dialect = Dialect.UNKNOWN
    wire = (header.get("wire") or {}).get("format")  # the reader checked the header's types
    status = (header.get("response") or {}).get("status") or 200
    try:
        session = StreamSession(dialect, wire or None, http_status=status, sentinel=sentinel)
    except ValueError as exc:  # a wire format this build does not know
        raise UsageError(f"{path}: cannot judge recording: {exc}") from None
    for segment in recording.segments:
        session.feed(segment.raw, segment.t_ms / 1000 if segment.t_ms is not None else None)
    end = (recording.end or {}).get("stream_end") or "finished"
    try:
        stream_end = StreamEnd(end)
    except ValueError:
        stream_end = StreamEnd.FINISHED
    analysis = session.close(stream_end)
    recorded = (recording.verdict or {}).get("kind")
    if recorded and recorded != analysis.verdict.kind.value:
        problems.append(f"the recording says {recorded}, judging its bytes again says {analysis.verdict.kind.value}")
    return Judged(path, analysis, dialect, "recording header", "recording", "; ".join(problems) or None)


def as_json(judged: Judged) -> dict:
    return {
        "file": str(judged.path),
        "source": judged.source,
        "dialect": judged.dialect.value,
        "detected": judged.how,
        "wire": judged.analysis.wire,
        "bytes": judged.analysis.bytes,
        "problem": judged.problem,
        "verdict": judged.analysis.verdict.to_dict(),
        "turn": judged.analysis.turn.to_dict(),
    }


def print_json(judged: Judged) -> None:
    sys.stdout.write(orjson.dumps(as_json(judged)).decode() + "\n")


def summary_line(judged: Judged) -> str:
    verdict = judged.analysis.verdict
    how = "" if judged.how in ("--provider", "recording header") else f", {judged.how}"
    where = f" [seq {verdict.seq}, byte {verdict.offset}]" if verdict.seq is not None or verdict.offset is not None else ""
    problem = f" (recording: {judged.problem})" if judged.problem else ""
    return f"{judged.path}: {verdict.kind} ({judged.dialect}{how}) {verdict.reason}{where}{problem}"


def run(args: argparse.Namespace) -> int:
    results = judge_files(args)
    for judged in results:
        if args.json:
            print_json(judged)
        else:
            print(summary_line(judged))
    return EXIT_OK if all(j.analysis.verdict.ok and not j.problem for j in results) else EXIT_FINDING
