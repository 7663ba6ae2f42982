"""SSEDecoder against the SSE decoders of the openai and anthropic SDKs, on every real
SSE body in ../shared/fixtures (``*.sse``, the anthropic SDK's ``.txt`` streams, and the
text/event-stream responses inside the VCR cassettes).

Where an SDK departs from the WHATWG rules the spec wins; each departure is named here
with its rule, shown on a constructed stream, and filtered out of the fixture comparison
explicitly (and only that departure).
"""

from __future__ import annotations

import anthropic._streaming as anthropic_streaming
import openai._streaming as openai_streaming
import pytest
import yaml
from hypothesis import given, settings

from conftest import FIXTURES, feed_cycled, shared_files
from streamtap.wire import SSEDecoder, SSEEvent
from test_wire_sse import chunkings, sse_streams

SDKS = {"openai": openai_streaming, "anthropic": anthropic_streaming}


def sse_bodies() -> list[tuple[str, bytes]]:
    bodies = [(str(p.relative_to(FIXTURES)), p.read_bytes()) for p in shared_files("**/*.sse")]
    bodies += [
        (str(p.relative_to(FIXTURES)), p.read_bytes()) for p in shared_files("anthropic-sdk-python/**/*.txt")
    ]
    for path in shared_files("**/*.yaml"):
        cassette = yaml.safe_load(path.read_text())
        for i, interaction in enumerate(cassette.get("interactions") or []):
            response = interaction["response"]
            body = (response.get("body") or {}).get("string")
            headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
            content_type = str(headers.get("content-type", ""))
            # !!binary bodies load as bytes: those are event-stream, not SSE
            if isinstance(body, str) and "text/event-stream" in content_type:
                bodies.append((f"{path.relative_to(FIXTURES)}#{i}", body.encode()))
    return bodies


BODIES = sse_bodies()


def ours(stream: bytes, chunk: int | None = None) -> list[tuple[str, str, str]]:
    decoder = SSEDecoder()
    events = []
    if chunk is None:
        events += decoder.feed(stream)
    else:
        for i in range(0, len(stream), chunk):
            events += decoder.feed(stream[i : i + chunk])
    events += decoder.close()
    return [(e.event, e.data, e.id) for e in events if isinstance(e, SSEEvent)]


def sdk_events(module, stream: bytes) -> list[tuple[tuple[str, str, str], bool]]:
    """The SDK's own decode of ``stream`` as (event, data, id), each with whether the
    event had a data line (tracked beside the SDK, which does not say)."""
    had_data: list[bool] = []

    class Tracking(module.SSEDecoder):
        seen_data = False

        def decode(self, line: str):
            if line.partition(":")[0] == "data":
                self.seen_data = True
            event = super().decode(line)
            if event is not None:
                had_data.append(self.seen_data)
            if not line:
                self.seen_data = False
            return event

    events = list(Tracking().iter_bytes(iter([stream])))
    return [((e.event or "message", e.data, e.id or ""), d) for e, d in zip(events, had_data, strict=True)]


def spec_conformant(events: list[tuple[tuple[str, str, str], bool]]) -> list[tuple[str, str, str]]:
    """Drop what the SDKs dispatch against WHATWG §9.2.6 "if the data buffer is an empty
    string, ... return" (DEPARTURE_DATALESS_DISPATCH below), and nothing else."""
    return [event for event, had_data in events if had_data]


@pytest.mark.skipif(not BODIES, reason=f"{FIXTURES} is absent: ../shared/ exists beside a development or CI clone only")
@pytest.mark.parametrize("sdk", sorted(SDKS))
@pytest.mark.parametrize("name,stream", BODIES, ids=[name for name, _ in BODIES])
def test_fixture_decodes_like_the_sdk(name: str, stream: bytes, sdk: str) -> None:
    expected = spec_conformant(sdk_events(SDKS[sdk], stream))
    got = ours(stream)
    assert got == expected
    assert got, "every fixture carries events"
    assert ours(stream, 1) == got and ours(stream, 7) == got


