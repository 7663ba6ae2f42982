"""Analysis workers: decoding, assembling, judging and recording in processes of their own.

mitmproxy carries all traffic on one event loop; streamtap's analysis costs several times what
the proxy itself spends per chunk. So the proxy side (``Workers``) only keeps each read with its
arrival time. One batch per worker, for all flows together, copies each flow's new reads into a
ring of memory the proxy shares with the worker that owns the flow (flows are sharded by id, so
N workers use N cores) and tells the worker where they are: at the end of the loop turn when
no batch went in the last ``SEND_EVERY`` or ``SEND_BYTES`` of large reads wait, else once that
much time has passed. A worker
(``serve``) runs a ``FlowTap`` per flow, exactly as the proxy would in-process, and sends each
verdict back; the proxy applies it to the flow when it arrives.

Why a shared ring and not the pipe: pickling a read and writing it through a pipe cost the proxy
about ten times what one copy into shared memory costs; the pipe now carries only small batches.

Failing open: the proxy never waits for a worker. Bytes handed to a worker and not yet
acknowledged are bounded by the ring (``MAX_IN_FLIGHT``); a flow whose bytes do not fit is
dropped from analysis and its recording says "analysis fell behind at byte N". Workers run at a
lower priority than the proxy, so on a busy machine the analysis, not the traffic, waits. A
worker that dies, or says nothing for ``HUNG_AFTER`` (it says something every ``HEARTBEAT``
while idle or getting on with its work, even inside one long batch), is killed if need be and
restarted (later and later if it keeps dying at once); the flows it held are judged ``unknown``
(but for one whose recording it finished before its verdict went: the recording's verdict),
said so in the log, the flow's comment and the recording it left, or, for a flow it had not
begun to record, a recording the restarted worker makes of it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import struct
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from itertools import count as count_from
from pathlib import Path
from time import monotonic
from types import ModuleType
from typing import Any

from streamtap.recording.writer import FELL_BEHIND

from .flowtap import FLUSH_EVERY, FlowTap, flow_summary
from .ring import RELEASE_AFTER, Ring, RingSpace

try:
    from fcntl import F_SETPIPE_SZ, fcntl
except ImportError:  # not Linux: pipes keep their default size
    F_SETPIPE_SZ = fcntl = None

log = logging.getLogger("streamtap")

# Per worker: the shared ring, which holds the reads not yet analysed. A worker on a busy machine
# lags in bursts and catches up after them: 200 answers of 200 KB at once over loopback on 2 cores
# got 16 MiB behind, and it dropped 23-48% of them; with 64 MiB it dropped none. Memory follows
# what is in flight (see ring.py): 1 MiB while the worker keeps up.
RING_ENV = "STREAMTAP_TEST_WORKER_RING"  # tests only: a smaller ring (bytes), to fill it with less traffic
MAX_IN_FLIGHT = int(os.environ.get(RING_ENV, 64 * 1024 * 1024))
SLOT = 64  # ring bytes each read is charged beyond its own, which bounds the reads in flight (their sizes and times)
# At most one batch of reads this often under load. Each flow in a batch costs the loop ~2 µs (a
# join, a copy into the ring, an op), so with many streams at once the batch must hold several
# reads per flow: at 5 ms, 200 streams gave ~1 read per flow and batch.
SEND_EVERY = 0.05
SEND_BYTES = 1024 * 1024  # ...unless this much of the ring is waiting, counted in reads over LARGE_READ:
# only large reads come fast enough to fill a batch (50 ms of them over loopback can be ~10 MB,
# which the proxy would hold and the worker get in one piece), and counting the small ones cost
# the loop more than keeping them
LARGE_READ = 1024
# Reads averaging less than this are joined before they go into the ring, larger ones go one by
# one: a copy into the ring costs ~90 ns a read, a join ~20 ns a read plus a second copy of each
# byte (8 reads of 200 B: 4.5 us one by one, 1.3 us joined; of 16 KiB: 4.3 us against 6.0 us).
JOIN_BELOW = 4096
# A request body this large goes to the worker through the ring, not pickled into the pipe: one copy
# into shared memory instead of a pickle, a concatenation and a pipe write (bench/request_bodies.py:
# a flow with a 1 MiB prompt costs the loop 0.37 ms instead of 1.5 ms, with 100 KiB 174 us instead of 238).
BODY_IN_RING = 4096
WORKER_NICE = 10  # analysis yields the CPU to the traffic (and to the apps beside the proxy)
# The pipe to a worker holds this much (Linux lets a process ask for up to 1 MiB): a batch of many
# flows' OPENs, or a large prompt the ring had no room for (BODY_IN_RING), then goes in one write
# instead of waiting for the loop to say the default 64 KiB pipe has room again.
PIPE_BYTES = 1024 * 1024
ACK_EVERY = 1024 * 1024  # a worker reports the bytes it analysed at least this often (and when idle)
VERDICT_WAIT = 60.0  # seconds after a flow's end before its verdict is given up on, once its worker gets nowhere
VERDICT_WAIT_BUSY = 600.0  # ...or however busy it is
STALL_ENV = "STREAMTAP_TEST_WORKER_STALL"  # tests only: a path; at its first reads a worker stalls while it exists
SLOW_FSYNC_ENV = "STREAMTAP_TEST_WORKER_SLOW_FSYNC"  # tests only: seconds each fsync takes in a worker (a slow disk)
SLOW_START_ENV = "STREAMTAP_TEST_WORKER_SLOW_START"  # tests only: seconds a worker waits before its first word
HEARTBEAT = 1.0  # a worker says something at least this often, idle or getting on with its work...
HUNG_AFTER = float(os.environ.get("STREAMTAP_TEST_WORKER_HUNG_AFTER", 30))  # ...or is taken for hung, killed and restarted
# A worker's start (a new Python, at a lower priority) can take many seconds on a loaded machine:
# before its first word it is given this long, so a slow start is not taken for a hang and killed
# again and again, with the flows it would take
START_WAIT = max(HUNG_AFTER, 60.0)
# The proxy looks for hung workers, lost verdicts and ring memory to give back this often: at 0.1 s
# (FLUSH_EVERY, what an in-process tap needs) its loop woke ten times a second for it, idle or not.
EXPIRE_EVERY = 1.0
# A worker that dies within RESTART_QUICK of its start died at once. It is restarted at once the
# first time; from the second such death in a row, the restart waits 1 s, then 2 s, 4 s... up to
# RESTART_WAIT_MAX: a worker that cannot live (a bug at start, no memory) must not have the proxy
# spawn Python processes in a loop, which would take the CPU from the traffic.
RESTART_QUICK = 10.0
RESTART_WAIT_MAX = 60.0

# What the proxy may hold of operations the pipe to a worker has not taken: past this, new flows are
# not handed to that worker (each OPEN carries the flow's request, and a worker that takes nothing
# would have them pile up in the proxy until it is found hung).
MAX_UNSENT = 8 * PIPE_BYTES
REAP_TRIES = 30  # seconds an exited worker's process may take to end before it is killed

# operations, proxy -> worker (tuples: the cheapest thing to pickle)
OPEN, DATA, BEHIND, FINISH, STOP, ORPHANED, REOPEN = range(7)
# results, worker -> proxy
OPENED, VERDICT, FAILED, NOTED = range(4)


# --- the worker process -------------------------------------------------------------------


class _Forward(logging.Handler):
    """Keeps the worker's log records to send to the proxy, which logs them as its own."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))

    def take(self) -> list[tuple[int, str]]:
        records, self.records = self.records, []
        return records


