"""Turn mitmproxy captures (``mitmdump -w FILE``) into streamtap recordings.

A capture keeps each flow's whole response body (as it crossed the network, still
content-encoded) but not when its chunks arrived, so an imported recording has one
network read with no arrival time, and frames without ``t``. Everything else is what
the Tap would have written: the same header, frames, verdict and turn, secrets redacted.

A response that mitmproxy streamed is only in the capture if it was made with
``--set store_streamed_bodies=true``; such flows are reported, not guessed at.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from streamtap.providers import StreamEnd, StreamSession, VerdictKind, answers_a_stream, detect_dialect
from streamtap.providers.common import one_line
from streamtap.providers.request import may_resume
from streamtap.wire import DEFAULT_MAX_EVENT

from .compress import SUFFIX
from .content import (
    UNDO_FAILED_RAW,
    WireUndo,
    content_encoded,
    delimited_by_length,
    judge_coding_streams,
    judge_held_for_a_slow_reader,
    judge_unaccepted_coding,
    judge_unfinished_coding,
)
from .flows import is_llm_stream, may_have_body, request_info, stream_end
from .header import flow_header, request_as_read, request_body
from .reader import line_json, shown_path
from .redact import Redactor
from .writer import (
    PARTIAL_SUFFIX,
    RecordingError,
    RecordingWriter,
    SpanNotKept,
    final_name,
    lock_unless_written,
    partial_name,
    stamp,
)


class CaptureError(RecordingError):
    """The file is not a mitmproxy capture, or cannot be read as one."""


class CaptureIncomplete(CaptureError):
    """The capture's first ``flows`` flows were read, and the rest of it cannot be."""

    def __init__(self, message: str, flows: int) -> None:
        super().__init__(message)
        self.flows = flows


@dataclass(slots=True)
class Imported:
    """What became of one flow that looked like a streamed LLM answer."""

    flow_id: str
    url: str
    path: Path | None = None  # the recording written, or the one already there
    provider: str = "unknown"
    model: str | None = None
    verdict: str | None = None
    reason: str = ""
    events: int = 0
    bytes: int = 0
    skipped: str | None = None  # why no recording was written
    already: bool = False  # a recording of this flow was in the directory already
    removed: list[Path] = field(default_factory=list)  # unfinished files of a stopped import, replaced
    same_id: Path | None = None  # a recording of a different flow with this flow's id, beside which it was written


def read_flows(source: Path) -> Iterator[Any]:
    """Every flow in a capture, in order; CaptureError when it is not one, CaptureIncomplete
    (after the flows before it) when it is cut short or damaged."""
    from mitmproxy import exceptions, io

    try:
        handle = source.open("rb")
    except OSError as exc:
        raise CaptureError(f"{shown_path(source)}: {exc.strerror or exc}") from None
    with handle:
        flows = start = 0  # flows read, and where the next one starts
        try:
            for flow in io.FlowReader(handle).stream():
                yield flow
                flows, start = flows + 1, handle.tell()
        # a well-framed record whose contents are damaged fails in mitmproxy's state loading, with
        # whatever error that meets (a key missing, a value of another type, a key it does not know:
        # Flow.set_state asserts none is left)
        except (exceptions.FlowReadException, KeyError, ValueError, TypeError, AttributeError, IndexError,
                AssertionError) as exc:
            exc = _unreadable_record(exc, exceptions.FlowReadException, start)
            read = f"after {flows} flow{'s' * (flows != 1)} (those are imported)" if flows else "inside its first flow"
            if _ends_inside_a_flow(handle, start):
                raise CaptureIncomplete(f"{shown_path(source)}: the capture is cut short {read}: the file ends inside a flow "
                                        "(mitmdump was stopped while writing it, or the copy is incomplete)", flows) from None
            if flows or _begins_a_flow(handle, start):
                raise CaptureIncomplete(f"{shown_path(source)}: the capture is damaged {read}: {exc}", flows) from None
            raise CaptureError(f"{shown_path(source)} is not a mitmproxy capture (mitmdump -w): {exc}") from None


