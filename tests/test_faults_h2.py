"""Live cuts for HTTP/2 clients through a real `mitmdump -s addon/tap.py` (TLS towards the
client, h2 by ALPN): a clean cut ends the client's stream with END_STREAM right at the cut,
an abort resets only that stream (RST_STREAM), a reset drops the TCP connection; the
upstream's side of the stream is cancelled, and the Tap records exactly what the client got.

The upstream streams slowly (0.1 s between events), so a cut that waited for the upstream's
end would show as seconds of delay. A small raw HTTP/2 client (the h2 library on a TLS
socket) sees the frames themselves and keeps several streams on one connection. The same
mechanism ends HTTP/1.1 responses: those tests check that a kept-alive connection stays
usable after a clean cut, and races with the upstream's own end or close crash nothing.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest

import provider_streams as streams
from streamtap.recording import check_recording
from upstream import H2Upstream, Mitmdump, Script, Upstream, find_recording, proxy_to

CHAT = "/v1/chat/completions"
REQUEST = b'{"model":"m","stream":true,"messages":[]}'
GAP = 0.1  # seconds between upstream events
SLOW = streams.openai_chat([f"w{i} " for i in range(36)])  # 40 events: about 4 s upstream
EVENTS = [event + b"\n\n" for event in SLOW.split(b"\n\n") if event]
BEFORE_CUT = b"".join(EVENTS[:6])  # events 0..5: every fault here is cut:event=5
PROMPT = 2.5  # the cut comes after ~0.55 s; the upstream would end after ~4 s (slack for busy CI cores)


def prompt_enough(elapsed: float) -> None:
    assert elapsed < PROMPT, f"the stream ended after {elapsed:.2f} s: it waited for the upstream"


def assert_upstream_stopped(served) -> None:
    """The upstream stopped sending soon after the cut (TCP lets a write or two through
    before a closed peer is noticed), long before its body was done."""
    time.sleep(3 * GAP)
    sent = len(served.wire)
    time.sleep(4 * GAP)
    assert len(served.wire) == sent < len(SLOW) and not served.done, "the upstream went on sending after the cut"


# An addon whose response hook takes a while for /s/slowhook/ flows: what the upstream
# sends meanwhile (its close, bytes in flight) reaches a stream that is waiting for the hook.
SLOW_HOOK = """
import asyncio

async def response(flow):
    if "/s/slowhook" in flow.request.path:
        await asyncio.sleep(0.3)
