"""One HTTP response answers one call: a second Anthropic or ConverseStream message in it, after
the first ended, was stitched on (a gateway that glued a retry's answer behind a finished one).
The proxy, `verify` on a recording and `import` judge it corrupt. The anthropic SDK would fold
the second message's deltas into the first's blocks by index, so the turn the app gets is
neither. A body file of several messages back to back (multi-step test recordings) stays one turn."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from mitmproxy.test import tflow
from test_providers_anthropic import START, end, sse, text_block

from provider_streams import bedrock_converse
from streamtap.mitm.flowtap import FlowTap
from streamtap.providers import Dialect, StreamEnd, VerdictKind, analyze_bytes


def message(message_id: str, text: str) -> bytes:
    start = copy.deepcopy(START)
    start["message"]["id"] = message_id
    return sse(start, *text_block(0, text), *end("end_turn"))


STITCHED = message("msg_A", "Hi there.") + message("msg_B", "Let me check.")
CONVERSE_TWICE = bedrock_converse(["Hi"], {"city": "Paris"}) * 2


@pytest.mark.parametrize("body, dialect", [(STITCHED, Dialect.ANTHROPIC), (CONVERSE_TWICE, Dialect.BEDROCK_CONVERSE)],
                         ids=["anthropic", "converse"])
def test_a_second_message_in_one_response_is_stitched_on(body, dialect):
    verdict = analyze_bytes(body, dialect, one_response=True).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "one call answers once, so a second answer was stitched on" in verdict.reason, verdict
    # a body file may be a multi-step test recording: one turn, as before
    assert analyze_bytes(body, dialect).verdict.kind is VerdictKind.COMPLETE


def test_the_proxy_and_verify_judge_a_stitched_response_corrupt(tmp_path):
    flow = tflow.tflow(resp=True)
    flow.request.host, flow.request.method, flow.request.path = "api.anthropic.com", "POST", "/v1/messages"
    flow.request.content = json.dumps({"model": "claude-test-4", "stream": True, "messages": []}).encode()
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = None
    tap = FlowTap(flow, directory=str(tmp_path), fsync="end", redact=(), sentinel=None, max_event_size=1 << 20, record=True)
    for i in range(0, len(STITCHED), 100):
        tap.arrived(STITCHED[i : i + 100], None)
    summary = tap.finish(StreamEnd.FINISHED)
    assert summary["verdict"] == "corrupt" and "stitched on" in summary["reason"], summary
    verified = subprocess.run([sys.executable, "-m", "streamtap", "verify", "--json", summary["recording"]],
                              capture_output=True, text=True, timeout=60)
    judged = json.loads(verified.stdout)
    assert judged["verdict"]["kind"] == "corrupt" and judged["problem"] is None, judged


AFTER_THE_END = [
    (Dialect.ANTHROPIC, message("msg_A", "Hi there."), b"event: ping\ndata: {\"ty"),
    (Dialect.BEDROCK_CONVERSE, bedrock_converse(["Hi"], {"city": "Paris"}), bedrock_converse(["Hi"], {})[:20]),
    (Dialect.BEDROCK_CONVERSE, bedrock_converse(["Hi"], {"city": "Paris"}), b"\x00\x00\x00\x05\x00"),
]


@pytest.mark.parametrize("dialect, body, tail", AFTER_THE_END, ids=["anthropic", "converse-frame", "converse-prelude"])
def test_the_start_of_another_event_after_the_answer_s_end_is_corrupt_not_truncated(dialect, body, tail):
    """boto3 (and the anthropic SDK) drop an unfinished last event at a clean end of the body: the
    app got the whole answer, which `truncated` denied. Anything after an answer's end is corrupt,
    as a whole event there is; a body file of messages back to back keeps reading it as the next
    message cut."""
    assert analyze_bytes(body, dialect, one_response=True).verdict.kind is VerdictKind.COMPLETE
    verdict = analyze_bytes(body + tail, dialect, one_response=True).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert "after the answer had ended (complete)" in verdict.reason and verdict.offset == len(body), verdict
    assert verdict.evidence["after_end"] and verdict.evidence["tail_bytes"] == len(tail), verdict.evidence
    cut = analyze_bytes(body + tail, dialect, one_response=True, end=StreamEnd.UPSTREAM_RESET).verdict
    assert cut.kind is VerdictKind.TRUNCATED, cut  # the SDKs raise on the reset
    assert analyze_bytes(body + tail, dialect).verdict.kind is VerdictKind.TRUNCATED


def test_a_comment_cut_after_the_answer_s_end_begins_no_event():
    """A keep-alive comment begins no event: cut after the end, it is no event appended (corrupt),
    but a cut line, as it was judged before."""
    body = message("msg_A", "Hi there.")
    assert analyze_bytes(body + b": ping\n", Dialect.ANTHROPIC, one_response=True).verdict.kind is VerdictKind.COMPLETE
    verdict = analyze_bytes(body + b": ping", Dialect.ANTHROPIC, one_response=True).verdict
    assert verdict.kind is VerdictKind.TRUNCATED and "began another event" not in verdict.reason, verdict
