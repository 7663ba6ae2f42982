"""Per-event cost of streamtap's proxy path, in-process: where the microseconds go.

    .venv/bin/python bench/tap_profile.py [--mb 4] [--profile sse|es|sse128|es128 [--turn BYTES]]

Feeds the bench/proxy.py workloads to the objects the addon uses, the way the addon uses
them, and prints microseconds per wire event for each layer added in turn:

  decoder   the wire decoder alone
  session   StreamSession (decoder + dialect assembler + session bookkeeping)
  +writer   session + RecordingWriter (reads line, frame lines, flush every 0.1 s)
  flowtap   the Tap's per-flow object: FlowTap.arrived() per chunk, its deferred analysis
            run once per event-loop turn (what the stream callable does, minus mitmproxy),
            recording on, fsync=end

Twice: with one read per event-loop turn (a slow stream), and with 64 KiB of reads per
turn, as mitmdump delivers a fast stream (every HTTP chunk of one socket read in one turn).

Same-round harness: in each round every layer runs once on the same chunks, back to back
(the order rotating between rounds), timed in CPU time of this process; what a layer adds is
its time minus the layer below it in the same round, and its share is that over the flowtap
time of the same round. At least 5 rounds; the median and range over the rounds are printed,
so machine load, which hits all layers of a round alike, moves the shares little.
``--profile`` runs cProfile over the flowtap layer for one workload and prints the top
functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "addon"))
sys.path.insert(0, str(REPO / "bench"))

from proxy import eventstream_events, sse_events  # noqa: E402

from streamtap.providers import Dialect, StreamSession  # noqa: E402
from streamtap.recording import RecordingWriter  # noqa: E402
from streamtap.wire import EventStreamDecoder, SSEDecoder  # noqa: E402

WORKLOADS = {
    # name: (dialect, wire, content type, URL path, events per chunk)
    "sse": (Dialect.OPENAI_CHAT, "sse", "text/event-stream", "/v1/chat/completions", 1),
    "es": (Dialect.BEDROCK_CONVERSE, "eventstream", "application/vnd.amazon.eventstream", "/model/m/converse-stream", 1),
    "sse128": (Dialect.OPENAI_CHAT, "sse", "text/event-stream", "/v1/chat/completions", 128),
    "es128": (Dialect.BEDROCK_CONVERSE, "eventstream", "application/vnd.amazon.eventstream", "/model/m/converse-stream", 128),
}


def chunks_for(name: str, megabytes: float) -> tuple[list[bytes], int]:
    per = WORKLOADS[name][4]
    events = sse_events(megabytes) if WORKLOADS[name][1] == "sse" else eventstream_events(megabytes)
    return [b"".join(events[i : i + per]) for i in range(0, len(events), per)], len(events)


def turns(chunks: list[bytes], per_turn: int) -> list[list[bytes]]:
    """The chunks grouped as one event-loop turn sees them: ``per_turn`` bytes of reads (0: one read)."""
    if not per_turn:
        return [[chunk] for chunk in chunks]
    out: list[list[bytes]] = [[]]
    size = 0
    for chunk in chunks:
        out[-1].append(chunk)
        size += len(chunk)
        if size >= per_turn:
            out.append([])
            size = 0
    return [group for group in out if group]


def run_decoder(name: str, groups: list[list[bytes]], tmp: Path) -> None:
    decoder = (SSEDecoder if WORKLOADS[name][1] == "sse" else EventStreamDecoder)()
    for group in groups:
        decoder.feed(group[0] if len(group) == 1 else b"".join(group))
    decoder.close()


def run_session(name: str, groups: list[list[bytes]], tmp: Path) -> None:
    dialect, wire = WORKLOADS[name][:2]
    session = StreamSession(dialect, wire, keep_arrivals=False)
    t0 = time.monotonic()
    for group in groups:
        t = time.monotonic() - t0
        session.feed_reads(group, [t] * len(group))
    session.close()


def run_writer(name: str, groups: list[list[bytes]], tmp: Path) -> None:
    dialect, wire = WORKLOADS[name][:2]
    session = StreamSession(dialect, wire, keep_arrivals=False)
    writer = RecordingWriter(tmp / f"w-{time.monotonic_ns()}.jsonl")
    writer.header({"request": {"method": "POST", "url": "http://x/", "headers": []}})
    t0 = time.monotonic()
    flushed = 0.0
    for group in groups:
        t = time.monotonic() - t0
        t_ms = [round(t * 1000, 3)] * len(group)
        writer.reads(group, t_ms)
        events, brought_by = session.feed_reads(group, [t] * len(group))
        writer.frames(events, [t_ms[i] for i in brought_by])
        if t - flushed >= 0.1:
            writer.flush()
            flushed = t
    analysis = session.close()
    writer.frames(analysis.events, [None] * len(analysis.events))
    writer.finish({"stream_end": "finished", "verdict": analysis.verdict.to_dict()})


def make_flow(name: str):
    from mitmproxy.test import tflow

    dialect, wire, content_type, path = WORKLOADS[name][:4]
    flow = tflow.tflow(resp=True)
    flow.request.host = "127.0.0.1"
    flow.request.path = path
    flow.request.method = "POST"
    flow.request.headers["content-type"] = "application/json"
    flow.request.content = b'{"model":"m","stream":true,"messages":[]}'
    flow.response.headers.clear()
    flow.response.headers["content-type"] = content_type
    return flow


class TurnLoop:
    """Stands in for the event loop: the Tap's deferred analysis runs once per turn."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def call_soon(self, callback) -> None:
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def run_flowtap(name: str, groups: list[list[bytes]], tmp: Path) -> None:
    """As mitmdump drives it: the HTTP chunks of one socket read reach the stream callable
    in one event-loop turn, and the deferred analysis runs after them."""
    from streamtap.mitm.flowtap import FlowTap
    from streamtap.providers import StreamEnd

    tap = FlowTap(
        make_flow(name), directory=str(tmp), fsync="end", redact=(), sentinel=None, max_event_size=16 << 20, record=True
    )
    loop = TurnLoop()
    for group in groups:
        for chunk in group:
            tap.arrived(chunk, loop)
        loop.run()
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "complete", summary


