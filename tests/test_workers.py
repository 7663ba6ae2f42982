"""Analysis in worker processes (``streamtap_workers``): the same recordings as in-process, and
a worker that dies or falls behind never touches the traffic nor grows the proxy's memory."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import mmap
import os
import pickle
import re
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
from mitmproxy import flow as mitmflow
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import provider_streams as streams
from streamtap.commands.verify import judge_file
from streamtap.mitm.ring import RELEASE_STEP, STEP, Ring, RingSpace
from streamtap.mitm.worker import (
    JOIN_BELOW, LARGE_READ, ORPHANED, RING_ENV, SEND_BYTES, SLOW_FSYNC_ENV, SLOW_START_ENV, STALL_ENV, WORKER_NICE, RemoteFlow, Workers,
)
from streamtap.providers import VerdictKind

HUNG_ENV = "STREAMTAP_TEST_WORKER_HUNG_AFTER"
from streamtap.recording import check_recording, read_recording
from test_metrics import scrape, value
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream, curl, curl_started, find_recording, free_port

WORKER_PID = re.compile(r"analysis worker 0 runs as pid (\d+)")


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


def worker_pids(proxy: Mitmdump, count: int = 1) -> list[int]:
    return [int(pid) for pid in WORKER_PID.findall(proxy.wait_log("analysis worker 0 runs as pid", count=count, timeout=30))]


def peak_rss_kib(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))


def comparable(rec) -> dict:
    """A recording less what differs between any two runs: times, ids and file names (the
    network's chunking, so the reads, can differ too)."""
    end = dict(rec.end)
    turn = dict(end.get("turn") or {})
    turn.pop("timing", None)
    return {
        "body": rec.body,
        "frames": [(f.kind, f.offset, f.raw) for f in rec.frames],
        "wire": sum(length for _, length, _ in rec.reads),
        "verdict": end["verdict"],
        "turn": turn,
        "stream_end": end["stream_end"],
        "notes": rec.notes,
    }


def _usage_nested(depth: int) -> bytes:
    """A chat answer whose usage holds a value nested ``depth`` deep: JSON the decoder takes, deeper
    than pickle goes (a worker that handed its verdict on as it was died of it)."""
    body = streams.openai_chat([f"piece {i} " for i in range(20)])
    assert body.count(b'"usage":{') == 1
    return body.replace(b'"usage":{', b'"usage":{"x":' + b"[" * depth + b"]" * depth + b",")


STREAMS = {
    "chat": Script(streams.openai_chat([f"piece {i} " for i in range(120)]), chunk_size=301),
    "deep-usage": Script(_usage_nested(900), chunk_size=301),
    "chat-cut": Script(streams.openai_chat([f"piece {i} " for i in range(120)]), chunk_size=301, cut_at=5000),
    "anthropic": Script(streams.anthropic("think", "an answer " * 40, {"q": 1}), chunk_size=97),
    "converse": Script(streams.bedrock_converse(["a", "b", "c"] * 30, {"x": [1, 2]}), content_type="application/vnd.amazon.eventstream", chunk_size=133),
    "gzip": Script(streams.openai_chat(["zipped "] * 80), encoding="gzip", chunk_size=211),
}


def tap_settings(tmp_path, **changed) -> dict:
    """What the Tap hands a worker with each flow: recording into ``tmp_path``, with ``changed``."""
    return dict(directory=str(tmp_path), fsync="never", redact=[], redact_allow=[], sentinel=None,
                max_event_size=1 << 20, record=True, compress="none") | changed  # fmt: skip


def test_workers_record_what_the_proxy_records_in_process(upstream, tmp_path):
    for name, script in STREAMS.items():
        upstream.add(name, script)
    got = {}
    for workers in ("0", "1"):
        with Mitmdump(upstream.url, tmp_path / f"w{workers}", options={"streamtap_workers": workers}) as proxy:
            for name in STREAMS:
                out = curl(f"{proxy.url}/s/{name}{CHAT}", "--compressed" if name == "gzip" else "-s")
                expected = gzip.decompress(upstream.last(name).wire) if name == "gzip" else upstream.last(name).wire
                assert out.stdout == expected, name
                rec = find_recording(proxy.record_dir, name)
                assert check_recording(rec) == [], name
                # the times differ from run to run, but each read arrived after the response began
                # and before it ended, in order (the worker makes the proxy's clock readings relative)
                times = [t for _, _, t in rec.reads]
                assert times == sorted(times) and 0 <= times[0] and times[-1] <= rec.end["duration_ms"], (name, times[:3])
                assert all(length for _, length, _ in rec.reads), name  # mitmproxy's empty call at the end is no read
                got[workers, name] = comparable(rec)
            log = proxy.log()
        assert ("analysis worker 0 runs as pid" in log) == (workers == "1")
    for name in STREAMS:
        assert got["1", name] == got["0", name], name
    assert got["1", "chat"]["verdict"]["kind"] == "complete"
    assert got["1", "chat-cut"]["verdict"]["kind"] == "truncated"
    assert got["1", "deep-usage"]["verdict"]["kind"] == "complete"
    assert "died" not in log, log[-3000:]


def test_a_flow_is_not_turned_away_for_its_own_request_body(tmp_path):
    """A ring that refused a read and has nothing in flight is not full; a new flow's 10 kB prompt
    goes into it, and the flow is analysed, not taken for one that met a busy worker (review of
    51d0735: the check ran again after the prompt was in)."""
    from streamtap.mitm.flowspec import FlowSpec

    settings = tap_settings(tmp_path)
    verdicts: list = []
    prompt = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "p" * 10_000}]}).encode()

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        process = workers.processes[0]
        os.close(process.ring.fd)
        process.ring.fd = os.open("/dev/null", os.O_RDONLY)  # the ring cannot grow past its first step
        try:
            first = workers.open(FlowSpec.of(openai_flow(), None), settings)
            workers.stream(first)(b"x" * (STEP + 10))  # more than it has: refused
            workers.send()
            workers.finish(first, "finished", None, None)
            await _until(lambda: len(verdicts) == 1)
            state = (process.behind, process.space.in_flight)
            second = workers.open(FlowSpec.of(_prompted_flow(prompt), None), settings)
            workers.stream(second)(streams.openai_chat(["Paris ", "is ", "sunny."]))
            workers.finish(second, "finished", None, None)
            await _until(lambda: len(verdicts) == 2)
            return state, second.dropped
        finally:
            workers.stop()

    state, dropped = asyncio.run(run())
    assert state == (True, 0)
    assert dropped is None and verdicts[1]["verdict"] == "complete", verdicts[1]


def test_a_request_body_leaves_the_ring_room_for_the_next_flows(tmp_path, monkeypatch):
    """A prompt that would take the ring past the room kept for new flows' reads goes through the
    pipe, so the flow that opens right after it is still analysed."""
    import streamtap.mitm.worker as worker_module
    from streamtap.mitm.flowspec import FlowSpec

    monkeypatch.setattr(worker_module, "MAX_IN_FLIGHT", 4 * SEND_BYTES)  # full from 3 MiB in flight
    settings = tap_settings(tmp_path)
    verdicts: list = []
    prompt = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "p" * (3 * SEND_BYTES)}]}).encode()
    answer = streams.openai_chat(["Paris ", "is ", "sunny."])

    async def run() -> list:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        try:
            remotes = [workers.open(FlowSpec.of(_prompted_flow(prompt), None), settings),
                       workers.open(FlowSpec.of(openai_flow(), None), settings)]  # fmt: skip
            for remote in remotes:
                workers.stream(remote)(answer)
                workers.finish(remote, "finished", None, None)
            await _until(lambda: len(verdicts) == 2)
            return [remote.dropped for remote in remotes]
        finally:
            workers.stop()

    assert asyncio.run(run()) == [None, None]
    assert [summary["verdict"] for summary in verdicts] == ["complete", "complete"], verdicts


def test_each_verdict_reaches_the_other_addons_in_an_update_hook(upstream, tmp_path):
    """mitmweb and user addons learn of a verdict through mitmproxy's update hook: every flow once,
    with its comment set, however many verdicts one hook carries."""
    upstream.add("chat", STREAMS["chat"])
    updates = tmp_path / "updates.jsonl"
    watcher = tmp_path / "watcher.py"
    watcher.write_text(
        "import json\n"
        "def update(flows):\n"
        f"    with open({str(updates)!r}, 'a') as out:\n"
        "        out.write(json.dumps([[flow.id, flow.comment] for flow in flows]) + '\\n')\n"
    )
    proxy = Mitmdump(upstream.url, tmp_path / "proxy", options={"streamtap_workers": "1"})
    proxy.args += ["-s", str(watcher)]
    with proxy:
        clients = [curl_started(f"{proxy.url}/s/chat{CHAT}") for _ in range(6)]
        for client in clients:
            assert client.wait(20) == 0
        proxy.wait_log("streamtap: openai-chat", count=6)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not updates.exists() or updates.read_text().count("streamtap: complete") < 6):
            time.sleep(0.05)
    hooks = [json.loads(line) for line in updates.read_text().splitlines()]
    # mitmproxy sends its own update hooks while a flow runs, before any verdict: no comment yet
    told = [(flow_id, comment) for hook in hooks for flow_id, comment in hook if comment]
    assert len(told) == 6 and len({flow_id for flow_id, _ in told}) == 6, hooks
    assert all(comment.startswith("streamtap: complete: ") for _, comment in told), hooks


def test_verdicts_that_come_in_one_loop_turn_go_out_in_one_update_hook():
    """Each update hook is a call over all of mitmproxy's addons: a worker's reply that carries
    several verdicts tells the other addons once."""
    from mitmproxy.test import taddons, tflow

    from streamtap.mitm.tap import Tap

    class Watcher:
        def __init__(self) -> None:
            self.hooks: list[list] = []

        def update(self, flows) -> None:
            self.hooks.append(list(flows))

    tap, watcher = Tap(), Watcher()
    flows = [tflow.tflow(resp=True) for _ in range(3)]
    remotes = [RemoteFlow(flow.id, 0, time.monotonic(), "openai-chat") for flow in flows]
    summary = {"verdict": "complete", "reason": "r", "stream_end": "finished", "errors": [], "provider": "openai-chat",
               "model": "m", "events": 3, "bytes": 10, "ttft_ms": 1.0, "duration_ms": 2.0, "recording": None}  # fmt: skip

    async def run() -> None:
        for flow, remote in zip(flows, remotes):
            tap.awaiting[remote.key] = (flow, False)
            tap.analysing[flow.id] = remote.key
        for remote in remotes:  # as Workers._received applies one reply
            tap._verdict(remote, dict(summary))
        assert watcher.hooks == []  # told at the end of this loop turn
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    with taddons.context(tap) as tctx:
        tctx.master.addons.add(watcher)
        asyncio.run(run())
    assert watcher.hooks == [flows]
    assert all(flow.comment == "streamtap: complete: r" for flow in flows)


def written_bytes(pid: int) -> int:
    """Bytes the process has handed to write() and the like (its recordings, and its messages to the proxy)."""
    return int(re.search(r"wchar: (\d+)", open(f"/proc/{pid}/io").read()).group(1))


def test_two_workers_share_the_flows_out_and_each_records_its_own(upstream, tmp_path):
    """Flows are shared out by id, so two workers use two processes: 16 flows land on both (all
    on one: a chance of 2 in 65,536), and each worker writes the recordings of its flows."""
    names = [f"share{i}" for i in range(16)]
    for name in names:
        upstream.add(name, Script(streams.openai_chat([f"{name} piece {i} " for i in range(60)]), chunk_size=173))
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_workers": "2"}) as proxy:
        proxy.wait_log("analysis worker 0 runs as pid", timeout=30)
        proxy.wait_log("analysis worker 1 runs as pid", timeout=30)
        pids = {int(i): int(pid) for i, pid in re.findall(r"analysis worker (\d) runs as pid (\d+)", proxy.log())}
        assert sorted(pids) == [0, 1] and pids[0] != pids[1]
        before = {i: written_bytes(pid) for i, pid in pids.items()}
        for name in names:
            assert curl(f"{proxy.url}/s/{name}{CHAT}").stdout == upstream.last(name).wire, name
        proxy.wait_log("streamtap: openai-chat", count=len(names), timeout=60)
        recs = [find_recording(proxy.record_dir, name) for name in names]
        written = {i: written_bytes(pid) - before[i] for i, pid in pids.items()}
    assert all(rec.verdict["kind"] == "complete" and check_recording(rec) == [] for rec in recs)
    recorded = sum(path.stat().st_size for path in proxy.record_dir.glob("*.jsonl"))
    assert sum(written.values()) >= recorded  # the workers wrote every recording
    assert min(written.values()) > min(path.stat().st_size for path in proxy.record_dir.glob("*.jsonl")), written


