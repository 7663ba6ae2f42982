"""How a flow ends, told apart: cut mid-event, reset, client abort, HTTP errors; compressed bodies; HTTP/2."""

from __future__ import annotations

import gzip
import socket
import ssl

import anthropic
import httpx
import openai
import pytest

import provider_streams as streams
from streamtap.recording import check_recording
from upstream import CHAT, STREAM_REQUEST, H2Upstream, Mitmdump, Script, TeeTransport, Upstream, curl, find_recording, proxy_to


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("ends")) as mitm:
            mitm.upstream = upstream
            yield mitm


def find_line(proxy, text: str) -> str:
    log = proxy.wait_log(text)
    return next(line for line in log.splitlines() if text in line)


@pytest.mark.parametrize("style", ["fin", "reset"])
def test_upstream_cut_mid_event(proxy, style):
    body = streams.openai_chat(["one ", "two ", "three ", "four"])
    cut = body.index(b'"three') + 3  # inside a JSON string of the fourth event
    name = f"cut-{style}"
    proxy.upstream.add(name, Script(body, chunk_size=40, cut_at=cut, cut_style=style))
    out = curl(f"{proxy.url}/s/{name}{CHAT}")
    assert out.returncode == 18, (out.returncode, out.stderr)  # curl: transfer closed with outstanding data
    sent = proxy.upstream.last(name).wire
    assert out.stdout == sent == body[:cut]
    rec = find_recording(proxy.record_dir, name)
    assert rec.body == sent and check_recording(rec) == []
    assert rec.verdict["kind"] == "truncated"
    assert rec.end["stream_end"] == "upstream_reset"
    assert rec.tail is not None and rec.tail.raw == body[body.rindex(b"data:", 0, cut) : cut]
    assert "_truncated_" in rec.path.name
    line = find_line(proxy, "truncated")
    assert "[upstream_reset]" in line


def test_client_abort_is_not_the_providers_fault(proxy):
    body = streams.openai_chat(["x"] * 30)
    proxy.upstream.arm_pause()
    proxy.upstream.add("abort", Script(body, chunk_size=100, pause_after=300))
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(
            f"POST /s/abort{CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(STREAM_REQUEST)}\r\n\r\n{STREAM_REQUEST}".encode()
        )
        assert proxy.upstream.wait_paused()
        received = b""
        while b"data:" not in received:
            received += sock.recv(65536)
    # the client is gone while the provider is still streaming
    rec = None
    try:
        rec = find_recording(proxy.record_dir, "abort", timeout=5)
    finally:
        proxy.upstream.release()
    assert rec.end["stream_end"] == "client_aborted"
    assert rec.verdict["kind"] != "complete"
    assert rec.body == body[: len(rec.body)] and len(rec.body) >= 300
    assert "[client_aborted]" in find_line(proxy, "client_aborted")


def test_http_429_keeps_the_error_body(proxy):
    error = b'{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}'
    proxy.upstream.add("r429", Script(error, status=429, content_type="application/json", framing="length", headers=[("retry-after", "7")]))
    client = anthropic.Anthropic(base_url=f"{proxy.url}/s/r429", api_key="sk-ant-test", max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        with client.messages.stream(model="claude-test-4", max_tokens=10, messages=[{"role": "user", "content": "q"}]) as stream:
            stream.get_final_message()
    rec = find_recording(proxy.record_dir, "r429")
    assert rec.body == error
    assert rec.header["response"]["status"] == 429
    assert rec.verdict["kind"] == "errored"
    assert rec.end["stream_end"] == "finished"


def test_http_500_through_curl(proxy):
    error = b'{"error":{"message":"The server had an error processing your request.","type":"server_error","param":null,"code":null}}'
    proxy.upstream.add("r500", Script(error, status=500, content_type="application/json"))
    out = curl(f"{proxy.url}/s/r500{CHAT}")
    assert out.returncode == 0 and out.stdout == error
    rec = find_recording(proxy.record_dir, "r500")
    assert rec.body == error and rec.verdict["kind"] == "errored"
    assert "_errored_" in rec.path.name


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "gzip, br", "identity, zstd"])
def test_compressed_sse_is_forwarded_as_is_and_parsed_from_a_copy(proxy, encoding):
    """Codings may be stacked (RFC 9110 8.4): each is undone, the last applied first."""
    body = streams.openai_chat(["compressed ", "stream"] * 40)
    name = f"enc-{encoding.replace(', ', '-')}"
    proxy.upstream.add(name, Script(body, encoding=encoding, chunk_size=50, gap=0.0005))
    out = curl(f"{proxy.url}/s/{name}{CHAT}")  # no --compressed: curl hands over the encoded bytes
    assert out.returncode == 0, out.stderr
    sent = proxy.upstream.last(name).wire
    assert out.stdout == sent and sent != body
    rec = find_recording(proxy.record_dir, name)
    assert rec.wire == sent, "the recording does not keep the wire bytes"
    assert rec.body == body, "the recording does not hold the decoded body"
    assert rec.content_encoding == encoding
    assert rec.verdict["kind"] == "complete" and check_recording(rec) == []
    assert len(rec.reads) > 3