"""


@pytest.fixture(scope="module")
def clean_proxy(tmp_path_factory):
    """An HTTP/1.1 upstream (reverse:http://...), HTTP/2 clients; every tapped stream gets a
    clean cut after event 5 (the option)."""
    work = tmp_path_factory.mktemp("h2clean")
    (work / "slow_hook.py").write_text(SLOW_HOOK)
    options = {"streamtap_fault": "cut:event=5,style=clean"}
    with Upstream() as upstream, proxy_to(upstream, work, options, scripts=(work / "slow_hook.py",)) as mitm:
        yield mitm


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """HTTP/2 on both sides (so httpx, which prefers http/1.1, gets h2 too); faults per request by header."""
    with H2Upstream() as upstream, proxy_to(upstream, tmp_path_factory.mktemp("h2faults"), {"streamtap_fault_header": "true"}) as mitm:
        yield mitm


# --- a raw HTTP/2 client: what each stream got, and how it ended -------------------------


@dataclass
class StreamResult:
    started: float
    status: int | None = None
    data: bytearray = field(default_factory=bytearray)
    ended: float | None = None  # END_STREAM arrived (monotonic time)
    reset: int | None = None  # RST_STREAM error code
    reset_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.ended is not None or self.reset is not None


class H2Client:
    def __init__(self, port: int, ca: str) -> None:
        context = ssl.create_default_context(cafile=ca)
        context.set_alpn_protocols(["h2"])
        self.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost")
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.streams: dict[int, StreamResult] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self._flush()

    def post(self, path: str, fault: str | None = None) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "https"), (":authority", "localhost"), (":path", path), ("content-type", "application/json")]
        if fault:
            headers.append(("x-streamtap-fault", fault))
        self.conn.send_headers(stream_id, headers)
        self.conn.send_data(stream_id, REQUEST, end_stream=True)
        self._flush()
        self.streams[stream_id] = StreamResult(time.monotonic())
        return stream_id

    def wait(self, *stream_ids: int, timeout: float) -> None:
        """Read frames until the streams finished, the connection ended or ``timeout`` s passed."""
        deadline = time.monotonic() + timeout
        while not all(self.streams[s].finished for s in stream_ids) and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return
            except ConnectionResetError:  # a TCP RST: 3.13's ssl raises it where 3.12.1's read b""
                data = b""
            if not data:
                self.closed = True
                return
            for event in self.conn.receive_data(data):
                result = self.streams.get(getattr(event, "stream_id", 0))
                if isinstance(event, h2.events.ResponseReceived):
                    result.status = int(dict(event.headers)[":status"])
                elif isinstance(event, h2.events.DataReceived):
                    result.data += event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    result.ended = time.monotonic()
                elif isinstance(event, h2.events.StreamReset):
                    result.reset, result.reset_at = event.error_code, time.monotonic()
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = event
            self._flush()

    def _flush(self) -> None:
        if data := self.conn.data_to_send():
            self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self._flush()
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def client(proxy):
    c = H2Client(proxy.port, proxy.ca)
    yield c
    c.close()


def curl_h2(proxy, name: str, fault: str | None = None) -> tuple[subprocess.CompletedProcess, float]:
    args = ["curl", "-sS", "-N", "--http2", "--max-time", "8", "--cacert", proxy.ca, "-H", "content-type: application/json", "--data", REQUEST.decode()]
    if fault:
        args += ["-H", f"x-streamtap-fault: {fault}"]
    start = time.monotonic()
    out = subprocess.run([*args, f"https://localhost:{proxy.port}/s/{name}{CHAT}"], capture_output=True)
    return out, time.monotonic() - start


# --- clean: END_STREAM at the cut ---------------------------------------------------------


def test_clean_cut_ends_the_http2_stream_at_once_and_cancels_the_upstream(proxy):
    proxy.upstream.add("clean", Script(SLOW, chunk_size=None, gap=GAP))
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=proxy.ca)) as http:
        start = time.monotonic()
        with http.stream("POST", f"https://localhost:{proxy.port}/s/clean{CHAT}", content=REQUEST,
                         headers={"x-streamtap-fault": "cut:event=5,style=clean"}) as response:
            got = b"".join(response.iter_raw())  # raises if the stream does not end properly
        elapsed = time.monotonic() - start
        assert response.http_version == "HTTP/2"
        # the client connection stays open, yet the upstream stops sending: its stream was reset
        assert_upstream_stopped(proxy.upstream.last("clean"))
    prompt_enough(elapsed)
    assert got == BEFORE_CUT
    rec = find_recording(proxy.record_dir, "clean")
    assert rec.body == got and check_recording(rec) == []
    assert rec.verdict["kind"] == "truncated" and rec.end["stream_end"] == "finished"
    assert "HTTP/2 stream" in proxy.wait_log("clean cut, END_STREAM to the client")


def test_clean_cut_with_curl_exits_0(clean_proxy):
    clean_proxy.upstream.add("clean-curl", Script(SLOW, chunk_size=None, gap=GAP))
    out, elapsed = curl_h2(clean_proxy, "clean-curl")
    assert out.returncode == 0, out.stderr
    prompt_enough(elapsed)
    assert out.stdout == BEFORE_CUT


def test_clean_cut_from_an_http1_upstream(clean_proxy):
    proxy = clean_proxy
    proxy.upstream.add("clean-h1", Script(SLOW, chunk_size=None, gap=GAP))
    client = H2Client(proxy.port, proxy.ca)
    try:
        stream = client.post(f"/s/clean-h1{CHAT}")  # the fault comes from the streamtap_fault option
        client.wait(stream, timeout=PROMPT)
        # with the client connection still open, the proxy closed the upstream connection
        assert_upstream_stopped(proxy.upstream.last("clean-h1"))
    finally:
        client.close()
    result = client.streams[stream]
    assert result.status == 200 and result.reset is None
    assert result.ended is not None, "no END_STREAM at the cut"
    prompt_enough(result.ended - result.started)
    assert bytes(result.data) == BEFORE_CUT
    rec = find_recording(proxy.record_dir, "clean-h1")
    assert rec.body == BEFORE_CUT and rec.verdict["kind"] == "truncated" and rec.end["stream_end"] == "finished"


@pytest.mark.parametrize("fixture", ["clean_proxy", "proxy"])
def test_clean_cuts_racing_a_fast_upstream(fixture, request):
    """The upstream's later bytes (or its end) may already be on their way when the cut ends
    the stream: every stream still gets exactly the bytes before the cut and one END_STREAM."""
    proxy = request.getfixturevalue(fixture)
    proxy.upstream.add("fast", Script(SLOW, chunk_size=97))
    client = H2Client(proxy.port, proxy.ca)
    try:
        fault = None if fixture == "clean_proxy" else "cut:event=5,style=clean"
        ids = [client.post(f"/s/fast{CHAT}", fault=fault) for _ in range(8)]
        client.wait(*ids, timeout=5)
        for stream_id in ids:
            result = client.streams[stream_id]
            assert result.ended is not None and result.reset is None and bytes(result.data) == BEFORE_CUT
        assert client.goaway is None and not client.closed
    finally:
        client.close()
    assert "mitmproxy has crashed" not in proxy.log()


@pytest.mark.parametrize("http2", [True, False])
def test_upstream_close_during_a_slow_response_hook(clean_proxy, http2):
    """The cut closes the HTTP/1.1 upstream connection while the stream waits for a slow
    response hook: the upstream's close must not reach the ended stream (a second end,
    a crash, or a closed client connection)."""
    clean_proxy.upstream.add("slowhook", Script(SLOW, chunk_size=None, gap=GAP))
    path = f"/s/slowhook{CHAT}"
    if http2:
        client = H2Client(clean_proxy.port, clean_proxy.ca)
        try:
            ids = [client.post(path)]
            client.wait(*ids, timeout=PROMPT + 0.3)
            ids.append(client.post(path))
            client.wait(*ids, timeout=PROMPT + 0.3)
            for stream_id in ids:
                result = client.streams[stream_id]
                assert result.ended is not None and result.reset is None and bytes(result.data) == BEFORE_CUT
            assert client.goaway is None and not client.closed
        finally:
            client.close()
    else:
        with httpx.Client() as http:
            first = http.post(clean_proxy.url + path, content=REQUEST)
            second = http.post(clean_proxy.url + path, content=REQUEST)
        assert first.content == second.content == BEFORE_CUT
        assert first.extensions["network_stream"] is second.extensions["network_stream"], "not the same connection"
    assert "mitmproxy has crashed" not in clean_proxy.log()


# --- abort: RST_STREAM on that stream only ------------------------------------------------


def test_abort_resets_only_that_stream(proxy, client):
    proxy.upstream.add("abort", Script(SLOW, chunk_size=None, gap=GAP))
    steady = streams.openai_chat(["steady "] * 8)  # 11 events over ~1 s, no fault, same connection
    proxy.upstream.add("steady", Script(steady, chunk_size=None, gap=GAP))
    neighbour = client.post(f"/s/steady{CHAT}")
    aborted = client.post(f"/s/abort{CHAT}", fault="cut:event=5,style=abort")
    client.wait(aborted, timeout=PROMPT)
    result = client.streams[aborted]
    assert result.reset == h2.errors.ErrorCodes.INTERNAL_ERROR, (result, client.goaway, client.closed)
    prompt_enough(result.reset_at - result.started)
    assert bytes(result.data) == BEFORE_CUT and result.ended is None
    # the other stream, open during the reset, finishes normally on the same connection
    client.wait(neighbour, timeout=5)
    assert client.streams[neighbour].ended is not None and client.streams[neighbour].reset is None
    assert bytes(client.streams[neighbour].data) == steady
    # and the connection takes new requests
    proxy.upstream.add("after", Script(streams.openai_chat(["fine"])))
    after = client.post(f"/s/after{CHAT}")
    client.wait(after, timeout=5)
    assert client.streams[after].ended is not None and bytes(client.streams[after].data) == streams.openai_chat(["fine"])
    assert client.goaway is None and not client.closed
    rec = find_recording(proxy.record_dir, "abort")
    assert rec.body == BEFORE_CUT and check_recording(rec) == []
    assert rec.verdict["kind"] == "truncated" and rec.end["stream_end"] == "upstream_reset"
    assert "abort cut, RST_STREAM INTERNAL_ERROR to the client" in proxy.wait_log("RST_STREAM INTERNAL_ERROR")


def test_abort_is_a_stream_error_for_curl_and_httpx(proxy):
    proxy.upstream.add("abort-curl", Script(SLOW, chunk_size=None, gap=GAP))
    out, elapsed = curl_h2(proxy, "abort-curl", "cut:event=5,style=abort")
    assert out.returncode == 92, out.stderr  # curl: HTTP/2 stream not closed cleanly
    assert b"INTERNAL_ERROR" in out.stderr
    prompt_enough(elapsed)
    assert out.stdout == BEFORE_CUT
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=proxy.ca)) as http:
        start = time.monotonic()
        got = bytearray()
        with pytest.raises(httpx.RemoteProtocolError, match="StreamReset"):
            with http.stream("POST", f"https://localhost:{proxy.port}/s/abort-curl{CHAT}", content=REQUEST,
                             headers={"x-streamtap-fault": "cut:event=5,style=abort"}) as response:
                assert response.http_version == "HTTP/2"
                for chunk in response.iter_raw():
                    got += chunk
        prompt_enough(time.monotonic() - start)
        assert bytes(got) == BEFORE_CUT


@pytest.fixture(scope="module")
def tunnel_proxy(tmp_path_factory):
    """mitmdump as an HTTP proxy (regular mode): each client's HTTP/2 runs inside a CONNECT
    tunnel, so the flow's stream is on an HTTP layer within the client connection's first one."""
    with H2Upstream() as upstream:
        options = {"streamtap_fault_header": "true", "ssl_insecure": "true"}
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("h2tunnel"), options=options, mode="regular") as mitm:
            mitm.upstream = upstream
            mitm.ca = str(mitm.confdir / "mitmproxy-ca-cert.pem")
            yield mitm
            assert "mitmproxy has crashed" not in mitm.log()


@pytest.mark.parametrize("style, curl_exit, how", [("clean", 0, "END_STREAM"), ("abort", 92, "RST_STREAM INTERNAL_ERROR")])
def test_a_cut_through_a_connect_tunnel_ends_the_http2_stream_at_once(tunnel_proxy, style, curl_exit, how):
    """The stream lookup used to search only the first HTTP layer, the one holding the CONNECT:
    the cut fell back, so a clean cut ended only when the upstream did and an abort closed the
    whole connection."""
    proxy = tunnel_proxy
    name = f"tunnel-{style}"
    proxy.upstream.add(name, Script(SLOW, chunk_size=None, gap=GAP))
    start = time.monotonic()
    out = subprocess.run(["curl", "-sS", "-N", "--http2", "--max-time", "8", "--proxy", proxy.url, "--cacert", proxy.ca,
                          "-H", "content-type: application/json", "-H", f"x-streamtap-fault: cut:event=5,style={style}",
                          "--data", REQUEST.decode(), f"{proxy.upstream.url}/s/{name}{CHAT}"], capture_output=True)
    prompt_enough(time.monotonic() - start)
    assert out.returncode == curl_exit, (out.returncode, out.stderr)
    assert out.stdout == BEFORE_CUT
    assert_upstream_stopped(proxy.upstream.last(name))
    log = proxy.wait_log(f"{style} cut, {how} to the client")
    assert "cannot end the response at the cut" not in log, log[-3000:]


@pytest.fixture(scope="module")
def http1_upstream_proxy(tmp_path_factory):
    """An HTTP/1.1 upstream (reverse:http://...), HTTP/2 clients; faults per request by header."""
    with Upstream() as upstream:
        options = {"streamtap_fault_header": "true"}
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("h2fast"), options=options) as mitm:
            mitm.upstream = upstream
            mitm.ca = str(mitm.confdir / "mitmproxy-ca-cert.pem")
            yield mitm
            assert "mitmproxy has crashed" not in mitm.log()