def kill_worker_holding_a_flow(proxy: Mitmdump, upstream: Upstream, pid: int, client: subprocess.Popen) -> bytes:
    """Once the worker holds the paused flow (its .partial recording has frames), kill it; then let
    the upstream go on. The client's output."""
    try:
        assert upstream.wait_paused()
        deadline = time.monotonic() + 10
        while not any(read_recording(p).frames for p in proxy.record_dir.glob("*.partial.jsonl")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        proxy.wait_log(f"analysis worker 0 (pid {pid}) died")
    finally:
        upstream.release()
        out, err = client.communicate(timeout=20)
    assert client.returncode == 0, err
    return out


def test_a_worker_killed_mid_stream_is_restarted_and_the_traffic_stays_whole(upstream, tmp_path):
    body = streams.openai_chat([f"token {i} " for i in range(400)])
    upstream.arm_pause()
    upstream.add("killed", Script(body, chunk_size=500, pause_after=8000))
    upstream.add("after", Script(body, chunk_size=500))
    port = free_port()
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_metrics": f"127.0.0.1:{port}"}) as proxy:
        [pid] = worker_pids(proxy)
        out = kill_worker_holding_a_flow(proxy, upstream, pid, curl_started(f"{proxy.url}/s/killed{CHAT}"))
        assert out == body == upstream.last("killed").wire  # every byte, unchanged
        log = proxy.wait_log("streamtap: openai-chat", count=1)
        line = next(line for line in log.splitlines() if "streamtap: openai-chat" in line)
        assert "unknown (streamtap's analysis worker died after it was handed" in line
        # the proxy counted every byte it forwarded, not only those it had handed to the worker;
        # the turn under the model the request names (as report and index name it), the error as analysis's
        families = scrape(port)
        assert value(families, "streamtap_stream_bytes_total") == len(body)
        requested = json.loads(STREAM_REQUEST)["model"]
        assert value(families, "streamtap_turns_total", model=requested, verdict="unknown") == 1, families["streamtap_turns"]
        assert value(families, "streamtap_tap_errors_total", part="analysis") == 1
        assert value(families, "streamtap_tap_errors_total", part="tap") == 0
        assert "1 flow(s) lose their analysis" in log
        assert "ends where the worker stopped" in log
        # the restarted worker notes in the dead one's recording why it stops there
        deadline = time.monotonic() + 10
        while True:
            notes = [n for n in find_recording(proxy.record_dir, "killed", partial=True).notes if n.get("kind") == "streamtap_error"]
            if notes or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert notes and "analysis worker died after it was handed" in notes[-1]["message"], notes
        [new_pid] = [p for p in worker_pids(proxy, count=2) if p != pid]
        # the restarted worker records the next flow in full
        assert curl(f"{proxy.url}/s/after{CHAT}").stdout == body
        rec = find_recording(proxy.record_dir, "after")
        assert rec.verdict["kind"] == "complete" and rec.body == body
        os.kill(new_pid, 0)  # still alive
    assert "Traceback" not in proxy.log()


def test_a_worker_runs_below_the_proxy_from_its_first_moment():
    """Its imports take seconds of CPU on a busy machine: at the proxy's priority they would
    compete with the traffic. The proxy lowers it as soon as the process exists."""
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE, 19)

    async def run() -> tuple[int, int]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            at_start = os.getpriority(os.PRIO_PROCESS, workers.processes[0].pid)  # still importing
            deadline = time.monotonic() + 30
            while workers.pids[0] is None:  # it said it runs: past its own call
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            return at_start, os.getpriority(os.PRIO_PROCESS, workers.pids[0])
        finally:
            workers.stop()

    assert asyncio.run(run()) == (expected, expected)


ORPHANED_WORKER = """
import multiprocessing
from streamtap.mitm.ring import Ring
from streamtap.mitm.worker import serve

inbox_r, inbox_w = multiprocessing.Pipe(duplex=False)
outbox_r, outbox_w = multiprocessing.Pipe(duplex=False)
outbox_r.close()  # the proxy is gone before the worker says its first word
ring = Ring.create(1 << 20)
serve(inbox_r, outbox_w, ring.path, 1 << 20)
print("returned")
"""


def test_a_worker_whose_proxy_died_before_it_was_up_ends_without_a_traceback():
    """mitmdump killed while its workers start: each printed a BrokenPipeError traceback from its first word."""
    got = subprocess.run([sys.executable, "-c", ORPHANED_WORKER], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout == "returned\n" and "Traceback" not in got.stderr, got.stderr


def test_a_worker_that_keeps_dying_at_once_is_restarted_less_and_less_often(caplog):
    """A worker that cannot live must not have the proxy spawn Python processes in a loop: the
    first quick death restarts it at once, the second waits 1 s, the third 2 s; flows that begin
    meanwhile go unanalysed and say why, and stopping cancels the restart that waits."""
    async def run() -> dict:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        seen: dict = {}

        async def until(condition) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)

        async def kill_when_running(previous: int | None) -> int:
            await until(lambda: workers.pids[0] not in (None, previous) and workers.processes[0].alive)
            pid = workers.pids[0]
            os.kill(pid, signal.SIGKILL)
            return pid

        try:
            first = workers.processes[0]
            pid = await kill_when_running(None)
            await until(lambda: workers.processes[0] is not first)
            seen["first"] = (workers.quick_deaths[0], workers.restarts[0])
            held = RemoteFlow("held", 0, time.monotonic(), "anthropic", opened=True, generation=workers.generations[0])
            workers.flows[held.key] = held  # as if opened on this worker (no recording yet)
            pid = await kill_when_running(pid)
            died = time.monotonic()
            await until(lambda: workers.quick_deaths[0] == 2)
            seen["second"] = (workers.processes[0].alive, workers.restarts[0] is not None)
            workers.finish(held, "eof", None, None)
            seen["held"] = (held.dropped, list(workers.ops[0]))  # no operations for the next worker about it
            seen["meanwhile"] = workers.open(SimpleNamespace(flow_id="late", started=0.0, detection=None), {}).dropped
            pid = await kill_when_running(pid)
            seen["waited"] = time.monotonic() - died
            await until(lambda: workers.quick_deaths[0] == 3)
            seen["third"] = workers.restarts[0]
        finally:
            workers.stop()
        return seen

    with caplog.at_level("WARNING", logger="streamtap"):
        seen = asyncio.run(run())
    assert seen["first"] == (1, None)  # restarted at once
    assert seen["second"] == (False, True)  # the restart waits
    assert seen["meanwhile"] == "no analysis worker: it died and is not restarted yet"
    assert seen["held"] == ("streamtap's analysis worker died after it was handed 0 bytes of this stream", [])
    assert seen["waited"] >= 1.0
    assert seen["third"] is not None and seen["third"].cancelled()  # stopping cancelled it
    assert "restarting it in 1 s (it died 2 times in a row" in caplog.text
    assert "restarting it in 2 s (it died 3 times in a row" in caplog.text


def test_a_worker_that_cannot_be_restarted_is_tried_again_later(caplog, monkeypatch):
    """No memory for a new ring (say): the restart fails, is said in the log, and is tried again
    after a wait instead of never; once it can, a worker runs again and takes new flows."""
    import streamtap.mitm.worker as worker_module

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)

        async def until(condition) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)

        try:
            await until(lambda: workers.pids[0] is not None)
            first = workers.pids[0]

            def no_ring(size):
                raise OSError("No space left on device")

            monkeypatch.setattr(worker_module.Ring, "create", no_ring)
            os.kill(first, signal.SIGKILL)
            await until(lambda: workers.restarts[0] is not None)
            waiting = not workers.processes[0].alive
            monkeypatch.undo()
            await until(lambda: workers.pids[0] != first and workers.processes[0].alive)
            return waiting, workers.restarts[0]
        finally:
            workers.stop()

    with caplog.at_level("WARNING", logger="streamtap"):
        waiting, pending = asyncio.run(run())
    assert waiting and pending is None
    assert "cannot restart analysis worker 0: OSError: No space left on device; trying again in 1 s" in caplog.text


def test_a_hung_worker_is_killed_and_restarted_and_the_traffic_stays_whole(upstream, tmp_path, monkeypatch):
    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv(STALL_ENV, str(stall))  # the worker hangs at its first reads while this file exists
    # well above the 1 s heartbeat: an idle worker's heartbeat comes late on a loaded machine
    monkeypatch.setenv(HUNG_ENV, "8")
    body = streams.openai_chat([f"token {i} " for i in range(200)])
    upstream.add("hangs", Script(body, chunk_size=500))
    upstream.add("after", Script(body, chunk_size=500))
    port = free_port()
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_metrics": f"127.0.0.1:{port}"}) as proxy:
        [pid] = worker_pids(proxy)
        started = time.monotonic()
        assert curl(f"{proxy.url}/s/hangs{CHAT}").stdout == body == upstream.last("hangs").wire  # not held up
        assert time.monotonic() - started < 5  # not held until the hung worker is killed
        proxy.wait_log(f"analysis worker 0 (pid {pid}) has said nothing for", timeout=20)
        stall.unlink()
        proxy.wait_log(f"analysis worker 0 (pid {pid}) died")
        log = proxy.wait_log("streamtap: openai-chat")  # logged just after the death: wait for it too
        line = next(line for line in log.splitlines() if "streamtap: openai-chat" in line)
        assert "unknown (streamtap's analysis worker died after it was handed" in line
        # the proxy counted every byte it forwarded, not only those it had handed to the worker
        assert value(scrape(port), "streamtap_stream_bytes_total") == len(body)
        [new_pid] = [p for p in worker_pids(proxy, count=2) if p != pid]
        assert curl(f"{proxy.url}/s/after{CHAT}").stdout == body
        rec = find_recording(proxy.record_dir, "after")
        assert rec.verdict["kind"] == "complete" and rec.body == body
        time.sleep(9)  # longer than HUNG_AFTER: an idle worker's heartbeat keeps it alive
        os.kill(new_pid, 0)
        assert proxy.log().count("has said nothing for") == 1
    assert "Traceback" not in proxy.log()


def test_a_worker_slow_to_start_is_not_taken_for_hung(upstream, tmp_path, monkeypatch):
    """A new Python at a lower priority can take many seconds to start on a loaded machine:
    before its first word a worker is given START_WAIT, not HUNG_AFTER, so it is not killed
    (and restarted, and killed again) while it starts."""
    monkeypatch.setenv(HUNG_ENV, "1")
    monkeypatch.setenv(SLOW_START_ENV, "4")
    body = streams.openai_chat(["slow ", "start"])
    upstream.add("slow", Script(body))
    with Mitmdump(upstream.url, tmp_path / "m") as proxy:
        worker_pids(proxy)
        assert curl(f"{proxy.url}/s/slow{CHAT}").stdout == body
        rec = find_recording(proxy.record_dir, "slow")
        log = proxy.log()
    assert rec.verdict["kind"] == "complete"
    assert "has said nothing for" not in log and log.count("runs as pid") == 1


