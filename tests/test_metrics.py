"""Live metrics: a real mitmdump with streamtap_metrics on loopback, real streaming traffic,
the endpoint scraped and parsed with prometheus-client's own parser; the counters equal the
recordings (read back with the reader) and the report."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import provider_streams as streams
from fleet_traffic import drive
from test_report import streamtap
from upstream import CHAT, Mitmdump, Script, Upstream, curl, free_port


def scrape(port: int) -> dict[str, list]:
    """{family name: [samples]} from the endpoint."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(families, sample_name: str, **labels) -> float:
    found = [s.value for family in families.values() for s in family if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found)


def model(rec) -> str:
    return rec.end["turn"]["model"] or rec.header["request"]["body"].get("model") or "amazon.nova-lite-v1:0"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    port = free_port()
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("metrics"), options={"streamtap_metrics": f"127.0.0.1:{port}"}) as mitm:
            mitm.upstream = upstream
            mitm.metrics_port = port
            mitm.wait_log("metrics on http://127.0.0.1:")
            yield mitm


def test_counters_equal_the_recordings(proxy):
    before = scrape(proxy.metrics_port)
    assert value(before, "streamtap_turns_total") == 0
    assert {s.labels["part"] for s in before["streamtap_tap_errors"]} >= {"analysis", "recording", "tap"}
    recordings = drive(proxy)
    families = scrape(proxy.metrics_port)
    turns = Counter((r.header["dialect"], model(r), r.verdict["kind"], r.end["stream_end"]) for r in recordings)
    scraped = {
        (s.labels["provider"], s.labels["model"], s.labels["verdict"], s.labels["stream_end"]): s.value
        for s in families["streamtap_turns"] if s.name == "streamtap_turns_total"
    }
    assert scraped == {key: float(n) for key, n in turns.items()}
    groups = Counter((r.header["dialect"], model(r)) for r in recordings)
    for (provider, name), n in groups.items():
        mine = [r for r in recordings if (r.header["dialect"], model(r)) == (provider, name)]
        assert value(families, "streamtap_turn_duration_seconds_count", provider=provider, model=name) == n
        assert value(families, "streamtap_turn_duration_seconds_sum", provider=provider, model=name) == pytest.approx(
            sum(r.end["duration_ms"] for r in mine) / 1000, abs=1e-3)
        with_ttft = [r.end["ttft_ms"] for r in mine if r.end["ttft_ms"] is not None]
        assert value(families, "streamtap_ttft_seconds_count", provider=provider, model=name) == len(with_ttft)
        assert value(families, "streamtap_ttft_seconds_sum", provider=provider, model=name) == pytest.approx(sum(with_ttft) / 1000, abs=1e-3)
    assert value(families, "streamtap_stream_bytes_total") == sum(len(r.body) for r in recordings)
    assert value(families, "streamtap_events_total") == sum(len(r.segments) for r in recordings)
    for kind in ("input", "output"):
        expected = sum((r.end["turn"]["usage"] or {}).get(kind) or 0 for r in recordings)
        assert expected > 0 and value(families, "streamtap_usage_tokens_total", kind=kind) == expected
    assert value(families, "streamtap_tap_errors_total") == 0
    assert value(families, "streamtap_open_streams") == 0
    # the report over the same recordings says the same
    report = json.loads(streamtap("report", "--json", str(proxy.record_dir)).stdout)
    by_verdict: Counter = Counter()
    for (_, _, verdict, _), n in scraped.items():
        by_verdict[verdict] += n
    assert report["verdicts"] == {k: int(v) for k, v in by_verdict.items()}


def test_open_streams_during_a_stream(proxy):
    body = streams.openai_chat(["x"] * 20)
    proxy.upstream.arm_pause()
    proxy.upstream.add("fleet-open", Script(body, chunk_size=100, pause_after=300))
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        request = '{"model":"m","stream":true,"messages":[]}'
        sock.sendall(
            f"POST /s/fleet-open{CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(request)}\r\n\r\n{request}".encode()
        )
        try:
            assert proxy.upstream.wait_paused()
            assert value(scrape(proxy.metrics_port), "streamtap_open_streams") == 1
        finally:
            proxy.upstream.release()
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            received += sock.recv(65536)
    for _ in range(100):  # the Tap closes the stream right after the last byte went out
        if value(scrape(proxy.metrics_port), "streamtap_open_streams") == 0:
            break
        time.sleep(0.05)
    assert value(scrape(proxy.metrics_port), "streamtap_open_streams") == 0


