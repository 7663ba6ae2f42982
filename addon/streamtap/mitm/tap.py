"""The Tap addon: watch streamed answers in flight, record them, say when one is incomplete.

For each matching flow the Tap sets ``flow.response.stream`` to a callable that returns
every chunk unchanged, at once, and feeds a copy to a ``FlowTap`` (decoder + assembler
+ recording writer). Nothing in here may block, delay or alter traffic: every failure
inside streamtap is caught, logged once per flow and kept as evidence.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from math import floor as _floor
from pathlib import Path
from typing import Any

from mitmproxy import exceptions, flowfilter, http
from mitmproxy.connection import ConnectionState

from streamtap.mitm import option_checks
from streamtap.mitm.flow_commands import FlowCommands
from streamtap.mitm.flowspec import FlowSpec, described as _described
from streamtap.mitm.worker import EXPIRE_EVERY, RemoteFlow, Workers
from streamtap.providers import RequestInfo, StreamEnd, StreamSession, VerdictKind, detect_dialect
from streamtap.recording import FSYNC_POLICIES, RecordingError, RecordingWriter, SpanNotKept, final_name, flow_header
from streamtap.recording.flows import injected_fault, is_llm_stream, request_info
from streamtap.recording.compress import COMPRESSIONS
from streamtap.recording.content import content_decoder
from streamtap.wire import DEFAULT_MAX_EVENT, Tail

log = logging.getLogger("streamtap")

MARK = ":warning:"
INJECTED_END = "streamtap_injected_end"  # flow.metadata key: the style of the cut streamtap's live fault made
MAX_BACKLOG = 1 << 20  # bytes handed on but not yet analysed before analysis runs inline
BATCH_BYTES = 64 * 1024  # reads decoded in one pass: amortises per-call costs, bounds the joined copy
MAX_KEPT_BODY = 32 * 1024 * 1024  # bytes of a streamed body kept to show when mitmproxy keeps none
MAX_EVENT_LIMIT = 256 * 1024 * 1024  # streamtap_max_event above this would unbound a stream's memory
OVERSIZE_RAW = "an event over streamtap_max_event: the decoder skipped it, its bytes are kept here unframed"
FLUSH_EVERY = 0.1  # seconds: recording lines reach the OS at least this often (a syscall per chunk costs too much)
MAX_WORKERS = 64
# A changed streamtap_workers is applied this long after the last change: mitmweb's number field
# sends one update per keystroke (typing 16 would start a pool of 1, then one of 16), and an
# update mitmproxy rolls back sets the count back within the same turn.
RESIZE_AFTER = 0.5


# --- one open stream --------------------------------------------------------------------


def _ms(seconds: float) -> float:
    """Milliseconds to the microsecond (the value round(seconds * 1000, 3) gives, at a quarter of its cost)."""
    return _floor(seconds * 1e6 + 0.5) / 1000


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
        self.flow_id = spec.flow_id
        self.t0 = time.monotonic() if t0 is None else t0
        self.started = spec.started
        self.errors: list[str] = []
        self.session: StreamSession | None = None
        self.writer: RecordingWriter | None = None
        self.decoder = None
        self.detection = spec.detection
        self.recording_path: Path | None = None
        self.directory = directory
        self.finished = False
        self.body_lost = False  # content decoding failed: later body bytes cannot be placed
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
        self.spill_at = max_event_size
        self.status = spec.status
        self.encoding = spec.encoding
        self.requested_model = spec.requested_model
        for part, message in spec.errors:
            if part == "analysis":
                self._failed(part, message)
        try:
            if self.detection is not None:
                self.decoder = content_decoder(self.encoding)
                self.session = StreamSession(
                    self.detection.dialect,
                    self.detection.wire,
                    http_status=self.status,
                    sentinel=sentinel,
                    max_event_size=max_event_size,
                    keep_arrivals=False,  # each frame's time is in the recording; a list would grow per event
                )
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
                    encoded=bool(self.decoder) or (self.encoding not in (None, "", "identity")),
                    compress=compress,
                )
                if not header_failed:
                    assert spec.header is not None
                    header = spec.header
                    if max_event_size != DEFAULT_MAX_EVENT:  # verify judges with the limit the proxy used
                        header = {**header, "max_event_size": max_event_size}
                    self.writer.header(header)
                    for note in self.errors:
                        self.writer.note("streamtap_error", note)
                    self.writer.flush()
            except Exception as exc:
                self.fail("recording", exc)
            for message in header_failed:
                self._failed("recording", message)

    def partial_path(self) -> str | None:
        return str(self.writer.path) if self.writer is not None else None

    # the errors ---------------------------------------------------------------------
    def fail(self, part: str, exc: BaseException) -> None:
        """Switch off the failed part for this flow; log the first failure only."""
        self._failed(part, _described(exc))

    def _failed(self, part: str, what: str) -> None:
        message = f"{part}: {what}"
        if not self.errors:
            log.warning(f"streamtap: flow {self.flow_id[:8]}: {message}; traffic passes on untouched")
        self.errors.append(message)
        if part == "recording":
            self.unframed = bytearray()
            writer, self.writer = self.writer, None
            if writer is not None:
                try:
                    writer.close()
                except Exception:
                    pass
        else:
            self.session = None
            if self.writer is not None:
                try:
                    self.writer.note("streamtap_error", message)
                except Exception as write_exc:
                    self.fail("recording", write_exc)

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
        """The bytes from wire byte ``offset`` on will not arrive: analysis stops, the recording says so."""
        if self.finished:
            return
        self.catch_up()
        message = f"{why} at byte {offset}"
        if self.session is not None:
            self._failed("analysis", message)
            self._record_raw(b"", _ms(time.monotonic() - self.t0))
        else:  # analysis had already stopped; the recording still says where its bytes end
            self.errors.append(f"analysis: {message}")
            if self.writer is not None:
                try:
                    self.writer.note("streamtap_error", f"analysis: {message}")
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
        try:
            t_ms = [_ms(t) for t in times]
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
                self._raw_lines(writer, kept, t_ms)
                writer.frames((event._replace(start=event.end, raw=b""),), (t_ms,))
                events, event_ms = events[gap.index + 1 :], event_ms[gap.index + 1 :]

    def _held(self, writer: RecordingWriter, chunks: Sequence[bytes]) -> bytes:
        """The body bytes the Tap holds from the writer's offset on (rare paths only: it copies)."""
        return (bytes(self.unframed) + b"".join(chunks))[writer.offset - self.unframed_start :]

    def _spill(self, writer: RecordingWriter, t_ms: float | None) -> None:
        """The event in progress outgrew the decoders' limit: record its bytes so far, unframed."""
        self._raw_lines(writer, bytes(self.unframed), t_ms)
        self.unframed = bytearray()
        self.unframed_start = writer.offset

    def _raw_lines(self, writer: RecordingWriter, data: bytes, t_ms: float | None) -> None:
        """``data`` as raw lines of at most the limit each (a decoded read can be larger), so no
        line outgrows what a reader takes."""
        for at in range(0, len(data), self.spill_at):
            writer.raw(data[at : at + self.spill_at], t_ms, OVERSIZE_RAW)

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
        t_ms = _ms(t)
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
        body = data
        if self.decoder is not None:
            try:
                body = self.decoder.flush() if final else self.decoder.decompress(data)
            except Exception as exc:
                self.body_lost = True
                self.fail("analysis", exc)
                return
            if not body:
                return
        if t_ms is None:
            t_ms = _ms(t)
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

    def _record_raw(self, body: bytes, t_ms: float) -> None:
        """Body bytes with no frames: those the decoder still held when analysis stopped, then ``body``."""
        writer = self.writer
        if writer is None:
            return
        data = bytes(self.unframed) + body
        self.unframed.clear()
        if not data:
            return
        try:
            writer.raw(data, t_ms, "streamtap analysis was off for this flow")
        except Exception as exc:
            self.fail("recording", exc)
        self.unframed_start = writer.offset if self.writer is not None else self.unframed_start

    # the end ------------------------------------------------------------------------
    def finish(
        self, end: StreamEnd, error: str | None = None, injected_fault: str | None = None, t: float | None = None
    ) -> dict[str, Any]:
        """Judge and close; returns the summary the addon logs and marks the flow with.

        ``injected_fault``: the faults streamtap itself put into this answer; the recording,
        the verdict's evidence and the summary name them."""
        self.catch_up()
        self.finished = True
        if t is None:
            t = time.monotonic() - self.t0
        if self.decoder is not None:
            self._take_body(b"", t, final=True)
        summary: dict[str, Any] = {
            "provider": self.provider,
            "model": self.requested_model,
            "verdict": VerdictKind.UNKNOWN.value,
            "reason": "streamtap could not analyse this flow",
            "events": 0,
            "bytes": 0,
            "ttft_ms": None,
            "duration_ms": _ms(t),
            "stream_end": end.value,
            "recording": None,
            "errors": self.errors,
        }
        end_record: dict[str, Any] = {"stream_end": end.value, "error": error, "duration_ms": _ms(t)}
        if injected_fault:
            summary["injected_fault"] = end_record["injected_fault"] = injected_fault
        if self.session is not None:
            try:
                analysis = self.session.close(end)
                if self.writer is not None and analysis.events:
                    try:
                        self._write_frames(self.writer, analysis.events, [_ms(t)] * len(analysis.events))
                    except Exception as exc:
                        self.fail("recording", exc)
                turn, verdict = analysis.turn, analysis.verdict
                if injected_fault:
                    verdict.evidence["injected_fault"] = injected_fault
                ttft = turn.timing.first_content
                turn_dict = turn.to_dict()
                turn_dict.get("timing", {}).pop("arrivals", None)
                summary.update(
                    model=turn.model or self.requested_model,  # as the recordings' index names it
                    verdict=verdict.kind.value,
                    reason=verdict.reason,
                    events=analysis.wire_events,
                    bytes=analysis.bytes,
                    ttft_ms=_ms(ttft) if ttft is not None else None,
                    usage=turn_dict.get("usage"),
                )
                end_record.update(verdict=verdict.to_dict(), turn=turn_dict, ttft_ms=summary["ttft_ms"], events=analysis.wire_events)
            except Exception as exc:
                self.fail("analysis", exc)
                self._record_raw(b"", _ms(t))
        if self.session is None:
            evidence = {"injected_fault": injected_fault} if injected_fault else {}
            end_record["verdict"] = {"kind": summary["verdict"], "reason": summary["reason"], "evidence": evidence}
        if self.errors:
            end_record["streamtap_errors"] = self.errors
        if self.writer is not None:
            try:
                final = self.writer.path.with_name(
                    final_name(self.started, self.provider, summary["verdict"], self.flow_id) + self.writer.suffix
                )
                loop = _running_loop()
                writer = self.writer
                # in the proxy, the disk sync runs on a worker thread: the client's end of body
                # (sent after this hook) never waits for the disk
                self.recording_path = writer.finish(end_record, final, sync=loop is None)
                summary["recording"] = str(self.recording_path)
                if loop is not None:
                    loop.run_in_executor(None, _sync_recording, writer, self.flow_id)
            except Exception as exc:
                self.fail("recording", exc)
        summary["errors"] = self.errors
        return summary

    def abandon(self) -> None:
        """The proxy is shutting down mid-stream: leave the recording marked incomplete."""
        self.catch_up()
        self.finished = True
        if self.writer is not None:
            self.writer.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
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
        log.warning(f"streamtap: flow {flow_id[:8]}: recording sync failed: {type(exc).__name__}: {exc}")


