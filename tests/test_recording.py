"""The recording format: byte-exact rebuild, self-checks, crash honesty, one writer, no secrets."""

from __future__ import annotations

import gzip
import hashlib
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtap.recording import (
    HeaderCut,
    RecordingBusy,
    RecordingError,
    RecordingWriter,
    check_recording,
    final_name,
    note_unfinished,
    partial_name,
    read_recording,
    redact_headers,
    redact_url,
)
from streamtap.wire import (
    EventStreamMessage,
    Int8,
    Int16,
    Int32,
    Int64,
    InvalidJSON,
    JSONValue,
    Malformed,
    SSEEvent,
    Tail,
    Timestamp,
)

SECRETS = {
    "bearer": "sk-proj-SECRETbearer0123456789",
    "xapikey": "sk-ant-SECRETanthropic98765",
    "goog": "AIzaSECRETgoogle55555",
    "cookie": "session=SECRETcookie777",
    "amztoken": "IQoJb3JpZ2luSECRETsessiontoken",
    "sig": "f00dfacecafe0123SECRETsig4567890abcdef",
    "query": "SECRETquerykey42",
    "custom": "SECRETcustomheader31",
}


def sse_events(body: bytes) -> tuple[list[SSEEvent], Tail | None]:
    """Split a simple SSE body at blank lines (enough to feed the writer; the decoder has its own tests)."""
    events, start, seq = [], 0, 0
    while (end := body.find(b"\n\n", start)) >= 0:
        raw = body[start : end + 2]
        events.append(SSEEvent(seq, start, end + 2, raw, "message", raw.decode("utf-8", "replace"), "", None))
        seq, start = seq + 1, end + 2
    tail = Tail(seq, start, len(body), body[start:], "no blank line after the last event") if start < len(body) else None
    return events, tail


def secret_headers() -> list[tuple[str, str]]:
    return [
        ("Host", "api.example.test"),
        ("Authorization", f"Bearer {SECRETS['bearer']}"),
        ("x-api-key", SECRETS["xapikey"]),
        ("X-Goog-Api-Key", SECRETS["goog"]),
        ("Cookie", SECRETS["cookie"]),
        ("X-Amz-Security-Token", SECRETS["amztoken"]),
        ("X-Team-Secret", SECRETS["custom"]),
        ("Content-Type", "application/json"),
    ]


def write_sse(tmp_path, body: bytes, chunk: int = 7, **kwargs):
    writer = RecordingWriter.create(tmp_path, started=1_780_000_000.25, provider="openai-chat", flow_id="abc123def456789", **kwargs)
    writer.header(
        {
            "flow_id": "abc123def456789",
            "request": {
                "method": "POST",
                "url": f"https://api.example.test/v1/chat?key={SECRETS['query']}&X-Amz-Signature={SECRETS['sig']}&alt=sse",
                "headers": secret_headers(),
                "body": {"model": "m", "stream": True},
            },
            "response": {"status": 200, "headers": [("Content-Type", "text/event-stream"), ("Set-Cookie", SECRETS["cookie"])]},
            "dialect": "openai-chat",
            "wire": {"format": "sse", "content_encoding": None},
        }
    )
    events, tail = sse_events(body)
    for i in range(0, len(body), chunk):
        writer.read(body[i : i + chunk], t_ms=i / 10)
    for event in events:
        writer.frame(event, t_ms=event.start / 10)
    if tail:
        writer.frame(tail, t_ms=len(body) / 10)
    return writer


BODY = b'data: {"a":1}\n\n: keep-alive\ndata: {"b":"\xc3\xa9"}\n\ndata: [DONE]\n\n'


def test_roundtrip_rebuilds_the_body_and_renames_with_the_verdict(tmp_path):
    writer = write_sse(tmp_path, BODY, redact=["x-team-secret"])
    assert writer.path.name.endswith(".partial.jsonl")
    final = tmp_path / final_name(1_780_000_000.25, "openai-chat", "complete", "abc123def456789")
    path = writer.finish({"verdict": {"kind": "complete", "reason": "ok"}, "stream_end": "finished"}, final)
    assert path == final and final.exists() and not list(tmp_path.glob("*.partial.jsonl"))
    assert final.name.startswith("20260528T") and "_openai-chat_complete_" in final.name
    assert stat.S_IMODE(os.stat(final).st_mode) == 0o600

    rec = read_recording(final)
    assert rec.complete_file and rec.problem is None
    assert rec.body == BODY and rec.wire == BODY
    assert [f.seq for f in rec.frames] == [0, 1, 2]
    assert [f.offset for f in rec.frames] == [0, 15, len(BODY) - 14]
    assert rec.frames[1].raw == b': keep-alive\ndata: {"b":"\xc3\xa9"}\n\n'
    assert sum(length for _, length, _ in rec.reads) == len(BODY)
    assert rec.end["bytes"] == len(BODY) and rec.end["sha256"] == hashlib.sha256(BODY).hexdigest()
    assert rec.verdict["kind"] == "complete"
    assert check_recording(rec) == []


