"""The replay server: HTTP/1.1 on raw asyncio streams, answering requests from recordings.

Requests are parsed by h11 (``_RequestReader``) within ``Limits``: headers must arrive
within a time limit, a body larger than the limit gets a 413 before any of it is read,
anything h11 refuses a 400 (or 431), and the connection closes after each of these.
Responses are written by hand, because the point is byte-level control: each planned
write becomes one HTTP chunk at its time, a clean end is the ``0`` chunk, an abort is an
unterminated chunked body followed by FIN, a reset is SO_LINGER 0 then close (RST).
Everything else about the response (which bytes, when) comes from ``faults.plan``.
"""

from __future__ import annotations

import array
import asyncio
import errno
import fcntl
import json
import os
import re
import resource
import socket
import stat
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote

import h11

from streamtap.recording.content import MAX_DECODED_BODY, content_encoded, decoded_body

from .faults import Fault, FaultSpecError, Plan, Timing, parse_faults, plan, unfit_faults, with_swapped_tails
from .match import Library, error_body, shown_text
from .source import Source, load_source

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "content-length", "content-encoding",
    }
)  # fmt: skip
FAULT_HEADER = "x-streamtap-fault"
MAX_HEADER_BYTES = 64 * 1024
READ_SIZE = 64 * 1024
# A wait longer than this (a stall, a long recorded gap) counts from when the client has taken the
# bytes before it, and watches for the client hanging up, so a client that left does not hold its
# connection until the wait is over; shorter ones just sleep, to a schedule fixed at the start.
WATCH_LONGER_THAN = 0.05
SERVED_KEPT = 1000  # answered requests kept for logs and tests: a server inside mitmproxy runs for days
# Plans kept for repeated requests: at most this many, and at most this much memory (a write
# costs about its bytes and 100 more): one fragment:max=1 plan of a 4 MB stream is ~300 MB.
PLANS_KEPT = 64
PLANS_KEPT_BYTES = 128 * 1024 * 1024
PLAN_WRITE_OVERHEAD = 100
# Plans made at once (each a thread, and up to ~100 MB while made); others wait their turn
PLANS_AT_ONCE = 4
# Requests matched at once, each in a thread: hashing a large body against thousands of
# recordings, or finding a Last-Event-ID in a long one, takes long enough to delay the other
# clients' writes (their timing) if done on the loop
MATCHES_AT_ONCE = 4
# Writes sent back to back before the stream lets the other clients in: drain() does not yield
# while a client that keeps up keeps the buffer low, so a fragment:max=1 stream would hold the loop.
WRITES_BETWEEN_YIELDS = 64
# A reset, and a long wait, wait for the client to take the bytes before them, as long as it keeps
# taking them: one that takes nothing for this many seconds is waited for no more
TAKING_PATIENCE = 3.0
TAKING_POLL = 0.002
# A client that took the bytes within this of the wait's start kept up: the schedule stays. Seeing
# that takes a poll or two after every write, and moving the schedule by them piled ~2 ms a gap
# over a stream of long gaps (100 gaps of 51 ms came 200 ms late).
KEPT_UP_WITHIN = 0.01
_OUTQ = getattr(termios, "TIOCOUTQ", None) if sys.platform == "linux" else None  # SIOCOUTQ on a socket
OUT_OF_FDS_SAID_EVERY = 10.0  # seconds between two reports of accept() failing for want of fds
BUSY_SAID_EVERY = 10.0  # seconds between two reports of connections refused for being over Limits.connections
# A connection refused for being over the cap gets its 503 and then this long to send what it was
# sending: closing with its request unread would reset the connection, and the client would see
# a reset, not the 503 that tells it to come back
REFUSED_LINGER = 1.0
REFUSED_LINGERING = 64  # connections lingering so at once; one more is closed at once, without its 503
FDS_KEPT_BACK = 64  # file descriptors the connection cap leaves for the server's own (recordings, pipes, threads)
ACCEPT_RETRIES_PENDING = 2.0  # asyncio retries a failed accept() after 1 s (ACCEPT_RETRY_DELAY)


class _SaidEvery:
    """A report said in one line at most once every ``seconds``; the next line counts the times it
    was not said (a flood of clients, or of failed accepts, must not flood the log)."""

    def __init__(self, seconds: float, log: Callable[[str], None]) -> None:
        self.seconds, self.log = seconds, log
        self.said = -seconds
        self.unsaid = 0

    def __call__(self, message: Callable[[], str]) -> None:
        now = time.monotonic()
        if now - self.said < self.seconds:
            self.unsaid += 1
            return
        also = f"; {self.unsaid} more times since last said" if self.unsaid else ""
        self.said, self.unsaid = now, 0
        self.log(message() + also)


