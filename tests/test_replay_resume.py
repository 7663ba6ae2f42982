"""Last-Event-ID resume with a real SSE client (httpx-sse): the pieces of a resumed stream,
concatenated, are exactly the original event sequence."""

from __future__ import annotations

import httpx
import pytest
from httpx_sse import connect_sse
from replay_streams import ANTHROPIC_REQUEST, OPENAI_REQUEST, anthropic_frames, openai_chat_frames, write_recording

from streamtap.replay.faults import Timing, parse_faults
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread
from streamtap.wire import SSEDecoder, SSEEvent

URL = "/v1/messages"


def own_id_frames() -> list[bytes]:
    return [b"id: evt-%d\n" % i + raw for i, raw in enumerate(anthropic_frames())]


@pytest.fixture
def library(tmp_path):
    write_recording(tmp_path / "anthropic.jsonl", "anthropic", anthropic_frames())
    return Library.load([tmp_path])


def read(client: httpx.Client, base: str, last_id: str | None = None, stop_after: int | None = None):
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    events = []
    with connect_sse(client, "POST", base + URL, json=ANTHROPIC_REQUEST, headers=headers) as source:
        for sse in source.iter_sse():
            events.append(sse)
            if stop_after is not None and len(events) == stop_after:
                break
    return events


def as_tuples(events):
    return [(e.event, e.data) for e in events]


def original_sequence():
    out = []
    for raw in anthropic_frames():
        name = raw.split(b"\n")[0][len(b"event: ") :].decode()
        data = raw.split(b"\n")[1][len(b"data: ") :].decode()
        out.append((name, data))
    return out


def test_resuming_twice_gives_exactly_the_original_sequence(library):
    with ServerThread(library, ServeOptions(assign_ids=True)) as server, httpx.Client(timeout=10) as client:
        first = read(client, server.base_url, stop_after=9)
        second = read(client, server.base_url, last_id=first[-1].id, stop_after=13)
        third = read(client, server.base_url, last_id=second[-1].id)
    assert [e.id for e in first] == [str(i) for i in range(9)]
    assert as_tuples(first + second + third) == original_sequence()
    assert [s.resumed_after for s in server.served] == [None, "8", "21"]


def test_resume_with_the_streams_own_ids(tmp_path):
    write_recording(tmp_path / "ids.jsonl", "anthropic", own_id_frames())
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        first = read(client, server.base_url, stop_after=20)
        rest = read(client, server.base_url, last_id="evt-19")
        unknown = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": "evt-999"})
    assert first[-1].id == "evt-19" and rest[0].id == "evt-20"
    assert as_tuples(first + rest) == original_sequence()
    assert unknown.status_code == 404 and "evt-999" in unknown.json()["error"]["message"]


def test_a_client_cut_off_mid_stream_resumes_to_the_full_answer(library):
    """The field case: the connection is cut (cleanly) after event 12; the client reconnects
    with the last id it saw and gets the rest from the recording, not a second generation."""
    options = ServeOptions(Timing.parse("fast"), parse_faults("cut:event=12,style=clean"), assign_ids=True)
    with ServerThread(library, options) as server, httpx.Client(timeout=10) as client:
        cut = read(client, server.base_url)
        rest = read(client, server.base_url, last_id=cut[-1].id)
    assert len(cut) == 13
    assert as_tuples(cut + rest) == original_sequence()


def test_resume_after_an_abort(library):
    options = ServeOptions(Timing.parse("fast"), parse_faults("cut:at=tool-args,style=abort"), assign_ids=True)
    got = []
    with ServerThread(library, options) as server, httpx.Client(timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with connect_sse(client, "POST", server.base_url + URL, json=ANTHROPIC_REQUEST) as source:
                for sse in source.iter_sse():
                    got.append(sse)
        got += read(client, server.base_url, last_id=got[-1].id)
    assert as_tuples(got) == original_sequence()


def test_assigned_ids_go_after_the_streams_bom(tmp_path):
    """A decoder drops a BOM only as the stream's very first bytes: an id line before it would
    turn the first event's data line into an unknown field, and lose the event."""
    frames = anthropic_frames()
    frames[0] = b"\xef\xbb\xbf" + frames[0]
    write_recording(tmp_path / "bom.jsonl", "anthropic", frames)
    with ServerThread(Library.load([tmp_path]), ServeOptions(assign_ids=True)) as server, httpx.Client(timeout=10) as client:
        body = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST).content
    assert body.startswith(b"\xef\xbb\xbfid: 0\n")
    decoder = SSEDecoder()  # the WHATWG rules (httpx-sse keeps the BOM in the first field's name)
    events = [e for e in decoder.feed(body) + decoder.close() if isinstance(e, SSEEvent)]
    assert [(e.event, e.data) for e in events] == original_sequence()
    assert [e.id for e in events] == [str(i) for i in range(len(frames))]