def _unreadable_record(exc: Exception, framing_error: type, start: int) -> str:
    """Why the record at byte ``start`` could not be read, without its contents: the error of
    mitmproxy's state loading quotes the whole record it loaded (``Invalid flow: loaded=...``), with
    its API keys and its bodies, megabytes on one line of stderr."""
    kind = type(exc).__name__
    if isinstance(exc, framing_error):  # its words up to what it quotes ("Unknown flow type: ...", "... version: ...")
        kind = (str(exc).split(":", 1)[0].splitlines() or [kind])[0][:80] or kind
    return f"a record mitmproxy cannot load as a flow at byte {start} ({kind})"


def _ends_inside_a_flow(handle: Any, start: int) -> bool:
    """Whether the record at ``start`` runs past the end of the file. Each flow is a tnetstring
    dict, ``LENGTH:`` then its first key (``LENGTH:``), then LENGTH bytes and ``}``."""
    handle.seek(start)
    head = handle.read(32)
    size = os.fstat(handle.fileno()).st_size
    record = re.match(rb"(\d{1,12}):(?:\d|\Z)", head)  # (the file may end right after the length)
    if record is None:
        return head.isdigit() and start + len(head) == size  # cut inside the length itself
    return start + record.end(1) + 1 + int(record[1]) + 1 > size


def _begins_a_flow(handle: Any, start: int) -> bool:
    """Whether the bytes at ``start`` begin as mitmproxy writes a flow. A capture damaged inside
    its first flow is then a damaged capture, not some other file."""
    handle.seek(start)
    return begins_a_flow(handle.read(64))


def begins_a_flow(head: bytes) -> bool:
    """Whether ``head`` begins as mitmproxy writes a flow: a tnetstring dict (``LENGTH:``) whose
    first item is a key (``LENGTH:name;``)."""
    return re.match(rb"\d{1,12}:\d{1,3}:[a-z_]{1,40}[;,]", head[:64]) is not None


@dataclass(frozen=True, slots=True)
class FlowIdentity:
    """What tells a flow from another with the same id (a capture appended to with ``-w +FILE``,
    or a flow replayed in mitmproxy and saved again: mitmproxy keeps the id, the answer is new):
    the whole id, when the request was sent, and the bytes the answer carried."""

    flow_id: Any
    request_started: Any
    wire_sha256: str | None  # None: the capture kept no body (then the request alone tells)

    def is_recorded_by(self, recorded: FlowIdentity) -> bool:
        return (self.flow_id == recorded.flow_id and self.request_started == recorded.request_started
                and (self.wire_sha256 is None or self.wire_sha256 == recorded.wire_sha256))


def flow_identity(flow: Any) -> FlowIdentity:
    wire = flow.response.raw_content
    return FlowIdentity(flow.id, flow.request.timestamp_start, None if wire is None else hashlib.sha256(wire).hexdigest())


def recorded_identity(path: Path) -> FlowIdentity | None:
    """The identity of the flow a finished recording holds (its header and end line), or None
    when the file does not read as one. A compressed one (the addon's streamtap_compress=zstd)
    is read as the fleet view reads it."""
    if path.name.endswith(SUFFIX):
        from .catalog import read_ends

        try:
            header, end, _, _ = read_ends(path)
        except (OSError, ValueError, RecordingError):
            return None
        return FlowIdentity(header.get("flow_id"), header.get("request_started"), end.get("wire_sha256")) if end else None
    try:
        with path.open("rb") as file:
            header = orjson.loads(file.readline())
            end = line_json(_last_line(file))
    except (OSError, ValueError):
        return None
    if not (isinstance(header, dict) and isinstance(end, dict) and end.get("type") == "end"):
        return None
    return FlowIdentity(header.get("flow_id"), header.get("request_started"), end.get("wire_sha256"))


