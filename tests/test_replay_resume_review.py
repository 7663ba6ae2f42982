"""Resume and --once findings of a review, against a real server on 127.0.0.1 and real clients:
a Last-Event-ID in UTF-8 or with spaces around it, ids that later events inherit or repeat,
requests refused under --once, the connection header of refusals, and handlers left waiting
when the server closes."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket

import httpx
import pytest
from replay_streams import ANTHROPIC_REQUEST, BEDROCK_MODEL, BEDROCK_REQUEST, anthropic_frames, bedrock_invoke_frames, write_recording

from streamtap.replay.faults import Timing
from streamtap.replay.match import Library, MatchOptions
from streamtap.replay.server import ServeOptions, ServerThread
from streamtap.wire import SSEDecoder, SSEEvent

URL = "/v1/messages"


def events_of(body: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [e for e in decoder.feed(body) + decoder.close() if isinstance(e, SSEEvent)]


def numbered(ids: list[str | None], first: int = 0) -> list[bytes]:
    """One event per id, its data its position (from ``first``); None: an event with no `id:` line."""
    return [(b"" if i is None else f"id: {i}\n".encode()) + b'data: {"n":%d}\n\n' % n for n, i in enumerate(ids, first)]


def resume(tmp_path, ids: list[str | None], last_id: bytes | str) -> tuple[int, list[int]]:
    write_recording(tmp_path / "ids.jsonl", "anthropic", numbered(ids))
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": last_id})
    if answer.status_code != 200:
        return answer.status_code, []
    return 200, [json.loads(e.data)["n"] for e in events_of(answer.content)]


def test_a_utf8_last_event_id_resumes(tmp_path):
    """SSE ids are UTF-8, and EventSource sends Last-Event-ID so: it names the event."""
    assert resume(tmp_path, ["évt-0", "évt-1", "évt-2"], "évt-1".encode()) == (200, [2])


def test_an_id_recorded_with_spaces_around_it_resumes(tmp_path):
    """`id:  a ` sets the id " a ", but a header value arrives without the spaces around it (a
    client strips them, or refuses to send them as httpx does; the server's h11 strips them)."""
    assert resume(tmp_path, [" a ", "b", "c"], "a") == (200, [1, 2])


def test_ids_equal_but_for_spaces_resume_after_the_earliest(tmp_path):
    """` a` arrives as `a`, which a later event also carries: resuming after the earlier loses none."""
    assert resume(tmp_path, [" a", "b", "a", "c"], "a") == (200, [1, 2, 3])


def test_resuming_after_an_id_later_events_inherit_loses_no_event(tmp_path):
    """Events 1 and 2 carry id `a` (set by event 0): a client cut after event 0 sends `a`."""
    assert resume(tmp_path, ["a", None, None, "b"], "a") == (200, [1, 2, 3])


def test_resuming_after_a_repeated_id_resumes_after_its_first_event(tmp_path):
    """x, y, x, z: resuming with x may send events twice, but none is lost."""
    assert resume(tmp_path, ["x", "y", "x", "z"], "x") == (200, [1, 2, 3])


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"])
def test_an_id_set_by_a_block_that_dispatches_nothing_resumes_before_the_event_it_is_folded_into(tmp_path, line_end):
    """`id: b` + a blank line sets the id the client sends without an event: the decoder folds that
    block into the next event's frame, so the resume sends that frame again, event 1 with it."""
    frames = [b"id: a\ndata: {\"n\":0}\n\n", b"id: b\n\n", b'data: {"n":1}\n\n', b'data: {"n":2}\n\n']
    frames = [frame.replace(b"\n", line_end.encode()) for frame in frames]
    write_recording(tmp_path / "ids.jsonl", "anthropic", frames)
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": "b"})
        assert answer.status_code == 200, answer.text
        assert [json.loads(e.data)["n"] for e in events_of(answer.content)] == [1, 2]
        # the id of an event's own block still resumes after that event
        after = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": "a"})
        assert [json.loads(e.data)["n"] for e in events_of(after.content)] == [1, 2]


def test_an_id_only_block_that_the_next_event_overrides_still_resumes(tmp_path):
    """The client holds `b` from the id-only block, though the event after it carries `c`."""
    write_recording(tmp_path / "ids.jsonl", "anthropic",
                    [b'id: a\ndata: {"n":0}\n\n', b"id: b\n\nid: c\n", b'data: {"n":1}\n\n', b'data: {"n":2}\n\n'])
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": "b"})
    assert answer.status_code == 200, answer.text
    assert [json.loads(e.data)["n"] for e in events_of(answer.content)] == [1, 2]


def test_with_once_a_refused_request_leaves_the_recording_for_the_retry(tmp_path):
    write_recording(tmp_path / "a.jsonl", "anthropic", anthropic_frames())
    library = Library.load([tmp_path], MatchOptions(once=True))
    options = ServeOptions(assign_ids=True, fault_header=True)
    with ServerThread(library, options) as server, httpx.Client(timeout=10) as client:
        post = lambda headers: client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers=headers)  # noqa: E731
        bad_fault = post({"x-streamtap-fault": "cut:event=999"})
        unknown_id = post({"Last-Event-ID": "999"})
        retry = post({"x-streamtap-fault": "cut:event=3"})
        gone = post({})
    assert [bad_fault.status_code, unknown_id.status_code, retry.status_code, gone.status_code] == [400, 404, 200, 404]
    assert 0 < len(events_of(retry.content)) < len(anthropic_frames())  # cut, as the retry asked


