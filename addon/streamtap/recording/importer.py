"""Turn mitmproxy captures (``mitmdump -w FILE``) into streamtap recordings.

A capture keeps each flow's whole response body (as it crossed the network, still
content-encoded) but not when its chunks arrived, so an imported recording has one
network read with no arrival time, and frames without ``t``. Everything else is what
the Tap would have written: the same header, frames, verdict and turn, secrets redacted.

A response that mitmproxy streamed is only in the capture if it was made with
``--set store_streamed_bodies=true``; such flows are reported, not guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamtap.providers import StreamEnd, StreamSession, detect_dialect
from streamtap.wire import DEFAULT_MAX_EVENT

from .flows import is_llm_stream, request_info
from .header import flow_header
from .writer import RecordingError, RecordingWriter, final_name


class CaptureError(RecordingError):
    """The file is not a mitmproxy capture, or cannot be read as one."""


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


def read_flows(source: Path) -> Iterator[Any]:
    """Every flow in a capture, in order; CaptureError when it is not one."""
    from mitmproxy import exceptions, io

    try:
        handle = source.open("rb")
    except OSError as exc:
        raise CaptureError(f"{source}: {exc.strerror or exc}") from None
    with handle:
        try:
            yield from io.FlowReader(handle).stream()
        except exceptions.FlowReadException as exc:
            raise CaptureError(f"{source} is not a mitmproxy capture (mitmdump -w): {exc}") from None


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
    result = Imported(flow.id, request.pretty_url)
    flow_part = final_name(0, "-", "-", flow.id).rsplit("_", 1)[1]  # how file names spell the flow id
    earlier = sorted(out.glob(f"*_{flow_part}"))
    if earlier:
        result.path, result.already, result.skipped = earlier[0], True, "already imported"
        return result
    wire = response.raw_content
    if wire is None:
        if flow.error is not None:
            result.skipped = f"body not in the capture: the stream failed ({flow.error.msg}) and mitmproxy keeps no partial body"
        else:
            result.skipped = "body not in the capture (streamed without --set store_streamed_bodies=true)"
        return result
    try:
        body = response.get_content(strict=True) or b""
    except ValueError as exc:
        result.skipped = f"cannot undo content-encoding {response.headers.get('content-encoding')!r}: {exc}"
        return result
    detection = detect_dialect(request_info(flow), response.headers.get("content-type"))
    result.provider = detection.dialect.value
    session = StreamSession(
        detection.dialect, detection.wire, http_status=response.status_code,
        sentinel=sentinel, max_event_size=DEFAULT_MAX_EVENT,
    )
    encoded = body != wire or bool(response.headers.get("content-encoding"))
    started = response.timestamp_start or request.timestamp_start or 0.0
    writer = RecordingWriter.create(
        out, started=started, provider=result.provider, flow_id=flow.id, redact=redact, redact_allow=redact_allow,
        encoded=encoded
    )
    try:
        writer.header(flow_header(
            flow,
            started=flow.response.timestamp_start,
            dialect=detection.dialect.value,
            why=detection.why,
            sentinel=sentinel,
            wire_format=detection.wire,
            content_encoding=flow.response.headers.get("content-encoding") or None,
            imported_from=source,
        ))
        writer.read(wire, None)  # the capture keeps the bytes, not when they came
        for event in session.feed(body, None):
            writer.frame(event, None)
        end, error = _stream_end(flow)
        analysis = session.close(end)
        for event in analysis.events:
            writer.frame(event, None)
        turn = analysis.turn.to_dict()
        turn.get("timing", {}).pop("arrivals", None)
        duration = None
        if response.timestamp_end and response.timestamp_start:
            duration = round((response.timestamp_end - response.timestamp_start) * 1000, 3)
        verdict = analysis.verdict
        final = out / final_name(started, result.provider, verdict.kind.value, flow.id)
        result.path = writer.finish(
            {
                "stream_end": end.value,
                "error": error,
                "duration_ms": duration,
                "verdict": verdict.to_dict(),
                "turn": turn,
                "ttft_ms": None,
            },
            final,
        )
    finally:
        writer.close()
    result.verdict, result.reason = verdict.kind.value, verdict.reason
    result.model, result.events, result.bytes = analysis.turn.model, analysis.wire_events, analysis.bytes
    return result


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

    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    for count, flow in enumerate(read_flows(source), 1):
        if progress is not None:
            progress(count)
        if not isinstance(flow, http.HTTPFlow) or flow.response is None or not matches(flow):
            continue
        yield import_flow(flow, out, source, sentinel=sentinel, redact=redact, redact_allow=redact_allow)


__all__ = ["CaptureError", "Imported", "import_capture", "import_flow", "is_llm_stream", "read_flows"]
