"""One tapped response stream: its decoder, assembler and recording writer (``FlowTap``).

A FlowTap runs where the analysis runs: in an analysis worker (``mitm/worker.py``), or in the
proxy's loop with ``streamtap_workers=0``. It is fed the reads with their arrival times, and
its methods never raise: a failure switches off the failed part and is kept as evidence.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from math import floor as _floor
from typing import TYPE_CHECKING, Any

from streamtap.cli import failure, terminal_safe
from streamtap.mitm.flowspec import FlowSpec, described as _described
from streamtap.providers import StreamEnd, StreamSession, VerdictKind
from streamtap.providers.request import may_resume
from streamtap.recording import RecordingError, RecordingWriter, SpanNotKept, final_name
from streamtap.recording.content import (
    UNDO_FAILED_RAW,
    WireUndo,
    content_encoded,
    judge_coding_streams,
    judge_unaccepted_coding,
    judge_undelivered,
    judge_unfinished_coding,
)
from streamtap.wire import DEFAULT_MAX_EVENT, Tail

if TYPE_CHECKING:  # an analysis worker imports this module, and none of mitmproxy
    from mitmproxy import http

log = logging.getLogger("streamtap")

MAX_BACKLOG = 1 << 20  # bytes handed on but not yet analysed before analysis runs inline
BATCH_BYTES = 64 * 1024  # reads decoded in one pass: amortises per-call costs, bounds the joined copy
MIN_RAW_LINE = 4096  # bytes of an oversize event's raw line at least, however small streamtap_max_event is
OVERSIZE_RAW = "an event over streamtap_max_event: the decoder skipped it, its bytes are kept here unframed"
ANALYSIS_OFF_RAW = "streamtap analysis was off for this flow"
FLUSH_EVERY = 0.1  # seconds: recording lines reach the OS at least this often (a syscall per chunk costs too much)


def milliseconds(seconds: float) -> float:
    """Milliseconds to the microsecond (the value round(seconds * 1000, 3) gives, at a quarter of its cost)."""
    return _floor(seconds * 1e6 + 0.5) / 1000


def flow_summary(
    *,
    provider: str | None,
    model: str | None,
    verdict: str,
    reason: str | None,
    events: int,
    bytes: int,
    duration_ms: float | None,
    stream_end: str | None,
    recording: str | None,
    errors: list[str],
    ttft_ms: float | None = None,
    usage: dict[str, Any] | None = None,
    injected_fault: str | None = None,
) -> dict[str, Any]:
    """A judged flow as the addon logs it, marks the flow with and counts it in its metrics: one
    shape whether the tap judged it, a worker's finished recording states it, or the flow was lost."""
    summary: dict[str, Any] = {
        "provider": provider,
        "model": model,
        "verdict": verdict,
        "reason": reason,
        "events": events,
        "bytes": bytes,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "stream_end": stream_end,
        "recording": recording,
        "errors": errors,
    }
    if usage is not None:
        summary["usage"] = usage
    if injected_fault:
        summary["injected_fault"] = injected_fault
    return summary


