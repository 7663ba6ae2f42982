"""mitmproxy addons: answer flows from recordings (``streamtap_replay``) and inject faults
into live streams (``streamtap_fault``).

Replay runs streamtap's own replay server inside mitmproxy's event loop on a loopback
port and points matching flows at it, so replayed answers stream with their recorded
timing and faults, and pass the Tap like any upstream answer: they are recorded and
judged too (replaying a recording records the same body again).

Live faults wrap the Tap's stream callable (this addon comes after the Tap), so the
Tap records exactly what the client got; a response the Tap does not tap is left alone. A ``clean`` cut ends the response at once and
cancels the upstream's side (see ``_end_at_cut``): HTTP/1.1 clients get the chunked
terminator (a close-delimited body a FIN) on a connection that stays usable, HTTP/2
clients END_STREAM. ``abort`` is, for HTTP/1.1, a FIN of the client connection after an
unterminated body, for HTTP/2 an RST_STREAM (INTERNAL_ERROR) of that stream only;
``reset`` is a TCP RST of the client connection (for HTTP/2: every stream on it). Aborts
come once the bytes before the cut are flushed; ``flow.kill()`` alone is no abort.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import Sequence
from typing import Any

from mitmproxy import ctx, exceptions, http

from streamtap.cli import failure, terminal_safe
from streamtap.mitm import option_checks
from streamtap.providers.detect import wire_from_content_type
from streamtap.recording.content import content_encoded, decoded_body
from streamtap.recording.flows import INJECTED, INJECTED_END, request_info
from streamtap.replay.faults import (
    LIVE_KINDS,
    Fault,
    FaultSpecError,
    LiveFaults,
    Timing,
    check_live_fault,
    parse_faults,
    reads_events,
    unfit_faults,
)
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import FAULT_HEADER, ReplayServer, ServeOptions, as_served, swap_recordings
from streamtap.replay.source import RecordingError, Source

log = logging.getLogger("streamtap")

REPLAYED = "streamtap_replayed"  # flow.metadata key: the recording server answering this flow
RESIZING = ("drop", "duplicate", "error", "cut")  # live faults that may change the body's length


class Replay:
    """``--set streamtap_replay=DIR``: matching requests are answered from recordings."""

    def __init__(self) -> None:
        self.library: Library | None = None
        self.server: ReplayServer | None = None
        self._starting: asyncio.Lock | None = None
        self._stale: list[ReplayServer] = []  # closed before the next one starts; configure may run twice before that
        self._failed: str | None = None  # why the server did not start with the current settings

    def load(self, loader) -> None:
        loader.add_option(
            "streamtap_replay",
            Sequence[str],
            [],
            "Recordings (files or directories of *.jsonl) that answer matching requests instead of the upstream "
            "(match: method, path, query and a hash of the JSON body).",
        )
        loader.add_option(
            "streamtap_replay_unmatched",
            str,
            "404",
            "What happens to a request no recording answers: 404 (a JSON error naming the nearest recordings) or upstream.",
            choices=["404", "upstream"],
        )
        loader.add_option(
            "streamtap_replay_timing", str, "original", "Replay timing: original (recorded gaps), scale=N (gaps times N) or fast."
        )
        loader.add_option(
            "streamtap_replay_ignore", Sequence[str], [], "JSON body fields (dotted paths) left out of request matching."
        )
        loader.add_option("streamtap_replay_once", bool, False, "Serve each recording once (then the next recording of the same request).")
        loader.add_option(
            "streamtap_replay_assign_ids", bool, False, "Add `id: <seq>` lines to replayed SSE streams so clients can resume with Last-Event-ID."
        )
        option_checks.given_before_load(loader)

    def configure(self, updated: set[str]) -> None:
        names = {"streamtap_replay", "streamtap_replay_timing", "streamtap_replay_ignore", "streamtap_replay_once",
                 "streamtap_replay_assign_ids", "streamtap_replay_unmatched", "streamtap_fault", "streamtap_fault_header",
                 "streamtap_redact", "streamtap_redact_allow"}  # fmt: skip
        if not updated & names:
            return
        options = ctx.options
        try:
            Timing.parse(options.streamtap_replay_timing)
        except FaultSpecError as exc:
            raise exceptions.OptionsError(f"streamtap_replay_timing: {exc}") from None
        option_checks.choice("streamtap_replay_unmatched", options.streamtap_replay_unmatched, ("404", "upstream"))
        option_checks.dotted_paths("streamtap_replay_ignore", options.streamtap_replay_ignore)
        if not options.streamtap_replay:
            self.library = None
        elif any(not path.strip() for path in options.streamtap_replay):
            # "" is the current folder to pathlib: every recording below it would answer, and nothing go upstream
            raise exceptions.OptionsError("streamtap_replay: an empty path (an unset shell variable?); "
                                          "name recording files or folders")
        else:
            match = MatchOptions(ignore_fields=tuple(options.streamtap_replay_ignore), once=options.streamtap_replay_once,
                                 # the Tap's options (registered by it: absent where the Tap is not loaded)
                                 redact=tuple(getattr(options, "streamtap_redact", ())),
                                 redact_allow=tuple(getattr(options, "streamtap_redact_allow", ())))
            try:
                self.library = Library.load(options.streamtap_replay, match, warn=_warn)
            except (RecordingError, OSError) as exc:
                raise exceptions.OptionsError(f"streamtap_replay: {exc}") from None
            if not self.library.entries:
                raise exceptions.OptionsError(f"streamtap_replay: no recordings (*.jsonl) in {', '.join(options.streamtap_replay)}")
            try:
                faults = parse_faults(getattr(options, "streamtap_fault", ""))
            except FaultSpecError:
                faults = []  # the Faults addon names the option
            # checked on the bodies as served: id lines count for byte= positions
            assign_ids = options.streamtap_replay_assign_ids
            served = [as_served(entry.source, assign_ids) for entry in self.library.entries]
            unfit = unfit_faults(faults, served, _swap_tails(faults, self.library, assign_ids))
            if unfit:  # else every replayed request would be answered with a 400
                raise exceptions.OptionsError(f"streamtap_fault: {'; '.join(unfit)}")
            log.info(f"streamtap: replaying {len(self.library.entries)} recording(s) from {', '.join(options.streamtap_replay)}")
            if options.connection_strategy == "eager":
                # eager would connect to the upstream before the request says it needs one: replay works offline
                options.update(connection_strategy="lazy")
        if self.server is not None:  # restarted with the new settings on the next request
            self._stale.append(self.server)
        self.server, self._failed = None, None

    async def _ensure_server(self) -> ReplayServer | None:
        """The running server; None when it did not start (``_failed`` says why)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            while self._stale:
                await self._stale.pop().close()
            if self.server is None and self._failed is None:  # not retried per request: the settings have not changed
                options = ctx.options
                try:
                    serve = ServeOptions(
                        timing=Timing.parse(options.streamtap_replay_timing),
                        faults=parse_faults(getattr(options, "streamtap_fault", "")),
                        assign_ids=options.streamtap_replay_assign_ids,
                        fault_header=getattr(options, "streamtap_fault_header", False),
                    )
                    self.server = await ReplayServer(self.library, serve, log=log.info).start("127.0.0.1", 0)
                except Exception as exc:
                    self._failed = f"{type(exc).__name__}: {exc}"
                    log.warning(f"streamtap: replay server did not start: {self._failed}; replayed requests get a 502")
            return self.server

    async def request(self, flow: http.HTTPFlow) -> None:
        flow.metadata.pop(REPLAYED, None)  # a flow sent again (client replay) is matched anew
        library = self.library
        if library is None or flow.response is not None:
            return
        request = flow.request
        if ctx.options.streamtap_replay_unmatched == "upstream":  # else the replay server answers all, 404 or not
            headers = {k.lower(): v for k, v in request.headers.items()}
            body = decoded_body(request.raw_content or b"", headers.get("content-encoding"))  # bounded: on the loop
            resume = bool(headers.get("last-event-id"))  # a resume of an answer served already (--once)
            if not library.has_match(request.method, request.path, headers, request.raw_content if body is None else body,
                                     resume=resume):
                return
        server = await self._ensure_server()
        if server is None:
            # never upstream instead: replay may run offline, or against an upstream that must not be called
            body = {"error": {"type": "streamtap_replay_failed", "message": f"streamtap's replay server did not start: {self._failed}"}}
            flow.response = http.Response.make(502, json.dumps(body), {"content-type": "application/json"})
            flow.metadata[REPLAYED] = "not started"  # streamtap's own answer: no live fault goes into it
            return
        host_header = request.host_header
        request.scheme, request.host, request.port = "http", server.host, server.port
        request.host_header = host_header  # the recording and the app keep seeing the real host
        flow.metadata[REPLAYED] = server.base_url

    def done(self) -> None:
        # not async: mitmproxy calls done synchronously when it reloads or unloads the script
        for server in [self.server, *self._stale]:
            if server is not None:
                server.close_now()
        self.server, self._stale = None, []


