"""Request bodies are decoded from their Content-Encoding within a bound, off the proxy's loop.

A few hundred KB of gzip can expand to hundreds of MB; mitmproxy never decodes a request body
itself, so neither may streamtap beyond what a prompt can be (``MAX_DECODED_BODY``). Past the
bound, or for an encoding it cannot decode, the recording keeps the body's length and hash, never
the compressed bytes, whose secrets redaction could not see.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import zlib

import brotli
import httpx
import orjson
import pytest
from provider_streams import openai_chat
from upstream import CHAT, Mitmdump, Script, Upstream, find_recording

from streamtap.recording.content import decoded_body

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd

PROMPT = orjson.dumps({"model": "gpt-test-1", "stream": True, "messages": [{"role": "user", "content": "hi " * 30000}]})
ENCODED = {
    "gzip": gzip.compress(PROMPT),
    "deflate": zlib.compress(PROMPT),  # zlib-wrapped, as the spec says
    "br": brotli.compress(PROMPT),
    "zstd": zstd.compress(PROMPT),
}


@pytest.mark.parametrize("encoding", sorted(ENCODED))
def test_a_body_decodes_whole_within_the_bound_and_not_beyond(encoding):
    raw = ENCODED[encoding]
    assert decoded_body(raw, encoding) == PROMPT
    assert decoded_body(raw, encoding.upper()) == PROMPT
    assert decoded_body(raw, encoding, limit=len(PROMPT)) == PROMPT
    assert decoded_body(raw, encoding, limit=len(PROMPT) - 1) is None
    assert decoded_body(raw[: len(raw) // 2], encoding) is None  # cut short


def test_the_odd_shapes_of_real_bodies_decode():
    assert decoded_body(zlib.compress(PROMPT)[2:-4], "deflate") == PROMPT  # raw deflate, as servers send it
    assert decoded_body(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip") == b"abcd"  # gzip members
    assert decoded_body(zstd.compress(b"ab") + zstd.compress(b"cd"), "zstd") == b"abcd"  # zstd frames
    assert decoded_body(PROMPT, None) == decoded_body(PROMPT, "identity") == PROMPT
    assert decoded_body(PROMPT, "compress") is None and decoded_body(ENCODED["gzip"], "gzip, br") is None


def test_stacked_codings_are_undone_last_first_each_within_the_bound():
    """``gzip, br`` (gzip applied first) came back None, and the recording kept the compressed bytes."""
    stacked = brotli.compress(ENCODED["gzip"])
    assert decoded_body(stacked, "gzip, br") == decoded_body(stacked, "GZIP,br") == PROMPT
    assert decoded_body(ENCODED["gzip"], "identity, gzip") == PROMPT
    assert decoded_body(stacked, "gzip, br", limit=len(PROMPT) - 1) is None
    assert decoded_body(stacked, "br, gzip") is None and decoded_body(stacked, "gzip, x-custom, br") is None
    bomb = gzip.compress(b"\0" * (80 << 20), compresslevel=1)
    assert decoded_body(brotli.compress(bomb), "gzip, br") is None
    assert decoded_body(gzip.compress(PROMPT), ", ".join(["identity"] * 9 + ["gzip"])) == PROMPT  # (identity is no coding)


def test_a_stacked_body_within_the_bound_decodes_though_a_layer_under_it_is_larger():
    """The bound held every layer: the gzip of a body that does not compress is a little larger than
    the body, so one within the bound, sent ``gzip, br``, was omitted as if over it."""
    body = random.Random(0).randbytes(4096)  # (bytes gzip cannot shrink)
    layer = gzip.compress(body)
    assert len(layer) > len(body)
    stacked = brotli.compress(layer)
    assert decoded_body(stacked, "gzip, br", limit=len(body)) == body
    assert decoded_body(stacked, "gzip, br", limit=len(body) - 1) is None  # the body itself is still held to it


def test_a_compression_bomb_stops_at_the_bound():
    bomb = gzip.compress(b"\0" * (80 << 20), compresslevel=1)
    assert len(bomb) < 1 << 20
    assert decoded_body(bomb, "gzip") is None
    assert decoded_body(brotli.compress(b"\0" * (80 << 20), quality=1), "br") is None
    assert decoded_body(zstd.compress(b"\0" * (80 << 20)), "zstd") is None


def test_through_mitmdump_a_bomb_request_is_recorded_as_its_length_and_hash_and_a_prompt_decoded(tmp_path):
    bomb = gzip.compress(b'{"model": "x", "messages": "' + b"a" * (80 << 20) + b'"}', compresslevel=1)
    answer = openai_chat(["Hi"])
    with Upstream() as upstream:
        upstream.add("bomb", Script(answer))
        upstream.add("prompt", Script(answer))
        with Mitmdump(upstream.url, tmp_path / "work") as mitm:
            for name, body in (("bomb", bomb), ("prompt", ENCODED["br"])):
                encoding = "gzip" if name == "bomb" else "br"
                got = httpx.post(f"{mitm.url}/s/{name}{CHAT}", content=body, timeout=30,
                                 headers={"content-type": "application/json", "content-encoding": encoding})
                assert got.content == answer
                assert upstream.last(name).body == body  # the request went on as sent
            bombed = find_recording(mitm.record_dir, "bomb")
            prompted = find_recording(mitm.record_dir, "prompt")
    request = bombed.header["request"]
    assert "body" not in request and "body_b64" not in request
    assert request["body_omitted"]["bytes"] == len(bomb) and request["body_omitted"]["sha256"] == hashlib.sha256(bomb).hexdigest()
    assert bombed.verdict["kind"] == "complete"
    assert prompted.header["request"]["body"] == orjson.loads(PROMPT)


@pytest.mark.parametrize(("encoding", "body"), [
    ("gzip", b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud83d"}], "api_key": "sk-1"}'),
    ("gzip, br", b'{"model": "gpt-4o", "messages": [], "api_key": "sk-1"}'),
], ids=["gzip-refused-json", "stacked"])
def test_a_compressed_request_finds_the_recording_its_decoded_body_was_kept_in(tmp_path, encoding, body):
    """Replay inside mitmproxy matches a request by its body decoded (``decoded_body``), as the
    recording now keeps it; the recorded key is redacted, the live one matches it all the same."""
    from replay_streams import openai_chat_frames, write_recording

    from streamtap.recording.header import request_body_fields
    from streamtap.recording.redact import Redactor
    from streamtap.replay.match import Library

    sent = brotli.compress(gzip.compress(body)) if encoding == "gzip, br" else gzip.compress(body)
    path = write_recording(tmp_path / "r.jsonl", "openai", openai_chat_frames())
    header, rest = path.read_bytes().split(b"\n", 1)
    record = orjson.loads(header)
    headers = [["content-type", "application/json"], ["content-encoding", encoding]]
    request = {name: value for name, value in record["request"].items() if name != "body"}
    record["request"] = Redactor().request_part({**request, "headers": headers, **request_body_fields((sent, encoding))})
    path.write_bytes(orjson.dumps(record) + b"\n" + rest)
    assert b"sk-1" not in path.read_bytes()
    live = decoded_body(sent, encoding)  # as mitm/replay.py decodes a live request's body
    assert Library.load([path]).find("POST", "/v1/chat/completions", dict(headers), live) is not None


EVENTS = [b'data: {"n":%d}\n\n' % n for n in range(4)]
PER_EVENT = {  # a server that compresses and flushes each event as its own member or frame
    "gzip": [gzip.compress(event) for event in EVENTS],
    "zstd": [zstd.compress(event) for event in EVENTS],
}


@pytest.mark.parametrize("encoding", sorted(PER_EVENT))
@pytest.mark.parametrize("reads", ["one per frame", "one read", "1-byte reads"])
def test_a_response_decoder_takes_frames_that_end_at_a_read_boundary(encoding, reads):
    from streamtap.recording.content import WireUndo

    frames = PER_EVENT[encoding]
    wire = b"".join(frames)
    chunks = {"one per frame": frames, "one read": [wire], "1-byte reads": [wire[i : i + 1] for i in range(len(wire))]}[reads]
    undo = WireUndo(encoding)
    body = b"".join(b"".join(undo.pieces(chunk)) for chunk in chunks) + b"".join(undo.finish_pieces())
    assert undo.failure is None and undo.unfinished() is None
    assert body == b"".join(EVENTS)  # every gzip member decoded, and recorded
    if encoding == "gzip":  # though httpx-based clients decode only the first: the verdict says so
        assert undo.later_stream()[0].endswith(f"a second one begins at wire byte {len(frames[0])}")
    else:
        assert undo.later_stream() is None  # (zstd frames: every client decodes them all)


@pytest.mark.parametrize(
    ("encoding", "accept", "refused"),
    [
        ("gzip", None, None),  # no Accept-Encoding: any coding is acceptable
        ("gzip", "identity", "gzip"),  # botocore's
        ("gzip", "", "gzip"),  # an empty value accepts no coding
        ("gzip", "gzip, deflate", None),  # httpx's
        ("GZIP", "Gzip;q=0.5", None),
        ("x-gzip", "gzip", None),
        ("gzip", "*", None),
        ("gzip", "gzip;q=0, *", "gzip"),
        ("gzip", "*;q=0.0", "gzip"),
        ("gzip", "gzip;q=oops", None),  # only a clear refusal is reported
        ("gzip, br", "gzip", "br"),
        ("identity", "identity", None),
    ],
)
def test_a_coding_the_request_did_not_accept_is_named(encoding, accept, refused):
    from streamtap.recording.content import unaccepted_coding

    said = unaccepted_coding(encoding, accept)
    if refused is None:
        assert said is None
    else:
        assert said is not None and said.endswith(f"does not accept {refused}")


def _reads(wire: bytes, size: int | None) -> list[bytes]:
    return [wire] if size is None else [wire[i : i + size] for i in range(0, len(wire), size)]


def _undone(encoding: str, wire: bytes, size: int | None):
    """A WireUndo fed ``wire`` in reads of ``size`` bytes (one read for None), and what it decoded."""
    from streamtap.recording.content import WireUndo

    undo = WireUndo(encoding)
    body = b"".join(piece for read in _reads(wire, size) for piece in undo.pieces(read)) + b"".join(undo.finish_pieces())
    return undo, body


ANSWER = openai_chat([f"word {i} " for i in range(40)])
HALF = ANSWER.index(b"\n\n", len(ANSWER) // 2) + 2
MEMBERS = {  # encoding: (wire of two gzip members or deflate streams, where the second begins)
    "gzip": (gzip.compress(ANSWER[:HALF], mtime=0) + gzip.compress(ANSWER[HALF:], mtime=0), len(gzip.compress(ANSWER[:HALF], mtime=0))),
    "deflate": (zlib.compress(ANSWER[:HALF]) + zlib.compress(ANSWER[HALF:]), len(zlib.compress(ANSWER[:HALF]))),
}


@pytest.mark.parametrize("size", [1, 2, 5, None])
@pytest.mark.parametrize("encoding", sorted(MEMBERS))
def test_a_second_gzip_member_is_decoded_and_named_at_its_wire_byte_whatever_the_reads(encoding, size):
    """httpx decodes only the first gzip member (and zlib stream): streamtap decodes all, and says
    where the second one begins, identically for any reads."""
    wire, second = MEMBERS[encoding]
    undo, body = _undone(encoding, wire, size)
    assert body == ANSWER and undo.failure is None and undo.unfinished() is None
    note, why = undo.later_stream()
    assert note.endswith(f"a second one begins at wire byte {second}")
    assert ("httpx-based clients (the openai and anthropic SDKs) decode only the first gzip member" in why) == (encoding == "gzip")
    stacked, body = _undone("gzip, br", brotli.compress(MEMBERS["gzip"][0]), size)  # (the gzip layer under br)
    assert body == ANSWER and stacked.later_stream()[0].endswith(f"begins at byte {MEMBERS['gzip'][1]} of the br-decoded bytes")


def test_an_empty_second_member_is_no_answer_a_client_misses():
    undo, body = _undone("gzip", gzip.compress(ANSWER) + gzip.compress(b""), 3)
    assert body == ANSWER and undo.later_stream() is None and undo.ignored_tail() is None


TAILS = {  # name: (encoding, a whole stream, bytes after it that start no other one)
    "gzip zeros": ("gzip", gzip.compress(ANSWER), b"\0\0\0\0"),
    "gzip newline": ("gzip", gzip.compress(ANSWER), b"\n"),
    "gzip lone magic byte": ("gzip", gzip.compress(ANSWER), b"\x1f"),
    "gzip then zlib": ("gzip", gzip.compress(ANSWER), zlib.compress(b"more")),
    "deflate newline": ("deflate", zlib.compress(ANSWER), b"\r\n"),
    "raw deflate zeros": ("deflate", zlib.compress(ANSWER)[2:-4], b"\0\0\0\0"),
}


@pytest.mark.parametrize("size", [1, 2, None])
@pytest.mark.parametrize("name", sorted(TAILS))
def test_bytes_after_a_whole_stream_are_ignored_as_clients_ignore_them(name, size):
    """httpx and urllib3 ignore them: they used to fail the decoding ("unknown compression method")."""
    encoding, stream, tail = TAILS[name]
    undo, body = _undone(encoding, stream + tail, size)
    assert body == ANSWER and undo.failure is None and undo.unfinished() is None and undo.later_stream() is None
    count = len(tail)
    assert undo.ignored_tail() == (f"{count} byte{'s' if count > 1 else ''} after the end of the {encoding} stream, "
                                   f"from wire byte {len(stream)} on, were ignored, as httpx and urllib3 ignore them")


def _judged(kind: str, judge, *args):
    from streamtap.providers import Dialect, Turn, Verdict, VerdictKind

    turn = Turn(Dialect.OPENAI_CHAT)
    verdict = judge(Verdict(VerdictKind(kind), "as read", 3, 10, {"end": "finished"}), turn, *args)
    return verdict, turn


@pytest.mark.parametrize(("kind", "becomes"), [("complete", "unknown"), ("stopped_by_limit", "unknown"),
                                                ("filtered", "unknown"), ("truncated", "truncated")])
def test_a_second_gzip_member_makes_an_answer_read_whole_unknown(kind, becomes):
    from streamtap.recording.content import judge_coding_streams

    undo, _ = _undone("gzip", MEMBERS["gzip"][0], None)
    verdict, turn = _judged(kind, judge_coding_streams, undo)
    note = verdict.evidence["later_coding_stream"]
    assert verdict.kind.value == becomes and note in turn.notes
    if becomes == "unknown":
        assert verdict.reason.startswith(f"{note}: the decoded body reads as {kind}, but httpx-based clients")
        assert verdict.evidence["decoded_body_read_as"] == kind


def test_an_ignored_tail_is_only_noted():
    from streamtap.recording.content import judge_coding_streams

    undo, _ = _undone("gzip", b"".join(TAILS["gzip zeros"][1:]), 1)
    verdict, turn = _judged("complete", judge_coding_streams, undo)
    assert verdict.kind.value == "complete" and verdict.evidence["ignored_coding_tail"] in turn.notes


@pytest.mark.parametrize(("end", "becomes"), [("client_aborted", "complete"), ("finished", "unknown")])
def test_a_client_that_left_before_the_end_marker_leaves_the_verdict_as_read(end, becomes):
    """The openai SDK closes the response at ``[DONE]``: whether the gzip trailer had arrived by
    then is read timing, not the answer."""
    from streamtap.providers import StreamEnd
    from streamtap.recording.content import judge_unfinished_coding

    verdict, turn = _judged("complete", judge_unfinished_coding, "the gzip stream ended before its end marker at wire byte 9",
                            StreamEnd(end))
    assert verdict.kind.value == becomes
    assert verdict.evidence["unfinished_coding"] in turn.notes


@pytest.mark.parametrize(("accept", "key"), [("gzip, deflate", "undecoded_coding"), (None, "undecoded_coding"),
                                             ("identity", "unaccepted_coding")])
def test_x_gzip_is_no_answer_an_httpx_client_reads(accept, key):
    """httpx has no x-gzip decoder: the openai SDK got the gzip bytes (UnicodeDecodeError)."""
    from streamtap.recording.content import judge_unaccepted_coding

    verdict, turn = _judged("complete", judge_unaccepted_coding, "x-gzip", accept)
    assert verdict.kind.value == "unknown" and verdict.evidence[key] in turn.notes
    assert _judged("complete", judge_unaccepted_coding, "gzip", accept)[0].kind.value == ("complete" if key != "unaccepted_coding" else "unknown")


CAPTURED = {  # name: (wire, encoding, mitmproxy's error, the verdict import and verify give, evidence key)
    "members": (MEMBERS["gzip"][0], "gzip", None, "unknown", "later_coding_stream"),
    "tail": (b"".join(TAILS["gzip zeros"][1:]), "gzip", None, "complete", "ignored_coding_tail"),
    "x-gzip": (gzip.compress(ANSWER), "x-gzip", None, "unknown", "undecoded_coding"),
    "left": (gzip.compress(ANSWER)[:-8], "gzip", "Client disconnected.", "complete", "unfinished_coding"),
}


def test_import_and_verify_judge_members_tails_x_gzip_and_a_client_that_left_alike(tmp_path):
    import subprocess
    import sys

    from mitmproxy import io
    from mitmproxy.flow import Error
    from mitmproxy.test import tflow

    from streamtap.recording import read_recording

    capture, out = tmp_path / "capture.mitm", tmp_path / "out"
    with capture.open("wb") as file:
        writer = io.FlowWriter(file)
        for name, (wire, encoding, error, _, _) in CAPTURED.items():
            flow = tflow.tflow(resp=True)
            flow.request.host, flow.request.path = "api.openai.com", f"/s/{name}/v1/chat/completions"
            flow.request.headers["accept-encoding"] = "gzip, deflate"  # httpx's
            flow.request.content = b'{"model":"gpt-test-1","stream":true,"messages":[]}'
            flow.response.headers["content-type"] = "text/event-stream"
            flow.response.headers["content-encoding"] = encoding
            flow.response.raw_content = wire
            if error:
                flow.error = Error(error)
            writer.add(flow)
    cli = [sys.executable, "-m", "streamtap.cli"]
    result = subprocess.run([*cli, "import", str(capture), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    recordings = {read_recording(path).header["request"]["url"].split("/s/")[1].split("/")[0]: path for path in out.glob("*.jsonl")}
    for name, (_, _, error, kind, key) in CAPTURED.items():
        rec = read_recording(recordings[name])
        assert rec.body == ANSWER and rec.end["stream_end"] == ("client_aborted" if error else "finished"), name
        assert rec.verdict["kind"] == kind and rec.verdict["evidence"][key] in rec.end["turn"]["notes"], (name, rec.verdict)
        judged = json.loads(subprocess.run([*cli, "verify", "--json", str(recordings[name])], capture_output=True,
                                           text=True, timeout=120).stdout)
        assert judged["problem"] is None and judged["verdict"]["kind"] == kind, (name, judged)