def _last_line(file: Any, block: int = 1 << 20) -> bytes:
    """The file's last line, read from its end (an end line is small; the frames before it need not be)."""
    at = file.seek(0, os.SEEK_END)
    tail = b""
    while at > 0:
        step = min(block, at)
        at -= step
        file.seek(at)
        tail = file.read(step) + tail
        cut = tail.rstrip(b"\n").rfind(b"\n")
        if cut >= 0:
            return tail[cut + 1 :]
    return tail


_NUMBERED = re.compile(r"(.+)-([0-9]+)")  # a flow's name part with the "-N" of a second flow with its id


def _family(part: str) -> str:
    """The name part of the flow id a recording's name ends with, without a "-N"."""
    numbered = _NUMBERED.fullmatch(part)
    return numbered[1] if numbered else part


def _renamed(name: str, base: str, part: str, suffix: str) -> str:
    """``name`` (ending ``_{base}{suffix}``) ending ``_{part}{suffix}`` instead."""
    return name[: len(name) - len(base + suffix)] + part + suffix


class ImportFolder:
    """The recordings in an import's ``--out`` folder, by the flow id their names end with: the
    folder is listed once per import, not once per flow (a listing per flow made importing n
    flows into a folder of n recordings take n² time: 2 min 24 s for 10,000 small flows). Each
    name is kept up to date as this import writes and removes files; another import writing
    into the same folder at once is seen through the names it locks and leaves (``import_flow``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.finals: dict[str, set[str]] = defaultdict(set)  # by _family of the name's flow part
        self.partials: dict[str, set[str]] = defaultdict(set)
        self._identities: dict[str, FlowIdentity | None] = {}
        with os.scandir(path) as entries:
            for entry in entries:
                self.add(entry.name)

    def add(self, name: str) -> None:
        slot = self._slot(name)
        if slot is not None:
            slot.add(name)

    def has(self, name: str) -> bool:
        slot = self._slot(name)
        return slot is not None and name in slot

    def forget(self, name: str) -> None:
        slot = self._slot(name)
        if slot is not None:
            slot.discard(name)

    def _slot(self, name: str) -> set[str] | None:
        """Where ``name`` is kept: with the finished or the unfinished recordings of its flow id."""
        if name.startswith("."):  # a writer's hidden name, before it is linked to its own
            return None
        for suffix, names in ((PARTIAL_SUFFIX, self.partials), (PARTIAL_SUFFIX + SUFFIX, self.partials), (".jsonl", self.finals),
                              (".jsonl" + SUFFIX, self.finals)):  # the addon's compressed recordings (streamtap_compress=zstd)
            if name.endswith(suffix):
                return names[_family(name.removesuffix(suffix).rsplit("_", 1)[-1])]
        return None

    def recording_of(self, identity: FlowIdentity, base: str) -> Path | None:
        """The recording of this very flow, if one is here. A file of the flow's id that does not
        read as a recording cannot be told apart: it is taken for the flow's, as it always was."""
        unreadable = None
        for name in sorted(self.finals.get(_family(base), ())):
            if name not in self._identities:
                self._identities[name] = recorded_identity(self.path / name)
            recorded = self._identities[name]
            if recorded is None:
                unreadable = unreadable or self.path / name
            elif identity.is_recorded_by(recorded):
                return self.path / name
        return unreadable

    def other_flow(self, base: str) -> Path | None:
        """A recording of another flow with this id (after ``recording_of`` found none of this one)."""
        names = sorted(self.finals.get(_family(base), ()))
        return self.path / names[0] if names else None

    def free_part(self, base: str) -> str:
        """The name part for a flow with the id ``base``: ``base``, or ``base-2``, ``base-3``...
        when other flows with that id are recorded here already."""
        taken = {name.removesuffix(SUFFIX).removesuffix(".jsonl").rsplit("_", 1)[-1]  # compressed ones too
                 for name in self.finals.get(_family(base), ())}
        part, number = base, 1
        while part in taken:
            number += 1
            part = f"{base}-{number}"
        return part

    def unfinished(self, base: str, started: float) -> list[Path]:
        """The unfinished recordings of flows with this id begun at ``started``, whatever provider
        their detection settled on (a stopped import may have left one)."""
        prefix = f"{stamp(started)}_"
        return sorted(self.path / name for name in self.partials.get(_family(base), ()) if name.startswith(prefix))


