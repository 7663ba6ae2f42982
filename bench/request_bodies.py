"""What a flow's request body costs the proxy's loop: through the worker's ring (as shipped) against
through its pipe (pickled into the flow's OPEN, as before), one run.

    .venv/bin/python bench/request_bodies.py [--rounds 7] [--flows 40] [--kib 1 100 1024]

In this process, with a real analysis worker: for each prompt size, every round opens ``--flows``
flows of a streamed Chat Completions call with that prompt each way, the two ways interleaved (the
order alternating between rounds). A flow is what the proxy's loop does for it: open (the spec, the
body into the ring or the pipe), one read, its batch, finish and the last batch; its CPU is this
thread's (``time.thread_time``), so the worker and the thread that reads its replies are not in it.
Each flow waits for its verdict before the next, as one client after another. Printed: each way's
median CPU per flow and range, and pipe / ring within each round, median and range. Under
``BODY_IN_RING`` bytes both ways take the pipe, so that row shows the noise of the measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addon"))

from mitmproxy.test import tflow  # noqa: E402

import streamtap.mitm.worker as worker  # noqa: E402
from streamtap.mitm.flowspec import FlowSpec  # noqa: E402

ANSWER = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
SETTINGS = dict(directory=None, fsync="never", redact=[], redact_allow=[], sentinel=None,
                max_event_size=1 << 20, record=False, compress="none")  # fmt: skip
WAYS = {"ring": worker.BODY_IN_RING, "pipe": 1 << 62}  # the body size from which it goes through the ring


def prompted_flow(kib: int):
    flow = tflow.tflow(resp=True)
    flow.request.host, flow.request.path, flow.request.method = "api.openai.com", "/v1/chat/completions", "POST"
    messages = [{"role": "user", "content": "x" * (kib * 1024)}]
    flow.request.content = json.dumps({"model": "m", "stream": True, "messages": messages}).encode()
    flow.response.headers["content-type"] = "text/event-stream"
    return flow


async def measure(kib: int, rounds: int, flows: int) -> dict[str, list[float]]:
    """Per way, the CPU per flow of each round (µs); and "ratio", pipe / ring of each round."""
    verdicts: list = []
    workers = worker.Workers(1, asyncio.get_running_loop(), verdict=lambda *a: verdicts.append(a), lost=lambda *a: verdicts.append(a))
    flow = prompted_flow(kib)
    results: dict[str, list[float]] = {"ring": [], "pipe": [], "ratio": []}
    try:
        for number in range(rounds):
            for way in (list(WAYS) if number % 2 == 0 else list(WAYS)[::-1]):
                worker.BODY_IN_RING = WAYS[way]
                spent = 0.0
                for _ in range(flows):
                    spec = FlowSpec.of(flow, None)
                    before, count = time.thread_time(), len(verdicts)
                    remote = workers.open(spec, SETTINGS)
                    workers.stream(remote)(ANSWER)
                    workers.send()
                    workers.finish(remote, "finished", None, None)
                    workers.send()
                    spent += time.thread_time() - before
                    deadline = time.monotonic() + 30
                    while len(verdicts) == count:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"no verdict from the worker within 30 s ({way}, {kib} KiB)")
                        await asyncio.sleep(0.001)
                results[way].append(spent / flows * 1e6)
            results["ratio"].append(results["pipe"][-1] / results["ring"][-1])
    finally:
        worker.BODY_IN_RING = WAYS["ring"]
        workers.stop()
    return results


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="rounds, each way once per round (default 7, at least 5)")
    parser.add_argument("--flows", type=int, default=40, help="flows each way per round (default 40)")
    parser.add_argument("--kib", type=int, nargs="+", default=[1, 100, 1024], help="prompt sizes in KiB (default 1 100 1024)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer ratios says little)")
    if args.flows < 1 or any(kib < 0 for kib in args.kib):
        parser.error("--flows must be at least 1 and --kib sizes at least 0")
    print(f"bench/request_bodies.py: {args.rounds} rounds of {args.flows} flows each way; CPU of the proxy's loop per flow, µs")
    print(f"{'prompt':>10}  {'through the ring':>22}  {'through the pipe':>22}  {'pipe / ring':>20}")
    for kib in args.kib:
        results = asyncio.run(measure(kib, args.rounds, args.flows))
        print(f"{kib:>6} KiB  {spread(results['ring'], 0):>22}  {spread(results['pipe'], 0):>22}  {spread(results['ratio'], 2) + 'x':>20}")
    return 0


if __name__ == "__main__":  # the analysis worker is spawned: it imports this file, and must not run it
    sys.exit(main())