def test_gzip_with_the_openai_sdk(proxy):
    body = streams.openai_chat(["zipped ", "answer"])
    proxy.upstream.add("gz-sdk", Script(body, encoding="gzip", chunk_size=20))
    tee = TeeTransport()
    client = openai.OpenAI(base_url=f"{proxy.url}/s/gz-sdk/v1", api_key="sk-x", max_retries=0, http_client=httpx.Client(transport=tee))
    chunks = list(client.chat.completions.create(model="m", messages=[], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rec = find_recording(proxy.record_dir, "gz-sdk")
    assert text == "zipped answer" == "".join(b["text"] for b in rec.end["turn"]["choices"][0]["blocks"])
    # the SDK stops reading at [DONE], so it may leave the gzip trailer unread
    assert rec.wire.startswith(bytes(tee.bodies[-1])) and len(tee.bodies[-1]) > len(rec.wire) - 16
    assert rec.wire == proxy.upstream.last("gz-sdk").wire and gzip.decompress(rec.wire) == rec.body == body


# --- HTTP/2 on both sides ---------------------------------------------------------------


@pytest.fixture(scope="module")
def h2proxy(tmp_path_factory):
    with H2Upstream() as upstream, proxy_to(upstream, tmp_path_factory.mktemp("h2")) as mitm:
        yield mitm


def h2_post(h2proxy, name, stop_after: int | None = None):
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=h2proxy.ca)) as client:
        with client.stream("POST", f"https://localhost:{h2proxy.port}/s/{name}{CHAT}", content=STREAM_REQUEST) as response:
            got = bytearray()
            error = None
            try:
                for chunk in response.iter_raw():
                    got += chunk
                    if stop_after is not None and len(got) >= stop_after:
                        break  # leaving the block resets the stream (RST_STREAM CANCEL)
            except httpx.HTTPError as exc:
                error = exc
            return response.http_version, bytes(got), error


def test_http2_complete(h2proxy):
    body = streams.openai_chat(["over ", "h2"] * 10)
    h2proxy.upstream.add("h2ok", Script(body, chunk_size=64, gap=0.001))
    version, got, error = h2_post(h2proxy, "h2ok")
    assert version == "HTTP/2" and error is None
    rec = find_recording(h2proxy.record_dir, "h2ok")
    assert got == h2proxy.upstream.last("h2ok").wire == rec.body == body
    assert rec.header["response"]["http_version"] == "HTTP/2.0"
    assert rec.verdict["kind"] == "complete"


def test_http2_stream_reset_mid_event(h2proxy):
    body = streams.openai_chat(["over ", "h2"] * 10)
    cut = len(body) // 2 + 5
    h2proxy.upstream.add("h2rst", Script(body, chunk_size=64, cut_at=cut, cut_style="reset"))
    version, got, error = h2_post(h2proxy, "h2rst")
    assert version == "HTTP/2" and error is not None  # the client sees the abort
    rec = find_recording(h2proxy.record_dir, "h2rst")
    assert got == rec.body == body[:cut]
    assert rec.verdict["kind"] == "truncated" and rec.end["stream_end"] == "upstream_reset"


def test_http2_client_cancel_is_a_client_abort(h2proxy):
    body = streams.openai_chat(["slow "] * 40)
    h2proxy.upstream.add("h2cancel", Script(body, chunk_size=64, gap=0.01))
    version, got, _ = h2_post(h2proxy, "h2cancel", stop_after=200)
    assert version == "HTTP/2"
    rec = find_recording(h2proxy.record_dir, "h2cancel")
    assert rec.end["stream_end"] == "client_aborted", rec.end["error"]
    assert rec.body.startswith(got) and rec.body == body[: len(rec.body)] and len(rec.body) < len(body)


@pytest.mark.parametrize("encoding", ["gzip", "deflate (zlib)", "deflate (raw)"])
def test_a_compressed_copy_decodes_the_same_one_byte_read_at_a_time(encoding):
    """The Tap's content decoders see the body as the network cut it: one-byte reads included
    (the first of them must not decide alone whether "deflate" is zlib-wrapped)."""
    import zlib

    from streamtap.recording.content import WireUndo

    body = streams.openai_chat(["one ", "byte ", "at ", "a ", "time"])
    wire = {
        "gzip": gzip.compress(body),
        "deflate (zlib)": zlib.compress(body),
        "deflate (raw)": zlib.compress(body)[2:-4],
    }[encoding]
    undo = WireUndo(encoding.split()[0])
    decoded = b"".join(b"".join(undo.pieces(wire[i : i + 1])) for i in range(len(wire))) + b"".join(undo.finish_pieces())
    assert decoded == body
