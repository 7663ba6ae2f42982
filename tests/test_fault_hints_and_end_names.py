"""A refused error kind on an event-stream names only the kinds that operation's SDK can raise,
and a session is closed by a stream end's name as well as by the enum."""

from __future__ import annotations

import pytest

import provider_streams as streams
from streamtap.providers import Dialect, StreamEnd, VerdictKind, analyze_bytes
from streamtap.replay.faults import FaultSpecError, parse_faults, plan
from streamtap.replay.source import Source
from streamtap.wire import EventStreamDecoder


def converse() -> Source:
    body = streams.bedrock_converse(["Hello"], {"city": "Paris"})
    raws = [message.raw for message in EventStreamDecoder().feed(body)]
    return Source.from_frames(raws, wire="eventstream", dialect="bedrock-converse")


def test_a_wrong_kind_on_converse_suggests_only_converses_own():
    with pytest.raises(FaultSpecError) as refused:
        plan(converse(), parse_faults("error:kind=overloaded_error,after=1"))
    assert "use one of" in str(refused.value) and "modelTimeoutException" not in str(refused.value)
    assert "throttlingException" in str(refused.value)


@pytest.mark.parametrize("end", [StreamEnd.UPSTREAM_RESET, "upstream_reset"])
def test_a_stream_end_is_taken_by_its_name_too(end):
    body = streams.openai_chat(["Hello", " world"], done=False)
    analysis = analyze_bytes(body[: len(body) // 2], Dialect.OPENAI_CHAT, end=end)
    assert analysis.verdict.kind is VerdictKind.TRUNCATED and analysis.verdict.evidence["end"] == "upstream_reset"