def test_a_stalled_worker_falls_behind_without_holding_the_traffic_or_the_memory(upstream, tmp_path, monkeypatch):
    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv(STALL_ENV, str(stall))  # the worker stalls at its first reads while this file exists
    monkeypatch.setenv(HUNG_ENV, "600")  # slow, not hung: not to be killed however slow this machine is
    ring = 16 * 1024 * 1024  # a quarter of the shipped ring: the bound is the same rule, with a quarter of the traffic
    monkeypatch.setenv(RING_ENV, str(ring))
    size = 3 * ring
    line = b"data: " + b"x" * 16377 + b"\n\n"  # 16 KiB events, not parsed as JSON: this is about bytes
    body = line * (size // len(line))
    upstream.add("flood", Script(body, content_type="text/event-stream", chunk_size=64 * 1024))
    upstream.add("small", Script(streams.openai_chat(["hi"])))
    upstream.add("late", Script(streams.openai_chat(["too", " late"])))
    port = free_port()
    options = {"streamtap_filter": "~u /s/", "streamtap_metrics": f"127.0.0.1:{port}"}
    with Mitmdump(upstream.url, tmp_path / "m", options=options) as proxy:
        worker_pids(proxy)
        assert curl(f"{proxy.url}/s/small{CHAT}").returncode == 0  # the worker stalls on this one
        before = peak_rss_kib(proxy.process.pid)
        out = curl(f"{proxy.url}/s/flood{CHAT}", max_time=120)  # while the worker stalls
        grown = peak_rss_kib(proxy.process.pid) - before
        late = curl(f"{proxy.url}/s/late{CHAT}")  # begins while the ring is full
        assert stall.exists()
        stall.unlink()
        assert late.returncode == 0 and late.stdout == upstream.last("late").wire
        assert out.returncode == 0 and out.stdout == body == upstream.last("flood").wire
        # bounded by the bytes in flight to the worker (plus a batch or two), not by the body
        assert grown * 1024 < 2 * ring < size, grown
        log = proxy.wait_log("analysis fell behind at byte")
        behind = int(re.search(r"analysis fell behind at byte (\d+)", log).group(1))
        assert 0 < behind <= ring
        rec = find_recording(proxy.record_dir, "flood", timeout=120)
        proxy.wait_log("streamtap: openai-chat", count=3, timeout=60)  # every verdict applied
        # the proxy counted every byte it forwarded, not only those its worker analysed
        forwarded = sum(len(upstream.last(name).wire) for name in ("small", "flood", "late"))
        assert value(scrape(port), "streamtap_stream_bytes_total") == forwarded
    assert rec.verdict["kind"] == "unknown"
    assert any(f"analysis fell behind at byte {behind}" in note.get("message", "") for note in rec.notes), rec.notes
    assert rec.body == body[: len(rec.body)] and len(rec.body) == behind  # what was analysed is recorded, whole
    assert check_recording(rec) == []
    # a flow that began while its worker was behind is not analysed, and its recording says so
    late_rec = find_recording(proxy.record_dir, "late", timeout=60)
    assert late_rec.verdict["kind"] == "unknown" and late_rec.body == b""
    assert any("analysis fell behind at byte 0" in note.get("message", "") for note in late_rec.notes), late_rec.notes
    assert check_recording(late_rec) == []
    # verify: the late recording stops where analysis stopped, not where its answer did (its no
    # bytes read as truncated; the answer came whole); the flood's bytes held are no JSON, as it said
    judged = judge_file(late_rec.path, None, None)
    assert judged.analysis.verdict.kind is VerdictKind.UNKNOWN and judged.problem is None, judged
    assert judged.analysis.verdict.evidence["analysis_stopped_at"] == 0
    assert judged.analysis.verdict.evidence["held_bytes_read_as"] == "truncated"
    judged = judge_file(rec.path, None, None)
    assert judged.analysis.verdict.kind is VerdictKind.CORRUPT and judged.problem is None, judged


def allocated(ring) -> int:
    """Bytes of memory (or disk) the ring's file holds."""
    return os.fstat(ring.fd).st_blocks * 512


def test_the_ring_lives_in_memory_where_it_can_and_takes_memory_only_as_it_is_reserved():
    ring = Ring.create(8 * STEP)
    try:
        assert ring.path.startswith("/dev/shm/") or not os.access("/dev/shm", os.W_OK)
        assert ring.backed == STEP and allocated(ring) == STEP  # sparse beyond the first step
        worker_side = Ring.attach(ring.path, 8 * STEP)  # as the worker maps it: the name goes
        assert not os.path.exists(ring.path)
        assert ring.reserve(3 * STEP + 1) and ring.backed == allocated(ring) == 4 * STEP
        ring.put(3 * STEP, [b"01234", b"56789"])
        assert worker_side.get(3 * STEP, 10) == b"0123456789"
        ring.release(STEP + 1)  # what the proxy does once nothing is in flight above byte STEP + 1
        assert ring.backed == allocated(ring) == 2 * STEP  # whole steps
        ring.release(0)
        assert ring.backed == allocated(ring) == STEP  # never below the first step
        assert ring.reserve(8 * STEP) and allocated(ring) == 8 * STEP
        ring.release(STEP)  # at most RELEASE_STEP at a time: each call holds up the proxy's loop
        assert ring.backed == allocated(ring) == 8 * STEP - RELEASE_STEP
        ring.release(STEP)
        assert ring.backed == allocated(ring) == STEP
        ring.put(10, [b"kept"])
        assert worker_side.get(10, 4) == b"kept"
    finally:
        ring.close()
    assert ring.fd is None


def _kernel_populates_on_request() -> bool:
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23), 0, mmap.PAGESIZE)  # Linux's number, not the ring's
        return True
    except (OSError, ValueError):
        return False
    finally:
        probe.close()


@pytest.mark.skipif(not _kernel_populates_on_request(), reason="this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
def test_the_proxy_writes_reads_into_the_ring_without_a_page_fault_per_page():
    # each fault is a trap into the kernel on the proxy's loop: 256 per MiB of answer without this
    ring = Ring.create(8 * STEP)
    try:
        assert ring.reserve(5 * STEP)
        answer = b"x" * (5 * STEP)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ring.put(0, [answer])
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        assert faults < 5 * STEP // mmap.PAGESIZE // 10, faults
    finally:
        ring.close()


def test_a_ring_that_cannot_get_memory_refuses_the_put_instead_of_faulting_the_proxy():
    ring = Ring.create(4 * STEP)
    try:
        os.close(ring.fd)
        ring.fd = os.open("/dev/null", os.O_RDONLY)  # posix_fallocate fails here, as on a full /dev/shm
        assert not ring.reserve(2 * STEP) and ring.backed == STEP
    finally:
        ring.close()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), max_size=120))
@example(steps=[(1, 0), (1, 0), (1, 0), (39, 1), (1, 0), (1, 3), (22, 0)])  # room only between two runs in flight
def test_ring_space_never_hands_out_bytes_in_flight(steps):
    """Puts (in 64-byte units) and acknowledgements of the oldest puts, as the worker sends them:
    no put overlaps one in flight or leaves the ring, and one is refused only when the ring is
    at least half taken."""
    unit, size = 64, 64 * 64
    space = RingSpace(size, keep=16 * unit)
    flight: list[tuple[int, int]] = []  # (at, length), oldest first
    for units, acks in steps:
        length = units * unit
        at = space.where(length, backed=size)
        if at is None:
            assert sum(n for _, n in flight) + length > size // 2
        else:
            assert 0 <= at and at + length <= size
            assert all(at + length <= a or a + n <= at for a, n in flight)
            space.take(at, length)
            flight.append((at, length))
        acked, flight = flight[:acks], flight[acks:]
        space.acknowledge(sum(n for _, n in acked))
        assert space.in_flight == sum(n for _, n in flight)
        assert space.top() == max((a + n for a, n in flight), default=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 9)), max_size=200))
def test_ring_space_cycles_through_its_first_step_while_the_worker_keeps_up(steps):
    """With what is in flight never over half of ``keep``, every put stays in the first ``keep``
    bytes: memory follows what is in flight, not the traffic that went through."""
    unit, keep = 64, 64 * 64
    space = RingSpace(16 * keep, keep=keep)
    flight: list[int] = []
    for units, ack in steps:
        length = units * unit
        while flight and space.in_flight + length > keep // 2:
            space.acknowledge(flight.pop(0))
        at = space.where(length, backed=16 * keep)
        assert at is not None and at + length <= keep
        space.take(at, length)
        flight.append(length)
        if ack == 0:  # now and then the worker catches up on everything
            space.acknowledge(sum(flight))
            flight.clear()


def test_the_ring_grows_for_a_burst_and_gives_the_memory_back_after_it(tmp_path, monkeypatch):
    """A real worker, stalled while 8 MiB of reads wait for it: the ring takes memory for them;
    once they are acknowledged and the ring has not grown for a while, all but the first step
    goes back. Light traffic after that cycles through the first steps."""
    import streamtap.mitm.worker as worker_module

    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv(STALL_ENV, str(stall))

    async def run() -> dict[str, int]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        process = workers.processes[0]
        seen: dict[str, int] = {"start": allocated(process.ring)}
        try:
            remote = RemoteFlow("f", 0, time.monotonic(), "anthropic")
            stream = workers.stream(remote)
            read = b"r" * (64 * 1024)
            for _ in range(8 * 16):  # 8 MiB, a batch per 1 MiB
                stream(read)
                await asyncio.sleep(0)
            workers.send()
            assert remote.dropped is None
            seen["burst"] = allocated(process.ring)
            stall.unlink()
            deadline = time.monotonic() + 30
            while process.space.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert process.space.in_flight == 0
            workers.expire()  # not yet: the ring grew moments ago
            seen["at once"] = allocated(process.ring)
            monkeypatch.setattr(worker_module, "RELEASE_AFTER", 0.0)
            for _ in range(16):  # RELEASE_STEP at a time
                workers.expire()
            seen["released"] = allocated(process.ring)
            small = b"s" * 4096
            for i in range(3000):  # 12 MiB more, a little at a time, as a worker that keeps up sees it
                stream(small)
                await asyncio.sleep(0.001 if i % 16 == 0 else 0)
            workers.send()
            seen["light"] = allocated(process.ring)
            assert remote.dropped is None
            return seen
        finally:
            workers.stop()

    seen = asyncio.run(run())
    assert seen["start"] == STEP
    assert seen["burst"] >= 8 * STEP  # what was in flight, and not the whole ring
    assert seen["at once"] == seen["burst"]
    assert seen["released"] == STEP
    assert seen["light"] <= 3 * STEP, seen