def test_idle_connections_to_the_metrics_port_cost_the_proxy_a_bounded_number_of_threads(proxy):
    """prometheus-client's server gave each connection a thread and kept it while the connection
    stayed open, without a timeout: 1,015 idle connections used up the proxy's 1,024 file
    descriptors, and it forwarded no more traffic. At most MAX_SCRAPES are served at once,
    each closed after SCRAPE_TIMEOUT; the others are closed at once."""
    from streamtap.mitm.metrics import MAX_SCRAPES

    def threads() -> int:
        return len(list((Path("/proc") / str(proxy.process.pid) / "task").iterdir()))

    before = threads()
    idle = [socket.create_connection(("127.0.0.1", proxy.metrics_port)) for _ in range(40)]
    try:
        time.sleep(1.0)
        assert threads() <= before + 2 * MAX_SCRAPES, (before, threads())  # (each scrape: its thread and its deadline's)
        proxy.upstream.add("beside-idle", Script(streams.openai_chat(["still ", "forwarded"])))
        assert curl(f"{proxy.url}/s/beside-idle{CHAT}").stdout == streams.openai_chat(["still ", "forwarded"])
        closed = 0
        for connection in idle:  # the ones beyond the limit were closed at once
            connection.settimeout(0.2)
            try:
                closed += connection.recv(1) == b""
            except TimeoutError:
                pass
        assert closed >= len(idle) - MAX_SCRAPES, closed
    finally:
        for connection in idle:
            connection.close()


def test_an_accept_header_prometheus_client_cannot_read_gets_the_text_format_not_a_traceback(proxy):
    """prometheus-client 0.26 compares a version in the Accept header to numbers: a version that
    is no number raised, and every such scrape printed a traceback into the proxy's output."""
    for accept in ("text/plain; version=x", "application/openmetrics-text; version=1.x"):
        response = httpx.get(f"http://127.0.0.1:{proxy.metrics_port}/metrics", headers={"accept": accept}, timeout=5)
        assert response.status_code == 200 and "streamtap_turns_total" in response.text, response.text[:300]
    assert "Traceback" not in proxy.log()


def test_model_labels_are_bounded():
    from streamtap.mitm.metrics import MAX_MODELS, OTHER, TurnMetrics

    metrics = TurnMetrics()
    labels = [metrics.model_label(f"model-{i}") for i in range(MAX_MODELS + 10)]
    assert labels[:MAX_MODELS] == [f"model-{i}" for i in range(MAX_MODELS)]
    assert labels[MAX_MODELS:] == [OTHER] * 10
    assert metrics.model_label("model-3") == "model-3"  # a known name keeps its label
    fresh = TurnMetrics()
    assert fresh.model_label("gpt 4 <script>") == OTHER and fresh.model_label(None) == OTHER and fresh.model_label("x" * 200) == OTHER


def test_a_model_name_is_its_own_label_whatever_allowed_character_it_starts_with():
    """As the README says: only a name with other characters than A-Za-z0-9._:/@+-, or longer
    than 100, counts as other (Cloudflare's Workers AI names start with @)."""
    from streamtap.mitm.metrics import OTHER, TurnMetrics

    metrics = TurnMetrics()
    for name in ("@cf/meta/llama-3.1-8b-instruct", "@hf/thebloke/zephyr-7b-beta-awq", ":latest", "x" * 100):
        assert metrics.model_label(name) == name
    assert metrics.model_label("x" * 101) == OTHER and metrics.model_label("") == OTHER
    assert metrics.model_label("@cf/meta llama") == OTHER  # a space is outside the set


def test_a_token_count_past_what_a_counter_holds_is_left_out_and_the_turn_counted_whole():
    """JSON allows any integer, and the stdlib parser the providers fall back to reads one past a
    double's range exactly: that count (and one past 2**53, which no float counter holds exactly)
    is left out, and the rest of the turn is counted, before and after it in the summary's order."""
    from streamtap.mitm.metrics import MAX_TOKEN_COUNT, TurnMetrics

    metrics = TurnMetrics()
    usage = {"input": 10**400, "output": 2, "cache_read": MAX_TOKEN_COUNT + 1, "cache_write": MAX_TOKEN_COUNT, "reasoning": True}
    summary = {"provider": "openai-chat", "verdict": "complete", "stream_end": "finished", "ttft_ms": 5.0,
               "duration_ms": 10.0, "bytes": 100, "events": 3, "usage": usage, "errors": ["recording: disk full"]}  # fmt: skip
    metrics.count(summary, "gpt-x")
    metrics.count({**summary, "usage": {"input": 9, "output": 2}, "errors": []}, "gpt-x")
    sample = metrics.registry.get_sample_value
    labels = {"provider": "openai-chat", "model": "gpt-x"}
    assert sample("streamtap_turns_total", {**labels, "verdict": "complete", "stream_end": "finished"}) == 2
    assert sample("streamtap_turn_duration_seconds_count", labels) == 2 and sample("streamtap_ttft_seconds_count", labels) == 2
    assert sample("streamtap_stream_bytes_total") == 200 and sample("streamtap_events_total") == 6
    tokens = {kind: sample("streamtap_usage_tokens_total", {**labels, "kind": kind}) for kind in usage}
    assert tokens == {"input": 9, "output": 4, "cache_read": None, "cache_write": MAX_TOKEN_COUNT, "reasoning": None}
    assert sample("streamtap_tap_errors_total", {"part": "recording"}) == 1