def import_flow(
    flow: Any, out: Path, source: Path, *, sentinel: str | None = None, redact: Iterable[str] = (),
    redact_allow: Iterable[str] = (), folder: ImportFolder | None = None,
) -> Imported:
    """Write one flow's recording into ``out`` (which must exist); ``folder``: ``out``'s listing,
    kept by the caller across flows (else listed now)."""
    if folder is None:
        folder = ImportFolder(out)
    request, response = flow.request, flow.response
    # printed by `streamtap import`: redacted as the recording's URL is
    result = Imported(flow.id, Redactor(redact, redact_allow).url(request.pretty_url))
    base = final_name(0, "-", "-", flow.id).rsplit("_", 1)[1].removesuffix(".jsonl")  # how file names spell the flow id
    identity = flow_identity(flow)
    earlier = folder.recording_of(identity, base)
    if earlier is not None:
        result.path, result.already, result.skipped = earlier, True, "already imported"
        return result
    result.same_id = folder.other_flow(base)
    part = folder.free_part(base)
    started = response.timestamp_start or request.timestamp_start or 0.0
    result.removed, blocked = _remove_stopped_imports(folder.unfinished(base, started))
    for removed in result.removed:
        folder.forget(removed.name)
    if blocked:
        result.skipped = blocked
        return result
    wire = response.raw_content
    if wire is None:
        if flow.error is not None:
            result.skipped = f"body not in the capture: the stream failed ({flow.error.msg}) and mitmproxy keeps no partial body"
        else:
            result.skipped = "body not in the capture (streamed without --set store_streamed_bodies=true)"
        return result
    # the Tap's decoder: it takes stacked codings (gzip, br), which mitmproxy's get_content does not.
    # A coding that cannot be undone is recorded as the Tap records it: the wire kept, the body
    # decoded before the failure, the verdict unknown
    encoding = response.headers.get("content-encoding")
    encoded = content_encoded(encoding)  # as the reader will take it
    undo = WireUndo(encoding) if encoded else None
    # decoded a piece at a time, as the Tap decodes it: a few KB of zstd can decode to gigabytes
    body = iter((wire,)) if undo is None else itertools.chain(undo.pieces(wire), undo.finish_pieces())
    content_type = response.headers.get("content-type")
    detection = detect_dialect(request_as_read(request_info(flow), request_body(request)), content_type)
    streamed = answers_a_stream(detection, content_type)
    result.provider = detection.dialect.value
    session = StreamSession(
        detection.dialect, detection.wire, http_status=response.status_code,
        sentinel=sentinel, max_event_size=DEFAULT_MAX_EVENT, streamed=streamed, one_response=True,
        may_resume=may_resume(request.method, request.pretty_url),
    )
    partial = _renamed(partial_name(started, result.provider, flow.id), base, part, PARTIAL_SUFFIX)
    writer, finished = None, False
    try:  # (one try from the writer's birth on: a Ctrl-C between the two left its file behind)
        try:
            writer = RecordingWriter(out / partial, redact=redact, redact_allow=redact_allow, encoded=encoded)
        except RecordingError as exc:  # another import into this folder began this flow meanwhile
            result.skipped = str(exc)
            return result
        meanwhile = _written_meanwhile(folder, started, result.provider, base, part, identity)
        if meanwhile is not None:  # by another import into this folder, since this one listed it
            result.path, result.already, result.skipped = meanwhile
            return result
        header = flow_header(
            flow,
            started=flow.response.timestamp_start,
            dialect=detection.dialect.value,
            why=detection.why,
            sentinel=sentinel,
            wire_format=detection.wire,
            content_encoding=flow.response.headers.get("content-encoding") or None,
            imported_from=Path(shown_path(source)),
        )
        if not streamed:
            header["streamed"] = False
        session.asked(header.get("request"))  # as the Tap and verify read it, from the header
        writer.header(header)
        writer.read(wire, None)  # the capture keeps the bytes, not when they came
        decoded, unframed = 0, bytearray()  # body bytes taken, and those no frame covers yet

        def unframed_to(end: int) -> bytes | memoryview:
            """The body's bytes from the writer's offset to ``end``."""
            if undo is None:
                return memoryview(wire)[writer.offset : end]
            start = decoded - len(unframed)
            return bytes(unframed[writer.offset - start : end - start])

        for piece in body:
            decoded += len(piece)
            if undo is not None:  # kept for a coding that fails later, which records them unframed
                unframed += piece
            for event in session.feed(piece, None):
                _frame(writer, event, unframed_to)
            if undo is not None:
                del unframed[: max(0, len(unframed) - (decoded - writer.offset))]
        failure = undo.failure if undo is not None else None
        end, error = stream_end(flow)
        duration, clock_note = _duration(response, flow.error)
        if failure:
            if clock_note:
                writer.note("clock", clock_note)
            verdict, analysis = _undo_failed(writer, unframed, failure), None
            # as the Tap writes it: its analysis is off by then, having counted the events framed before it
            end_record = {"stream_end": end.value, "error": error, "duration_ms": duration, "verdict": verdict,
                          "turn": None, "ttft_ms": None, "events": session.wire_events,
                          "streamtap_errors": [f"analysis: {failure}"]}
        else:
            headers = flow.response.headers
            framed = delimited_by_length(headers.get("content-length"), headers.get("transfer-encoding"))
            analysis = session.close(end, length_framed=framed)
            for event in analysis.events:
                _frame(writer, event, unframed_to)
            unfinished = undo.unfinished() if undo is not None else None
            if unfinished:  # the decoded body may be whole; its compressed stream was cut
                analysis.verdict = judge_unfinished_coding(analysis.verdict, analysis.turn, unfinished, end)
            if undo is not None:  # a gzip member, or bytes after it, a client may not read as streamtap did
                analysis.verdict = judge_coding_streams(analysis.verdict, analysis.turn, undo)
            # decoded here; the client may not have
            analysis.verdict = judge_unaccepted_coding(analysis.verdict, analysis.turn, encoding,
                                                       flow.request.headers.get("accept-encoding"))
            if end is StreamEnd.UPSTREAM_RESET and flow.client_conn.alpn in (b"h2", b"h3"):
                analysis.verdict = judge_held_for_a_slow_reader(analysis.verdict, analysis.turn)
            if clock_note:
                analysis.turn.notes.append(clock_note)
            turn = analysis.turn.to_dict()
            turn.get("timing", {}).pop("arrivals", None)
            verdict = analysis.verdict.to_dict()
            end_record = {"stream_end": end.value, "error": error, "duration_ms": duration, "verdict": verdict,
                          "turn": turn, "ttft_ms": None, "events": analysis.wire_events}
        final = out / _renamed(final_name(started, result.provider, verdict["kind"], flow.id), base, part, ".jsonl")
        result.path = writer.finish(end_record, final)
        folder.add(final.name)
        finished = True
    finally:
        if writer is not None:
            if not finished:  # stopped (Ctrl-C) or failed: the capture still holds the flow, so
                _discard(writer)  # an unfinished file of it is no evidence, only in the next run's way
            writer.close()
    result.verdict, result.reason = verdict["kind"], verdict["reason"]
    if analysis is not None:
        result.model, result.events, result.bytes = analysis.turn.model, analysis.wire_events, analysis.bytes
    else:
        result.bytes = decoded
    return result


