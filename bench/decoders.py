"""Decoder throughput: streamtap against the decoders apps already ship with.

    .venv/bin/python bench/decoders.py [--quick]

Two constructed streams of realistic shape:
  * Anthropic Messages SSE, ~20k ``content_block_delta`` text deltas;
  * a Bedrock InvokeModelWithResponseStream event-stream body, ~20k ``chunk`` frames
    built with streamtap's encoder (the three string headers Bedrock sends, payload
    ``{"bytes": <base64 Anthropic event>, "p": <padding>}``).
Each is fed in 1,500-byte (one TCP segment) and 16 KiB chunks to streamtap and to its
peers: botocore's EventStreamBuffer; the SSE decoders of httpx-sse, the openai SDK and
the anthropic SDK, each driven the way the library drives it (bytes iterator in, events
out); and zlib.crc32 over the same chunks, the floor for any decoder that checks CRCs.
streamtap is also fed 1 byte at a time on a slice, against 16 KiB reads of the same
slice, to show the cost of tiny reads, and against a decoder whose ``feed`` only appends
(the least a Python ``feed`` costs); and 1-byte reads each handed to a call into C that does
nothing, against streamtap's 16 KiB reads: the floor of the 1-byte slowdown for any ``feed``,
even one written in C. Where the install has the decoders' compiled loops
(``streamtap.wire._accel``), streamtap runs them, and one more pair times it against the
same decoder with its Python loops.

Each pair (streamtap and one peer, or streamtap's 1-byte and 16 KiB reads) runs back to
back in every round, the order alternating between rounds, and the ratio is taken within
the round: machine load hits both sides of a ratio alike. Figures are CPU time of this
process (steadier than wall time on a shared machine). Printed: the median and the range
of each pair's ratios (peer time / streamtap time: above 1 means streamtap is faster;
for the 1-byte pair, how many times slower 1-byte reads are).
"""

from __future__ import annotations

import argparse
import base64
import json
import operator
import os
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Iterator

import httpx
from anthropic._streaming import SSEDecoder as AnthropicSSEDecoder
from botocore.eventstream import EventStreamBuffer
from httpx_sse import EventSource
from openai._streaming import SSEDecoder as OpenAISSEDecoder

from streamtap.wire import EventStreamDecoder, SSEDecoder, accel, encode_message

DELTAS = 20_000
WORDS = "the quick brown fox jumps over a lazy dog while streaming tokens arrive one by one".split()


def anthropic_events(count: int) -> Iterator[dict]:
    rng = random.Random(7)
    yield {
        "type": "message_start",
        "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "content": [], "model": "claude-sonnet-4-5", "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 472, "output_tokens": 2},
        },
    }  # fmt: skip
    yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    for _ in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        yield {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    yield {"type": "content_block_stop", "index": 0}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": count},
    }
    yield {"type": "message_stop"}


def anthropic_sse(count: int) -> bytes:
    lines = []
    for event in anthropic_events(count):
        lines.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
        if len(lines) % 500 == 0:
            lines.append("event: ping\ndata: {\"type\": \"ping\"}\n\n")
    return "".join(lines).encode()


def bedrock_body(count: int) -> bytes:
    rng = random.Random(11)
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    frames = []
    for event in anthropic_events(count):
        native = json.dumps(event, separators=(",", ":")).encode()
        padding = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"[: rng.randint(1, 52)]
        payload = json.dumps({"bytes": base64.b64encode(native).decode(), "p": padding}, separators=(",", ":"))
        frames.append(encode_message(headers, payload.encode()))
    return b"".join(frames)


def chunks_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# one function per decoder: chunks in, number of events out ------------------------------


class PythonLoopSSE(SSEDecoder):
    _compiled_run = None


class PythonLoopEventStream(EventStreamDecoder):
    _compiled_frames = None


def fed(decoder_class: type) -> Callable[[list[bytes]], int]:
    """A run that feeds every chunk to a new ``decoder_class()``, then closes it."""

    def run(chunks: list[bytes]) -> int:
        decoder = decoder_class()
        count = 0
        for chunk in chunks:
            count += len(decoder.feed(chunk))
        return count + len(decoder.close())

    return run


streamtap_sse, streamtap_eventstream = fed(SSEDecoder), fed(EventStreamDecoder)
python_loop_sse, python_loop_eventstream = fed(PythonLoopSSE), fed(PythonLoopEventStream)