def _note_orphaned(path: str | None, message: str, directory: str | None, started: float, flow_id: str) -> None:
    """Say in a recording a dead worker left why it stops. Without its path (the worker died
    before it said it), the recording is looked for by the flow's start and id."""
    from streamtap.recording import note_unfinished, partial_recordings

    if path:
        paths = [path]
    else:
        paths = partial_recordings(directory, started, flow_id) if directory else []
    for found in paths:
        try:
            noted = note_unfinished(found, "streamtap_error", f"analysis: {message}")
        except OSError:
            noted = False
        if not noted:
            log.warning(f"streamtap: {found}: cannot note in it that {message}")


def _begun_recordings(directory: str, started: float, flow_id: str) -> list[str]:
    """The recordings, partial or finished, that a worker began of the flow ``flow_id`` tapped
    at ``started`` (named as ``partial_name`` and ``final_name`` name them), but for a file it
    created and died before it wrote a line to, which a new writer takes over."""
    from streamtap.recording.writer import stamp

    pattern = f"{stamp(started)}_*_{flow_id.replace('-', '')[:12]}.*"
    try:
        return sorted(str(path) for path in Path(directory).glob(pattern) if path.stat().st_size)
    except OSError:
        return []


def _finished_recording(partial: str, directory: str, started: float, flow_id: str) -> tuple[str, dict[str, Any]] | None:
    """The recording a dead worker finished (its end line written, renamed from ``partial``)
    before its verdict reached the proxy: its path and end line. None where there is none."""
    from streamtap.recording.catalog import read_ends
    from streamtap.recording.writer import PARTIAL_SUFFIX

    if os.path.exists(partial):
        return None
    for path in _begun_recordings(directory, started, flow_id):
        if PARTIAL_SUFFIX in Path(path).name:
            continue
        try:
            _header, end, problem, _size = read_ends(Path(path))
        except Exception:  # unreadable: the flow stays unknown, as it would without this look
            continue
        if end is not None and problem is None and isinstance(end.get("verdict"), dict):
            return path, end
    return None


def summary_of_end(remote: RemoteFlow, path: str, end: dict[str, Any]) -> dict[str, Any]:
    """The summary a worker would have sent for ``remote``, rebuilt from the end line of the
    recording it finished: the verdict is the one the recording states."""
    verdict, turn = end["verdict"], end.get("turn") or {}
    return flow_summary(
        provider=remote.provider,
        model=turn.get("model") or remote.model,
        verdict=verdict.get("kind"),
        reason=verdict.get("reason"),
        events=end.get("events", 0),
        bytes=remote.forwarded(),
        ttft_ms=end.get("ttft_ms"),
        duration_ms=end.get("duration_ms"),
        stream_end=end.get("stream_end"),
        recording=path,
        errors=end.get("streamtap_errors") or [],
        usage=turn.get("usage"),
        injected_fault=end.get("injected_fault"),
    )


def _opened(tap: FlowTap) -> tuple[str | None, str | None, str]:
    """What OPENED says of a flow: its recording's path, the model its request names and its
    provider. The proxy guessed the provider without the request body, which some paths need
    (a root /completions, Ollama's): a flow whose analysis is lost after is counted under this one,
    as its recording is."""
    return tap.writer.file_path if tap.writer else None, tap.requested_model, tap.provider


def _reopen(spec, settings: dict[str, Any], t0: float, dropped: str) -> tuple[FlowTap | None, tuple[str | None, str | None, str]]:
    """A flow a dead worker held before it said it had begun its recording: the recording it
    began gets the note why it stops; else this worker records the flow, without its bytes (they
    went to the dead one), with the note. The tap, if one was made, and what OPENED says."""
    spec.complete()  # the model the request names and the provider, with the body, for the verdict
    begun = _begun_recordings(settings["directory"], spec.started, spec.flow_id)
    if begun:
        _note_orphaned(None, f"{dropped}; the recording ends where it stopped", settings["directory"], spec.started, spec.flow_id)
        return None, (begun[0], spec.requested_model, spec.detection.dialect.value if spec.detection else "unknown")
    tap = FlowTap(spec, t0=t0, **settings)
    tap.lost_from(0, f"{dropped}; {FELL_BEHIND}")
    return tap, _opened(tap)


class _Voice:
    """The worker's pipe to the proxy, shared by its main loop and its heartbeat thread: a
    message must not be written into the middle of another."""

    def __init__(self, outbox) -> None:
        self.outbox = outbox
        self.lock = threading.Lock()
        self.said = time.monotonic()

    def say(self, message) -> None:
        with self.lock:
            self.outbox.send(message)
            self.said = time.monotonic()


def _io_of(thread_id: int) -> Callable[[], int | None]:
    """How much the thread has read and written (its pipe, its recordings): a count that moves
    while the thread gets on with its work, and stands still while it is stuck or stalled
    (sleeping, blocked, stopped). None where the system does not count it per thread."""
    path = f"/proc/self/task/{thread_id}/io"

    def moved() -> int | None:
        try:
            with open(path, "rb") as counts:
                fields = dict(line.split(b":") for line in counts.read().splitlines())
            return int(fields[b"rchar"]) + int(fields[b"wchar"])
        except (OSError, KeyError, ValueError):
            return None

    return moved


def _beat_while_busy(voice: _Voice, progress: Callable[[], int | None]) -> None:
    """The heartbeat inside a long batch (thousands of lines each synced to a slow disk): the
    main loop speaks only between batches. It beats only while ``progress`` moves, so a worker
    that gets nowhere still falls silent and is found hung."""
    seen = progress()
    while True:
        time.sleep(HEARTBEAT / 2)
        now = progress()
        if now is not None and now != seen and time.monotonic() - voice.said >= HEARTBEAT:
            try:
                voice.say((0, [], [], True))  # (busy: the proxy takes it for progress, as it takes a verdict)
            except (EOFError, OSError, ValueError):  # the proxy is gone, or the worker is leaving
                return
        seen = now