def _duration(response: Any, error: Any = None) -> tuple[float | None, str | None]:
    """Response start to end in ms, and a note when it cannot be had. A flow that ended in an
    error (a reset, a client gone) has no response end: it ended when its error came, as the
    Tap times it. A capture keeps wall-clock times (``time.time()``), not the Tap's monotonic
    ones: a clock set back while the answer streamed makes the end come before the start, and a
    negative duration is no duration at all (the reader calls such a file damaged)."""
    start, end = response.timestamp_start, response.timestamp_end
    if not end and error is not None:
        end = getattr(error, "timestamp", None)
    if not (start and end):
        return None, None
    if end < start:
        return None, (f"duration unknown: the capture's response ends {(start - end) * 1000:.0f} ms before it "
                      "starts (the wall clock was set back while it streamed)")
    return round((end - start) * 1000, 3), None


def _written_meanwhile(
    folder: ImportFolder, started: float, provider: str, base: str, part: str, identity: FlowIdentity
) -> tuple[Path, bool, str] | None:
    """A recording another import finished under the name this one is about to give (after
    this one listed the folder, before it locked its unfinished file): checked by name, in a few
    lookups, not by listing the folder again. (path, already, why it is skipped), or None."""
    for kind in VerdictKind:
        path = folder.path / _renamed(final_name(started, provider, kind.value, identity.flow_id), base, part, ".jsonl")
        if folder.has(path.name) or not path.exists():
            continue
        folder.add(path.name)
        recorded = recorded_identity(path)
        if recorded is None or identity.is_recorded_by(recorded):
            return path, True, "already imported"
        return path, False, (f"another import into this folder wrote {shown_path(path)}, a different flow with this "
                             "flow's id, meanwhile: import the capture again to record this one beside it")
    return None


