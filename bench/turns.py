"""Turn assembly throughput: decode + assemble + verdict, against the SDKs' own accumulators.

    .venv/bin/python bench/turns.py [--quick]

Two constructed streams of realistic shape, ~20k wire events each:
  * Anthropic Messages SSE: a thinking block (thinking deltas + signature), a text block,
    a tool_use block whose input arrives in small input_json_delta fragments, pings,
    message_delta, message_stop;
  * OpenAI Chat Completions SSE: content chunks, then one tool call whose arguments arrive
    in fragments, a finish_reason chunk, the usage chunk and ``[DONE]``.
Both are fed in 1,500-byte reads (one TCP segment).

streamtap: ``analyze_bytes`` (SSE decoder + dialect assembler + verdict). Peers, on the
same bytes and the same reads:
  * "SDK decode+accumulate": the SDK's own SSE decoder, json.loads, then the accumulator
    (anthropic ``accumulate_event``; openai ``ChatCompletionStreamState.handle_chunk`` on
    ``ChatCompletionChunk`` objects built the way the SDK's Stream builds them) - the
    least an app using the SDK pays;
  * "SDK client end-to-end": the real client (``client.messages.stream(...)
    .get_final_message()`` / ``client.chat.completions.stream(...).get_final_completion()``)
    over an in-memory httpx transport - what an app actually pays, HTTP plumbing included.
A third table times the text-delta fast path (providers/fastpath.py) on against off (every
chunk parsed), same events, same rounds: on the Chat Completions stream above, on the same chunks
with OpenAI's per-chunk ``obfuscation`` padding, as the API sends them by default, on a
Bedrock ConverseStream body of about the same text (event-stream frames, each padded with ``p`` of
random length, as Bedrock sends them), and on the Anthropic stream above (text, tool-argument
and thinking deltas).
A second table leaves decoding out on both sides: streamtap's dialect Assembler on
already-decoded wire events against the SDK accumulator on already-parsed events
(anthropic: dicts; openai: ChatCompletionChunk objects, whose construction is the SDK's
decoding).
The turns are checked equal (text, tool arguments, stop reason) before timing.
Each pair runs back to back in every round (order alternating), the ratio (peer CPU time /
streamtap CPU time) is taken within the round, and the median and range over the rounds are
printed: machine load hits both sides of a ratio alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

import anthropic
import httpx2  # the HTTP library these SDK versions are built on
import openai
from anthropic._streaming import SSEDecoder as AnthropicSSEDecoder
from anthropic.lib.streaming._messages import accumulate_event
from openai._models import construct_type
from openai._streaming import SSEDecoder as OpenAISSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from streamtap.providers import Dialect, StreamEnd, analyze_bytes
from streamtap.providers import anthropic as anthropic_dialect
from streamtap.providers import bedrock_converse, openai_chat
from streamtap.providers.session import make_assembler
from streamtap.wire import EventStreamDecoder, SSEDecoder, encode_message

READ = 1500
WORDS = "the quick brown fox jumps over a lazy dog while streaming tokens arrive one by one".split()


def _words(rng: random.Random) -> str:
    return " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def _fragments(rng: random.Random, count: int) -> list[str]:
    """``count`` small pieces that join into one JSON object."""
    items = ",".join(json.dumps({"n": i, "w": rng.choice(WORDS)}) for i in range(count // 6))
    text = '{"items": [' + items + '], "done": true}'
    size = max(1, len(text) // count)
    return [text[i : i + size] for i in range(0, len(text), size)]


def anthropic_stream(events: int) -> bytes:
    rng = random.Random(11)
    thinking, tool = events // 5, events // 5
    text = events - thinking - tool
    out: list[dict] = [{
        "type": "message_start",
        "message": {"id": "msg_bench", "type": "message", "role": "assistant", "model": "claude-bench",
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": 1200, "cache_read_input_tokens": 0, "output_tokens": 1}},
    }]  # fmt: skip
    out.append({"type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
    out += [{"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": _words(rng)}}
            for _ in range(thinking)]
    out.append({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQB" * 40}})
    out.append({"type": "content_block_stop", "index": 0})
    out.append({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
    for i in range(text):
        out.append({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": _words(rng)}})
        if i % 1000 == 999:
            out.append({"type": "ping"})
    out.append({"type": "content_block_stop", "index": 1})
    out.append({"type": "content_block_start", "index": 2,
                "content_block": {"type": "tool_use", "id": "toolu_bench", "name": "record", "input": {}}})
    out += [{"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": f}}
            for f in _fragments(rng, tool)]
    out.append({"type": "content_block_stop", "index": 2})
    out.append({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": events}})
    out.append({"type": "message_stop"})
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
        for e in out
    )


def openai_stream(chunks: int, padded: bool = False) -> bytes:
    rng = random.Random(13)
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "gpt-bench", "system_fingerprint": "fp_bench"}
    fragments = _fragments(rng, chunks // 5)
    content = chunks - len(fragments) - 4
    out: list[dict] = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": {"content": _words(rng)}, "logprobs": None,
                                  "finish_reason": None}]} for _ in range(content)]
    out.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_bench", "type": "function", "function": {"name": "record", "arguments": ""}}]},
        "logprobs": None, "finish_reason": None}]})
    out += [{**base, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": f}}]},
                                  "logprobs": None, "finish_reason": None}]} for f in fragments]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]})
    out.append({**base, "choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": chunks,
                                                 "total_tokens": 900 + chunks}})
    if padded:  # OpenAI's stream_options.include_obfuscation: random-length padding on every chunk
        out = [{**c, "obfuscation": "x" * rng.randint(1, 16)} for c in out]
    body = b"".join(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in out)
    return body + b"data: [DONE]\n\n"


def converse_stream(events: int) -> bytes:
    """A ConverseStream body: text deltas, then a tool call's argument fragments, as Bedrock frames them."""
    rng = random.Random(13)
    fragments = _fragments(rng, events // 5)
    out = [("messageStart", {"role": "assistant"})]
    out += [("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": _words(rng)}})
            for _ in range(events - len(fragments) - 7)]
    out += [("contentBlockStop", {"contentBlockIndex": 0}),
            ("contentBlockStart", {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_bench",
                                                                                  "name": "record"}}})]
    out += [("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": f}}}) for f in fragments]
    out += [("contentBlockStop", {"contentBlockIndex": 1}), ("messageStop", {"stopReason": "tool_use"}),
            ("metadata", {"usage": {"inputTokens": 900, "outputTokens": events, "totalTokens": 900 + events},
                          "metrics": {"latencyMs": 1000}})]
    headers = {":content-type": "application/json", ":message-type": "event"}
    padding = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return b"".join(
        encode_message({":event-type": kind, **headers},
                       json.dumps({**body, "p": padding[: rng.randint(1, len(padding))]}, separators=(",", ":")).encode())
        for kind, body in out
    )