def _slow_down_fsync(seconds: float) -> None:
    """Tests only: every fsync in this worker takes ``seconds`` more, as on a slow disk."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(seconds)
        real_fsync(fd)

    os.fsync = slow_fsync


def lower_priority(worker_pid: int, proxy_pid: int) -> None:
    """The worker runs WORKER_NICE below the proxy. Set by the proxy as soon as the process
    exists: the worker itself could only do it once its imports are done, seconds of CPU at the
    proxy's priority on a busy machine. Where it is not permitted, the worker runs at the proxy's."""
    try:
        niceness = min(os.getpriority(os.PRIO_PROCESS, proxy_pid) + WORKER_NICE, 19)
        if os.getpriority(os.PRIO_PROCESS, worker_pid) < niceness:
            os.setpriority(os.PRIO_PROCESS, worker_pid, niceness)
    except OSError:
        pass


def serve(inbox, outbox, ring_path: str, ring_size: int) -> None:
    """The worker's main loop: batches of operations in, acknowledgements and verdicts out."""
    if os.environ.get(SLOW_START_ENV):  # tests only: a start as slow as on a loaded machine
        time.sleep(float(os.environ[SLOW_START_ENV]))
    from streamtap.providers import StreamEnd

    # a terminal's Ctrl-C reaches the whole process group: the proxy stops the worker itself (STOP),
    # after the last verdicts, instead of the worker dying first with a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lower_priority(os.getpid(), os.getppid())  # (the proxy did so already, but for a race with its call)
    ring = Ring.attach(ring_path, ring_size)
    get = ring.get
    forward = _Forward()
    log.addHandler(forward)
    log.setLevel(logging.INFO)
    log.propagate = False
    stall = os.environ.get(STALL_ENV)
    if os.environ.get(SLOW_FSYNC_ENV):
        _slow_down_fsync(float(os.environ[SLOW_FSYNC_ENV]))
    taps: dict[int, FlowTap] = {}  # by RemoteFlow.key
    failed: dict[int, str] = {}  # flows whose analysis raised, and why: their FINISH says so at once
    unacknowledged = 0  # bytes of reads analysed and not yet reported: acknowledged in bulk, not per batch
    voice = _Voice(outbox)
    say = voice.say
    try:
        say((0, [(OPENED, None, os.getpid())], []))
    except (EOFError, OSError):  # the proxy died before this worker was up: nothing to do, nothing to say
        return
    threading.Thread(
        target=_beat_while_busy, args=(voice, _io_of(threading.get_native_id())), name="streamtap-heartbeat", daemon=True
    ).start()
    while True:
        try:
            if not inbox.poll(FLUSH_EVERY):
                for tap in taps.values():  # a stalled stream's lines still reach the OS
                    tap.flush()
                if unacknowledged or forward.records or time.monotonic() - voice.said >= HEARTBEAT:
                    say((unacknowledged, [], forward.take()))
                    unacknowledged = 0
                continue
            batch = inbox.recv()
        except (EOFError, OSError):  # the proxy is gone
            batch = [(STOP,)]
        if stall and any(op[0] == DATA for op in batch):
            while os.path.exists(stall):
                time.sleep(0.05)
            stall = None
        consumed, results, noted = 0, [], 0
        for op in batch:
            kind = op[0]
            try:
                if kind == DATA:
                    _, key, at, sizes, times, occupied = op
                    consumed += occupied
                    tap = taps.get(key)
                    if tap is not None:
                        t0 = tap.t0  # the proxy sends arrival times as they are (monotonic)
                        times = [t - t0 for t in times]
                        data = get(at, sum(sizes))
                        if len(sizes) == 1:
                            tap.take([data], times)
                        else:
                            ends = list(accumulate(sizes))
                            tap.take(list(map(data.__getitem__, map(slice, [0, *ends], ends))), times)
                elif kind == OPEN:
                    _, key, spec, settings, t0, body_at = op
                    if body_at is not None:  # the request body came through the ring
                        at, size, occupied = body_at
                        consumed += occupied
                        spec.take_request_body(get(at, size))
                    tap = taps[key] = FlowTap(spec, t0=t0, **settings)
                    results.append((OPENED, key, _opened(tap)))
                elif kind == REOPEN:  # a flow a dead worker held before it said it had begun its recording
                    _, key, spec, settings, t0, dropped = op
                    tap, opened = _reopen(spec, settings, t0, dropped)
                    if tap is not None:
                        taps[key] = tap
                    else:  # the recording the dead worker began is all there is: its FINISH gets FAILED
                        failed[key] = dropped
                    results.append((OPENED, key, opened))
                elif kind == BEHIND:
                    tap = taps.get(op[1])
                    if tap is not None:
                        tap.lost_from(op[2], op[3])
                elif kind == FINISH:
                    _, key, end, error, fault, t, undelivered = op
                    tap = taps.pop(key, None)
                    if tap is not None:
                        results.append((VERDICT, key, tap.finish(StreamEnd(end), error, fault, t, undelivered)))
                    else:
                        results.append((FAILED, key, failed.pop(key, "the analysis worker never had this flow")))
                elif kind == ORPHANED:  # a recording a dead worker left: say why it stops
                    noted += 1
                    _note_orphaned(*op[1:])
                elif kind == STOP:
                    for tap in taps.values():
                        try:  # one recording that cannot be closed (a full disk) leaves the others' to close
                            tap.abandon()
                        except Exception:  # (no log: nothing is said after STOP) it stays marked incomplete all the same
                            pass
                    return
            except Exception as exc:  # a streamtap bug costs this flow its analysis, not the worker
                why = f"analysis failed: {type(exc).__name__}: {exc}"
                log.warning(f"streamtap: analysis worker: {why}")
                if kind in (OPEN, REOPEN, DATA, BEHIND):  # no verdict can be trusted after this: say why at its end
                    tap = taps.pop(op[1], None)
                    try:
                        if tap is not None:
                            tap.abandon()  # its recording stays marked incomplete
                    except Exception:
                        pass
                    failed[op[1]] = why
                elif kind == FINISH:
                    results.append((FAILED, op[1], why))
        if noted:  # until the proxy hears it, a death would leave the notes to the next worker
            results.append((NOTED, None, noted))
        unacknowledged += consumed
        if not (results or forward.records or unacknowledged >= ACK_EVERY or time.monotonic() - voice.said >= HEARTBEAT):
            continue
        records = forward.take()
        try:
            try:
                say((unacknowledged, results, records))
            except (EOFError, OSError):
                raise
            except Exception:  # a reply that does not pickle (nothing was written yet): sent as what pickles
                say((unacknowledged, _picklable(results), _picklable(records)))
            unacknowledged = 0
        except (EOFError, OSError):
            for tap in taps.values():
                tap.abandon()
            return


def _picklable(items: list) -> list:
    """``items`` that pickle. A verdict that does not (a provider's usage nested deeper than
    pickle goes, which JSON allows) goes without its provider's raw usage, or else as a failure;
    a log record that does not is dropped. The worker lives on, and so do its other flows."""
    kept = []
    for item in items:
        try:
            pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            if not (isinstance(item, tuple) and len(item) == 3 and item[0] == VERDICT):
                continue
            _, key, summary = item
            usage = summary.get("usage")
            if isinstance(usage, dict) and "raw" in usage:
                item = (VERDICT, key, {**summary, "usage": {k: v for k, v in usage.items() if k != "raw"}})
                try:
                    pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
                except Exception:
                    item = (FAILED, key, f"its verdict could not be handed to the proxy: {type(exc).__name__}")
            else:
                item = (FAILED, key, f"its verdict could not be handed to the proxy: {type(exc).__name__}")
        kept.append(item)
    return kept


