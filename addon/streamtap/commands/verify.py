"""`streamtap verify FILE...`: one line per file, exit 0 only when every turn is complete.

Also home of the input loading that `show` shares: raw bodies (`.sse`, `.ndjson`,
`.bin`/`.eventstream`, `.json` array, anything else sniffed) and streamtap recordings
(detected by their header line, read with `streamtap.recording.read_recording`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from streamtap.cli import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UsageError, json_for_stdout, named_path, say, terminal_safe, write_out
from streamtap.providers import (
    Analysis,
    Detection,
    Dialect,
    StreamEnd,
    StreamSession,
    Verdict,
    VerdictKind,
    analyze_error_document,
    sentinel_problem,
    sniff_dialect,
)
from streamtap.providers.common import dumps, loads
from streamtap.providers.judge import DROPPED, ENDING_KINDS, TEXT_CAP
from streamtap.providers.request import may_resume
from streamtap.recording.catalog import files_under
from streamtap.recording.content import (
    WireBodyCheck,
    content_encoded,
    delimited_by_length,
    judge_coding_streams,
    judge_unaccepted_coding,
    judge_undelivered,
    judge_unfinished_coding,
)
from streamtap.recording.importer import begins_a_flow
from streamtap.recording.reader import EventViews, analysis_stopped, shown_path
from streamtap.wire import DEFAULT_MAX_EVENT


PROVIDERS = [d.value for d in Dialect if d is not Dialect.UNKNOWN]

EXTENSION_WIRE = {
    ".sse": "sse",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
    ".bin": "eventstream",
    ".eventstream": "eventstream",
    ".json": "json-array",
}

# what a directory given as input contributes (once each: ".jsonl" is also a wire suffix)
DIRECTORY_SUFFIXES = tuple(dict.fromkeys((".jsonl", ".jsonl.zst", *EXTENSION_WIRE)))

WIRE_NAMES = {"sse": "SSE", "eventstream": "AWS event-stream", "ndjson": "NDJSON", "json-array": "a JSON array"}

SNIFF_BYTES = 1024 * 1024  # a raw body's dialect is sniffed from its start; the rest is fed in reads of this size


@dataclass(slots=True)
class Judged:
    path: Path
    analysis: Analysis
    dialect: Dialect
    how: str  # how the dialect was chosen: "--provider", "sniffed: ...", "recording header"
    source: str  # "raw body" | "recording"
    problem: str | None = None  # e.g. an incomplete recording file
    injected_fault: str | None = None  # the faults streamtap injected into this answer (the recording says)


@dataclass(slots=True)
class Unjudged:
    """An input that could not be judged (missing, unreadable, damaged, not a stream): reported
    on its own line; the other inputs are still judged."""

    path: Path
    message: str


def add_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        type=named_path,
        metavar="PATH",
        help="raw response bodies, streamtap recordings, or directories of them (searched recursively, in name order; "
        f"files ending in {', '.join(DIRECTORY_SUFFIXES)})",
    )
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        metavar="NAME",
        help=f"judge as this dialect: {', '.join(PROVIDERS)} (default: a raw body's is sniffed from its content, "
        "and said so; a recording's is the one its header names)",
    )
    parser.add_argument(
        "--sentinel", metavar="LINE", help="exact last line the answer must end with (one line, not blank); missing => truncated (an answer, or with n > 1 a choice, that stops to call a tool is not checked)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per file (turn and verdict)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Verdicts: complete, truncated, stopped_by_limit, filtered, errored, corrupt, unknown. "
        "A .partial.jsonl recording (its writer never finished) is not complete, even with its end line: the "
        "line shows the verdict it holds and says the file was never renamed, so it may not have reached the disk. "
        "Exit codes: 0 every file complete, 1 any file not complete, 2 usage error or any input that could not "
        "be judged (missing, unreadable, a recording whose lines break its format, not a stream: each is said "
        "on its own line on stderr, and the other inputs are still judged). A recording that reads but does not "
        "check out (a frame's sum, an offset, the body's hash) is judged unknown, saying why: exit 1. Examples: "
        "`streamtap verify a.sse b.bin rec.jsonl`, `streamtap verify recordings/`, "
        "`streamtap verify --provider gemini body.json` (else the dialect is sniffed from the bytes, and said so), "
        "`streamtap verify --sentinel END-OF-ANSWER a.sse`, `streamtap verify --json rec.jsonl | jq .verdict`."
    )
    add_input_options(parser)


def check_sentinel(sentinel: str | None) -> None:
    """Refuse a --sentinel no answer could end with, as the addon refuses its streamtap_sentinel:
    judged with it, every file would be truncated and the cause hidden."""
    if sentinel == "":  # an unset shell variable (--sentinel "$END"): the check would be off, silently
        raise UsageError("--sentinel: empty; give the line the answer must end with, or leave --sentinel out")
    problem = sentinel_problem(sentinel)
    if problem:
        raise UsageError(f"--sentinel: {problem}")


def input_paths(names: list[str]) -> Iterator[Path | Unjudged]:
    """Each named file, and the stream files under each named directory in name order."""
    for name in names:
        path = Path(name)
        try:
            exists, is_dir, is_file = path.exists(), path.is_dir(), path.is_file()
        except OSError as exc:  # a name too long, a loop of links: said for this input, the others go on
            yield Unjudged(path, f"cannot read: {exc.strerror or exc}")
            continue
        if not exists:
            yield Unjudged(path, "no such file")
        elif is_dir:
            files, unreadable = files_under(path, DIRECTORY_SUFFIXES)
            # a dangling link is kept (and said unreadable); a pipe or socket would block or fail
            # if read, so it is said instead, as a folder that cannot be read is
            found: list[Path | Unjudged] = [
                file if file.is_file() or not file.exists() else Unjudged(file, "not a file (a pipe, socket or device)")
                for file in files
            ]
            found += (Unjudged(folder, f"cannot read directory: {why}") for folder, why in unreadable)
            found.sort(key=lambda item: str(item.path if isinstance(item, Unjudged) else item))
            if not found:
                yield Unjudged(path, f"no recordings or stream files in this directory (files ending in {', '.join(DIRECTORY_SUFFIXES)})")
            yield from found
        elif not is_file:
            yield Unjudged(path, "not a file")
        else:
            yield path


# What a turn keeps in memory while it is judged (see StreamSession): verify needs only the
# verdict, so it keeps the proxy's text cap but every tool call's arguments (they must parse), and
# no list of event arrivals (one float per event: the memory would grow with the file);
# show prints the text, so it keeps everything.
VERIFY_KEEPS = {"text_cap": TEXT_CAP, "arguments_cap": None, "keep_arrivals": False}
SHOW_KEEPS = {"text_cap": None, "arguments_cap": None}


def judge_inputs(args: argparse.Namespace, keeps: dict[str, int | None] = VERIFY_KEEPS) -> Iterator[Judged | Unjudged]:
    """One result per input file, in order, as each is judged."""
    for item in input_paths(args.files):
        yield item if isinstance(item, Unjudged) else judge_file(item, args.provider, args.sentinel, keeps)


def judge_file(path: Path, provider: str | None, sentinel: str | None,
               keeps: dict[str, int | None] = VERIFY_KEEPS) -> Judged | Unjudged:
    from streamtap.recording import RecordingError, open_recording
    from streamtap.recording.catalog import is_recording
    from streamtap.recording.compress import frames_ended

    try:
        with open_recording(path) as file:
            head = file.read(SNIFF_BYTES)
            first_line = head.split(b"\n", 1)[0]
            cut_before_a_line = not head and not frames_ended(file)  # a zstd stream cut before its first block
            if cut_before_a_line or is_recording(path, first_line):
                return _judge_recording(path, provider, sentinel, keeps)
            return _judge_raw(path, head, file, provider, sentinel, keeps)
    except RecordingError as exc:
        message = str(exc).removeprefix(f"{path}: ").removeprefix(str(path) + " ")
        return Unjudged(path, f"cannot read recording: {message}")
    except OSError as exc:
        return Unjudged(path, f"cannot read: {exc.strerror or exc}")


def _recognised(detection: Detection) -> bool:
    """Whether sniffing found any stream format at all: its last resort is what it says of no bytes."""
    return detection != sniff_dialect(b"")


_HAR_START = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*\{\s*\"log\"\s*:\s*\{")
# what the providers answer a request that did not ask for a stream: one document, never a stream's event
_NOT_STREAMED = {("object", "chat.completion"), ("object", "response"), ("type", "message")}


def _one_document(head: bytes, whole: bool, detection: Detection) -> str | None:
    """Why a file that is one JSON document is no stream, or None: a HAR file (browsers' captures),
    a provider's non-streamed answer, or an object in which no provider's events were sniffed (a
    settings file beside the recordings). Each would otherwise be judged as a stream cut or broken."""
    if _HAR_START.match(head):
        return ("not a stream: a HAR file (a browser's capture), not a response body; save the streamed "
                "answer's body, or capture it with mitmdump -w and `streamtap import` it")
    if not whole:
        return None
    try:
        document = loads(head)
    except ValueError:  # several documents (NDJSON), or none
        return None
    if not isinstance(document, dict):
        return None
    if any(document.get(name) == value for name, value in _NOT_STREAMED):
        return "not a stream: one JSON document, a provider's answer to a request that asked for no stream; --provider judges it anyway"
    if detection.dialect is Dialect.UNKNOWN:
        return "not a stream: one JSON document, in which no provider's stream was found; --provider judges it anyway"
    return None


def _judge_raw(path: Path, head: bytes, file: BinaryIO, provider: str | None, sentinel: str | None,
               keeps: dict[str, int | None]) -> Judged | Unjudged:
    if not head and not provider:  # no bytes tell a dialect, nor that this was ever a stream
        return Unjudged(path, "not a stream: the file is empty; --provider judges it anyway (as a body cut before its first byte)")
    if begins_a_flow(head):  # its bodies' data lines would be judged with the capture's framing around them
        return Unjudged(path, "a mitmproxy capture (mitmdump -w), not a response body: `streamtap import` "
                              "turns its streamed answers into recordings, which this command judges")
    by_name = EXTENSION_WIRE.get(path.suffix.lower())
    whole = False  # the file is all in ``head``
    if len(head) < SNIFF_BYTES:  # (a compressed read may stop short of the file's end)
        more = file.read(1)
        whole, head = not more, head + more
    errored = analyze_error_document(head, Dialect(provider) if provider else Dialect.UNKNOWN) if whole else None
    if errored is not None:  # an HTTP error's body saved as a file: no stream, so no framing reads it
        how = "--provider" if provider else "sniffed: one JSON document holding the provider's error"
        return Judged(path, errored, errored.turn.dialect, how, "raw body")
    detection = sniff_dialect(head)
    document = None if provider else _one_document(head, whole, detection)
    if document is not None:
        return Unjudged(path, document)
    if detection.dialect is Dialect.UNKNOWN and not provider and len(head) == SNIFF_BYTES:
        # the first event may be larger than the start read (an image in a Gemini chunk): sniff
        # again once room for a whole event of the decoders' size limit is read
        head += file.read(DEFAULT_MAX_EVENT)
        detection = sniff_dialect(head)
    if provider:
        dialect, how = Dialect(provider), "--provider"
        wire = by_name or detection.wire
    else:
        dialect, how = detection.dialect, detection.why
        wire = by_name if by_name and (by_name == detection.wire or detection.dialect is Dialect.UNKNOWN) else detection.wire
    if dialect is Dialect.GEMINI and wire not in ("sse", "json-array"):
        wire = "sse"
    if not provider and wire != detection.wire:
        how += f"; read as {WIRE_NAMES[wire]}" + (f" (a {path.suffix} file)" if wire == by_name else "")
    session = StreamSession(dialect, wire, sentinel=sentinel, **keeps)
    session.feed(head)
    while chunk := file.read(SNIFF_BYTES):
        session.feed(chunk)
    analysis = session.close(StreamEnd.FINISHED)
    if not provider and not _recognised(detection) and analysis.turn.events == 0:
        return Unjudged(
            path,
            f"not a stream: no SSE, AWS event-stream, NDJSON or JSON array found in it (read as {WIRE_NAMES[wire]}, "
            "nothing decoded); --provider judges it anyway",
        )
    return Judged(path, analysis, dialect, how, "raw body")


def _judge_recording(path: Path, provider: str | None, sentinel: str | None,
                     keeps: dict[str, int | None]) -> Judged | Unjudged:
    """Walk the recording once: check each line against the others and feed its bytes to the
    judge as they come, so memory does not grow with the file."""
    from streamtap.recording import Frame, HeaderCut, NetworkReads, RecordingCheck, RecordingLines
    from streamtap.recording.catalog import never_renamed

    try:
        lines = RecordingLines(path).open()
    except HeaderCut as exc:  # a writer killed before its header was out: incomplete, and said so
        problem = str(exc).removeprefix(f"{path}: ").removeprefix(f"{path} ")
        analysis = StreamSession(Dialect.UNKNOWN).close(StreamEnd.FINISHED)
        return Judged(path, analysis, Dialect.UNKNOWN, "recording header", "recording", problem)
    with lines:
        header = lines.header
        if sentinel is None:
            sentinel = header.get("sentinel")  # judge with the sentinel the proxy used
        recorded = header.get("dialect") or "unknown"
        try:
            dialect = Dialect(provider or recorded)
        except ValueError:
            dialect = Dialect.UNKNOWN
        how = "recording header"
        if provider and provider != recorded:
            how = f"--provider, the recording says {recorded}"
        wire = (header.get("wire") or {}).get("format")  # the reader checked the header's types
        status = (header.get("response") or {}).get("status") or 200
        limit = header.get("max_event_size")  # the proxy's streamtap_max_event, when not the default
        limits = {"max_event_size": limit} if limit else {}
        try:
            streamed = header.get("streamed") is not False  # a plain JSON answer a filter tapped
            # a recording holds one HTTP response, as the proxy judged it
            request = header.get("request") or {}  # (the reader checked its method's and URL's types)
            session = StreamSession(dialect, wire or None, http_status=status, sentinel=sentinel, streamed=streamed,
                                    one_response=True, may_resume=may_resume(request.get("method"), request.get("url")),
                                    **keeps, **limits)
            session.asked(request)
        except ValueError as exc:  # a wire format this build does not know
            return Unjudged(path, f"cannot judge recording: {exc}")
        encoding = (header.get("wire") or {}).get("content_encoding")
        check = RecordingCheck(encoding)
        views = EventViews(path, header["format"])  # each frame's `event` is what its bytes decode to?
        undone = WireBodyCheck(encoding) if content_encoded(encoding) else None  # the body is its wire decoded?
        for item in lines:
            if isinstance(item, Frame):
                check.segment(item)
                # views are compared while the lines check out: once a sum or an offset does not, the bytes
                # may decode to other events, and the verdict (unknown, exit 1) already says why
                viewed = not check.problems
                if viewed:
                    views.frame(item)
                events = session.feed(item.raw, item.t_ms / 1000 if item.t_ms is not None else None)
                if viewed:
                    views.decoded(events)
                if undone is not None:
                    undone.body(item.raw)
            elif isinstance(item, NetworkReads):
                check.reads(item.reads, item.wire)
                if undone is not None and item.wire is not None:
                    _undo_reads(undone, item)
    end = lines.end or {}
    cut = [lines.problem] if lines.problem else []
    unfinished = never_renamed(path, has_end=bool(lines.end))  # the rule report and index apply too
    checked = check.finish(lines.end)  # sums, sequence, offsets, counts, hashes
    problems = cut + ([unfinished] if unfinished else []) + checked
    damage = cut + checked
    sent = (header.get("response") or {}).get("headers")
    framed = delimited_by_length(_header_value(sent, "content-length"), _header_value(sent, "transfer-encoding"))
    analysis = session.close(StreamEnd(end.get("stream_end") or "finished"), length_framed=framed)  # (the reader checked it)
    if not checked:
        views.decoded(analysis.events)  # the events only the stream's end completed
    if damage and _unvouched(analysis.verdict.kind, checked):
        # a cut or damaged file holds a shorter or altered stream: what its bytes read as is no answer.
        # Read as truncated, they stop where the recording stops (a dead worker, a full disk), not
        # necessarily where the stream did; the provider's own error in them, and a contradiction
        # in bytes whose sums hold, are still what the stream said
        analysis.verdict = _not_vouched_for(analysis.verdict, "the recording is cut or damaged")
    stopped = analysis_stopped(end)
    if stopped is not None and _unvouched(analysis.verdict.kind, checked):
        # the proxy stopped handing the flow's reads to analysis, and to this recording, there: the
        # stream went on, so its bytes stop where the proxy stopped, not where the answer did
        at, why = stopped
        analysis.verdict = _not_vouched_for(analysis.verdict, f"the recording stops at wire byte {at}, where the proxy "
                                            f"stopped analysing the stream ({why})", analysis_stopped_at=at)
    if undone is not None:
        accept_encoding = _header_value((header.get("request") or {}).get("headers"), "accept-encoding")
        analysis.verdict = _judged_coding(analysis, undone, accept_encoding, damaged=bool(damage) or stopped is not None,
                                          end=StreamEnd(end.get("stream_end") or "finished"))
    undelivered = _undelivered(end)
    if undelivered:  # the recording holds bytes the client never got: judged as the proxy judged them
        analysis.verdict = judge_undelivered(analysis.verdict, analysis.turn, undelivered)
    if lines.end is not None:
        # (a recording whose analysis stopped holds no turn, and its verdict says only that it stopped).
        # Another dialect (--provider) or sentinel (--sentinel) than the proxy's asks another question:
        # its verdict is this one's, and no contradiction of the proxy's
        rejudged = (dialect.value == recorded and sentinel == header.get("sentinel") and not damage
                    and stopped is None)
        problems += end_line_problems(lines.end, analysis, rejudged=rejudged)
    injected = end.get("injected_fault")
    if injected:
        analysis.verdict.evidence["injected_fault"] = injected
    return Judged(path, analysis, dialect, how, "recording", "; ".join(problems) or None, injected or None)


def _undelivered(end: dict) -> int:
    """The bytes at the end of the recording the client never got, as the proxy counted them in the
    verdict's evidence (``undelivered_bytes``); 0 where it counted none."""
    evidence = (end.get("verdict") or {}).get("evidence")
    count = evidence.get("undelivered_bytes") if isinstance(evidence, dict) else None
    return count if type(count) is int and count > 0 else 0


def _undo_reads(undone: WireBodyCheck, reads) -> None:
    """A reads line's wire bytes to the decoder read by read, as the Tap decoded them: where the
    coding could not be undone is then the read the Tap said."""
    at = 0
    for _, length, _ in reads.reads:
        undone.wire(reads.wire[at : at + length])
        at += length


def _header_value(pairs: list[list[str]] | None, name: str) -> str | None:
    """A recorded header's values joined as mitmproxy joins them; None when it was not sent."""
    values = [value for key, value in pairs or () if key.lower() == name]  # (the reader checked the pairs)
    return ", ".join(values) if values else None


def _judged_coding(analysis: Analysis, undone: WireBodyCheck, accept_encoding: str | None, damaged: bool,
                   end: StreamEnd = StreamEnd.FINISHED) -> Verdict:
    """The verdict of a content-encoded recording once its wire bytes are decoded again. Where the
    coding could not be undone, or the body is not the wire decoded, the body is not the answer
    the client got: ``unknown``, whatever its bytes read as. A compressed stream cut before its
    end marker (``end``: how the stream ended), holding more than one gzip member, or in a coding its
    request did not accept, is judged as the Tap judges it (``judge_unfinished_coding``,
    ``judge_coding_streams``, ``judge_unaccepted_coding``)."""
    verdict = analysis.verdict
    problem = undone.problem()
    if problem and (undone.undo.failure or not damaged):  # (a cut file's body and wire stop apart)
        evidence = {key: value for key, value in verdict.evidence.items() if key != "end"}  # the end of an unknown stream
        return Verdict(VerdictKind.UNKNOWN, problem, verdict.seq, verdict.offset,
                       {"held_bytes_read_as": verdict.kind.value, **evidence, "content_encoding": problem})
    unfinished = undone.undo.unfinished()
    if unfinished and not damaged:
        verdict = judge_unfinished_coding(verdict, analysis.turn, unfinished, end)
    if not damaged:
        verdict = judge_coding_streams(verdict, analysis.turn, undone.undo)
    return judge_unaccepted_coding(verdict, analysis.turn, undone.encoding, accept_encoding)


def end_line_problems(end: dict, analysis: Analysis, rejudged: bool) -> list[str]:
    """Where the end line disagrees with ``analysis``, its bytes judged again (``rejudged``: as the
    proxy judged them, same dialect, nothing damaged). No hash covers the end line, and report and
    index take the verdict, the model and the usage from it: each of them must be the bytes' own."""
    recorded = end.get("verdict") or {}  # the reader checked its types
    kind = recorded.get("kind")
    if not kind:  # the proxy and the importer always write one: without it, report shows none
        return ["the end line holds no verdict"]
    if not rejudged:
        return []
    evidence = recorded.get("evidence")
    # the proxy could not parse arguments beyond its cap and said unknown (only then does it say
    # arguments_not_kept): judging them here is the answer. Its turn is still the bytes' turn
    not_kept = kind == VerdictKind.UNKNOWN.value and isinstance(evidence, dict) and evidence.get("arguments_not_kept") is True
    if kind != analysis.verdict.kind.value and not not_kept:
        return [f"the recording says {kind}, judging its bytes again says {analysis.verdict.kind.value}"]
    turn = end.get("turn")
    if isinstance(turn, dict):  # the fleet view takes the model and the usage from it
        differs = turn_difference(turn, analysis.turn.to_dict())
        return [differs] if differs else []
    if kind == VerdictKind.UNKNOWN.value and not not_kept:  # a proxy whose analysis failed writes no turn, and says unknown
        return []
    return ["the end line holds no turn, its bytes give one"]


def _not_vouched_for(held: Verdict, why: str, **evidence: object) -> Verdict:
    """``unknown``, saying ``why`` the bytes held cannot vouch for the verdict ``held`` they read as
    (how the stream ended is unknown: its ``end`` is left out)."""
    kept = {key: value for key, value in held.evidence.items() if key != "end"}
    return Verdict(VerdictKind.UNKNOWN, f"{why}: the bytes it holds read as {held.kind.value}, which they cannot "
                   "vouch for", held.seq, held.offset, {**kept, "held_bytes_read_as": held.kind.value, **evidence})


def _unvouched(kind: VerdictKind, checked: list[str]) -> bool:
    """Whether a cut or damaged recording's bytes cannot vouch for the verdict ``kind`` they read as
    (``checked``: the problems found in the lines it holds, beyond the cut)."""
    return kind in ENDING_KINDS or kind is VerdictKind.TRUNCATED or (kind is VerdictKind.CORRUPT and bool(checked))


def _turn_facts(turn: dict) -> tuple[dict[str, object], dict[str, int]]:
    """What the bytes decide of a turn, by name: neither timing (the proxy had the reads' arrival
    times, a recording keeps its frames' only) nor notes or the parsed arguments (their raw text is
    compared). Also, by the same names, how many characters of a call's arguments the writer
    counted but did not keep (beyond its cap: the start is kept)."""
    facts: dict[str, object] = {
        "model": turn.get("model"),
        "response id": turn.get("response_id"),
        "stop reason": turn.get("stop_reason_raw"),
        "normalised stop reason": turn.get("stop_reason"),
        "usage": turn.get("usage"),  # the index and report read its normalised counts
        "error": turn.get("error"),
    }
    dropped: dict[str, int] = {}
    choices = turn.get("choices")
    facts["choices"] = len(choices) if isinstance(choices, list) else choices
    for position, choice in enumerate(choices if isinstance(choices, list) else []):
        where = f"choice {position}"
        facts[f"{where}: index"] = choice.get("index") if isinstance(choice, dict) else choice
        blocks = choice.get("blocks") if isinstance(choice, dict) else None
        facts[f"{where}: blocks"] = len(blocks) if isinstance(blocks, list) else blocks
        for number, block in enumerate(blocks if isinstance(blocks, list) else []):
            for field in ("kind", "text", "id", "name", "arguments_raw"):
                facts[f"{where}, block {number}: {field}"] = block.get(field) if isinstance(block, dict) else block
            extra = block.get("extra") if isinstance(block, dict) else None
            count = extra.get(DROPPED["arguments_raw"]) if isinstance(extra, dict) else None
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                dropped[f"{where}, block {number}: arguments_raw"] = count
    return facts, dropped


def turn_difference(recorded: dict, judged: dict) -> str | None:
    """The first fact where the end line's turn and the turn its bytes make now disagree, said;
    None when they agree. The hashes cover the bytes, not the end line: an edited turn, or one
    written by a streamtap that assembled it differently, shows here."""
    try:
        judged = loads(dumps(judged))  # as the writer wrote it
    except (TypeError, ValueError):  # text orjson cannot write, or nested deeper than it reads: compared as built
        pass
    (mine, dropped), (theirs, _) = _turn_facts(recorded), _turn_facts(judged)
    for name, count in dropped.items():  # verify keeps every call's arguments; the writer kept their start
        kept, whole = mine.get(name), theirs.get(name)
        if isinstance(kept, str) and isinstance(whole, str) and len(whole) == len(kept) + count and whole.startswith(kept):
            theirs[name] = kept
    for name in dict.fromkeys([*mine, *theirs]):
        kept, made = mine.get(name), theirs.get(name)
        if kept == made:
            continue
        while isinstance(kept, dict) and isinstance(made, dict):  # down to the member that differs (usage.output)
            key = next(k for k in dict.fromkeys([*kept, *made]) if kept.get(k, _ABSENT) != made.get(k, _ABSENT))
            name, kept, made = f"{name}.{key}", kept.get(key, _ABSENT), made.get(key, _ABSENT)
        return f"the recording's turn has {name} {_shown(kept, made)}, its bytes give {_shown(made, kept)}"
    return None


_ABSENT = object()  # a member one side lacks


def _shown(value: object, other: object) -> str:
    """``value`` in a few characters; a long text from where it first differs from ``other``."""
    if value is _ABSENT:
        return "none"
    if isinstance(value, str) and isinstance(other, str) and len(value) > 60:
        at = next((i for i, (a, b) in enumerate(zip(value, other)) if a != b), min(len(value), len(other)))
        return f"{len(value)} characters, from character {at}: {_shown(value[at : at + 40], '')}"
    try:
        text = dumps(value)
    except TypeError:
        text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def as_json(judged: Judged) -> dict:
    return {
        "file": shown_path(judged.path),
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
    write_out(json_for_stdout(dumps(as_json(judged))) + "\n")


def summary_line(judged: Judged) -> str:
    verdict = judged.analysis.verdict
    how = "" if judged.how in ("--provider", "recording header") else f", {judged.how}"
    at = [f"seq {verdict.seq}"] * (verdict.seq is not None) + [f"byte {verdict.offset}"] * (verdict.offset is not None)
    where = f" [{', '.join(at)}]" if at else ""
    problem = f" (recording: {judged.problem})" if judged.problem else ""
    injected = f" [injected fault: {judged.injected_fault}]" if judged.injected_fault else ""
    return f"{shown_path(judged.path)}: {verdict.kind} ({judged.dialect}{how}) {verdict.reason}{where}{injected}{problem}"


def report_unjudged(verb: str, item: Unjudged) -> None:
    """The name and the message may hold someone else's text (a shared folder's file name, a
    recording header's format): written as ``say`` writes it, so no terminal control runs."""
    say(verb, f"{shown_path(item.path)}: {item.message}")


def exit_code(judged_ok: bool, any_unjudged: bool) -> int:
    return EXIT_USAGE if any_unjudged else EXIT_OK if judged_ok else EXIT_FINDING


def run(args: argparse.Namespace) -> int:
    check_sentinel(args.sentinel)
    all_ok, unjudged = True, False
    for item in judge_inputs(args):
        if isinstance(item, Unjudged):
            report_unjudged("verify", item)
            unjudged = True
            continue
        all_ok = all_ok and item.analysis.verdict.ok and not item.problem
        print(json_for_stdout(dumps(as_json(item))) if args.json else terminal_safe(summary_line(item), one_line=True), flush=True)
    return exit_code(all_ok, unjudged)