def test_no_secret_reaches_the_disk(tmp_path):
    writer = write_sse(tmp_path, BODY, redact=["X-Team-Secret"])
    writer.finish({"verdict": {"kind": "complete"}, "stream_end": "finished"})
    written = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for name, secret in SECRETS.items():
        assert secret.encode() not in written, f"{name} secret written to disk"
    rec = read_recording(next(tmp_path.iterdir()))
    headers = dict((k.lower(), v) for k, v in rec.header["request"]["headers"])
    assert headers["authorization"] == "Bearer [redacted]"  # the scheme stays visible
    assert headers["content-type"] == "application/json"
    assert "alt=sse" in rec.header["request"]["url"]


def test_binary_frames_roundtrip_as_base64(tmp_path):
    raw = bytes(range(256)) * 3
    writer = RecordingWriter(tmp_path / "r.jsonl")
    writer.header({"wire": {"format": "eventstream"}})
    writer.read(raw, 0.0)
    writer.frame(EventStreamMessage(0, 0, len(raw), raw, {":event-type": "chunk", "id": b"\x00\xff"}, b"\xff\x00"), 1.5)
    writer.finish({"verdict": None, "stream_end": "finished"})
    rec = read_recording(tmp_path / "r.jsonl")
    assert rec.body == raw
    assert rec.frames[0].event["headers"]["id"] == {"b64": "AP8="}
    assert check_recording(rec) == []


def test_a_cut_last_line_reads_as_incomplete_not_as_a_shorter_turn(tmp_path):
    writer = write_sse(tmp_path, BODY)
    writer.finish({"verdict": {"kind": "complete"}, "stream_end": "finished"})
    path = next(tmp_path.iterdir())
    data = path.read_bytes()
    lines = data.split(b"\n")
    good = len(b"\n".join(lines[:3])) + 1
    path.write_bytes(data[: good + 9])  # the fourth line is cut after 9 bytes
    rec = read_recording(path)
    assert not rec.complete_file and rec.end is None
    assert rec.problem.startswith(f"recording incomplete at byte {good}")
    assert check_recording(rec)[0] == rec.problem


def test_a_recording_without_an_end_line_is_incomplete(tmp_path):
    writer = write_sse(tmp_path, BODY)
    writer.flush()
    rec = read_recording(writer.path)  # read while the writer is still open: a live or killed proxy
    assert not rec.complete_file and "no end line" in rec.problem
    assert rec.body == BODY  # what was seen is still there
    writer.close()


def test_a_recording_whose_writer_died_gets_a_note_after_its_last_whole_line(tmp_path):
    writer = write_sse(tmp_path, BODY)
    writer.close()  # its lock goes, as a killed process's does
    data = writer.path.read_bytes()
    lines = data.split(b"\n")
    whole = len(b"\n".join(lines[:3])) + 1
    writer.path.write_bytes(data[: whole + 9])  # the writer died inside the fourth line
    assert note_unfinished(writer.path, "streamtap_error", "analysis: the worker died at byte 15", 12.5)
    rec = read_recording(writer.path)
    assert rec.body == BODY[: len(rec.body)] and rec.end is None and "no end line" in rec.problem
    assert rec.notes[-1] == {"type": "note", "kind": "streamtap_error", "message": "analysis: the worker died at byte 15", "t": 12.5}
    assert writer.path.read_bytes()[: whole] == data[: whole]  # every whole line is kept


def test_a_note_said_twice_is_written_once(tmp_path):
    """A worker that writes a note and dies before it tells the proxy leaves the note to the
    next worker, which must not repeat it; a different note after it is still written."""
    writer = write_sse(tmp_path, BODY)
    writer.close()
    assert note_unfinished(writer.path, "streamtap_error", "analysis: the worker died")
    once = writer.path.read_bytes()
    assert note_unfinished(writer.path, "streamtap_error", "analysis: the worker died")
    assert writer.path.read_bytes() == once
    assert note_unfinished(writer.path, "streamtap_error", "analysis: the next worker died")
    assert [note["message"] for note in read_recording(writer.path).notes] == [
        "analysis: the worker died", "analysis: the next worker died"]