class AppendOnly:
    """The least a decoder's Python ``feed`` can do: keep the bytes, return no events."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list:
        self.buffer += data
        return []


def append_only(chunks: list[bytes]) -> int:
    decoder = AppendOnly()
    count = 0
    for chunk in chunks:
        count += len(decoder.feed(chunk))
    return count


_no_op = operator.itemgetter(slice(0, 0))  # a call into C that keeps nothing and returns b""


def no_op_c_call(chunks: list[bytes]) -> int:
    """Below any decoder: the loop above with one call into C per read that does nothing. Against
    16 KiB reads it is the least slowdown 1-byte reads can show in this loop, whatever ``feed`` is."""
    count = 0
    for chunk in chunks:
        count += len(_no_op(chunk))
    return count


def botocore_eventstream(chunks: list[bytes]) -> int:
    buffer = EventStreamBuffer()
    count = 0
    for chunk in chunks:  # how botocore.eventstream.EventStream drives it
        buffer.add_data(chunk)
        for _ in buffer:
            count += 1
    return count


def httpx_sse_decoder(chunks: list[bytes]) -> int:
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(chunks))
    return sum(1 for _ in EventSource(response).iter_sse())


def openai_sse_decoder(chunks: list[bytes]) -> int:
    return sum(1 for _ in OpenAISSEDecoder().iter_bytes(iter(chunks)))


def anthropic_sse_decoder(chunks: list[bytes]) -> int:
    return sum(1 for _ in AnthropicSSEDecoder().iter_bytes(iter(chunks)))


def zlib_crc32(chunks: list[bytes]) -> int:
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return 0


def cpu_seconds(run: Callable[[list[bytes]], int], chunks: list[bytes], repeat: int = 1) -> tuple[float, int]:
    """CPU time of this process for ``repeat`` runs over ``chunks`` (per run), and the events counted."""
    events = 0
    started = time.process_time()
    for _ in range(repeat):
        events = run(chunks)
    return (time.process_time() - started) / repeat, events


class Pair:
    """Two runs timed back to back in every round; the round's ratio is ``slow / fast``."""

    def __init__(self, stream: str, label: str, ours, theirs, note: str = "") -> None:
        self.stream, self.label, self.note = stream, label, note
        self.ours, self.theirs = ours, theirs  # (run, chunks, repeat)
        self.ratios: list[float] = []
        self.our_rates: list[float] = []
        self.events: tuple[int, int] = (0, 0)
        self.skipped = ""

    def round(self, flip: bool) -> None:
        if self.skipped:
            return
        sides = [self.ours, self.theirs]
        timed = {}
        try:
            for side in reversed(sides) if flip else sides:  # alternate who goes first
                run, chunks, repeat = side
                timed[id(side)] = cpu_seconds(run, chunks, repeat)
        except NotImplementedError as missing:
            self.skipped = str(missing)
            return
        (mine, my_events), (theirs, their_events) = timed[id(self.ours)], timed[id(self.theirs)]
        self.events = (my_events, their_events)
        self.ratios.append(theirs / mine)
        self.our_rates.append(sum(map(len, self.ours[1])) / mine / 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the deltas, 5 rounds unless --rounds says (a smoke run)")
    parser.add_argument("--rounds", type=int, help="rounds; every pair runs once in each (default 7, at least 5)")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 5 if args.quick else 7
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (a median and range of fewer ratios says little)")
    deltas = DELTAS // 10 if args.quick else DELTAS

    suites = [
        ("Anthropic SSE", anthropic_sse(deltas), streamtap_sse,
         [("httpx-sse 0.4.3", httpx_sse_decoder), ("openai SDK", openai_sse_decoder),
          ("anthropic SDK", anthropic_sse_decoder)], python_loop_sse),
        ("Bedrock event-stream", bedrock_body(deltas), streamtap_eventstream,
         [("botocore EventStreamBuffer", botocore_eventstream)], python_loop_eventstream),
    ]  # fmt: skip
    pairs: list[Pair] = []
    for title, data, ours, peers, python_loop in suites:
        print(f"{title}: {len(data):,} bytes", file=sys.stderr)
        if accel.compiled:
            peers = [*peers, ("its Python loops", python_loop)]
        for chunk in (1500, 16384):
            chunks = chunks_of(data, chunk)
            for peer_name, peer in [*peers, ("zlib.crc32 (limit)", zlib_crc32)]:
                pairs.append(Pair(title, f"{chunk:>5} B  vs {peer_name}", (ours, chunks, 1), (peer, chunks, 1)))
        # the cost of tiny reads: 1-byte reads against 16 KiB reads of the same slice, same decoder,
        # and against a feed that only appends (how close 1-byte reads are to their floor)
        sliced = data[: len(data) // 10]
        one_byte = chunks_of(sliced, 1)
        pairs.append(Pair(title, "    1 B  vs 16 KiB reads (slowdown)", (ours, chunks_of(sliced, 16384), 4),
                          (ours, one_byte, 1), note="1B"))
        pairs.append(Pair(title, "    1 B  vs an append-only feed (slowdown)", (append_only, one_byte, 1),
                          (ours, one_byte, 1), note="1B"))
        pairs.append(Pair(title, "    1 B no-op C calls vs our 16 KiB (floor)", (ours, chunks_of(sliced, 16384), 4),
                          (no_op_c_call, one_byte, 1), note="1B"))
    for pair in pairs:  # warm-up: imports, caches, first-call costs
        for run, chunks, _ in (pair.ours, pair.theirs):
            try:
                run(chunks[: max(1, len(chunks) // 20)])
            except NotImplementedError:
                pass
    for number in range(args.rounds):
        for pair in pairs:
            pair.round(flip=bool(number % 2))

    print(f"bench/decoders.py: {args.rounds} rounds; in each round the two sides of a pair run back to back "
          f"(order alternating) and the ratio is taken within the round; CPU time of this process; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end; "
          f"{'compiled loops (streamtap.wire._accel)' if accel.compiled else 'Python loops only'}")
    print(f"{'stream':<22} {'pair':<44} {'ratio median':>12} {'range':>15} {'streamtap MB/s':>15}")
    for pair in pairs:
        if pair.skipped:
            print(f"{pair.stream:<22} {pair.label:<44} skipped: {pair.skipped}")
            continue
        ratios = pair.ratios
        slowdown = pair.note == "1B"  # 1-byte time / 16 KiB time, not a speed ratio to a peer
        rate = "  (times slower)" if slowdown else f"{statistics.median(pair.our_rates):15.1f}"
        print(f"{pair.stream:<22} {pair.label:<44} {statistics.median(ratios):11.2f}x "
              f"{min(ratios):6.2f}-{max(ratios):.2f}x {rate}")
        mine, theirs = pair.events
        if not slowdown and theirs and theirs != mine:
            print(f"  note: the peer saw {theirs} events, streamtap {mine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
