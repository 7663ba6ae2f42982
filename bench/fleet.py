"""The fleet view's speed and the size of compressed recordings, as measured.

    .venv/bin/python bench/fleet.py [--recordings 10000] [--rounds 5] [--dir DIR]

1. Makes N recordings (default 10,000) with streamtap's own writer, the way the Tap does
   (StreamSession over 1,500-byte reads, RecordingWriter lines, the Tap's end line): the
   real captures under ../shared/fixtures (VCR cassettes; constructed streams where absent),
   one in ten cut at a random byte, start times spread over a week. Kept in --dir for reuse.
2. `streamtap index DIR --out IDX` (a fresh IDX each round, the real CLI) against the I/O
   floor: a Python loop reading every recording whole. Target: index < 10 s.
3. `streamtap report --json IDX` against `streamtap report --json DIR` (the same figures from
   the recordings). Target: report over the index < 1 s. The CLI times include Python's
   start-up and imports; the in-process time of the queries is printed too.
4. Metrics: what the Tap does per finished turn with the Metrics addon on (observers told,
   labels found, counters and histograms updated), against the Tap with no observer, per
   turn and per event at the real captures' median events per turn. Target: < 1 µs per event.
5. Compression: the real captures written as .jsonl and as .jsonl.zst, total sizes.

Pairs are interleaved in each round, ratios taken within the round, >= 5 rounds: median and
range are printed. The machine has 2 cores and is shared: figures are noisy, not rounded.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "addon"))
sys.path.insert(0, str(REPO / "tests"))

from streamtap.providers import StreamEnd, StreamSession, detect_dialect  # noqa: E402
from streamtap.recording import RecordingWriter, final_name  # noqa: E402

STREAMTAP = [str(REPO / ".venv" / "bin" / "python"), "-m", "streamtap.cli"]
READ = 1500
DAY = 86400


# --- the recordings ---------------------------------------------------------------------


def streams() -> list[tuple[str, bytes, bytes, str, int]]:
    """(url, request body, response body, content type, status) of the real captures, or
    constructed streams when ../shared/ is absent."""
    import provider_streams as ps

    found = []
    try:
        captured = ps.cassette_responses("**/cassettes/*.yaml")
    except Exception:
        captured = []
    for c in captured:
        if c.request is None or not c.body:
            continue
        found.append((c.request.url, c.request.body or b"{}", c.body, c.content_type or "text/event-stream", c.status))
    if not found:
        chat = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
        found = [
            ("https://api.openai.com/v1/chat/completions", chat, ps.openai_chat(["word "] * n), "text/event-stream", 200)
            for n in (5, 40, 200)
        ]
    return found


class Flow:
    """What recording.flow_header reads from a flow, without mitmproxy."""

    class _Headers(dict):
        def items(self, multi=False):
            return list(dict.items(self))

    def __init__(self, url: str, body: bytes, content_type: str, status: int, number: int) -> None:
        self.id = f"{number:08x}-0000-4000-8000-{number:012x}"
        request = type("Request", (), {})()
        request.raw_content, request.method, request.pretty_url, request.http_version = body, "POST", url, "HTTP/1.1"
        request.timestamp_start = 0.0
        request.headers = self._Headers({"content-type": "application/json"})
        request.get_content = lambda strict=False: body
        response = type("Response", (), {})()
        response.status_code, response.reason, response.http_version = status, "OK", "HTTP/1.1"
        response.headers = self._Headers({"content-type": content_type})
        self.request, self.response = request, response


def write_one(directory: Path, number: int, stream, started: float, cut: int | None, compress: str = "none") -> Path:
    """One recording as the Tap writes it: header, reads and frames per read, the end line."""
    from streamtap.providers import RequestInfo
    from streamtap.recording import flow_header

    url, request_body, body, content_type, status = stream
    if cut is not None:
        body = body[:cut]
    detection = detect_dialect(RequestInfo("POST", url, {}, request_body), content_type)
    session = StreamSession(detection.dialect, detection.wire, http_status=status, keep_arrivals=False)
    provider = detection.dialect.value
    writer = RecordingWriter.create(directory, started=started, provider=provider, flow_id=f"{number:012x}", fsync="never", compress=compress)
    flow = Flow(url, request_body, content_type, status, number)
    writer.header(flow_header(flow, started=started, dialect=provider, why=detection.why, sentinel=None, wire_format=detection.wire, content_encoding=None))
    t = 0.0
    for i in range(0, len(body), READ):
        chunk = body[i : i + READ]
        t += 0.004
        writer.reads([chunk], [t * 1000])
        events = session.feed(chunk, t)
        writer.frames(events, [t * 1000] * len(events))
    end = StreamEnd.UPSTREAM_RESET if cut is not None else StreamEnd.FINISHED
    analysis = session.close(end)
    for event in analysis.events:
        writer.frame(event, t * 1000)
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)
    ttft = analysis.turn.timing.first_content
    record = {"stream_end": end.value, "error": None, "duration_ms": round(t * 1000 + 3, 3), "verdict": analysis.verdict.to_dict(),
              "turn": turn, "ttft_ms": round(ttft * 1000, 3) if ttft is not None else None, "events": analysis.wire_events}
    final = writer.path.with_name(final_name(started, provider, analysis.verdict.kind.value, f"{number:012x}") + writer.suffix)
    return writer.finish(record, final)


def make_recordings(directory: Path, count: int) -> None:
    existing = len(list(directory.glob("*.jsonl")))
    if existing >= count:
        print(f"{existing} recordings in {directory} (reused)")
        return
    rng = random.Random(11)
    pool = streams()
    base = time.time() - 7 * DAY
    started_at = time.perf_counter()
    for number in range(existing, count):
        stream = pool[number % len(pool)]
        cut = rng.randrange(1, len(stream[2])) if rng.random() < 0.1 and len(stream[2]) > 1 else None
        write_one(directory, number, stream, base + number * 7 * DAY / count, cut)
    print(f"made {count - existing} recordings from {len(pool)} streams in {time.perf_counter() - started_at:.1f} s")


# --- timing -------------------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a command; its exit code is not checked (report exits 1 on a finding)."""
    cpu, started = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started, _children_cpu() - cpu