def test_a_recording_whose_writer_died_between_its_end_line_and_its_rename_gets_no_note(tmp_path):
    """Its end line says all: a note after it would make the file unreadable."""
    writer = write_sse(tmp_path, BODY)
    partial = writer.path
    final = writer.finish({"verdict": {"kind": "complete"}, "stream_end": "finished"}, tmp_path / "final.jsonl")
    final.rename(partial)  # as the writer leaves it when killed before the rename
    data = partial.read_bytes()
    assert not note_unfinished(partial, "streamtap_error", "analysis: the worker died")
    assert partial.read_bytes() == data
    rec = read_recording(partial)
    assert rec.end is not None and rec.body == BODY


@pytest.mark.parametrize("kept", [0, 40])
def test_a_recording_cut_inside_its_header_gets_no_note(tmp_path, kept):
    """A worker killed before its header line was whole: a note would take the header's place.
    The file stays as it is, and still reads as one whose writer stopped at once."""
    writer = write_sse(tmp_path, BODY)
    writer.close()
    data = writer.path.read_bytes()
    writer.path.write_bytes(data[:kept])
    assert not note_unfinished(writer.path, "streamtap_error", "analysis: the worker died")
    assert writer.path.read_bytes() == data[:kept]
    with pytest.raises(HeaderCut):
        read_recording(writer.path)


def test_a_note_is_not_added_while_a_writer_holds_the_recording(tmp_path):
    writer = write_sse(tmp_path, BODY)
    writer.flush()
    before = writer.path.read_bytes()
    assert not note_unfinished(writer.path, "streamtap_error", "x")
    assert writer.path.read_bytes() == before
    writer.close()


def test_damage_in_the_middle_raises(tmp_path):
    writer = write_sse(tmp_path, BODY)
    path = writer.finish({"verdict": {"kind": "complete"}, "stream_end": "finished"})
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:-5]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(RecordingError, match="line 3"):
        read_recording(path)


def test_not_a_recording(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"type":"frame"}\n')
    with pytest.raises(RecordingError, match="not a streamtap recording"):
        read_recording(tmp_path / "x.jsonl")


def test_check_finds_tampered_bytes_sums_and_offsets(tmp_path):
    writer = write_sse(tmp_path, BODY)
    path = writer.finish({"verdict": {"kind": "complete"}, "stream_end": "finished"})
    text = path.read_text()
    tampered = text.replace('{\\"a\\":1}', '{\\"a\\":2}')
    assert tampered != text
    path.write_text(tampered)
    problems = check_recording(read_recording(path))
    assert any("sum" in p for p in problems) and any("sha256" in p for p in problems)

    rec = read_recording(path)
    rec.segments[1].offset += 1
    rec.segments[2].seq = 7
    problems = check_recording(rec)
    assert any("offset 16, expected 15" in p for p in problems)
    assert any("sequence number 7, expected 2" in p for p in problems)


def test_one_writer_per_recording(tmp_path):
    path = tmp_path / "r.jsonl"
    first = RecordingWriter(path)
    first.header({})
    first.flush()
    with pytest.raises(RecordingBusy):
        RecordingWriter(path)
    first.finish({"stream_end": "finished"})
    with pytest.raises(RecordingError, match="append-only"):
        RecordingWriter(path)


def test_fsync_policy_is_checked(tmp_path):
    with pytest.raises(RecordingError, match="always, end, never"):
        RecordingWriter(tmp_path / "r.jsonl", fsync="sometimes")
    for policy in ("always", "never"):
        writer = write_sse(tmp_path / policy, BODY, fsync=policy)
        assert read_recording(writer.finish({"stream_end": "finished"})).body == BODY


def test_encoded_bodies_keep_the_wire_bytes_too(tmp_path):
    wire = gzip.compress(BODY * 50)
    body = BODY * 50
    writer = RecordingWriter(tmp_path / "r.jsonl", encoded=True)
    writer.header({"wire": {"format": "sse", "content_encoding": "gzip"}})
    for i in range(0, len(wire), 5):
        writer.read(wire[i : i + 5], float(i))
    events, _ = sse_events(body)
    for event in events:
        writer.frame(event, 1.0)
    writer.finish({"stream_end": "finished"})
    rec = read_recording(tmp_path / "r.jsonl")
    assert rec.wire == wire and rec.body == body
    assert gzip.decompress(rec.wire) == rec.body
    assert check_recording(rec) == []


def test_out_of_order_bytes_are_refused(tmp_path):
    writer = RecordingWriter(tmp_path / "r.jsonl")
    writer.header({})
    with pytest.raises(RecordingError, match="do not follow"):
        writer.frame(SSEEvent(0, 5, 10, b"data:\n", "message", "", "", None), 0.0)


