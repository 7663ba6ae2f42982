"""Peak memory of `streamtap verify` on a large recording, against the recording's size.

    .venv/bin/python bench/verify_memory.py [--mib 256] [--rounds 5] [--pings] [--baseline PYTHON]

A recording of about `--mib` MiB (an Anthropic SSE answer, 2 KiB text deltas, or with `--pings`
ping events of the same size that add nothing to the turn; 16 KiB network reads) is written once with the project's own writer. Each round runs `streamtap verify` on it
in a fresh process and reads that process's peak RSS (ru_maxrss of the waited child). With
`--baseline PYTHON` (e.g. another checkout's `.venv/bin/python`), each round also runs that
interpreter's streamtap on the same file, interleaved, and prints the ratio within the round.
Two floors are printed with it: Python importing streamtap, and the reader alone (every line
read and checked, as verify does, without judging): the rest of verify's peak is the judged
turn (at most TEXT_CAP characters of the answer's text, see providers/judge.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from streamtap.recording import RecordingWriter
from streamtap.wire import SSEDecoder

MEASURE = (
    "import resource, subprocess, sys;"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode;"
    "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_rss_mib(command: list[str]) -> tuple[int, float]:
    """(exit code, peak RSS in MiB) of `command` run alone in a fresh measuring process."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True).stdout
    code, kib = out.split()
    return int(code), int(kib) / 1024


def verify_command(python: str, path: Path) -> list[str]:
    return [python, "-c", "import sys; from streamtap.cli import main; sys.exit(main())", "verify", str(path)]


WALK = """
import sys
from streamtap.recording import Frame, NetworkReads, RecordingCheck, RecordingLines
with RecordingLines(sys.argv[1]) as lines:
    check = RecordingCheck()
    for item in lines:
        if isinstance(item, Frame):
            check.segment(item)
        elif isinstance(item, NetworkReads):
            check.reads(item.reads, item.wire)
sys.exit(1 if check.finish(lines.end) else 0)
"""


def write_recording(path: Path, mib: int, pings: bool = False) -> None:
    text = ("lorem ipsum dolor sit amet " * 80)[:2048]
    delta = ('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
             '"delta":{"type":"text_delta","text":"%s"}}\n\n' % text).encode()  # fmt: skip
    if pings:  # events of the same size that add nothing to the turn
        delta = ('event: ping\ndata: {"type":"ping","pad":"%s"}\n\n' % text).encode()
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_b","type":"message",'
             b'"role":"assistant","model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
             b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
             b'"content_block":{"type":"text","text":""}}\n\n')  # fmt: skip
    stop = (b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
            b'"usage":{"output_tokens":9}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')  # fmt: skip
    # a frame line is about its raw bytes plus JSON escaping: aim the body at the file size asked
    deltas = mib * 2**20 // (len(delta) + 200)
    writer = RecordingWriter(path)
    writer.header({
        "request": {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "headers": [], "body": {"bench": True}},
        "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
        "dialect": "anthropic", "wire": {"format": "sse", "content_encoding": None},
    })  # fmt: skip
    decoder = SSEDecoder()
    pending = bytearray(start)
    t = 0.0
    for i in range(deltas + 1):
        pending += delta if i < deltas else stop
        while len(pending) >= 16 * 1024 or (i == deltas and pending):
            piece = bytes(pending[: 16 * 1024])
            del pending[: 16 * 1024]
            t += 0.5
            writer.read(piece, t)
            for event in decoder.feed(piece):
                writer.frame(event, t)
    for event in decoder.close():
        writer.frame(event, t)
    # the verdict the proxy would have written: verify judges again and compares
    writer.finish({"verdict": {"kind": "complete", "reason": "", "seq": None, "offset": None, "evidence": None},
                   "stream_end": "finished"})  # fmt: skip


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (range {min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the recording to verify (MiB, about)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pings", action="store_true", help="events that add no text to the turn (padded pings)")
    parser.add_argument("--baseline", metavar="PYTHON", help="another interpreter whose streamtap runs in the same rounds")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer rounds says little)")
    with tempfile.TemporaryDirectory(prefix="streamtap-bench-") as tmp:
        path = Path(tmp) / "big.jsonl"
        write_recording(path, args.mib, args.pings)
        size = path.stat().st_size / 2**20
        print(f"recording: {size:.1f} MiB, {sum(1 for _ in path.open('rb'))} lines")
        floor = peak_rss_mib([sys.executable, "-c", "import streamtap.cli"])[1]
        print(f"python importing streamtap.cli: {floor:.1f} MiB")
        peaks, ratios, baseline_peaks, walks = [], [], [], []
        for number in range(1, args.rounds + 1):
            walk_code, walk = peak_rss_mib([sys.executable, "-c", WALK, str(path)])
            walks.append(walk)
            code, peak = peak_rss_mib(verify_command(sys.executable, path))
            peaks.append(peak)
            line = (f"round {number}: reader alone {walk:.1f} MiB (exit {walk_code}); "
                    f"verify {peak:.1f} MiB (exit {code}, {peak / size:.3f}x the file)")  # fmt: skip
            if args.baseline:
                base_code, base = peak_rss_mib(verify_command(args.baseline, path))
                baseline_peaks.append(base)
                ratios.append(base / peak)
                line += f"; baseline {base:.1f} MiB (exit {base_code}); baseline / this {base / peak:.2f}x"
            print(line)
        print(f"reader alone, peak RSS MiB: {spread(walks)}")
        print(f"verify, peak RSS MiB: {spread(peaks)}; per MiB of file: {spread([p / size for p in peaks])}")
        if args.baseline:
            print(f"baseline, peak RSS MiB: {spread(baseline_peaks)}; baseline / this: {spread(ratios)}")


if __name__ == "__main__":
    main()