@dataclass(slots=True)
class ServeOptions:
    timing: Timing = field(default_factory=Timing)
    faults: list[Fault] = field(default_factory=list)
    assign_ids: bool = False  # add `id: <seq>` lines to SSE streams so any client can resume
    fault_header: bool = False  # honour x-streamtap-fault request headers (opt-in)
    fault_on_resume: bool = False  # apply the faults to Last-Event-ID resumes too


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server accepts from a client (the README's Security section lists them)."""

    header_bytes: int = MAX_HEADER_BYTES  # request line and headers; more: 431
    body_bytes: int = 32 * 1024 * 1024  # a request body; more: 413, before any of it is read
    header_timeout: float = 10.0  # seconds from a request's first byte to the end of its headers; then 408
    body_timeout: float = 10.0  # seconds the body may pause between two reads; then 408
    idle_timeout: float = 120.0  # seconds a kept-alive connection may wait for its next request
    # seconds a new connection may wait before its first byte (at most idle_timeout): connections
    # opened and left silent hold the server's file descriptors for this long, not for idle_timeout
    first_byte_timeout: float = 10.0
    # connections served at once; one more closes the kept-alive one idle longest, or with none
    # idle gets a 503 with Retry-After (SDKs retry it), rather than the server running out of file
    # descriptors, where it can answer no one. None: what the fd limit leaves room for (connections_room)
    connections: int | None = None


@dataclass(slots=True)
class Served:
    """One answered request, for logs and tests."""

    method: str
    target: str
    status: int
    recording: str | None
    log: list[str]
    end: str | None = None
    resumed_after: str | None = None
    refused: str | None = None  # why it got a 400 (a fault that does not fit, a bad fault header) or a 404


def swap_recordings(faults: list[Fault], library: Library, loaded: dict[str, Source] | None = None, *,
                    assign_ids: bool = False) -> dict[str, Source]:
    """The recordings the swap-tail faults name, by those names, not in ``loaded`` yet: each
    found as given, else beside the served recordings, and as a server that ``assign_ids`` serves
    it (``as_served``: a swapped-in tail carries ids as the rest of the stream does).
    FaultSpecError names one not found."""
    found: dict[str, Source] = {}
    for fault in faults:
        name = fault.params.get("with") if fault.kind == "swap-tail" else None
        if name is None or name in found or name in (loaded or {}):
            continue
        candidates = [Path(os.path.expanduser(name))] + [Path(e.source.path).parent / name for e in library.entries]
        troubles = [(c, _not_a_file(c)) for c in candidates]
        path = next((c for c, trouble in troubles if trouble == ""), None)
        if path is None:
            # what is there instead, if anything: "no recording" would send the user looking for a file that is there
            there = next((f"{c}: {trouble}" for c, trouble in troubles if trouble), None)
            raise FaultSpecError(f"{fault.spec!r}: {there or f'no recording {name!r}'} (looked beside the served recordings too)")
        found[name] = as_served(load_source(path), assign_ids)
    return found


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a file to read a recording from: "" when it is one, None when nothing is there."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # there, but not to be looked at
        return exc.strerror or str(exc)
    if stat.S_ISREG(mode):
        return ""
    what = ("a folder" if stat.S_ISDIR(mode) else "a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")
    return f"{what}, not a recording file"


class ReplayServer:
    def __init__(
        self,
        library: Library,
        options: ServeOptions | None = None,
        *,
        log: Callable[[str], None] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.library = library
        self.options = options or ServeOptions()
        self.limits = limits or Limits()
        self.connections = self.limits.connections or connections_room()
        self.log = log if log is not None else _stderr
        self.served: deque[Served] = deque(maxlen=SERVED_KEPT)
        self._server: asyncio.base_events.Server | None = None
        self._others: dict[str, Source] = {}  # swap-tail names -> recordings
        self._given: dict[str, Source] | None = None  # names a fault header may use for swap-tail
        self._as_served: dict[int, Source] = {}  # id(recording) -> its body as served
        self._plans: dict[tuple, tuple[Plan, int]] = {}  # -> (plan, its size estimate in bytes)
        self._plans_bytes = 0
        self._planning = asyncio.Semaphore(PLANS_AT_ONCE)
        self._matching = asyncio.Semaphore(MATCHES_AT_ONCE)
        self._restore_exception_handler: Callable[[], None] | None = None
        # the connection handlers: a stream still waiting (original timing, a stall) when the server
        # closes must end with it, not be left pending for a later garbage collection to complain of
        self._handlers: set[asyncio.Task] = set()
        self._refusing: set[asyncio.Task] = set()  # connections over the cap, told 503, lingering
        self._connections: dict[asyncio.StreamWriter, _RequestReader] = {}  # each connection served, and its requests
        self._say_busy = _SaidEvery(BUSY_SAID_EVERY, self.log)
        self.host, self.port = "127.0.0.1", 0

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ReplayServer:
        self._load_others(self.options.faults)
        served = [self.served_source(entry.source) for entry in self.library.entries]
        unfit = unfit_faults(self.options.faults, served, self._others)
        if unfit:  # refused now (swap-tail, and the faults together, checked here), not with a 400 per request
            raise FaultSpecError("; ".join(unfit))
        self._server = await asyncio.start_server(self._accepted, host, port, backlog=1024)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        listening = {sock.fileno() for sock in self._server.sockets}
        self._restore_exception_handler = _report_accept_failures(asyncio.get_running_loop(), listening, self.log)
        return self

    async def close(self) -> None:
        if self._server is not None:
            server = self._server
            handlers = [*self._handlers, *self._refusing]
            self.close_now()
            await server.wait_closed()
            await asyncio.gather(*handlers, return_exceptions=True)

    def close_now(self) -> None:
        """Stop listening and drop every connection, without waiting for them to be gone."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.transport.abort()
            for handler in [*self._handlers, *self._refusing]:
                handler.cancel()
            self._server = None
        if self._restore_exception_handler is not None:
            self._restore_exception_handler()
            self._restore_exception_handler = None

    @property
    def swap_recordings(self) -> dict[str, Source]:
        """The recordings the swap-tail faults name, by those names, as loaded at start: what a
        plan of this server's faults needs (``plan(..., others=)``)."""
        return dict(self._others)

    def served_source(self, source: Source) -> Source:
        """``source`` as this server sends it (``as_served``), made once per recording: what its
        faults are planned, and checked, on."""
        served = self._as_served.get(id(source))
        if served is None:
            served = self._as_served[id(source)] = as_served(source, self.options.assign_ids)
        return served

    def _load_others(self, faults: list[Fault]) -> None:
        self._others.update(swap_recordings(faults, self.library, self._others, assign_ids=self.options.assign_ids))

    def _given_recordings(self) -> dict[str, Source]:
        """What a fault header may name for swap-tail: only recordings this server was given
        (served ones by path as loaded, absolute path or file name; the swap-tail recordings of
        the faults it was started with, by their names). A header never opens a file: a name
        outside this table reads as unknown whatever is, or is not, at that path."""
        if self._given is None:
            given: dict[str, Source] = {}
            for entry in self.library.entries:
                path = Path(entry.source.path)
                for name in (str(path), str(path.absolute()), path.name):
                    given.setdefault(name, self.served_source(entry.source))
            given.update(self._others)
            self._given = given
        return self._given

    def _header_others(self, faults: list[Fault]) -> None:
        given = self._given_recordings()
        for fault in faults:
            if fault.kind != "swap-tail":
                continue
            name = fault.params["with"]
            if name not in given:
                raise FaultSpecError(
                    f"{fault.spec!r}: with= names no recording this server serves "
                    "(a fault header may name only the served recordings, by path or file name)"
                )
            self._others.setdefault(name, given[name])

    # --- HTTP ------------------------------------------------------------------------------

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection's handler, a task of the server's own from the start: the server's stop
        cancels it even before it ran (Ctrl-C as a client connects), and such a task is not
        handed to Python 3.12.1's stream callback, which reports it with a traceback."""
        loop = asyncio.get_running_loop()
        over_cap = len(self._handlers) >= self.connections and not self._close_longest_idle()
        if over_cap and len(self._refusing) >= REFUSED_LINGERING:  # a flood: its fds go back now
            self._say_busy(self._busy_line)
            writer.transport.abort()
            return
        handlers = self._refusing if over_cap else self._handlers
        handler = loop.create_task(self._refuse_busy(reader, writer) if over_cap else self._connection(reader, writer))
        handlers.add(handler)

        def ended(task: asyncio.Task) -> None:
            handlers.discard(task)
            if task.cancelled():
                writer.transport.abort()  # (a handler that ran closed it already)
            elif task.exception() is not None:
                loop.call_exception_handler({"message": "streamtap replay: a connection's handler failed",
                                             "exception": task.exception(), "transport": writer.transport})
                writer.transport.abort()

        handler.add_done_callback(ended)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests = self._connections[writer] = _RequestReader(reader, writer, self.limits)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.transport.set_write_buffer_limits(high=1024 * 1024)  # fewer drain round trips in fast mode
        try:
            while True:
                request = await requests.next()
                if request is None:
                    break
                keep_open = await self._answer(request, writer, requests)
                if not keep_open:
                    return
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # the server stops (Ctrl-C, asyncio.run's end): ended quietly, or Python 3.12.1's
            # stream callback reports the cancelled task as an error with a traceback
            return
        except _Refused as exc:
            body = error_body(exc.kind, exc.message)
            try:
                await _send_json(writer, exc.status, body, close=True)
            except ConnectionError:
                pass
        finally:
            self._connections.pop(writer, None)
            if not writer.transport.is_closing():
                writer.close()

    def _close_longest_idle(self) -> bool:
        """Make room for a new connection: close the kept-alive one that has waited longest for its
        next request, if any does (a client's pool opens another when it needs one). Its handler
        ends at the close; the new connection is served meanwhile."""
        idle = [requests for requests in self._connections.values() if requests.idle_since is not None]
        if not idle:
            return False
        longest = min(idle, key=lambda requests: requests.idle_since)
        longest.idle_since = None
        longest.writer.close()
        return True

    def _busy_line(self) -> str:
        # inside mitmproxy the cap is always the fd limit's: --max-connections is serve's
        why = "--max-connections" if self.limits.connections else "what `ulimit -n` leaves room for"
        return (f"streamtap replay: serving its limit of {self.connections} connections at once "
                f"({why}): new ones get a 503 with Retry-After until some close")

    async def _refuse_busy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection over ``Limits.connections``: a 503 before its request is read, then a short
        wait for the client to finish sending (closing with its request unread would reset the
        connection, and the client would see the reset, not the 503)."""
        self._say_busy(self._busy_line)
        message = f"this replay server already serves its limit of {self.connections} connections at once; try again"
        body = json.dumps(error_body("overloaded_error", message), indent=1).encode()
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\nretry-after: 1\r\n\r\n%s" % (len(body), body))
        try:
            await writer.drain()
            writer.write_eof()
            deadline = time.monotonic() + REFUSED_LINGER
            while (left := deadline - time.monotonic()) > 0 and await asyncio.wait_for(reader.read(READ_SIZE), left):
                pass
        except OSError:  # the client left (a reset, or gone before the shutdown: ENOTCONN), or the wait ended
            pass
        finally:
            writer.close()

    async def _answer(self, request: _Request, writer: asyncio.StreamWriter, requests: _RequestReader) -> bool:
        lib = self.library
        # an empty Last-Event-ID names no event: the client has no id to resume from (WHATWG clients
        # do not send one then), so the answer is the whole stream
        resume_id = request.headers.get("last-event-id") or None
        # matched, not yet used up (--once): a request refused below (a bad fault header, an unknown
        # Last-Event-ID) leaves the recording for the corrected retry. Planning awaits (in a thread)
        # before the consume below: if another request took the recording meanwhile, this one
        # looks again (the consume fails only under --once, where each retry has one fewer to take).
        as_read, undecoded = request.body, None
        encoding = request.headers.get("content-encoding")
        if content_encoded(encoding):  # (decoding may take a while: off the loop)
            as_read, undecoded = await self._off_loop(_body_as_read, request.body, encoding)
        found = await self._off_loop(partial(lib.find, resume=resume_id is not None),
                                     request.method, request.target, request.headers, as_read)
        if found is None:
            body = await self._off_loop(partial(lib.explain, note=undecoded),
                                        request.method, request.target, request.headers, as_read)
            self._record(Served(request.method, request.target, 404, None, [], refused=body["message"]))
            await _send_json(writer, 404, body, close=not request.keep_alive, head_only=request.method == "HEAD")
            return request.keep_alive
        from_header: list[Fault] = []
        if self.options.fault_header and FAULT_HEADER in request.headers:
            try:
                from_header = parse_faults(request.headers[FAULT_HEADER])
                self._header_others(from_header)
            except (FaultSpecError, ValueError) as exc:
                return await self._refuse_fault(request, writer, found.source, exc)
        faults = self.options.faults + from_header
        source = self.served_source(found.source)
        start_after = None
        if resume_id is not None:
            if not self.options.fault_on_resume:
                # the server's own faults spare a resume, so a client can recover after a cut;
                # a fault the resume itself asks for is the one its test wants to see
                faults = from_header
            try:
                # the id names an event of the stream as this resume plans it: one a swap-tail
                # swapped in is one the client was served
                start_after = await self._off_loop(_resume_position_as_planned, source, faults, dict(self._others), resume_id)
            except FaultSpecError as exc:
                return await self._refuse_fault(request, writer, source, exc)
            if start_after is None:
                if source.wire == "sse":
                    message = f"Last-Event-ID {resume_id!r} names no event of {source.path}"
                else:
                    message = (f"Last-Event-ID {resume_id!r}: {source.path} is not SSE but {source.wire}, "
                               "a format that carries no event ids to resume from")
                self._record(Served(request.method, request.target, 404, source.path, [], refused=message))
                error = error_body("streamtap_unknown_event_id", message)
                await _send_json(writer, 404, error, close=not request.keep_alive, head_only=request.method == "HEAD")
                return request.keep_alive
        try:
            the_plan = await self._plan(source, faults, start_after)
        except FaultSpecError as exc:
            return await self._refuse_fault(request, writer, source, exc)
        if not lib.consume(found):  # served now: under --once the recording is used up
            return await self._answer(request, writer, requests)
        served = Served(request.method, request.target, source.status, source.path, list(the_plan.log), None, resume_id)
        self._record(served)
        await self._stream(source, the_plan, writer, request, requests)
        served.end = the_plan.end.style
        return the_plan.end.style == "clean" and request.keep_alive

    async def _off_loop(self, work: Callable[..., Any], *args: Any) -> Any:
        return await _in_daemon_thread(self._matching, "streamtap-match", work, *args)

    async def _refuse_fault(self, request: _Request, writer: asyncio.StreamWriter, source: Source, problem: Exception) -> bool:
        """A 400 for a fault that cannot be served with this recording, logged as any answer is:
        a start-up fault that fits only some recordings must not fail requests unseen."""
        self._record(Served(request.method, request.target, 400, source.path, [], refused=str(problem)))
        error = error_body("streamtap_bad_fault", str(problem))
        await _send_json(writer, 400, error, close=not request.keep_alive, head_only=request.method == "HEAD")
        return request.keep_alive

    async def _plan(self, source: Source, faults: list[Fault], start_after: int | None) -> Plan:
        """Plans are deterministic: a repeated request reuses its plan (a cache bounded in count
        and in size). A new plan is made in a worker thread: a fault header may ask for millions
        of writes, seconds of work during which the other clients are served."""
        key = (id(source), tuple(f.spec for f in faults), start_after)
        cached = self._plans.get(key)
        if cached is not None:
            return cached[0]
        others = dict(self._others)  # (a copy: a fault header may add to it while the thread reads)
        made, size = await _in_daemon_thread(self._planning, "streamtap-plan", _plan_and_size, source, faults,
                                             self.options.timing, others, start_after)
        if size <= PLANS_KEPT_BYTES and key not in self._plans:
            while self._plans and (len(self._plans) >= PLANS_KEPT or self._plans_bytes + size > PLANS_KEPT_BYTES):
                self._plans_bytes -= self._plans.pop(next(iter(self._plans)))[1]
            self._plans[key] = (made, size)
            self._plans_bytes += size
        return made

    def _record(self, served: Served) -> None:
        self.served.append(served)
        where = served.recording or "no recording"
        if served.refused:
            where += f": {served.refused}"
        # the log keeps no credential of the request (a ?key= in the target), and no control
        # character a client sent (an ESC would act on the terminal, a newline forge a line)
        target = self.library.redactor.url(served.target)
        self.log(shown_text(f"streamtap replay: {served.method} {target} -> {served.status} ({where})"))
        for line in served.log:
            self.log(shown_text(f"streamtap replay:   fault {line}"))

    async def _stream(
        self, source: Source, the_plan: Plan, writer: asyncio.StreamWriter, request: _Request, requests: _RequestReader
    ) -> None:
        head = [f"HTTP/1.1 {source.status} {_reason(source.status)}"]
        head += [f"{k}: {v}" for k, v in source.headers if k.lower() not in HOP_BY_HOP]
        if request.chunked:
            head += ["transfer-encoding: chunked", "connection: keep-alive" if request.keep_alive else "connection: close"]
        else:  # the close ends the body: clean and abort look alike to such a client
            head += ["connection: close"]
        # e.g. the faults it carries, for whatever records it; percent-encoded, so that any text in
        # a spec (a message in another script, a line break) arrives whole and inside its header
        head += [f"{k}: {quote(v, safe=_HEADER_TEXT)}" for k, v in the_plan.headers]
        text = "\r\n".join(head) + "\r\n\r\n"
        try:  # the bytes recorded: mitmproxy reads a header as UTF-8, a byte that is not UTF-8 as a lone surrogate
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte gives (a Source made in code) is written as "?", not a failure
            data = text.encode("utf-8", "replace")
        writer.write(data)
        await writer.drain()
        if request.method == "HEAD":  # a HEAD response is its head alone
            return
        loop = asyncio.get_running_loop()

        async def wait_until(deadline: float) -> None:
            remaining = deadline - loop.time()
            if remaining > WATCH_LONGER_THAN and await requests.hung_up_within(remaining - 0.002):
                raise ConnectionResetError("the client closed the connection")
            await _sleep_until(loop, deadline)

        start = loop.time()
        written_at = 0.0  # the plan's time of the last bytes written

        async def wait_for(at: float) -> None:
            """Wait until the plan's time ``at``. A long wait (a stall, a long recorded gap) is a
            silence the client must get whole: it counts from when the client has taken the bytes
            before it, not from when they were written, as a slow reader would still be reading
            them through it (the silence shortened, or gone). The rest of the plan moves with it."""
            nonlocal start
            if at - written_at > WATCH_LONGER_THAN:
                waited_from = loop.time()
                if await _all_taken(writer) and loop.time() - waited_from > KEPT_UP_WITHIN:
                    start = max(start, loop.time() - written_at)
            if start + at > loop.time():
                await wait_until(start + at)

        style = the_plan.end.style
        writes = the_plan.writes
        # a clean end due with the last write leaves in the same segment: a proxy in front then
        # sees the body end before the client can react to the last event (and hang up)
        terminated = style == "clean" and bool(writes) and the_plan.end.at <= writes[-1].at and request.chunked
        for i, write in enumerate(writes):
            await wait_for(write.at)
            if writer.transport.is_closing():  # the client left while we waited (writing now would raise elsewhere)
                raise ConnectionResetError("the client closed the connection")
            last = terminated and i == len(writes) - 1
            if not request.chunked:
                writer.write(write.data)
            elif write.data:  # writelines: scatter-gather, no copy of a large body
                writer.writelines((b"%x\r\n" % len(write.data), write.data, b"\r\n0\r\n\r\n" if last else b"\r\n"))
            elif last:
                writer.write(b"0\r\n\r\n")
            await writer.drain()
            written_at = write.at
            if i % WRITES_BETWEEN_YIELDS == WRITES_BETWEEN_YIELDS - 1:
                await asyncio.sleep(0)  # the other clients' turn (see WRITES_BETWEEN_YIELDS)
        await wait_for(the_plan.end.at)
        if style == "clean":
            if request.chunked and not terminated:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            if not request.keep_alive:
                writer.close()
        elif style == "abort":
            await writer.drain()
            writer.close()  # FIN after an unterminated chunked body
        else:  # reset
            await _all_taken(writer)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


async def _all_taken(writer: asyncio.StreamWriter) -> bool:
    """Wait until the client's side holds every byte written (drain() returns while up to the
    high-water mark is still in asyncio's buffer, and the kernel's send queue holds more): a
    reset (SO_LINGER 0, then abort) drops both, and a stall must not pass while the client is
    still reading. The wait lasts as long as the client keeps taking bytes; one that takes
    none for TAKING_PATIENCE seconds, or leaves, is waited for no more. True when there was
    anything to wait for."""
    sock = writer.get_extra_info("socket")
    loop = asyncio.get_running_loop()
    left, taken_at = None, loop.time()
    while not writer.transport.is_closing():
        now_left = writer.transport.get_write_buffer_size() + _send_queue(sock)
        if now_left == 0:
            return left is not None
        if left is None or now_left < left:
            left, taken_at = now_left, loop.time()
        elif loop.time() - taken_at > TAKING_PATIENCE:
            break
        await asyncio.sleep(TAKING_POLL)
    return True


def _send_queue(sock: socket.socket | None) -> int:
    """Bytes in the kernel's send queue not yet acknowledged by the client (0 where the system
    cannot tell: Linux can)."""
    if sock is None or _OUTQ is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), _OUTQ, count)
    except OSError:
        return 0
    return count[0]


async def _in_daemon_thread(slots: asyncio.Semaphore, name: str, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` in a thread of its own that nothing waits for at exit: Ctrl-C stops the
    server at once, not after the plans under way (asyncio.to_thread's pool is joined at exit).
    The thread holds one of ``slots`` until it ends, even when its request is gone meanwhile: a
    client that asks and hangs up, again and again, starts no more threads than there are slots."""
    await slots.acquire()
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(outcome: Callable[[Any], None], value: Any) -> None:
        slots.release()
        if not done.done():  # (the request was cancelled meanwhile)
            outcome(value)

    def run() -> None:
        try:
            result = work(*args)
        except BaseException as exc:  # handed to the awaiting request, as to_thread does
            outcome, value = done.set_exception, exc
        else:
            outcome, value = done.set_result, result
        try:
            loop.call_soon_threadsafe(settle, outcome, value)
        except RuntimeError:  # the loop closed: the server stopped while this planned
            pass

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except BaseException:
        slots.release()
        raise
    return await done


