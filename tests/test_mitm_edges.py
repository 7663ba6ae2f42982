"""Edges of the mitmproxy addon, each in a real mitmdump: options checked at start, replay that
cannot start, live faults that do or do not change the answer, which flows faults touch, how
an injected cut is judged, client replay of a tapped flow, and replay servers left behind.

A small extra script (PROBE) lets a test act inside the proxy the way a user would from
mitmproxy's command bar: a request to /__probe/... runs a command or sets an option there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording
from upstream import Mitmdump, Script, Upstream, find_recording

from streamtap.recording import read_recording

pytestmark = pytest.mark.slow

LIVE = b"".join(b'data: {"i": %d}\n\n' % i for i in range(30))
OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()

PROBE = '''
import json
from mitmproxy import ctx, exceptions, http

tapped = []

def responseheaders(flow):
    if flow.request.path.startswith("/s/") and flow not in tapped:
        tapped.append(flow)

def request(flow):
    path = flow.request.path
    if not path.startswith("/__probe/"):
        return
    status, answer = 200, {}
    if path.startswith("/__probe/set/"):
        name, _, value = path[len("/__probe/set/"):].partition("=")
        try:
            ctx.master.commands.call("set", name, value)
        except exceptions.CommandError as exc:
            status, answer = 400, {"error": str(exc)}
    else:
        target = tapped[-1]
        if path == "/__probe/replay":
            ctx.master.commands.call("replay.client", [target])
        answer = {
            "verdict": ctx.master.commands.call("streamtap.verdict", [target])[0],
            "recording": ctx.master.commands.call("streamtap.recording", [target])[0],
            "marked": target.marked,
        }
    flow.response = http.Response.make(status, json.dumps(answer), {"content-type": "application/json"})
'''


def with_probe(mitm: Mitmdump, tmp_path: Path) -> Mitmdump:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    mitm.args += ["-s", str(probe)]
    return mitm


def start_fails(tmp_path: Path, options: dict[str, str]) -> str:
    """mitmdump's output, once it refused to start."""
    proxy = Mitmdump("http://127.0.0.1:9", tmp_path / "m", options=options)
    result = subprocess.run(proxy.args, capture_output=True, text=True, timeout=20, cwd=proxy.workdir)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    return out


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on, from /proc (its socket fds, matched to the table)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# --- options ---------------------------------------------------------------------------


def test_a_compression_that_does_not_exist_stops_mitmdump_at_start(tmp_path):
    out = start_fails(tmp_path, {"streamtap_compress": "gzip"})
    assert "streamtap_compress: 'gzip' is not one of none, zstd" in out


def test_a_tilde_in_streamtap_dir_is_the_home_directory(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # as a config file or a quoted --set gives it: unexpanded
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE))
        with Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_dir": "~/recs"}) as mitm:
            assert httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15).content == LIVE
            assert find_recording(home / "recs", "live").body == LIVE
    assert not (tmp_path / "work" / "~").exists()


# --- replay inside mitmproxy -----------------------------------------------------------


def replay_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "replay"
    directory.mkdir()
    write_recording(directory / "openai.jsonl", "openai", openai_chat_frames(words=6))
    return directory


def test_a_swap_tail_that_fits_no_replayed_recording_stops_mitmdump_at_start(tmp_path):
    replayed = replay_dir(tmp_path)
    out = start_fails(tmp_path, {"streamtap_replay": str(replayed), "streamtap_fault": "swap-tail:with=missing.jsonl,at=3"})
    assert "streamtap_fault: 'swap-tail:with=missing.jsonl,at=3': no recording 'missing.jsonl'" in out
    other = tmp_path / "other.jsonl"
    write_recording(other, "openai", openai_chat_frames(words=9))
    # one unfit fault does not keep the next one, a swap-tail, from being checked
    out = start_fails(tmp_path, {"streamtap_replay": str(replayed), "streamtap_fault": f"cut:event=999;swap-tail:with={other},at=3"})
    assert "streamtap_fault: 'cut:event=999': event 999 does not exist" in out
    assert "was not loaded" not in out and "AttributeError" not in out  # the swap-tail fits


def test_a_replay_server_that_cannot_start_answers_502_and_nothing_goes_upstream(tmp_path):
    other = tmp_path / "other.jsonl"
    write_recording(other, "openai", openai_chat_frames(words=9))
    options = {"streamtap_replay": str(replay_dir(tmp_path)), "streamtap_fault": f"swap-tail:with={other},at=3"}
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path / "work", options=options) as mitm:
            mitm.wait_log("streamtap: replaying")  # the port listens before the addon has loaded
            other.unlink()  # checked at start; gone when the first request starts the server
            answers = [httpx.post(mitm.url + "/v1/chat/completions", content=OPENAI_BODY, timeout=15) for _ in range(2)]
            log = mitm.log()
        assert not upstream.served, "a request went upstream because the replay server failed"
    for answer in answers:
        assert answer.status_code == 502
        assert answer.json()["error"]["message"].startswith("streamtap's replay server did not start: FaultSpecError: ")
        assert "no recording" in answer.json()["error"]["message"]
    assert log.count("replay server did not start") == 1, "the start is not retried per request"