def test_a_ring_without_memory_drops_the_flow_from_analysis_and_takes_the_next_flows_again():
    """/dev/shm full: a batch that needs more ring memory than it has is refused, and the flow
    falls behind, with a warning; the traffic is untouched. With nothing in flight, the next
    flows are still handed on (no acknowledgement will come to say the worker caught up)."""

    async def run() -> tuple[str | None, bool, bool, str | None]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        process = workers.processes[0]
        try:
            os.close(process.ring.fd)
            process.ring.fd = os.open("/dev/null", os.O_RDONLY)  # posix_fallocate now fails
            big = RemoteFlow("big", 0, time.monotonic(), "anthropic")
            stream = workers.stream(big)
            read = b"b" * (64 * 1024)
            for _ in range(2 * STEP // len(read)):  # more than the ring's first step, in one batch
                assert stream(read) is read
            workers.send()
            refused = (process.behind, process.full)
            small = RemoteFlow("small", 0, time.monotonic(), "anthropic")
            workers.stream(small)(b"data: {}\n\n")
            workers.send()
            return big.dropped, *refused, small.dropped
        finally:
            workers.stop()

    big_dropped, behind, full, small_dropped = asyncio.run(run())
    assert big_dropped == "analysis fell behind" and behind
    assert not full and small_dropped is None


def test_large_reads_go_to_the_worker_once_a_mebibyte_waits_and_small_ones_at_the_batch_interval():
    """What the proxy holds between batches: large reads (over LARGE_READ) are counted, and once
    SEND_BYTES of them wait a batch goes at the end of the loop turn; small reads, which mitmproxy
    cannot deliver fast enough to matter, wait for the interval without being counted."""

    async def feed() -> tuple[bool, bool]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            remote = RemoteFlow("f", 0, time.monotonic(), "anthropic")
            stream = workers.stream(remote)
            stream(b"x")
            await asyncio.sleep(0.01)  # the first read after a quiet spell goes at once
            assert not workers.scheduled and not remote.chunks
            small = b"s" * LARGE_READ
            for _ in range(2 * SEND_BYTES // LARGE_READ):  # 2 MiB of small reads, in one loop turn
                assert stream(small) is small
            after_small = workers.scheduled
            large = b"L" * (64 * 1024)
            for _ in range(SEND_BYTES // len(large) + 1):
                assert stream(large) is large
            return after_small, workers.scheduled
        finally:
            workers.stop()

    after_small, after_large = asyncio.run(feed())
    assert not after_small  # waiting for the interval's timer
    assert after_large  # over SEND_BYTES of large reads: sent at the end of this turn


def openai_flow():
    """A finished mitmproxy flow of a streamed Chat Completions call, as the proxy would open it."""
    from mitmproxy.test import tflow

    flow = tflow.tflow(resp=True)
    flow.request.host, flow.request.path, flow.request.method = "api.openai.com", "/v1/chat/completions", "POST"
    flow.request.content = b'{"model":"m","stream":true,"messages":[]}'
    flow.response.headers["content-type"] = "text/event-stream"
    return flow


async def _until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_worker_behind_on_a_slow_disk_keeps_its_flows_past_the_verdict_wait(tmp_path, monkeypatch):
    """The verdicts of flows that ended more than VERDICT_WAIT ago were given up on while their
    worker, alive and getting on with its work, was still behind them (the soak review: 651 of
    14,000 flows unknown, their recordings finished as complete, errored, truncated...). Only a
    worker that takes no work for as long loses them."""
    import streamtap.mitm.worker as worker_module
    from streamtap.mitm.flowspec import FlowSpec

    monkeypatch.setenv(SLOW_FSYNC_ENV, "0.3")  # each recording's end waits for a slow disk
    monkeypatch.setattr(worker_module, "VERDICT_WAIT", 3.0)  # (a busy worker says so about once a second)
    settings = tap_settings(tmp_path, fsync="end")
    verdicts: list = []
    answer = streams.openai_chat(["Paris ", "is ", "sunny."])

    async def run() -> None:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary["verdict"]),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        try:
            await _until(lambda: workers.processes[0].spoke)
            for _ in range(20):  # 6 s of syncs: the last verdicts come 3 s after the wait
                remote = workers.open(FlowSpec.of(openai_flow(), None), settings)
                workers.stream(remote)(answer)
                workers.finish(remote, "finished", None, None)
            workers.send()
            while len(verdicts) < 20:
                workers.expire()
                await asyncio.sleep(0.1)
        finally:
            workers.stop()

    asyncio.run(run())
    assert verdicts == ["complete"] * 20, verdicts


def test_a_worker_that_hangs_before_its_first_word_is_killed_and_restarted(monkeypatch, caplog):
    """A worker stuck at its start (here: stopped before it could say anything) is hung like any
    other, once START_WAIT (a slow start's allowance) is over: its start counts as the last time
    it spoke."""
    import streamtap.mitm.worker as worker_module

    monkeypatch.setattr(worker_module, "HUNG_AFTER", 1.0)
    monkeypatch.setattr(worker_module, "START_WAIT", 1.5)

    async def run() -> tuple[bool, int | None, int]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        first = workers.processes[0]
        os.kill(first.process.pid, signal.SIGSTOP)  # long before its interpreter has started
        try:

            def expired_and_restarted() -> bool:
                workers.expire()
                return workers.processes[0] is not first and workers.processes[0].alive

            await _until(expired_and_restarted, timeout=20)
            await _until(lambda: workers.pids[0] is not None)
            await _until(lambda: first.exitcode is not None, timeout=10)  # reaped
            return first.killed, first.exitcode, first.pid
        finally:
            workers.stop()

    with caplog.at_level("WARNING", logger="streamtap"):
        killed, exitcode, pid = asyncio.run(run())
    assert killed and exitcode == -signal.SIGKILL
    assert f"analysis worker 0 (pid {pid}) has said nothing for" in caplog.text  # its pid, though it never said it


class PipedSpec(SimpleNamespace):
    """A flow's spec whose request goes through the pipe (a large body goes through the ring
    while the ring has room, and then through the pipe)."""

    def request_body_apart(self):
        return self, None


def test_a_worker_that_takes_no_work_gets_no_more_flows_than_a_bounded_backlog(monkeypatch):
    """Each flow's OPEN carries its request. A worker that reads nothing (stopped, but not yet
    found hung) must not have the requests of every new flow pile up in the proxy: past
    MAX_UNSENT waiting for its pipe, new flows go unanalysed, and their verdict says why."""
    import streamtap.mitm.worker as worker_module

    said: list = []
    prompt = b"p" * (1024 * 1024)  # one request of 1 MiB per flow

    async def run() -> tuple[int, list, list]:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda remote, why: said.append(why))
        await _until(lambda: workers.pids[0] is not None)
        process = workers.processes[0]
        os.kill(workers.pids[0], signal.SIGSTOP)
        try:
            remotes, most = [], 0
            for i in range(3 * worker_module.MAX_UNSENT // len(prompt)):
                remote = workers.open(PipedSpec(flow_id=f"f{i}", started=0.0, detection=None, body=prompt), {})
                workers.stream(remote)(b"data: {}\n\n")
                workers.send()
                most = max(most, len(process.unsent))
                remotes.append(remote)
            for remote in remotes:
                workers.finish(remote, "finished", None, None)
            return most, [remote.dropped for remote in remotes], list(said)  # before the worker reads again
        finally:
            os.kill(workers.pids[0], signal.SIGCONT)
            workers.stop(0.5)

    most, dropped, lost = asyncio.run(run())
    assert most <= worker_module.MAX_UNSENT + 2 * len(prompt), most
    refused = [why for why in dropped if why is not None]
    assert refused and all(why.startswith("no analysis: its worker has taken no work for a while") for why in refused)
    assert dropped[0] is None  # the first flows went to the worker as usual
    assert lost == refused  # each refused flow is judged unknown, with the reason, at its end


def test_workers_that_cannot_all_start_leave_no_worker_behind(monkeypatch):
    """The second worker's ring cannot be made: the proxy analyses in-process instead, so the
    first worker, already started, must go too, not live on beside it."""
    import multiprocessing

    import streamtap.mitm.worker as worker_module

    create = Ring.create
    made: list = []

    def second_fails(size):
        if made:
            raise OSError("No space left on device")
        made.append(create(size))
        return made[-1]

    monkeypatch.setattr(worker_module.Ring, "create", second_fails)
    errors: list = []

    async def run() -> list:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: errors.append(context))
        with pytest.raises(OSError, match="No space left"):
            Workers(2, loop, verdict=lambda *a: None, lost=lambda *a: None)
        await asyncio.sleep(1.5)  # longer than a worker's heartbeat
        return [child.name for child in multiprocessing.active_children()]

    children = asyncio.run(run())
    assert "streamtap-worker-0" not in children
    assert errors == []


def test_a_flow_tapped_again_before_its_verdict_came_gets_both_verdicts(tmp_path):
    """mitmproxy's client replay sends the same flow, id and all, again. When the second run
    starts before the first run's verdict is back (a worker that is behind makes that seconds),
    each run still gets its own verdict: the first complete, the second, cut, not."""
    from streamtap.mitm.flowspec import FlowSpec

    flow = openai_flow()
    body = streams.openai_chat(["Paris ", "is ", "sunny."])
    settings = tap_settings(tmp_path)
    verdicts: list = []

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append((remote, summary)),
                          lost=lambda remote, why: verdicts.append((remote, why)))  # fmt: skip
        try:
            first = workers.open(FlowSpec.of(flow, None), settings)
            workers.stream(first)(body)
            workers.finish(first, "finished", None, None)
            second = workers.open(FlowSpec.of(flow, None), settings)  # before the first verdict is back
            workers.stream(second)(body[:40])
            await _until(lambda: len(verdicts) == 1)
            workers.finish(second, "upstream_reset", "connection cut", None)
            await _until(lambda: len(verdicts) == 2)
            return first, second, dict(workers.flows)
        finally:
            workers.stop()

    first, second, left = asyncio.run(run())
    assert [remote for remote, _ in verdicts] == [first, second] and first.flow_id == second.flow_id
    assert verdicts[0][1]["verdict"] == "complete"
    assert verdicts[1][1]["verdict"] not in ("complete", "unknown"), verdicts[1][1]
    assert left == {}
    assert len(list(tmp_path.glob("*.jsonl"))) == 2  # a recording of each run


@pytest.mark.parametrize("read_size", [1, 200, JOIN_BELOW - 1, JOIN_BELOW, 3 * JOIN_BELOW])
def test_reads_reach_the_worker_byte_exact_and_read_by_read_whether_joined_or_put_one_by_one(tmp_path, read_size):
    """A batch's reads go into the ring joined when they average under JOIN_BELOW, one by one
    otherwise; either way the recording has every byte and every read as the proxy saw it."""
    from streamtap.mitm.flowspec import FlowSpec
    from streamtap.recording import read_recording

    body = streams.openai_chat([f"word{i} " for i in range(4000)])
    reads = [body[i : i + read_size] for i in range(0, len(body), read_size)]
    if read_size < JOIN_BELOW:  # the first 400, then the rest in one large read: the last batch mixes sizes
        reads = [*reads[:400], body[400 * read_size :]]
    assert len(reads) >= 30  # several batches of 10 whole reads each, then the rest
    settings = tap_settings(tmp_path)
    verdicts: list = []

    async def run() -> None:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        try:
            remote = workers.open(FlowSpec.of(openai_flow(), None), settings)
            stream = workers.stream(remote)
            for number, read in enumerate(reads):
                assert stream(read) is read
                if number % 10 == 9:  # a batch of 10 reads of read_size (JOIN_BELOW: one by one, just)
                    workers.send()
            workers.finish(remote, "finished", None, None)
            await _until(lambda: verdicts)
        finally:
            workers.stop()

    asyncio.run(run())
    assert verdicts[0]["verdict"] == "complete", verdicts
    [path] = tmp_path.glob("*.jsonl")
    recording = read_recording(path)
    assert recording.body == body
    assert [length for _, length, _ in recording.reads] == [len(read) for read in reads if read]


def _prompted_flow(prompt: bytes, encoding: str | None = None):
    flow = openai_flow()
    flow.request.headers.pop("content-encoding", None)
    if encoding:
        flow.request.headers["content-encoding"] = encoding
    flow.request.raw_content = gzip.compress(prompt, mtime=0) if encoding == "gzip" else prompt
    return flow


def _run_flows(flows: list, tmp_path, *, break_ring: bool = False) -> tuple[list, list[int], int]:
    """Each flow through one worker, one after another: the verdicts, the size of every message
    the pipe carried, and the ring bytes still in flight once the last verdict was back."""
    from streamtap.mitm.flowspec import FlowSpec

    settings = tap_settings(tmp_path)
    verdicts: list = []
    piped: list[int] = []
    body = streams.openai_chat(["Paris ", "is ", "sunny."])

    async def run() -> int:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        process = workers.processes[0]
        send = process.send
        process.send = lambda batch: (piped.append(len(pickle.dumps(batch))), send(batch))
        if break_ring:  # posix_fallocate fails from here on: the ring takes nothing
            os.close(process.ring.fd)
            process.ring.fd = os.open("/dev/null", os.O_RDONLY)
        try:
            for number, flow in enumerate(flows, 1):
                remote = workers.open(FlowSpec.of(flow, None), settings)
                workers.stream(remote)(body)
                workers.finish(remote, "finished", None, None)
                await _until(lambda: len(verdicts) == number)
            return process.space.in_flight
        finally:
            workers.stop()

    in_flight = asyncio.run(run())
    return verdicts, piped, in_flight


def test_a_large_request_body_goes_to_the_worker_through_the_ring_byte_exact(tmp_path):
    """A 300 KiB prompt is copied into the ring, not pickled into the pipe, and the recording's
    header has it as sent (also gzip-encoded); the ring has it back once the verdict is in."""
    from streamtap.recording import read_recording

    prompt = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    verdicts, piped, in_flight = _run_flows([_prompted_flow(prompt), _prompted_flow(prompt, "gzip")], tmp_path)
    assert [summary["verdict"] for summary in verdicts] == ["complete", "complete"], verdicts
    assert max(piped) < 20_000, piped  # the prompts went through the ring
    assert in_flight == 0
    headers = [read_recording(path).header for path in sorted(tmp_path.glob("*.jsonl"))]
    assert len(headers) == 2 and all(header["request"]["body"] == json.loads(prompt) for header in headers)


