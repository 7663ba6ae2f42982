"""`streamtap import` writes what the live Tap writes, and stays quick on a full folder.

- An HTTP/2 flow that errored is blamed on the side the Tap blames (one rule, in
  recording/flows.py): mitmproxy words every RST_STREAM "stream reset by client", whichever
  side sent it.
- The end line counts the wire events (`events`), as the Tap's does.
- The `--out` folder is listed once per import, not once per flow (that was n² time).
- A different flow with an id already recorded is recorded beside it, not dropped as
  "already imported"; the same flow twice is imported once.
- A wall clock set back while an answer streamed gives no negative `duration_ms` (which the
  reader calls damaged), but null and a note.
- A redirect and an answer with no body (HEAD, 204, 304) to a streaming call are not imported,
  whatever `--filter` says, as the Tap does not tap them: no turn, not a truncated one.

Captures are written with mitmproxy's own io and imported by the real CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from interception import openai_chat_stream

CHAT = openai_chat_stream(["fidelity ", "of ", "imports"])
CUT = CHAT[: len(CHAT) // 2 + 7]  # mid-event: frames, then a cut tail


def streamtap(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamtap.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def chat_flow(body: bytes = CHAT):
    from mitmproxy.test import tflow

    flow = tflow.tflow(resp=True)
    flow.request.host, flow.request.path = "api.openai.com", "/v1/chat/completions"
    flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = body
    return flow


def write_capture(path: Path, flows: list) -> Path:
    from mitmproxy import io

    with path.open("wb") as file:
        writer = io.FlowWriter(file)
        for flow in flows:
            writer.add(flow)
    return path


def end_line(path: Path) -> dict:
    return orjson.loads(path.read_bytes().splitlines()[-1])


def only_recording(out: Path) -> Path:
    [path] = out.glob("*.jsonl")
    return path


# -- 1. which side ended an HTTP/2 flow ------------------------------------------------------


def errored_flow(message: str, client_alpn: bytes, server_alpn: bytes, client_closed: bool = False):
    from mitmproxy.flow import Error

    flow = chat_flow(CUT)
    flow.error = Error(message, flow.response.timestamp_start + 1.25)  # 1.25 s after the response began
    flow.response.timestamp_end = None  # the body never ended
    flow.client_conn.alpn, flow.server_conn.alpn = client_alpn, server_alpn
    # mitmdump -w saves a flow at its error hook, before the proxy closes the connections
    flow.client_conn.timestamp_end = 946681204.0 if client_closed else None
    flow.server_conn.timestamp_end = None
    return flow


@pytest.mark.parametrize(
    "message, client_alpn, server_alpn, client_closed, expected",
    [
        # the upstream's RST_STREAM INTERNAL_ERROR, worded "by client" (the Tap: upstream_reset)
        ("stream reset by client (INTERNAL_ERROR)", b"h2", b"h2", False, "upstream_reset"),
        ("stream reset by client (INTERNAL_ERROR)", b"http/1.1", b"h2", False, "upstream_reset"),
        # a client that cancels its HTTP/2 stream
        ("stream reset by client (CANCEL)", b"h2", b"h2", False, "client_aborted"),
        ("stream reset by client (CANCEL)", b"h2", b"http/1.1", False, "client_aborted"),
        # no side named: the client's connection had closed when the flow was saved
        ("peer closed connection", b"h2", b"h2", True, "client_aborted"),
    ],
)
def test_an_errored_flow_is_blamed_on_the_side_the_tap_blames(tmp_path, message, client_alpn, server_alpn,
                                                              client_closed, expected):
    capture = write_capture(tmp_path / "capture.mitm", [errored_flow(message, client_alpn, server_alpn, client_closed)])
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0, result.stderr
    end = end_line(only_recording(out))
    assert end["error"] == message
    assert end["stream_end"] == expected
    assert end["verdict"]["kind"] == "truncated"
    assert end["duration_ms"] == 1250, end  # no response end: the flow lasted until its error came, as the Tap times it


@pytest.mark.parametrize("client_alpn, expected", [(b"h2", "unknown"), (b"http/1.1", "complete")])
def test_a_whole_answer_the_upstream_reset_is_unknown_where_mitmproxy_may_have_held_bytes_for_the_client(
        tmp_path, client_alpn, expected):
    """mitmproxy drops what it holds for a slow HTTP/2 client when the upstream resets the stream:
    the live tap counts those bytes, a capture cannot. A whole answer is unknown there, not complete."""
    flow = errored_flow("stream reset by client (INTERNAL_ERROR)", client_alpn, b"h2")
    flow.response.content = CHAT  # every byte, [DONE] too
    capture = write_capture(tmp_path / "capture.mitm", [flow])
    out = tmp_path / "out"
    assert streamtap("import", capture, "--out", out).returncode == 0
    end = end_line(only_recording(out))
    assert end["stream_end"] == "upstream_reset" and end["verdict"]["kind"] == expected, end["verdict"]
    if expected == "unknown":
        assert end["verdict"]["evidence"]["recording_read_as"] == "complete"
        assert "does not say whether the client got the last bytes" in end["verdict"]["reason"]


def test_the_tap_and_the_importer_ask_one_rule():
    import streamtap.mitm.replay as replay
    import streamtap.mitm.tap as tap
    from streamtap.recording import flows

    assert tap.ended_by is flows.ended_by
    assert tap.may_have_body is flows.may_have_body  # the flows neither judges
    assert replay.INJECTED_END is flows.INJECTED_END  # the live fault marks flows with the key ended_by reads


# -- 2. the end line counts the wire events ------------------------------------------------------


@pytest.mark.parametrize("body, tail", [(CHAT, 0), (CUT, 1)], ids=["complete", "cut"])
def test_the_end_line_counts_the_wire_events_as_the_tap_writes_them(tmp_path, body, tail):
    capture = write_capture(tmp_path / "capture.mitm", [chat_flow(body)])
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0, result.stderr
    path = only_recording(out)
    end = end_line(path)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert sum(line["type"] == "tail" for line in lines) == tail
    assert end["events"] == end["frames"] + tail
    assert f", {end['events']} events," in result.stdout  # what the import printed is what it wrote


# -- 3. the folder is listed once per import, not once per flow --------------------------------


def test_the_out_folder_is_listed_once_however_many_flows(tmp_path, monkeypatch):
    """Counted, not timed: every listing of the folder goes through os.scandir (Path.glob too)
    or os.listdir. A listing per flow made an import n² in the folder's size."""
    from streamtap.recording.importer import import_capture

    flows = 300
    capture = write_capture(tmp_path / "capture.mitm", [chat_flow(openai_chat_stream([f"answer {n}"])) for n in range(flows)])
    out = tmp_path / "out"
    listings = []
    scandir, listdir = os.scandir, os.listdir

    def counted_scandir(path="."):
        listings.append(Path(path))
        return scandir(path)

    def counted_listdir(path="."):
        listings.append(Path(path))
        return listdir(path)

    monkeypatch.setattr(os, "scandir", counted_scandir)
    monkeypatch.setattr(os, "listdir", counted_listdir)

    first = list(import_capture(capture, out))
    listed = listings.count(out)
    assert [item.skipped for item in first] == [None] * flows
    assert len(list(out.glob("*_complete_*.jsonl"))) == flows
    assert listed <= 1, f"{listed} listings of the folder for {flows} flows"

    listings.clear()
    again = list(import_capture(capture, out))  # every flow already there: as quick
    listed = listings.count(out)
    assert all(item.already for item in again) and len(again) == flows
    assert listed <= 1, f"{listed} listings of the folder for {flows} flows"