@pytest.mark.parametrize("style, curl_exit", [("abort", 92), ("clean", 0)])
def test_a_cut_holds_when_the_upstream_sends_its_whole_body_at_once(http1_upstream_proxy, style, curl_exit):
    """Headers, body and end in one read: mitmproxy holds the body and its end while the
    responseheaders hooks run, and hands them to the stream after. The cut must still end the
    client's stream as its style says, not with the upstream's clean end, and the recording
    says so: an abort as the upstream's end (upstream_reset), not a body that ended cleanly."""
    proxy = http1_upstream_proxy
    for attempt in range(4):
        name = f"fast-{style}-{attempt}"
        proxy.upstream.add(name, Script(SLOW, chunks=[SLOW]))
        out, _ = curl_h2(proxy, name, f"cut:event=5,style={style}")
        assert out.returncode == curl_exit, (attempt, out.returncode, out.stderr)
        assert out.stdout == BEFORE_CUT
        rec = find_recording(proxy.record_dir, name)
        ended = "finished" if style == "clean" else "upstream_reset"
        assert rec.body == BEFORE_CUT and rec.end["stream_end"] == ended, (attempt, rec.end)


def test_an_http1_abort_is_the_upstream_s_end_when_the_upstream_ends_at_once(http1_upstream_proxy):
    """HTTP/1.1 clients: the connection closes after the cut's bytes, and the upstream's own end,
    which mitmproxy reports with the response hook, does not make the recording say it finished."""
    proxy = http1_upstream_proxy
    for attempt in range(3):
        name = f"fast-h1-abort-{attempt}"
        proxy.upstream.add(name, Script(SLOW, chunks=[SLOW]))
        out = subprocess.run(["curl", "-sS", "--http1.1", "--max-time", "8", "-H", "content-type: application/json",
                              "-H", "x-streamtap-fault: cut:event=5,style=abort", "--data", REQUEST.decode(),
                              f"{proxy.url}/s/{name}{CHAT}"], capture_output=True)
        assert out.returncode == 18 and out.stdout == BEFORE_CUT, (attempt, out.returncode, out.stderr)  # a cut body
        rec = find_recording(proxy.record_dir, name)
        assert rec.body == BEFORE_CUT and rec.end["stream_end"] == "upstream_reset", (attempt, rec.end)