def read_all(directory: Path) -> tuple[float, float]:
    cpu, started = time.process_time(), time.perf_counter()
    for path in directory.glob("*.jsonl"):
        path.read_bytes()
    return time.perf_counter() - started, time.process_time() - cpu


def summary(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    values = [v * scale for v in values]
    return f"median {statistics.median(values):.3f} {unit} (range {min(values):.3f}–{max(values):.3f})"


def bench_index_and_report(directory: Path, rounds: int) -> None:
    from streamtap.recording import fleet

    index, floor, report_index, report_files, in_process = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="streamtap-bench-") as tmp:
        for r in range(rounds):
            out = Path(tmp) / f"idx{r}"
            index.append(timed([*STREAMTAP, "index", str(directory), "--out", str(out)]))

            def report_in_process() -> tuple[float, float]:
                con = fleet.connect()
                cpu, started = time.process_time(), time.perf_counter()
                fleet.open_index(con, out)
                fleet.report(con)
                return time.perf_counter() - started, time.process_time() - cpu

            # each pair back to back, the order alternating between rounds (the index must exist first)
            steps = [(floor, lambda: read_all(directory)), (report_index, lambda: timed([*STREAMTAP, "report", "--json", str(out)])),
                     (report_files, lambda: timed([*STREAMTAP, "report", "--json", str(directory)])), (in_process, report_in_process)]
            for into, step in steps if r % 2 == 0 else steps[::-1]:
                into.append(step())
    rows = len(list(directory.glob("*.jsonl")))

    def line(name: str, pairs: list[tuple[float, float]], target: str = "") -> str:
        return f"{name}: wall {summary([w for w, _ in pairs])}, CPU {summary([c for _, c in pairs])}{target}"

    print(f"\n{rows} recordings, {rounds} rounds (CLI times include Python start-up and imports)")
    print(line("index (CLI, fresh folder)", index, "; target < 10 s"))
    print(line("  I/O floor: every file read whole in Python", floor))
    print(f"  index / floor, wall: {summary([a[0] / b[0] for a, b in zip(index, floor)], 'x')}")
    print(line("report --json over the index (CLI)", report_index, "; target < 1 s"))
    print(line("  its queries in-process (load the index, every figure)", in_process))
    print(line("  report --json over the recordings themselves (CLI)", report_files))
    print(f"  recordings / index, wall: {summary([a[0] / b[0] for a, b in zip(report_files, report_index)], 'x')}")