def _plan_and_size(source: Source, faults: list[Fault], timing: Timing, others: dict[str, Source],
                   start_after: int | None) -> tuple[Plan, int]:
    """A plan and what keeping it costs, about (in a worker thread, as the walk is as long as the plan)."""
    made = plan(source, faults, timing, others=others, start_after=start_after)
    return made, sum(len(write.data) + PLAN_WRITE_OVERHEAD for write in made.writes)


def connections_room() -> int:
    """The connection cap that the file descriptor limit (``ulimit -n``) leaves room for: each
    connection holds one, and the connections told 503 and the server's own files need some more.
    Half the limit when it is too low for that (where the server still says when accept() fails)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = resource.RLIM_INFINITY
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        return 1 << 20
    return max(soft - REFUSED_LINGERING - FDS_KEPT_BACK, soft // 2, 1)


def _report_accept_failures(loop: asyncio.AbstractEventLoop, listening: set[int], log: Callable[[str], None]) -> Callable[[], None]:
    """Have ``loop`` report accept() failing on the ``listening`` sockets for want of file descriptors
    in one line every OUT_OF_FDS_SAID_EVERY seconds. asyncio logs each failure with a traceback, up
    to one per backlog slot per retry (1,024 a second), and retries by itself each second, which is
    how the server recovers once connections close. Every other report goes where it went before.
    Returns what puts the loop's previous handler back (if no one replaced this one since)."""
    previous = loop.get_exception_handler()
    say = _SaidEvery(OUT_OF_FDS_SAID_EVERY, log)
    retries_until = 0.0  # asyncio's retries of accept() may be pending until then

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal retries_until
        exc, sock = context.get("exception"), context.get("socket")
        now = time.monotonic()
        if _a_retry_after_the_close(context) and now < retries_until:
            return  # (one per failure above: the socket closed before the retry; nothing to serve)
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES and sock is not None and sock.fileno() in listening):
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        retries_until = now + ACCEPT_RETRIES_PENDING
        say(lambda: f"streamtap replay: cannot accept connections: {exc.strerror or exc} "
                    f"({errno.errorcode.get(exc.errno, exc.errno)}); retrying each second while open connections close "
                    "(raise `ulimit -n`?)")

    loop.set_exception_handler(handler)

    def restore() -> None:
        pending = retries_until - time.monotonic()
        if pending > 0 and not loop.is_closed():  # the retries still to come would each log a traceback
            loop.call_later(pending, restore)
        elif loop.get_exception_handler() is handler:
            loop.set_exception_handler(previous)

    return restore


