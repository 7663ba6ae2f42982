"""Which side reset an HTTP/2 stream when both sides of mitmproxy speak HTTP/2, through a real
`mitmdump -s addon/tap.py`. mitmproxy words a reset from either side "stream reset by client
(CODE)", and either side may use any code (an upstream's CANCEL, a client's NO_ERROR): the Tap
reads the side from the proxy's stream with the client, not from the code."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import h2.errors
import h2.settings
import pytest

import provider_streams as streams
from test_faults_h2 import H2Client
from upstream import CHAT, H2Upstream, Mitmdump, Script, find_recording, proxy_to

CANCEL = h2.errors.ErrorCodes.CANCEL


class _CancellingConnection:
    """An upstream's h2 connection that ends its streams with RST_STREAM(CANCEL): instead of
    END_STREAM after the whole body, and as a script's ``reset`` cut."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def end_stream(self, stream_id: int) -> None:
        self._conn.reset_stream(stream_id, CANCEL)

    def reset_stream(self, stream_id: int, error_code: int = 0) -> None:
        self._conn.reset_stream(stream_id, CANCEL)


class _GoingAwayWriter:
    """An upstream's writer that says GOAWAY(NO_ERROR) right after the first DATA frame, letting
    the stream under way finish (RFC 9113 6.8), and then goes on sending its body."""

    def __init__(self, writer, stream_id: int) -> None:
        self._writer, self._stream_id, self._writes = writer, stream_id, 0

    def write(self, data: bytes) -> None:
        from hyperframe.frame import GoAwayFrame

        self._writes += 1
        if self._writes == 3:  # after the headers and the first piece of the body
            goaway = GoAwayFrame(0)
            goaway.last_stream_id, goaway.error_code = self._stream_id, h2.errors.ErrorCodes.NO_ERROR
            data += goaway.serialize()  # (the next DATA comes a gap later: in the same read, h2 refuses it)
        if not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:  # mitmproxy closed the connection on the GOAWAY
            pass

    def close(self) -> None:
        self._writer.close()


class CancellingUpstream(H2Upstream):
    """H2Upstream whose scripts named ``cancel-...`` end in RST_STREAM(CANCEL), and whose scripts
    named ``goaway-...`` say a graceful GOAWAY in mid-body."""

    async def _respond_h2(self, conn, writer, stream_id, headers, body) -> None:
        if headers.get(":path", "").startswith("/s/cancel-"):
            conn = _CancellingConnection(conn)
        if headers.get(":path", "").startswith("/s/goaway-"):
            writer = _GoingAwayWriter(writer, stream_id)
        await super()._respond_h2(conn, writer, stream_id, headers, body)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with CancellingUpstream() as upstream, proxy_to(upstream, tmp_path_factory.mktemp("h2ends")) as mitm:
        yield mitm


@pytest.fixture
def client(proxy):
    c = H2Client(proxy.port, proxy.ca)
    yield c
    c.close()


def cancelled_by_upstream(proxy, client, name: str, path: str, script: Script):
    """The recording of a stream the upstream cancelled, checking the client got the reset."""
    proxy.upstream.add(name, script)
    stream = client.post(f"/s/{name}{path}")
    client.wait(stream, timeout=10)
    assert client.streams[stream].reset == CANCEL, client.streams[stream]  # an error for the client
    return find_recording(proxy.record_dir, name)


def test_an_upstream_cancel_after_an_anthropic_answer_s_last_data_is_a_truncated_upstream_reset(proxy, client):
    """The anthropic SDK reads the body to its end and raises on the reset: not complete, and
    not the client's doing."""
    body = streams.anthropic("", "all of it", {})
    rec = cancelled_by_upstream(proxy, client, "cancel-anthropic", "/v1/messages", Script(body))
    assert rec.body == body
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "truncated", rec.verdict


def test_an_upstream_cancel_after_done_keeps_a_chat_answer_complete(proxy, client):
    """The openai SDK stops reading at [DONE]: the answer is complete, the end still the upstream's."""
    body = streams.openai_chat(["all ", "of it"])
    rec = cancelled_by_upstream(proxy, client, "cancel-chat", CHAT, Script(body))
    assert rec.body == body
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "complete", rec.verdict


