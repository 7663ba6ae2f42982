"""Bedrock ConverseStream: a stream missing blocks is never complete.

provider-streams.md §4.3: blocks come by ``contentBlockIndex``; an index that skips some means
blocks were lost: ``corrupt``, never ``complete``.
"""

from __future__ import annotations

import json

import provider_streams
from streamtap.providers import Dialect, analyze_bytes
from streamtap.providers.turn import VerdictKind
from streamtap.wire import encode_message

CONVERSE = Dialect.BEDROCK_CONVERSE


def frame(kind: str, payload: dict) -> bytes:
    return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps(payload).encode())


START = frame("messageStart", {"role": "assistant"})
END = (frame("messageStop", {"stopReason": "end_turn"})
       + frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}}))


def text_block(index: int, text: str) -> bytes:
    return (frame("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": text}})
            + frame("contentBlockStop", {"contentBlockIndex": index}))


def tool_block(index: int) -> bytes:
    return (frame("contentBlockStart", {"contentBlockIndex": index,
                                        "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}})
            + frame("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": "{}"}}})
            + frame("contentBlockStop", {"contentBlockIndex": index}))


def test_skipped_block_index_is_corrupt() -> None:
    verdict = analyze_bytes(START + text_block(0, "A") + text_block(5, "B") + END, CONVERSE).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == "contentBlockDelta (text) for index 5 while 1 blocks exist"
    assert verdict.evidence["index"] == 5


def test_skipped_index_at_a_block_start_is_corrupt() -> None:
    verdict = analyze_bytes(START + text_block(0, "A") + tool_block(2) + END, CONVERSE).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == "contentBlockStart for index 2 while 1 blocks exist"


def test_first_block_not_at_index_0_is_corrupt() -> None:
    verdict = analyze_bytes(START + text_block(1, "B") + END, CONVERSE).verdict
    assert verdict.kind is VerdictKind.CORRUPT, verdict
    assert verdict.reason == "contentBlockDelta (text) for index 1 while 0 blocks exist"


def test_blocks_in_order_stay_complete() -> None:
    body = START + text_block(0, "A") + text_block(1, "B") + tool_block(2) + END
    verdict = analyze_bytes(body, CONVERSE).verdict
    assert verdict.kind is VerdictKind.COMPLETE, verdict
    # an empty start (boto3 refuses it: a union needs one member) is judged on that, not on its index
    empty_start = frame("contentBlockStart", {"contentBlockIndex": 1, "start": {}})
    verdict = analyze_bytes(START + text_block(0, "A") + empty_start + text_block(1, "B") + tool_block(2) + END, CONVERSE).verdict
    assert verdict.kind is VerdictKind.CORRUPT and "exactly one" in verdict.reason, verdict


def test_back_to_back_messages_number_blocks_from_0_again() -> None:
    one = provider_streams.bedrock_converse(["Hel", "lo"], {"city": "Paris"})
    verdict = analyze_bytes(one + one, CONVERSE).verdict
    assert verdict.kind is VerdictKind.COMPLETE, verdict
