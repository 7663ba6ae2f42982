"""Peak memory of one long answer through mitmdump: streamtap against bare streaming mitmdump.

    .venv/bin/python bench/memory.py [--sizes 8,48,200] [--rounds 5] [--norec] [--workers]

The upstream (its own process, on loopback) streams an Anthropic answer of SIZE MB made of
64 KiB text deltas, generated as it is sent (the upstream holds one event, not the answer).
Each measurement starts a fresh `mitmdump` in reverse mode (bare: `flow.response.stream =
True`; streamtap: `-s addon/tap.py`, recording to a temporary folder, `streamtap_fsync=end`,
analysis in the proxy's own process, `streamtap_workers=0`, so that one process holds all of
streamtap's state), sends one small warm-up answer (imports, caches), reads the peak RSS
(VmHWM) of the proxy and its child processes, then carries the long answer to a client that
reads and discards it, and reads them again. The figure is the growth of the peaks during the
long answer: what one stream costs. Within a round the bare and streamtap proxies run back to
back for each size (interleaved); the difference streamtap - bare is taken within the round.
Prints median and range over rounds. The recording of each streamtap run is checked
(`streamtap verify` exit 0) and deleted.

With --workers, streamtap runs as shipped (one analysis worker): the figure adds the worker's
growth to the proxy's. A loopback answer comes faster than a worker analyses it, so its recording
may end with "analysis fell behind" (the ring of reads in flight is full and the proxy stops
handing the flow on rather than hold more): such a recording is counted, not failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy import MITMDUMP, REPO, Proxy, fetch, process_tree  # noqa: E402  (bench/proxy.py)

DELTA_CHARS = 65536  # characters of text per event (--delta-chars)


def sse(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def answer_parts(megabytes: float, chars: int, tool: bool = False):
    """The answer's events, one at a time: start, deltas of ``chars`` characters up to ``megabytes`` MB, stop.
    With ``tool``, the deltas are the arguments of one tool call (a JSON object with one long string)."""
    yield sse("message_start", {"type": "message_start", "message": {
        "id": "msg_mem", "type": "message", "role": "assistant", "model": "claude-bench", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}})
    filler = "lorem ipsum " * (chars // 12) + "x" * (chars % 12)
    if tool:
        yield sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
            "type": "tool_use", "id": "toolu_mem", "name": "write_file", "input": {}}})
        yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "input_json_delta", "partial_json": '{"content": "'}})
        delta = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "input_json_delta", "partial_json": filler}})
    else:
        yield sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        delta = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": filler}})
    for _ in range(max(1, int(megabytes * 1e6 // len(delta)))):
        yield delta
    if tool:
        yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "input_json_delta", "partial_json": '"}'}})
    yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use" if tool else "end_turn"},
                                "usage": {"output_tokens": 9}})
    yield sse("message_stop", {"type": "message_stop"})


def upstream_main(port_pipe, chars: int = DELTA_CHARS, tool: bool = False) -> None:
    """POST /<MB>/v1/messages: an answer of that many MB, one HTTP chunk per event."""

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n")
            for i, event in enumerate(answer_parts(float(path.split("/")[1]), chars, tool)):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                if i % 16 == 0:
                    await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_pipe.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def peak_kib(pid: int) -> int:
    """The peak RSS of the process and of its child processes (streamtap's analysis worker)."""
    total = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        total += int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
    return total


def ring_kib(pid: int) -> int:
    """Memory the proxy's worker rings hold (their files' blocks), wherever a worker has mapped
    them: the proxy keeps each ring's file open (twice: its mmap holds a copy of the descriptor),
    so its /proc fd links find them."""
    blocks = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if "streamtap-ring-" in str(fd.readlink()):
                stat = fd.stat()
                blocks[stat.st_ino] = stat.st_blocks
        except OSError:
            continue
    return sum(blocks.values()) * 512 // 1024


FELL_BEHIND: list[str] = []  # recordings whose analysis fell behind the answer (--workers)
RINGS: dict[float, list[tuple[float, float]]] = {}  # (--workers) per size: ring memory after the warm-up and after the long answer, MiB


def measure(name: str, upstream: int, megabytes: float, workdir: Path) -> tuple[float, float]:
    """(growth of peak RSS during the long answer, peak RSS at the end), in MiB, for a fresh proxy."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    proxy = Proxy(name, upstream, run_dir)
    try:
        fetch(proxy.port, "/1/v1/messages")  # warm-up: imports, caches, the first flow
        before = peak_kib(proxy.process.pid)
        ring_before = ring_kib(proxy.process.pid)
        fetch(proxy.port, f"/{megabytes:g}/v1/messages")
        after = peak_kib(proxy.process.pid)
        if name == "streamtap":
            RINGS.setdefault(megabytes, []).append((ring_before / 1024, ring_kib(proxy.process.pid) / 1024))
    finally:
        proxy.stop()
    if name.startswith("streamtap") and "norec" not in name:
        recordings = sorted((proxy.dir / "rec").rglob("*.jsonl"), key=lambda p: p.stat().st_size)
        verify = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(recordings[-1])],
                                capture_output=True, text=True, cwd=REPO / "addon")
        if verify.returncode != 0:
            if name == "streamtap" and "analysis fell behind" in recordings[-1].read_text(errors="replace"):
                FELL_BEHIND.append(recordings[-1].name)
            else:
                raise RuntimeError(f"the recording does not verify: {verify.stdout}{verify.stderr}")
    shutil.rmtree(run_dir)
    return (after - before) / 1024, after / 1024


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):7.1f}  range {min(values):7.1f} .. {max(values):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,48,200", help="answer sizes in MB, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--delta-chars", type=int, default=DELTA_CHARS, help="characters of text per event")
    parser.add_argument("--tool", action="store_true",
                        help="the answer is one tool call whose arguments are that long (else text)")
    parser.add_argument("--norec", action="store_true", help="streamtap without recording (streamtap_record=false)")
    parser.add_argument("--workers", action="store_true",
                        help="streamtap as shipped, with one analysis worker, whose growth is added (else workers=0)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer rounds says little)")
    if not MITMDUMP.exists():
        sys.exit(f"no {MITMDUMP}: run `make .venv/.installed` first")
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.norec and args.workers:
        parser.error("--norec runs in-process (workers=0): not with --workers")
    tap = "streamtap-norec" if args.norec else "streamtap" if args.workers else "streamtap-w0"
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=upstream_main, args=(send, args.delta_chars, args.tool), daemon=True)
    server.start()
    upstream = receive.recv()
    growth: dict[tuple[str, float], list[float]] = {}
    peaks: dict[tuple[str, float], list[float]] = {}
    extra: dict[float, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for size in sizes:
                row = {}
                for name in (("bare", tap) if round_ % 2 == 0 else (tap, "bare")):
                    row[name], peak = measure(name, upstream, size, Path(tmp))
                    growth.setdefault((name, size), []).append(row[name])
                    peaks.setdefault((name, size), []).append(peak)
                extra.setdefault(size, []).append(row[tap] - row["bare"])
                print(f"round {round_ + 1} {size:g} MB: bare +{row['bare']:.1f} MiB, {tap} +{row[tap]:.1f} MiB", flush=True)
    server.terminate()
    print(f"\npeak RSS growth while one answer of SIZE MB ({args.delta_chars}-character {'tool-argument' if args.tool else 'text'} events) passes, MiB, {args.rounds} rounds")
    for size in sizes:
        print(f"{size:6g} MB  bare         {spread(growth[('bare', size)])}   (peak {spread(peaks[('bare', size)])})")
        print(f"{size:6g} MB  {tap:12} {spread(growth[(tap, size)])}   (peak {spread(peaks[(tap, size)])})")
        print(f"{size:6g} MB  extra        {spread(extra[size])}   ({tap} - bare, within the round)")
    if args.workers:
        runs = args.rounds * len(sizes)
        for size, rings in RINGS.items():
            print(f"{size:6g} MB  the ring's memory after the warm-up {spread([b for b, _ in rings])}, "
                  f"at the end of the answer {spread([a for _, a in rings])} (MiB)")
        print(f"{len(FELL_BEHIND)} of {runs} recordings end with 'analysis fell behind' (the worker could not keep up "
              f"with a loopback answer; the proxy stopped handing it the flow); the others verify complete")


if __name__ == "__main__":
    main()