def test_an_upstream_cancel_mid_body_is_not_blamed_on_the_client(proxy, client):
    body = streams.openai_chat(["one ", "two ", "three ", "four"])
    cut = body.index(b'"three')
    rec = cancelled_by_upstream(proxy, client, "cancel-mid", CHAT, Script(body, cut_at=cut, cut_style="reset"))
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "truncated", rec.verdict


def test_a_client_that_resets_its_stream_with_no_error_mid_body_aborted_it(proxy, client):
    """As Node's req.close() does; the connection stays open."""
    name = "client-reset"
    body = streams.openai_chat([f"w{i} " for i in range(40)])
    proxy.upstream.add(name, Script(body, gap=0.05))
    stream = client.post(f"/s/{name}{CHAT}")
    deadline = time.monotonic() + 10
    while len(client.streams[stream].data) < 200 and time.monotonic() < deadline:
        client.wait(stream, timeout=0.05)
    assert len(client.streams[stream].data) >= 200, "the stream never got going"
    client.conn.reset_stream(stream, h2.errors.ErrorCodes.NO_ERROR)
    client._flush()
    rec = find_recording(proxy.record_dir, name)
    assert rec.end["stream_end"] == "client_aborted", rec.end
    assert rec.verdict["kind"] == "truncated", rec.verdict


def test_a_stream_mitmproxy_drops_at_an_upstream_s_graceful_goaway_is_the_proxy_s_end(proxy, client):
    """A GOAWAY with NO_ERROR lets the streams under way finish; mitmproxy closes the connection on
    any GOAWAY and drops them. The answer is cut, but the upstream would have sent it whole: it
    was blamed on the upstream (upstream_reset)."""
    name = "goaway-chat"
    body = streams.openai_chat([f"w{i} " for i in range(20)])
    proxy.upstream.add(name, Script(body, gap=0.05))
    stream = client.post(f"/s/{name}{CHAT}")
    client.wait(stream, timeout=10)
    assert len(client.streams[stream].data) < len(body)
    rec = find_recording(proxy.record_dir, name)
    assert rec.end["stream_end"] == "proxy_ended", rec.end
    assert "ConnectionTerminated" in rec.end.get("error", ""), rec.end
    assert rec.verdict["kind"] == "truncated", rec.verdict


@pytest.mark.parametrize("code, end", [("CANCEL", "client_aborted"), ("NO_ERROR", "upstream_reset")])
def test_without_the_proxy_internals_the_side_comes_from_the_code(code, end):
    """A flow on no live connection (as an addon's test or another mitmproxy sees it): the Tap
    cannot read the stream and keeps the guess from the code."""
    from mitmproxy.test import tflow

    from streamtap.mitm.tap import _client_reset, _client_stream, _closed
    from streamtap.recording.flows import ended_by

    flow = tflow.tflow(resp=True)
    flow.client_conn.alpn = flow.server_conn.alpn = b"h2"
    assert _client_reset(_client_stream(flow)) is None
    client_reset = lambda flow: _client_reset(_client_stream(flow))  # noqa: E731  (as the Tap's error hook passes it)
    assert ended_by(flow, f"stream reset by client ({code})", closed=_closed, client_reset=client_reset) == end


@pytest.fixture(scope="module")
def regular_proxy(tmp_path_factory):
    """mitmdump as an HTTP proxy: the client's HTTP/2 runs in a CONNECT tunnel."""
    with CancellingUpstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("h2ends-regular"), options={"ssl_insecure": "true"}, mode="regular") as mitm:
            mitm.upstream = upstream
            mitm.ca = str(mitm.confdir / "mitmproxy-ca-cert.pem")
            yield mitm
            assert "mitmproxy has crashed" not in mitm.log()