class FlowTap:
    """Everything streamtap does for one response stream. Its methods never raise.

    It runs in the proxy (``streamtap_workers=0``, or hooks called without an event loop) or in
    an analysis worker (``mitm/worker.py``), fed the same reads with the same arrival times."""

    def __init__(
        self,
        flow: http.HTTPFlow | FlowSpec,
        *,
        directory: str,
        fsync: str,
        redact: Sequence[str],
        redact_allow: Sequence[str] = (),
        sentinel: str | None,
        max_event_size: int,
        record: bool,
        compress: str = "none",
        t0: float | None = None,
    ) -> None:
        spec = flow if isinstance(flow, FlowSpec) else FlowSpec.of(flow, sentinel)
        spec.complete()
        # the request as the recording's header keeps it (complete() lets go of spec.request), as verify reads it
        asked = (spec.header or {}).get("request") or {}
        self.flow_id = spec.flow_id
        self.t0 = time.monotonic() if t0 is None else t0
        self.started = spec.started
        self.errors: list[str] = []
        self.session: StreamSession | None = None
        self.events_before_stop = 0  # wire events analysed (and recorded) before analysis stopped
        self.writer: RecordingWriter | None = None
        self.decoder: WireUndo | None = None  # for a content-encoded body
        self.detection = spec.detection
        self.recording_path: str | None = None
        self.directory = directory
        self.finished = False
        self.body_lost = False  # content decoding failed: later body bytes cannot be placed
        self.body_bytes = 0  # (decoded) body bytes taken: the summary's count when analysis failed
        self.called = False  # the Tap's stream callable was called (set there): not replaced by another addon
        self.flushed_at = 0.0
        self.backlog: list[bytes] = []  # chunks handed on, not analysed yet
        self.backlog_times: list[float] = []  # their arrivals
        self.backlog_bytes = 0
        self.scheduled = False
        # body bytes the decoder holds that no frame covers yet (the event in progress), so that
        # they can still be recorded if analysis fails; only kept while recording
        self.unframed = bytearray()
        self.unframed_start = 0
        # past this the event in progress is over the decoders' limit: the decoder will skip it
        # without keeping it, so its bytes go to the recording as raw lines now, not memory
        # (in lines of at least MIN_RAW_LINE: a line per byte of a tiny limit cost ~190 bytes of JSON each)
        self.spill_at = max(max_event_size, MIN_RAW_LINE)
        self.status = spec.status
        self.encoding = spec.encoding
        self.accept_encoding = spec.accept_encoding
        self.length_framed = spec.length_framed
        self.requested_model = spec.requested_model
        for part, message in spec.errors:
            if part == "analysis":
                self._failed(part, message)
        try:
            if self.detection is not None:
                self.decoder = WireUndo(self.encoding) if content_encoded(self.encoding) else None
                self.session = StreamSession(
                    self.detection.dialect,
                    self.detection.wire,
                    http_status=self.status,
                    sentinel=sentinel,
                    max_event_size=max_event_size,
                    keep_arrivals=False,  # each frame's time is in the recording; a list would grow per event
                    streamed=spec.streamed,
                    one_response=True,
                    may_resume=may_resume(asked.get("method"), asked.get("url")),
                )
                self.session.asked(asked)
                if self.decoder is not None and self.decoder.failure:  # a coding streamtap does not know
                    self._undo_failed(None)
        except Exception as exc:
            self.fail("analysis", exc)
        self.provider = self.detection.dialect.value if self.detection else "unknown"
        self.sentinel = sentinel
        if record:
            header_failed = [message for part, message in spec.errors if part == "recording"]
            try:
                self.writer = RecordingWriter.create(
                    directory,
                    started=self.started,
                    provider=self.provider,
                    flow_id=self.flow_id,
                    fsync=fsync,
                    redact=redact,
                    redact_allow=redact_allow,
                    encoded=content_encoded(self.encoding),
                    compress=compress,
                )
                if not header_failed:
                    assert spec.header is not None
                    header = spec.header
                    if max_event_size != DEFAULT_MAX_EVENT:  # verify judges with the limit the proxy used
                        header = {**header, "max_event_size": max_event_size}
                    self.writer.header(header)
                    for note in self.errors:
                        self.writer.note("streamtap_error", note, self._now_ms())
                    self.writer.flush()
            except Exception as exc:
                self.fail("recording", exc)
            for message in header_failed:
                self._failed("recording", message)

    def partial_path(self) -> str | None:
        return self.writer.file_path if self.writer is not None else None

    # the errors ---------------------------------------------------------------------
    def fail(self, part: str, exc: BaseException) -> None:
        """Switch off the failed part for this flow; log the first failure only."""
        self._failed(part, _described(exc), file_broken=isinstance(exc, OSError))

    def _failed(self, part: str, what: str, logged: bool = False, file_broken: bool = True) -> None:
        """``logged``: the proxy has logged this failure already (it stays the flow's first).
        ``file_broken``: the recording failed writing (a full disk), so it takes no note of it.

        The message can quote the traffic (a Content-Encoding header names its coding): its log
        line is escaped here, where it is made, so a worker forwards the record already safe."""
        message = f"{part}: {what}"
        if not self.errors and not logged:
            log.warning(f"streamtap: flow {self.flow_id[:8]}: {terminal_safe(message, one_line=True)}; traffic passes on untouched")
        self.errors.append(message)
        if part == "recording":
            self.unframed = bytearray()
            writer, self.writer = self.writer, None
            if writer is not None:
                if not file_broken:  # a bug, not the disk: its lines are whole, and one more says why they stop
                    try:
                        writer.note("streamtap_error", message, self._now_ms())
                    except Exception:
                        pass
                try:
                    writer.close()
                except Exception:
                    pass
        else:
            if self.session is not None:
                try:  # (the session may be what failed)
                    self.events_before_stop = self.session.wire_events
                except Exception:
                    pass
            self.session = None
            if self.writer is not None:
                try:
                    self.writer.note("streamtap_error", message, self._now_ms())
                except Exception as write_exc:
                    self.fail("recording", write_exc)

    def _now_ms(self) -> float:
        """When streamtap hit a failure, as a note's ``t``: ms since the response started (``t0``)."""
        return milliseconds(time.monotonic() - self.t0)

    # the bytes ----------------------------------------------------------------------
    def arrived(self, data: bytes, loop) -> None:
        """A chunk is on its way to the client: note its arrival, analyse it right after.

        The analysis runs in a callback the event loop calls once the proxy has handed the
        chunk on, so parsing never delays a chunk. Without a loop, or when the backlog
        grows (a saturated proxy), it runs at once: memory stays bounded."""
        if not data or self.finished:
            return
        self.backlog_times.append(time.monotonic() - self.t0)
        self.backlog.append(data)
        self.backlog_bytes += len(data)
        if loop is None or self.backlog_bytes > MAX_BACKLOG:
            self.catch_up()
        elif not self.scheduled:
            self.scheduled = True
            loop.call_soon(self.catch_up)

    def take(self, chunks: list[bytes], times: list[float]) -> None:
        """Reads that arrived earlier (``times`` since ``t0``), analysed now: a worker's entry."""
        if self.finished:
            return
        self.backlog += chunks
        self.backlog_times += times
        self.catch_up()

    def lost_from(self, offset: int, why: str) -> None:
        """The bytes from wire byte ``offset`` on will not arrive: analysis stops, the recording says so.

        The proxy, which stopped handing them on, has logged why: logged here too, it would be twice."""
        if self.finished:
            return
        self.catch_up()
        message = f"{why} at byte {offset}"
        if self.session is not None:
            self._failed("analysis", message, logged=True)
            self._record_raw(b"", milliseconds(time.monotonic() - self.t0))
        else:  # analysis had already stopped; the recording still says where its bytes end
            self.errors.append(f"analysis: {message}")
            if self.writer is not None:
                try:
                    self.writer.note("streamtap_error", f"analysis: {message}", self._now_ms())
                except Exception as exc:
                    self.fail("recording", exc)

    def catch_up(self) -> None:
        self.scheduled = False
        chunks, times = self.backlog, self.backlog_times
        if not chunks:
            return
        self.backlog, self.backlog_times, self.backlog_bytes = [], [], 0
        if self.finished:
            return
        if self.decoder is not None or self.session is None:
            for t, data in zip(times, chunks):
                try:
                    self.feed(data, t)
                except Exception as exc:  # feed does not raise; this is the last line of defence
                    self.fail("analysis", exc)
            return
        # the common case: the reads of one event-loop turn (often a single one), decoded and
        # recorded in one pass per BATCH_BYTES
        if len(chunks) == 1:
            self._feed_reads(chunks, times, len(chunks[0]))
            return
        first, size = 0, 0
        for i, chunk in enumerate(chunks):
            size += len(chunk)
            if size >= BATCH_BYTES:
                self._feed_reads(chunks[first : i + 1], times[first : i + 1], size)
                first, size = i + 1, 0
        if first < len(chunks):
            self._feed_reads(chunks[first:] if first else chunks, times[first:] if first else times, size)

    def _feed_reads(self, chunks: list[bytes], times: list[float], size: int) -> None:
        """Several identity-encoded reads: recorded, decoded and framed in one pass each."""
        self.body_bytes += size
        try:
            t_ms = [milliseconds(t) for t in times]
            writer = self.writer
            if writer is not None:
                try:
                    writer.reads(chunks, t_ms)
                except Exception as exc:
                    self.fail("recording", exc)
                    writer = None
            session = self.session
            if session is None:  # analysis failed on an earlier group
                self._record_raw(b"".join(chunks), t_ms[-1])
                return
            try:
                if len(chunks) == 1:
                    events = session.feed(chunks[0], times[0])
                    event_ms = [t_ms[0]] * len(events)
                else:
                    events, brought_by = session.feed_reads(chunks, times)
                    event_ms = [t_ms[i] for i in brought_by]
            except Exception as exc:
                self.fail("analysis", exc)
                self._record_raw(b"".join(chunks), t_ms[-1])
                return
            if writer is not None:
                try:
                    self._write_frames(writer, events, event_ms, chunks)
                    self._keep_unframed(chunks, size)
                    if len(self.unframed) > self.spill_at:
                        self._spill(writer, t_ms[-1])
                except Exception as exc:
                    self.fail("recording", exc)
            if times[-1] - self.flushed_at >= FLUSH_EVERY:
                self.flush(times[-1])
        except Exception as exc:  # the last line of defence
            self.fail("analysis", exc)

    def _write_frames(self, writer: RecordingWriter, events: Sequence, event_ms: Sequence, chunks: Sequence[bytes] = ()) -> None:
        """``writer.frames``, and the bytes of an event the decoder did not keep (see SpanNotKept)
        from the Tap's own copy: ``unframed``, then ``chunks`` when they are not in it yet."""
        if not events:
            return
        if type(events[-1]) is Tail:  # the stream's last bytes: all the Tap holds from the last frame on
            self._write_frames(writer, events[:-1], event_ms[:-1], chunks)
            tail = self._held(writer, chunks)
            writer.tail(events[-1]._replace(start=writer.offset, end=writer.offset + len(tail), raw=tail), event_ms[-1])
            return
        while events:
            try:
                writer.frames(events, event_ms)
                return
            except SpanNotKept as gap:
                event, t_ms = events[gap.index], event_ms[gap.index]
                kept = self._held(writer, chunks)[: event.end - writer.offset]
                if len(kept) != event.end - writer.offset:
                    raise RecordingError(f"bytes {writer.offset}-{event.end} of a skipped event are not held") from gap
                writer.unkept(event, kept, t_ms, self.spill_at, OVERSIZE_RAW)
                events, event_ms = events[gap.index + 1 :], event_ms[gap.index + 1 :]

    def _held(self, writer: RecordingWriter, chunks: Sequence[bytes]) -> bytes:
        """The body bytes the Tap holds from the writer's offset on (rare paths only: it copies)."""
        return (bytes(self.unframed) + b"".join(chunks))[writer.offset - self.unframed_start :]

    def _spill(self, writer: RecordingWriter, t_ms: float | None) -> None:
        """The event in progress outgrew the decoders' limit: record its bytes so far, unframed, in
        whole lines of the limit counted from the event's start (from a view of them: each copy of
        an event this size is the limit's size again). The rest stays held until the next line
        fills or the event ends, so its lines are cut alike whatever the reads."""
        whole = len(self.unframed) // self.spill_at * self.spill_at
        with memoryview(self.unframed) as held:
            writer.raw_lines(held[:whole], t_ms, self.spill_at, OVERSIZE_RAW)
            rest = bytearray(held[whole:])
        self.unframed = rest
        self.unframed_start = writer.offset

    def _keep_unframed(self, chunks: list[bytes], size: int) -> None:
        """After ``chunks`` were decoded and framed: keep the body bytes no frame covers yet
        (the event in progress), from what was held before and from ``chunks``."""
        writer = self.writer
        assert writer is not None
        held = self.unframed
        end = self.unframed_start + len(held) + size
        keep = end - writer.offset
        if keep <= 0:
            if held:
                self.unframed = bytearray()
        elif keep <= size:
            pieces = []
            for chunk in reversed(chunks):
                if keep <= len(chunk):
                    pieces.append(chunk[len(chunk) - keep :])
                    break
                pieces.append(chunk)
                keep -= len(chunk)
            self.unframed = bytearray(b"".join(reversed(pieces)))
        else:
            del held[: len(held) - (keep - size)]
            held += b"".join(chunks)
        self.unframed_start = writer.offset

    def feed(self, data: bytes, t: float | None = None) -> None:
        if not data or self.finished:
            return
        if t is None:
            t = time.monotonic() - self.t0
        t_ms = milliseconds(t)
        writer = self.writer
        if writer is not None:
            try:
                writer.read(data, t_ms)
            except Exception as exc:
                self.fail("recording", exc)
                writer = None
        self._take_body(data, t, t_ms=t_ms)
        if t - self.flushed_at >= FLUSH_EVERY:
            self.flush(t)

    def flush(self, t: float | None = None) -> None:
        """Hand buffered lines to the OS, so a killed proxy loses at most FLUSH_EVERY of them."""
        self.flushed_at = time.monotonic() - self.t0 if t is None else t
        if self.writer is not None:
            try:
                self.writer.flush()
            except Exception as exc:
                self.fail("recording", exc)

    def _take_body(self, data: bytes, t: float, final: bool = False, t_ms: float | None = None) -> None:
        if self.body_lost:
            return
        if t_ms is None:
            t_ms = milliseconds(t)
        if self.decoder is None:
            self._take_decoded(data, t, t_ms)
            return
        # a piece at a time: a read of a high-ratio coding can decode to gigabytes
        for body in self.decoder.finish_pieces() if final else self.decoder.pieces(data):
            self._take_decoded(body, t, t_ms)
        if self.decoder.failure is not None:
            self._undo_failed(t_ms)

    def _take_decoded(self, body: bytes, t: float, t_ms: float) -> None:
        self.body_bytes += len(body)
        session = self.session
        if session is None:
            self._record_raw(body, t_ms)
            return
        if self.writer is not None:
            self.unframed += body
        try:
            events = session.feed(body, t)
        except Exception as exc:
            self.fail("analysis", exc)
            self._record_raw(b"", t_ms)
            return
        writer = self.writer
        if writer is not None:
            try:
                if events:
                    self._write_frames(writer, events, [t_ms] * len(events))
                covered = writer.offset - self.unframed_start
                if covered:
                    del self.unframed[:covered]
                    self.unframed_start = writer.offset
                if len(self.unframed) > self.spill_at:
                    self._spill(writer, t_ms)
            except Exception as exc:
                self.fail("recording", exc)

    def _undo_failed(self, t_ms: float | None) -> None:
        """The content-encoding could not be undone (``decoder.failure`` says where): no body byte
        follows, the recording keeps the wire. The bytes decoded before it that no frame covers
        yet (the event in progress) are recorded unframed, so the body holds all that was decoded."""
        assert self.decoder is not None and self.decoder.failure is not None
        self.body_lost = True
        self._failed("analysis", self.decoder.failure)
        if t_ms is not None:
            self._record_raw(b"", t_ms, UNDO_FAILED_RAW)

    def _record_raw(self, body: bytes, t_ms: float, why: str = ANALYSIS_OFF_RAW) -> None:
        """Body bytes with no frames: those the decoder still held when analysis stopped, then ``body``."""
        writer = self.writer
        if writer is None:
            return
        data = bytes(self.unframed) + body
        self.unframed.clear()
        if not data:
            return
        try:
            writer.raw(data, t_ms, why)
        except Exception as exc:
            self.fail("recording", exc)
        self.unframed_start = writer.offset if self.writer is not None else self.unframed_start

    # the end ------------------------------------------------------------------------
    def finish(
        self, end: StreamEnd, error: str | None = None, injected_fault: str | None = None, t: float | None = None,
        undelivered: int = 0,
    ) -> dict[str, Any]:
        """Judge and close; returns the summary the addon logs and marks the flow with.

        ``injected_fault``: the faults streamtap itself put into this answer; the recording,
        the verdict's evidence and the summary name them. ``undelivered``: the bytes at the end
        of the body the proxy received (and streamtap recorded) but the client never got."""
        self.catch_up()
        self.finished = True
        if t is None:
            t = time.monotonic() - self.t0
        if self.decoder is not None:
            self._take_body(b"", t, final=True)
        why = next((error[len("analysis: "):] for error in self.errors if error.startswith("analysis: ")), None)
        judged: dict[str, Any] = {  # until the analysis says more
            "model": self.requested_model,
            "verdict": VerdictKind.UNKNOWN.value,
            "reason": "streamtap could not analyse this flow" + (f": {why}" if why else ""),
            "events": self.events_before_stop,  # as many frames as the recording holds
            "bytes": self.body_bytes,  # (analysis, when it ran, counts them itself)
        }
        end_record: dict[str, Any] = {"stream_end": end.value, "error": error, "duration_ms": milliseconds(t)}
        if injected_fault:
            end_record["injected_fault"] = injected_fault
        if self.session is not None:
            counted, closed = self.session.wire_events, False
            try:
                analysis = self.session.close(end, length_framed=self.length_framed)
                closed = True
                if self.writer is not None and analysis.events:
                    try:
                        self._write_frames(self.writer, analysis.events, [milliseconds(t)] * len(analysis.events))
                    except Exception as exc:
                        self.fail("recording", exc)
                turn, verdict = analysis.turn, analysis.verdict
                unfinished = self.decoder.unfinished() if self.decoder is not None else None
                if unfinished:  # the decoded body may be whole; its compressed stream was cut
                    verdict = analysis.verdict = judge_unfinished_coding(verdict, turn, unfinished, end)
                if self.decoder is not None:  # a gzip member, or bytes after it, a client may not read as streamtap did
                    verdict = analysis.verdict = judge_coding_streams(verdict, turn, self.decoder)
                # streamtap decoded it; the client may not
                verdict = analysis.verdict = judge_unaccepted_coding(verdict, turn, self.encoding, self.accept_encoding)
                if undelivered > 0:
                    verdict = analysis.verdict = judge_undelivered(verdict, turn, undelivered)
                if injected_fault:
                    verdict.evidence["injected_fault"] = injected_fault
                ttft = turn.timing.first_content
                turn_dict = turn.to_dict()
                turn_dict.get("timing", {}).pop("arrivals", None)
                judged = {
                    "model": turn.model or self.requested_model,  # as the recordings' index names it
                    "verdict": verdict.kind.value,
                    "reason": verdict.reason,
                    "events": analysis.wire_events,
                    "bytes": analysis.bytes,
                    "ttft_ms": milliseconds(ttft) if ttft is not None else None,
                    "usage": turn_dict.get("usage"),
                }
                end_record.update(verdict=verdict.to_dict(), turn=turn_dict, ttft_ms=judged["ttft_ms"], events=analysis.wire_events)
            except Exception as exc:
                self.fail("analysis", exc)
                if not closed:  # its events (a cut tail) were not recorded, though counted: their bytes go raw
                    self.events_before_stop = counted
                    self._record_raw(b"", milliseconds(t))  # (after a close, its frames and tail hold every byte)
        if self.session is None:
            if self.decoder is not None and self.decoder.failure:  # the body stops there: said, not a vague "could not analyse"
                judged["reason"] = self.decoder.failure
            judged["events"] = self.events_before_stop  # (analysis may have stopped in the close above)
            evidence = {"injected_fault": injected_fault} if injected_fault else {}
            if undelivered > 0:
                evidence["undelivered_bytes"] = undelivered
            # every end line has one shape (readers such as DuckDB and Spark take the fields of one):
            # the events the recording holds, and no turn, first-content time or place where it stopped making sense
            end_record.update(
                verdict={"kind": judged["verdict"], "reason": judged["reason"], "seq": None, "offset": None, "evidence": evidence},
                turn=None,
                ttft_ms=None,
                events=judged["events"],
            )
        if self.errors:
            end_record["streamtap_errors"] = self.errors
        if self.writer is not None:
            try:
                final = os.path.join(os.path.dirname(self.writer.file_path),
                                     final_name(self.started, self.provider, judged["verdict"], self.flow_id) + self.writer.suffix)
                loop = running_loop()
                writer = self.writer
                # in the proxy, the disk sync runs on a worker thread: the client's end of body
                # (sent after this hook) never waits for the disk
                writer.finish(end_record, final, sync=loop is None)
                self.recording_path = writer.file_path
                if loop is not None:
                    loop.run_in_executor(None, _sync_recording, writer, self.flow_id)
            except Exception as exc:
                self.fail("recording", exc)
        return flow_summary(
            provider=self.provider,
            duration_ms=milliseconds(t),
            stream_end=end.value,
            recording=self.recording_path,
            errors=self.errors,
            injected_fault=injected_fault,
            **judged,
        )

    def abandon(self) -> None:
        """The proxy is shutting down mid-stream: leave the recording marked incomplete."""
        self.catch_up()
        self.finished = True
        if self.writer is not None:
            self.writer.close()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The proxy's event loop; None where hooks are called without one (tests, scripts)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _sync_recording(writer: RecordingWriter, flow_id: str) -> None:
    """On a worker thread: the finished recording's sync (per policy) and close."""
    try:
        writer.sync_and_close()
    except Exception as exc:  # the end line is written; only its durability is in doubt
        log.warning(f"streamtap: flow {flow_id[:8]}: recording sync failed: {failure(exc)}")
