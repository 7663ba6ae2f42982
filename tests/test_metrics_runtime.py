"""Live metrics under changes and odd answers: a real mitmdump, real streams, the endpoint scraped.

- A new ``streamtap_metrics`` address that cannot be served while the proxy runs is refused,
  and the endpoint that works stays (mitmproxy puts the option back).
- An answer that names its model with something other than a string is still counted, with
  its verdict line in the log."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

import provider_streams as streams
from test_metrics import scrape, value
from upstream import CHAT, Mitmdump, Script, Upstream, free_ports

# sets streamtap_metrics from a request, as mitmweb's options page or the console's `set` do
SETTER = '''
from mitmproxy import ctx, exceptions, http


class SetMetrics:
    def request(self, flow):
        if flow.request.path.startswith("/__set"):
            try:
                ctx.options.update(streamtap_metrics=flow.request.query.get("to", ""))
                said = "set"
            except exceptions.OptionsError as exc:
                said = f"refused: {exc}"
            flow.response = http.Response.make(200, f"{said}\\n{ctx.options.streamtap_metrics}".encode())


addons = [SetMetrics()]
'''


def turns(port: int) -> float:
    return value(scrape(port), "streamtap_turns_total")


def wait_for_turns(port: int, expected: float) -> float:
    deadline = time.monotonic() + 10
    while (seen := turns(port)) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return seen


@pytest.fixture
def proxy(tmp_path):
    setter = tmp_path / "set_metrics.py"
    setter.write_text(SETTER)
    first, second, third = free_ports(3)
    with Upstream() as upstream:
        upstream.add("m", Script(streams.openai_chat(["still ", "counted"]), chunk_size=40))
        mitm = Mitmdump(upstream.url, tmp_path / "run", options={"streamtap_metrics": f"127.0.0.1:{first}"})
        mitm.args += ["-s", str(setter)]
        with mitm:
            mitm.wait_log("metrics on http://127.0.0.1:")
            mitm.ports = first, second, third
            yield mitm

    # nothing here: the proxy stopped


def set_metrics(mitm, to: str) -> tuple[str, str]:
    said, _, now = httpx.get(f"{mitm.url}/__set", params={"to": to}, timeout=10).text.partition("\n")
    return said, now


def one_turn(mitm) -> None:
    assert httpx.post(f"{mitm.url}/s/m{CHAT}", content=b'{"model":"m","stream":true}', timeout=10).status_code == 200


def test_an_address_that_cannot_be_served_at_runtime_is_refused_and_the_endpoint_stays(proxy):
    first, _, _ = proxy.ports
    one_turn(proxy)
    assert wait_for_turns(first, 1) == 1
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        said, now = set_metrics(proxy, busy)
    assert said.startswith("refused:") and "cannot serve metrics" in said, said
    assert now == f"127.0.0.1:{first}"  # the option is back where it serves
    one_turn(proxy)  # a turn meanwhile is counted: the endpoint never went away
    assert wait_for_turns(first, 2) == 2
    assert proxy.process.poll() is None


def test_metrics_turned_on_at_runtime_on_a_taken_port_are_refused_and_stay_off(proxy):
    """At start a taken port is warned of (the proxy runs on); set while the proxy runs, it is
    refused as any other address the endpoint cannot move to, and the option says off."""
    first, _, _ = proxy.ports
    assert set_metrics(proxy, "") == ("set", "")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        said, now = set_metrics(proxy, busy)
    assert said.startswith("refused:") and "cannot serve metrics" in said and "they stay off" in said, said
    assert now == ""


def test_turns_while_the_metrics_are_off_show_as_a_reset_not_a_quiet_spell(proxy):
    """Turns finished while the endpoint is off are not counted: served again, the counters start
    anew with new _created times, so a rate over the gap is not silently too low."""
    first, second, _ = proxy.ports
    one_turn(proxy)
    assert wait_for_turns(first, 1) == 1
    created = value(scrape(first), "streamtap_turns_created")
    assert set_metrics(proxy, "") == ("set", "")
    one_turn(proxy)
    one_turn(proxy)
    time.sleep(0.5)  # the turns are judged (their log lines) before the endpoint comes back
    assert set_metrics(proxy, f"127.0.0.1:{second}") == ("set", f"127.0.0.1:{second}")
    assert turns(second) == 0
    one_turn(proxy)
    assert wait_for_turns(second, 1) == 1
    assert value(scrape(second), "streamtap_turns_created") > created


def test_a_new_address_moves_the_endpoint_with_its_counts(proxy):
    first, second, _ = proxy.ports
    one_turn(proxy)
    assert wait_for_turns(first, 1) == 1
    assert set_metrics(proxy, f"127.0.0.1:{second}") == ("set", f"127.0.0.1:{second}")
    with pytest.raises(httpx.ConnectError):
        scrape(first)
    one_turn(proxy)
    assert wait_for_turns(second, 2) == 2


def test_another_host_on_the_same_port_takes_the_port_over(proxy):
    """The old server holds the port, so it closes first; the new one binds in its place."""
    first, _, _ = proxy.ports
    assert set_metrics(proxy, f"localhost:{first}") == ("set", f"localhost:{first}")
    one_turn(proxy)
    assert wait_for_turns(first, 1) == 1


@pytest.mark.parametrize("named", [123, ["a"], {"x": 1}, True])
def test_an_answer_naming_its_model_with_no_string_is_counted_and_logged(tmp_path, named):
    """Anthropic's message_start carries the model; a value other than a string is no name."""
    events = streams.anthropic_events("thought", "hello", {"a": 1})
    events[0]["message"]["model"] = named
    events[0]["message"]["id"] = named
    body = b"".join(streams._sse(event["type"], event) for event in events)
    metrics_port, = free_ports(1)
    request = json.dumps({"model": "claude-asked", "stream": True, "messages": []})
    with Upstream() as upstream:
        upstream.add("odd", Script(body, chunk_size=64))
        with Mitmdump(upstream.url, tmp_path, options={"streamtap_metrics": f"127.0.0.1:{metrics_port}"}) as mitm:
            mitm.wait_log("metrics on http://127.0.0.1:")
            answer = httpx.post(f"{mitm.url}/s/odd/v1/messages", content=request, timeout=10,
                                headers={"content-type": "application/json"})
            assert answer.content == body
            assert wait_for_turns(metrics_port, 1) == 1
            families = scrape(metrics_port)
            assert value(families, "streamtap_turns_total", verdict="complete", model="claude-asked") == 1
            assert value(families, "streamtap_tap_errors_total") == 0
            mitm.wait_log("complete")
            assert "cannot finish" not in mitm.log() and "Traceback" not in mitm.log(), mitm.log()[-2000:]