def test_an_http2_client_that_hangs_up_mid_stream_is_not_taken_for_the_upstream(http1_upstream_proxy):
    """mitmproxy words it "peer closed connection", and by the error hook it has closed the
    upstream connection too: the answer was not the provider's fault."""
    proxy = http1_upstream_proxy
    proxy.upstream.add("h2-leaves", Script(SLOW, chunk_size=None, gap=GAP))
    client = H2Client(proxy.port, proxy.ca)
    stream = client.post(f"/s/h2-leaves{CHAT}")
    deadline = time.monotonic() + PROMPT
    while len(client.streams[stream].data) < len(BEFORE_CUT) and time.monotonic() < deadline:
        client.wait(stream, timeout=GAP)
    assert len(client.streams[stream].data) >= len(BEFORE_CUT), "the stream never got going"
    client.sock.close()  # no GOAWAY, no RST_STREAM: the client is just gone
    rec = find_recording(proxy.record_dir, "h2-leaves")
    assert rec.end["stream_end"] == "client_aborted", rec.end
    assert rec.verdict["kind"] == "truncated" and "client" in rec.verdict["reason"], rec.verdict


# --- reset: the TCP connection (every stream on it) --------------------------------------


def test_reset_drops_the_whole_connection(proxy, client):
    proxy.upstream.add("reset", Script(SLOW, chunk_size=None, gap=GAP))
    stream = client.post(f"/s/reset{CHAT}", fault="cut:event=5,style=reset")
    client.wait(stream, timeout=PROMPT)
    result = client.streams[stream]
    assert client.closed and client.goaway is None, "the TCP connection should just go (no GOAWAY)"
    assert result.ended is None and result.reset is None and bytes(result.data) == BEFORE_CUT
    prompt_enough(time.monotonic() - result.started)
    out, elapsed = curl_h2(proxy, "reset", "cut:event=5,style=reset")
    assert out.returncode == 56 and b"reset by peer" in out.stderr, out.stderr  # a TCP RST, not a FIN
    prompt_enough(elapsed)


