"""The live side under a hostile upstream and under option changes, with a real mitmdump.

- A Content-Encoding header names its coding with terminal control characters (an OSC title,
  colours, backspaces and a CR that would start a forged verdict line). The per-flow warning
  and the "(streamtap error: ...)" part of the flow's comment quote that coding: both keep it
  escaped, whether the analysis runs in the proxy (workers=0) or in a worker, which forwards
  its log records to the proxy.
- Changing ``streamtap_metrics`` while a stream flows (a new port, another host on the same
  port, cleared, set again) never holds the proxy's loop: the old endpoint's server waits up to
  its 0.5 s poll to stop, and that wait stalled every stream in flight."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import provider_streams as streams
from test_metrics import scrape, value
from test_metrics_runtime import SETTER
from upstream import CHAT, Mitmdump, Script, Upstream, curl, free_ports

HOSTILE_CODING = "x\x1b]0;PWNED\x07\x1b[31mRED\x1b[0m\x08\x08\x08\rstreamtap: openai-chat gpt-4o complete"
RAW_CONTROLS = ("\x1b", "\x07", "\x08", "\r")

# writes each flow's comment as mitmproxy's other addons see it (the update hook)
COMMENT_WATCHER = '''
import json


def update(flows):
    with open({path!r}, "a") as out:
        for flow in flows:
            if flow.comment:
                out.write(json.dumps(flow.comment) + "\\n")
'''



def wait_for_comment(path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            comments = [json.loads(line) for line in path.read_text().splitlines()]
            if comments:
                return comments[-1]
        time.sleep(0.05)
    raise AssertionError("no flow comment came")


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_content_encoding_of_control_characters_stays_escaped_in_the_log_and_the_comment(tmp_path, workers):
    body = streams.openai_chat(["hi"])
    comments = tmp_path / "comments.jsonl"
    watcher = tmp_path / "watcher.py"
    watcher.write_text(COMMENT_WATCHER.format(path=str(comments)))
    with Upstream() as upstream:
        upstream.add("esc", Script(body, chunk_size=50, headers=[("content-encoding", HOSTILE_CODING)]))
        proxy = Mitmdump(upstream.url, tmp_path / "run", options={"streamtap_workers": workers})
        proxy.args += ["-s", str(watcher)]
        with proxy:
            assert curl(f"{proxy.url}/s/esc{CHAT}").stdout == body  # the traffic passes on untouched
            proxy.wait_log("traffic passes on untouched")
            proxy.wait_log(" unknown (")
            comment = wait_for_comment(comments)
            log = proxy.log_path.read_bytes().decode(errors="replace")  # read_text would turn a CR into a newline
    assert not [c for c in RAW_CONTROLS if c in log], log[-3000:]
    [warning] = [line for line in log.splitlines() if "content-encoding could not be undone" in line and "untouched" in line]
    assert "the x\\x1b]0;" in warning and "\\x07" in warning and "\\r" in warning, warning
    assert "(streamtap error: analysis: the x\\x1b]0;" in comment, comment
    assert not [c for c in RAW_CONTROLS + ("\n",) if c in comment], comment


def read_chunk_times(url: str, arrivals: list[float], received: bytearray, started: threading.Event) -> None:
    with httpx.stream("POST", url, content=b'{"model":"m","stream":true}', timeout=30) as answer:
        for chunk in answer.iter_raw():
            arrivals.append(time.monotonic())
            received += chunk
            started.set()


def largest_gap(arrivals: list[float]) -> float:
    return max(later - earlier for earlier, later in zip(arrivals, arrivals[1:]))


def stream_while(proxy, body: bytes, changes: list[str]) -> tuple[float, int]:
    """The largest gap between chunks the client saw while ``changes`` were set one after the
    other, and how many of them were set while the stream still flowed."""
    arrivals: list[float] = []
    received = bytearray()
    started = threading.Event()
    client = threading.Thread(target=read_chunk_times, args=(f"{proxy.url}/s/slow{CHAT}", arrivals, received, started))
    client.start()
    assert started.wait(10)
    set_at = []
    for to in changes:
        said = httpx.get(f"{proxy.url}/__set", params={"to": to}, timeout=10).text
        assert said == f"set\n{to}", said
        set_at.append(time.monotonic())
        # a server started ~0.1 s ago is ~0.4 s from its next poll: that is how long closing it held the loop
        time.sleep(0.1)
    client.join(60)
    assert bytes(received) == body
    return largest_gap(arrivals), sum(moment < arrivals[-1] for moment in set_at)


def test_changing_the_metrics_address_at_runtime_never_holds_a_stream(tmp_path):
    body = streams.openai_chat(["x"] * 200)
    first, second = free_ports(2)
    setter = tmp_path / "set_metrics.py"
    setter.write_text(SETTER)
    changes = [f"127.0.0.1:{second}", f"localhost:{second}", "", f"127.0.0.1:{first}",  # another port, the same port, off, on
               f"127.0.0.1:{second}", f"127.0.0.1:{first}", f"localhost:{first}", f"127.0.0.1:{first}"]
    with Upstream() as upstream:
        upstream.add("slow", Script(body, chunk_size=100, gap=0.01))
        proxy = Mitmdump(upstream.url, tmp_path / "run", options={"streamtap_metrics": f"127.0.0.1:{first}"})
        proxy.args += ["-s", str(setter)]
        with proxy:
            proxy.wait_log("metrics on http://127.0.0.1:")
            baseline, _ = stream_while(proxy, body, [])
            worst, changed_in_flight = stream_while(proxy, body, changes)
            assert changed_in_flight >= 5, "the stream ended before the option changes: make it longer"
            # the endpoint where the option ended up serves; the metrics were off once among the
            # changes, so the counters started anew there (a reset Prometheus reads as one): the
            # turn in flight across them is counted, the one before the off is not
            deadline = time.monotonic() + 10
            while value(scrape(first), "streamtap_turns_total") < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            assert value(scrape(first), "streamtap_turns_total") == 1
            log = proxy.log()
    assert "Traceback" not in log and "cannot serve metrics" not in log, log[-3000:]
    # closing an endpoint on the loop held it ~0.4 s per change; the stream's own gaps are ~10 ms
    assert worst < baseline + 0.2, (worst, baseline)