def _warn(message: str) -> None:
    log.warning(f"streamtap: {message}")


def _swap_tails(faults: list[Fault], library: Library, assign_ids: bool) -> dict[str, Source]:
    """The recordings swap-tail names, found as the replay server will find them, so that a
    fault that fits none of the replayed recordings is refused at start."""
    try:
        return swap_recordings(faults, library, assign_ids=assign_ids)
    except (FaultSpecError, RecordingError) as exc:
        raise exceptions.OptionsError(f"streamtap_fault: {exc}") from None


# The live faults of the flows under way, by flow id until the flow's end: the faults themselves,
# and the upstream bytes they hold back now. A script reload makes a new Faults addon while those
# flows go on, and their ends reach the new one: it logs what the faults did from these.
_FAULTS_UNDER_WAY: tuple[dict[str, LiveFaults], dict[str, int]] = ({}, {})


class Faults:
    """``--set streamtap_fault=SPEC``: inject a fault into every tapped stream.

    Replayed flows get it from the replay server (all fault kinds, real timing);
    live flows get the kinds that need no recording (cut, corrupt, drop, duplicate,
    reorder, error, fragment). With ``streamtap_fault_header`` a request may carry its
    own fault in ``x-streamtap-fault`` (removed before the request goes upstream).
    """

    def __init__(self) -> None:
        self.faults: list = []
        self.live, self.held = _FAULTS_UNDER_WAY  # one pair for every instance: see there

    def load(self, loader) -> None:
        loader.add_option(
            "streamtap_fault",
            str,
            "",
            "A fault for every tapped stream, e.g. cut:event=37,style=abort or stall:after=10,secs=95 "
            "(several joined with ';'; see `streamtap serve --help`).",
        )
        loader.add_option(
            "streamtap_fault_header", bool, False, f"Honour a per-request fault spec in the {FAULT_HEADER} request header."
        )
        option_checks.given_before_load(loader)

    def configure(self, updated: set[str]) -> None:
        if updated & {"streamtap_fault", "streamtap_replay"}:
            try:
                self.faults = parse_faults(ctx.options.streamtap_fault)
            except FaultSpecError as exc:
                raise exceptions.OptionsError(f"streamtap_fault: {exc}") from None
            replay_only = [f.spec for f in self.faults if f.kind not in LIVE_KINDS]
            if replay_only and not getattr(ctx.options, "streamtap_replay", None):
                raise exceptions.OptionsError(
                    f"streamtap_fault: {', '.join(replay_only)}: works on replays only (set streamtap_replay, or use streamtap serve)"
                )
            if not getattr(ctx.options, "streamtap_replay", None):  # live only: replay takes the middle event itself
                for fault in self.faults:
                    try:
                        check_live_fault(fault)
                    except FaultSpecError as exc:
                        raise exceptions.OptionsError(f"streamtap_fault: {exc}") from None

    def request(self, flow: http.HTTPFlow) -> None:
        # runs after Replay.request: a replayed flow takes the header to the replay server
        spec = flow.request.headers.get(FAULT_HEADER)
        if spec is None or flow.metadata.get(REPLAYED):
            return
        if ctx.options.streamtap_fault_header:  # taken, not passed on; else it is the app's own header
            flow.metadata[FAULT_HEADER] = spec
            del flow.request.headers[FAULT_HEADER]

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        for key in (INJECTED, INJECTED_END, "streamtap_faults"):
            flow.metadata.pop(key, None)  # a flow sent again (client replay) starts without the last run's
        if flow.metadata.get(REPLAYED) or flow.response is None:
            return  # the replay server applied the faults already
        tap = ctx.master.addons.get("tap")
        if flow.id not in getattr(tap, "open", ()):
            return  # not a stream the Tap taps: mitmproxy handles it as it would without streamtap
        if flow.response.raw_content is not None:  # an addon's answer (server replay, map_local): sent whole, never streamed
            if self.faults or flow.metadata.get(FAULT_HEADER):
                log.warning(f"streamtap: flow {flow.id[:12]}: fault not applied: an addon made this response, "
                            "and mitmproxy sends its body whole")
            return
        try:
            # with streamtap_replay, a flow that goes upstream takes the list's live faults only
            faults = [f for f in self.faults if f.kind in LIVE_KINDS] + parse_faults(flow.metadata.get(FAULT_HEADER))
            if not faults:
                return
            live = LiveFaults(faults, *_wire_and_dialect(flow))
        except FaultSpecError as exc:
            log.warning(f"streamtap: flow {flow.id[:12]}: fault not applied: {terminal_safe(str(exc), one_line=True)}")
            return
        specs = "; ".join(f.spec for f in faults)
        encoding = flow.response.headers.get("content-encoding", "")
        if content_encoded(encoding) and reads_events(faults):
            # the bytes on the wire are compressed: a decoder would find no event in them and hold the
            # whole body back until the upstream ends. The flow passes untouched, as with a spec that does not fit.
            log.warning(f"streamtap: flow {flow.id[:12]}: fault not applied: {specs}: the body is {encoding}-encoded; event "
                        "faults need an identity body (their events cannot be read from the compressed bytes as they pass; "
                        "cut:byte= and fragment work on them)")
            return
        if any(f.kind == "fragment" for f in faults):  # it re-chunks every stream, and logs only at the end
            flow.metadata[INJECTED] = specs
        self.live[flow.id] = live
        if any(f.kind in RESIZING for f in faults) and "content-length" in flow.response.headers:
            # the upstream's length would frame a body of another length: a short or over-long body
            # the client takes for a clean end; without it mitmproxy frames the faulted body itself
            del flow.response.headers["content-length"]
        inner = flow.response.stream if callable(flow.response.stream) else (lambda data: data)
        logged = 0
        self.held[flow.id] = 0
        marked_for_held = False

        def forward(pieces: list[bytes]) -> list[bytes]:
            out = []
            for piece in pieces:
                result = inner(piece)
                out += [result] if isinstance(result, bytes) else list(result)
            return [p for p in out if p]  # an empty chunk would end a chunked body early

        def mark_while_held() -> None:
            # the Tap reads the mark on an upstream error before our error hook runs: an answer that
            # would lose the held bytes there is streamtap's, not the upstream's, from now on
            nonlocal marked_for_held
            if live.end is None and self.held.get(flow.id, 0) > 0:
                if not flow.metadata.get(INJECTED):
                    flow.metadata[INJECTED], marked_for_held = specs, True
            elif marked_for_held:
                marked_for_held = False
                if not _changed_answer(live):
                    flow.metadata.pop(INJECTED, None)

        def passed(fed: bytes, pieces: list[bytes]) -> list[bytes]:
            if flow.id in self.held:
                self.held[flow.id] += len(fed) - sum(len(p) for p in pieces)
            mark_while_held()
            return pieces

        def stream(data: bytes) -> list[bytes]:
            nonlocal logged
            if data == b"":  # end of the upstream body
                out = forward(passed(b"", live.close() if live.end is None else []) + [b""])
                logged = _report(flow, live, logged, specs)
                return out
            ended_before = live.end is not None
            out = forward(passed(data, live.feed(data)))
            logged = _report(flow, live, logged, specs)
            if live.end is not None and not ended_before:
                flow.metadata[INJECTED_END] = live.end  # the Tap's stream_end: streamtap, not the client, cut it
                _end_at_cut(flow, live.end, out)
            return out

        flow.response.stream = stream

    def response(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        live, held = self.live.get(flow.id), self.held.get(flow.id, 0)
        if live is not None and live.end is None and held > 0:
            # mitmproxy calls no stream callable after an error: what the faults held back is lost
            reason = flow.error.msg if flow.error else "error"
            log.warning(f"streamtap: flow {flow.id[:12]}: the flow ended with an error ({reason}) while live faults held back "
                        f"{held} bytes of the upstream's body: the client never got them (recorded as injected)")
        self._ended(flow)

    def _ended(self, flow: http.HTTPFlow) -> None:
        self.held.pop(flow.id, None)
        live = self.live.pop(flow.id, None)
        if live is not None:
            logged = len(live.log)
            live.ended()
            _report(flow, live, logged, "; ".join(f.spec for f in live.faults))


def _report(flow: http.HTTPFlow, live: LiveFaults, logged: int, specs: str) -> int:
    """Log the fault lines after the first ``logged``; the flow is marked once a fault changed the answer."""
    new = live.log[logged:]
    for line in new:
        log.info(f"streamtap: flow {flow.id[:12]}: fault {line}")
    if new:
        flow.metadata["streamtap_faults"] = list(live.log)  # evidence: what was done to this flow, where
        if any(not line.startswith("not applied") for line in new):
            flow.metadata[INJECTED] = specs  # the Tap names it in the recording and the verdict
    return len(live.log)


def _changed_answer(live: LiveFaults) -> bool:
    return any(f.kind == "fragment" for f in live.faults) or any(not line.startswith("not applied") for line in live.log)


def _wire_and_dialect(flow: http.HTTPFlow) -> tuple[str, str]:
    """The wire format and dialect, as the Tap would detect them (the error shapes depend on both)."""
    try:
        from streamtap.providers import detect_dialect

        detection = detect_dialect(request_info(flow), flow.response.headers.get("content-type") if flow.response else None)
        return detection.wire or _wire_of(flow), str(detection.dialect)
    except Exception:  # fail open: framing from the content type alone
        return _wire_of(flow), "unknown"


def _wire_of(flow: http.HTTPFlow) -> str:
    return wire_from_content_type(flow.response.headers.get("content-type") if flow.response else None) or "sse"


def _end_early(flow: http.HTTPFlow, style: str) -> None:
    """Abort the response now: close the client connection once the bytes before the cut left.

    (An empty chunk returned from the stream callable becomes the HTTP/1.1 chunked
    terminator, which is why ``flow.kill()`` plus an empty return looked like a clean end
    when measured.)"""
    writer = _client_writer(flow)
    if writer is None:
        log.warning(f"streamtap: flow {flow.id[:12]}: cannot reach the client connection; the {style} cut ends cleanly")
        flow.kill()
        return

    async def close_after_flush() -> None:
        await asyncio.sleep(0)  # let mitmproxy hand the last bytes to the transport
        try:
            await writer.drain()
            if style == "reset":
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()  # FIN after an unterminated body
        except Exception:
            pass
        flow.kill()

    _run_soon(close_after_flush())


# --- ending the client's message at the cut ---------------------------------------------
#
# A stream callable returns bytes only, and an empty DATA frame does not end an HTTP/2
# stream, so the end must come from mitmproxy's HTTP layer. The flow's HttpStream is handed
# the event it would get from an upstream that ends right there: ResponseEndOfMessage
# (clean: the response hook, then END_STREAM, or for HTTP/1.1 the chunked terminator or, for
# a close-delimited body, a FIN) or ResponseProtocolError (HTTP/2 abort: the error hook,
# then RST_STREAM INTERNAL_ERROR, as for an upstream reset). Events travel only down the
# layer stack, so this one rides on a Wakeup, which every layer passes down and the HTTP
# layer routes by its command (as for its own HTTP/2 keep-alive pings), to a stand-in
# (_StreamEnder). The stand-in also takes the stream's place in the HTTP layer until the
# stream is dropped, and cancels the upstream's side (RST_STREAM CANCEL to an HTTP/2
# upstream, the connection closed for HTTP/1): whatever the upstream still sends for the
# flow is dropped, so a kept-alive HTTP/1.1 client gets no second terminator and no late
# error. These are mitmproxy 12.3 internals: when they are not found, the cut falls back to
# the older way (HTTP/1.1: an empty chunk; HTTP/2 abort: the connection is closed) and says so.

ENDS = {
    ("h2", "clean"): "END_STREAM",
    ("h2", "abort"): "RST_STREAM INTERNAL_ERROR",  # "reset" stays a TCP RST (every stream)
    ("http/1.1", "clean"): "end of body",
}


def _end_at_cut(flow: http.HTTPFlow, style: str, out: list[bytes]) -> None:
    """End the client's response now that the bytes in ``out`` are the last ones."""
    alpn = flow.client_conn.alpn or b"http/1.1"
    protocol = "http/1.1" if alpn.startswith(b"http/1") else alpn.decode("ascii", "replace")
    if protocol == "http/1.1" and style == "clean" and "chunked" not in flow.response.headers.get("transfer-encoding", "").lower():
        if "content-length" in flow.response.headers:
            log.warning(f"streamtap: flow {flow.id[:12]}: a content-length body cannot end early cleanly; the client connection is closed (FIN)")
            _end_early(flow, "abort")
            return
    if (protocol, style) in ENDS:
        if _end_stream(flow, style, protocol):
            return
        if style == "abort":
            log.warning(f"streamtap: flow {flow.id[:12]}: the abort closes the whole client connection instead")
    if style == "clean":
        if protocol == "http/1.1":
            out.append(b"")  # the HTTP/1.1 chunked terminator (and another when the upstream ends)
        else:
            log.warning(f"streamtap: flow {flow.id[:12]}: the {protocol} stream ends when the upstream's does")
    else:
        _end_early(flow, style)


def _end_stream(flow: http.HTTPFlow, style: str, protocol: str) -> bool:
    """Have mitmproxy end the flow's response to the client (see above); False if it cannot."""
    try:
        from mitmproxy.proxy import commands, events

        handler = ctx.master.addons.get("proxyserver").connections[flow.client_conn.id]
        *tunnels, (layer, stream) = http_streams(flow)
        wakeup = commands.RequestWakeup(0)
        ender = _StreamEnder(layer, stream, style, ENDS[protocol, style], wakeup)
        for outer, tunnel in tunnels:  # as an HTTP proxy: down each CONNECT stream to the layer inside
            outer.command_sources[wakeup] = tunnel
        layer.command_sources[wakeup] = ender
        # in the stream's place at once, not at the wakeup: the upstream's end, parsed from the
        # same read as the cut's bytes, would otherwise reach the client first as a clean end
        layer.streams[stream.stream_id] = ender
        ender.drop_queued()
    except Exception as exc:
        log.warning(f"streamtap: flow {flow.id[:12]}: cannot end the response at the cut ({failure(exc)})")
        return False
    _run_soon(handler.server_event(events.Wakeup(wakeup)))
    return True


_PENDING: set[asyncio.Task] = set()


def _run_soon(coroutine: Any) -> None:
    task = asyncio.get_running_loop().create_task(coroutine)
    _PENDING.add(task)  # the loop keeps only a weak reference: an unreferenced task may vanish mid-way
    task.add_done_callback(_PENDING.discard)


def http_streams(flow: http.HTTPFlow) -> list[tuple[Any, Any]]:
    """The HTTP layers and streams from a live flow's client connection down to the one that
    carries it, last; as an HTTP proxy, each before it is a CONNECT stream whose tunnel holds
    the next HTTP layer."""
    top = ctx.master.addons.get("proxyserver").connections[flow.client_conn.id].layer

    def within(layer: Any, depth: int) -> list[tuple[Any, Any]] | None:
        streams = list(layer.streams.values())
        for stream in streams:
            if getattr(stream, "flow", None) is flow:
                return [(layer, stream)]
        if depth < 8:  # each CONNECT tunnel holds one more HTTP layer; they rarely nest
            for stream in streams:
                child = getattr(stream, "child_layer", None)
                try:
                    inner = within(_http_layer(child), depth + 1) if child is not None else None
                except LookupError:  # a tunnel to something other than HTTP
                    continue
                if inner is not None:
                    return [(layer, stream), *inner]
        return None

    found = within(_http_layer(top), 0)
    if found is None:
        raise LookupError("no HTTP stream for the flow")
    return found


def _http_layer(top: Any) -> Any:
    from mitmproxy.proxy.layer import NextLayer
    from mitmproxy.proxy.layers.http import HttpLayer

    layer = top
    for _ in range(32):
        if isinstance(layer, HttpLayer):
            return layer
        if isinstance(layer, NextLayer):
            nxt = layer.layer
        else:
            # a layer that hands its events on keeps its child here, or is its child's handle_event
            nxt = getattr(layer, "child_layer", None) or getattr(getattr(layer, "_handle_event", None), "__self__", None)
        if nxt is None or nxt is layer:
            break
        layer = nxt
    raise LookupError("no HTTP layer on the client connection")


class _StreamEnder:
    """Stands in for one HttpStream in the HTTP layer's routing. On its wakeup it ends the
    stream and takes the stream's place in the layer, so that what the upstream still sends
    for it (bytes in flight, its close, its end) is dropped instead of reaching a stream that
    already ended (mitmproxy would crash on it, or pass a late error on to the client's next
    request). Every other event (the hook replies, the client's own events) goes on to it."""

    def __init__(self, layer: Any, stream: Any, style: str, how: str, wakeup: Any) -> None:
        self.layer, self.stream, self.style, self.how, self.wakeup = layer, stream, style, how, wakeup
        self.flow = stream.flow

    def handle_event(self, event: Any):
        if getattr(event, "command", None) is self.wakeup:
            yield from self._end()
        elif not _from_upstream(event):
            yield from self.stream.handle_event(event)

    def drop_queued(self) -> None:
        """What the upstream sent that the stream holds, unhandled, while a hook runs (a fast upstream's
        whole body arrives with its headers): handled after the cut, its end would reach the client."""
        queued = getattr(self.stream, "_paused_event_queue", None)
        if queued:
            kept = [event for event in queued if not _from_upstream(event)]
            queued.clear()
            queued.extend(kept)

    def _end(self):
        from mitmproxy.proxy.layers.http import (
            ErrorCode,
            RequestProtocolError,
            ResponseEndOfMessage,
            ResponseProtocolError,
            SendHttp,
        )

        stream, flow = self.stream, self.flow
        ending = flow.response is None or flow.response.timestamp_end is not None  # set before the response hook
        if self.layer.streams.get(stream.stream_id) is not self:
            return  # the stream was dropped meanwhile (the client went away)
        if ending or getattr(stream, "_paused", None) or stream.server_state != stream.state_stream_response_body:
            # the stream ended or errored before the cut took its place (an end event now would
            # reach a stream that is done): it goes on as it was
            self.layer.streams[stream.stream_id] = stream
            return
        if stream.context.server in self.layer.connections:
            yield SendHttp(RequestProtocolError(stream.stream_id, "streamtap fault: cut", ErrorCode.CANCEL), stream.context.server)
        where = f"HTTP/2 stream {stream.stream_id}" if flow.client_conn.alpn == b"h2" else "HTTP/1.1 response"
        log.info(f"streamtap: flow {flow.id[:12]}: {where}: {self.style} cut, {self.how} to the client, upstream cancelled")
        if self.style == "clean":
            yield from stream.handle_event(ResponseEndOfMessage(stream.stream_id))
        else:
            message = f"streamtap fault: {self.style} cut, stream reset ({self.how})"
            yield from stream.handle_event(ResponseProtocolError(stream.stream_id, message, ErrorCode.GENERIC_SERVER_ERROR))


def _from_upstream(event: Any) -> bool:
    from mitmproxy.proxy.layers.http import ResponseData, ResponseEndOfMessage, ResponseProtocolError, ResponseTrailers

    return isinstance(event, (ResponseData, ResponseTrailers, ResponseEndOfMessage, ResponseProtocolError))


def _client_writer(flow: http.HTTPFlow) -> Any:
    try:
        handler = ctx.master.addons.get("proxyserver").connections[flow.client_conn.id]
        writer = handler.transports[handler.client].writer
        return writer if isinstance(writer, asyncio.StreamWriter) else None
    except (AttributeError, KeyError):
        return None


ADDONS = [Replay, Faults]