# --- the addon --------------------------------------------------------------------------


def _closed(conn) -> bool:
    # the proxy clears CAN_READ when the peer's EOF arrives, before the hooks run
    return conn.timestamp_end is not None or not (conn.state & ConnectionState.CAN_READ)


def ended_by(flow: http.HTTPFlow, message: str) -> StreamEnd:
    """Which side ended a flow that errored. mitmproxy's error does not say, so read the signs:
    its HTTP/1 message names the client; otherwise the side whose connection closed first;
    for an HTTP/2 stream reset (mitmproxy words it "reset by client" for either side) the
    code: clients cancel with CANCEL, servers cut with other codes."""
    if flow.metadata.get(INJECTED_END):  # streamtap cut it, standing in for the upstream, whatever the protocol shows
        return StreamEnd.UPSTREAM_RESET
    text = message.lower()
    if "client disconnected" in text:
        return StreamEnd.CLIENT_ABORTED
    client_closed = _closed(flow.client_conn)
    server_closed = _closed(flow.server_conn)
    if client_closed != server_closed:
        return StreamEnd.CLIENT_ABORTED if client_closed else StreamEnd.UPSTREAM_RESET
    if "stream reset" in text:
        return StreamEnd.CLIENT_ABORTED if "(cancel)" in text else StreamEnd.UPSTREAM_RESET
    return StreamEnd.UPSTREAM_RESET