def test_a_recording_another_import_finished_after_the_listing_is_not_written_twice(tmp_path):
    """Two imports into one folder at once: this one listed the folder before the other wrote
    the flow (deterministic here: the listing is taken first, the other import runs after)."""
    from streamtap.recording.importer import ImportFolder, import_flow, read_flows

    capture = write_capture(tmp_path / "capture.mitm", [chat_flow()])
    out = tmp_path / "out"
    out.mkdir()
    listed_before = ImportFolder(out)
    other = streamtap("import", capture, "--out", out, "-q")
    assert other.returncode == 0, other.stderr
    [flow] = read_flows(capture)
    result = import_flow(flow, out, capture, folder=listed_before)
    assert result.already and result.path == only_recording(out)
    assert not list(out.glob("*.partial.jsonl"))


# -- 4. flows that share an id -------------------------------------------------------------------


def test_a_different_flow_with_the_id_of_a_compressed_recording_gets_the_next_name(tmp_path):
    """The live addon's recordings may be compressed (streamtap_compress=zstd): the name such a
    recording holds is taken all the same, or the flow beside it would get a twin name."""
    import zstandard

    first, second = chat_flow(CHAT), chat_flow(CUT)
    second.id = first.id
    out = tmp_path / "out"
    assert streamtap("import", write_capture(tmp_path / "a.mitm", [first]), "--out", out, "-q").returncode == 0
    plain = only_recording(out)
    compressed = plain.with_name(plain.name + ".zst")
    compressed.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(plain.read_bytes()))
    plain.unlink()
    result = streamtap("import", write_capture(tmp_path / "b.mitm", [second]), "--out", out)
    assert result.returncode == 0, result.stderr
    [beside] = out.glob("*_truncated_*.jsonl")
    assert beside.name.endswith(f"_{first.id.replace('-', '')[:12]}-2.jsonl"), sorted(p.name for p in out.iterdir())


