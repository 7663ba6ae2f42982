"""The proxy's work counted in instructions: streamtap in mitmdump against bare mitmdump, without the noise.

    .venv/bin/python bench/proxy_instructions.py [--mb 0.5] [--runs 2] [--only es]

CPU seconds on a shared 2-core machine swing by 15% between two runs of the same proxy, which is
wider than the distance to the 1.10x target (`bench/proxy.py` interleaves and takes medians, and
still cannot resolve it). Valgrind's callgrind counts the instructions a process executes instead:
the same for the same work whatever else the machine does. Each proxy runs under callgrind with
counting off while it starts; counting is switched on for the transfers only, and its total is
read when the proxy exits. The analysis workers run outside valgrind and are not counted: this
measures what streamtap costs the process that carries the traffic.

What stays variable: how many reads the proxy's loop makes for the same body (it depends on how
fast the upstream writes against how fast the proxy reads) and when its timers fire. `--runs`
repeats each proxy to show that spread; it is printed.

What it does not see: the kernel's work for the process (system calls, page faults; `bench/proxy.py`
counts those in its CPU time) and what an instruction costs (cache misses; callgrind counts a
`rep movsb` copy once per byte, so copies weigh more here than in time). Counting runs for
SETTLE seconds after the transfers, so a proxy's idle work is in every row; the idle row shows it alone.

Needs valgrind (Debian's package). Slow: each proxy runs ~50x slower under callgrind.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTLE = 2.0  # seconds counted after the transfers (verdicts come back), and the idle run's length

from proxy import (  # noqa: E402
    MITMDUMP, PROMPT, PROMPT_KIB, REPO, REQUEST, SCRIPTS, SHORT_MB, eventstream_events, fetch, free_port, sse_events, upstream_main,
    wait_listening,
)

WORKLOADS = {  # label: title, path, the request sent, bodies per run (None: --transfers)
    "sse": ("SSE, one HTTP chunk per event", "/sse/v1/chat/completions", REQUEST, None),
    "es": ("event-stream, one chunk per message", "/es/model/m/converse-stream", REQUEST, None),
    "sse16k": ("SSE, 128 events per HTTP chunk", "/big-sse/v1/chat/completions", REQUEST, None),
    "es16k": ("event-stream, 128 per HTTP chunk", "/big-es/model/m/converse-stream", REQUEST, None),
    "short": (f"20 short answers, {PROMPT_KIB} KiB prompts", "/short-sse/v1/chat/completions", PROMPT, 20),
    "idle": (f"idle, no traffic for {SETTLE:.0f} s", "", REQUEST, 0),
}


class CountedProxy:
    """mitmdump under callgrind, counting only while ``count`` runs its transfers and the settle after them."""

    def __init__(self, name: str, upstream_port: int, workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.dir = workdir / f"{name}-{self.port}"
        self.dir.mkdir()
        self.out = self.dir / "callgrind.out"
        args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out}",
                "--trace-children=no", sys.executable, str(MITMDUMP), "-q",
                "--mode", f"reverse:http://127.0.0.1:{upstream_port}", "--listen-host", "127.0.0.1",
                "--listen-port", str(self.port), "--set", f"confdir={self.dir / 'conf'}"]
        if name == "streamtap":
            args += ["-s", str(REPO / "addon" / "tap.py"), "--set", f"streamtap_dir={self.dir / 'rec'}",
                     "--set", "streamtap_fsync=end"]
        else:
            script = self.dir / "addon.py"
            script.write_text(SCRIPTS[name])
            args += ["-s", str(script)]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self.log = self.dir / "valgrind.log"
        args.insert(1, f"--log-file={self.log}")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_listening(self.process, self.port, f"{name} mitmdump under valgrind", seconds=600)

    def _control(self, *flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(self.process.pid)], check=True, stdout=subprocess.DEVNULL)

    def count(self, path: str, transfers: int, body: bytes) -> int:
        """Instructions the proxy executed for ``transfers`` fetches of ``path``."""
        fetch(self.port, path or WORKLOADS["short"][1], body)  # warm-up: first-flow costs (imports, caches, the worker's start)
        time.sleep(SETTLE)
        self._control("-i", "on")
        for _ in range(transfers):
            fetch(self.port, path, body)
        time.sleep(SETTLE)  # the verdicts coming back are the proxy's work too
        self._control("-i", "off")
        self.process.terminate()
        self.process.wait(120)
        collected = re.search(r"Collected : ([\d,]+)", self.log.read_text(errors="replace"))
        if collected is None:
            raise RuntimeError(f"{self.name}: valgrind reported no count in {self.log}")
        return int(collected.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=0.5, help="size of each body in MB (default 0.5)")
    parser.add_argument("--transfers", type=int, default=2, help="bodies counted per run (default 2)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each proxy per workload, to show the spread (default 2)")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="this workload only (repeatable)")
    parser.add_argument("--peers", default="bare,passthru,streamtap", help="comma-separated (default bare,passthru,streamtap)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("needs valgrind: apt-get install valgrind")
    names = args.peers.split(",")
    unknown = [name for name in names if name not in (*SCRIPTS, "streamtap")]
    if unknown or "bare" not in names:
        parser.error(f"--peers: bare and any of {', '.join((*SCRIPTS, 'streamtap'))}")

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    upstream = ctx.Process(target=upstream_main, args=(child, args.mb), daemon=True)
    upstream.start()
    port = parent.recv()[0]
    workdir = Path(tempfile.mkdtemp(prefix="streamtap-instr-"))
    counts: dict[tuple[str, str], list[int]] = {}
    try:
        for label in args.only or WORKLOADS:
            for run in range(args.runs):
                for name in names if run % 2 == 0 else names[::-1]:
                    proxy = CountedProxy(name, port, workdir)
                    _, path, body, bodies = WORKLOADS[label]
                    try:
                        counts.setdefault((label, name), []).append(proxy.count(path, args.transfers if bodies is None else bodies, body))
                    finally:
                        if proxy.process.poll() is None:
                            proxy.process.kill()
                    print(f"  {label} run {run + 1} {name}: {counts[label, name][-1]:,} instructions", file=sys.stderr, flush=True)
    finally:
        upstream.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    events = {"sse": len(sse_events(args.mb)), "es": len(eventstream_events(args.mb)), "short": len(sse_events(SHORT_MB))}
    print(f"bench/proxy_instructions.py: instructions the mitmdump process executed (callgrind) in a run: "
          f"{args.transfers} bodies of {args.mb} MB (short answers: as the row says; idle: none) and the "
          f"{SETTLE:.0f} s after them; {args.runs} runs per proxy; workers not counted")
    print(f"{'workload':38} {'proxy':10} {'instructions':>16} {'x bare (each run)':>24}")
    for label in args.only or WORKLOADS:
        title, _, _, bodies = WORKLOADS[label]
        if label == "idle":
            unit, per = "per second", SETTLE
        else:
            unit, per = "per event", events[label.removesuffix("16k")] * (args.transfers if bodies is None else bodies)
        bare = statistics.median(counts[label, "bare"])
        for name in names:
            runs = counts[label, name]
            ratios = ", ".join(f"{run / bare:.3f}" for run in runs)
            print(f"{title if name == names[0] else '':38} {name:10} {statistics.median(runs) / per:>12,.0f} "
                  f"{unit:>10} {ratios:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