def _a_retry_after_the_close(context: dict[str, Any]) -> bool:
    """asyncio's retry of accept() on a listening socket closed since: it fails to watch fd -1."""
    return isinstance(context.get("exception"), ValueError) and str(context.get("message", "")).startswith(
        "Exception in callback BaseSelectorEventLoop._start_serving")


_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


async def _sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    """Sleep to an absolute deadline, so lateness never accumulates over a stream.

    asyncio's epoll timeouts round up to whole milliseconds, so the last millisecond is
    spent yielding to the loop. Measured (bench/replay.py, 5 ms gaps): p99 gap error
    0.9 ms without this, 0.05 ms with it on a quiet machine; on a 2-core machine at load 7
    a longer (1.5 ms) spin starved the client and doubled the median error.
    """
    remaining = deadline - loop.time()
    if remaining > 0.001:
        await asyncio.sleep(remaining - 0.001)
    while loop.time() < deadline:
        await asyncio.sleep(0)


# --- resume ---------------------------------------------------------------------------------


_BOM = b"\xef\xbb\xbf"


def as_served(source: Source, assign_ids: bool) -> Source:
    """``source`` as the server sends it: with ``id:`` lines when it assigns ids to an SSE
    stream. Byte positions count this body, so a check of the faults at start must plan on it."""
    return with_event_ids(source) if assign_ids and source.wire == "sse" else source


