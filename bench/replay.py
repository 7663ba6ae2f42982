"""Replay: fast-mode throughput, original-mode timing fidelity, sweep speed.

    .venv/bin/python bench/replay.py [--quick]

1. Throughput. A ~32 MiB Anthropic SSE recording (16 KiB network reads) is served by a real
   `streamtap serve --timing fast` process and received by curl (a C client, so the figure
   is the server's). Peers, same bytes: Python reading the body file in 64 KiB reads (page
   cache warm), curl reading it as a file:// URL (same client, no network), and a bare
   asyncio server sending it in one write (the loopback HTTP floor for a Python server).
   In each round every side runs once, back to back (the order rotating between rounds),
   and each ratio (peer wall time / replay wall time) is taken within the round; at least
   5 rounds, median and range printed.
2. Timing fidelity. A 2 s recording of 400 events 5 ms apart is served with
   `--timing original`; a raw-socket client timestamps each HTTP chunk as it arrives and
   compares each gap with the recorded gap: p50 / p99 / max of |served - recorded|. In each
   round a bare time.sleep loop over the same gaps runs next to it (the machine's scheduling
   floor at that moment); median and range over the rounds.
3. Sweep. `streamtap sweep` over 200 cut positions (events, clean style) of a 201-event
   recording with a stdlib Python client, 2 jobs (the target machine has 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from replay_streams import write_recording  # noqa: E402

from streamtap.recording import RecordingWriter  # noqa: E402
from streamtap.wire import SSEDecoder  # noqa: E402

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]


def anthropic_body(events: int, text_size: int) -> list[bytes]:
    word = ("lorem ipsum dolor sit amet " * (text_size // 27 + 1))[:text_size]
    frames = [b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_b","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":1}}}\n\n',
              b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n']  # fmt: skip
    delta = ('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}}\n\n' % word).encode()
    frames += [delta] * events
    frames += [b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
               b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}\n\n',
               b'event: message_stop\ndata: {"type":"message_stop"}\n\n']  # fmt: skip
    return frames


def write_big_recording(path: Path, frames: list[bytes], read_size: int) -> bytes:
    """A recording whose network reads are `read_size` bytes (as a proxy would see them)."""
    body = b"".join(frames)
    writer = RecordingWriter(path)
    writer.header({
        "request": {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "headers": [], "body": {"bench": True}},
        "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
        "dialect": "anthropic", "wire": {"format": "sse", "content_encoding": None},
    })  # fmt: skip
    decoder = SSEDecoder()
    for i in range(0, len(body), read_size):
        piece = body[i : i + read_size]
        t = i / len(body) * 1000.0
        writer.read(piece, t)
        for event in decoder.feed(piece):
            writer.frame(event, t)
    for event in decoder.close():
        writer.frame(event, 1000.0)
    writer.finish({"stream_end": "finished"})
    return body


class Serve:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*STREAMTAP, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit(f"streamtap serve did not start: {self.url!r}")

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def throughput(tmp: Path, quick: bool, rounds_wanted: int) -> None:
    events = 8_000 if quick else 32_000
    frames = anthropic_body(events, 900)
    rec = tmp / "big.jsonl"
    t0 = time.perf_counter()
    body = write_big_recording(rec, frames, 16 * 1024)
    raw_file = tmp / "body.bin"
    raw_file.write_bytes(body)
    mib = len(body) / 2**20
    print(f"1. throughput: {mib:.1f} MiB body, {len(frames)} events (recording written in {time.perf_counter() - t0:.1f} s)")

    def read_file() -> float:
        start = time.perf_counter()
        with open(raw_file, "rb", buffering=0) as f:
            while f.read(65536):
                pass
        return time.perf_counter() - start

    if not shutil.which("curl"):
        print("   curl is not installed: skipped")
        return
    start = time.perf_counter()
    with Serve(str(rec), "--timing", "fast") as server, BareServer(raw_file) as bare:
        loaded = time.perf_counter() - start

        def replay() -> float:
            return _curl(server.url + "/v1/messages", len(body), "-d", '{"bench": true}')

        sides = {"replay": replay, "raw": read_file, "curl file://": lambda: _curl(raw_file.as_uri(), len(body)),
                 "bare server": lambda: _curl(bare.url, len(body))}
        order = list(sides)
        for side in order:  # one untimed run each: page cache, first connections
            sides[side]()
        rounds = []
        for number in range(rounds_wanted):
            turn = order[number % len(order) :] + order[: number % len(order)]
            rounds.append({side: sides[side]() for side in turn})
    print(f"   {rounds_wanted} rounds, every side once per round (order rotating); load average {os.getloadavg()[0]:.1f} now")
    for side, what in (("raw", "raw file read (64 KiB reads)"), ("curl file://", "curl file:// of the body"),
                       ("bare server", "bare asyncio server, one write"), ("replay", "streamtap serve --timing fast")):
        print(f"   {what:<32} {_spread([mib / r[side] for r in rounds], ' MiB/s', 1)}")
    print(f"   ratio replay / raw read        {_spread([r['raw'] / r['replay'] for r in rounds], 'x', 3)}   (target >= 0.50)")
    print(f"   ratio replay / curl file://    {_spread([r['curl file://'] / r['replay'] for r in rounds], 'x', 3)}")
    print(f"   ratio replay / bare server     {_spread([r['bare server'] / r['replay'] for r in rounds], 'x', 3)}")
    print(f"   (server start + loading the {rec.stat().st_size / 2**20:.0f} MiB recording: {loaded:.2f} s, not counted)")


def _spread(values: list[float], unit: str, digits: int) -> str:
    return f"{statistics.median(values):9.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


BARE = """
import asyncio, sys
body = open(sys.argv[1], "rb").read()
async def handle(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % len(body))
    writer.write(body)
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _curl(url: str, size: int, *args: str) -> float:
    """Wall seconds for curl to fetch ``url`` (whole request)."""
    t = time.perf_counter()
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", *args, url],
                         capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - t
    assert int(out.stdout) == size, out.stdout
    return elapsed