# --- replayed cuts reach HTTP/2 clients through mitmproxy's own mapping -------------------


def test_replayed_cuts_for_http2_clients(tmp_path):
    """The replay server cuts its HTTP/1.1 answer (terminator, FIN or RST); mitmproxy turns
    that into END_STREAM or, for both abort and reset, RST_STREAM INTERNAL_ERROR."""
    import json

    from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording

    (tmp_path / "replay").mkdir()
    frames = openai_chat_frames(words=20)
    write_recording(tmp_path / "replay" / "openai.jsonl", "openai", frames, gap_ms=20)
    options = {"streamtap_replay": str(tmp_path / "replay"), "streamtap_fault_header": "true"}
    with Upstream() as upstream, Mitmdump(upstream.url, tmp_path, options=options) as mitm:
        ca = str(mitm.confdir / "mitmproxy-ca-cert.pem")
        for style, code in [("clean", 0), ("abort", 92), ("reset", 92)]:
            out = subprocess.run(
                ["curl", "-sS", "--http2", "--max-time", "8", "--cacert", ca, "-H", f"x-streamtap-fault: cut:event=7,style={style}",
                 "-H", "content-type: application/json", "--data-binary", json.dumps(OPENAI_REQUEST),
                 f"https://localhost:{mitm.port}/v1/chat/completions"],
                capture_output=True,
            )
            assert out.returncode == code, (style, out.stderr)
            assert out.stdout == b"".join(frames[:8])
            if code:
                assert b"INTERNAL_ERROR" in out.stderr