def with_event_ids(source: Source) -> Source:
    """The same stream with an ``id: <seq>`` line opening every SSE event: in the frame's last
    block, the one that dispatches it, not in a block the decoder folded in before it (a
    comment, OpenRouter's ``: OPENROUTER PROCESSING``), where the id would be set with no event
    and a resume from it would send the event again; and after the stream's BOM, which a
    decoder drops only as the very first bytes."""
    frames = []
    for i, frame in enumerate(source.frames):
        if frame.seq is not None:
            bom = len(_BOM) if i == 0 and frame.raw.startswith(_BOM) else 0
            ends = _block_ends(frame.raw[bom:])
            at = bom + (ends[-1] if ends else 0)
            frame = replace(frame, raw=frame.raw[:at] + b"id: %d\n" % frame.seq + frame.raw[at:])
        frames.append(frame)
    return replace(source, frames=frames, reads=[])


def _resume_position_as_planned(source: Source, faults: list[Fault], others: dict[str, Source],
                                last_event_id: str) -> int | None:
    """``resume_position`` in the stream that ``plan(source, faults, others=others)`` serves, the
    index its ``start_after`` takes."""
    return resume_position(with_swapped_tails(source, faults, others), last_event_id)


def resume_position(source: Source, last_event_id: str) -> int | None:
    """Index of the frame after which a client that sends ``last_event_id`` resumes, or None.

    The SSE decoder tracks the id in force at each event by the WHATWG rules (an id
    persists over later events, one with a NUL is ignored). The first event carrying the id
    is the one whose own ``id:`` line set it: the client got at least that far, maybe further
    (later events without an ``id:`` line, or repeating it, carry the same id), and the server
    cannot tell how much further. Resuming right after it may send the client some events
    twice but loses none. An id set by a block that dispatches no event resumes before the
    event that block was recorded with.

    HTTP strips the spaces around a header value (h11 does), so an id recorded with leading or
    trailing spaces or tabs never arrives as recorded: ids are compared without them, and of
    several that then match (`` a`` and ``a``), the earliest is taken, for the same reason."""
    if source.wire != "sse":
        return None
    from streamtap.wire import SSEDecoder

    wanted = last_event_id.strip(" \t")
    decoder = SSEDecoder()
    # the frames were cut by this decoder when recorded: fed one by one, each gives its event
    for i, frame in enumerate(source.frames):
        if frame.seq is None:  # an event over the size limit, kept unframed: the client got its bytes, ids and all
            decoder.feed(frame.raw)  # (its id takes effect at the frame that reports the event, after these)
            continue
        raw, fed = frame.raw, 0
        for end in _block_ends(raw):
            # a block before the frame's event (an id-only block the decoder folds into the next
            # event's frame) sets the id without dispatching: the client may hold it without the
            # frame's event, so the resume sends this frame again
            decoder.feed(raw[fed:end])
            fed = end
            if decoder.last_event_id.strip(" \t") == wanted:
                return i - 1
        decoder.feed(raw[fed:])
        if decoder.last_event_id.strip(" \t") == wanted:
            return i
    return None


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _block_ends(raw: bytes) -> list[int]:
    """Where the SSE blocks in ``raw`` end (just past each blank line), its last line end left out."""
    ends, line_start = [], 0
    for line_end in _LINE_END.finditer(raw):
        if line_end.start() == line_start and line_end.end() < len(raw):
            ends.append(line_end.end())
        line_start = line_end.end()
    return ends


