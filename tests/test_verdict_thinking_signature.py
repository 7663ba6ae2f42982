"""A thinking block's signature covers the thinking before it and comes last in its block
(provider-streams.md §3.3): thinking after it was reordered or another block's stitched on, and the
API refuses the block when the app sends it back. Corrupt on Anthropic and ConverseStream alike,
on the full path and where the text-delta fast path would take the delta."""

from __future__ import annotations

import json

import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.wire import encode_message


def anthropic(deltas: list[dict]) -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}
    thinking = [{"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                *({"type": "content_block_delta", "index": 0, "delta": delta} for delta in deltas),
                {"type": "content_block_stop", "index": 0}]
    text = [{"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi."}},
            {"type": "content_block_stop", "index": 1}]
    events = [{"type": "message_start", "message": message}, *thinking, *text,
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
              {"type": "message_stop"}]
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)


def converse(deltas: list[dict]) -> bytes:
    def frame(kind: str, payload: dict) -> bytes:
        return encode_message({":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                              json.dumps(payload).encode())

    reasoning = b"".join(frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": delta}})
                         for delta in deltas)
    return (frame("messageStart", {"role": "assistant"}) + reasoning + frame("contentBlockStop", {"contentBlockIndex": 0})
            + frame("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Hi."}})
            + frame("contentBlockStop", {"contentBlockIndex": 1}) + frame("messageStop", {"stopReason": "end_turn"})
            + frame("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}, "metrics": {"latencyMs": 5}}))


ORDERS = {  # dialect -> (its stream, a thinking delta, the signature delta, what the reason calls the thinking delta)
    Dialect.ANTHROPIC: (anthropic, lambda text: {"type": "thinking_delta", "thinking": text},
                        {"type": "signature_delta", "signature": "EqQBCgIYAh"}, "thinking_delta"),
    Dialect.BEDROCK_CONVERSE: (converse, lambda text: {"text": text}, {"signature": "EqQBCgIYAh"}, "reasoningContent text"),
}


@pytest.mark.parametrize("dialect", sorted(ORDERS, key=str), ids=str)
def test_thinking_after_its_blocks_signature_is_corrupt(dialect):
    stream, thinking, signature, named = ORDERS[dialect]
    # several deltas in one layout first: the fast path has learnt it by the one after the signature
    signed_last = analyze_bytes(stream([thinking("Let "), thinking("me "), thinking("think."), signature]), dialect)
    assert signed_last.verdict.kind is VerdictKind.COMPLETE, signed_last.verdict
    assert signed_last.turn.blocks[0].signature == "EqQBCgIYAh"
    unsigned = analyze_bytes(stream([thinking("Let "), thinking("me think.")]), dialect)
    assert unsigned.verdict.kind is VerdictKind.COMPLETE, unsigned.verdict  # (compatible servers send none)
    for chunk_size in (None, 1):
        verdict = analyze_bytes(stream([thinking("Let "), thinking("me "), signature, thinking("think.")]), dialect,
                                chunk_size=chunk_size).verdict
        assert verdict.kind is VerdictKind.CORRUPT, verdict
        assert verdict.reason.startswith(f"{named} for block 0 after its signature"), verdict