def test_assigned_ids_go_in_the_block_that_dispatches_not_in_a_comment_before_it(tmp_path):
    """OpenRouter sends `: OPENROUTER PROCESSING` comment blocks, which the recorder folds into
    the next event's frame: an id put before them is set by a block that dispatches nothing, so
    a resume from it sent that event again ("The sky is is blue"). Resumed at every id, the
    client gets each event exactly once."""
    frames = openai_chat_frames(words=6, tool=False)
    original = [raw.removeprefix(b"data: ").rstrip(b"\n").decode() for raw in frames]
    comment = b": OPENROUTER PROCESSING\n\n"
    frames[0], frames[3] = comment * 2 + frames[0], comment + frames[3]
    write_recording(tmp_path / "openrouter.jsonl", "openai", frames)

    def events(client, base, last_id=None):
        headers = {"Last-Event-ID": last_id} if last_id is not None else {}
        with connect_sse(client, "POST", base + "/v1/chat/completions", json=OPENAI_REQUEST, headers=headers) as source:
            # once an id is set, httpx-sse yields a comment block as an event without data, which
            # a WHATWG client does not dispatch
            return [sse for sse in source.iter_sse() if sse.data]

    with ServerThread(Library.load([tmp_path]), ServeOptions(assign_ids=True)) as server, httpx.Client(timeout=10) as client:
        whole = events(client, server.base_url)
        resumed = [events(client, server.base_url, last_id=e.id) for e in whole]
    assert [e.data for e in whole] == original and [e.id for e in whole] == [str(i) for i in range(len(frames))]
    for k, rest in enumerate(resumed):
        assert [e.data for e in whole[: k + 1] + rest] == original, f"resumed after event {k}"


def test_with_once_a_resume_continues_the_recording_that_answered_and_uses_up_none(tmp_path):
    """Under --once each recording answers one request; a resume (Last-Event-ID) is not a new
    request: it continues the answer served last for that request, and counts for nothing."""
    first, second = anthropic_frames(20), anthropic_frames(30)
    assert first != second
    write_recording(tmp_path / "a.jsonl", "anthropic", first)
    write_recording(tmp_path / "b.jsonl", "anthropic", second)
    library = Library.load([tmp_path], MatchOptions(once=True))
    with ServerThread(library, ServeOptions(assign_ids=True)) as server, httpx.Client(timeout=10) as client:
        head = read(client, server.base_url, stop_after=5)
        rest = read(client, server.base_url, last_id=head[-1].id)
        again = read(client, server.base_url, last_id=rest[-1].id)  # after the last event: nothing more
        other = read(client, server.base_url)  # the next request: the other recording, whole
        gone = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST)
    served_first = [p.name for p in sorted(tmp_path.glob("*.jsonl"))][0]
    whole = {"a.jsonl": first, "b.jsonl": second}
    paths = [s.recording.rsplit("/", 1)[-1] if s.recording else None for s in server.served]
    assert paths[:3] == [served_first] * 3 and paths[3] != served_first and gone.status_code == 404, paths
    assert len(head) + len(rest) == len(whole[served_first]) and again == []
    assert [e.id for e in head + rest] == [str(i) for i in range(len(whole[served_first]))]
    assert len(other) == len(whole[paths[3]])


def test_an_empty_last_event_id_names_no_event_and_gets_the_whole_stream(library):
    with ServerThread(library, ServeOptions()) as server, httpx.Client(timeout=10) as client:
        events = read(client, server.base_url, last_id="")
    assert as_tuples(events) == original_sequence()


def test_an_id_set_inside_an_event_over_the_size_limit_resumes_after_that_event(tmp_path):
    """The Tap keeps an event over streamtap_max_event as raw lines, then a frame with no bytes:
    the resume skipped those lines, so an id set inside that event (which the client got) named
    no event, a 404."""
    from test_tap_batching import flow_for

    from streamtap.mitm.flowtap import FlowTap
    from streamtap.providers import StreamEnd

    frames = anthropic_frames()
    big = b"id: big\nevent: ping\ndata: {\"type\": \"ping\", \"pad\": \"" + b"x" * 20_000 + b"\"}\n\n"
    body = b"".join(frames[:5]) + big + b"".join(frames[5:])
    import json

    flow = flow_for("/v1/messages", "text/event-stream")
    flow.request.host, flow.request.content = "api.anthropic.com", json.dumps(ANTHROPIC_REQUEST).encode()  # (what read() asks)
    tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=4096, record=True)
    for at in range(0, len(body), 1000):
        tap.arrived(body[at : at + 1000], None)
    tap.finish(StreamEnd.FINISHED)
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        rest = read(client, server.base_url, last_id="big")
    assert as_tuples(rest) == original_sequence()[5:]