# --- the proxy side -----------------------------------------------------------------------


def _restart_wait(quick_deaths: int) -> float:
    """Seconds before restarting a worker that died at once ``quick_deaths`` times in a row."""
    return 0.0 if quick_deaths < 2 else min(RESTART_WAIT_MAX, 2.0 ** (quick_deaths - 2))


_keys = count_from()


@dataclass
class RemoteFlow:
    """A flow whose analysis runs in a worker: the proxy keeps its reads until the next send."""

    flow_id: str
    shard: int
    t0: float
    provider: str  # guessed without the request body until the worker says (OPENED) what it detected with it
    started: float = 0.0  # the tap's wall-clock start, which names its recording
    directory: str | None = None  # where its recording goes; None when it is not recorded
    # What the proxy and the worker know this run of the flow by. Not the flow's id: mitmproxy's
    # client replay sends the same flow, id and all, again, maybe before the first run's verdict is back.
    key: int = field(default_factory=_keys.__next__)
    # the reads since the last batch and their arrivals (time.monotonic()): copied into the ring when it goes
    chunks: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    sent: int = 0  # wire bytes handed to the worker
    seen: int = 0  # wire bytes forwarded to the client, but for those in chunks
    queued: bool = False  # in the list of flows with reads to send
    called: bool = False  # its stream callable was called (the end's empty call counts): not replaced
    dropped: str | None = None  # why its later bytes are not analysed
    opened: bool = False  # handed to its worker
    # its OPEN's spec and settings until the worker says it took it (OPENED): a worker that dies
    # before has begun no recording, so the one that takes its place is handed the flow again.
    # The spec holds the request body mitmproxy's flow holds anyway, and a reply comes in milliseconds.
    opening: tuple[Any, dict[str, Any]] | None = field(default=None, repr=False)
    reopened: bool = False  # handed again to the worker that took a dead one's place, only for its recording
    verdict_lost: bool = False  # ended with its analysis dropped: its worker only finishes the recording
    recording: str | None = None  # the partial recording's path, once the worker said
    model: str | None = None  # the model the request names, once the worker said
    generation: int = 0  # of the worker process it was handed to
    ended: float | None = None  # when the proxy saw its end
    end: str | None = None  # how it ended (a StreamEnd value)
    error: str | None = None  # mitmproxy's error at its end
    fault: str | None = None  # the faults streamtap injected into it
    # the pool it was handed to: its end goes there, even after streamtap_workers changed
    workers: Workers | None = field(default=None, repr=False, compare=False)

    def partial_path(self) -> str | None:
        return self.recording

    def forwarded(self) -> int:
        """Wire bytes forwarded to the client so far."""
        return self.seen + sum(map(len, self.chunks))

    def discard_reads(self) -> None:
        """Drop the reads kept since the last batch (no worker will analyse them); they still count as forwarded."""
        self.seen = self.forwarded()
        self.chunks.clear()
        self.times.clear()


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """A spawned worker runs no copy of the proxy's main script. multiprocessing runs the parent's
    ``__main__`` file again in the child, as ``__mp_main__``, so the child can unpickle what it
    defines; for mitmdump that imports all of mitmproxy's tools (0.5 s of CPU at each start and
    restart, at the worker's low priority often longer), and the worker needs none of it: what it
    runs is in this module. So the parent's main module is out of ``sys.modules`` while
    ``Process.start`` reads it, which is on this thread and takes only that call."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class _Process:
    """One worker process and its two pipes: written from the event loop without blocking,
    read by a thread that hands each message to the loop."""

    def __init__(self, index: int, generation: int, loop, received: Callable, died: Callable) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork the proxy's running loop
        self.ring = Ring.create(MAX_IN_FLIGHT)
        pipes = []
        try:  # a start that fails (out of fds, say) leaves no ring file behind: it would stay until reboot
            inbox_r, self.inbox = ctx.Pipe(duplex=False)
            pipes += [inbox_r, self.inbox]
            self.outbox, outbox_w = ctx.Pipe(duplex=False)
            pipes += [self.outbox, outbox_w]
            self.index, self.generation = index, generation
            self.process = ctx.Process(
                target=serve, args=(inbox_r, outbox_w, self.ring.path, MAX_IN_FLIGHT), name=f"streamtap-worker-{index}", daemon=True
            )
            with _main_not_rerun():
                self.process.start()
            lower_priority(self.process.pid, os.getpid())
        except BaseException:
            self.ring.close()
            for pipe in pipes:
                pipe.close()
            raise
        inbox_r.close()
        outbox_w.close()
        self.space = RingSpace(MAX_IN_FLIGHT)  # where the reads in flight are
        self.grown = time.monotonic()  # when the ring last took more memory
        self.behind = False  # the ring refused a flow's reads, and the worker has acknowledged none since
        self.loop = loop
        self.fd = self.inbox.fileno()
        os.set_blocking(self.fd, False)
        if fcntl is not None:
            try:
                fcntl(self.fd, F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:  # over this user's pipe memory: the default size works too
                pass
        self.unsent = bytearray()  # what the pipe did not take yet (new flows stop at MAX_UNSENT)
        self.starved = False  # said once that the ring could get no memory
        self.alive = True
        self.started = time.monotonic()
        # when it last said something; its start counts, so a worker that hangs before its first word
        # is found too (after START_WAIT)
        self.heard = self.started
        self.spoke = False  # set by the reader thread at the first reply: the worker is up
        # when it last took bytes or said anything of a flow: one behind (a slow disk), not stuck, is getting on
        self.progressed = self.started
        self.killed = False  # taken for hung and killed: its reader thread reports the death
        self.leaving = False  # sent STOP by a retired pool: its exit is no death
        self.freed = False
        self.notes: list[tuple] = []  # the notes (ORPHANED) sent to it that it has not said it wrote
        self.pid: int | None = self.process.pid
        self.exitcode: int | None = None
        # what the worker said, until the loop takes it: at shutdown the loop runs no more
        # callbacks, so what is left here is taken by stop()
        self.replies: deque = deque()
        self.reader = threading.Thread(
            target=self._read, args=(loop, received, died), name=f"streamtap-from-worker-{index}", daemon=True
        )
        self.reader.start()

    def send(self, batch: list) -> None:
        """One message in the framing ``Connection.recv`` reads; a full pipe never blocks the loop:
        the rest waits for the loop to say the pipe is writable."""
        payload = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        message = struct.pack("!i", len(payload)) + payload
        if self.unsent:
            self.unsent += message
            return
        try:
            written = os.write(self.fd, message)
        except BlockingIOError:
            written = 0
        except OSError:  # the worker is gone; the reader thread reports it
            return
        if written < len(message):
            self.unsent += memoryview(message)[written:]
            self.loop.add_writer(self.fd, self._drain)

    def _drain(self) -> None:
        try:
            written = os.write(self.fd, self.unsent)
        except BlockingIOError:
            return
        except OSError:
            written = len(self.unsent)
        del self.unsent[:written]
        if not self.unsent:
            self.loop.remove_writer(self.fd)

    @property
    def full(self) -> bool:
        """Is the ring too full for a new flow? It refused a flow's reads and the worker has caught
        up on none of what it holds since, or it is within a batch of full. An empty ring is never
        full: a put it refused for want of memory must not stop the next flows for good, as no
        acknowledgement would come to clear it."""
        in_flight = self.space.in_flight
        return (self.behind and in_flight > 0) or in_flight > MAX_IN_FLIGHT - SEND_BYTES

    def put(self, chunks: list[bytes], occupied: int) -> int | None:
        """Copy a flow's reads into the ring, one after another, charged ``occupied`` bytes of it;
        where they start, or None when the ring has no room for them (or the system no memory to back it)."""
        ring = self.ring
        at = self.space.where(occupied, ring.backed)
        if at is None:
            return None
        if at + occupied > ring.backed:
            if not ring.reserve(at + occupied):
                if not self.starved:
                    self.starved = True
                    log.warning(f"streamtap: analysis worker {self.index}: no memory for its ring in {os.path.dirname(ring.path)}")
                return None
            self.grown = time.monotonic()
        ring.put(at, chunks)
        self.space.take(at, occupied)
        return at

    def release(self, now: float) -> None:
        """After a spell without growth, the ring's memory above what is in flight goes back."""
        if now - self.grown > RELEASE_AFTER:
            self.ring.release(self.space.top())

    def _read(self, loop, received: Callable, died: Callable) -> None:
        while True:
            try:
                message = self.outbox.recv()
            except Exception:
                break
            self.spoke = True
            self.replies.append(message)
            try:
                loop.call_soon_threadsafe(self.take_replies, received)
            except RuntimeError:  # the loop is closed: the proxy is shutting down
                return
        try:
            loop.call_soon_threadsafe(died, self)
        except RuntimeError:
            pass

    def take_replies(self, received: Callable) -> None:
        """Hand what the worker said to ``received``, in order (on the loop, or at shutdown)."""
        replies = self.replies
        while replies:
            received(self, replies.popleft())

    def free(self) -> None:
        """The worker has exited: its ring, its pipes and its process handle go back to the system.
        A retired pool outlives its workers (each flow mitmweb keeps holds its stream callable), so
        this is not left to the garbage collector."""
        if self.freed:
            return
        self.freed = True
        if self.unsent:
            self.loop.remove_writer(self.fd)
            self.unsent.clear()
        self.ring.close()
        self.inbox.close()
        self.outbox.close()
        self._reap(REAP_TRIES)

    def _reap(self, tries: int) -> None:
        """The exited process's status and handle. A worker can close its pipes a while before its
        process ends (the interpreter's teardown): it is looked for again each second rather than
        left a zombie, and killed after ``REAP_TRIES``."""
        self.process.join(0)
        if self.process.exitcode is None:
            if tries:
                try:
                    self.loop.call_later(1.0, self._reap, tries - 1)
                    return
                except RuntimeError:  # the loop is closed: the proxy is exiting, which reaps it
                    return
            self.process.kill()
            self.process.join(1)
        self.exitcode = self.process.exitcode
        try:
            self.process.close()
        except ValueError:  # still not reaped: its handle goes with the garbage collector
            pass

    def stop(self, timeout: float) -> None:
        """At shutdown: the rest of what was sent, then STOP (the worker leaves its open
        recordings marked incomplete); a worker that does not take it within ``timeout`` is killed."""
        deadline = time.monotonic() + timeout
        self.tell_stop(deadline)
        self.wait_stopped(deadline)

    def tell_stop(self, deadline: float) -> None:
        """The rest of what was sent, then STOP, written by ``deadline`` if the pipe takes them."""
        self.alive = False
        if self.freed:
            return
        if self.unsent:
            self.loop.remove_writer(self.fd)
        payload = pickle.dumps([(STOP,)])
        self.unsent += struct.pack("!i", len(payload)) + payload
        while self.unsent:  # (one write at least, however late: a worker that keeps up takes it)
            try:
                del self.unsent[: os.write(self.fd, self.unsent)]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
            except OSError:
                break

    def wait_stopped(self, deadline: float) -> None:
        """After ``tell_stop``: the worker's end, by ``deadline``, else it is killed."""
        if self.freed:
            return
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1)
        self.reader.join(1)  # the pipe's end after the worker's: every reply it sent is read
        self.ring.close()  # the worker removes the name once mapped; not if it never got that far


