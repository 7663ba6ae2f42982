"""Per-event cost of streamtap's proxy path, in-process: where the microseconds go.

    .venv/bin/python bench/tap_profile.py [--mb 4] [--profile sse|es|sse128|es128]

Feeds the bench/proxy.py workloads to the same objects the addon uses, the way the addon
uses them, and prints microseconds per event for each layer added in turn:

  decoder     the wire decoder alone
  session     StreamSession (decoder + dialect assembler + session bookkeeping)
  +writer     session + RecordingWriter (read line, frame lines, flush every 0.1 s)
  flowtap     the Tap's per-flow object, FlowTap.arrived() per chunk with no event loop
              (what the stream callable does, minus mitmproxy), recording on, fsync=end:
              every chunk analysed on its own
  flowtap/64K the same with a stand-in event loop turning once per 64 KiB of chunks, as
              mitmdump does (one socket read's HTTP chunks, then the deferred analysis)

The first four layers feed one chunk at a time; "flowtap/64K" is not cumulative with them.

``--profile`` runs cProfile over the flowtap layer for one workload and prints the top
functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
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


def run_decoder(name: str, chunks: list[bytes], tmp: Path) -> None:
    decoder = (SSEDecoder if WORKLOADS[name][1] == "sse" else EventStreamDecoder)()
    for chunk in chunks:
        decoder.feed(chunk)
    decoder.close()


def run_session(name: str, chunks: list[bytes], tmp: Path) -> None:
    dialect, wire = WORKLOADS[name][:2]
    session = StreamSession(dialect, wire)
    t0 = time.monotonic()
    for chunk in chunks:
        session.feed(chunk, time.monotonic() - t0)
    session.close()


def run_writer(name: str, chunks: list[bytes], tmp: Path) -> None:
    dialect, wire = WORKLOADS[name][:2]
    session = StreamSession(dialect, wire)
    writer = RecordingWriter(tmp / f"w-{time.monotonic_ns()}.jsonl")
    writer.header({"request": {"method": "POST", "url": "http://x/", "headers": []}})
    t0 = time.monotonic()
    flushed = 0.0
    for chunk in chunks:
        t = time.monotonic() - t0
        t_ms = round(t * 1000, 3)
        writer.read(chunk, t_ms)
        for event in session.feed(chunk, t):
            writer.frame(event, t_ms)
        if t - flushed >= 0.1:
            writer.flush()
            flushed = t
    analysis = session.close()
    for event in analysis.events:
        writer.frame(event, None)
    writer.finish({"verdict": analysis.verdict.to_dict()})


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


def run_flowtap(name: str, chunks: list[bytes], tmp: Path) -> None:
    from streamtap.mitm.tap import FlowTap
    from streamtap.providers import StreamEnd

    tap = FlowTap(
        make_flow(name), directory=str(tmp), fsync="end", redact=(), sentinel=None, max_event_size=16 << 20, record=True
    )
    for chunk in chunks:
        tap.arrived(chunk, None)
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "complete", summary


class TurnLoop:
    """Stands in for the event loop: the Tap's deferred analysis runs once per socket read."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def call_soon(self, callback) -> None:
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def run_flowtap_loop(name: str, chunks: list[bytes], tmp: Path) -> None:
    """As mitmdump drives it: the HTTP chunks of one 64 KiB socket read reach the stream
    callable in one event-loop turn, and the analysis callback runs after them."""
    from streamtap.mitm.tap import FlowTap
    from streamtap.providers import StreamEnd

    tap = FlowTap(
        make_flow(name), directory=str(tmp), fsync="end", redact=(), sentinel=None, max_event_size=16 << 20, record=True
    )
    loop = TurnLoop()
    read = 0
    for chunk in chunks:
        tap.arrived(chunk, loop)
        read += len(chunk)
        if read >= SOCKET_READ:
            loop.run()
            read = 0
    loop.run()
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "complete", summary


SOCKET_READ = 65536
LAYERS = {
    "decoder": run_decoder,
    "session": run_session,
    "+writer": run_writer,
    "flowtap": run_flowtap,
    "flowtap/64K": run_flowtap_loop,
}


def best_of(fn, name, chunks, tmp, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(name, chunks, tmp)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4, help="body size in MB (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per figure, the best is kept (default 3)")
    parser.add_argument("--profile", choices=list(WORKLOADS), help="cProfile the flowtap layer on this workload")
    parser.add_argument("--loop", action="store_true", help="with --profile: the flowtap/64K layer")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if args.profile:
            chunks, count = chunks_for(args.profile, args.mb)
            profiler = cProfile.Profile()
            profiler.enable()
            (run_flowtap_loop if args.loop else run_flowtap)(args.profile, chunks, tmp_path)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return 0
        print(f"bench/tap_profile.py: {args.mb} MB bodies, best of {args.rounds}; microseconds per wire event "
              "(cumulative: each layer includes the ones above it)")
        print(f"{'workload':10} {'events':>7} {'chunks':>7} " + " ".join(f"{layer:>11}" for layer in LAYERS))
        for name in WORKLOADS:
            chunks, count = chunks_for(name, args.mb)
            figures = [best_of(fn, name, chunks, tmp_path, args.rounds) / count * 1e6 for fn in LAYERS.values()]
            print(f"{name:10} {count:7} {len(chunks):7} " + " ".join(f"{f:11.2f}" for f in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