# --- the same end for HTTP/1.1 clients ------------------------------------------------------


def test_clean_cut_keeps_an_http1_connection_usable(clean_proxy):
    """The chunked terminator comes once, at the cut: the next request on the connection
    gets its own response (a second terminator when the upstream ended would read as a
    bogus status line)."""
    clean_proxy.upstream.add("keepalive", Script(SLOW, chunk_size=None, gap=GAP))
    with httpx.Client() as http:
        url = f"{clean_proxy.url}/s/keepalive{CHAT}"
        start = time.monotonic()
        first = http.post(url, content=REQUEST)
        prompt_enough(time.monotonic() - start)
        second = http.post(url, content=REQUEST)
        assert first.content == second.content == BEFORE_CUT
        assert first.extensions["network_stream"] is second.extensions["network_stream"], "not the same connection"
        assert_upstream_stopped(clean_proxy.upstream.last("keepalive"))


def test_clean_cut_of_a_close_delimited_http1_body_is_a_fin_at_the_cut(clean_proxy):
    clean_proxy.upstream.add("close-delimited", Script(SLOW, chunk_size=None, gap=GAP, framing="close"))
    with httpx.Client() as http:
        start = time.monotonic()
        response = http.post(f"{clean_proxy.url}/s/close-delimited{CHAT}", content=REQUEST)
        prompt_enough(time.monotonic() - start)
    assert "content-length" not in response.headers and "transfer-encoding" not in response.headers
    assert response.content == BEFORE_CUT
    rec = find_recording(clean_proxy.record_dir, "close-delimited")
    assert rec.body == BEFORE_CUT and rec.end["stream_end"] == "finished"


# --- when mitmproxy's internals are not as expected -----------------------------------------


@pytest.mark.parametrize("alpn, style, chunk, says", [
    (b"h2", "clean", [], "cannot end the response at the cut"),
    (b"http/1.1", "clean", [b""], "cannot end the response at the cut"),
    (b"h2", "abort", [], "the abort closes the whole client connection instead"),
])
def test_without_the_proxy_internals_the_cut_falls_back_and_says_so(alpn, style, chunk, says, caplog):
    from mitmproxy.test import tflow

    from streamtap.mitm.replay import _end_at_cut

    flow = tflow.tflow(resp=True)  # no proxy server around it: the HTTP layer cannot be found
    flow.client_conn.alpn = alpn
    flow.response.headers["transfer-encoding"] = "chunked"
    out: list[bytes] = []
    with caplog.at_level("INFO", logger="streamtap"):
        _end_at_cut(flow, style, out)
    assert out == chunk  # HTTP/1.1: the empty chunk (the terminator) is the fallback
    assert says in caplog.text