def test_fixture_set_is_complete_when_shared_is_present() -> None:
    if not FIXTURES.is_dir():
        pytest.skip(f"{FIXTURES} is absent: ../shared/ exists beside a development or CI clone only")
    names = [name for name, _ in BODIES]
    assert any(n.endswith(".sse") for n in names)
    assert any(n.endswith(".txt") for n in names)
    assert any(".yaml#" in n for n in names)
    assert any(b"\r\n" in stream for _, stream in BODIES)  # the Gemini CRLF framing is covered


# -- departures, each named with the rule it breaks -----------------------------------


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_departure_dataless_dispatch(sdk: str) -> None:
    """Rule (§9.2.6 dispatch, step 2): an event whose data buffer is empty is not
    dispatched. Both SDKs dispatch it (data "") when it set event, id or retry."""
    stream = b"event: ping\n\nretry: 10\n\ndata: a\n\n"
    assert [e for e, _ in sdk_events(SDKS[sdk], stream)] == [("ping", "", ""), ("message", "", ""), ("message", "a", "")]
    assert ours(stream) == [("message", "a", "")]
    assert spec_conformant(sdk_events(SDKS[sdk], stream)) == ours(stream)
    assert empty_dispatches(stream) == (["ping", "message"], 2)


@pytest.mark.parametrize("value", [b"+3000", b"-1", b"  3000", b"3_000", b"3000 ", "\u0663".encode()])
@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_a_retry_the_spec_ignores_but_the_sdks_take_is_still_their_dataless_dispatch(sdk: str, value: bytes) -> None:
    """The SDKs test a retry value with int(), which takes a sign, spaces, underscores and other
    digits: at the block's blank line they dispatch an empty event all the same, so it is noted."""
    stream = b"retry:" + value + b"\n\ndata: a\n\n"
    assert sdk_dataless(sdk, stream) == ["message"]
    for reads in (None, [1], [7, 1]):
        assert empty_dispatches(stream, reads) == (["message"], 1), reads
    assert ours(stream) == [("message", "a", "")]


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_departure_dispatch_after_comment_once_an_id_was_set(sdk: str) -> None:
    """Rule (§9.2.6 dispatch, step 2 with the last-event-ID buffer persisting): once an
    id was set, the SDKs dispatch an empty event at every blank line, keep-alive
    comments included, because they test the persisted id for "something to send"."""
    stream = b"id: 7\ndata: a\n\n: keep-alive\n\n"
    assert [e for e, _ in sdk_events(SDKS[sdk], stream)] == [("message", "a", "7"), ("message", "", "7")]
    assert ours(stream) == [("message", "a", "7")]
    assert empty_dispatches(stream) == (["message"], 1)


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_departure_bom_not_stripped(sdk: str) -> None:
    """Rule (§9.2.5, UTF-8 decode): one leading BOM is removed. The SDKs keep it, so the
    first field name becomes "\\ufeffdata" and the first event is lost."""
    stream = b"\xef\xbb\xbfdata: a\n\ndata: b\n\n"
    assert [e for e, _ in sdk_events(SDKS[sdk], stream)] == [("message", "b", "")]
    assert ours(stream) == [("message", "a", ""), ("message", "b", "")]


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_departure_invalid_utf8_raises(sdk: str) -> None:
    """Rule (§9.2.5, UTF-8 decode with replacement): invalid bytes become U+FFFD. The
    SDKs decode strictly and raise."""
    stream = b"data: \xff\n\n"
    with pytest.raises(UnicodeDecodeError):
        sdk_events(SDKS[sdk], stream)
    assert ours(stream) == [("message", "\ufffd", "")]


def test_departure_anthropic_retry_accepts_non_digits() -> None:
    """Rule (§9.2.6, retry): only a value of ASCII digits sets the reconnection time. The
    anthropic SDK uses int(), which also takes signs, underscores and other digits."""
    stream = b"retry: +1_0\ndata: a\n\n"
    (event,) = anthropic_streaming.SSEDecoder().iter_bytes(iter([stream]))
    assert event.retry == 10
    (ours_event,) = SSEDecoder().feed(stream)
    assert ours_event.retry is None


