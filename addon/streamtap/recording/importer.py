"""Turn mitmproxy captures (``mitmdump -w FILE``) into streamtap recordings.

A capture keeps each flow's whole response body (as it crossed the network, still
content-encoded) but not when its chunks arrived, so an imported recording has one
network read with no arrival time, and frames without ``t``. Everything else is what
the Tap would have written: the same header, frames, verdict and turn, secrets redacted.

A response that mitmproxy streamed is only in the capture if it was made with
``--set store_streamed_bodies=true``; such flows are reported, not guessed at.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from streamtap.providers import StreamEnd, StreamSession, detect_dialect
from streamtap.providers.common import one_line
from streamtap.wire import DEFAULT_MAX_EVENT

from .compress import SUFFIX
from .content import UNDO_FAILED_RAW, WireUndo, content_encoded, judge_unfinished_coding
from .flows import is_llm_stream, request_info
from .header import flow_header
from .reader import shown_path
from .redact import Redactor
from .writer import RecordingError, RecordingWriter, final_name, lock_unless_written, partial_recordings


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
        except exceptions.FlowReadException as exc:
            read = f"after {flows} flow{'s' * (flows != 1)} (those are imported)" if flows else "inside its first flow"
            if _ends_inside_a_flow(handle, start):
                raise CaptureIncomplete(f"{shown_path(source)}: the capture is cut short {read}: the file ends inside a flow "
                                        "(mitmdump was stopped while writing it, or the copy is incomplete)", flows) from None
            if flows or _begins_a_flow(handle, start):
                raise CaptureIncomplete(f"{shown_path(source)}: the capture is damaged {read}: {exc}", flows) from None
            raise CaptureError(f"{shown_path(source)} is not a mitmproxy capture (mitmdump -w): {exc}") from None


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


def _stream_end(flow: Any) -> tuple[StreamEnd, str | None]:
    if flow.error is None:
        return StreamEnd.FINISHED, None
    message = flow.error.msg
    client_gone = "client" in message.lower()
    return (StreamEnd.CLIENT_ABORTED if client_gone else StreamEnd.UPSTREAM_RESET), message


def import_flow(
    flow: Any, out: Path, source: Path, *, sentinel: str | None = None, redact: Iterable[str] = (),
    redact_allow: Iterable[str] = (),
) -> Imported:
    """Write one flow's recording into ``out`` (which must exist)."""
    request, response = flow.request, flow.response
    # printed by `streamtap import`: redacted as the recording's URL is
    result = Imported(flow.id, Redactor(redact, redact_allow).url(request.pretty_url))
    flow_part = final_name(0, "-", "-", flow.id).rsplit("_", 1)[1]  # how file names spell the flow id
    earlier = sorted(out.glob(f"*_{flow_part}"))
    if earlier:
        result.path, result.already, result.skipped = earlier[0], True, "already imported"
        return result
    started = response.timestamp_start or request.timestamp_start or 0.0
    result.removed, blocked = _remove_stopped_imports(out, started, flow.id)
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
    body = wire if undo is None else undo.feed(wire) + undo.finish()
    detection = detect_dialect(request_info(flow), response.headers.get("content-type"))
    result.provider = detection.dialect.value
    session = StreamSession(
        detection.dialect, detection.wire, http_status=response.status_code,
        sentinel=sentinel, max_event_size=DEFAULT_MAX_EVENT,
    )
    try:
        writer = RecordingWriter.create(
            out, started=started, provider=result.provider, flow_id=flow.id, redact=redact, redact_allow=redact_allow,
            encoded=encoded
        )
    except RecordingError as exc:  # another import into this folder began this flow meanwhile
        result.skipped = str(exc)
        return result
    finished = False
    try:
        writer.header(flow_header(
            flow,
            started=flow.response.timestamp_start,
            dialect=detection.dialect.value,
            why=detection.why,
            sentinel=sentinel,
            wire_format=detection.wire,
            content_encoding=flow.response.headers.get("content-encoding") or None,
            imported_from=Path(shown_path(source)),
        ))
        failure = undo.failure if undo is not None else None
        writer.read(wire, None)  # the capture keeps the bytes, not when they came
        for event in session.feed(body, None):
            writer.frame(event, None)
        end, error = _stream_end(flow)
        duration = None
        if response.timestamp_end and response.timestamp_start:
            duration = round((response.timestamp_end - response.timestamp_start) * 1000, 3)
        if failure:
            verdict, analysis = _undo_failed(writer, body, failure), None
            end_record = {"stream_end": end.value, "error": error, "duration_ms": duration, "verdict": verdict,
                          "streamtap_errors": [f"analysis: {failure}"]}
        else:
            analysis = session.close(end)
            for event in analysis.events:
                writer.frame(event, None)
            unfinished = undo.unfinished() if undo is not None else None
            if unfinished:  # the decoded body may be whole; its compressed stream was cut
                analysis.verdict = judge_unfinished_coding(analysis.verdict, analysis.turn, unfinished)
            turn = analysis.turn.to_dict()
            turn.get("timing", {}).pop("arrivals", None)
            verdict = analysis.verdict.to_dict()
            end_record = {"stream_end": end.value, "error": error, "duration_ms": duration, "verdict": verdict,
                          "turn": turn, "ttft_ms": None}
        final = out / final_name(started, result.provider, verdict["kind"], flow.id)
        result.path = writer.finish(end_record, final)
        finished = True
    finally:
        if not finished:  # stopped (Ctrl-C) or failed: the capture still holds the flow, so
            _discard(writer)  # an unfinished file of it is no evidence, only in the next run's way
        writer.close()
    result.verdict, result.reason = verdict["kind"], verdict["reason"]
    if analysis is not None:
        result.model, result.events, result.bytes = analysis.turn.model, analysis.wire_events, analysis.bytes
    else:
        result.bytes = len(body)
    return result


def _undo_failed(writer: RecordingWriter, body: bytes, failure: str) -> dict[str, Any]:
    """The end of a recording whose content-encoding could not be undone, as the Tap writes it:
    the note, the decoded bytes no frame covers as raw lines, and an ``unknown`` verdict."""
    writer.note("streamtap_error", f"analysis: {failure}")
    rest = memoryview(body)[writer.offset :]
    for at in range(0, len(rest), DEFAULT_MAX_EVENT):  # no line outgrows what a reader takes, as the Tap splits them
        writer.raw(rest[at : at + DEFAULT_MAX_EVENT], None, UNDO_FAILED_RAW)
    return {"kind": "unknown", "reason": failure, "evidence": {}}


def _remove_stopped_imports(out: Path, started: float, flow_id: str) -> tuple[list[Path], str | None]:
    """Remove the unfinished recordings of this flow that an import stopped midway left (a kill,
    a crash): the capture still holds the flow, so it is imported again. Returns the files
    removed, and why the flow cannot be imported now: another writer holds one of them (an
    import into the same folder running), or one is not an import's (a proxy's recording, cut
    short: evidence, left as it is)."""
    removed = []
    for path in partial_recordings(out, started, flow_id):
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
    """One ``Imported`` per HTTP flow with a response that ``matches``; ``progress(flows_read)``."""
    from mitmproxy import http

    # made first, so that a folder that cannot be is said before any work; removed again if it
    # stays empty, so that a file that is no capture leaves nothing behind
    made = _missing_folders(out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        for count, flow in enumerate(read_flows(source), 1):
            if progress is not None:
                progress(count)
            if not isinstance(flow, http.HTTPFlow) or flow.response is None or not matches(flow):
                continue
            try:
                imported = import_flow(flow, out, source, sentinel=sentinel, redact=redact, redact_allow=redact_allow)
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
