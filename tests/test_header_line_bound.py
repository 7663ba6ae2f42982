"""A recording's header line stays within the format's line limit, whatever the request's size.

The header keeps the request body; a body over ``MAX_RECORDED_BODY`` (a 200 MiB prompt of base64
images to a self-hosted server, say) is kept as its length and SHA-256 instead, so ``verify``
never calls a recording the proxy wrote damaged. ``verify`` and ``report`` take the same longest
line (``MAX_LINE_BYTES``), so they never disagree on a file.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import re

import orjson
import pytest

from streamtap import cli
from streamtap.providers import Dialect, StreamSession
from streamtap.recording import MAX_LINE_BYTES, RecordingError, RecordingLines, RecordingWriter, check_recording, read_recording
from streamtap.recording.catalog import read_ends, recording_row
from streamtap.recording.header import BODY_GROWTH, MAX_RECORDED_BODY, request_body_fields
from streamtap.recording.reader import check_header

LIMIT = 1000  # a small bound, as the default one behaves at its size
ANSWER = (b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
          b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
          b"data: [DONE]\n\n")


def _json_of_size(size: int) -> bytes:
    return b'{"x":"' + b"a" * (size - 8) + b'"}'


def _omitted(raw: bytes, limit: int, encoding: str | None = None) -> dict:
    reason = f"the body is larger than the {limit} bytes a recording keeps of a request"
    if encoding:
        reason = (f"the body's {encoding} content-encoding could not be undone within the {limit} bytes a recording "
                  "keeps of a request (an unknown coding, damaged bytes, or more once decoded)")
    return {"body_omitted": {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "reason": reason}}


def test_a_body_over_the_bound_is_kept_as_its_length_and_hash():
    at, over = _json_of_size(LIMIT), _json_of_size(LIMIT + 1)
    assert request_body_fields((at, None), limit=LIMIT) == {"body": orjson.loads(at)}
    assert request_body_fields((over, None), limit=LIMIT) == _omitted(over, LIMIT)
    binary = bytes(range(256)) * 4  # not JSON: base64 up to the bound, its length and hash over it
    assert request_body_fields((binary[:LIMIT], None), limit=LIMIT) == {"body_b64": base64.b64encode(binary[:LIMIT]).decode()}
    assert request_body_fields((binary[: LIMIT + 1], None), limit=LIMIT) == _omitted(binary[: LIMIT + 1], LIMIT)
    # compressed: kept decoded up to the bound; past it, small or large, never as the compressed
    # bytes (whose secrets redaction cannot see)
    small = gzip.compress(_json_of_size(50 * LIMIT))
    assert len(small) < LIMIT
    assert request_body_fields((small, "gzip"), limit=LIMIT) == _omitted(small, LIMIT, "gzip")
    assert request_body_fields((gzip.compress(at), "gzip"), limit=LIMIT) == {"body": orjson.loads(at)}
    assert request_body_fields((gzip.compress(binary[:LIMIT]), "gzip"), limit=LIMIT) == {
        "body_b64": base64.b64encode(binary[:LIMIT]).decode(), "body_decoded_from": "gzip"}
    large = gzip.compress(bytes(range(256)) * 16, compresslevel=0)
    assert request_body_fields((large, "gzip"), limit=LIMIT) == _omitted(large, LIMIT, "gzip")


def test_the_default_bound_keeps_a_large_prompt_and_leaves_out_a_larger_one():
    """At the real sizes: a body of MAX_RECORDED_BODY bytes is kept, one byte more is not
    (before, any size was kept, and a 200 MiB prompt made a header verify refused)."""
    at = _json_of_size(MAX_RECORDED_BODY)
    assert request_body_fields((at, None)) == {"body": orjson.loads(at)}
    del at
    over = _json_of_size(MAX_RECORDED_BODY + 1)
    assert request_body_fields((over, None)) == _omitted(over, MAX_RECORDED_BODY)


def test_the_bound_leaves_the_header_within_the_line_limit():
    """A kept body grows by at most BODY_GROWTH in the line; with 1 MiB for the URL and headers
    (as MAX_LINE_BYTES allows the other fields of a frame line) the header still fits."""
    assert MAX_RECORDED_BODY * BODY_GROWTH + 2**20 < MAX_LINE_BYTES


@pytest.mark.parametrize("body", [
    b"a=&" * (LIMIT // 3),  # a form: every field redacted, in base64
    b"[" + b"1e15," * (LIMIT // 5 - 1) + b"1]",  # numbers JSON writes longer
    b"[" + b'{"a":""},' * (LIMIT // 9 - 1) + b"1]",  # JSON members redacted
    b'["https://h/?' + b"a=&" * (LIMIT // 3 - 6) + b'"]',  # a URL in JSON text, its query redacted
    b'{"messages":[{"content":"\\ud83d"}],"x":"' + b"a=&" * (LIMIT // 3 - 15) + b'"}',  # JSON the parser refuses
], ids=["form", "numbers", "members", "urls", "refused-json"])
def test_a_kept_body_grows_no_more_than_body_growth_in_the_written_line(tmp_path, body):
    assert len(body) <= LIMIT
    fields = request_body_fields((body, None), limit=LIMIT)
    assert "body_omitted" not in fields
    lengths = []
    for name, request_fields in (("without", {}), ("with", fields)):
        writer = RecordingWriter(tmp_path / f"{name}.partial.jsonl", redact=["a"])
        writer.header({"request": {"method": "POST", "url": "http://h/", "headers": [
            ["content-type", "application/x-www-form-urlencoded"]], **request_fields}})
        writer.close()
        lengths.append(len((tmp_path / f"{name}.partial.jsonl").read_bytes()))
    grown = lengths[1] - lengths[0]
    assert 2 * len(body) < grown <= len(body) * BODY_GROWTH + len(',"body_b64":""'), (grown, len(body))


def test_a_recording_whose_body_was_left_out_verifies_and_reports(tmp_path, capsys):
    prompt = _json_of_size(LIMIT + 1)
    writer = RecordingWriter.create(tmp_path, started=1_780_000_000.25, provider="openai-chat", flow_id="abc123def456")
    writer.header({
        "flow_id": "abc123def456",
        "request": {"method": "POST", "url": "https://api.example.test/v1/chat/completions", "headers": [],
                    **request_body_fields((prompt, None), limit=LIMIT)},
        "response": {"status": 200, "headers": [["content-type", "text/event-stream"]]},
        "dialect": "openai-chat", "why": "test", "sentinel": None,
        "wire": {"format": "sse", "content_encoding": None},
    })
    session = StreamSession(Dialect.OPENAI_CHAT)  # the frames and turn as the proxy writes them
    writer.read(ANSWER, t_ms=1.0)
    for event in session.feed(ANSWER, 0.001):
        writer.frame(event, t_ms=1.0)
    analysis = session.close()
    turn = analysis.turn.to_dict()
    turn.get("timing", {}).pop("arrivals", None)
    path = writer.finish({"verdict": analysis.verdict.to_dict(), "turn": turn, "stream_end": "finished"},
                         tmp_path / "20260528T200000.250Z_openai-chat_complete_abc123def456.jsonl")
    assert read_recording(path).header["request"]["body_omitted"]["bytes"] == len(prompt)
    assert check_recording(read_recording(path)) == []
    assert cli.main(["verify", str(path)]) == 0, capsys.readouterr().out.replace(str(tmp_path), "")
    assert recording_row(path)["problem"] is None


@pytest.mark.parametrize("omitted, says", [
    ({"bytes": -1, "sha256": "0" * 64}, "'bytes' is -1"),
    ({"sha256": "0" * 64}, "'bytes' is null"),
    ({"bytes": 5, "sha256": "x"}, "'sha256' is \"x\""),
    ({"bytes": 5, "sha256": "0" * 64, "reason": 1}, "'reason' is 1"),
    ("big", "'body_omitted' is \"big\""),
])
def test_a_malformed_body_omitted_is_damage(omitted, says):
    with pytest.raises(ValueError, match=says):
        check_header({"request": {"body_omitted": omitted}})


def test_verify_and_report_refuse_the_same_header_line_too_long(tmp_path):
    """A header line one byte past MAX_LINE_BYTES: both say so (before, report read header lines
    up to 256 MiB and called this one cut). The file is sparse: nothing is written to the disk."""
    path = tmp_path / "20260528T200000.250Z_openai-chat_abc123def456.partial.jsonl"
    with open(path, "wb") as file:
        file.write(b'{"type":"header","format":"streamtap-recording/1","request":{"body_b64":"')
        file.truncate(MAX_LINE_BYTES + 1)
    says = f"line 1 (byte 0) is longer than {MAX_LINE_BYTES} bytes, the longest line the format allows"
    with pytest.raises(RecordingError, match=re.escape(f"{path}: {says}")):
        RecordingLines(path).open()
    with pytest.raises(RecordingError, match="^" + re.escape(says.replace(" (byte 0)", ""))):
        read_ends(path)


def test_report_and_index_refuse_a_last_line_too_long_holding_one_block(tmp_path):
    """A last line past MAX_LINE_BYTES: report and index read it backwards, whole, into memory
    (1.3 GB for a 400 MiB line) and took it for a line that is no end line; verify refused it.
    The file is sparse: nothing is written to the disk."""
    import tracemalloc

    path = tmp_path / "20260528T200000.250Z_openai-chat_abc123def456.jsonl"
    first = orjson.dumps({"type": "header", "format": "streamtap-recording/1", "streamtap": "0", "flow_id": "f",
                          "started": 0.0, "request": {"method": "POST", "url": "http://x/v1/chat/completions", "headers": []},
                          "response": {"status": 200, "headers": []}, "dialect": "openai-chat",
                          "wire": {"format": "sse", "content_encoding": None}}) + b"\n"
    with open(path, "wb") as file:
        file.write(first + b'{"type":"note","message":"')
        file.truncate(len(first) + MAX_LINE_BYTES + 10)
        file.seek(0, 2)
        file.write(b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(RecordingError, match=f"is longer than {MAX_LINE_BYTES} bytes"):
            read_ends(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024, peak