def test_a_request_body_the_ring_cannot_take_goes_through_the_pipe(tmp_path):
    """A prompt larger than the ring's memory, which cannot grow: it goes in the OPEN, as a
    small one does, and still reaches the recording's header; the answer's reads fit the ring."""
    from streamtap.recording import read_recording

    prompt = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "y" * (STEP + STEP // 2)}]}).encode()
    verdicts, piped, in_flight = _run_flows([_prompted_flow(prompt)], tmp_path, break_ring=True)
    assert verdicts[0]["verdict"] == "complete", verdicts
    assert max(piped) > len(prompt) and in_flight == 0
    [path] = tmp_path.glob("*.jsonl")
    assert read_recording(path).header["request"]["body"] == json.loads(prompt)


def test_a_flow_whose_analysis_raises_in_the_worker_is_judged_unknown_at_its_end_with_the_reason(tmp_path):
    """A streamtap bug in the worker (here: settings the flow's tap cannot take) costs that flow
    its analysis, not the worker: at the flow's end it is judged unknown at once, saying what
    raised, instead of after VERDICT_WAIT with no reason; the next flow is analysed as usual."""
    from streamtap.mitm.flowspec import FlowSpec

    flow = openai_flow()
    body = streams.openai_chat(["fine"])
    good = dict(directory=str(tmp_path), fsync="never", redact=[], redact_allow=[], sentinel=None,
                max_event_size=1 << 20, record=False, compress="none")  # fmt: skip
    said: list = []

    async def run() -> float:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: said.append(summary["verdict"]),
                          lost=lambda remote, why: said.append(why))  # fmt: skip
        try:
            bad = workers.open(FlowSpec.of(flow, None), {**good, "no_such_setting": 1})
            workers.stream(bad)(body)
            ended = time.monotonic()
            workers.finish(bad, "finished", None, None)
            await _until(lambda: said)
            waited = time.monotonic() - ended
            after = workers.open(FlowSpec.of(flow, None), good)
            workers.stream(after)(body)
            workers.finish(after, "finished", None, None)
            await _until(lambda: len(said) == 2)
            return waited
        finally:
            workers.stop()

    waited = asyncio.run(run())
    assert said[0].startswith("analysis failed: TypeError:") and "no_such_setting" in said[0], said
    assert waited < 10  # not VERDICT_WAIT
    assert said[1] == "complete"


async def _recorded_and_restart_waits(workers: Workers, flow, settings: dict) -> RemoteFlow:
    """A flow recorded by worker 0, which then dies twice in a row: its restart waits (1 s)."""
    from streamtap.mitm.flowspec import FlowSpec

    await _until(lambda: workers.pids[0] is not None)
    first = workers.pids[0]
    os.kill(first, signal.SIGKILL)  # the first quick death: restarted at once
    await _until(lambda: workers.pids[0] not in (None, first) and workers.processes[0].alive)
    remote = workers.open(FlowSpec.of(flow, None), settings)
    workers.stream(remote)(streams.openai_chat(["half"])[:60])
    await _until(lambda: remote.recording is not None)
    await asyncio.sleep(0.2)  # its frames reach the file (fsync always)
    os.kill(workers.pids[0], signal.SIGKILL)  # the second in a row: the restart waits 1 s
    await _until(lambda: workers.restarts[0] is not None)
    return remote


def test_a_proxy_that_stops_while_a_restart_waits_still_notes_why_the_recording_stops(tmp_path):
    """The recording a dead worker left gets its note from the next worker; when the proxy stops
    before that worker starts (a worker that keeps dying waits to be restarted), the proxy writes it."""
    from streamtap.recording import read_recording

    flow = openai_flow()
    settings = tap_settings(tmp_path, fsync="always")

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            remote = await _recorded_and_restart_waits(workers, flow, settings)
            return remote, list(workers.ops[0])
        finally:
            workers.stop()

    remote, waiting = asyncio.run(run())
    assert [op[0] for op in waiting] == [ORPHANED]  # for the worker that did not start
    notes = [note["message"] for note in read_recording(remote.recording).notes]
    assert any(message.startswith("analysis: streamtap's analysis worker died after it was handed") for message in notes), notes


def test_a_note_sent_to_a_worker_that_dies_before_it_reads_it_goes_to_the_next(tmp_path, monkeypatch):
    """Worker 1 dies holding a recording: worker 2 is sent the note why it stops, and dies before
    it reads it (here: while it starts). The note was lost; it now waits until a worker says it
    wrote it, so worker 3 writes it, once."""
    from streamtap.mitm.flowspec import FlowSpec
    from streamtap.recording import read_recording

    flow = openai_flow()
    settings = tap_settings(tmp_path, fsync="always")

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            await _until(lambda: workers.pids[0] is not None)
            remote = workers.open(FlowSpec.of(flow, None), settings)
            workers.stream(remote)(streams.openai_chat(["half"])[:60])
            await _until(lambda: remote.recording is not None)
            await asyncio.sleep(0.2)  # its frames reach the file (fsync always)
            monkeypatch.setenv(SLOW_START_ENV, "60")  # worker 2 reads nothing for a minute
            first = workers.pids[0]
            os.kill(first, signal.SIGKILL)
            second = None

            def note_sent() -> bool:
                nonlocal second
                process = workers.processes[0]
                if process.pid == first or not process.alive or workers.ops[0] or process.unsent:
                    return False
                second = process.pid
                return True

            await _until(note_sent)
            assert [op[0] for op in workers.processes[0].notes] == [ORPHANED]
            monkeypatch.delenv(SLOW_START_ENV)
            os.kill(second, signal.SIGKILL)
            await _until(lambda: workers.pids[0] not in (None, first))  # worker 3 is up
            await _until(lambda: not workers.processes[0].notes and not workers.ops[0])
            return remote, read_recording(remote.recording)
        finally:
            workers.stop()

    remote, recording = asyncio.run(run())
    notes = [note["message"] for note in recording.notes if note.get("kind") == "streamtap_error"]
    assert notes == [f"analysis: {remote.dropped}; the recording ends where it stopped"], notes


def test_a_worker_killed_before_it_said_its_recordings_name_still_gets_the_note_in_it(tmp_path):
    """The worker names a flow's recording to the proxy only after the batch that opened it is
    done. Killed in between (here: while it analyses a large first read), the proxy does not know
    the name; the next worker finds the recording by the flow's start and id and notes why it stops."""
    from streamtap.mitm.flowspec import FlowSpec
    from streamtap.recording import read_recording

    flow = openai_flow()
    settings = tap_settings(tmp_path)
    body = streams.openai_chat([f"w{i} " for i in range(40_000)])  # seconds of analysis in one batch

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            await _until(lambda: workers.pids[0] is not None)
            first = workers.pids[0]
            remote = workers.open(FlowSpec.of(flow, None), settings)
            workers.stream(remote)(body)  # goes with the OPEN, in one batch
            # its header line whole: a worker killed before that leaves a file that holds no
            # recording yet, and no note is added to it (note_unfinished)
            await _until(lambda: any(b"\n" in path.read_bytes() for path in tmp_path.glob("*.partial.jsonl")), timeout=10)
            unnamed = remote.recording is None
            os.kill(first, signal.SIGKILL)
            await _until(lambda: workers.pids[0] not in (None, first) and workers.processes[0].alive)
            path = next(tmp_path.glob("*.partial.jsonl"))
            await _until(lambda: any(n.get("kind") == "streamtap_error" for n in read_recording(path).notes))
            return unnamed, remote, read_recording(path)
        finally:
            workers.stop()

    unnamed, remote, recording = asyncio.run(run())
    assert unnamed, "the worker said the recording's name before it was killed: the case was not met"
    assert remote.dropped and remote.dropped.startswith("streamtap's analysis worker died after it was handed")
    notes = [note["message"] for note in recording.notes if note.get("kind") == "streamtap_error"]
    assert notes == [f"analysis: {remote.dropped}; the recording ends where it stopped"], notes
    assert not recording.complete_file


def test_a_worker_killed_after_it_finished_a_recording_but_before_its_verdict_came_gives_that_verdict(tmp_path):
    """The worker sends a batch's verdicts when the whole batch is done. Killed in between (here:
    a flow's end and a large read of another flow in one batch), the first flow's recording is
    finished and renamed, and its end line holds the verdict: the proxy gives that verdict and
    names that file, not the .partial name it knew, nor ``unknown``."""
    from streamtap.mitm.flowspec import FlowSpec

    settings = tap_settings(tmp_path)
    small = streams.openai_chat(["a ", "whole ", "answer"])
    large = streams.openai_chat([f"w{i} " for i in range(40_000)])  # seconds of analysis in one batch
    verdicts, lost = {}, {}

    async def run() -> tuple:
        workers = Workers(
            1, asyncio.get_running_loop(),
            verdict=lambda remote, summary: verdicts.__setitem__(remote.key, summary),
            lost=lambda remote, why: lost.__setitem__(remote.key, why),
        )  # fmt: skip
        try:
            await _until(lambda: workers.pids[0] is not None)
            first = workers.pids[0]
            finished = workers.open(FlowSpec.of(openai_flow(), None), settings)
            other = workers.open(FlowSpec.of(openai_flow(), None), settings)
            workers.stream(finished)(small)
            await _until(lambda: finished.recording is not None and other.recording is not None)
            partial = finished.recording
            workers.finish(finished, "finished", None, None)
            workers.stream(other)(large)  # its reads go after the FINISH, in the same batch
            await _until(lambda: any(".partial" not in path.name for path in tmp_path.glob("*.jsonl")), timeout=10)
            assert not verdicts, "the verdict came before the worker was killed: the case was not met"
            os.kill(first, signal.SIGKILL)
            await _until(lambda: finished.key in verdicts or finished.key in lost)
            return finished, partial
        finally:
            workers.stop()

    finished, partial = asyncio.run(run())
    assert finished.key not in lost, lost
    summary = verdicts[finished.key]
    final = next(path for path in tmp_path.glob("*.jsonl") if ".partial" not in path.name)
    assert summary["recording"] == str(final) != partial
    assert summary["verdict"] == judge_file(final, None, None).analysis.verdict.kind.value == VerdictKind.COMPLETE.value
    assert summary["events"] > 3 and summary["bytes"] == len(small) and summary["stream_end"] == "finished"


def _alive(pid: int) -> bool:
    """Is ``pid`` a running process (not gone, and not a zombie waiting to be reaped)?"""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_change_of_streamtap_workers_while_running_takes_the_new_flows_and_lets_the_open_ones_finish(upstream, tmp_path):
    """Set in mitmweb's options (as a user does in its UI or the console): the new count takes
    the next flows; a flow open at the change finishes, recorded whole, in the worker it started
    in, which then stops; 0 moves new flows into the proxy's loop; a count out of range is
    refused with the reason, and the running count stays."""
    from test_mitmweb import MITMWEB, PASSWORD, Mitmweb

    if not MITMWEB.exists():
        pytest.skip(f"{MITMWEB} is missing")
    body = streams.openai_chat([f"token {i} " for i in range(400)])
    upstream.arm_pause()
    upstream.add("held", Script(body, chunk_size=500, pause_after=8000))
    upstream.add("in-two", Script(body, chunk_size=500))
    upstream.add("in-proxy", Script(body, chunk_size=500))
    with Mitmweb(upstream.url, tmp_path / "web", {}) as proxy:
        api = httpx.Client(base_url=proxy.web_url, headers={"Authorization": f"Bearer {PASSWORD}"}, timeout=10)
        token = "0123456789abcdef"
        api.cookies.set("_mitmproxy_xsrf", token)

        def set_workers(value) -> httpx.Response:
            return api.put("/options", json={"streamtap_workers": value}, headers={"X-XSRFToken": token})

        [first] = worker_pids(proxy)
        client = curl_started(f"{proxy.url}/s/held{CHAT}")
        try:
            assert upstream.wait_paused()
            deadline = time.monotonic() + 10
            while not find_recording(proxy.record_dir, "held", partial=True).frames:  # the first pool holds it
                assert time.monotonic() < deadline
                time.sleep(0.02)
            answer = set_workers(2)
            assert answer.status_code == 200, answer.text
            proxy.wait_log("new flows are analysed in 2 analysis worker(s); the 1 flow(s) under way finish in the workers they started in")
            log = proxy.wait_log("runs as pid", count=3, timeout=30)  # the new pool's two, beside the first
            new = {int(pid) for pid in re.findall(r"analysis worker \d runs as pid (\d+)", log)} - {first}
            assert len(new) == 2, log
            assert curl(f"{proxy.url}/s/in-two{CHAT}").stdout == body
            rec = find_recording(proxy.record_dir, "in-two")
            assert rec.verdict["kind"] == "complete" and rec.body == body
            assert _alive(first)  # it still holds the open flow
        finally:
            upstream.release()
            out, err = client.communicate(timeout=20)
        assert client.returncode == 0, err
        assert out == body
        rec = find_recording(proxy.record_dir, "held")
        assert rec.verdict["kind"] == "complete" and rec.body == body
        assert check_recording(rec) == []
        deadline = time.monotonic() + 10
        while _alive(first) and time.monotonic() < deadline:  # its flow done, the old worker stops
            time.sleep(0.1)
        assert not _alive(first)
        assert all(_alive(pid) for pid in new)

        answer = set_workers(0)
        assert answer.status_code == 200, answer.text
        proxy.wait_log("new flows are analysed in the proxy's loop (streamtap_workers=0)")
        deadline = time.monotonic() + 10
        while any(map(_alive, new)) and time.monotonic() < deadline:  # they held no flow: they stop at once
            time.sleep(0.1)
        assert not any(map(_alive, new))
        assert curl(f"{proxy.url}/s/in-proxy{CHAT}").stdout == body  # analysed in the proxy, with no worker left
        rec = find_recording(proxy.record_dir, "in-proxy")
        assert rec.verdict["kind"] == "complete" and rec.body == body

        refused = set_workers(65)
        assert refused.status_code == 400 and "65 is outside 0..64 processes" in refused.text, refused.text
        assert api.get("/options").json()["streamtap_workers"]["value"] == 0
        api.close()
    log = proxy.log()
    assert "Traceback" not in log and "hung" not in log and "died" not in log, log