class BareServer:
    """A bare asyncio server that sends the body in one write, kept up for all rounds."""

    def __init__(self, raw_file: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", BARE, str(raw_file)], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}/"

    def __enter__(self) -> BareServer:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def timing_fidelity(tmp: Path, rounds_wanted: int) -> None:
    frames = [b'data: {"i":%d,"text":"tok"}\n\n' % i for i in range(400)]
    rec = write_recording(tmp / "gaps.jsonl", "openai", frames, gap_ms=5.0)
    served, floor = [], []
    with Serve(str(rec), "--timing", "original") as server:
        for number in range(rounds_wanted):
            pair = [lambda: served.append(served_gap_errors(server.url, len(frames))),
                    lambda: floor.append(sleep_loop_errors(400, 0.005))]
            for run in pair if number % 2 == 0 else pair[::-1]:
                run()
    if any(errors is None for errors in served):
        print("2. timing fidelity: events went missing in a round")
        return

    def p99(errors: list[float]) -> float:
        return errors[min(len(errors) - 1, int(len(errors) * 0.99))]

    print(f"2. timing fidelity (original mode, 400 events 5 ms apart; {rounds_wanted} rounds, each next to a bare "
          f"time.sleep loop over the same gaps; load average {os.getloadavg()[0]:.1f} now):")
    for label, runs in (("served |gap error|", served), ("sleep loop |gap error|", floor)):
        print(f"   {label:<24} p50 {_spread([statistics.median(e) for e in runs], ' ms', 3)}   "
              f"p99 {_spread([p99(e) for e in runs], ' ms', 3)}   max {_spread([e[-1] for e in runs], ' ms', 3)}")
    print("   (target: served p99 < 2 ms; the sleep loop is the machine's scheduling floor in the same round)")


def served_gap_errors(url: str, count: int) -> list[float] | None:
    """Sorted |served gap - 5 ms| in ms, from a raw-socket client timestamping each event."""
    host, port = url.removeprefix("http://").split(":")
    request = json.dumps({"model": "gpt-4.1-nano", "stream": True, "messages": [{"role": "user", "content": "Weather in Paris?"}]}).encode()
    arrivals: list[float] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%b" % (len(request), request))
        buf = b""
        seen = 0
        while True:
            data = sock.recv(65536)
            now = time.perf_counter()
            if not data:
                break
            buf += data
            found = buf.count(b"data: {")
            arrivals += [now] * (found - seen)
            seen = found
            if buf.endswith(b"\r\n0\r\n\r\n"):
                break
    if len(arrivals) != count:
        return None
    return sorted(abs((b - a) - 0.005) * 1000 for a, b in zip(arrivals, arrivals[1:]))


def sleep_loop_errors(count: int, gap: float) -> list[float]:
    start = time.perf_counter()
    arrivals = []
    for i in range(count):
        delay = start + i * gap - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        arrivals.append(time.perf_counter())
    return sorted(abs((b - a) - gap) * 1000 for a, b in zip(arrivals, arrivals[1:]))


CLIENT = """
import http.client, os, sys, urllib.parse
u = urllib.parse.urlsplit(os.environ["STREAMTAP_BASE_URL"])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
c.request("POST", "/v1/chat/completions", body=b"{}")
body = b""
try:
    body = c.getresponse().read()
except Exception as exc:
    sys.exit(f"broken: {exc!r}")
sys.exit(0 if body.rstrip().endswith(b"[DONE]") else "incomplete")
"""


def sweep(tmp: Path) -> None:
    frames = [b'data: {"i":%d}\n\n' % i for i in range(200)] + [b"data: [DONE]\n\n"]
    rec = write_recording(tmp / "sweep.jsonl", "openai", frames)
    client = tmp / "client.py"
    client.write_text(CLIENT)
    start = time.perf_counter()
    out = subprocess.run(
        [*STREAMTAP, "sweep", str(rec), "--positions", "events", "--styles", "clean", "--jobs", "2", "--json", "-", "--", sys.executable, "-S", str(client)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    report = json.loads(out.stdout)
    print(f"3. sweep: {len(report['runs'])} cut positions, 2 jobs, {os.cpu_count()} cores here: {elapsed:.1f} s "
          f"({report['counts']}) (target < 60 s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller throughput body")
    parser.add_argument("--rounds", type=int, default=5, help="rounds for throughput and timing (default 5, at least 5)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer rounds says little)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        throughput(tmp, args.quick, args.rounds)
        timing_fidelity(tmp, args.rounds)
        sweep(tmp)


if __name__ == "__main__":
    main()
