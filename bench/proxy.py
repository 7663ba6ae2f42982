"""streamtap in mitmdump against bare streaming mitmdump, same loopback workload, one run.

    .venv/bin/python bench/proxy.py [--mb 16] [--rounds 5] [--quick] [--against DIR]

Peers (each a real `mitmdump` in reverse mode in front of the same loopback upstream):
  bare       a one-line script addon: flow.response.stream = True
  passthru   a stream callable that returns each chunk (the floor for any callable)
  keep       (with --floor) a stream callable that keeps each chunk and its arrival time, then drops
             them: the floor for any tap that records every read, before it analyses anything
  streamtap-w0  `-s addon/tap.py` with streamtap_workers=0: analysis and recording in the proxy's loop
  streamtap  `-s addon/tap.py` as shipped: one analysis worker process (streamtap_workers=1)
  (both record, fsync=end; with --norec also streamtap-norec: workers=0 and streamtap_record=false)
  streamtap-norec-old, streamtap-old  (with --against DIR) the same from another checkout, e.g.
             `git archive COMMIT addon | tar -x -C DIR`, to compare two versions in one run

Measures: wall time, proxy CPU (utime+stime from /proc) and the total CPU of the proxy and its
child processes (the analysis workers) for a large SSE body (OpenAI chat chunks) and a large
AWS event-stream body (ConverseStream deltas); throughput with 200 streams at once; 100 short
answers (30 events) to prompts of about 100 KiB one after another, what each flow costs beyond
its reads; the added latency per event for a small event every 5 ms; the proxy's resident
memory per open stream with 100 streams held open mid-body. Every round runs each proxy once per workload, interleaved (the
order alternating between rounds); each ratio to bare is taken within its round, and the
median and range of those ratios are printed, as measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
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
sys.path.insert(0, str(REPO / "addon"))

from streamtap.recording.catalog import is_partial  # noqa: E402
from streamtap.wire import encode_message  # noqa: E402

MITMDUMP = REPO / ".venv" / "bin" / "mitmdump"
CLK = os.sysconf("SC_CLK_TCK")

BARE = "def responseheaders(flow):\n    flow.response.stream = True\n"
PASSTHRU = "def responseheaders(flow):\n    flow.response.stream = lambda data: data\n"
# The floor for any tap that keeps every read with its arrival time, before it does anything with
# them: streamtap's stream callable does this much (its batches then go to the worker).
KEEP = """from time import monotonic

def responseheaders(flow):
    reads, times = [], []
    keep, note = reads.append, times.append

    def stream(data):
        keep(data)
        note(monotonic())
        if len(reads) >= 256:  # handed on and dropped
            reads.clear()
            times.clear()
        return data

    flow.response.stream = stream