def test_a_retired_pool_finishes_its_flows_then_its_workers_stop_and_it_is_gone(tmp_path):
    """What the Tap does when streamtap_workers changes: the old pool, retired, still takes the
    reads and the end of a flow it holds and gives its verdict. A worker that holds no flow stops
    at once; the one that holds the flow stops after its verdict, without the loop waiting on it;
    then the pool says it is gone (the Tap then forgets it)."""
    from streamtap.mitm.flowspec import FlowSpec

    settings = tap_settings(tmp_path)
    verdicts: list = []
    body = streams.openai_chat(["still ", "analysed."])

    async def run() -> tuple:
        workers = Workers(2, asyncio.get_running_loop(), verdict=lambda remote, summary: verdicts.append(summary),
                          lost=lambda remote, why: verdicts.append(why))  # fmt: skip
        try:
            await _until(lambda: None not in workers.pids)
            remote = workers.open(FlowSpec.of(openai_flow(), None), settings)
            busy, idle = workers.processes[remote.shard], workers.processes[1 - remote.shard]
            workers.stream(remote)(body[:50])
            workers.retire()
            await _until(lambda: not idle.alive, timeout=10)
            workers.expire()
            await asyncio.sleep(0.3)
            await _until(lambda: idle.exitcode is not None, timeout=10)  # reaped (at once, or in a second or two under load)
            held = (busy.alive, workers.gone, idle.exitcode)
            workers.stream(remote)(body[50:])
            workers.finish(remote, "finished", None, None)
            await _until(lambda: verdicts)
            started = time.monotonic()
            workers.expire()
            left_in = time.monotonic() - started
            leaving = workers.gone  # asked to stop; its exit is seen on this loop, so not before the next await
            await _until(lambda: workers.gone, timeout=10)
            await _until(lambda: busy.exitcode is not None, timeout=10)
            return held, left_in, leaving, busy.exitcode
        finally:
            workers.stop()

    held, left_in, leaving, exitcode = asyncio.run(run())
    assert held == (True, False, 0)
    assert verdicts[0]["verdict"] == "complete", verdicts
    assert left_in < 0.1 and not leaving and exitcode == 0


def test_a_retired_pools_worker_that_dies_is_not_restarted_and_the_proxy_notes_its_recording(tmp_path, caplog):
    """A retired pool takes no new flows, so a worker of it that dies is not replaced: its flows
    lose their analysis as with any death, and the note a new worker would have written into the
    recording it left is written by the proxy."""
    from streamtap.mitm.flowspec import FlowSpec
    from streamtap.recording import read_recording

    settings = tap_settings(tmp_path, fsync="always")
    said: list = []
    body = streams.openai_chat(["one ", "two."])

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda remote, summary: said.append(summary["verdict"]),
                          lost=lambda remote, why: said.append(why))  # fmt: skip
        try:
            await _until(lambda: workers.pids[0] is not None)
            remote = workers.open(FlowSpec.of(openai_flow(), None), settings)
            workers.stream(remote)(body[:40])
            await _until(lambda: remote.recording is not None)
            workers.retire()
            process = workers.processes[0]
            os.kill(process.pid, signal.SIGKILL)
            await _until(lambda: not process.alive)
            await asyncio.sleep(0.3)
            restarted = workers.processes[0] is not process or workers.restarts[0] is not None
            workers.stream(remote)(body[40:])
            workers.finish(remote, "finished", None, None)
            await _until(lambda: said)
            notes = [note["message"] for note in read_recording(remote.recording).notes]  # before stop() could write it
            return restarted, workers.gone, notes
        finally:
            workers.stop()

    restarted, gone, notes = asyncio.run(run())
    assert not restarted and gone
    assert said[0].startswith("streamtap's analysis worker died after it was handed"), said
    assert any("analysis worker died after it was handed" in message for message in notes), notes
    assert "1 flow(s) lose their analysis" in caplog.text and "restarting" not in caplog.text


def test_a_pool_retired_while_a_restart_waits_writes_the_note_itself_and_starts_no_worker(tmp_path):
    """A worker that keeps dying waits to be restarted; the worker it waits for would only write
    the note into the recording the dead one left. Retired meanwhile, the pool writes it at once
    and starts nobody."""
    from streamtap.recording import read_recording

    settings = tap_settings(tmp_path, fsync="always")

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            remote = await _recorded_and_restart_waits(workers, openai_flow(), settings)
            workers.finish(remote, "finished", None, None)
            workers.retire()
            notes = [note["message"] for note in read_recording(remote.recording).notes]
            await asyncio.sleep(1.5)  # past the restart's wait
            return notes, workers.restarts[0], workers.processes[0].alive, workers.gone
        finally:
            workers.stop()

    notes, restart, alive, gone = asyncio.run(run())
    assert any(message.startswith("analysis: streamtap's analysis worker died after it was handed") for message in notes), notes
    assert restart is None and not alive and gone


# -- streamtap_workers changed in a running Tap (mitmproxy's test context, real workers) -------


def _ring_mappings() -> int:
    """This process's mappings of a streamtap ring."""
    return sum("streamtap-ring-" in line for line in open("/proc/self/maps"))


@contextlib.asynccontextmanager
async def _running_tap(tmp_path, workers: int, *addons):
    """The Tap in mitmproxy's test context, running on this loop with ``workers`` real workers."""
    from mitmproxy.test import taddons

    from streamtap.mitm.tap import Tap

    tap = Tap()
    with taddons.context(tap, *addons) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path), streamtap_workers=workers)
        tap.running()
        try:
            if workers:
                await _until(lambda: None not in tap.pools.current.pids)
            yield tap, tctx
        finally:
            tap.done()


def _open_flow(tap):
    flow = openai_flow()
    flow.response.content = None  # streamed: mitmproxy keeps no body
    tap.responseheaders(flow)
    assert callable(flow.response.stream)
    return flow


def _new_pool(tap, old, count: int):
    """Until the Tap runs a pool other than ``old`` of ``count`` workers, each of which said its pid."""
    def ready() -> bool:
        workers = tap.pools.current
        return workers is not old and workers is not None and len(workers.processes) == count and None not in workers.pids
    return _until(ready, timeout=30)


def test_retired_pools_give_their_rings_and_pipes_back_while_the_flows_they_analysed_are_kept(tmp_path):
    """mitmweb keeps every flow, and each flow its stream callable, which holds the pool that
    analysed it: a retired pool outlives its workers. Their rings' memory and their pipes go back
    as each worker exits, not when (if ever) the pool is collected."""
    body = streams.openai_chat(["kept ", "flow."])
    kept = []

    async def run() -> tuple:
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            before = (_ring_mappings(), len(os.listdir("/proc/self/fd")))
            for count in (2, 1, 2, 1):
                old = tap.pools.current
                flow = _open_flow(tap)
                flow.response.stream(body)
                flow.response.stream(b"")
                tap.response(flow)
                kept.append(flow)
                await _until(lambda: not tap.awaiting)
                tctx.options.update(streamtap_workers=count)
                await _new_pool(tap, old, count)
            await _until(lambda: not tap.pools.retiring, timeout=20)
            # a worker's process can end a moment after its pipes closed: its handle goes when it is reaped
            deadline = time.monotonic() + 10
            while len(os.listdir("/proc/self/fd")) > before[1] + 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            return before, (_ring_mappings(), len(os.listdir("/proc/self/fd")))

    (maps_before, fds_before), (maps_after, fds_after) = asyncio.run(run())
    assert all(flow.metadata["streamtap"]["verdict"] == "complete" for flow in kept)
    assert maps_before == maps_after == 1  # the running pool's one worker; six retired ones gave theirs back
    assert fds_after <= fds_before + 2, (fds_before, fds_after)


def test_changes_in_quick_succession_start_one_pool_and_a_rolled_back_change_none(tmp_path, caplog):
    """mitmweb's number field sends an update per keystroke, and mitmproxy, when another option of
    an update is refused, sets every option back: only the count that stays is started, once."""
    import logging

    from mitmproxy import exceptions

    from streamtap.mitm.pools import RESIZE_AFTER

    assert RESIZE_AFTER > 0.1  # keystrokes 50 ms apart are one change

    class Picky:
        def load(self, loader):
            loader.add_option("picky", str, "ok", "refuses any other value")

        def configure(self, updated):
            from mitmproxy import ctx

            if "picky" in updated and ctx.options.picky != "ok":
                raise exceptions.OptionsError("picky: no")

    caplog.set_level(logging.INFO, logger="streamtap")

    async def run() -> tuple:
        async with _running_tap(tmp_path, 1, Picky()) as (tap, tctx):
            first = tap.pools.current
            for count in (2, 3, 4, 2):  # typed, or stepped with the arrows, a keystroke each 50 ms
                tctx.options.update(streamtap_workers=count)
                await asyncio.sleep(0.05)
            await _new_pool(tap, first, 2)
            second = tap.pools.current
            await _until(lambda: not tap.pools.retiring)
            with pytest.raises(exceptions.OptionsError):
                tctx.options.update(streamtap_workers=3, picky="bad")
            await asyncio.sleep(1.5)
            return second, tap.pools.current, tctx.options.streamtap_workers, list(tap.pools.retiring)

    second, running, option, retiring = asyncio.run(run())
    assert running is second and len(running.processes) == 2 and option == 2 and retiring == []
    started = [message for message in caplog.messages if "runs as pid" in message]
    assert len(started) == 3, started  # the first pool's worker, then the last count's two


def test_workers_that_cannot_start_leave_the_running_ones_and_the_option_says_so(tmp_path, caplog, monkeypatch):
    from streamtap.mitm import pools as pools_module

    def no_room(*args, **kwargs):
        raise OSError("no room for the ring")

    async def run() -> tuple:
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            first = tap.pools.current
            monkeypatch.setattr(pools_module, "Workers", no_room)
            tctx.options.update(streamtap_workers=3)
            await _until(lambda: tctx.options.streamtap_workers == 1, timeout=10)
            flow = _open_flow(tap)  # still analysed by the running worker
            flow.response.stream(streams.openai_chat(["still ", "here."]))
            flow.response.stream(b"")
            tap.response(flow)
            await _until(lambda: not tap.awaiting)
            return first, tap.pools.current, tap.pools.retiring, flow.metadata["streamtap"]["verdict"]

    first, running, retiring, verdict = asyncio.run(run())
    assert running is first and retiring == [] and verdict == "complete"
    assert "cannot start 3 analysis workers: OSError: no room for the ring; streamtap_workers stays 1" in caplog.text