def test_replay_servers_of_replaced_settings_are_closed(tmp_path):
    options = {"streamtap_replay": str(replay_dir(tmp_path)), "streamtap_replay_unmatched": "upstream", "streamtap_replay_timing": "fast"}
    with Upstream() as upstream:
        with with_probe(Mitmdump(upstream.url, tmp_path / "work", options=options), tmp_path) as mitm:

            def replay_ports() -> set[int]:
                assert httpx.post(mitm.url + "/v1/chat/completions", content=OPENAI_BODY, timeout=15).status_code == 200
                return listening_ports(mitm.process.pid) - {mitm.port}

            assert len(replay_ports()) == 1
            for timing in ("scale=2", "fast"):  # two changes, no request between them
                assert httpx.get(f"{mitm.url}/__probe/set/streamtap_replay_timing={timing}", timeout=10).status_code == 200
            assert len(replay_ports()) == 1
            refused = httpx.get(f"{mitm.url}/__probe/set/streamtap_fault=cut:nowhere=1", timeout=10)
            assert refused.status_code == 400 and "cut takes" in refused.json()["error"]
            assert len(replay_ports()) == 1


# --- live faults -----------------------------------------------------------------------


def live_run(tmp_path: Path, fault: str, logged: str) -> tuple[bytes, object, str]:
    """LIVE through a real mitmdump with ``fault``: what the client got, the recording, and the
    log once ``logged`` is in it."""
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE, gap=0.005))
        with Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": fault}) as mitm:
            response = httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15)
            rec = find_recording(mitm.record_dir, "live")
            return response.content, rec, mitm.wait_log(logged)


def test_a_reorder_of_the_last_event_changes_nothing_and_says_so(tmp_path):
    got, rec, log = live_run(tmp_path, "reorder:event=29", "streamtap: unknown")
    assert got == LIVE == rec.body
    assert "injected_fault" not in rec.end and "injected fault" not in log and "swapped" not in log
    assert "fault not applied: reorder:event=29: event 29 was the last one, nothing to swap it with" in log


def test_a_reorder_inside_the_stream_swaps_and_says_so(tmp_path):
    got, rec, log = live_run(tmp_path, "reorder:event=3", "fault reorder:event=3: events 3 and 4 swapped")
    events = LIVE.split(b"\n\n")
    assert got == rec.body == b"\n\n".join(events[:3] + [events[4], events[3]] + events[5:])
    assert rec.end["injected_fault"] == "reorder:event=3" and "not applied" not in log


def test_a_fault_never_reached_is_logged_at_the_flows_end(tmp_path):
    got, rec, log = live_run(tmp_path, "cut:event=999;drop:event=2",
                             "fault not applied: cut:event=999: not reached (the stream ended after 30 events")
    assert got == rec.body == LIVE.replace(b'data: {"i": 2}\n\n', b"")
    assert "fault drop:event=2: dropped event 2" in log and "drop:event=2: not reached" not in log


def test_live_faults_touch_only_the_streams_the_tap_taps(tmp_path):
    """Other responses stay as mitmproxy would handle them: not streamed, so their bodies are
    kept for mitmweb, -w captures and other addons."""
    from mitmproxy import io

    page = b"<html>" + b"x" * 5000 + b"</html>"
    capture = tmp_path / "capture.mitm"
    with Upstream() as upstream:
        upstream.add("page", Script(page, content_type="text/html", framing="length"))
        upstream.add("live", Script(LIVE))
        mitm = Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": "fragment:max=5"})
        mitm.args += ["-w", str(capture)]
        with mitm:
            assert httpx.get(mitm.url + "/s/page/index.html", timeout=15).content == page
            assert httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15).content == LIVE
            rec = find_recording(mitm.record_dir, "live")
            mitm.wait_log("fault fragment:max=5: ")
    assert rec.end["injected_fault"] == "fragment:max=5"  # the tapped stream got it
    with capture.open("rb") as handle:
        flows = {f.request.path: f for f in io.FlowReader(handle).stream()}
    assert flows["/s/page/index.html"].response.content == page