def test_an_upstream_cancel_through_a_connect_tunnel_is_the_upstream_s(regular_proxy):
    proxy = regular_proxy
    body = streams.anthropic("", "all of it", {})
    proxy.upstream.add("cancel-tunnel", Script(body))
    out = subprocess.run(["curl", "-sS", "-N", "--http2", "--max-time", "8", "--proxy", proxy.url, "--cacert", proxy.ca,
                          "--data", "{}", f"{proxy.upstream.url}/s/cancel-tunnel/v1/messages"], capture_output=True)
    assert out.returncode == 92 and b"CANCEL" in out.stderr, (out.returncode, out.stderr)  # a stream error
    rec = find_recording(proxy.record_dir, "cancel-tunnel")
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "truncated", rec.verdict


@pytest.fixture(scope="module")
def inline_proxy(tmp_path_factory):
    """As ``proxy``, with the analysis in the proxy's loop (``streamtap_workers=0``)."""
    with CancellingUpstream() as upstream, proxy_to(upstream, tmp_path_factory.mktemp("h2ends-inline"),
                                                    {"streamtap_workers": "0"}) as mitm:
        yield mitm


SLOW_WINDOW = 1024  # the client's stream window: mitmproxy holds the rest of the answer for it


def _slow_reader(proxy, name: str, body: bytes, *, slow: bool):
    """What an HTTP/2 client got of a chat answer the upstream sends whole, then cancels, and
    its recording. A ``slow`` client opens a 1 KiB stream window and reads nothing until the
    upstream has reset (the recording is finished at that reset); the other reads as it comes."""
    proxy.upstream.add(name, Script(body))
    client = H2Client(proxy.port, proxy.ca)
    try:
        if slow:
            client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: SLOW_WINDOW})
            client._flush()  # the proxy takes it before the request below: the stream opens with this window
        stream = client.post(f"/s/{name}{CHAT}")
        if slow:
            rec = find_recording(proxy.record_dir, name)
            client.wait(stream, timeout=10)
        else:
            client.wait(stream, timeout=10)
            rec = find_recording(proxy.record_dir, name)
        return client.streams[stream], rec
    finally:
        client.close()


@pytest.mark.parametrize("which", ["proxy", "inline_proxy"])
def test_a_chat_answer_whose_done_a_slow_client_never_got_is_not_complete(which, request):
    """mitmproxy drops the bytes it held for a slow HTTP/2 reader when the upstream resets the
    stream: the client never got [DONE], though the recording, made of what the upstream sent, has it."""
    proxy = request.getfixturevalue(which)
    body = streams.openai_chat([f"word{i} " for i in range(60)])
    assert len(body) > 4 * SLOW_WINDOW
    got, rec = _slow_reader(proxy, f"cancel-slow-{which}", body, slow=True)
    assert got.reset == CANCEL, got
    assert len(got.data) < len(body) and b"[DONE]" not in got.data, len(got.data)
    assert rec.body == body  # every byte the upstream sent
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "unknown", rec.verdict
    assert rec.verdict["evidence"]["undelivered_bytes"] == len(body) - len(got.data), rec.verdict
    assert "did not get the last" in rec.verdict["reason"], rec.verdict
    # verify judges the recording's bytes as the proxy did: the count is the proxy's account
    verified = subprocess.run([str(Path(sys.executable).with_name("streamtap")), "verify", str(rec.path)],
                              capture_output=True, text=True, timeout=30)
    assert ": unknown (openai-chat) the client did not get the last" in verified.stdout, verified.stdout
    assert "judging its bytes again" not in verified.stdout, verified.stdout


@pytest.mark.parametrize("which", ["proxy", "inline_proxy"])
def test_a_chat_answer_a_client_read_as_it_came_stays_complete_after_an_upstream_cancel(which, request):
    proxy = request.getfixturevalue(which)
    body = streams.openai_chat([f"word{i} " for i in range(60)])
    got, rec = _slow_reader(proxy, f"cancel-kept-up-{which}", body, slow=False)
    assert got.reset == CANCEL and bytes(got.data) == body, got
    assert rec.end["stream_end"] == "upstream_reset", rec.end
    assert rec.verdict["kind"] == "complete", rec.verdict
    assert "undelivered_bytes" not in rec.verdict["evidence"], rec.verdict