OVERSIZE_RAW = f"an event over {DEFAULT_MAX_EVENT >> 20} MiB: the decoder skipped it, its bytes are kept here unframed"


def _frame(writer: RecordingWriter, event, unframed_to: Callable[[int], bytes | memoryview]) -> None:
    """``writer.frame(event)``; an event the decoder did not keep (over its limit) goes as its
    bytes, unframed in lines of at most the limit, then itself without them, as the Tap records it."""
    try:
        writer.frame(event, None)
    except SpanNotKept:
        writer.unkept(event, unframed_to(event.end), None, DEFAULT_MAX_EVENT, OVERSIZE_RAW)


def _undo_failed(writer: RecordingWriter, unframed: bytearray, failure: str) -> dict[str, Any]:
    """The end of a recording whose content-encoding could not be undone, as the Tap writes it:
    the note, the decoded bytes no frame covers (``unframed``) as raw lines, and an ``unknown`` verdict."""
    writer.note("streamtap_error", f"analysis: {failure}")
    rest = memoryview(unframed)
    for at in range(0, len(rest), DEFAULT_MAX_EVENT):  # no line outgrows what a reader takes, as the Tap splits them
        writer.raw(rest[at : at + DEFAULT_MAX_EVENT], None, UNDO_FAILED_RAW)
    return {"kind": "unknown", "reason": failure, "seq": None, "offset": None, "evidence": {}}


def _remove_stopped_imports(unfinished: list[Path]) -> tuple[list[Path], str | None]:
    """Remove the unfinished recordings of this flow that an import stopped midway left (a kill,
    a crash): the capture still holds the flow, so it is imported again. Returns the files
    removed, and why the flow cannot be imported now: another writer holds one of them (an
    import into the same folder running), or one is not an import's (a proxy's recording, cut
    short: evidence, left as it is)."""
    removed = []
    for path in unfinished:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # its writer finished or removed it meanwhile
            continue
        except OSError as exc:
            return removed, f"{shown_path(path)}, an unfinished recording of this flow, cannot be read: {exc.strerror or exc}"
        try:
            if not lock_unless_written(fd):  # free once its writer is gone (readers let go in moments)
                return removed, f"{shown_path(path)} is being written right now (another import into this folder?): left as it is"
            try:
                same = os.path.samestat(os.stat(path), os.fstat(fd))
            except FileNotFoundError:
                same = False
            if not same:  # removed (and begun again) by another import while this one waited
                continue
            if not _written_by_import(path, fd):
                return removed, (f"{shown_path(path)} is an unfinished recording of this flow that no import wrote "
                                 "(a proxy stopped while recording it): left as it is")
            os.unlink(path)
            removed.append(path)
        finally:
            os.close(fd)  # (drops the lock)
    return removed, None