def reads(body: bytes) -> list[bytes]:
    return [body[i : i + READ] for i in range(0, len(body), READ)]


# -- the contenders: each returns (text, tool arguments, stop reason) ------------------------------
def streamtap_runner(dialect: Dialect) -> Callable[[bytes], tuple]:
    def run(body: bytes) -> tuple:
        analysis = analyze_bytes(body, dialect, chunk_size=READ)
        assert analysis.verdict.ok, analysis.verdict
        turn = analysis.turn
        return turn.text(), turn.tool_calls()[0].arguments, turn.stop_reason_raw

    return run


def anthropic_accumulate(body: bytes) -> tuple:
    snapshot, buffers = None, {}
    for sse in AnthropicSSEDecoder().iter_bytes(iter(reads(body))):
        snapshot = accumulate_event(event=json.loads(sse.data), current_snapshot=snapshot, json_bufs=buffers)
    text = "".join(c.text for c in snapshot.content if c.type == "text")
    return text, snapshot.content[2].input, snapshot.stop_reason


def _mock_client(cls, body: bytes, **kwargs):
    """The real client over an in-memory transport that hands out the body in READ-sized reads."""

    class Reads(httpx2.ByteStream):
        def __iter__(self):
            yield from reads(body)

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Reads(body))

    return cls(http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), base_url="http://bench.invalid",
               max_retries=0, **kwargs)


def anthropic_client(body: bytes) -> tuple:
    client = _mock_client(anthropic.Anthropic, body, api_key="bench")
    with client.messages.stream(model="claude-bench", max_tokens=10,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()
    text = "".join(c.text for c in message.content if c.type == "text")
    return text, message.content[2].input, message.stop_reason


def openai_accumulate(body: bytes) -> tuple:
    state = ChatCompletionStreamState()
    for sse in OpenAISSEDecoder().iter_bytes(iter(reads(body))):
        if sse.data.startswith("[DONE]"):
            break
        state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=json.loads(sse.data)))
    return _openai_result(state.get_final_completion())