"""
SCRIPTS = {"bare": BARE, "passthru": PASSTHRU, "keep": KEEP}


# --- workload ------------------------------------------------------------------------------


def sse_events(megabytes: float) -> list[bytes]:
    base = {"id": "chatcmpl-B1", "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-bench"}
    events = [b'data: ' + json.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}).encode() + b"\n\n"]
    size, i = 0, 0
    while size < megabytes * 1e6:
        piece = json.dumps({**base, "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}).encode()
        events.append(b"data: " + piece + b"\n\n")
        size += len(events[-1])
        i += 1
    events.append(b'data: ' + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def eventstream_events(megabytes: float) -> list[bytes]:
    def message(kind: str, payload: dict) -> bytes:
        return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"}, json.dumps(payload).encode())

    out = [message("messageStart", {"role": "assistant"})]
    size, i = 0, 0
    while size < megabytes * 1e6:
        out.append(message("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": f"tok{i} "}, "p": "abcdefghij"}))
        size += len(out[-1])
        i += 1
    out.append(message("contentBlockStop", {"contentBlockIndex": 0}))
    out.append(message("messageStop", {"stopReason": "end_turn"}))
    out.append(message("metadata", {"usage": {"inputTokens": 1, "outputTokens": i, "totalTokens": i + 1}, "metrics": {"latencyMs": 1}}))
    return out


# --- the upstream (its own process, so it does not share the client's GIL) ------------------


CONCURRENT = 200  # streams at once in the concurrency workload
CONCURRENT_SHARE = 1 / 20  # each of those carries this share of --mb
SHORT_FLOWS = 100  # answers one after another in the short-answers workload...
SHORT_MB = 0.005  # ...each this big (30 events)...
PROMPT_KIB = 100  # ...to a request this big, as apps with long contexts send


def upstream_main(port_pipe, megabytes: float) -> None:
    bodies = {
        "/sse/v1/chat/completions": (b"text/event-stream", sse_events(megabytes)),
        "/es/model/m/converse-stream": (b"application/vnd.amazon.eventstream", eventstream_events(megabytes)),
        "/small-sse/v1/chat/completions": (b"text/event-stream", sse_events(megabytes * CONCURRENT_SHARE)),
        "/short-sse/v1/chat/completions": (b"text/event-stream", sse_events(SHORT_MB)),
    }

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: ")
                if path.startswith("/tick"):  # /tick/<events>/v1/chat/completions: a small event every 5 ms
                    count = int(path.split("/")[2])
                    writer.write(b"text/event-stream\r\n\r\n")
                    start = time.perf_counter()
                    for i in range(count):
                        delay = start + i * 0.005 - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        event = b'data: {"t":%.9f,"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n' % time.perf_counter()
                        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                        await writer.drain()
                    event = b"data: [DONE]\n\n"
                    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
                elif path.startswith("/hold"):  # a few events, then hold the stream open
                    writer.write(b"text/event-stream\r\n\r\n")
                    event = b'data: {"choices":[{"index":0,"delta":{"content":"held"}}]}\n\n' * 4
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    await asyncio.sleep(3600)
                else:
                    # /sse/... and /es/...: one HTTP chunk per event, as providers flush them;
                    # /big-sse/... and /big-es/...: the same bytes coalesced into 16 KiB chunks (worst case per byte)
                    coalesced = path.startswith("/big-")
                    content_type, events = bodies[path.replace("/big-", "/", 1)]
                    writer.write(content_type + b"\r\n\r\n")
                    pieces = [b"".join(events[i : i + 128]) for i in range(0, len(events), 128)] if coalesced else events
                    for i, piece in enumerate(pieces):
                        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        if i % 64 == 0:
                            await writer.drain()
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
        port_pipe.send((server.sockets[0].getsockname()[1], *(sum(map(len, events)) for _, events in bodies.values())))
        await asyncio.Event().wait()

    asyncio.run(main())


# --- the proxies ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu(pid: int) -> float:
    """CPU seconds of a process: its threads' run time in nanoseconds (``schedstat``) where the
    kernel keeps it; else ``stat``'s user and system time, which count 10 ms ticks (±1 tick in
    a transfer of 80 is ±1.2% in a ratio's either side)."""
    try:
        return sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):  # no schedstat here, or a thread gone meanwhile
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK


def wait_listening(process: subprocess.Popen, port: int, what: str, seconds: float = 20) -> None:
    """Until something accepts connections on ``port``; raises when ``process`` exits or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


def process_tree(pid: int) -> list[int]:
    """The process and its live descendants (a streamtap proxy's analysis workers)."""
    tree, todo = [], [pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += map(int, (task / "children").read_text().split())
        except OSError:  # gone meanwhile
            pass
    return tree


class Proxy:
    def __init__(self, name: str, upstream_port: int, workdir: Path, against: Path | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.dir = workdir / name
        self.dir.mkdir()
        args = [str(MITMDUMP), "-q", "--mode", f"reverse:http://127.0.0.1:{upstream_port}", "--listen-host", "127.0.0.1",
                "--listen-port", str(self.port), "--set", f"confdir={self.dir / 'conf'}"]
        if name.startswith("streamtap"):
            tap = (against if name.endswith("-old") and against else REPO) / "addon" / "tap.py"  # tap.py puts its own tree first
            args += ["-s", str(tap), "--set", f"streamtap_dir={self.dir / 'rec'}", "--set", "streamtap_fsync=end"]
            if name.startswith("streamtap-norec"):
                args += ["--set", "streamtap_record=false"]
            if name.startswith(("streamtap-norec", "streamtap-w0")):
                args += ["--set", "streamtap_workers=0"]
        else:
            script = self.dir / "addon.py"
            script.write_text(SCRIPTS[name])
            args += ["-s", str(script)]
        self.counted: set[Path] = set()  # recordings seen by analysed()
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.process, self.port, f"{name} mitmdump")

    def cpu(self) -> float:
        return _cpu(self.process.pid)

    def analysed(self, flows: int) -> int:
        """Of the ``flows`` recordings made since the last call, those analysed whole. A flow that
        met a busy worker is not: its recording says "analysis fell behind" (at byte 0 when the
        worker was already behind as it began; before b305ab0 such a flow got no recording at all,
        so it is not counted either). A proxy that analyses fewer flows does less work."""
        folder = self.dir / "rec"
        if not folder.is_dir():
            return 0
        # verdicts come back after the transfer: wait for the worker to finish all the round's
        # recordings (a .partial file is renamed when its verdict is written; one the worker has not
        # begun yet is not there), then count them: a recording counted in the next round instead
        # made one round's share over 100%
        deadline = time.monotonic() + 30

        def finished() -> set[Path]:
            return {path for path in folder.glob("*.jsonl") if not is_partial(path)} - self.counted

        while (len(finished()) < flows or any(map(is_partial, folder.glob("*.jsonl")))) and time.monotonic() < deadline:
            time.sleep(0.05)
        new = finished()
        self.counted |= new
        return sum(b"analysis fell behind" not in path.read_bytes() for path in new)

    def total_cpu(self) -> float:
        """The proxy's CPU and that of its live descendants (analysis workers; they live as long as the proxy)."""
        total = 0.0
        for pid in process_tree(self.process.pid):
            try:
                total += _cpu(pid)
            except OSError:  # gone meanwhile
                pass
        return total

    def rss(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


REQUEST = b'{"model":"m","stream":true,"messages":[]}'


def prompt(kib: int) -> bytes:
    """A chat request of about ``kib`` KiB: a conversation, as apps with long contexts send."""
    messages: list[dict] = []
    while sum(len(m["content"]) for m in messages) < kib * 1024:
        i = len(messages)
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": " ".join(f"word{j}" for j in range(i, i + 90))})
    return json.dumps({"model": "m", "stream": True, "messages": messages}).encode()


PROMPT = prompt(PROMPT_KIB)


def request_head(path: str, body: bytes = REQUEST) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def fetch(port: int, path: str, body: bytes = REQUEST) -> int:
    """Read a whole chunked response as fast as possible; returns the raw bytes read."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_head(path, body))
        total = 0
        tail = b""
        while True:
            data = sock.recv(1 << 20)
            if not data:
                break
            total += len(data)
            tail = (tail + data)[-7:]
            if tail.endswith(b"\r\n0\r\n\r\n"[-7:]):
                break
        return total


WORKLOADS = ("sse", "es", "sse16k", "es16k", "conc", "short")


def transfer(proxy: Proxy, path: str, repeat: int = 1, concurrent: int = 1, body: bytes = REQUEST) -> tuple[float, float, float, float]:
    """Wall, proxy CPU and proxy+workers CPU seconds for one body (``repeat`` transfers
    averaged, for CPU time in ticks where ``_cpu`` falls back to them), or for ``concurrent``
    bodies at once; and the share of those flows that a recording streamtap proxy analysed whole."""
    cpu0, total0, t0 = proxy.cpu(), proxy.total_cpu(), time.perf_counter()
    for _ in range(repeat):
        if concurrent > 1:
            fetch_many(proxy.port, path, concurrent)
        else:
            fetch(proxy.port, path, body)
    wall = (time.perf_counter() - t0) / repeat
    # let the proxy and its workers finish the flows (verdicts, end lines, fsync) before reading
    # their CPU: done when 50 ms add less than a tick (an idle worker still polls its pipe)
    total, deadline = proxy.total_cpu(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)
        total, before = proxy.total_cpu(), total
        if total - before < 1 / CLK:
            break
    return wall, (proxy.cpu() - cpu0) / repeat, (total - total0) / repeat, proxy.analysed(repeat * concurrent) / (repeat * concurrent)


def fetch_many(port: int, path: str, count: int) -> None:
    """``count`` streams at once, each read whole (asyncio: one client thread keeps up with them)."""

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(request_head(path))
        tail = b""
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            tail = (tail + data)[-7:]
            if tail.endswith(b"\r\n0\r\n\r\n"[-7:]):
                break
        writer.close()

    async def all_of_them() -> None:
        await asyncio.gather(*(one() for _ in range(count)))

    asyncio.run(all_of_them())


def tick_latencies(port: int, count: int) -> list[float]:
    """Per-event delay from the upstream's write to the client's read, in ms."""
    delays = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_head(f"/tick/{count}/v1/chat/completions"))
        buffer = b""
        while True:
            data = sock.recv(65536)
            now = time.perf_counter()
            if not data:
                break
            buffer += data
            while (start := buffer.find(b'{"t":')) >= 0:
                end = buffer.find(b",", start)
                if end < 0:
                    break
                delays.append((now - float(buffer[start + 5 : end])) * 1000)
                buffer = buffer[end:]
            if b"[DONE]" in buffer:
                break
    return delays


def held_streams(proxy: Proxy, count: int) -> int:
    """RSS growth with ``count`` streams held open mid-body, per stream (bytes)."""
    def open_streams() -> list[socket.socket]:
        return open_streams_n(count)

    def open_streams_n(n: int) -> list[socket.socket]:
        socks = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", proxy.port))
            sock.sendall(request_head("/hold/v1/chat/completions"))
            socks.append(sock)
        for sock in socks:
            got = b""
            while b"held" not in got:
                got += sock.recv(65536)
        return socks

    for _ in range(2):  # the first streams pay one-time costs (imports, caches)
        for sock in open_streams_n(4):
            sock.close()
    time.sleep(0.5)
    before = proxy.rss()
    socks = open_streams()
    time.sleep(0.5)
    after = proxy.rss()
    for sock in socks:
        sock.close()
    return (after - before) // count


def per_stream_state(count: int) -> int:
    """Bytes of streamtap's own per-stream state (session, decoder, assembler, writer) with ``count`` open."""
    import tracemalloc

    from streamtap.providers import Dialect, StreamSession
    from streamtap.recording import RecordingWriter

    events = sse_events(0.05)
    prefix = b"".join(events[:200]) + events[200][:60]  # 200 events in, one event in progress
    with tempfile.TemporaryDirectory() as tmp:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        open_streams = []
        for i in range(count):
            session = StreamSession(Dialect.OPENAI_CHAT, "sse", keep_arrivals=False)  # as the Tap makes it
            writer = RecordingWriter(Path(tmp) / f"{i}.jsonl")
            writer.header({"request": {"method": "POST", "url": "http://x/v1/chat/completions", "headers": []}})
            for start in range(0, len(prefix), 1500):
                chunk = prefix[start : start + 1500]
                writer.read(chunk, 1.0)
                for event in session.feed(chunk, 1.0):
                    writer.frame(event, 1.0)
                writer.flush()
            open_streams.append((session, writer))
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        for _, writer in open_streams:
            writer.close()
    return (after - before) // count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4, help="size of each large body in MB (default 4)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds; in each, every proxy runs every workload once (default 5, at least 5)")
    parser.add_argument("--ticks", type=int, default=400, help="events in the latency run per proxy, spread over the rounds (one per 5 ms; default 400)")
    parser.add_argument("--held", type=int, default=100, help="streams held open for the memory figure (default 100)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--norec", action="store_true", help="also run streamtap-norec (workers=0, no recording)")
    parser.add_argument("--floor", action="store_true",
                        help="also run keep: a stream callable that keeps each read and its arrival time and "
                             "drops them, the floor for a tap that records every read")
    parser.add_argument("--only", choices=WORKLOADS, metavar="WORKLOAD",
                        help=f"run this one workload only ({', '.join(WORKLOADS)}), e.g. with more --rounds to "
                             "resolve a small difference; no latency or memory figures")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="also run DIR/addon/tap.py (another version of streamtap) as the -old peers")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.rounds, args.ticks, args.held = 0.5, 5, 100, 20
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer ratios says little)")
    if args.against and not (args.against / "addon" / "tap.py").is_file():
        parser.error(f"--against: {args.against}/addon/tap.py does not exist")

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    upstream = ctx.Process(target=upstream_main, args=(child, args.mb), daemon=True)
    upstream.start()
    port, sse_len, es_len, small_len, short_len = parent.recv()
    sse_count, es_count = len(sse_events(args.mb)), len(eventstream_events(args.mb))
    whole = not args.only  # every workload, and the latency and memory figures
    state_bytes = per_stream_state(args.held) if whole else 0
    workdir = Path(tempfile.mkdtemp(prefix="streamtap-bench-"))
    names = ["bare", "passthru", "streamtap-w0", "streamtap"]
    if args.norec:
        names[2:2] = ["streamtap-norec"]
    if args.floor:
        names[2:2] = ["keep"]
    if args.against:
        names[2:2] = ["streamtap-old"]
    proxies: dict[str, Proxy] = {}
    results: dict[str, dict[str, float]] = {name: {} for name in names}
    try:
        for name in names:  # inside the try: a proxy that fails to start stops the ones before it
            proxies[name] = Proxy(name, port, workdir, args.against)
        if whole:
            for name in names:  # first, while the proxies' heaps are small and unfragmented
                results[name]["held_bytes"] = held_streams(proxies[name], args.held)
        workloads = (
            ("sse", "/sse/v1/chat/completions", sse_len),
            ("es", "/es/model/m/converse-stream", es_len),
            ("sse16k", "/big-sse/v1/chat/completions", sse_len),
            ("es16k", "/big-es/model/m/converse-stream", es_len),
            ("conc", "/small-sse/v1/chat/completions", small_len * CONCURRENT),
            ("short", "/short-sse/v1/chat/completions", short_len),
        )
        for label, path, size in workloads:
            if args.only not in (None, label):
                continue
            repeat = 8 if label.endswith("16k") else SHORT_FLOWS if label == "short" else 1
            concurrent = CONCURRENT if label == "conc" else 1
            body = PROMPT if label == "short" else REQUEST
            for name in names:
                transfer(proxies[name], path, concurrent=concurrent, body=body)  # warm-up
            for number in range(args.rounds):
                order = names if number % 2 == 0 else names[::-1]  # interleaved, order alternating
                round_runs = {name: transfer(proxies[name], path, repeat, concurrent, body) for name in order}
                bare_wall, bare_cpu, bare_total, _ = round_runs["bare"]
                for name in names:
                    wall, cpu, total, analysed = round_runs[name]
                    r = results[name]
                    r.setdefault(f"{label}_analysed", []).append(analysed)
                    r.setdefault(f"{label}_wall", []).append(wall)
                    r.setdefault(f"{label}_wall_x", []).append(wall / bare_wall)
                    r.setdefault(f"{label}_tput_x", []).append(bare_wall / wall)
                    r.setdefault(f"{label}_cpu_x", []).append(cpu / max(bare_cpu, 1e-9))
                    r.setdefault(f"{label}_total_x", []).append(total / max(bare_total, 1e-9))
                    r.setdefault(f"{label}_cpu", []).append(cpu * 1000 / (size / 1e6))
        ticks = max(20, args.ticks // args.rounds)
        latency_rounds = args.rounds if whole else 0
        for number in range(latency_rounds):
            order = names if number % 2 == 0 else names[::-1]
            p50 = {}
            for name in order:
                delays = tick_latencies(proxies[name].port, ticks)
                p50[name] = statistics.median(delays)
                results[name].setdefault("tick_p99", []).append(sorted(delays)[int(len(delays) * 0.99) - 1])
            for name in names:
                results[name].setdefault("tick_p50", []).append(p50[name])
                results[name].setdefault("tick_added", []).append(p50[name] - p50["bare"])
        recordings = list((workdir / "streamtap" / "rec").glob("*.jsonl"))
    finally:
        for proxy in proxies.values():
            proxy.stop()
        upstream.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    def spread(values: list[float], digits: int = 2) -> str:
        return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    print(f"bench/proxy.py: mitmdump reverse proxy on loopback; SSE {sse_len / 1e6:.1f} MB "
          f"({sse_count} events), event-stream {es_len / 1e6:.1f} MB ({es_count} messages); {args.rounds} rounds, "
          f"the proxies interleaved in each round and every ratio to bare taken within its round; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end; "
          f"streamtap wrote {len(recordings)} recordings\n")
    print("throughput and CPU, as ratios to bare: median (range) over the rounds; 1.10 = 10% more; "
          "total CPU = proxy + its analysis workers")
    print(f"{'workload':38} {'proxy':19} {'MB/s':>7} {'time x bare':>18} {'CPU ms/MB':>10} {'CPU x bare':>18} {'total CPU x bare':>18}")
    titles = {
        "sse": "SSE, one HTTP chunk per event",
        "es": "event-stream, one chunk per message",
        "sse16k": "SSE, 128 events per HTTP chunk",
        "es16k": "event-stream, 128 per HTTP chunk",
        "conc": f"{CONCURRENT} SSE streams at once, 1 chunk/event",
        "short": f"{SHORT_FLOWS} short answers, {len(PROMPT) // 1024} KiB prompts",
    }
    sizes = {"sse": sse_len, "es": es_len, "sse16k": sse_len, "es16k": es_len, "conc": small_len * CONCURRENT, "short": short_len}
    for label, title in titles.items():
        if args.only not in (None, label):
            continue
        for name in names:
            r = results[name]
            mbps = sizes[label] / 1e6 / statistics.median(r[label + "_wall"])
            print(f"{title if name == 'bare' else '':38} {name:19} {mbps:7.1f} {spread(r[label + '_wall_x']):>18} "
                  f"{statistics.median(r[label + '_cpu']):10.1f} {spread(r[label + '_cpu_x']):>18} {spread(r[label + '_total_x']):>18}")
        if label == "conc":
            for name in names[1:]:
                print(f"{'':38} {name:19} throughput x bare: {spread(results[name]['conc_tput_x'])}")
        for name in names:
            shares = results[name][label + "_analysed"]
            if name.startswith("streamtap") and "norec" not in name and min(shares) < 1:
                print(f"{'':38} {name:19} flows analysed whole: {spread([100 * share for share in shares], 0)} % "
                      "(the rest met a busy worker: less work, so its figures above flatter it)")
    if not whole:
        return 0
    ticks = max(20, args.ticks // args.rounds)
    print(f"\nlatency of a small event every 5 ms ({ticks} events per proxy and round): p50 added over bare within the round,"
          f" median (range); and resident memory per open stream ({args.held} held open)")
    print(f"{'proxy':19} {'p50 ms':>8} {'added ms':>22} {'p99 ms':>8} {'RSS/stream':>12} {'added':>10}")
    bare = results["bare"]
    for name in names:
        r = results[name]
        print(f"{name:19} {statistics.median(r['tick_p50']):8.3f} {spread(r['tick_added'], 3):>22} "
              f"{statistics.median(r['tick_p99']):8.3f} "
              f"{r['held_bytes'] / 1024:8.1f} KiB {(r['held_bytes'] - bare['held_bytes']) / 1024:6.1f} KiB")
    print("  (RSS moves in pages and the heap reuses memory freed by earlier flows, so a few KiB per stream is below its"
          " resolution; the in-process figure below is the precise one)")
    print(f"\nstreamtap per-stream state measured in-process (tracemalloc, {args.held} sessions+writers open mid-event): "
          f"{state_bytes / 1024:.1f} KiB per stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