def test_names_sort_by_time():
    a = partial_name(1_780_000_000.001, "anthropic", "f" * 36)
    b = partial_name(1_780_000_000.01, "anthropic", "0" * 36)
    c = final_name(1_780_000_100.0, "bedrock/converse", "truncated", "abc")
    assert a < b < c
    assert "bedrock-converse_truncated_abc" in c


def test_redaction_rules():
    sigv4 = (
        "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20260101/us-east-1/bedrock/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=deadbeef"
    )
    out = dict(redact_headers([("Authorization", sigv4), ("X-Other", "v"), ("Api-Key", "k1")], extra=["x-other"]))
    assert out == {"Authorization": "AWS4-HMAC-SHA256 [redacted]", "X-Other": "[redacted]", "Api-Key": "[redacted]"}
    url = redact_url("https://u:pw@h.test/p?X-Amz-Credential=AKIA&X-Amz-Signature=abc&x=1&KEY=zz")
    assert "pw" not in url and "AKIA" not in url and "abc" not in url and "zz" not in url and "x=1" in url
    assert redact_url("http://h.test/v1/messages") == "http://h.test/v1/messages"


@settings(max_examples=40)
@given(body=st.binary(max_size=600), cuts=st.lists(st.integers(1, 60), max_size=30), read_size=st.integers(1, 97))
def test_any_body_split_any_way_rebuilds_exactly(tmp_path_factory, body, cuts, read_size):
    directory = tmp_path_factory.mktemp("any")
    writer = RecordingWriter(directory / "r.jsonl")
    writer.header({})
    offset, seq = 0, 0
    for size in cuts:
        if offset >= len(body):
            break
        raw = body[offset : offset + size]
        writer.frame(SSEEvent(seq, offset, offset + len(raw), raw, "message", "", "", None), None)
        offset, seq = offset + len(raw), seq + 1
    if offset < len(body):
        writer.frame(Tail(seq, offset, len(body), body[offset:], "cut"), None)
    for i in range(0, len(body), read_size):
        writer.read(body[i : i + read_size], None)
    writer.finish({"stream_end": "finished"})
    rec = read_recording(directory / "r.jsonl")
    assert rec.body == body
    assert check_recording(rec) == []


# -- the writer's hand-built frame lines against a straightforward reading of the format ---