def test_a_flow_analysed_in_the_proxy_keeps_its_lines_flushed_every_tenth_of_a_second_after_workers_start(tmp_path):
    """A flow opened while streamtap_workers was 0 is analysed in the proxy to its end; its lines
    must still reach the file within FLUSH_EVERY (a killed proxy loses no more), though the
    flusher, with workers running, wakes only every EXPIRE_EVERY for them."""
    from streamtap.mitm.flowtap import FLUSH_EVERY, FlowTap

    def event(text: str) -> bytes:
        return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()

    async def run() -> list[float]:
        async with _running_tap(tmp_path, 0) as (tap, tctx):
            flow = _open_flow(tap)
            in_proxy = tap.open[flow.id]
            assert isinstance(in_proxy, FlowTap)
            tctx.options.update(streamtap_workers=1)
            await _new_pool(tap, None, 1)
            path = Path(in_proxy.partial_path())
            waited = []
            for i in range(5):
                flow.response.stream(event(f"flushed-{i}-a"))
                await asyncio.sleep(0.01)  # analysed (and flushed, a tenth of a second after the last)
                flow.response.stream(event(f"flushed-{i}-b"))  # analysed next turn: held in the buffer
                started = time.monotonic()
                await _until(lambda: f"flushed-{i}-b".encode() in path.read_bytes(), timeout=5)
                waited.append(time.monotonic() - started)
            flow.response.stream(b"")
            tap.response(flow)
            return waited

    waited = asyncio.run(run())
    assert max(waited) < FLUSH_EVERY * 4, waited  # every 1 s, five in a row would all wait under 0.4 s about 1% of the time


def test_the_first_flow_analysed_in_the_proxy_after_a_change_to_0_is_flushed_without_waiting_for_the_workers_pace(tmp_path):
    """With workers, the flusher sleeps a second at a time. A change to 0 wakes it, so the first
    flow analysed in the proxy does not wait out the sleep under way for its lines to reach the file."""
    def event(text: str) -> bytes:
        return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()

    async def run() -> float:
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            ticks = []
            expire = tap.pools.expire

            def counted() -> None:
                ticks.append(time.monotonic())
                expire()

            tap.pools.expire = counted  # each wake of the flusher ends here
            await _until(lambda: len(ticks) >= 2, timeout=10)  # its sleeps are now the workers' long ones
            seen = len(ticks)
            await _until(lambda: len(ticks) > seen, timeout=10)
            tctx.options.update(streamtap_workers=0)  # applied half a second into the flusher's sleep
            await _until(lambda: tap.pools.current is None, timeout=10)
            flow = _open_flow(tap)
            path = Path(tap.open[flow.id].partial_path())
            flow.response.stream(event("first"))
            await asyncio.sleep(0.01)
            flow.response.stream(event("second"))  # analysed next turn, held in the writer's buffer
            started = time.monotonic()
            await _until(lambda: b"second" in path.read_bytes(), timeout=5)
            waited = time.monotonic() - started
            flow.response.stream(b"")
            tap.response(flow)
            return waited

    waited = asyncio.run(run())
    assert waited < 0.3, waited  # the sleep under way had about half a second left


def _gated_workers(monkeypatch, fail: int | None = None):
    """Pools the Tap starts wait for the returned gate before they start (one starting off the
    loop, in slow motion); a pool of ``fail`` workers then fails to start. Returns the gate and
    the counts asked for."""
    import threading

    from streamtap.mitm import pools as pools_module

    real, gate, asked = pools_module.Workers, threading.Event(), []

    def gated(count, *args, **kwargs):
        asked.append(count)
        gate.wait(30)
        if count == fail:
            raise OSError("no room for the ring")
        return real(count, *args, **kwargs)

    monkeypatch.setattr(pools_module, "Workers", gated)
    return gate, asked


def test_a_change_made_while_a_pool_starts_still_waits_for_the_keystrokes_after_it(tmp_path, monkeypatch):
    """The count typed while a pool starts is applied after the same wait as any change: a 3 then
    a 4 start a pool of 4, not one of 3 and then one of 4."""
    async def run() -> tuple:
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            gate, asked = _gated_workers(monkeypatch)
            first = tap.pools.current
            tctx.options.update(streamtap_workers=2)
            await _until(lambda: tap.pools.starting)
            tctx.options.update(streamtap_workers=3)  # its wait starts now
            gate.set()
            await _until(lambda: not tap.pools.starting)  # the pool of 2 started, and holds no flow
            at_once = list(asked)
            tctx.options.update(streamtap_workers=4)
            await _new_pool(tap, first, 4)
            await _until(lambda: not tap.pools.retiring)
            return at_once, asked

    at_once, asked = asyncio.run(run())
    assert at_once == [2] and asked == [2, 4]


def test_a_start_that_fails_after_the_count_changed_again_tries_the_new_count(tmp_path, monkeypatch, caplog):
    async def run() -> tuple:
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            gate, asked = _gated_workers(monkeypatch, fail=3)
            first = tap.pools.current
            tctx.options.update(streamtap_workers=3)
            await _until(lambda: tap.pools.starting)
            tctx.options.update(streamtap_workers=2)
            gate.set()
            await _new_pool(tap, first, 2)
            return asked, tctx.options.streamtap_workers

    asked, option = asyncio.run(run())
    assert asked == [3, 2] and option == 2
    assert "cannot start 3 analysis workers: OSError: no room for the ring" in caplog.text
    assert "stays" not in caplog.text


def test_a_proxy_that_stops_while_new_workers_start_leaves_no_ring_and_no_worker_behind(tmp_path):
    """mitmproxy shutting down while a changed count's workers start: the start runs to its end
    (asyncio waits for it), and its workers are stopped then, before the interpreter exits and
    kills them, maybe before they could remove their rings' files."""
    import subprocess
    import sys

    script = """
import asyncio, sys
from mitmproxy.test import taddons
from streamtap.mitm import pools as pools_module, tap as tap_module
pools, real = [], pools_module.Workers
def kept(*args, **kwargs):
    pools.append(real(*args, **kwargs))
    return pools[-1]
pools_module.Workers = kept
async def main():
    tap = tap_module.Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=sys.argv[1], streamtap_workers=0)
        tap.running()
        tctx.options.update(streamtap_workers=4)
        while not tap.pools.starting:
            await asyncio.sleep(0.005)
        tap.done()  # what mitmproxy does at shutdown, here while the 4 start
asyncio.run(main())
for pool in pools:
    for process in pool.processes:
        print(process.ring.path, process.pid)
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "addon")})
    assert done.returncode == 0, done.stderr
    started = [line.split() for line in done.stdout.splitlines()]
    assert len(started) == 4, done.stdout
    time.sleep(0.5)
    assert [path for path, _ in started if os.path.exists(path)] == []
    assert [pid for _, pid in started if _alive(int(pid))] == []


def test_a_flow_a_pool_failed_to_open_is_not_held_and_does_not_keep_a_retired_pool(tmp_path, monkeypatch):
    """The Tap leaves a flow untapped when ``open`` raises, so no end will ever come for it: the
    pool must not count it as one it holds, or a retired pool would keep that worker for good."""
    from streamtap.mitm.flowspec import FlowSpec

    def no_ring(process, spec):
        raise OSError("the ring is gone")

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            await _until(lambda: workers.pids[0] is not None)
            monkeypatch.setattr(Workers, "_request_body_into_ring", staticmethod(no_ring))
            with pytest.raises(OSError):
                workers.open(FlowSpec.of(openai_flow(), None), tap_settings(tmp_path))
            held = dict(workers.flows)
            workers.retire()
            await _until(lambda: workers.gone, timeout=10)
            return held
        finally:
            workers.stop()

    assert asyncio.run(run()) == {}


def test_a_worker_whose_process_ends_a_while_after_its_pipes_is_reaped_not_left_a_zombie(monkeypatch):
    import slow_exiting_worker

    import streamtap.mitm.worker as worker_module

    monkeypatch.setattr(worker_module, "serve", slow_exiting_worker.serve)

    async def run() -> tuple:
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            await _until(lambda: workers.pids[0] is not None)
            workers.retire()  # holds no flow: it takes STOP, closes its pipes, and ends 2 s later
            await _until(lambda: workers.gone)
            process = workers.processes[0]
            await _until(lambda: process.exitcode is not None, timeout=10)
            return process.pid, process.exitcode
        finally:
            workers.stop()

    pid, exitcode = asyncio.run(run())
    assert exitcode == 0 and not os.path.exists(f"/proc/{pid}")


def test_a_worker_that_cannot_get_its_pipes_leaves_no_ring_file(monkeypatch):
    """Out of file descriptors after the ring is made: the ring's file would stay in /dev/shm
    until the machine restarts."""
    import multiprocessing

    import streamtap.mitm.worker as worker_module

    rings, real_create = [], worker_module.Ring.create
    spawn, real_pipe = multiprocessing.get_context("spawn"), multiprocessing.get_context("spawn").Pipe
    pipes = []

    def kept(size):
        rings.append(real_create(size))
        return rings[-1]

    def second_fails(duplex=True):
        if pipes:
            raise OSError(24, "Too many open files")
        pipes.append(real_pipe(duplex))
        return pipes[-1]

    monkeypatch.setattr(worker_module.Ring, "create", kept)
    monkeypatch.setattr(spawn, "Pipe", second_fails)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="Too many open files"):
        worker_module._Process(0, 1, None, lambda *a: None, lambda *a: None)
    [ring] = rings
    assert not os.path.exists(ring.path) and ring.fd is None
    assert all(pipe.closed for pipe in pipes[0]) and len(os.listdir("/proc/self/fd")) == fds


def test_a_tap_stopped_while_its_new_workers_start_does_not_hold_the_loop(tmp_path):
    """A script reload stops the Tap while the proxy carries traffic: the workers still starting
    are killed, not each given seconds to take a STOP they cannot read yet."""
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def run() -> None:
        async with _running_tap(tmp_path, 0) as (tap, tctx):
            ticks = asyncio.create_task(ticker())
            tctx.options.update(streamtap_workers=4)
            await _until(lambda: tap.pools.starting)
            gaps.clear()
            tap.done()
            await _until(lambda: not tap.pools.starting, timeout=30)
            await asyncio.sleep(0.1)
            ticks.cancel()

    asyncio.run(run())
    assert max(gaps) < 0.5, max(gaps)


def _arrival_gaps(url: str) -> tuple[bytes, float]:
    """A streamed answer read through ``url``: its body, and the longest wait between two reads."""
    body, longest = b"", 0.0
    with httpx.stream("POST", url, content=STREAM_REQUEST, timeout=30) as response:
        last = None
        for piece in response.iter_raw():
            now = time.monotonic()
            if last is not None:
                longest = max(longest, now - last)
            last, body = now, body + piece
    return body, longest


@pytest.mark.parametrize("workers", ["8", "0"])
def test_a_script_reload_holds_no_stream_and_the_flows_under_way_keep_their_analysis(upstream, tmp_path, workers):
    """mitmproxy runs a script again when its file changes (as an upgrade of streamtap does). The
    old Tap stopped its workers on the loop, holding every stream: 8 workers held it 0.8 s, 16
    2.5 s. The flows under way were logged as fallen behind, got no verdict, and kept a recording
    cut at the reload, and their live faults never said what they did. The new Tap takes them and
    the workers over, and the new Faults addon their faults."""
    script = tmp_path / "streamtap_script.py"
    script.write_text("from streamtap.mitm.entry import make_addons\naddons = make_addons()\n")
    body = streams.openai_chat([f"tick {i} " for i in range(150)])
    upstream.add("ticking", Script(body, gap=0.01))  # one event every 10 ms, for ~1.5 s
    options = {"streamtap_workers": workers, "streamtap_fault": "fragment:max=64"}  # a live fault under way too
    with Mitmdump(upstream.url, tmp_path / "m", script=script, options=options) as proxy:
        if workers != "0":
            proxy.wait_log("runs as pid", count=int(workers), timeout=60)
        time.sleep(1.1)  # a new modification time, whatever the file system's resolution
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(_arrival_gaps, f"{proxy.url}/s/ticking{CHAT}")
            time.sleep(0.5)
            script.write_text(script.read_text() + "# changed\n")
            got, longest = reading.result(timeout=60)
        proxy.wait_log("Loading script", count=2)
        assert got == body == upstream.last("ticking").wire
        log = proxy.wait_log("streamtap: openai-chat")
        rec = find_recording(proxy.record_dir, "ticking")
        assert curl(f"{proxy.url}/s/ticking{CHAT}").stdout == body  # a flow after the reload
        log = proxy.wait_log("streamtap: openai-chat", count=2)
    assert longest < 0.3, longest
    assert rec.verdict["kind"] == "complete" and rec.body == body
    assert "fell behind" not in log and "Traceback" not in log, log[-3000:]
    assert log.count(" complete: ") == 2, log[-3000:]
    assert log.count("fault fragment:max=64: ") == 2, log[-3000:]  # each flow's live fault said what it did
    assert log.count("runs as pid") == int(workers)  # the same workers: none stopped, none started


def test_verdicts_that_come_back_while_mitmproxy_stops_are_still_given(upstream, tmp_path, monkeypatch):
    """Flows that ended just before a SIGTERM: the worker answers while the proxy waits for it to
    stop, when the event loop runs no more callbacks; each still gets its log line."""
    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv(STALL_ENV, str(stall))  # the worker holds its first reads while this file exists
    body = streams.openai_chat(["last ", "words"])
    names = [upstream.add(f"stopping-{i}", Script(body)) for i in range(3)]
    proxy = Mitmdump(upstream.url, tmp_path / "m").start()
    try:
        for name in names:
            assert curl(f"{proxy.url}/s/{name}{CHAT}").stdout == body
        proxy.process.send_signal(signal.SIGTERM)  # the proxy stops with every verdict still to come
        time.sleep(0.5)
        stall.unlink()  # the worker answers now, while the proxy waits for it
        proxy.process.wait(15)
    finally:
        proxy.stop()
    log = proxy.log()
    verdicts = [line for line in log.splitlines() if "streamtap: openai-chat" in line and " complete: " in line]
    assert len(verdicts) == len(names), log
    assert "before their verdicts came back" not in log and "Traceback" not in log


def test_a_proxy_stopped_before_its_worker_is_up_still_gets_the_recordings_of_its_flows(upstream, tmp_path, monkeypatch):
    """mitmdump stopped just after its start, on a machine loaded enough that the worker is not up
    yet: the worker used to be killed after the 3 s every worker gets, and the flows that ended
    before the stop had no recording. One still starting gets STOP_WAIT_STARTING."""
    monkeypatch.setenv(SLOW_START_ENV, "4.5")  # up 4.5 s after its start: past 3 s from the stop below
    body = streams.openai_chat(["said ", "early"])
    upstream.add("early", Script(body))
    proxy = Mitmdump(upstream.url, tmp_path / "m").start()
    try:
        assert curl(f"{proxy.url}/s/early{CHAT}").stdout == body
        proxy.process.send_signal(signal.SIGTERM)
        proxy.process.wait(30)
    finally:
        proxy.stop()
    log = proxy.log()
    assert "waiting up to 7 s for analysis worker(s) still starting, to record the 1 flow(s) they hold" in log, log
    rec = find_recording(proxy.record_dir, "early", timeout=1)
    assert rec.verdict["kind"] == "complete" and rec.body == body
    assert "streamtap: openai-chat" in log and "Traceback" not in log


def test_two_pools_with_workers_still_starting_stop_against_one_deadline(tmp_path, monkeypatch):
    """A change of streamtap_workers leaves a retiring pool beside the current one. At exit each
    pool with a worker still starting that holds flows waited its own STOP_WAIT_STARTING, one
    after the other: twice the wait, past a container's 10 s stop timeout for 7 s each."""
    from streamtap.mitm.flowspec import FlowSpec
    from streamtap.mitm.pools import Pools

    monkeypatch.setenv(SLOW_START_ENV, "60")  # not up within the wait below
    settings = tap_settings(tmp_path)
    wait = 4.0  # longer than the 3 s every worker gets

    async def run() -> float:
        pools = Pools(verdict=lambda remote, summary: None, lost=lambda remote, why: None, into_loop=lambda: None)
        loop = asyncio.get_running_loop()
        pools.retiring = [Workers(1, loop, verdict=pools._verdict, lost=pools._lost)]
        pools.current = Workers(1, loop, verdict=pools._verdict, lost=pools._lost)
        for workers in pools.all():
            remote = workers.open(FlowSpec.of(openai_flow(), None), settings)
            workers.stream(remote)(streams.openai_chat(["held"]))
            workers.finish(remote, "finished", None, None)
        started = time.monotonic()
        pools.stop(starting=wait)
        return time.monotonic() - started

    took = asyncio.run(run())
    assert wait <= took < 1.5 * wait, took