@pytest.mark.parametrize(
    "style, framing",
    # (the upstream's content-length goes when a fault may change the length: a clean cut is then
    # the end of a close-delimited body)
    [("abort", "chunked"), ("reset", "chunked"), ("clean", "length")],
)
def test_a_live_cut_is_judged_as_the_upstream_ending_on_http1(tmp_path, style, framing):
    """The cut is streamtap's, standing in for the upstream, as through streamtap_replay or on HTTP/2:
    never "the client went away first", though streamtap closes the client's connection."""
    fault = f"cut:event=5,style={style}"
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE, gap=0.005, framing=framing))
        with Mitmdump(upstream.url, tmp_path / "work", options={"streamtap_fault": fault}) as mitm:
            if style == "clean":
                answer = httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15)
                assert answer.status_code == 200 and 0 < len(answer.content) < len(LIVE)
            else:
                with pytest.raises(httpx.HTTPError):
                    httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15).raise_for_status()
            rec = find_recording(mitm.record_dir, "live")
            log = mitm.wait_log("[injected fault: ")
    end = "finished" if style == "clean" else "upstream_reset"
    assert rec.end["stream_end"] == end, log[-3000:]
    assert "[client_aborted]" not in log and (style == "clean" or "[upstream_reset]" in log)


# --- client replay of a tapped flow ----------------------------------------------------


