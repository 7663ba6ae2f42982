"""An HTTP/2 client that cancels its stream (RST_STREAM CANCEL: a browser's stop button, undici,
curl --http2) in front of an HTTP/1.1 upstream (a local vLLM, Ollama or LiteLLM on http://) went
away itself: mitmproxy closes the upstream connection to cancel it, which must not be taken for
the provider's reset."""

from __future__ import annotations

import socket
import ssl
import time

import h2.config
import h2.connection
import h2.errors
import h2.events

import provider_streams as streams
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream, find_recording


def post_and_cancel(port: int, path: str, after: int) -> bytes:
    """A client offering only h2 (as mitmproxy then speaks it whatever the upstream): the request,
    ``after`` bytes of the answer, then RST_STREAM(CANCEL)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost") as sock:
        assert sock.selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "POST"), (":path", path), (":scheme", "https"), (":authority", "localhost"),
                              ("content-type", "application/json"), ("content-length", str(len(STREAM_REQUEST)))])
        conn.send_data(1, STREAM_REQUEST.encode(), end_stream=True)
        sock.sendall(conn.data_to_send())
        got = bytearray()
        while len(got) < after:
            for event in conn.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.DataReceived):
                    got += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            sock.sendall(conn.data_to_send())
        conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        sock.sendall(conn.data_to_send())
        time.sleep(0.5)  # the connection stays: only the stream was cancelled
    return bytes(got)


def test_an_h2_client_cancel_before_an_http1_upstream_is_a_client_abort(tmp_path):
    body = streams.openai_chat(["slow "] * 60)
    with Upstream() as upstream:
        upstream.add("cancel", Script(body, chunk_size=64, gap=0.02))
        with Mitmdump(upstream.url, tmp_path) as mitm:
            got = post_and_cancel(mitm.port, f"/s/cancel{CHAT}", 300)
            rec = find_recording(mitm.record_dir, "cancel")
    assert rec.header["response"]["http_version"] == "HTTP/1.1"
    assert rec.end["stream_end"] == "client_aborted", (rec.end["stream_end"], rec.end.get("error"))
    assert rec.body.startswith(got) and rec.body == body[: len(rec.body)] and len(rec.body) < len(body)
