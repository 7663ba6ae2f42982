"""The Chat Completions assembler with its content-delta fast path against the same assembler
parsing every chunk: identical turns and verdicts on real captures (whole and cut) and on
generated streams built to hit every rule a skipped parse could miss (a chunk id change, a
delta after its choice finished, a second role start, error chunks and ``event: error``,
usage chunks, several choices, unusable indexes, ``[DONE]`` mid-stream, mixed layouts)."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from provider_streams import chunk_lines, frame_chat, sse_spans
from conftest import shared_files
from fastpath_differential import STYLES, FastPath

from streamtap.providers import Dialect, sniff_dialect
from streamtap.providers import openai_chat

CHAT = Dialect.OPENAI_CHAT


PATH = FastPath(CHAT, openai_chat.Assembler, "_content_delta")
judged, assert_same = PATH.judged, PATH.assert_same


def _real_chat_bodies() -> dict[str, bytes]:
    bodies = {}
    for path in shared_files("*/bodies/**/*.sse") + shared_files("vercel-ai/openai-compatible/*.sse"):
        body = path.read_bytes()
        if sniff_dialect(body).dialect is CHAT:
            bodies[path.name] = body
    for path in shared_files("vercel-ai/**/*.chunks.txt"):
        lines = chunk_lines(path)
        try:
            first = orjson.loads(lines[0]) if lines else None
        except ValueError:
            continue
        if isinstance(first, dict) and "choices" in first:
            bodies[str(path.name)] = frame_chat(lines)
    return bodies


def test_real_captures_whole_and_cut_are_judged_alike():
    PATH.assert_captures_alike(_real_chat_bodies(), sse_spans, least=100, absent="no Chat Completions capture")


# -- generated streams ------------------------------------------------------------------------------
FRAGMENTS = ["Hello", " world", "", 'say "hi"', "back\\slash", "line\nbreak", "é\U0001f600", "\u2028", " ", "x" * 40]
OPS = ["content"] * 8 + ["role", "role_content", "finish", "id_change", "no_id", "empty_id", "error_chunk",
                         "error_event", "usage", "usage_empty_delta", "tool", "reasoning", "done", "bad_index",
                         "no_index", "obfuscation", "not_json", "array", "blank", "model_change", "style"]


def generated_stream(ops: list[tuple[str, int, int]], seed: int) -> bytes:
    """SSE bytes for a sequence of (operation, choice, fragment number)."""
    rng = random.Random(seed)
    styles = STYLES
    style = styles[0]
    out = []

    def chunk(choice: dict | None, *, id_="chatcmpl-gen", model="gpt-gen", **extra) -> dict:
        obj = {"id": id_, "object": "chat.completion.chunk", "created": 1770000000, "model": model, **extra}
        obj["choices"] = [] if choice is None else [choice]
        return obj

    def content(index, text, **kwargs) -> dict:
        return {"index": index, "delta": {"content": text, **kwargs}, "logprobs": None, "finish_reason": None}

    for op, index, number in ops:
        text = FRAGMENTS[number % len(FRAGMENTS)]
        event = None
        if op == "content":
            obj = chunk(content(index, text))
        elif op == "role":
            obj = chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        elif op == "role_content":
            obj = chunk(content(index, text, role="assistant"))
        elif op == "finish":
            obj = chunk({"index": index, "delta": {}, "finish_reason": rng.choice(["stop", "length", "tool_calls"])})
        elif op == "id_change":
            obj = chunk(content(index, text), id_="chatcmpl-other")
        elif op == "no_id":
            obj = chunk(content(index, text))
            del obj["id"]
        elif op == "empty_id":
            obj = chunk(content(index, text), id_="")
        elif op == "error_chunk":
            obj = chunk(content(index, text), error={"message": "overloaded", "type": "server_error"})
        elif op == "error_event":
            obj, event = chunk(content(index, text)), "error"
        elif op == "usage":
            obj = chunk(None, usage={"prompt_tokens": 3, "completion_tokens": number, "total_tokens": 3 + number})
        elif op == "usage_empty_delta":
            obj = chunk({"index": index, "delta": {"content": ""}, "finish_reason": None},
                        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
        elif op == "tool":
            obj = chunk({"index": index, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {
                "name": "f", "arguments": '{"a": 1}'}}]}, "finish_reason": None})
        elif op == "reasoning":
            obj = chunk({"index": index, "delta": {"reasoning_content": text or "r"}, "finish_reason": None})
        elif op == "done":
            out.append(b"data: [DONE]\n\n")
            continue
        elif op == "bad_index":
            obj = chunk(content(rng.choice([-1, 200, "1", None, True]), text))
        elif op == "no_index":
            obj = chunk(content(index, text))
            del obj["choices"][0]["index"]
        elif op == "obfuscation":
            obj = chunk(content(index, text), obfuscation="x" * (number % 5))
        elif op == "not_json":
            out.append(b'data: {"id": "chatcmpl-gen", "choices": [\n\n')
            continue
        elif op == "array":
            out.append(b"data: [1, 2]\n\n")
            continue
        elif op == "blank":
            out.append(b"data: \n\n")
            continue
        elif op == "model_change":
            obj = chunk(content(index, text), model="gpt-other")
        else:  # "style": later chunks are serialised another way
            style = styles[number % len(styles)]
            continue
        head = b"event: " + event.encode() + b"\n" if event else b""
        out.append(head + b"data: " + style(obj).encode() + b"\n\n")
    return b"".join(out)


@settings(max_examples=400, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.integers(0, 30)), max_size=40),
    seed=st.integers(0, 1000),
    ending=st.sampled_from(["finish_done", "done", "none"]),
    chunk_size=st.sampled_from([None, 1, 5, 64]),
)
def test_generated_streams_are_judged_alike(ops, seed, ending, chunk_size):
    prologue = [("role", 0, 0), ("content", 0, 0), ("content", 0, 1)]
    epilogue = {"finish_done": [("finish", 0, 0), ("usage", 0, 9), ("done", 0, 0)], "done": [("done", 0, 0)],
                "none": []}[ending]
    assert_same(generated_stream(prologue + ops + epilogue, seed), chunk_size=chunk_size)


# the cases the brief of the fast path names, each one where a skipped parse would miss a rule
ADVERSARIAL = {
    "delta after finish": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("finish", 0, 0),
                           ("content", 0, 3), ("done", 0, 0)],
    "chunk id change": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("id_change", 0, 1),
                        ("content", 0, 1), ("finish", 0, 0), ("done", 0, 0)],
    "second role start": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("role", 0, 0), ("content", 0, 1),
                          ("finish", 0, 0), ("done", 0, 0)],
    "error chunk": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("error_event", 0, 1),
                    ("content", 0, 1), ("done", 0, 0)],
    "content after [DONE]": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("finish", 0, 0),
                             ("done", 0, 0), ("content", 0, 1)],
    "two choices, one finished": [("role", 0, 0), ("role", 1, 0), ("content", 0, 0), ("content", 1, 1),
                                  ("content", 0, 0), ("finish", 1, 0), ("content", 1, 4), ("content", 0, 4),
                                  ("finish", 0, 0), ("done", 0, 0)],
    "index not yet a choice": [("role", 0, 0), ("content", 0, 0), ("content", 0, 1), ("content", 2, 1),
                               ("content", 2, 1), ("finish", 0, 0), ("finish", 2, 0), ("done", 0, 0)],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_streams_are_judged_alike(name):
    body = generated_stream(ADVERSARIAL[name], seed=1)
    hits = assert_same(body)
    assert hits >= 1, "the fast path was not exercised"
    _, verdict, _ = judged(body, fast=True)
    if name not in ("two choices, one finished", "index not yet a choice"):
        assert verdict["kind"] in ("corrupt", "errored"), verdict