def test_a_flow_sent_again_gets_the_new_runs_verdict_and_mark(tmp_path):
    body = b"".join(openai_chat_frames(words=12))
    with Upstream() as upstream:
        upstream.add("again", Script(body, cut_at=len(body) // 2))  # the first run: cut, marked
        with with_probe(Mitmdump(upstream.url, tmp_path / "work"), tmp_path) as mitm:
            with pytest.raises(httpx.HTTPError):
                httpx.post(mitm.url + "/s/again/v1/chat/completions", content=OPENAI_BODY, timeout=15)
            mitm.wait_log("[upstream_reset]")
            first = httpx.get(mitm.url + "/__probe/ask", timeout=10).json()
            assert first["verdict"].startswith("truncated: ") and first["marked"] == ":warning:"
            upstream.arm_pause()
            upstream.add("again", Script(body, pause_after=len(body) // 3))  # the second run: whole, held mid-way
            httpx.get(mitm.url + "/__probe/replay", timeout=10)
            assert upstream.wait_paused()
            time.sleep(0.2)  # the bytes before the pause reach the proxy
            during = httpx.get(mitm.url + "/__probe/ask", timeout=10).json()
            upstream.release()
            mitm.wait_log("gpt-4.1-nano complete: ")
            after = httpx.get(mitm.url + "/__probe/ask", timeout=10).json()
    assert during["verdict"] == "streaming"
    assert during["recording"].endswith(".partial.jsonl") and during["recording"] != first["recording"]
    assert after["verdict"].startswith("complete: ") and after["marked"] == ""
    assert after["recording"] not in (first["recording"], "") and read_recording(after["recording"]).body == body


def test_the_fault_header_is_the_apps_own_while_streamtap_fault_header_is_off(tmp_path):
    """The header is opt-in: off (the default), it reaches the upstream unchanged and faults nothing."""
    with Upstream() as upstream:
        upstream.add("live", Script(LIVE))
        with Mitmdump(upstream.url, tmp_path / "work") as mitm:
            got = httpx.post(mitm.url + "/s/live/x", content=b"{}", timeout=15,
                             headers={"x-streamtap-fault": "cut:event=3"})
            rec = find_recording(mitm.record_dir, "live")
    assert got.content == LIVE == rec.body
    assert upstream.last("live").headers.get("x-streamtap-fault") == "cut:event=3"
    assert "injected_fault" not in rec.end


def test_a_flow_sent_again_and_not_tapped_this_time_loses_the_last_runs_verdict_and_mark(tmp_path):
    """mitmproxy's client replay keeps a flow's metadata: a run streamtap does not tap (here a
    redirect) must not answer with the run before's verdict, recording, mark and comment."""
    body = b"".join(openai_chat_frames(words=12))
    with Upstream() as upstream:
        upstream.add("again", Script(body, cut_at=len(body) // 2))
        with with_probe(Mitmdump(upstream.url, tmp_path / "work"), tmp_path) as mitm:
            with pytest.raises(httpx.HTTPError):
                httpx.post(mitm.url + "/s/again/v1/chat/completions", content=OPENAI_BODY, timeout=15)
            mitm.wait_log("[upstream_reset]")
            first = httpx.get(mitm.url + "/__probe/ask", timeout=10).json()
            upstream.add("again", Script(b"", status=302, content_type="text/plain", headers=[("location", "/elsewhere")]))
            httpx.get(mitm.url + "/__probe/replay", timeout=10)
            deadline = time.monotonic() + 10
            while len(upstream.served["again"]) < 2:
                assert time.monotonic() < deadline, "the flow was not sent again"
                time.sleep(0.05)
            upstream.last_done("again")
            time.sleep(0.3)  # its response reaches the proxy
            after = httpx.get(mitm.url + "/__probe/ask", timeout=10).json()
    assert first["verdict"].startswith("truncated: ") and first["marked"] == ":warning:"
    assert after == {"verdict": "not tapped", "recording": "", "marked": ""}, after


# --- another addon that sets flow.response.stream ----------------------------------------

SHOUTING_ADDON = '''
def responseheaders(flow):
    if flow.request.path.startswith("/s/"):
        flow.response.stream = lambda data: data.replace(b"hello", b"HELLO")
'''


@pytest.mark.parametrize("order", ["before", "after"])
def test_another_addons_stream_callable_before_streamtap_is_kept_and_after_it_is_never_judged_unseen(tmp_path, order):
    body = b"".join(openai_chat_frames(words=12)).replace(b'"content":"', b'"content":"hello ', 3)
    assert b"hello" in body
    other = tmp_path / "shout.py"
    other.write_text(SHOUTING_ADDON)
    with Upstream() as upstream:
        upstream.add("other", Script(body))
        mitm = Mitmdump(upstream.url, tmp_path / "work")
        if order == "before":
            mitm.args[mitm.args.index("-s"):mitm.args.index("-s")] = ["-s", str(other)]
        else:
            mitm.args += ["-s", str(other)]
        with mitm:
            got = httpx.post(mitm.url + "/s/other/v1/chat/completions", content=OPENAI_BODY, timeout=15).content
            log = mitm.wait_log("streamtap: openai-chat ")
            rec = find_recording(mitm.record_dir, "other")
    assert got == body.replace(b"hello", b"HELLO")  # the other addon's change reaches the client either way
    if order == "before":
        assert rec.verdict["kind"] == "complete" and rec.body == got
    else:
        assert rec.verdict["kind"] == "unknown", rec.verdict
        assert "another addon replaced streamtap's flow.response.stream" in log
        assert " truncated" not in log
        # the verdict names the recording the worker finished, not the .partial one it renamed
        [line] = [line for line in log.splitlines() if "streamtap: openai-chat " in line]
        assert line.endswith(" -> " + str(rec.path)), line


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_live_fault_that_forwards_nothing_is_not_taken_for_another_addon(tmp_path, workers):
    """streamtap's own live faults wrap the Tap's callable: a cut before the first byte hands it
    nothing, which is a cut the client got, not a callable another addon replaced."""
    body = b"".join(openai_chat_frames(words=12))
    with Upstream() as upstream:
        upstream.add("cut", Script(body))
        options = {"streamtap_workers": workers, "streamtap_fault": "cut:byte=0"}
        with Mitmdump(upstream.url, tmp_path / "work", options=options) as mitm:
            got = httpx.post(mitm.url + "/s/cut/v1/chat/completions", content=OPENAI_BODY, timeout=15).content
            log = mitm.wait_log("streamtap: openai-chat ")
            rec = find_recording(mitm.record_dir, "cut")
    assert got == b"" and rec.body == b""
    assert rec.verdict["kind"] == "truncated", rec.verdict
    assert "another addon" not in log and "truncated (" in log


KILLING_ADDON = '''
import asyncio
from mitmproxy import ctx


def responseheaders(flow):
    if flow.request.path.startswith("/s/kill/"):
        flow.kill()
    elif flow.request.path.startswith("/s/kill_mid/"):  # as mitmweb's Kill button, while the body streams
        inner, reads = flow.response.stream, []

        def stream(data):
            reads.append(data)
            if len(reads) == 2:
                asyncio.get_running_loop().call_soon(ctx.master.commands.call, "flow.kill", [flow])
            return inner(data)

        flow.response.stream = stream
'''


@pytest.mark.parametrize("name", ["kill", "kill_mid"])
def test_an_answer_mitmproxy_killed_is_not_blamed_on_the_upstream(tmp_path, name):
    """A kill (mitmweb's button, an addon's flow.kill()) ends the client's answer, at its headers
    or while it streams: the end is the proxy's, not an upstream reset, nor a clean finish."""
    body = b"".join(openai_chat_frames(words=12))
    killer = tmp_path / "killer.py"
    killer.write_text(KILLING_ADDON)
    with Upstream() as upstream:
        upstream.add(name, Script(body, chunk_size=200, gap=0.05))
        mitm = Mitmdump(upstream.url, tmp_path / "work")
        mitm.args += ["-s", str(killer)]
        with mitm:
            with pytest.raises(httpx.HTTPError):  # the kill cuts the client's answer
                httpx.post(mitm.url + f"/s/{name}/v1/chat/completions", content=OPENAI_BODY, timeout=15)
            log = mitm.wait_log("streamtap: openai-chat ")
            rec = find_recording(mitm.record_dir, name)
    assert rec.end["stream_end"] == "proxy_ended", rec.end
    assert "[proxy_ended]" in log and "[upstream_reset]" not in log
    if name == "kill":
        assert rec.verdict["evidence"].get("provider_fault") is False, rec.verdict