def openai_client(body: bytes) -> tuple:
    client = _mock_client(openai.OpenAI, body, api_key="bench")
    with client.chat.completions.stream(model="gpt-bench", messages=[{"role": "user", "content": "hi"}]) as stream:
        completion = stream.get_final_completion()
    return _openai_result(completion)


def _openai_result(completion) -> tuple:
    choice = completion.choices[0]
    arguments = json.loads(choice.message.tool_calls[0].function.arguments)
    return choice.message.content, arguments, choice.finish_reason


def decoded(body: bytes, decoder_class: type = SSEDecoder) -> list:
    decoder = decoder_class()
    return [e for chunk in reads(body) for e in decoder.feed(chunk)] + decoder.close()


def assembly(make: Callable[[], object]) -> Callable[[list], object]:
    """Feed decoded events to a fresh assembler from ``make`` and judge them (a complete turn)."""

    def run(events: list) -> object:
        assembler = make()
        for event in events:
            assembler.feed(event, None)
        turn, verdict = assembler.finish(StreamEnd.FINISHED)
        assert verdict.ok
        return turn

    return run


def assemble_only(dialect: Dialect) -> Callable[[list], object]:
    return assembly(lambda: make_assembler(dialect, "sse"))


class FullParse(openai_chat.Assembler):
    """The Chat Completions assembler with its content fast path off: every chunk parsed."""

    def _content_delta(self, data: str, t: float | None) -> bool:
        return False


class AnthropicFullParse(anthropic_dialect.Assembler):
    """The Anthropic assembler with its delta fast path off: every event parsed."""

    def _delta(self, data: str, t: float | None) -> bool:
        return False


class ConverseFullParse(bedrock_converse.Assembler):
    """The ConverseStream assembler with its text-delta fast path off: every event parsed."""

    def _text_delta(self, data: str, t: float | None) -> bool:
        return False


def chat_assembly(cls: type) -> Callable[[list], object]:
    return assembly(lambda: cls(wire="sse"))


def full_parse_end_to_end(dialect: Dialect) -> Callable[[bytes], tuple]:
    """``streamtap_runner`` with the dialect's fast path off, for the on/off pair."""
    cls, name, off = {Dialect.OPENAI_CHAT: (openai_chat.Assembler, "_content_delta", FullParse._content_delta),
                      Dialect.ANTHROPIC: (anthropic_dialect.Assembler, "_delta", AnthropicFullParse._delta),
                      Dialect.BEDROCK_CONVERSE: (bedrock_converse.Assembler, "_text_delta",
                                                 ConverseFullParse._text_delta)}[dialect]

    def run(body: bytes) -> tuple:
        taken = getattr(cls, name)
        setattr(cls, name, off)
        try:
            return streamtap_runner(dialect)(body)
        finally:
            setattr(cls, name, taken)

    return run


def anthropic_accumulate_only(events: list[dict]) -> object:
    snapshot, buffers = None, {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    return snapshot


def openai_accumulate_only(chunks: list) -> object:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    return state.get_final_completion()


def paired_rounds(ours: Callable, our_input: object, peer: Callable, peer_input: object, rounds: int) -> tuple[list[float], list[float]]:
    """Both sides back to back in each round, the order alternating: (peer time / our time per
    round, our seconds per round). CPU time of this process, steadier than wall time under load."""
    ratios, mine = [], []
    for number in range(rounds):
        sides = [(ours, our_input), (peer, peer_input)]
        timed = []
        for fn, value in sides if number % 2 == 0 else sides[::-1]:
            start = time.process_time()
            fn(value)
            timed.append((fn, time.process_time() - start))
        seconds = dict((id(fn), t) for fn, t in timed)
        ratios.append(seconds[id(peer)] / seconds[id(ours)])
        mine.append(seconds[id(ours)])
    return ratios, mine


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):6.1f}x {min(ratios):5.1f}-{max(ratios):.1f}x"


