"""A worker that is slow but gets on with its work is not taken for hung; a flow whose worker died
before it took the flow still gets its recording; a flow lost with its worker keeps its recording's
path and its model in its verdict, under the provider its recording names (real mitmdump, real
workers, loopback upstream)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

import provider_streams as streams
from streamtap.mitm.worker import SLOW_FSYNC_ENV
from streamtap.recording import check_recording, read_recording
from test_metrics import scrape
from test_workers import HUNG_ENV, kill_worker_holding_a_flow, worker_pids
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream, curl, curl_started, find_recording, free_port

REQUESTED_MODEL = json.loads(STREAM_REQUEST)["model"]


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


def verdict_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "streamtap: openai-chat" in line]


def test_a_worker_slow_inside_one_long_batch_is_not_taken_for_hung_and_a_stopped_one_still_is(upstream, tmp_path, monkeypatch):
    """fsync=always on a slow disk: one batch takes the worker many times HUNG_AFTER, one synced
    line after another. It gets on, so it says so; stopped, it falls silent and is killed."""
    hung_after = 3
    monkeypatch.setenv(HUNG_ENV, str(hung_after))
    monkeypatch.setenv(SLOW_FSYNC_ENV, "0.025")  # 300 events, each line synced: 7.5 s in one batch
    body = streams.openai_chat([f"piece {i} " for i in range(300)])
    upstream.add("slowdisk", Script(body, chunks=[body]))  # one write: the worker gets it in one batch
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_fsync": "always"}) as proxy:
        [pid] = worker_pids(proxy)
        sent = time.monotonic()
        assert curl(f"{proxy.url}/s/slowdisk{CHAT}").stdout == body == upstream.last("slowdisk").wire
        log = proxy.wait_log("streamtap: openai-chat", timeout=90)
        took = time.monotonic() - sent
        [line] = verdict_lines(log)
        assert "has said nothing" not in log, log
        assert "openai-chat gpt-test-1 complete" in line, line  # the model the answer names
        assert took > 2 * hung_after, f"the worker took {took:.1f} s: too little to tell a slow worker from a hung one"
        os.kill(pid, 0)  # the same worker, never killed
        rec = find_recording(proxy.record_dir, "slowdisk")
        assert rec.body == body and rec.verdict["kind"] == "complete" and check_recording(rec) == []

        os.kill(pid, signal.SIGSTOP)  # stopped, it makes no progress: found hung as before
        proxy.wait_log(f"analysis worker 0 (pid {pid}) has said nothing for", timeout=hung_after + 10)
        proxy.wait_log(f"analysis worker 0 (pid {pid}) died")
        [new_pid] = [p for p in worker_pids(proxy, count=2) if p != pid]
        os.kill(new_pid, 0)
    assert "Traceback" not in proxy.log()


def test_flows_a_worker_never_took_before_it_died_each_get_a_recording_with_the_note(upstream, tmp_path, monkeypatch):
    """A stopped worker takes no work: flows begun meanwhile wait in its pipe, unopened. It then
    dies (OOM killer, crash): each of them still gets its one recording, made by the restarted
    worker, with no bytes and the note why; the traffic is exact throughout."""
    monkeypatch.setenv(HUNG_ENV, "600")  # killed here, not found hung
    names = [f"unopened{i}" for i in range(3)]
    for name in names:
        upstream.add(name, Script(streams.openai_chat([f"{name} piece {i} " for i in range(40)]), chunk_size=300))
    with Mitmdump(upstream.url, tmp_path / "m") as proxy:
        [pid] = worker_pids(proxy)
        os.kill(pid, signal.SIGSTOP)
        try:
            for name in names:
                assert curl(f"{proxy.url}/s/{name}{CHAT}").stdout == upstream.last(name).wire, name
        finally:
            os.kill(pid, signal.SIGKILL)
        proxy.wait_log(f"analysis worker 0 (pid {pid}) died")
        log = proxy.wait_log("streamtap: openai-chat", count=len(names), timeout=30)
        recordings = {name: find_recording(proxy.record_dir, name) for name in names}
        [new_pid] = [p for p in worker_pids(proxy, count=2) if p != pid]
        os.kill(new_pid, 0)
    for name, rec in recordings.items():
        handed = len(upstream.last(name).wire)
        assert rec.verdict["kind"] == "unknown" and rec.body == b"" and check_recording(rec) == [], name
        notes = [note["message"] for note in rec.notes if note.get("kind") == "streamtap_error"]
        assert any(
            re.search(r"analysis worker died after it was handed \d+ bytes of this stream; analysis fell behind at byte 0$", message)
            for message in notes
        ), (name, handed, notes)
        [line] = [line for line in verdict_lines(log) if rec.path.name in line]  # the verdict points at it
        assert f"openai-chat {REQUESTED_MODEL} unknown (streamtap's analysis worker died after it was handed" in line, line
    assert len(list(proxy.record_dir.glob("*.partial.jsonl"))) == 0
    assert "Traceback" not in proxy.log()


def test_a_flow_lost_with_its_worker_keeps_its_recording_and_model_in_its_verdict(upstream, tmp_path):
    """The worker dies mid-stream: the .partial recording it left, now with the note, is what the
    verdict, the log line and the `streamtap.recording` command point at, under the model asked for."""
    body = streams.openai_chat([f"token {i} " for i in range(400)])
    upstream.arm_pause()
    upstream.add("lostmid", Script(body, chunk_size=500, pause_after=8000))
    said = tmp_path / "said.jsonl"
    watcher = tmp_path / "watcher.py"
    watcher.write_text(
        "import json\n"
        "from mitmproxy import ctx\n"
        "def update(flows):\n"
        "    for flow in flows:\n"
        "        summary = flow.metadata.get('streamtap')\n"
        "        if summary:\n"
        f"            with open({str(said)!r}, 'a') as out:\n"
        "                out.write(json.dumps({'model': summary['model'], 'verdict': summary['verdict'],\n"
        "                    'command': ctx.master.commands.call('streamtap.recording', [flow])}) + '\\n')\n"
    )
    proxy = Mitmdump(upstream.url, tmp_path / "m")
    proxy.args += ["-s", str(watcher)]
    with proxy:
        [pid] = worker_pids(proxy)
        assert kill_worker_holding_a_flow(proxy, upstream, pid, curl_started(f"{proxy.url}/s/lostmid{CHAT}")) == body
        log = proxy.wait_log("streamtap: openai-chat")
        [partial] = list(proxy.record_dir.glob("*.partial.jsonl"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the restarted worker's note, and the watcher's report
            notes = [note["message"] for note in read_recording(partial).notes]
            if notes and said.exists():
                break
            time.sleep(0.05)
    [line] = verdict_lines(log)
    assert f"openai-chat {REQUESTED_MODEL} unknown (" in line and line.endswith(f" -> {partial}"), line
    told = [json.loads(text) for text in said.read_text().splitlines()]  # mitmproxy may send more update hooks
    assert told and all(t == {"model": REQUESTED_MODEL, "verdict": "unknown", "command": [str(partial)]} for t in told), told
    assert any("analysis worker died after it was handed" in message for message in notes), notes


def test_a_flow_lost_with_its_worker_is_counted_under_the_provider_its_recording_names(upstream, tmp_path):
    """A root /completions (an OpenAI-compatible server whose base URL has no /v1) is told apart by
    the model its request body names, which the proxy has not read when it hands the flow over: the
    worker's detection is what the verdict, the log line and the metrics name once it is lost."""
    body = streams.openai_chat([f"token {i} " for i in range(400)], model="gpt-root")
    upstream.arm_pause()
    upstream.add("root", Script(body, chunk_size=500, pause_after=8000))
    upstream.router = lambda path, request: "root"
    port = free_port()
    try:
        with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_metrics": f"127.0.0.1:{port}"}) as proxy:
            [pid] = worker_pids(proxy)
            client = subprocess.Popen(
                ["curl", "-sS", "-N", "-H", "content-type: application/json", "--data",
                 '{"model":"gpt-root","stream":true,"prompt":"hi"}', f"{proxy.url}/completions"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            assert kill_worker_holding_a_flow(proxy, upstream, pid, client) == body
            log = proxy.wait_log("not judged")
            deadline = time.monotonic() + 10
            while not (turns := {(s.labels["provider"], s.labels["model"], s.labels["verdict"]): s.value
                                 for s in scrape(port)["streamtap_turns"] if s.name == "streamtap_turns_total"}):  # fmt: skip
                assert time.monotonic() < deadline  # (the log line comes just before the count)
                time.sleep(0.02)
    finally:
        upstream.router = None
    [partial] = list(proxy.record_dir.glob("*.partial.jsonl"))
    assert read_recording(partial).header["dialect"] == "openai-chat"
    [line] = [line for line in log.splitlines() if "not judged" in line]
    assert "streamtap: openai-chat gpt-root unknown (" in line, line
    assert turns == {("openai-chat", "gpt-root", "unknown"): 1.0}, turns