TURN_BYTES = 65536  # mitmproxy reads sockets 64 KiB at a time
LAYERS = {"decoder": run_decoder, "session": run_session, "+writer": run_writer, "flowtap": run_flowtap}


def layer_rounds(name: str, groups: list[list[bytes]], tmp: Path, rounds: int) -> list[dict[str, float]]:
    """CPU seconds of every layer in each round, the layers back to back, the order rotating."""
    order = list(LAYERS)
    for layer in order:  # one untimed run each: imports and first-use caches are not a layer's cost
        LAYERS[layer](name, groups, tmp)
    results = []
    for number in range(rounds):
        turn = order[number % len(order) :] + order[: number % len(order)]
        seconds = {}
        for layer in turn:
            start = time.process_time()
            LAYERS[layer](name, groups, tmp)
            seconds[layer] = time.process_time() - start
        results.append(seconds)
    return results


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4, help="body size in MB (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, every layer once in each (default 5, at least 5)")
    parser.add_argument("--profile", choices=list(WORKLOADS), help="cProfile the flowtap layer on this workload")
    parser.add_argument("--turn", type=int, default=TURN_BYTES,
                        help=f"with --profile: bytes of reads per event-loop turn (default {TURN_BYTES}; 0: one read)")
    args = parser.parse_args()
    if args.rounds < 5 and not args.profile:
        parser.error("--rounds: at least 5 (a median and range of fewer rounds says little)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if args.profile:
            chunks, count = chunks_for(args.profile, args.mb)
            groups = turns(chunks, args.turn)
            profiler = cProfile.Profile()
            profiler.enable()
            run_flowtap(args.profile, groups, tmp_path)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return 0
        print(f"bench/tap_profile.py: {args.mb} MB bodies, {args.rounds} rounds, every layer once per round (order "
              f"rotating), CPU time; load average {os.getloadavg()[0]:.2f} at the start. Microseconds per wire event "
              "that each layer adds to the one before it (decoder: the whole decoder), median (range) over the rounds, "
              "and its share of the flowtap time of the same round")
        for per_turn, title in ((0, "one read per event-loop turn"), (TURN_BYTES, f"{TURN_BYTES // 1024} KiB of reads per event-loop turn (as in mitmdump)")):
            print(f"\n{title}")
            print(f"{'workload':10} {'events':>7} {'chunks':>7}  " + "  ".join(f"{layer:>24}" for layer in LAYERS)
                  + f"  {'flowtap total':>20}")
            for name in WORKLOADS:
                chunks, count = chunks_for(name, args.mb)
                groups = turns(chunks, per_turn)
                results = layer_rounds(name, groups, tmp_path, args.rounds)
                cells = []
                below = None
                for layer in LAYERS:
                    added = [(r[layer] - (r[below] if below else 0.0)) / count * 1e6 for r in results]
                    share = [(r[layer] - (r[below] if below else 0.0)) / r["flowtap"] * 100 for r in results]
                    cells.append(f"{spread(added)} {statistics.median(share):3.0f}%")
                    below = layer
                total = [r["flowtap"] / count * 1e6 for r in results]
                print(f"{name:10} {count:7} {len(chunks):7}  " + "  ".join(f"{c:>24}" for c in cells) + f"  {spread(total):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