def bench_metrics(rounds: int) -> None:
    from streamtap.mitm.metrics import Metrics
    from streamtap.mitm.tap import Tap

    pool = streams()
    events_per_turn = []
    for url, request_body, body, content_type, status in pool:
        from streamtap.providers import RequestInfo

        detection = detect_dialect(RequestInfo("POST", url, {}, request_body), content_type)
        session = StreamSession(detection.dialect, detection.wire, http_status=status)
        session.feed(body)
        events_per_turn.append(session.close().wire_events)
    events = statistics.median(events_per_turn)
    summaries = [
        {"provider": p, "model": m, "verdict": v, "stream_end": "finished", "ttft_ms": 120.5, "duration_ms": 2300.0,
         "bytes": 20000, "events": int(events), "usage": {"input": 40, "output": 300, "cache_read": None}, "errors": []}
        for p in ("openai-chat", "anthropic") for m in ("gpt-a", "claude-b", "gpt-c") for v in ("complete", "truncated")
    ]
    flow = Flow("https://api.openai.com/v1/chat/completions", b"{}", "text/event-stream", 200, 1)
    bare = Tap()
    on = Tap()
    metrics = Metrics(on)
    on.observers.append(metrics)
    turns = 20000
    costs, base_costs = [], []
    pair = ((bare, base_costs), (on, costs))
    for r in range(rounds):
        for tap, out in pair if r % 2 == 0 else pair[::-1]:
            started = time.process_time()  # CPU time: the machine is shared, waiting is not cost
            for i in range(turns):
                tap._tell("turn_finished", flow, summaries[i % len(summaries)])
            out.append((time.process_time() - started) / turns)
    added = [c - b for c, b in zip(costs, base_costs)]
    print(f"\nmetrics per finished turn, CPU: {summary(added, 'µs', 1e6)} added (observer call, labels, counters, histograms)")
    per_event = [a / events for a in added]
    print(f"  per event at the real captures' median of {events:.0f} events per turn: {summary(per_event, 'µs', 1e6)}; target < 1 µs")
    print(f"  nothing runs per event: only a turn of {int(statistics.median(added) * 1e6)} events or fewer costs more than 1 µs per event")


def bench_compression() -> None:
    pool = streams()
    with tempfile.TemporaryDirectory(prefix="streamtap-bench-") as tmp:
        plain_dir, zstd_dir = Path(tmp) / "plain", Path(tmp) / "zstd"
        started = time.time()
        body = plain = packed = 0
        for number, stream in enumerate(pool):
            body += len(stream[2])
            plain += write_one(plain_dir, number, stream, started, None).stat().st_size
            packed += write_one(zstd_dir, number, stream, started, None, compress="zstd").stat().st_size
    print(f"\ncompression over {len(pool)} real captures: bodies {body:,} B; .jsonl {plain:,} B ({plain / body:.2f}x the bodies); "
          f".jsonl.zst {packed:,} B ({packed / body:.2f}x the bodies); .jsonl / .jsonl.zst = {plain / packed:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recordings", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "streamtap-bench-fleet")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer rounds says little)")
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at the start")
    make_recordings(args.dir, args.recordings)
    bench_compression()
    bench_metrics(args.rounds)
    bench_index_and_report(args.dir, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
