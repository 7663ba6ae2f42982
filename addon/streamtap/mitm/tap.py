"""The Tap addon: watch streamed answers in flight, record them, say when one is incomplete.

For each matching flow the Tap sets ``flow.response.stream`` to a callable that returns
every chunk unchanged, at once, and hands a copy to the flow's analysis: a ``FlowTap``
(``mitm/flowtap.py``: decoder, assembler and recording writer) in an analysis worker
(``mitm/worker.py``, in a pool of ``mitm/pools.py``), or in the proxy's loop with
``streamtap_workers=0``. Nothing in here may block, delay or alter traffic: every failure
inside streamtap is caught, logged once per flow and kept as evidence.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from mitmproxy import exceptions, flowfilter, http
from mitmproxy.connection import ConnectionState

from streamtap.cli import failure, terminal_safe
from streamtap.mitm import option_checks
from streamtap.mitm.flow_commands import FlowCommands
from streamtap.mitm.flowspec import FlowSpec
from streamtap.mitm.flowtap import FLUSH_EVERY, FlowTap, flow_summary, milliseconds, running_loop
from streamtap.mitm.pools import Pools
from streamtap.mitm.replay import http_streams
from streamtap.mitm.worker import EXPIRE_EVERY, RemoteFlow
from streamtap.providers import RequestInfo, StreamEnd, VerdictKind
from streamtap.recording import FSYNC_POLICIES
from streamtap.recording.flows import answered_end, ended_by, injected_fault, is_llm_stream, may_have_body, request_info
from streamtap.recording.compress import COMPRESSIONS
from streamtap.wire import DEFAULT_MAX_EVENT

log = logging.getLogger("streamtap")

MARK = ":warning:"
MAX_KEPT_BODY = 32 * 1024 * 1024  # bytes of a streamed body kept to show when mitmproxy keeps none
MAX_EVENT_LIMIT = 256 * 1024 * 1024  # streamtap_max_event above this would unbound a stream's memory
MAX_WORKERS = 64
# At exit, a worker still starting (seconds on a loaded machine) holds the recordings of the flows that
# ended just before; the others get 3 s. Together they stay within a container's 10 s stop timeout.
STOP_WAIT_STARTING = float(os.environ.get("STREAMTAP_TEST_STOP_WAIT_STARTING", 7.0))  # (tests: longer on a busy machine)


_RESPONSE_BODY_TERM = re.compile(r"(?:^|[\s(!&|])~bs(?:\s|$)")


def _closed(conn) -> bool:
    """``ended_by``'s ``closed`` for a live flow. The proxy clears CAN_READ when the peer's EOF
    arrives, before the hooks run; a capture keeps no state, so the importer asks only the end time."""
    return conn.timestamp_end is not None or not (conn.state & ConnectionState.CAN_READ)


def _client_stream(flow) -> tuple[Any, int] | None:
    """A live flow's stream on the proxy's HTTP/2 connection with the client: that connection and
    the stream's id; None for another protocol, or where the proxy's internals cannot be read."""
    try:
        from mitmproxy.proxy.layers.http import Http2Server

        layer, stream = http_streams(flow)[-1]
        client = layer.connections[flow.client_conn]
        return (client, stream.stream_id) if isinstance(client, Http2Server) else None
    except Exception:  # other mitmproxy internals, or none (a flow not on a live connection)
        return None


def _client_reset(client: tuple[Any, int] | None) -> bool | None:
    """``ended_by``'s ``client_reset``, of the flow's ``_client_stream``: whether that stream has
    closed. mitmproxy words either side's reset "stream reset by client", but its h2 connection
    closes the client's stream as the client's RST_STREAM arrives, before the error hook, and passes
    the upstream's reset on to the client only after the hook: at the hook that stream has closed
    only if the client reset it. None where it cannot be read."""
    try:
        return client[0].is_closed(client[1]) if client is not None else None
    except Exception:
        return None


def _undelivered(client: tuple[Any, int] | None) -> int:
    """Bytes of a live flow's answer that mitmproxy received but the client will never get, of the
    flow's ``_client_stream``: the proxy's HTTP/2 connection with the client holds what a slow
    reader's flow-control window has no room for, and drops it as it resets the client's stream
    after the error hook. At the hook it is still held. 0 where it cannot be read (fail open)."""
    try:
        return sum(len(chunk.data) for chunk in client[0].h2_conn.stream_buffers.get(client[1], ())) if client else 0
    except Exception:
        return 0


def summary_line(s: dict[str, Any]) -> str:
    """One line per turn. The model name and the reason (which quotes the provider's error) are
    someone else's text: a newline in them would forge a line of its own, an ESC act on the terminal."""
    ttft = f"{s['ttft_ms']:.0f} ms" if s.get("ttft_ms") is not None else "-"
    extra = "" if s["verdict"] == VerdictKind.COMPLETE else f" ({terminal_safe(s['reason'], one_line=True)})"
    end = "" if s["stream_end"] == StreamEnd.FINISHED else f" [{s['stream_end']}]"
    model = terminal_safe(s["model"], one_line=True) if s["model"] else "-"
    return (
        f"streamtap: {s['provider']} {model} {s['verdict']}{extra}{end}: "
        f"{s['events']} events, {s['bytes']} bytes, ttft {ttft}, {s['duration_ms']:.0f} ms"
        + (f" [injected fault: {terminal_safe(s['injected_fault'], one_line=True)}]" if s.get("injected_fault") else "")
        + (f" -> {s['recording']}" if s.get("recording") else "")
    )


def flow_comment(s: dict[str, Any]) -> str:
    """The verdict as mitmweb shows it beside the flow."""
    comment = f"streamtap: {s['verdict']}: {terminal_safe(s['reason'], one_line=True)}"
    if s["stream_end"] != StreamEnd.FINISHED:
        comment += f" [{s['stream_end']}]"
    if s["errors"]:
        comment += f" (streamtap error: {terminal_safe(s['errors'][0], one_line=True)})"  # it may quote the traffic
    return comment


def _after(earlier: Callable, ours: Callable[[bytes], bytes], body_ended: Callable[[], bool]) -> Callable:
    """``earlier``'s stream callable, then streamtap's on what it hands on (bytes or an iterable
    of them, as mitmproxy allows). An empty piece handed on mid-body ends an HTTP/1 chunked body
    (mitmproxy writes it as the last chunk): ``body_ended`` says whether it did, and then streamtap
    takes nothing after it, as the client gets nothing after it."""
    over = False

    def stream(data: bytes):
        nonlocal over
        out = earlier(data)
        pieces = [out] if isinstance(out, bytes) else list(out)
        for piece in pieces:
            if over:
                break
            if not piece and data and body_ended():
                over = True
                break
            ours(piece)
        return out if isinstance(out, bytes) else pieces

    return stream


def _wraps(outer: Any, ours: Callable | None, depth: int = 4) -> bool:
    """Whether ``outer`` holds ``ours`` (in a closure, as ``__wrapped__``, or as a bound method's
    object), a few calls deep: a wrapper that held back every byte (streamtap's own live faults,
    until the upstream cut) has not replaced streamtap's callable."""
    todo, seen = [(outer, 0)], set()
    while todo:
        value, level = todo.pop()
        if value is ours:
            return True
        if level == depth or id(value) in seen:
            continue
        seen.add(id(value))
        held = [getattr(value, "__wrapped__", None), getattr(value, "__self__", None), getattr(value, "__func__", None)]
        for cell in getattr(value, "__closure__", None) or ():
            try:
                held.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        todo += [(item, level + 1) for item in held if callable(item)]
    return False


def _saw_nothing(tap: FlowTap | RemoteFlow) -> bool:
    """Whether streamtap's stream callable was never called, not even with the body's empty end:
    a wrapper that forwards nothing (a live fault's cut at byte 0) still calls it at the end."""
    return not tap.called


class Tap:
    """mitmproxy addon: stream matching responses through streamtap's analysis and recorder."""

    def __init__(self) -> None:
        self.open: dict[str, FlowTap | RemoteFlow] = {}
        self.awaiting: dict[int, tuple[http.HTTPFlow, bool]] = {}  # by RemoteFlow.key: ended in a worker, verdict not back yet
        # by flow id, the key of the run whose verdict the flow waits for. mitmproxy's client replay
        # sends a flow again, maybe before that verdict is back: the verdict then is not the flow's.
        self.analysing: dict[str, int] = {}
        self._flush_now = asyncio.Event()  # wakes the flusher: taps in the proxy's loop need it every FLUSH_EVERY
        self.pools = Pools(verdict=self._verdict, lost=self._lost, into_loop=self._flush_now.set)
        self.kept: dict[str, bytearray] = {}  # with store_streamed_bodies: the bytes forwarded, for a cut flow
        # each tapped flow's stream callable as installed (maybe after an earlier addon's), to see it
        # replaced, and streamtap's own, to hand a body it did not see
        self.streams: dict[str, tuple[Callable, Callable]] = {}
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
            "application/vnd.amazon.eventstream or NDJSON (application/x-ndjson, application/ndjson, ...) response, plus streaming calls "
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
            "A text the app's prompt asks the model to end every answer with; a turn without it is not complete "
            "(an answer, or with n > 1 a choice, that stops to call a tool is not checked).",
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
                if _RESPONSE_BODY_TERM.search(expression):
                    raise exceptions.OptionsError(
                        "streamtap_filter: ~bs (the response body) can never match: a flow is chosen at its response "
                        "headers, before its body arrives (the request, its headers and body, can be filtered on)"
                    )
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
            self.pools.want(options.streamtap_workers)
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

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """A flow sent again (mitmproxy's client replay keeps its metadata): the run before's
        verdict, mark and comment are not this run's, whether or not this one is tapped. A flow
        read from a file (``mitmdump -r``, mitmweb's open) goes through the same hooks, not live:
        its verdict is its own, and stays."""
        if not flow.live:
            return
        self.analysing.pop(flow.id, None)
        earlier = flow.metadata.pop("streamtap", None)
        if earlier is None:
            return
        try:
            if flow.marked == MARK:
                flow.marked = ""
            if flow.comment.startswith(flow_comment(earlier)):
                flow.comment = ""
        except Exception as exc:  # fail open: the flow goes on as mitmproxy would carry it
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot clear the run before's verdict: {failure(exc)}")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            if flow.response is None or flow.id in self.open or not may_have_body(flow):
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
            workers = self.pools.current
            if workers is not None:
                remote = workers.open(FlowSpec.of(flow, settings["sentinel"], request), settings)
            else:
                tap = FlowTap(FlowSpec.of(flow, settings["sentinel"], request), **settings)
        except Exception as exc:  # fail open: the flow goes on as mitmproxy would carry it
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot tap: {failure(exc)}")
            self._tell("tap_failed")
            return
        if workers is not None:
            self.open[flow.id] = remote
            stream = workers.stream(remote)
        else:
            self.open[flow.id] = tap
            loop = running_loop()

            def stream(data: bytes) -> bytes:
                tap.called = True
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

            ours = stream_and_keep
        else:
            ours = stream
        earlier = flow.response.stream
        # an addon loaded before streamtap that changes the chunks keeps doing so; streamtap
        # watches what the client gets
        if callable(earlier):
            flow.response.stream = _after(earlier, ours, lambda: self._body_ended(flow))
        else:
            flow.response.stream = ours
        self.streams[flow.id] = (flow.response.stream, ours)
        # A response an addon made (server replay, map_local, a script's request hook) has its
        # body already: mitmproxy sends it whole after the response hook and streams nothing.
        if flow.response.raw_content:
            ours(flow.response.raw_content)

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.error is not None:  # killed as it ended: mitmproxy sends the kill, not the body's end
            self.error(flow)
            return
        self._finish(flow, answered_end(flow), None)

    def error(self, flow: http.HTTPFlow) -> None:
        message = flow.error.msg if flow.error else "error"
        client = _client_stream(flow)  # looked up once: the side of a reset, and the bytes held for the client
        end = ended_by(flow, message, closed=_closed, client_reset=lambda _: _client_reset(client))
        self._finish(flow, end, message, _undelivered(client))

    def _finish(self, flow: http.HTTPFlow, end: StreamEnd, error: str | None, undelivered: int = 0) -> None:
        tap = self.open.pop(flow.id, None)
        kept = self.kept.pop(flow.id, None)
        installed, ours = self.streams.pop(flow.id, (None, None))
        if tap is None:
            return
        try:
            if flow.response is not None and flow.response.stream is not installed and _saw_nothing(tap) \
                    and not _wraps(flow.response.stream, installed):
                if not self._take_unstreamed(flow, tap, ours):
                    kept = None  # nothing was kept: the flow shows what mitmproxy holds
            shown_cut = False
            if kept is not None and flow.response is not None and flow.response.raw_content is None:
                # mitmproxy stores a streamed body only when the stream ends properly: a cut
                # one, the one to read, would show no content
                flow.response.raw_content = bytes(kept)
                shown_cut = len(kept) >= MAX_KEPT_BODY
            if isinstance(tap, RemoteFlow):
                assert tap.workers is not None
                self.awaiting[tap.key] = (flow, shown_cut)
                self.analysing[flow.id] = tap.key
                tap.workers.finish(tap, end.value, error, injected_fault(flow), undelivered)
                return
            summary = tap.finish(end, error, injected_fault(flow), undelivered=undelivered)
        except Exception as exc:
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot finish: {failure(exc)}")
            self._tell("tap_failed")
            return
        self._apply(flow, summary, shown_cut)

    def _body_ended(self, flow: http.HTTPFlow) -> bool:
        """An addon before streamtap handed mitmproxy an empty piece mid-body: whether that ended the
        client's body (HTTP/1 chunked), in which case streamtap's analysis stops there, said why."""
        if flow.client_conn.alpn in (b"h2", b"h3") or "chunked" not in flow.response.headers.get("transfer-encoding", "").lower():
            return False  # an empty piece sends nothing
        tap = self.open.get(flow.id)
        why = "an addon loaded before streamtap handed mitmproxy an empty chunk, which ends an HTTP/1 chunked body: the client got nothing after it"
        log.warning(f"streamtap: flow {flow.id[:12]}: {why}; traffic passed on untouched")
        try:
            if isinstance(tap, RemoteFlow):
                if tap.workers is not None:
                    tap.workers.hand_on_now(tap)  # the reads the client did get go first
                tap.dropped = tap.dropped or why
            elif tap is not None:
                tap.catch_up()
                tap.lost_from(tap.body_bytes, why)
        except Exception as exc:  # fail open
            log.warning(f"streamtap: flow {flow.id[:12]}: {failure(exc)}")
        return True

    @staticmethod
    def _take_unstreamed(flow: http.HTTPFlow, tap: FlowTap | RemoteFlow, ours: Callable | None) -> bool:
        """An addon loaded after streamtap replaced its stream callable (with one of its own, or
        with ``stream = False``), so no read came through streamtap. A body mitmproxy then holds
        whole is the one the client got; with none, the turn cannot be judged, and it says why.
        Returns whether the body was taken."""
        body = flow.response.raw_content if flow.response is not None else None
        if body and ours is not None:
            ours(body)
            return True
        why = "another addon replaced streamtap's flow.response.stream, so streamtap saw none of the body"
        log.warning(f"streamtap: flow {flow.id[:12]}: {why}; traffic passed on untouched")
        if isinstance(tap, RemoteFlow):
            tap.dropped = tap.dropped or why
        else:
            tap.lost_from(0, why)
        return False

    def _apply(self, flow: http.HTTPFlow, summary: dict[str, Any], shown_cut: bool, onto_flow: bool = True) -> None:
        """A flow's verdict: its log line and observers, and onto the flow (metadata, mark, comment)
        unless the flow was sent again meanwhile."""
        try:
            self.finished.append(summary)
            del self.finished[:-100]
            if not onto_flow:
                log.info(summary_line(summary) + " (an earlier run of a flow sent again)")
                self._tell("turn_finished", flow, summary)
                return
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
            log.warning(f"streamtap: flow {flow.id[:12]}: cannot finish: {failure(exc)}")
            self._tell("tap_failed")
            return
        self._tell("turn_finished", flow, summary)

    def _verdict(self, remote: RemoteFlow, summary: dict[str, Any]) -> None:
        """A worker's verdict, applied when it arrives; mitmweb is told the flow changed."""
        waiting = self.awaiting.pop(remote.key, None)
        if waiting is None:
            return
        flow, shown_cut = waiting
        onto_flow = self.analysing.get(flow.id) == remote.key
        if onto_flow:
            del self.analysing[flow.id]
        self._apply(flow, summary, shown_cut, onto_flow)
        if not onto_flow:
            return
        self.changed.append(flow)
        if len(self.changed) == 1:
            loop = running_loop()
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
            log.warning(f"streamtap: {len(flows)} flow(s): cannot show their verdicts: {failure(exc)}")

    def _lost(self, remote: RemoteFlow, why: str) -> None:
        """A flow whose worker died (or never answered): judged unknown, and said so. The recording
        it left (or the one made of it after) and the model it asked for are kept, as for any turn."""
        duration = milliseconds((remote.ended or time.monotonic()) - remote.t0)
        where = f"; its recording {remote.recording} ends where the worker stopped" if remote.recording else ""
        log.warning(f"streamtap: flow {remote.flow_id[:8]}: {why}{where}; traffic passed on untouched")
        summary = flow_summary(
            provider=remote.provider,
            model=remote.model,
            verdict=VerdictKind.UNKNOWN.value,
            reason=f"{why}: not judged",
            events=0,
            bytes=remote.forwarded(),
            duration_ms=duration,
            stream_end=remote.end or StreamEnd.FINISHED.value,
            recording=remote.recording,
            errors=[f"analysis: {why}"],
            injected_fault=remote.fault,
        )
        self._verdict(remote, summary)

    def _tell(self, what: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, what)(*args)
            except Exception as exc:  # an observer's bug never reaches the traffic
                log.warning(f"streamtap: {type(observer).__name__}.{what}: {failure(exc)}")

    def running(self) -> None:
        from mitmproxy import ctx

        if option_checks.names_not_known(ctx.options):
            return  # mitmdump stops at start: no worker to start
        loop = running_loop()
        if _handed_over:
            self._take_over(_handed_over.pop())
            self.pools.want(getattr(ctx.options, "streamtap_workers", 0))
        else:
            self.pools.begin(loop, getattr(ctx.options, "streamtap_workers", 0))
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
            self.pools.expire()
            # taps in the proxy's loop (streamtap_workers=0, or opened before it changed) need FLUSH_EVERY
            wait = EXPIRE_EVERY if self.pools.current is not None and not in_process else FLUSH_EVERY

    def done(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        loop = running_loop()
        if loop is not None and not _exiting():  # a script reload: the next Tap takes over (see _handed_over)
            _handed_over.append(self)
            loop.call_soon(self._stop_unless_taken_over)
            return
        self._stop()

    def _stop_unless_taken_over(self) -> None:
        """The script was removed, not reloaded: no Tap took the flows and workers over."""
        if self in _handed_over:
            _handed_over.remove(self)
            self._stop()

    def _take_over(self, old: Tap) -> None:
        """The flows under way and the workers of the Tap a script reload replaced are this one's:
        their verdicts come here, and the workers stay (the count in the options applies)."""
        self.open, self.awaiting, self.analysing = old.open, old.awaiting, old.analysing
        self.kept, self.streams, self.finished = old.kept, old.streams, old.finished
        self.told_about_loaded_flows = old.told_about_loaded_flows
        self.pools = old.pools
        self.pools.answer_to(verdict=self._verdict, lost=self._lost, into_loop=self._flush_now.set)

    def _stop(self) -> None:
        for tap in self.open.values():
            try:
                if isinstance(tap, FlowTap):
                    tap.abandon()
            except Exception:
                pass
        # the verdicts the workers still had are applied on the way. At mitmproxy's exit (not the
        # script's removal, which must not hold the loop) a worker still starting gets longer.
        self.pools.stop(starting=STOP_WAIT_STARTING if _exiting() else None)
        if self.awaiting:
            log.warning(f"streamtap: {len(self.awaiting)} flow(s) ended as mitmproxy stopped, before their verdicts came "
                        "back; their recordings say how far their analysis got (one whose worker never began it has none)")
            self.awaiting.clear()
            self.analysing.clear()
        self.open.clear()
        self.kept.clear()
        self.streams.clear()


# A script reload (mitmproxy runs the script again when its file changes, as an upgrade of streamtap
# does) replaces the Tap while the flows under way go on. The old Tap leaves itself here and the new
# one takes its flows and workers over: stopping the workers held every stream for seconds (2.5 s
# with 16), and the flows under way lost their verdicts and the rest of their recordings.
_handed_over: list[Tap] = []


def _exiting() -> bool:
    """Is mitmproxy exiting (rather than reloading this script)?"""
    from mitmproxy import ctx

    try:
        return ctx.master.should_exit.is_set()
    except Exception:
        return False


def __getattr__(name: str) -> Any:
    # `mitmdump -s .../streamtap/mitm/tap.py` loads this module as a script, and mitmproxy
    # registers a script's `addons`: hand it the whole addon rather than silently nothing.
    if name == "addons":
        from streamtap.mitm.entry import make_addons

        globals()["addons"] = made = make_addons()
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