# -- what the decoder notes of the data-less dispatches ---------------------------------


def each_empty_dispatch(notes: list[tuple]) -> list[tuple[int, int, str | None]]:
    """The decoder's notes of empty dispatches, a run of blank lines each: (seq, offset, type) of every one."""
    return [(seq, first + k * step, name) for seq, first, name, count, step in notes for k in range(count)]


def empty_dispatches(stream: bytes, chunks: list[int] | None = None) -> tuple[list[str], int]:
    """The types of the empty events the decoder says the SDKs dispatch, and their count."""
    decoder = SSEDecoder()
    feed_cycled(decoder, stream, chunks)
    return [name or "message" for _, _, name in each_empty_dispatch(decoder.empty_dispatches)], decoder.empty_dispatch_count


def sdk_dataless(sdk: str, stream: bytes) -> list[str]:
    return [event for (event, _, _), had_data in sdk_events(SDKS[sdk], stream) if not had_data]


@settings(max_examples=150)
@given(stream=sse_streams(), chunks=chunkings())
@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_noted_empty_dispatches_are_the_sdks_dataless_events(sdk: str, stream: bytes, chunks: list[int]) -> None:
    """The decoder dispatches by the spec, and notes each blank line where the SDKs dispatch an
    event with empty data instead: the same ones, of the same type, for any chunking."""
    # away from two other departures: the SDKs raise on bytes that are not UTF-8, and misread
    # the first field after a BOM
    stream = stream.decode("utf-8", "replace").lstrip("\ufeff").encode()
    expected = sdk_dataless(sdk, stream)
    names, count = empty_dispatches(stream, chunks)
    assert count == len(expected)
    assert names == expected[: len(names)] and len(names) >= min(count, 16)  # the first 16 runs of them


@settings(max_examples=100)
@given(stream=sse_streams(), chunks=chunkings())
def test_a_decoder_told_to_keep_all_empty_dispatches_notes_every_one(stream: bytes, chunks: list[int]) -> None:
    """``keep_all_empty_dispatches``: every blank line the SDKs dispatch is noted, past the first
    few, in order, for any chunking (the session empties the list after each read)."""
    stream = stream.decode("utf-8", "replace").lstrip("\ufeff").encode()
    stream += b"\n\n" + b"event: ping\n\n" * 20 + b"event: error\n\n"
    decoder = SSEDecoder(keep_all_empty_dispatches=True)
    feed_cycled(decoder, stream, chunks)
    noted = each_empty_dispatch(decoder.empty_dispatches)
    assert [name or "message" for _, _, name in noted] == sdk_dataless("openai", stream)
    assert len(noted) == decoder.empty_dispatch_count > 20
    # the 20 pings at equal distance are one note
    assert [count for _, _, name, count, _ in decoder.empty_dispatches if name == "ping"][-1] >= 20


@pytest.mark.skipif(not BODIES, reason=f"{FIXTURES} is absent: ../shared/ exists beside a development or CI clone only")
def test_real_streams_have_no_empty_dispatches() -> None:
    """No provider sends a block the SDKs would dispatch without data: every captured body
    is free of them, by the SDKs' count and by the decoder's."""
    for name, stream in BODIES:
        assert empty_dispatches(stream) == ([], 0), name
        assert sdk_dataless("openai", stream) == [], name


@pytest.mark.parametrize("reads", [[9, 9], [5, 1, 3], [1]])
def test_a_retry_block_split_before_its_blank_line_is_noted_however_it_is_read(reads: list[int]) -> None:
    """The retry line read in one piece and its blank line (with another after it) in the next:
    the bulk path must not take that blank line for a second one."""
    stream = b"\nretry:5\n\n\ndata:\n\n"
    assert empty_dispatches(stream, reads) == empty_dispatches(stream) == (["message"], 1)
    assert sdk_dataless("openai", stream) == ["message"]  # the retry block (the data: line is an event with data "")
