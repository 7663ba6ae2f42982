"""Another addon that sets ``flow.response.stream`` too (a callable that changes chunks, or
``False`` to buffer the body), loaded before or after streamtap: streamtap watches what the
client gets, and never judges a body it did not see."""

from __future__ import annotations

import contextlib

from mitmproxy import flow as mitmflow
from mitmproxy.test import taddons

import provider_streams as streams
from streamtap.mitm.tap import Tap
from streamtap.recording import read_recording
from test_addon_marks import streaming_flow


@contextlib.contextmanager
def tapped(tmp_path):
    """A Tap in mitmproxy's addon test harness, recording into ``tmp_path``, and a streamed flow."""
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        yield tap, streaming_flow()


def shout(data: bytes) -> bytes:
    return data.replace(b"hello", b"HELLO")


def pieces(data: bytes):
    return iter([data[: len(data) // 2], data[len(data) // 2 :]]) if data else []


def chunks_of(body: bytes) -> list[bytes]:
    return [body[i : i + 40] for i in range(0, len(body), 40)]


def sent(f, chunks: list[bytes]) -> bytes:
    """What mitmproxy hands the client: the stream callable's result for each read, then for b""."""
    out = b""
    for chunk in chunks + [b""]:
        got = f.response.stream(chunk)
        out += got if isinstance(got, bytes) else b"".join(got)
    return out


def test_a_callable_set_before_streamtap_still_changes_the_chunks_and_streamtap_records_what_the_client_got(tmp_path):
    body = streams.openai_chat(["hello ", "world"])
    for earlier in (shout, lambda data: pieces(shout(data))):
        with tapped(tmp_path) as (tap, f):
            f.response.stream = earlier
            tap.responseheaders(f)
            got = sent(f, chunks_of(body))
            tap.response(f)
        assert got == shout(body) and b"HELLO" in got
        summary = f.metadata["streamtap"]
        assert summary["verdict"] == "complete", summary
        assert read_recording(summary["recording"]).body == got


def test_a_callable_that_replaces_streamtaps_after_it_gives_unknown_not_a_cut(tmp_path):
    body = streams.openai_chat(["hello ", "world"])
    with tapped(tmp_path) as (tap, f):
        tap.responseheaders(f)
        f.response.stream = shout  # the later addon's responseheaders
        got = sent(f, chunks_of(body))
        tap.response(f)
    assert got == shout(body)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "unknown", summary
    assert "another addon replaced" in summary["reason"] + " ".join(summary["errors"])
    assert f.response.raw_content is None  # streamtap kept nothing, and shows nothing it did not see


def test_a_callable_that_wraps_streamtaps_after_it_is_judged_as_usual(tmp_path):
    body = streams.openai_chat(["hello ", "world"])
    with tapped(tmp_path) as (tap, f):
        tap.responseheaders(f)
        theirs = f.response.stream
        f.response.stream = lambda data: theirs(data)
        sent(f, chunks_of(body))
        tap.response(f)
    assert f.metadata["streamtap"]["verdict"] == "complete"


def test_a_body_buffered_by_a_later_addon_is_judged_whole(tmp_path):
    body = streams.openai_chat(["hello ", "world"])
    with tapped(tmp_path) as (tap, f):
        tap.responseheaders(f)
        f.response.stream = False  # the later addon's responseheaders: mitmproxy reads the body whole
        f.response.raw_content = body
        tap.response(f)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "complete", summary
    assert read_recording(summary["recording"]).body == body


def test_a_buffered_body_cut_before_it_was_whole_is_unknown(tmp_path):
    with tapped(tmp_path) as (tap, f):
        tap.responseheaders(f)
        f.response.stream = False
        f.error = mitmflow.Error("server closed connection")
        tap.error(f)
    assert f.metadata["streamtap"]["verdict"] == "unknown"


def test_a_wrapper_that_held_every_byte_back_until_a_cut_has_not_replaced_streamtaps(tmp_path):
    """A wrapper that holds streamtap's callable (streamtap's own live faults hold bytes back to
    cut at an event) and forwarded nothing before the upstream cut: a cut, not a blind spot."""
    with tapped(tmp_path) as (tap, f):
        tap.responseheaders(f)
        inner, held = f.response.stream, []

        def forward(pieces):
            return [inner(piece) for piece in pieces]

        def holding(data: bytes):
            held.append(data)  # waits for a whole event, which never comes
            return forward([]) if data else forward(held)

        f.response.stream = holding
        f.response.stream(b"data: {")
        f.error = mitmflow.Error("server closed connection")
        tap.error(f)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "truncated", summary


def buffering():
    """An earlier addon's callable that hands on nothing until the body's end, then all of it."""
    held = bytearray()

    def stream(data: bytes) -> bytes:
        if data:
            held.extend(data)
            return b""
        return bytes(held)

    return stream


def test_an_empty_piece_that_ends_a_chunked_body_ends_what_streamtap_takes(tmp_path):
    """mitmproxy writes an empty piece as HTTP/1's last chunk: the client's body ends there, and
    the answer handed on at the end never reaches it. Judged as seen: unknown, saying why."""
    body = streams.openai_chat(["hello ", "world"])
    with tapped(tmp_path) as (tap, f):
        f.response.headers["transfer-encoding"] = "chunked"
        f.response.stream = buffering()
        tap.responseheaders(f)
        sent(f, chunks_of(body))
        tap.response(f)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "unknown" and "ends an HTTP/1 chunked body" in summary["reason"], summary
    assert read_recording(summary["recording"]).body == b""


def test_an_empty_piece_in_a_body_of_known_length_sends_nothing_and_the_rest_is_judged(tmp_path):
    body = streams.openai_chat(["hello ", "world"])
    with tapped(tmp_path) as (tap, f):
        f.response.headers["content-length"] = str(len(body))
        f.response.stream = buffering()
        tap.responseheaders(f)
        assert sent(f, chunks_of(body)) == body
        tap.response(f)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "complete", summary
    assert read_recording(summary["recording"]).body == body


def test_a_body_buffered_by_a_later_addon_is_taken_as_the_client_got_it_not_through_an_earlier_callable(tmp_path):
    """With stream = False set after streamtap, mitmproxy calls no callable: an earlier addon's
    change never reached the client, so streamtap takes the body as it is, without running it."""
    body = streams.openai_chat(["hello ", "world"])
    calls = []

    def earlier(data: bytes) -> bytes:
        calls.append(data)
        return shout(data)

    with tapped(tmp_path) as (tap, f):
        f.response.stream = earlier
        tap.responseheaders(f)
        f.response.stream = False
        f.response.raw_content = body
        tap.response(f)
    summary = f.metadata["streamtap"]
    assert read_recording(summary["recording"]).body == body and calls == []