def test_a_different_flow_with_a_recorded_id_is_recorded_beside_it(tmp_path):
    """As `cat a.mitm b.mitm`, or a flow replayed in mitmproxy and saved again (`-w +FILE`):
    mitmproxy keeps the id, the answer is another. Both answers are what the user captured."""
    first, second = chat_flow(CHAT), chat_flow(CUT)
    second.id = first.id
    capture = write_capture(tmp_path / "capture.mitm", [first, second])
    out = tmp_path / "out"

    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0, result.stderr
    assert "already imported" not in result.stdout
    complete, truncated = sorted(out.glob("*_complete_*.jsonl")), sorted(out.glob("*_truncated_*.jsonl"))
    assert len(complete) == len(truncated) == 1, sorted(p.name for p in out.iterdir())
    assert truncated[0].name.endswith(f"_{first.id.replace('-', '')[:12]}-2.jsonl")
    [said] = [line for line in result.stderr.splitlines() if "same id" in line]
    assert str(complete[0]) in said and str(truncated[0]) in said

    bodies = {path: b"".join(
        line.get("raw", "").encode() for line in map(orjson.loads, path.read_bytes().splitlines()) if line["type"] in ("frame", "tail")
    ) for path in (complete[0], truncated[0])}
    assert bodies == {complete[0]: CHAT, truncated[0]: CUT}

    again = streamtap("import", capture, "--out", out)  # both are there now
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already imported") == 2
    assert len(list(out.glob("*.jsonl"))) == 2


def test_the_same_flow_twice_is_imported_once(tmp_path):
    flow = chat_flow()
    capture = write_capture(tmp_path / "capture.mitm", [flow, flow])  # as `cat a.mitm a.mitm`
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("already imported") == 1
    assert "same id" not in result.stderr
    only_recording(out)


# -- 5. a wall clock set back --------------------------------------------------------------------


def test_a_clock_set_back_mid_stream_gives_no_duration_and_a_note_not_a_damaged_file(tmp_path):
    """mitmproxy stamps with time.time(): NTP stepping the clock back 1.5 s during a 1 s stream
    leaves the response ending 0.5 s before it started."""
    flow = chat_flow()
    flow.response.timestamp_end = flow.response.timestamp_start - 0.5
    capture = write_capture(tmp_path / "capture.mitm", [flow])
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out)
    assert result.returncode == 0, result.stderr
    path = only_recording(out)
    end = end_line(path)
    assert end["duration_ms"] is None
    assert any("wall clock" in note and "500 ms" in note for note in end["turn"]["notes"]), end["turn"]["notes"]

    verify = streamtap("verify", path)  # streamtap reads back what it wrote
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "damaged" not in verify.stdout + verify.stderr


def test_a_forward_duration_is_kept(tmp_path):
    flow = chat_flow()
    flow.response.timestamp_end = flow.response.timestamp_start + 1.25
    capture = write_capture(tmp_path / "capture.mitm", [flow])
    out = tmp_path / "out"
    assert streamtap("import", capture, "--out", out).returncode == 0
    end = end_line(only_recording(out))
    assert end["duration_ms"] == 1250.0
    assert not any("wall clock" in note for note in end["turn"]["notes"])