# --- HTTP/1.1 plumbing -------------------------------------------------------------------


class _Refused(Exception):
    """A request the server answers with an error status and then closes the connection."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    chunked: bool = True  # the client speaks HTTP/1.1: an HTTP/1.0 one reads a body that ends at the close


class _RequestReader:
    """The requests on one connection, parsed by h11 within the server's ``Limits``.

    One h11 connection per request (the bytes after a request carry over), because the
    responses are written by hand: h11 only ever sees the client's side."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits) -> None:
        self.reader, self.writer, self.limits = reader, writer, limits
        self._leftover = b""
        self._silent = True  # nothing received yet on this connection
        # since when a kept-alive connection waits for its next request: the server, at its
        # connection cap, closes the one idle longest to make room (a client's pool reconnects)
        self.idle_since: float | None = None

    async def next(self) -> _Request | None:
        """The next whole request; None when the client closed or went quiet between requests.
        Raises _Refused for what cannot be answered normally."""
        limits = self.limits
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.header_bytes)
        # RFC 9112 2.2: empty lines before a request line are ignored (some clients send a CRLF
        # after a POST body); h11 would refuse them
        self._leftover = self._leftover.lstrip(b"\r\n")
        begun = bool(self._leftover)  # h11 has this request's first byte
        header_deadline = time.monotonic() + limits.header_timeout if begun else None
        if begun:  # (receive_data(b"") would mean the client closed)
            conn.receive_data(self._leftover)
            self._leftover = b""
        request: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if request is None and header_deadline is None:
                    return None  # closed before a request began
                status = exc.error_status_hint if exc.error_status_hint in (400, 431) else 400
                raise _Refused(status, "bad_request", f"malformed request: {_without_echo(str(exc))}") from None
            if event is h11.NEED_DATA:
                if request is None:
                    timeout = self._idle_timeout() if header_deadline is None else header_deadline - time.monotonic()
                else:
                    timeout = limits.body_timeout
                if request is None and header_deadline is None and not self._silent:
                    self.idle_since = time.monotonic()
                data = await self._read(timeout, waiting=header_deadline is not None or request is not None)
                self.idle_since = None
                if data is None:
                    return None
                if data and header_deadline is None:
                    header_deadline = time.monotonic() + limits.header_timeout
                    self._silent = False
                if data and not begun:
                    data = data.lstrip(b"\r\n")
                    begun = bool(data)
                    if not begun:
                        continue
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
                if event.http_version not in (b"1.0", b"1.1"):
                    raise _Refused(505, "bad_request", f"HTTP/{event.http_version.decode('latin-1')} is not spoken here; HTTP/1.1 is")
                if _head_size(event) > limits.header_bytes:  # h11 bounds only a head still incomplete
                    raise _Refused(431, "bad_request", f"request headers over {limits.header_bytes} bytes")
                if _has_header(event, b"content-length") and _has_header(event, b"transfer-encoding"):
                    # RFC 9112 6.1: which framing wins is what request smuggling plays on
                    raise _Refused(400, "bad_request", "malformed request: both Content-Length and Transfer-Encoding")
                length = _content_length(event)
                if length is not None and length > limits.body_bytes:
                    raise _Refused(413, "request_too_large", f"request body of {length} bytes; this server takes at most {limits.body_bytes}")
                if conn.they_are_waiting_for_100_continue:
                    self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limits.body_bytes:
                    raise _Refused(413, "request_too_large", f"request body over {limits.body_bytes} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                self._leftover = bytes(conn.trailing_data[0])
                return _request(request, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None
            # PAUSED cannot come before EndOfMessage on the client's side

    def _idle_timeout(self) -> float:
        if self._silent:
            return min(self.limits.first_byte_timeout, self.limits.idle_timeout)
        return self.limits.idle_timeout

    async def hung_up_within(self, seconds: float) -> bool:
        """While the server waits to write: True as soon as the client hangs up, False once
        ``seconds`` have passed. What the client sends meanwhile (a pipelined request) is kept
        for ``next()``; past a header's worth of it, the rest is left unread until then."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while len(self._leftover) <= self.limits.header_bytes:
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            reading = asyncio.ensure_future(self.reader.read(READ_SIZE))
            try:
                done, _ = await asyncio.wait({reading}, timeout=remaining)
            finally:
                if not reading.done():
                    reading.cancel()  # a cancelled read has taken nothing from the reader
            try:
                data = await reading
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # the server stops: not ours to swallow
                    raise
                return False
            except OSError:  # reset: gone
                return True
            if not data:
                return True
            self._leftover += data
        await asyncio.sleep(max(0.0, end - loop.time()))
        return False

    async def _read(self, timeout: float, *, waiting: bool) -> bytes | None:
        """Bytes from the client (b"" at its end); None when an idle connection timed out.
        ``waiting``: a request is under way, so a timeout is a 408."""
        try:
            return await asyncio.wait_for(self.reader.read(READ_SIZE), max(timeout, 0.0))
        except TimeoutError:
            if waiting:
                raise _Refused(408, "request_timeout", "the request did not arrive in time") from None
            return None


def _head_size(request: h11.Request) -> int:
    """The request line and header lines, in bytes as sent (give or take whitespace)."""
    line = len(request.method) + len(request.target) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


def _has_header(request: h11.Request, name: bytes) -> bool:
    return any(header == name for header, _ in request.headers)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 let only digits through
    return None


def _body_as_read(body: bytes, encoding: str) -> tuple[bytes, str | None]:
    """The request body as its server reads it, decoded from its Content-Encoding, as the recording
    keeps it (recording/header.py); and None, or why it is the body as sent. One that cannot be
    decoded (damaged, an unknown coding, a bomb) is compared as sent, as the proxy's replay
    (mitm/replay.py) compares it to decide whether the request is sent here: the two agree."""
    decoded = decoded_body(body, encoding)
    if decoded is not None:
        return decoded, None
    return body, (f"its Content-Encoding {encoding!r} could not be undone (an unknown coding, damaged bytes, "
                  f"or over {MAX_DECODED_BODY} bytes decoded): the body was compared as sent")


def _request(event: h11.Request, body: bytes) -> _Request:
    headers = {name.decode("latin-1"): _header_text(name, value) for name, value in event.headers}  # names come lower-cased
    codings = [value.decode("latin-1") for name, value in event.headers if name == b"content-encoding"]
    if len(codings) > 1:  # stacked over several lines: all of them were applied (RFC 9110 5.3), in order
        headers["content-encoding"] = ", ".join(codings)
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (event.http_version != b"1.0" or "keep-alive" in connection)
    chunked = event.http_version != b"1.0"  # RFC 9112: no Transfer-Encoding to an HTTP/1.0 client
    return _Request(event.method.decode("ascii").upper(), event.target.decode("latin-1"), headers, body,
                    keep_alive and chunked, chunked)


_UTF8_HEADERS = (b"last-event-id", FAULT_HEADER.encode())


def _header_text(name: bytes, value: bytes) -> str:
    """A header value as text: latin-1 (bytes kept one to one), but a Last-Event-ID as UTF-8 first,
    because SSE ids are UTF-8 (the decoder reads them so) and EventSource sends them that way, and
    a fault spec too, as curl sends it and the live addon reads it (a ``message=`` in any language)."""
    if name in _UTF8_HEADERS:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return value.decode("latin-1")


async def _send_json(writer: asyncio.StreamWriter, status: int, body: Any, close: bool = False, head_only: bool = False) -> None:
    data = json.dumps(body, indent=1).encode()
    head = (
        f"HTTP/1.1 {status} {_reason(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    writer.write(head.encode() + (b"" if head_only else data))
    await writer.drain()
    if close:
        writer.close()


_HEADER_TEXT = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")  # printable ASCII but the escape


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- running a server beside synchronous code (tests, the pytest plugin, the sweep) ------


class ServerThread:
    """A ReplayServer on its own event loop in a daemon thread: ``with ServerThread(...) as s: s.base_url``."""

    def __init__(self, library: Library, options: ServeOptions | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 log: Callable[[str], None] | None = None, limits: Limits | None = None) -> None:
        self.server = ReplayServer(library, options, log=log if log is not None else (lambda line: None), limits=limits)
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamtap-replay", daemon=True)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def served(self) -> deque[Served]:
        return self.server.served

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(self._host, self._port), self._loop).result(10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _without_echo(reason: str) -> str:
    """h11's reason for refusing a request, without the line it quotes as Python bytes: the client
    sent that line, which may hold a key, and its repr tells the client nothing more."""
    head, echoed, _ = reason.partition(": bytearray(b")
    if not echoed:
        head, echoed, _ = reason.partition(": b'")
    return f"{head} (the line is not shown)" if echoed else reason