def fastpath_table(events: int, rounds: int) -> None:
    print()
    print("Text-delta fast path, on against off (every chunk parsed) in the same rounds; "
          "ratio = off CPU time / on CPU time")
    print(f"{'stream':<22} {'what':<26} {'events':>7} {'on ev/s':>10} {'off ev/s':>10} {'ratio':>7} {'range':>12}")
    chat = (chat_assembly(openai_chat.Assembler), chat_assembly(FullParse), SSEDecoder, Dialect.OPENAI_CHAT)
    converse = (assembly(bedrock_converse.Assembler), assembly(ConverseFullParse),
                EventStreamDecoder, Dialect.BEDROCK_CONVERSE)
    messages = (assembly(anthropic_dialect.Assembler), assembly(AnthropicFullParse), SSEDecoder,
                Dialect.ANTHROPIC)
    for name, body, (fast, full, decoder, dialect) in [("openai-chat", openai_stream(events), chat),
                                                        ("openai-chat, padded", openai_stream(events, True), chat),
                                                        ("bedrock-converse", converse_stream(events), converse),
                                                        ("anthropic", anthropic_stream(events), messages)]:
        wire_events = decoded(body, decoder)
        ours, theirs = streamtap_runner(dialect), full_parse_end_to_end(dialect)
        assert fast(wire_events).to_dict() == full(wire_events).to_dict(), f"{name}: the fast path changed the turn"
        assert ours(body) == theirs(body)
        for what, on, off, value in [("assembly (events decoded)", fast, full, wire_events),
                                     ("decode+assemble+judge", ours, theirs, body)]:
            ratios, mine = paired_rounds(on, value, off, value, rounds)
            rate = len(wire_events) / statistics.median(mine)
            off_rate = rate / statistics.median(ratios)
            print(f"{name:<22} {what:<26} {len(wire_events):>7} {rate:>10,.0f} {off_rate:>10,.0f} "
                  f"{statistics.median(ratios):6.2f}x {min(ratios):5.2f}-{max(ratios):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2k events, 5 rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per pair (default 5, at least 5)")
    parser.add_argument("--fastpath-only", action="store_true", help="only the text-delta fast path on/off table")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer ratios says little)")
    events = 2_000 if args.quick else 20_000
    if args.fastpath_only:
        print(f"python {sys.version.split()[0]}, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f} at the start")
        fastpath_table(events, args.rounds)
        return 0
    cases = [
        ("anthropic", anthropic_stream(events), Dialect.ANTHROPIC, "tool_use",
         [("anthropic SDK decode+accumulate", anthropic_accumulate),
          ("anthropic SDK client end-to-end", anthropic_client)]),
        ("openai-chat", openai_stream(events), Dialect.OPENAI_CHAT, "tool_calls",
         [("openai SDK decode+ChatCompletionStreamState", openai_accumulate),
          ("openai SDK client end-to-end", openai_client)]),
    ]
    print(f"python {sys.version.split()[0]}, reads of {READ} bytes; {args.rounds} rounds per pair, the two sides back "
          f"to back in each (order alternating), ratio = peer CPU time / streamtap CPU time within the round; "
          f"median and range; load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'stream':<12} {'events':>7} {'MiB':>6}  {'peer':<46} {'streamtap ev/s':>14} {'ratio':>8} {'range':>10}")
    for name, body, dialect, stop, peers in cases:
        ours = streamtap_runner(dialect)
        reference = ours(body)
        wire_events = analyze_bytes(body, dialect).wire_events
        assert reference[2] == stop
        for _, peer in peers:  # same turn before timing anything
            text, arguments, stop_reason = peer(body)
            assert (text, arguments, stop_reason) == reference, f"{name}: a peer disagrees with streamtap"
        mib = len(body) / 2**20
        for label, peer in peers:
            ratios, mine = paired_rounds(ours, body, peer, body, args.rounds)
            rate = wire_events / statistics.median(mine)
            print(f"{name:<12} {wire_events:>7} {mib:>6.2f}  {label:<46} {rate:>14,.0f} {spread(ratios)}")
    print()
    print("assembly only (events already decoded)")
    print(f"{'stream':<12} {'events':>7}  {'peer':<46} {'streamtap ev/s':>14} {'ratio':>8} {'range':>10}")
    for name, body, dialect, _, _ in cases:
        wire_events = decoded(body)
        parsed = [json.loads(e.data) for e in wire_events if not e.data.startswith("[DONE]")]
        if dialect is Dialect.OPENAI_CHAT:
            label, peer = "openai ChatCompletionStreamState.handle_chunk", openai_accumulate_only
            inputs = [construct_type(type_=ChatCompletionChunk, value=p) for p in parsed]
        else:
            label, peer, inputs = "anthropic accumulate_event", anthropic_accumulate_only, parsed
        ratios, mine = paired_rounds(assemble_only(dialect), wire_events, peer, inputs, args.rounds)
        rate = len(wire_events) / statistics.median(mine)
        print(f"{name:<12} {len(wire_events):>7}  {label:<46} {rate:>14,.0f} {spread(ratios)}")
    fastpath_table(events, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