@pytest.mark.parametrize("address", ["nonsense", "http://127.0.0.1:19108"])
def test_a_bad_address_stops_the_proxy_at_startup_saying_why(tmp_path, address):
    mitm = Mitmdump("http://127.0.0.1:9", tmp_path, options={"streamtap_metrics": address})
    process = subprocess.run(mitm.args, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert process.returncode != 0
    assert f"streamtap_metrics must be HOST:PORT (e.g. 127.0.0.1:9108), not {address!r}" in process.stdout + process.stderr


def test_an_address_is_a_host_name_or_an_ip_address_and_a_port_of_ascii_digits():
    from streamtap.mitm.metrics import parse_address

    for good, parsed in (("127.0.0.1:9108", ("127.0.0.1", 9108)), ("localhost:80", ("localhost", 80)),
                         ("[::1]:9108", ("::1", 9108)), ("metrics-1.example:9108", ("metrics-1.example", 9108)),
                         ("metrics_host:9108", ("metrics_host", 9108))):
        assert parse_address(good) == parsed
    for bad in ("http://127.0.0.1:19108", "127.0.0.1:19108/metrics", "300.1.1.1:19108", "127.0.0.1 :19108",
                "127.0.0.1:\u00b2", "127.0.0.1:\u0669\u0661\u0660\u0668", ":9108", "[localhost]:9108", "-host:1", "h:65536"):
        with pytest.raises(ValueError, match="must be HOST:PORT"):
            parse_address(bad)


def test_a_script_reload_serves_the_metrics_from_the_new_addons(tmp_path):
    """mitmproxy reloads a script whose file changed: its done hook runs synchronously, so every
    streamtap addon must stop without awaiting; the new instances then serve the metrics."""
    script = tmp_path / "streamtap_script.py"
    script.write_text("from streamtap.mitm.entry import make_addons\naddons = make_addons()\n")
    port = free_port()
    with Upstream() as upstream:
        upstream.add("m", Script(streams.openai_chat(["before ", "and after"]), chunk_size=40))
        with Mitmdump(upstream.url, tmp_path / "run", script=script, options={"streamtap_metrics": f"127.0.0.1:{port}"}) as mitm:
            mitm.wait_log("metrics on http://127.0.0.1:")
            assert httpx.post(f"{mitm.url}/s/m{CHAT}", content=b"{}", timeout=10).status_code == 200
            deadline = time.monotonic() + 10
            while value(scrape(port), "streamtap_turns_total") < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.1)  # a new modification time, whatever the file system's resolution
            script.write_text(script.read_text() + "# changed\n")
            mitm.wait_log("metrics on http://127.0.0.1:", count=2, timeout=15)
            assert httpx.post(f"{mitm.url}/s/m{CHAT}", content=b"{}", timeout=10).status_code == 200
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if value(scrape(port), "streamtap_turns_total") == 1:  # the new instances count anew
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            assert value(scrape(port), "streamtap_turns_total") == 1
        assert "sync context" not in mitm.log() and "Traceback" not in mitm.log(), mitm.log()[-3000:]