def raw_head(base_url: str, headers: str) -> bytes:
    """The head of the answer to a POST that asks for the connection to be closed."""
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps(ANTHROPIC_REQUEST).encode()
    request = (f"POST {URL} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
               f"connection: close\r\n{headers}\r\n").encode() + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):  # ends: the server closes as it said it would
            data += chunk
    return data.split(b"\r\n\r\n", 1)[0].lower()


def test_a_refusal_says_connection_close_when_it_closes(tmp_path):
    write_recording(tmp_path / "a.jsonl", "anthropic", anthropic_frames())
    with ServerThread(Library.load([tmp_path]), ServeOptions(fault_header=True)) as server:
        unknown_id = raw_head(server.base_url, "last-event-id: nope\r\n")
        bad_fault = raw_head(server.base_url, "x-streamtap-fault: cut:event=999\r\n")
    assert unknown_id.startswith(b"http/1.1 404") and b"connection: close" in unknown_id
    assert bad_fault.startswith(b"http/1.1 400") and b"connection: close" in bad_fault


def test_resuming_a_stream_without_ids_says_its_format_has_none(tmp_path):
    write_recording(tmp_path / "b.jsonl", "bedrock", bedrock_invoke_frames())
    with ServerThread(Library.load([tmp_path]), ServeOptions()) as server, httpx.Client(timeout=10) as client:
        answer = client.post(server.base_url + f"/model/{BEDROCK_MODEL}/invoke-with-response-stream", json=BEDROCK_REQUEST,
                             headers={"Last-Event-ID": "1"})
    assert answer.status_code == 404, answer.text
    assert "carries no event ids" in answer.json()["error"]["message"]


def test_closing_ends_a_connection_still_waiting_in_original_timing(tmp_path, caplog):
    """A test that ends while its stream waits out a recorded gap: the handler ends with the
    server, rather than being left pending for a later garbage collection to log an ERROR."""
    write_recording(tmp_path / "a.jsonl", "anthropic", anthropic_frames(), gap_ms=30)
    caplog.set_level(logging.ERROR, logger="asyncio")
    thread = ServerThread(Library.load([tmp_path]), ServeOptions(Timing.parse("original")))
    with thread, httpx.Client(timeout=10) as client:
        with client.stream("POST", thread.base_url + URL, json=ANTHROPIC_REQUEST) as answer:
            next(answer.iter_raw())
            thread.stop()  # the stream is still under way
            left_pending = [t for t in asyncio.all_tasks(thread._loop) if not t.done()]
    gc.collect()
    assert left_pending == []
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def resume_with_fault(tmp_path, fault: str) -> tuple[int, list[int]]:
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    write_recording(folder / "ids.jsonl", "anthropic", numbered(["a", "b", "c", "d"]))
    with ServerThread(Library.load([folder]), ServeOptions(fault_header=True)) as server, httpx.Client(timeout=10) as client:
        answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers={"Last-Event-ID": "b", "x-streamtap-fault": fault})
    return answer.status_code, [json.loads(e.data)["n"] for e in events_of(answer.content) if e.data.startswith("{\"n\"")]