def reference_line(event, t_ms, previous_id: str = "") -> bytes:
    """One frame or tail line written the plain way, straight from docs/recording-format.md:
    a dict per line, dumped by the standard library's json (not orjson, not the writer's code).
    ``previous_id``: the SSE event id in effect at the frame before."""
    import base64
    import json

    raw = event.raw
    line = {
        "type": "tail" if isinstance(event, Tail) else "frame",
        "seq": event.seq,
        "offset": event.start,
        "len": len(raw),
        "sum": hashlib.sha256(raw).hexdigest()[:16],
        "t": t_ms,
    }
    try:
        line["raw"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        line["raw_b64"] = base64.b64encode(raw).decode()
    if isinstance(event, Tail):
        line["reason"] = event.reason
    elif isinstance(event, SSEEvent):
        view = {"sse": event.event}
        if event.id != previous_id:
            view["id"] = event.id
        if event.retry is not None:
            view["retry"] = event.retry
        if event.invalid_utf8:
            view["invalid_utf8"] = event.invalid_utf8
        line["event"] = view
    elif isinstance(event, EventStreamMessage):
        headers = {}
        for name, value in event.headers.items():
            if isinstance(value, bytes):
                value = {"b64": base64.b64encode(value).decode()}
            elif not isinstance(value, (str, int, float, bool)):
                value = str(value)
            headers[name] = value
        view = {"headers": headers}
        try:
            view["payload"] = event.payload.decode("utf-8")
        except UnicodeDecodeError:
            view["payload_b64"] = base64.b64encode(event.payload).decode()
        line["event"] = view
    elif isinstance(event, JSONValue):
        line["event"] = {"json": True}
    else:  # Malformed
        line["event"] = {"malformed": event.error.message, "error": type(event.error).__name__, "fatal": event.fatal}
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


_TEXTS = st.text(st.characters(codec="utf-8"), max_size=30)
_RAWS = st.one_of(_TEXTS.map(str.encode), st.binary(min_size=1, max_size=40))


@st.composite
def wire_events(draw):
    """(kind, raw, details) for one event of any kind the writer takes."""
    kind = draw(st.sampled_from(["sse", "sse", "sse-plain", "eventstream", "json", "malformed"]))
    raw = draw(_RAWS)
    if kind == "sse-plain":
        return kind, raw, (draw(st.sampled_from(["message", "content_block_delta"])), "", None, 0)
    if kind == "sse":
        return kind, raw, (draw(_TEXTS), draw(_TEXTS), draw(st.none() | st.integers(0, 10**6)), draw(st.integers(0, 3)))
    if kind == "eventstream":
        values = st.one_of(
            _TEXTS, st.binary(max_size=8), st.booleans(), st.sampled_from([Int8(-3), Int16(7), Int32(-70000), Int64(2**40), Timestamp(1_700_000_000_123)]),
            st.uuids(),
        )
        headers = draw(st.dictionaries(_TEXTS, values, max_size=3))
        return kind, raw, (headers, draw(_RAWS))
    return kind, raw, draw(_TEXTS)


def build_events(drawn: list, cut_tail: bytes | None) -> list:
    events, offset = [], 0
    for seq, (kind, raw, details) in enumerate(drawn):
        start, end = offset, offset + len(raw)
        if kind.startswith("sse"):
            name, id_, retry, invalid = details
            events.append(SSEEvent(seq, start, end, raw, name, "", id_, retry, invalid))
        elif kind == "eventstream":
            events.append(EventStreamMessage(seq, start, end, raw, *details))
        elif kind == "json":
            events.append(JSONValue(seq, start, end, raw, None))
        else:
            events.append(Malformed(seq, start, end, raw, InvalidJSON(details, start), fatal=False))
        offset = end
    if cut_tail:
        events.append(Tail(len(events), offset, offset + len(cut_tail), cut_tail, "cut"))
    return events


@settings(max_examples=120)
@given(
    drawn=st.lists(wire_events(), max_size=25),
    cut_tail=st.none() | _RAWS,
    batches=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    times=st.lists(st.none() | st.floats(0, 1e9).map(lambda t: round(t, 3)), min_size=1, max_size=4),
    fsync=st.sampled_from(["end", "always"]),
)
def test_frame_lines_are_what_a_straightforward_writer_gives(tmp_path_factory, drawn, cut_tail, batches, times, fsync):
    """frames() builds its lines by hand for speed; they must be byte for byte what the
    format says, for every event kind, any batching, shared or distinct times."""
    events = build_events(drawn, cut_tail)
    directory = tmp_path_factory.mktemp("lines")
    writer = RecordingWriter(directory / "r.jsonl", fsync=fsync)
    writer.header({})
    expected, i, b = [], 0, 0
    ids = [""]  # the SSE id in effect before each event
    for event in events:
        ids.append(event.id if isinstance(event, SSEEvent) else ids[-1])
    while i < len(events):
        batch = events[i : i + batches[b % len(batches)]]
        # a batch shares one time object (as the proxy passes it) or not
        t_ms = [times[b % len(times)]] * len(batch) if b % 2 else [times[(b + j) % len(times)] for j in range(len(batch))]
        writer.frames(batch, t_ms)
        expected += [reference_line(event, t, ids[i + j]) for j, (event, t) in enumerate(zip(batch, t_ms))]
        i += len(batch)
        b += 1
    writer.finish({"stream_end": "finished"})
    lines = (directory / "r.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[1:-1] == expected
    rec = read_recording(directory / "r.jsonl")
    # (the drawn times go back and forth, which a recording's times never do: the check says so)
    assert [problem for problem in check_recording(rec) if "arrival time" not in problem] == []


def test_header_values_python_calls_equal_are_recorded_as_their_own_types(tmp_path):
    """True == 1 == Int32(1) in Python: a header set was taken for the one before it (and cached
    by equality), so x=Int32(1) after x=True was recorded as true."""
    sets = [{"x": True}, {"x": Int32(1)}, {"x": False}, {"x": Int8(0)}, {"x": Int32(1)}, {"x": True}]
    events, offset = [], 0
    for seq, headers in enumerate(sets):
        raw = b"frame %d" % seq
        events.append(EventStreamMessage(seq, offset, offset + len(raw), raw, headers, b"{}"))
        offset += len(raw)
    for batches in ([events], [[event] for event in events]):
        directory = tmp_path / str(len(batches))
        directory.mkdir()
        writer = RecordingWriter(directory / "r.jsonl")
        writer.header({})
        for batch in batches:
            writer.frames(batch, [0.0] * len(batch))
        writer.finish({"stream_end": "finished"})
        rec = read_recording(directory / "r.jsonl")
        assert [frame.event["headers"]["x"] for frame in rec.frames] == [True, 1, False, 0, 1, True]
        assert [type(frame.event["headers"]["x"]) for frame in rec.frames] == [bool, int, bool, int, int, bool]