def test_the_workers_that_are_up_are_told_to_stop_before_one_still_starting():
    """A worker still starting reads nothing, so writing STOP into its full pipe waits up to its
    deadline, which without ``starting`` (a script reload) is everyone's: told first, it left the
    workers that are up no time to close their recordings (d9a77da sorted by deadline alone)."""
    from streamtap.mitm.worker import stop_pools

    told: list[int] = []

    class Process:
        def __init__(self, index: int, up: bool) -> None:
            self.index, self.spoke = index, up

        def tell_stop(self, deadline: float) -> None:
            told.append(self.index)

        def wait_stopped(self, deadline: float) -> None:
            pass

        def take_replies(self, received) -> None:
            pass

    pool = Workers.__new__(Workers)
    pool.processes = [Process(0, up=False), Process(1, up=True), Process(2, up=True)]
    pool.flows = {key: SimpleNamespace(shard=key) for key in range(3)}  # each holds a flow
    pool.restarts, pool.ops, pool.stopping = [None] * 3, [[], [], []], False
    pool.send = lambda: None
    pool._write_notes = lambda index: None
    stop_pools([pool], timeout=1.0, starting=None)
    assert told == [1, 2, 0], told


@pytest.mark.slow
def test_a_worker_still_starting_gets_its_flows_even_when_they_fill_its_pipe(upstream, tmp_path, monkeypatch):
    """1,500 flows while the only worker starts fill its pipe (each OPEN carries the flow's
    request). Its STOP and the flows' last operations were written with the 3 s every worker gets,
    not the 7 s of one still starting: given up on, and 978 flows had no recording at all."""
    # up 9 s after its start: the flows take ~4 s here, over 6 s beside the rest of the suite (a worker
    # that imports nothing of mitmproxy is up about 0.45 s sooner, which 6 s left too close)
    monkeypatch.setenv(SLOW_START_ENV, "9")
    # the worker runs at nice 10: beside other tests it may take far longer than 7 s for 1,500 flows,
    # and what is tested is that it is given them all, which the 3 s the pipe was written for did not
    monkeypatch.setenv("STREAMTAP_TEST_STOP_WAIT_STARTING", "60")
    body = streams.openai_chat(["said ", "early"])
    upstream.add("crowd", Script(body))
    request = json.dumps({"model": "gpt-test-1", "stream": True, "messages": [{"role": "user", "content": "x" * 16000}]})
    flows = 1500
    proxy = Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_fsync": "never"}).start()  # (no disk waits)
    try:
        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
            def one(_: int) -> bytes:
                return client.post(f"{proxy.url}/s/crowd{CHAT}", content=request, headers={"content-type": "application/json"}).content
            assert all(got == body for got in pool.map(one, range(flows)))
        proxy.process.send_signal(signal.SIGTERM)
        proxy.process.wait(90)
    finally:
        proxy.stop()
    log = proxy.log()
    if "waiting up to 60 s for analysis worker(s) still starting" not in log:
        pytest.skip("the flows took longer than the worker's start on this machine: it was up before the stop")
    assert len([path for path in proxy.record_dir.glob("*.jsonl") if not path.name.endswith(".partial.jsonl")]) == flows
    assert log.count(" complete: ") == flows and "before their verdicts came back" not in log, log[-3000:]


def test_ctrl_c_stops_the_proxy_and_its_worker_without_a_traceback(upstream, tmp_path):
    """A terminal's Ctrl-C reaches the whole process group, the worker too: the proxy stops it."""
    body = streams.openai_chat(["interrupted ", "quietly"])
    upstream.add("ctrl-c", Script(body))
    proxy = Mitmdump(upstream.url, tmp_path / "m").start()
    try:
        [pid] = worker_pids(proxy)
        assert curl(f"{proxy.url}/s/ctrl-c{CHAT}").stdout == body
        proxy.wait_log("streamtap: openai-chat")
        os.kill(pid, signal.SIGINT)  # as the terminal sends it, to every process of the group
        proxy.process.send_signal(signal.SIGINT)
        proxy.process.wait(15)
    finally:
        proxy.stop()
    log = proxy.log()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert "died" not in log, log  # the worker did not die of it: it was stopped


def test_a_shutdown_waits_for_stuck_workers_together_not_one_after_another(upstream, tmp_path):
    """Each stuck worker had its own 3 s in turn: 4 of them held mitmdump's exit 12 s, past a
    supervisor's stop timeout. They are now told to stop first, then waited for together."""
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_workers": "4"}) as proxy:
        log = proxy.wait_log("runs as pid", count=4, timeout=30)
        pids = [int(pid) for pid in re.findall(r"analysis worker \d runs as pid (\d+)", log)]
        assert len(pids) == 4, log
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        proxy.process.terminate()
        proxy.process.wait(60)
        took = time.monotonic() - started
    assert took < 7, f"mitmdump took {took:.1f} s to stop with 4 stuck workers"
    time.sleep(0.5)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()]


def test_a_flow_sent_again_before_its_verdict_came_does_not_take_the_earlier_runs_verdict(tmp_path, caplog):
    """mitmproxy's client replay sends a flow, id and all, again, maybe right after it ended,
    before its worker's verdict is back: that verdict is logged and counted, but it is not the
    new run's verdict, mark, comment or recording."""
    from streamtap.mitm.flow_commands import NOT_TAPPED

    body = streams.openai_chat(["cut ", "short ", "here."])

    async def run():
        async with _running_tap(tmp_path, 1) as (tap, tctx):
            flow = _open_flow(tap)
            flow.response.stream(body[: len(body) // 2])
            flow.error = mitmflow.Error("server closed connection")
            tap.error(flow)
            assert tap.awaiting  # the verdict is on its way
            flow.error = None
            tap.requestheaders(flow)  # sent again; this run is not tapped (a redirect, say)
            await _until(lambda: not tap.awaiting)
            return flow, tap.addons[0].verdict([flow]), tap.addons[0].recording([flow])

    with caplog.at_level(logging.INFO, logger="streamtap"):
        flow, verdict, recording = asyncio.run(run())
    assert verdict == [NOT_TAPPED] and recording == [""]
    assert "streamtap" not in flow.metadata and not flow.marked and not flow.comment
    assert "truncated" in caplog.text and "an earlier run of a flow sent again" in caplog.text


def test_a_worker_runs_no_copy_of_mitmdumps_main_script(tmp_path):
    """multiprocessing would run the parent's main file again in the worker: for mitmdump, all of
    mitmproxy's tools, about 0.5 s of CPU at every start and restart that the worker never uses.
    Each import shows at the top level of ``-X importtime`` in the process that makes it."""
    from interception import MITMDUMP, TAP

    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    argv = [str(MITMDUMP), "--set", f"confdir={tmp_path / 'conf'}", "-p", "0", "-s", str(TAP),
            "--set", f"streamtap_dir={tmp_path / 'rec'}"]
    errors = (tmp_path / "stderr").open("w+")
    proxy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors, env=env)
    worker_imported = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| streamtap\.mitm\.worker$", re.M)
    try:
        deadline = time.monotonic() + 60
        while not worker_imported.search((tmp_path / "stderr").read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proxy.terminate()
        proxy.wait(30)
        errors.close()
    imports = (tmp_path / "stderr").read_text()
    assert worker_imported.search(imports), imports[-2000:]  # the worker started and imported its module
    mains = re.findall(r"^import time:\s+\d+ \|\s+\d+ \| mitmproxy\.tools\.main$", imports, re.M)
    assert len(mains) == 1, f"{len(mains)} processes imported mitmdump's main script"


def test_the_worker_module_imports_none_of_mitmproxy():
    """What a worker imports at its start: its module and what that needs, none of mitmproxy."""
    check = ("import sys, streamtap.mitm.worker; "
             "print(sorted(name for name in sys.modules if name.split('.')[0] == 'mitmproxy'))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "addon")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