def test_a_resume_with_an_event_fault_counts_the_events_as_served(tmp_path):
    """After `b` the stream served is c, d: event 0 is c, whichever fault names it."""
    assert resume_with_fault(tmp_path, "drop:event=0") == (200, [3])
    assert resume_with_fault(tmp_path, "duplicate:event=0") == (200, [2, 2, 3])
    assert resume_with_fault(tmp_path, "cut:event=0") == (200, [2])


def test_a_resume_finds_its_id_in_the_stream_its_swap_tail_served(tmp_path):
    """swap-tail:with=b.jsonl,at=1 serves a0 a1 b2 a4 b4 b5: an id of the swapped-in tail was
    looked up in a.jsonl alone, so `b2` named no event (404), and `a4` resumed after a.jsonl's
    event 4, applied to the swapped stream, losing b.jsonl's event 4."""
    write_recording(tmp_path / "a.jsonl", "anthropic", numbered(["a0", "a1", "a2", "a3", "a4", "a5"]))
    write_recording(tmp_path / "b.jsonl", "anthropic", numbered(["b0", "b1", "b2", "a4", "b4", "b5"], first=10))
    swap = {"x-streamtap-fault": "swap-tail:with=b.jsonl,at=1"}
    with ServerThread(Library.load([tmp_path]), ServeOptions(fault_header=True)) as server, httpx.Client(timeout=10) as client:
        def served(headers: dict[str, str]) -> tuple[int, list[int]]:
            answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers=swap | headers)
            return answer.status_code, [json.loads(e.data)["n"] for e in events_of(answer.content)] if answer.status_code == 200 else []

        assert served({}) == (200, [0, 1, 12, 13, 14, 15])
        assert served({"Last-Event-ID": "b2"}) == (200, [13, 14, 15])
        assert served({"Last-Event-ID": "a4"}) == (200, [14, 15])
        assert served({"Last-Event-ID": "a2"})[0] == 404  # served by neither answer


def test_assigned_ids_run_through_a_swapped_in_tail(tmp_path):
    """With --assign-ids every served event carries an id, those a swap-tail brought in too (they
    had none), and a client cut inside the swapped-in part resumes from its own last id."""
    write_recording(tmp_path / "a.jsonl", "anthropic", numbered([None] * 6))
    write_recording(tmp_path / "b.jsonl", "anthropic", numbered([None] * 6, first=10))
    swap = {"x-streamtap-fault": "swap-tail:with=b.jsonl,at=1"}
    options = ServeOptions(fault_header=True, assign_ids=True)
    with ServerThread(Library.load([tmp_path]), options) as server, httpx.Client(timeout=10) as client:
        def served(headers: dict[str, str]) -> list[tuple[str, int]]:
            answer = client.post(server.base_url + URL, json=ANTHROPIC_REQUEST, headers=swap | headers)
            assert answer.status_code == 200, answer.text
            return [(e.id, json.loads(e.data)["n"]) for e in events_of(answer.content)]

        whole = served({})
        assert [n for _, n in whole] == [0, 1, 12, 13, 14, 15]
        assert [event_id for event_id, _ in whole] == ["0", "1", "2", "3", "4", "5"]
        assert served({"Last-Event-ID": "3"}) == whole[4:]
