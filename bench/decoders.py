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
streamtap is also fed 1 byte at a time on a slice, to show the cost of tiny reads.
Figures are CPU time of this process (steadier than wall time on a shared machine),
best of five repetitions; ratios are streamtap / peer.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
import zlib
from collections.abc import Callable, Iterator

import httpx
from anthropic._streaming import SSEDecoder as AnthropicSSEDecoder
from botocore.eventstream import EventStreamBuffer
from httpx_sse import EventSource
from openai._streaming import SSEDecoder as OpenAISSEDecoder

from streamtap.wire import EventStreamDecoder, SSEDecoder, encode_message

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


def streamtap_eventstream(chunks: list[bytes]) -> int:
    decoder = EventStreamDecoder()
    count = 0
    for chunk in chunks:
        count += len(decoder.feed(chunk))
    return count + len(decoder.close())


def streamtap_sse(chunks: list[bytes]) -> int:
    decoder = SSEDecoder()
    count = 0
    for chunk in chunks:
        count += len(decoder.feed(chunk))
    return count + len(decoder.close())


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


def best_of(run: Callable[[list[bytes]], int], chunks: list[bytes], repeats: int) -> tuple[float, int]:
    best, events = float("inf"), 0
    for _ in range(repeats):
        started = time.process_time()
        events = run(chunks)
        best = min(best, time.process_time() - started)
    return best, events


def measure(name: str, run, data: bytes, chunk: int, repeats: int) -> dict | None:
    try:
        seconds, events = best_of(run, chunks_of(data, chunk), repeats)
    except NotImplementedError as missing:
        print(f"  skipped {name}: {missing}", file=sys.stderr)
        return None
    return {"decoder": name, "chunk": chunk, "bytes": len(data), "seconds": seconds, "events": events}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the deltas, one repetition (a smoke run)")
    args = parser.parse_args(argv)
    deltas = DELTAS // 10 if args.quick else DELTAS
    repeats = 1 if args.quick else 5

    suites = [
        ("Anthropic SSE", anthropic_sse(deltas), streamtap_sse,
         [("httpx-sse 0.4.3", httpx_sse_decoder), ("openai SDK", openai_sse_decoder),
          ("anthropic SDK", anthropic_sse_decoder)]),
        ("Bedrock event-stream", bedrock_body(deltas), streamtap_eventstream,
         [("botocore EventStreamBuffer", botocore_eventstream)]),
    ]  # fmt: skip
    rows = []
    for title, data, ours, peers in suites:
        print(f"{title}: {len(data):,} bytes", file=sys.stderr)
        for chunk in (1500, 16384):
            mine = measure("streamtap", ours, data, chunk, repeats)
            rows.append((title, mine, None))
            for peer_name, peer in [*peers, ("zlib.crc32 (limit)", zlib_crc32)]:
                theirs = measure(peer_name, peer, data, chunk, repeats)
                rows.append((title, theirs, mine))
                if mine and theirs and theirs["events"] and theirs["events"] != mine["events"]:
                    print(f"  note: {peer_name} saw {theirs['events']} events, streamtap {mine['events']}",
                          file=sys.stderr)
        sliced = data[: len(data) // 10]
        one_byte = measure("streamtap", ours, sliced, 1, repeats)
        bulk = measure("streamtap", ours, sliced, 16384, repeats)
        rows.append((title, one_byte, bulk))

    print(f"{'stream':<22} {'chunk':>6} {'decoder':<28} {'MB/s':>9} {'events/s':>11} {'streamtap/peer':>15}")
    for title, row, reference in rows:
        if row is None:
            continue
        rate = row["bytes"] / row["seconds"] / 1e6
        events = row["events"] / row["seconds"] if row["events"] else float("nan")
        ratio = ""
        if reference is not None and row["decoder"] != "streamtap":
            ratio = f"{reference['bytes'] / reference['seconds'] / rate / 1e6:.2f}x"
        elif reference is not None:  # the 1-byte row: slowdown against 16 KiB on the same slice
            slowdown = (reference["bytes"] / reference["seconds"]) / (row["bytes"] / row["seconds"])
            ratio = f"1B is {slowdown:.1f}x slower"
        events_text = "" if events != events else f"{events:,.0f}"
        print(f"{title:<22} {row['chunk']:>6} {row['decoder']:<28} {rate:>9.1f} {events_text:>11} {ratio:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