def summary_line(s: dict[str, Any]) -> str:
    ttft = f"{s['ttft_ms']:.0f} ms" if s.get("ttft_ms") is not None else "-"
    extra = "" if s["verdict"] == VerdictKind.COMPLETE else f" ({s['reason']})"
    end = "" if s["stream_end"] == StreamEnd.FINISHED else f" [{s['stream_end']}]"
    return (
        f"streamtap: {s['provider']} {s['model'] or '-'} {s['verdict']}{extra}{end}: "
        f"{s['events']} events, {s['bytes']} bytes, ttft {ttft}, {s['duration_ms']:.0f} ms"
        + (f" [injected fault: {s['injected_fault']}]" if s.get("injected_fault") else "")
        + (f" -> {s['recording']}" if s.get("recording") else "")
    )


def flow_comment(s: dict[str, Any]) -> str:
    """The verdict as mitmweb shows it beside the flow."""
    comment = f"streamtap: {s['verdict']}: {s['reason']}"
    if s["stream_end"] != StreamEnd.FINISHED:
        comment += f" [{s['stream_end']}]"
    if s["errors"]:
        comment += f" (streamtap error: {s['errors'][0]})"
    return comment


class Tap:
    """mitmproxy addon: stream matching responses through streamtap's analysis and recorder."""

    def __init__(self) -> None:
        self.open: dict[str, FlowTap | RemoteFlow] = {}
        self.awaiting: dict[int, tuple[http.HTTPFlow, bool]] = {}  # by RemoteFlow.key: ended in a worker, verdict not back yet
        self.workers: Workers | None = None  # the pool that takes new flows
        self.retiring: list[Workers] = []  # pools streamtap_workers replaced, finishing the flows they hold
        self.wanted_workers = 0  # what streamtap_workers says
        self._resize_timer: asyncio.TimerHandle | None = None
        self._starting = False  # a pool is being started off the loop
        self._stopped = False
        self._flush_now = asyncio.Event()  # wakes the flusher: taps in the proxy's loop need it every FLUSH_EVERY
        self.kept: dict[str, bytearray] = {}  # with store_streamed_bodies: the bytes forwarded, for a cut flow
        self.addons = [FlowCommands(self)]  # mitmproxy registers an addon's `addons` with it
        self.told_about_loaded_flows = False
        self.filter: Callable[[http.HTTPFlow], bool] | None = None
        self.finished: list[dict[str, Any]] = []  # summaries of finished turns, newest last (bounded)
        self.observers: list[Any] = []  # told of each finished turn and each failure (the Metrics addon)
        self._flusher: asyncio.Task | None = None
        # the options every tapped flow needs, read in configure(): reading a mitmproxy option
        # deep-copies its value, which cost ~12 µs per flow on the loop
        self.settings: dict[str, Any] = {}
        self.keep_streamed_bodies = False
        self.changed: list[http.HTTPFlow] = []  # flows whose verdict came in this loop turn, for one update hook

    def load(self, loader) -> None:
        loader.add_option(
            "streamtap_dir", str, "./recordings/live", "Directory for recordings (one JSONL file per flow)."
        )
        loader.add_option(
            "streamtap_filter",
            str,
            "",
            "mitmproxy filter expression choosing the flows to tap. Empty: any text/event-stream, "
            "application/vnd.amazon.eventstream or application/x-ndjson response, plus streaming calls "
            "to a known LLM API (so their HTTP error answers are judged too).",
        )
        loader.add_option(
            "streamtap_fsync",
            str,
            "end",
            "When recordings reach the disk: always (every line), end (at the end of each stream), never (leave it to the OS).",
            choices=list(FSYNC_POLICIES),
        )
        loader.add_option(
            "streamtap_redact",
            Sequence[str],
            [],
            "More header, query parameter and body field names whose values are redacted in recordings "
            "(names that look like secrets always are: see the README's Security section).",
        )
        loader.add_option(
            "streamtap_redact_allow",
            Sequence[str],
            [],
            "Names the secret patterns catch wrongly: their values are kept in recordings.",
        )
        loader.add_option(
            "streamtap_sentinel",
            str | None,
            None,
            "A text the app's prompt asks the model to end every answer with; a turn without it is not complete.",
        )
        loader.add_option("streamtap_record", bool, True, "Write recordings (off: analyse and log only).")
        loader.add_option(
            "streamtap_compress", str, "none", "Compress recordings: zstd writes .jsonl.zst (crash-safe zstd blocks), none plain .jsonl.",
            choices=list(COMPRESSIONS),
        )
        loader.add_option(
            "streamtap_max_event", int, DEFAULT_MAX_EVENT, "Largest single wire event in bytes before it counts as malformed."
        )
        loader.add_option(
            "streamtap_workers",
            int,
            1,
            "Analysis worker processes: decoding, judging and recording run in them, off the proxy's event loop "
            "(flows are shared out by id, so N workers use N cores). 0: run in the proxy's loop (for debugging). "
            "A change while running applies to new flows; open ones finish where they started.",
        )
        option_checks.given_before_load(loader)

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if "streamtap_filter" in updated:
            expression = ctx.options.streamtap_filter.strip()
            if not expression:
                self.filter = None
            else:
                try:
                    self.filter = flowfilter.parse(expression)
                except ValueError as exc:
                    raise exceptions.OptionsError(f"streamtap_filter: {exc}") from None
        options = ctx.options
        if "streamtap_fsync" in updated:
            option_checks.choice("streamtap_fsync", options.streamtap_fsync, FSYNC_POLICIES)
        if "streamtap_compress" in updated:
            option_checks.choice("streamtap_compress", options.streamtap_compress, COMPRESSIONS)
        if updated & {"streamtap_dir", "streamtap_record"} and options.streamtap_record:
            option_checks.writable_dir("streamtap_dir", options.streamtap_dir)
        if "streamtap_redact" in updated:
            option_checks.names("streamtap_redact", options.streamtap_redact)
        if "streamtap_redact_allow" in updated:  # a typo here would leave the name redacted, silently
            option_checks.names("streamtap_redact_allow", options.streamtap_redact_allow)
        if "streamtap_sentinel" in updated:
            option_checks.sentinel("streamtap_sentinel", options.streamtap_sentinel)
        if "streamtap_max_event" in updated:
            option_checks.size("streamtap_max_event", options.streamtap_max_event, 1, MAX_EVENT_LIMIT)
        if "streamtap_workers" in updated:
            option_checks.size("streamtap_workers", options.streamtap_workers, 0, MAX_WORKERS, "processes")
            self.wanted_workers = options.streamtap_workers
            if self._flusher is not None:  # running: at start, running() starts them
                self._resize_soon()
        self.settings = dict(
            directory=os.path.expanduser(options.streamtap_dir),  # the shell does not expand a quoted or config-file ~
            fsync=options.streamtap_fsync,
            redact=list(options.streamtap_redact),
            redact_allow=list(options.streamtap_redact_allow),
            sentinel=options.streamtap_sentinel,
            max_event_size=options.streamtap_max_event,
            record=options.streamtap_record,
            compress=options.streamtap_compress,
        )
        self.keep_streamed_bodies = bool(getattr(options, "store_streamed_bodies", False))  # an option of mitmproxy's proxy server

    def _matches(self, flow: http.HTTPFlow, request: RequestInfo | None) -> bool:
        if self.filter is not None:
            return bool(self.filter(flow))
        return is_llm_stream(flow, request)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            if flow.response is None or flow.id in self.open:
                return
            # read once (~20 µs a time, on the loop that carries the traffic): the check and the spec share it
            request = None if self.filter is not None else request_info(flow)
            if not self._matches(flow, request):
                return
            if not flow.live:
                # A flow read from a file (mitmdump -r) arrives with its body already
                # stored: nothing will stream through a callable, so tapping it would
                # record an empty turn. `streamtap import` analyses stored bodies.
                if not self.told_about_loaded_flows:
                    self.told_about_loaded_flows = True
                    log.info("streamtap: flows read from a file are not tapped; `streamtap import FILE` records them")
                return
            settings = self.settings
            workers = self.workers
            if workers is not None:
                remote = workers.open(FlowSpec.of(flow, settings["sentinel"], request), settings)
            else:
                tap = FlowTap(FlowSpec.of(flow, settings["sentinel"], request), **settings)
        except Exception as exc:  # fail open: the flow goes on as mitmproxy would carry it
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot tap: {type(exc).__name__}: {exc}")
            self._tell("tap_failed")
            return
        if workers is not None:
            self.open[flow.id] = remote
            stream = workers.stream(remote)
        else:
            self.open[flow.id] = tap
            loop = _running_loop()

            def stream(data: bytes) -> bytes:
                try:
                    tap.arrived(data, loop)
                except Exception as exc:  # arrived() does not raise; this is the last line of defence
                    tap.fail("analysis", exc)
                return data

        if self.keep_streamed_bodies:
            kept = self.kept[flow.id] = bytearray()

            def stream_and_keep(data: bytes) -> bytes:
                if len(kept) < MAX_KEPT_BODY:
                    kept.extend(data[: MAX_KEPT_BODY - len(kept)])
                return stream(data)

            flow.response.stream = stream_and_keep
        else:
            flow.response.stream = stream

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow, StreamEnd.FINISHED, None)

    def error(self, flow: http.HTTPFlow) -> None:
        message = flow.error.msg if flow.error else "error"
        self._finish(flow, ended_by(flow, message), message)

    def _finish(self, flow: http.HTTPFlow, end: StreamEnd, error: str | None) -> None:
        tap = self.open.pop(flow.id, None)
        kept = self.kept.pop(flow.id, None)
        if tap is None:
            return
        try:
            shown_cut = False
            if kept is not None and flow.response is not None and flow.response.raw_content is None:
                # mitmproxy stores a streamed body only when the stream ends properly: a cut
                # one, the one to read, would show no content
                flow.response.raw_content = bytes(kept)
                shown_cut = len(kept) >= MAX_KEPT_BODY
            if isinstance(tap, RemoteFlow):
                assert tap.workers is not None
                self.awaiting[tap.key] = (flow, shown_cut)
                tap.workers.finish(tap, end.value, error, injected_fault(flow))
                return
            summary = tap.finish(end, error, injected_fault(flow))
        except Exception as exc:
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot finish: {type(exc).__name__}: {exc}")
            self._tell("tap_failed")
            return
        self._apply(flow, summary, shown_cut)

    def _apply(self, flow: http.HTTPFlow, summary: dict[str, Any], shown_cut: bool) -> None:
        """A flow's verdict, onto the flow: metadata, mark, comment, log line, observers."""
        try:
            self.finished.append(summary)
            del self.finished[:-100]
            flow.metadata["streamtap"] = summary
            if summary["verdict"] != VerdictKind.COMPLETE:
                flow.marked = MARK
            elif flow.marked == MARK:  # an earlier run's (client replay); a mark the user chose stays
                flow.marked = ""
            flow.comment = flow_comment(summary)
            if shown_cut:
                flow.comment += f" (body shown: its first {MAX_KEPT_BODY} bytes)"
            log.info(summary_line(summary))
        except Exception as exc:
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot finish: {type(exc).__name__}: {exc}")
            self._tell("tap_failed")
            return
        self._tell("turn_finished", flow, summary)

    def _verdict(self, remote: RemoteFlow, summary: dict[str, Any]) -> None:
        """A worker's verdict, applied when it arrives; mitmweb is told the flow changed."""
        waiting = self.awaiting.pop(remote.key, None)
        if waiting is None:
            return
        flow, shown_cut = waiting
        self._apply(flow, summary, shown_cut)
        self.changed.append(flow)
        if len(self.changed) == 1:
            loop = _running_loop()
            if loop is None:  # called off a loop: at once
                self._announce_changed()
            else:
                loop.call_soon(self._announce_changed)

    def _announce_changed(self) -> None:
        """One update hook for every flow whose verdict came in this loop turn (a worker's reply
        often carries several): each hook is a call over all of mitmproxy's addons (~0.1 ms)."""
        flows, self.changed = self.changed, []
        if not flows:
            return
        try:
            from mitmproxy import ctx
            from mitmproxy.hooks import UpdateHook

            ctx.master.addons.trigger(UpdateHook(flows))
        except Exception as exc:
            log.warning(f"streamtap: {len(flows)} flow(s): cannot show their verdicts: {type(exc).__name__}: {exc}")

    def _lost(self, remote: RemoteFlow, why: str) -> None:
        """A flow whose worker died (or never answered): judged unknown, and said so."""
        duration = _ms((remote.ended or time.monotonic()) - remote.t0)
        where = f"; its recording {remote.recording} ends where the worker stopped" if remote.recording else ""
        log.warning(f"streamtap: flow {remote.flow_id[:8]}: {why}{where}; traffic passed on untouched")
        summary: dict[str, Any] = {
            "provider": remote.provider,
            "model": None,
            "verdict": VerdictKind.UNKNOWN.value,
            "reason": f"{why}: not judged",
            "events": 0,
            "bytes": remote.forwarded(),
            "ttft_ms": None,
            "duration_ms": duration,
            "stream_end": remote.end or StreamEnd.FINISHED.value,
            "recording": None,
            "errors": [f"analysis: {why}"],
        }
        if remote.fault:
            summary["injected_fault"] = remote.fault
        self._verdict(remote, summary)

    def _tell(self, what: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, what)(*args)
            except Exception as exc:  # an observer's bug never reaches the traffic
                log.warning(f"streamtap: {type(observer).__name__}.{what}: {type(exc).__name__}: {exc}")

    def running(self) -> None:
        from mitmproxy import ctx

        loop = _running_loop()
        count = getattr(ctx.options, "streamtap_workers", 0)
        if loop is not None and count and self.workers is None:
            try:
                self.workers = Workers(count, loop, verdict=self._verdict, lost=self._lost)
            except Exception as exc:  # analysis runs in the proxy's loop instead
                log.warning(f"streamtap: cannot start analysis workers: {type(exc).__name__}: {exc}; analysing in the proxy")
        # a stalled stream gets no chunks, so its buffered lines are flushed from here
        self._flusher = loop.create_task(self._flush_open()) if loop is not None else None

    async def _flush_open(self) -> None:
        wait = FLUSH_EVERY
        while True:
            try:
                await asyncio.wait_for(self._flush_now.wait(), wait)
            except TimeoutError:
                pass
            self._flush_now.clear()
            in_process = False
            for tap in list(self.open.values()):
                try:
                    if isinstance(tap, FlowTap):
                        in_process = True
                        tap.flush()
                except Exception:
                    pass
            self._expire_pools()
            # taps in the proxy's loop (streamtap_workers=0, or opened before it changed) need FLUSH_EVERY
            wait = EXPIRE_EVERY if self.workers is not None and not in_process else FLUSH_EVERY

    def _pools(self) -> list[Workers]:
        """Every pool of workers: the one that takes new flows, and those that finish their flows."""
        return [self.workers, *self.retiring] if self.workers is not None else list(self.retiring)

    def _expire_pools(self) -> None:
        for workers in self._pools():
            try:
                workers.expire()
            except Exception as exc:
                log.warning(f"streamtap: analysis workers: {type(exc).__name__}: {exc}")
        self.retiring = [workers for workers in self.retiring if not workers.gone]

    def _running_workers(self) -> int:
        return len(self.workers.processes) if self.workers is not None else 0

    def _resize_soon(self) -> None:
        loop = _running_loop()
        if loop is None:
            return
        if self._resize_timer is not None:
            self._resize_timer.cancel()
        self._resize_timer = loop.call_later(RESIZE_AFTER, self._resize_workers)

    def _resize_workers(self) -> None:
        """``streamtap_workers`` changed while running: a new pool (or the proxy's loop, for 0)
        takes new flows; the old pool finishes the flows it holds, then its workers stop. The new
        pool's processes start off the loop (16 of them take most of a second), and the flows that
        come meanwhile go where they went before."""
        self._resize_timer = None
        count = self.wanted_workers
        if self._stopped or self._starting or count == self._running_workers():
            return  # a start under way looks at the count again when it is done
        if not count:
            self._replace_workers(None)
            return
        loop = _running_loop()
        if loop is None:
            return
        self._starting = True
        started = loop.run_in_executor(None, functools.partial(Workers, count, loop, verdict=self._verdict, lost=self._lost))
        started.add_done_callback(functools.partial(self._workers_started, count))

    def _workers_started(self, count: int, started: asyncio.Future) -> None:
        self._starting = False
        try:
            new = started.result()
        except Exception as exc:
            if self._stopped:
                return
            running = self._running_workers()
            if self.wanted_workers == count:  # the option goes back to what runs
                log.warning(f"streamtap: cannot start {count} analysis workers: {type(exc).__name__}: {exc}; "
                            f"streamtap_workers stays {running}")
                self.wanted_workers = running
                try:
                    from mitmproxy import ctx

                    ctx.options.update(streamtap_workers=running)
                except Exception:
                    pass
            else:  # changed meanwhile: that count is tried
                log.warning(f"streamtap: cannot start {count} analysis workers: {type(exc).__name__}: {exc}")
                self._resize_if_idle()
            return
        if self._stopped:  # the proxy is shutting down (or the script reloading): no loop turn is left to see them exit
            new.stop(0.0)  # still starting: killed, not waited for, so the loop is not held
            return
        if self.wanted_workers != count:  # changed again meanwhile: these hold no flow, and stop at once
            new.retire()
            self.retiring.append(new)
            self._resize_if_idle()
            return
        self._replace_workers(new)

    def _resize_if_idle(self) -> None:
        """The count changed while a start ran: a pending timer applies it, else it is applied now
        (its timer fired during the start, and waited then)."""
        if self._resize_timer is None:
            self._resize_workers()

    def _replace_workers(self, new: Workers | None) -> None:
        old = self.workers
        if old is not None:
            old.retire()
            self.retiring.append(old)
        self.workers = new
        if new is None:  # the flusher may be in a sleep of EXPIRE_EVERY: taps in the loop need FLUSH_EVERY
            self._flush_now.set()
        where = f"{len(new.processes)} analysis worker(s)" if new is not None else "the proxy's loop (streamtap_workers=0)"
        held = f"; the {len(old.flows)} flow(s) under way finish in the workers they started in" if old is not None and old.flows else ""
        log.info(f"streamtap: new flows are analysed in {where}{held}")

    def done(self) -> None:
        self._stopped = True
        if self._resize_timer is not None:
            self._resize_timer.cancel()
            self._resize_timer = None
        if self._flusher is not None:
            self._flusher.cancel()
        for tap in self.open.values():
            try:
                if isinstance(tap, FlowTap):
                    tap.abandon()
            except Exception:
                pass
        for workers in self._pools():
            try:  # they leave their open recordings marked incomplete
                workers.stop()
            except Exception:
                pass
        self.workers = None
        self.retiring = []
        self.open.clear()
        self.kept.clear()


def __getattr__(name: str) -> Any:
    # `mitmdump -s .../streamtap/mitm/tap.py` loads this module as a script, and mitmproxy
    # registers a script's `addons`: hand it the whole addon rather than silently nothing.
    if name == "addons":
        from streamtap.mitm.entry import make_addons

        globals()["addons"] = made = make_addons()
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