# -- 6. answers that are no turn -----------------------------------------------------------------


def bodiless(status: int, method: str = "POST"):
    """A streaming call's answer that is no turn: the Tap does not tap it, whatever its filter."""
    flow = chat_flow(b"")
    flow.request.method = method
    flow.response.status_code = status
    if 300 <= status < 400:
        del flow.response.headers["content-type"]
        flow.response.headers["location"] = "https://api.openai.com/v1/chat/completions/"
    return flow


@pytest.mark.parametrize("options", [[], ["--filter", "~d api.openai.com"]], ids=["llm streams", "--filter"])
def test_a_redirect_and_an_answer_with_no_body_are_not_imported(tmp_path, options):
    flows = [bodiless(307), bodiless(302), bodiless(204), bodiless(304), bodiless(200, "HEAD"), chat_flow()]
    capture = write_capture(tmp_path / "capture.mitm", flows)
    out = tmp_path / "out"
    result = streamtap("import", capture, "--out", out, *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "_complete_" in only_recording(out).name  # the streamed answer alone, none "truncated"
    assert "1 recorded, 0 already there, 0 skipped" in result.stderr  # passed over as a flow of no LLM stream is


def test_a_disk_that_fills_mid_import_stops_it_saying_after_how_many_flows(tmp_path, monkeypatch, capsys):
    """The folder or the disk failing is no usage error: the recordings before stay, and stderr
    says where and after how many flows, with exit 1, as for a recording that cannot be written."""
    import errno

    from streamtap import cli
    from streamtap.recording.writer import RecordingWriter

    capture = write_capture(tmp_path / "capture.mitm", [chat_flow() for _ in range(4)])
    finish, finished = RecordingWriter.finish, []

    def filling(self, *args, **kwargs):
        if len(finished) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        finished.append(finish(self, *args, **kwargs))
        return finished[-1]

    monkeypatch.setattr(RecordingWriter, "finish", filling)
    out = tmp_path / "out"
    assert cli.main(["import", str(capture), "--out", str(out)]) == cli.EXIT_FINDING
    err = capsys.readouterr().err
    assert f"stopped after 2 flows: {out}: No space left on device" in err, err
    assert sorted(out.glob("*.jsonl")) == sorted(finished)


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_an_event_over_the_decoders_limit_is_recorded_unframed_as_the_tap_records_it(tmp_path, encoding):
    """The decoder skips an event over its limit without keeping its bytes; the importer asked the
    writer to frame it anyway, which refused, and the flow was skipped ("event 0 does not hold its
    bytes"). Its bytes are now recorded unframed, and the recording is byte-exact."""
    import gzip

    from streamtap.providers import Dialect, analyze_bytes
    from streamtap.recording import check_recording, read_recording
    from streamtap.wire import DEFAULT_MAX_EVENT

    huge = b"data: " + b"x" * (DEFAULT_MAX_EVENT + 1000) + b"\n\n"
    body = huge + CHAT
    flow = chat_flow()
    if encoding:
        flow.response.headers["content-encoding"] = encoding
        flow.response.raw_content = gzip.compress(body, compresslevel=1)
    else:
        flow.response.content = body
    out = tmp_path / "out"
    result = streamtap("import", write_capture(tmp_path / "capture.mitm", [flow]), "--out", out)
    assert result.returncode == 0, result.stderr
    rec = read_recording(only_recording(out))
    assert rec.body == body and check_recording(rec) == []
    expected = analyze_bytes(body, Dialect.OPENAI_CHAT).verdict
    assert end_line(only_recording(out))["verdict"]["kind"] == expected.kind.value == "corrupt"
    assert "event longer than" in end_line(only_recording(out))["verdict"]["reason"]


def test_an_import_reads_the_answer_against_what_its_request_asked_for_as_the_tap_does(tmp_path):
    flow = chat_flow(CHAT)
    flow.request.content = b'{"model":"gpt-test-1","stream":true,"n":3,"messages":[]}'
    out = tmp_path / "out"
    result = streamtap("import", write_capture(tmp_path / "capture.mitm", [flow]), "--out", out, "-q")
    assert result.returncode == 0, result.stderr
    notes = end_line(only_recording(out))["turn"]["notes"]
    assert any("asked for 3 choices (n)" in note for note in notes), notes