def _written_by_import(path: Path, fd: int) -> bool:
    """Whether an unfinished recording is an import's: empty (nothing in it to lose), or its
    first line is a header naming the capture it was imported from. An import writes the header
    whole (a file may still lack the newline after it: the writer buffers that)."""
    if str(path).endswith(SUFFIX):  # import never compresses
        return False
    first = bytearray()
    while b"\n" not in first:
        chunk = os.pread(fd, 1 << 20, len(first))
        if not chunk:
            break
        first += chunk
    if not first:
        return True
    try:
        header = orjson.loads(first.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return False
    return isinstance(header, dict) and header.get("type") == "header" and "imported_from" in header


def _discard(writer: RecordingWriter) -> None:
    """Remove the file ``writer`` has not finished, while it still holds the lock."""
    try:
        os.unlink(writer.path)
    except OSError:  # then it stays behind, and the next import removes it
        pass


def import_capture(
    source: Path,
    out: Path,
    *,
    matches: Callable[[Any], bool] = is_llm_stream,
    sentinel: str | None = None,
    redact: Iterable[str] = (),
    redact_allow: Iterable[str] = (),
    progress: Callable[[int], None] | None = None,
) -> Iterator[Imported]:
    """One ``Imported`` per HTTP flow with a response that ``matches``; ``progress(flows_read)``.
    A redirect and an answer with no body are passed over whatever ``matches`` says, as the Tap
    passes them over whatever its filter says: no turn to judge, not a truncated one."""
    from mitmproxy import http

    # made first, so that a folder that cannot be is said before any work; removed again if it
    # stays empty, so that a file that is no capture leaves nothing behind
    made = _missing_folders(out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        folder = ImportFolder(out)
        for count, flow in enumerate(read_flows(source), 1):
            if progress is not None:
                progress(count)
            if not isinstance(flow, http.HTTPFlow) or flow.response is None or not may_have_body(flow) or not matches(flow):
                continue
            try:
                imported = import_flow(
                    flow, out, source, sentinel=sentinel, redact=redact, redact_allow=redact_allow, folder=folder
                )
            except RecordingError as exc:  # this flow's recording cannot be written: said, and the others go on
                imported = Imported(flow.id, _shown_url(flow, redact, redact_allow), skipped=str(exc))
            except OSError:  # the folder or the disk, not this flow: every other flow would fail alike
                raise
            except Exception as exc:  # a flow that trips a bug must not cost the capture's other flows
                skipped = f"cannot be imported: {type(exc).__name__}: {one_line(str(exc))}"
                imported = Imported(flow.id, _shown_url(flow, redact, redact_allow), skipped=skipped)
            yield imported
    finally:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty: recordings were written
                break


def _shown_url(flow: Any, redact: Iterable[str], redact_allow: Iterable[str]) -> str:
    """The flow's URL as ``streamtap import`` prints it: redacted, or not at all."""
    try:
        return Redactor(redact, redact_allow).url(flow.request.pretty_url)
    except Exception as exc:  # (the flow's failure is said already: this one would only hide it)
        return f"(URL not shown: {type(exc).__name__})"


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


__all__ = ["CaptureError", "CaptureIncomplete", "Imported", "import_capture", "import_flow", "is_llm_stream", "read_flows"]