class Workers:
    """The proxy's side of the analysis workers. Every method is called on the event loop."""

    def __init__(self, count: int, loop, *, verdict: Callable[[RemoteFlow, dict], None], lost: Callable[[RemoteFlow, str], None]) -> None:
        self.loop = loop
        self.verdict, self.lost = verdict, lost
        self.flows: dict[int, RemoteFlow] = {}  # by key: handed to a worker, verdict not back yet
        self.queued: list[RemoteFlow] = []
        self.queued_bytes = 0  # of large reads, since the last batch
        self.ops: list[list] = [[] for _ in range(count)]
        self.notes_unsent = [0] * count  # of the ops waiting for each worker, how many are notes (ORPHANED)
        self.timer = None  # the next batch, when only reads wait (SEND_EVERY)
        self.sent_at = 0.0  # when the last batch went
        self.scheduled = False  # a batch in this loop turn: an open or an end waits, a read after a quiet spell, or SEND_BYTES
        self.generations = [0] * count
        self.pids: list[int | None] = [None] * count
        self.quick_deaths = [0] * count  # deaths in a row, each within RESTART_QUICK of the worker's start
        self.restarts: list = [None] * count  # a restart that waits (a timer)
        self.stopping = False
        self.retired = False  # takes no new flows; its workers stop once the flows they hold have their verdicts
        self.processes: list[_Process] = []
        try:
            for index in range(count):
                self.processes.append(self._start(index))
        except BaseException:  # the caller analyses in-process instead: the workers already started go
            self.stopping = True
            for process in self.processes:
                process.stop(0.0)
            raise

    def _start(self, index: int) -> _Process:
        self.generations[index] += 1
        return _Process(index, self.generations[index], self.loop, self._received, self._died)

    # what the Tap calls ------------------------------------------------------------
    def open(self, spec, settings: dict[str, Any]) -> RemoteFlow:
        shard = zlib.crc32(spec.flow_id.encode()) % len(self.processes)
        provider = spec.detection.dialect.value if spec.detection else "unknown"
        directory = settings["directory"] if settings.get("record") else None
        remote = RemoteFlow(
            spec.flow_id, shard, time.monotonic(), provider, spec.started, directory, generation=self.generations[shard], workers=self
        )
        process = self.processes[shard]
        if not process.alive:  # it died, and its restart waits
            remote.dropped = "no analysis worker: it died and is not restarted yet"
        elif len(process.unsent) > MAX_UNSENT:
            remote.dropped = f"no analysis: its worker has taken no work for a while ({len(process.unsent) >> 20} MiB wait for it)"
        else:
            remote.opened = True
            remote.opening = (spec, settings)
            body_at = None
            full = process.full  # before the body goes in: a flow is never turned away for its own request
            if not full:
                spec, body_at = self._request_body_into_ring(process, spec)
            self._op(shard, (OPEN, remote.key, spec, settings, remote.t0, body_at))
            if full:
                # a worker that is behind gets none of a new flow's reads, but records that it got none
                self._fall_behind(remote, " (its worker was busy)")
        # held until its verdict; only once nothing above raised (the Tap then leaves the flow
        # untapped, and no end would ever take it out, keeping a retired pool's worker for good)
        self.flows[remote.key] = remote
        return remote

    @staticmethod
    def _request_body_into_ring(process: _Process, spec) -> tuple[Any, tuple[int, int, int] | None]:
        """A large request body copied into the worker's ring: the spec without it, and where it
        is (at, length, ring bytes charged). The OPEN that says so is the next op, so the worker
        acknowledges it in the order it went in, as it does reads. Where the ring has no room, or
        the body would take the room new flows' reads need (``full``), it stays in the spec and goes
        through the pipe."""
        parted, raw = spec.request_body_apart()
        if raw is None or len(raw) < BODY_IN_RING:
            return spec, None
        occupied = -(-(len(raw) + SLOT) // SLOT) * SLOT
        if process.space.in_flight + occupied > MAX_IN_FLIGHT - SEND_BYTES:
            return spec, None
        at = process.put([raw], occupied)
        if at is None:
            return spec, None
        return parted, (at, len(raw), occupied)

    def stream(self, remote: RemoteFlow) -> Callable[[bytes], bytes]:
        """The flow's stream callable: it hands each read on unchanged and keeps it, with its
        arrival time, for the next batch.

        It does as little as it can, on the loop that carries all the traffic: no arithmetic on
        the time (the worker makes it relative to the flow's start), no check whether the flow was
        dropped (the batch throws its reads away), and only large reads are counted. What the
        proxy holds between batches is at most SEND_BYTES of large reads and SEND_EVERY of small ones."""
        keep, note = remote.chunks.append, remote.times.append
        queue, count = self._queue, self._count

        def stream(data: bytes) -> bytes:
            try:
                keep(data)
                now = monotonic()
                note(now)
                if not remote.queued:
                    queue(remote, now)
                if len(data) > LARGE_READ:
                    count(len(data))
            except Exception:  # nothing above raises; this is the last line of defence
                remote.dropped = remote.dropped or "streamtap could not hand this flow to its worker"
            return data

        return stream

    def _queue(self, remote: RemoteFlow, now: float) -> None:
        """The flow's first read since the last batch: it goes in the next one."""
        remote.queued = remote.called = True
        self.queued.append(remote)
        if self.timer is None and not self.scheduled:
            # a read after a quiet spell goes at the end of this loop turn, so the worker
            # analyses it before the next one comes; under load, one batch per SEND_EVERY
            wait = self.sent_at + SEND_EVERY - now
            if wait <= 0:
                self._send_soon()
            else:
                self.timer = self.loop.call_later(wait, self.send)

    def _count(self, size: int) -> None:
        self.queued_bytes += size
        if self.queued_bytes > SEND_BYTES:
            self._send_soon()

    def finish(self, remote: RemoteFlow, end: str, error: str | None, fault: str | None, undelivered: int = 0) -> None:
        remote.ended = time.monotonic()
        remote.end, remote.error, remote.fault = end, error, fault
        t = remote.ended - remote.t0
        if remote.reopened:  # the worker that records it closes its recording; the verdict is lost() once it did
            self._op(remote.shard, (FINISH, remote.key, end, error, fault, t, undelivered))
            return
        if remote.dropped is not None and remote.dropped != FELL_BEHIND:  # its verdict is unknown, whatever the worker says
            remote.opening = None
            if remote.opened and remote.generation == self.generations[remote.shard]:
                # the worker closes its recording; the verdict is lost() once it did, naming the finished file
                remote.verdict_lost = True
                self._op(remote.shard, (BEHIND, remote.key, remote.sent, remote.dropped))
                self._op(remote.shard, (FINISH, remote.key, end, error, fault, t, undelivered))
                return
            self.flows.pop(remote.key, None)
            self.lost(remote, remote.dropped)
            return
        if remote.queued:
            self._hand_on(remote)
        self._op(remote.shard, (FINISH, remote.key, end, error, fault, t, undelivered))

    def send(self) -> None:
        """Every flow's new reads and every waiting operation: one batch per worker.

        Reads are copied into the ring only here (and in ``finish``, just before its FINISH op; a
        large request body in ``open``, just before its OPEN op), so a batch covers every byte put
        in the ring since the one before: the worker acknowledges whole batches, so what it
        acknowledged is always the oldest part of the ring."""
        self.scheduled = False
        self.sent_at = time.monotonic()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queued_bytes = 0
        queued, self.queued = self.queued, []
        for remote in queued:
            if remote.queued:
                self._hand_on(remote)
        for index, ops in enumerate(self.ops):
            process = self.processes[index]
            if ops and process.alive:  # else they wait for the worker's restart (notes for its recordings)
                self.ops[index] = []
                if self.notes_unsent[index]:
                    self.notes_unsent[index] = 0
                    process.notes += [op for op in ops if op[0] == ORPHANED]
                process.send(ops)

    def hand_on_now(self, remote: RemoteFlow) -> None:
        """The flow's reads kept since the last batch go to its worker now, ahead of a change to the
        flow (its analysis dropped from here on)."""
        if remote.queued:
            self._hand_on(remote)

    def _hand_on(self, remote: RemoteFlow) -> None:
        """The flow's reads since the last batch: copied into its worker's ring, and said so in
        the next batch. A flow whose reads do not fit is dropped from analysis instead."""
        remote.queued = False
        chunks, times = remote.chunks, remote.times
        if remote.dropped is not None:
            remote.discard_reads()
            return
        if not chunks:
            return
        reads = chunks
        if b"" in chunks:  # mitmproxy's call at the end of the body: not a read
            times = [t for chunk, t in zip(chunks, times) if chunk]
            reads = [chunk for chunk in chunks if chunk]
            if not reads:
                remote.discard_reads()
                return
        else:
            times = times[:]  # the stream callable goes on appending to the flow's lists
        sizes = list(map(len, reads))
        size = sum(sizes)
        if len(reads) > 1 and size < JOIN_BELOW * len(reads):
            reads = [b"".join(reads)]
        remote.seen += size
        occupied = -(-(size + SLOT * len(sizes)) // SLOT) * SLOT
        process = self.processes[remote.shard]
        at = process.put(reads, occupied) if process.alive else None
        chunks.clear()
        remote.times.clear()
        if at is None:
            # the worker is behind: this flow's analysis stops here rather than the proxy's memory growing
            process.behind = True
            self._fall_behind(remote)
            return
        self.ops[remote.shard].append((DATA, remote.key, at, sizes, times, occupied))
        remote.sent += size

    def _fall_behind(self, remote: RemoteFlow, why: str = "") -> None:
        """The flow's analysis stops at the bytes handed on so far; its worker notes it in the recording."""
        remote.dropped = FELL_BEHIND
        self._op(remote.shard, (BEHIND, remote.key, remote.sent, FELL_BEHIND))
        log.warning(f"streamtap: flow {remote.flow_id[:8]}: {FELL_BEHIND} at byte {remote.sent}{why}; traffic passes on untouched")

    def _op(self, shard: int, op: tuple) -> None:
        self.ops[shard].append(op)
        self._send_soon()

    def _note(self, shard: int, remote: RemoteFlow, why: str) -> None:
        """Worker ``shard`` is to note in the recording ``remote``'s dead worker left why it stops."""
        self.notes_unsent[shard] += 1
        self._op(shard, (ORPHANED, remote.recording, why, remote.directory, remote.started, remote.flow_id))

    def _send_soon(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.send)

    # what the workers say ----------------------------------------------------------
    def _received(self, process: _Process, message) -> None:
        if process is not self.processes[process.index]:
            return  # an old process's last words
        process.heard = time.monotonic()
        consumed, results, records, *busy = message  # (busy: said inside a long batch whose work moves)
        if consumed or results or busy:
            process.progressed = process.heard
        if consumed:
            process.space.acknowledge(consumed)
            process.behind = False
        for level, text in records:
            log.log(level, text)
        for kind, key, value in results:
            if kind == VERDICT:
                remote = self.flows.pop(key, None)
                if remote is None:
                    continue
                remote.opening = None
                if remote.reopened or remote.verdict_lost:  # its analysis was lost: the verdict only names the recording
                    remote.recording = value.get("recording") or remote.recording
                    self.lost(remote, remote.dropped or "")
                    continue
                if remote.dropped is not None:  # the worker saw only part of the body: count what was forwarded
                    value["bytes"] = remote.forwarded()
                self.verdict(remote, value)
            elif kind == FAILED:  # its analysis raised: judged unknown at once, with the reason
                remote = self.flows.pop(key, None)
                if remote is not None:
                    remote.opening = None
                    self.lost(remote, remote.dropped if remote.reopened and remote.dropped else value)
            elif kind == NOTED:
                del process.notes[:value]
            elif key is None:
                self.pids[process.index] = value
                log.info(f"streamtap: analysis worker {process.index} runs as pid {value}")
            else:
                remote = self.flows.get(key)
                if remote is not None:
                    remote.recording, remote.model, remote.provider = value
                    remote.opening = None  # taken: should the worker die now, the next one notes the recording it began

    def _died(self, process: _Process) -> None:
        if process is not self.processes[process.index] or not process.alive:
            return
        index = process.index
        process.alive = False
        process.process.join(0.2)  # it closed its pipe exiting: ends at once, else free() looks again later
        process.free()
        if process.leaving:  # a retired pool's worker that took its STOP (or was killed as hung after it)
            return
        # a flow handed again to this worker, after the death of the one before, is this worker's whatever its generation
        held = [r for r in self.flows.values() if r.shard == index and (r.generation == process.generation or r.reopened)]
        quick = self.quick_deaths[index] = self.quick_deaths[index] + 1 if time.monotonic() - process.started < RESTART_QUICK else 0
        wait = _restart_wait(quick)
        if self.retired:
            restart = ""  # it takes no new flows: the flows it held are all it had
        else:
            restart = f"; restarting it{f' in {wait:g} s (it died {quick} times in a row within {RESTART_QUICK:g} s of its start)' if wait else ''}"
        log.warning(
            f"streamtap: analysis worker {index} (pid {process.pid}) died (exit code {process.exitcode}){restart}; "
            f"{len(held)} flow(s) lose their analysis"
        )
        # what waited for the dead process was for it alone, but for the notes for recordings the one
        # before it left: those, and the ones it was sent but did not say it wrote, go to the next
        notes = process.notes + [op for op in self.ops[index] if op[0] == ORPHANED]
        self.ops[index] = notes
        self.notes_unsent[index] = len(notes)
        self.generations[index] += 1  # the dead one's flows get no more operations, even while its restart waits
        if not self.retired:
            self._restart_after(index, wait)
        for remote in held:
            again = remote.reopened or remote.verdict_lost  # this worker only recorded it: the reason given stays
            remote.reopened = False
            if not again:
                remote.dropped = f"streamtap's analysis worker died after it was handed {remote.sent} bytes of this stream"
            remote.discard_reads()
            if not again and self._reopen(remote, index):
                continue
            remote.opening = None
            if not again and remote.ended is not None and remote.recording and remote.directory:
                self._verdict_from_recording(remote, index)  # it may have finished the recording before it died
                continue
            if remote.recording or (remote.opened and remote.directory):  # the new worker notes it in the recording the dead one left
                self._note(index, remote, f"{remote.dropped}; the recording ends where it stopped")
            if remote.ended is not None:  # its verdict will not come
                self.flows.pop(remote.key, None)
                self.lost(remote, remote.dropped)
        if self.retired:  # no worker comes after it to write them
            self._write_notes(index)

    def _verdict_from_recording(self, remote: RemoteFlow, index: int) -> None:
        """A flow that had ended when its worker died: the worker may have finished its recording
        (end line, rename) and died before its verdict came. The recording's end line is then the
        verdict; else the flow is lost and the next worker notes why its recording stops. The
        look goes to a thread: a compressed recording is read whole to find its end."""
        self.flows.pop(remote.key, None)
        why = f"{remote.dropped}; the recording ends where it stopped"

        def looked(future) -> None:
            try:
                found = future.result()
            except Exception:
                found = None
            take(found)

        def take(found: tuple[str, dict[str, Any]] | None) -> None:
            if found is None:
                self._note(index, remote, why)
                if self.retired:
                    self._write_notes(index)
                self.lost(remote, remote.dropped)
                return
            path, end = found
            remote.recording = path
            log.info(f"streamtap: flow {remote.flow_id[:8]}: its verdict is taken from the recording {path}, finished before its worker died")
            self.verdict(remote, summary_of_end(remote, path, end))

        try:
            look = self.loop.run_in_executor(None, _finished_recording, remote.recording, remote.directory, remote.started, remote.flow_id)
        except RuntimeError:  # the loop is closing: no thread to look in, and no callback would run
            take(None)
            return
        look.add_done_callback(looked)

    def _reopen(self, remote: RemoteFlow, index: int) -> bool:
        """A flow whose worker died before it said it had begun its recording (a worker stopped or
        hung takes no work, then dies): handed to the worker that takes its place, which notes
        the recording the dead one began or makes one, without the flow's bytes, with the note.
        Its verdict is lost() once that worker answers. Once only: a flow whose OPEN kills its
        worker must not kill the next ones too. False where no worker will come after it."""
        if remote.opening is None or not remote.directory or self.retired:
            return False
        spec, settings = remote.opening
        remote.opening = None
        remote.reopened = True
        self._op(index, (REOPEN, remote.key, spec, settings, remote.t0, remote.dropped))
        if remote.ended is not None:
            # (its verdict is lost() whatever the worker says: no count of undelivered bytes to pass)
            self._op(index, (FINISH, remote.key, remote.end, remote.error, remote.fault, remote.ended - remote.t0, 0))
        return True

    def _write_notes(self, index: int) -> None:
        """The notes meant for worker ``index``'s recordings, written here: no worker will take them.
        A flow handed to it again gets the note in the recording the dead worker began, if it began
        one, and its verdict at once."""
        for op in self.ops[index]:
            if op[0] == ORPHANED:
                _note_orphaned(*op[1:])
            elif op[0] == REOPEN:
                _, key, spec, settings, _t0, dropped = op
                _note_orphaned(None, f"{dropped}; the recording ends where it stopped", settings["directory"], spec.started, spec.flow_id)
                remote = self.flows.get(key)
                if remote is not None:
                    remote.reopened = False
                    if remote.ended is not None:
                        del self.flows[key]
                        self.lost(remote, dropped)
        self.ops[index] = []
        self.notes_unsent[index] = 0

    def _restart_after(self, index: int, wait: float) -> None:
        if wait:
            self.restarts[index] = self.loop.call_later(wait, self._restart, index)
        else:
            self._restart(index)

    def _restart(self, index: int) -> None:
        self.restarts[index] = None
        if self.stopping or self.retired:
            return
        try:
            self.processes[index] = self._start(index)
        except Exception as exc:  # its flows go unanalysed meanwhile; the traffic does not notice
            self.quick_deaths[index] = max(2, self.quick_deaths[index] + 1)
            wait = _restart_wait(self.quick_deaths[index])
            log.error(f"streamtap: cannot restart analysis worker {index}: {type(exc).__name__}: {exc}; trying again in {wait:g} s")
            self._restart_after(index, wait)
            return
        if self.ops[index]:  # notes for the recordings the dead one left
            self._send_soon()

    def expire(self) -> None:
        """Called every EXPIRE_EVERY. A worker silent for HUNG_AFTER is hung: it is killed, and
        restarted as any dead worker is. A flow whose verdict has not come VERDICT_WAIT after its
        end is given up on once its worker has also taken no work for that long (one behind, on a
        slow disk say, gets to it in turn), and after VERDICT_WAIT_BUSY whatever the worker does."""
        now = time.monotonic()
        for process in self.processes:
            limit = HUNG_AFTER if process.heard > process.started else START_WAIT
            if process.alive and not process.killed and now - process.heard > limit:
                log.warning(
                    f"streamtap: analysis worker {process.index} (pid {process.pid}) "
                    f"has said nothing for {now - process.heard:.0f} s: hung; killing it"
                )
                process.killed = True
                process.process.kill()
            elif process.alive:
                process.release(now)
        deadline = now - VERDICT_WAIT
        for remote in [r for r in self.flows.values() if r.ended is not None and r.ended < deadline]:
            process = self.processes[remote.shard]
            if process.alive and now - process.progressed < VERDICT_WAIT and now - remote.ended < VERDICT_WAIT_BUSY:
                continue  # its worker is behind, not stuck: this flow's verdict comes in its turn
            del self.flows[remote.key]
            remote.opening = None
            if remote.reopened and remote.dropped:  # its analysis was lost with a dead worker, which says more
                self.lost(remote, remote.dropped)
            else:
                waited = now - remote.ended
                self.lost(remote, f"no verdict from streamtap's analysis worker within {waited:.0f} s of the end, "
                                  f"the last {now - process.progressed:.0f} s without its taking any work")
        if self.retired:
            self._leave_idle()

    def retire(self) -> None:
        """Take no new flows (``streamtap_workers`` changed; another pool takes them). Each worker
        is stopped once the flows it holds have their verdicts (at once, if it holds none), and a
        worker that dies is not restarted. Never waits."""
        self.retired = True
        for index, restart in enumerate(self.restarts):
            if restart is not None:  # the worker it was to start would only have written these notes
                restart.cancel()
                self.restarts[index] = None
                self._write_notes(index)
        self._leave_idle()

    @property
    def gone(self) -> bool:
        """Retired, and every worker has exited."""
        return self.retired and not any(process.alive for process in self.processes)

    def _leave_idle(self) -> None:
        """A retired pool's workers that hold no flow are sent what waits for them, then STOP,
        without waiting: each one's reader thread reports its exit, and one that does not exit is
        found hung."""
        busy = {remote.shard for remote in self.flows.values()}
        idle = [process for process in self.processes if process.alive and not process.leaving and process.index not in busy]
        if not idle:
            return
        self.send()
        for process in idle:
            process.leaving = True
            process.send([(STOP,)])

    def stop(self, timeout: float = 3.0, starting: float | None = None) -> None:
        """Every worker stops within ``timeout``; one still starting (it has not said its first word)
        that holds flows within ``starting`` if given: it has the recordings of flows that ended
        just before, which a worker killed before it was up would never write."""
        stop_pools([self], timeout, starting)

    def _stop_deadlines(self, now: float, timeout: float, starting: float | None) -> list[tuple[_Process, float, bool]]:
        """The pool takes nothing more and sends what waits; each worker with the time by which it
        must have stopped, and whether it is still starting with flows to record."""
        self.stopping = True
        for restart in self.restarts:
            if restart is not None:
                restart.cancel()
        self.send()
        for index in range(len(self.ops)):  # what is left was for a worker whose restart waited
            self._write_notes(index)
        deadline = now + timeout
        holding = {remote.shard for remote in self.flows.values()}
        late = {process.index for process in self.processes if process.index in holding and not process.spoke}
        late_deadline = now + max(timeout, starting or 0.0)
        if late and late_deadline > deadline:
            held = sum(remote.shard in late for remote in self.flows.values())
            log.info(f"streamtap: waiting up to {starting:.0f} s for analysis worker(s) still starting, "
                     f"to record the {held} flow(s) they hold")
        return [(process, late_deadline if process.index in late else deadline, process.index in late) for process in self.processes]


def stop_pools(pools: list[Workers], timeout: float = 3.0, starting: float | None = None) -> None:
    """Every worker of every pool stops (``Workers.stop``), all against one deadline: a busy or
    stuck worker does not hold the others' stop (one after another, 64 stuck workers took 192 s,
    and two pools each with a worker still starting twice the wait for one)."""
    now = time.monotonic()
    stopping = []
    for pool in pools:
        try:
            stopping += [(pool, process, deadline, late) for process, deadline, late in pool._stop_deadlines(now, timeout, starting)]
        except Exception as exc:  # the other pools still stop
            log.warning(f"streamtap: analysis workers at shutdown: {type(exc).__name__}: {exc}")
    # the workers that are up first: a late one's pipe may stay full until it is up and reads, and
    # writing it waits up to its deadline, which without ``starting`` is everyone's
    stopping.sort(key=lambda item: (item[3], item[2]))
    for _, process, deadline, _ in stopping:
        process.tell_stop(deadline)
    for pool, process, deadline, _ in stopping:
        try:
            process.wait_stopped(deadline)
            # the verdicts of flows that ended just before: the loop will not run again to take them
            process.take_replies(pool._received)
        except Exception as exc:
            log.warning(f"streamtap: analysis worker {process.index}: at shutdown: {type(exc).__name__}: {exc}")
