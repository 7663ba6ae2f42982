"""The proxy fails open and stays honest: full disk, unwritable directory, bad encodings,
kill -9 mid-stream, 50 concurrent streams, bad options."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import provider_streams as streams
from streamtap.recording import check_recording, read_recording
from upstream import CHAT, MITMDUMP, REPO, STREAM_REQUEST, Mitmdump, Script, Upstream, curl, curl_started, find_recording


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as up:
        yield up


def big_stream(events: int) -> bytes:
    return streams.openai_chat([f"token {i} " for i in range(events)])


def test_unwritable_recording_dir_passes_traffic_and_says_so_once(upstream, tmp_path):
    # a directory that cannot be written stops mitmdump at start (test_addon_options);
    # here it turns into a file once the proxy runs
    blocker = tmp_path / "not-a-dir"
    blocker.mkdir()
    body = big_stream(200)
    upstream.add("unwritable", Script(body, chunk_size=999))
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_dir": str(blocker / "recordings")}) as proxy:
        assert curl(f"{proxy.url}/s/unwritable{CHAT}", max_time=20).stdout == body  # the addon is loaded and records
        find_recording(blocker / "recordings", "unwritable")
        shutil.rmtree(blocker)
        blocker.write_text("a file where the recording directory should be")
        for _ in range(2):
            out = curl(f"{proxy.url}/s/unwritable{CHAT}", max_time=20)
            assert out.returncode == 0 and out.stdout == body
        log = proxy.wait_log("streamtap: openai-chat", count=3)
    errors = [line for line in log.splitlines() if "traffic passes on untouched" in line]
    assert len(errors) == 2, log  # once per flow, not once per chunk
    assert all("recording:" in line and "not-a-dir" in line for line in errors)
    assert log.count("complete:") == 3  # analysis went on without the recorder
    assert "Traceback" not in log


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here (needs root): {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_disk_full_mid_stream(upstream, tmp_path, tiny_disk):
    body = big_stream(800)  # ~140 KB of SSE: the recording cannot fit in 48 KiB
    assert len(body) > 120_000
    upstream.add("diskfull", Script(body, chunk_size=4096, gap=0.001))
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_dir": str(tiny_disk)}) as proxy:
        out = curl(f"{proxy.url}/s/diskfull{CHAT}", max_time=20)
        assert out.returncode == 0 and out.stdout == body == upstream.last("diskfull").wire
        log = proxy.wait_log("streamtap: openai-chat")
    errors = [line for line in log.splitlines() if "traffic passes on untouched" in line]
    assert len(errors) == 1 and "No space left on device" in errors[0], log
    assert "complete:" in log
    partial = list(tiny_disk.glob("*.partial.jsonl"))
    assert len(partial) == 1
    rec = read_recording(partial[0])  # what fitted reads back as an incomplete recording, not a corrupt one
    assert not rec.complete_file and rec.problem.startswith("recording incomplete at byte")
    assert body.startswith(rec.body)


def test_a_body_that_lies_about_its_encoding(upstream, tmp_path):
    body = big_stream(20)
    upstream.add("liar", Script(body, headers=[("content-encoding", "gzip")], chunk_size=300))
    with Mitmdump(upstream.url, tmp_path / "m") as proxy:
        out = subprocess.run(
            ["curl", "-sS", "-N", "-H", "content-type: application/json", "--data", STREAM_REQUEST, f"{proxy.url}/s/liar{CHAT}"],
            capture_output=True,
        )
        assert out.stdout == body  # forwarded untouched, though it cannot be decoded
        rec = find_recording(proxy.record_dir, "liar")
        log = proxy.wait_log("streamtap: openai-chat")  # the verdict's line comes after the recording's end
    assert rec.wire == body and rec.complete_file
    assert any(n["kind"] == "streamtap_error" and "analysis" in n["message"] for n in rec.notes)
    assert rec.end["streamtap_errors"] and rec.verdict["kind"] == "unknown"
    assert sum("traffic passes on untouched" in line for line in log.splitlines()) == 1


def test_kill_9_mid_stream_leaves_an_incomplete_recording(upstream, tmp_path):
    body = big_stream(100)
    upstream.arm_pause()
    upstream.add("kill9", Script(body, chunk_size=500, pause_after=4000))
    proxy = Mitmdump(upstream.url, tmp_path / "m").start()
    client = curl_started(f"{proxy.url}/s/kill9{CHAT}")
    try:
        assert upstream.wait_paused()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rec = find_recording(proxy.record_dir, "kill9", partial=True)
            if sum(length for _, length, _ in rec.reads) >= 4000 or rec.segments and rec.segments[-1].end > 3500:
                break
            time.sleep(0.02)
        proxy.kill9()
    finally:
        upstream.release()
        client.wait(10)
        proxy.stop()
    path = next(proxy.record_dir.glob("*.partial.jsonl"))
    rec = read_recording(path)
    assert not rec.complete_file and rec.end is None
    assert "recording incomplete at byte" in rec.problem
    # every frame completed before the kill is there (the event in progress was still in the decoder)
    assert rec.body == body[: len(rec.body)] and len(rec.body) > 4000 - 200
    assert check_recording(rec) == [rec.problem]  # incomplete, but nothing in it is wrong
    verify = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(path)], capture_output=True, text=True)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "incomplete" in verify.stdout


@pytest.mark.slow
def test_fifty_concurrent_streams(upstream, tmp_path):
    bodies = {f"c{i}": streams.openai_chat([f"stream {i} piece {j} " for j in range(30)]) for i in range(50)}
    for name, body in bodies.items():
        upstream.add(name, Script(body, chunk_size=211, gap=0.004))
    barrier = threading.Barrier(50)
    with Mitmdump(upstream.url, tmp_path / "m") as proxy, httpx.Client(timeout=30, limits=httpx.Limits(max_connections=60)) as client:

        def run(name: str) -> bytes:
            barrier.wait()
            with client.stream("POST", f"{proxy.url}/s/{name}{CHAT}", content=STREAM_REQUEST) as response:
                return b"".join(response.iter_raw())

        with ThreadPoolExecutor(50) as pool:
            received = dict(zip(bodies, pool.map(run, bodies)))
        for name, body in bodies.items():
            assert received[name] == body == upstream.last(name).wire, name
            rec = find_recording(proxy.record_dir, name)
            assert rec.body == body and rec.verdict["kind"] == "complete" and check_recording(rec) == []
        assert len(list(proxy.record_dir.glob("*_complete_*.jsonl"))) == 50


def test_options_are_listed_and_checked(tmp_path):
    listed = subprocess.run([str(MITMDUMP), "-s", str(REPO / "addon" / "tap.py"), "--options"], capture_output=True, text=True, cwd=tmp_path)
    for name in ("streamtap_dir", "streamtap_filter", "streamtap_fsync", "streamtap_redact", "streamtap_sentinel"):
        assert name in listed.stdout
    bad = Mitmdump("http://127.0.0.1:9", tmp_path / "bad", options={"streamtap_filter": "~q ~~~("})
    result = subprocess.run(bad.args, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode != 0
    assert "streamtap_filter: Invalid filter expression" in result.stdout + result.stderr


def test_a_filter_chooses_the_flows(upstream, tmp_path):
    body = big_stream(3)
    upstream.add("chosen", Script(body))
    upstream.add("ignored", Script(body))
    with Mitmdump(upstream.url, tmp_path / "m", options={"streamtap_filter": "~u /s/chosen/", "streamtap_fsync": "always"}) as proxy:
        assert curl(f"{proxy.url}/s/ignored{CHAT}", max_time=20).stdout == body
        assert curl(f"{proxy.url}/s/chosen{CHAT}", max_time=20).stdout == body
        rec = find_recording(proxy.record_dir, "chosen")
        assert rec.body == body
        assert len(list(proxy.record_dir.iterdir())) == 1