def test_a_metrics_port_already_taken_is_logged_and_the_proxy_runs_on_without_metrics(tmp_path):
    """README: metrics never block traffic. mitmdump exits on an error logged while it starts,
    so the failed listen is a warning, and the proxy carries a stream as usual."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with Upstream() as upstream:
            upstream.add("m", Script(streams.openai_chat(["still ", "here"]), chunk_size=40))
            with Mitmdump(upstream.url, tmp_path, options={"streamtap_metrics": f"127.0.0.1:{port}"}) as mitm:
                mitm.wait_log(f"cannot serve metrics on 127.0.0.1:{port}")
                answer = httpx.post(f"{mitm.url}/s/m{CHAT}", content=b"{}", timeout=10)
                assert answer.status_code == 200 and answer.content == upstream.last("m").wire
                assert mitm.process.poll() is None


def test_metrics_report_and_index_agree_with_compression_on(tmp_path):
    """Metrics and zstd recordings on together: the scraped counters, `report` over the
    .jsonl.zst recordings and the Parquet index tell the same numbers."""
    import duckdb

    port = free_port()
    with Upstream() as upstream:
        options = {"streamtap_metrics": f"127.0.0.1:{port}", "streamtap_compress": "zstd"}
        with Mitmdump(upstream.url, tmp_path / "proxy", options=options) as mitm:
            mitm.upstream = upstream
            mitm.wait_log("metrics on http://127.0.0.1:")
            recordings = drive(mitm)
            families = scrape(port)
    assert all(r.path.name.endswith(".jsonl.zst") for r in recordings)
    scraped = Counter()
    for s in families["streamtap_turns"]:
        if s.name == "streamtap_turns_total":
            scraped[(s.labels["provider"], s.labels["model"], s.labels["verdict"], s.labels["stream_end"])] += int(s.value)
    out = tmp_path / "idx"
    assert streamtap("index", str(mitm.record_dir), "--out", str(out)).returncode == 0
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT provider, model, verdict, stream_end, count(*) FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true) GROUP BY ALL"
    ).fetchall()
    assert {(p, m, v, e): n for p, m, v, e, n in rows} == dict(scraped)
    total_bytes, total_events, input_tokens, output_tokens = con.execute(
        f"SELECT sum(bytes), sum(events), sum(input_tokens), sum(output_tokens) FROM read_parquet('{out}/**/*.parquet')"
    ).fetchall()[0]
    assert value(families, "streamtap_stream_bytes_total") == total_bytes
    assert value(families, "streamtap_events_total") == total_events
    assert value(families, "streamtap_usage_tokens_total", kind="input") == input_tokens
    assert value(families, "streamtap_usage_tokens_total", kind="output") == output_tokens
    report = json.loads(streamtap("report", "--json", str(mitm.record_dir)).stdout)
    by_verdict: Counter = Counter()
    for (_, _, verdict, _), n in scraped.items():
        by_verdict[verdict] += n
    assert report["verdicts"] == dict(by_verdict) and report["recordings"] == len(recordings)


def test_a_usage_count_past_a_double_is_left_out_live_and_its_recording_verifies(tmp_path):
    """A real proxy: the stream whose prompt_tokens has 401 digits is counted (its output tokens
    too), the next one counted as before, and its recording, judged complete, verifies."""
    chat = streams.openai_chat(["a ", "b"], model="gpt-x")
    port = free_port()
    with Upstream() as upstream:
        upstream.add("huge", Script(chat.replace(b'"prompt_tokens":9', b'"prompt_tokens":1' + b"0" * 400)))
        upstream.add("plain", Script(chat))
        with Mitmdump(upstream.url, tmp_path / "proxy", options={"streamtap_metrics": f"127.0.0.1:{port}"}) as mitm:
            for name in ("huge", "plain"):
                assert curl(f"{mitm.url}/s/{name}{CHAT}").stdout == upstream.last(name).wire
            mitm.wait_log("streamtap: openai-chat", count=2)
            deadline = time.monotonic() + 10
            while value(families := scrape(port), "streamtap_turns_total") < 2:  # (the log line comes just before the count)
                assert time.monotonic() < deadline
                time.sleep(0.02)
    assert value(families, "streamtap_turns_total", provider="openai-chat", model="gpt-x", verdict="complete") == 2
    assert value(families, "streamtap_usage_tokens_total", kind="output") == 4
    assert value(families, "streamtap_usage_tokens_total", kind="input") == 9  # the plain stream's only
    assert value(families, "streamtap_tap_errors_total") == 0
    assert "Metrics.turn_finished" not in mitm.log()
    recordings = sorted(mitm.record_dir.glob("*.jsonl"))
    assert len(recordings) == 2
    for path in recordings:
        result = streamtap("verify", str(path))
        assert result.returncode == 0 and ": complete " in result.stdout, result.stdout + result.stderr


def test_a_scrape_that_trickles_is_closed_at_its_deadline_not_kept_by_each_byte(monkeypatch):
    """The socket timeout bounds each read: a client sending a byte now and then kept its slot for
    good, and 8 of them refused every real scrape. Each scrape now ends at SCRAPE_TIMEOUT."""
    import threading

    import streamtap.mitm.metrics as metrics_module

    monkeypatch.setattr(metrics_module, "SCRAPE_TIMEOUT", 1.0)
    server = metrics_module._start_server(("127.0.0.1", 0), metrics_module.TurnMetrics().registry)
    port = server.server_address[1]
    stop = threading.Event()

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", port)) as connection:
            try:
                while not stop.wait(0.3):
                    connection.sendall(b"G")
            except OSError:  # closed by the server: what is tested
                pass

    trickling = [threading.Thread(target=trickle) for _ in range(metrics_module.MAX_SCRAPES)]
    try:
        for thread in trickling:
            thread.start()
        time.sleep(2.5)  # past the deadline of each
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        stop.set()
        for thread in trickling:
            thread.join(5)
        metrics_module.Metrics._close(server)
