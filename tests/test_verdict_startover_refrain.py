"""On a Chat Completions server that names the role on every chunk and gives the time in whole
seconds (Ollama's /v1), an answer's chunks come again byte for byte whenever its tokens do. A
replay stitched on after a cut at the p-th chunk brings back all p chunks before it, so only that
is taken for the answer starting over: an answer that opens a second code fence the way it opened
the first ("```", "python", "\\n") is complete."""

from __future__ import annotations

import orjson
import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes
from streamtap.providers.common import StartOver
from streamtap.providers.openai_chat import Assembler
from streamtap.wire import SSEDecoder


def ollama_chunk(content: str, finish_reason: str | None = None) -> bytes:
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
                         "model": "llama3.2", "system_fingerprint": "fp_ollama",
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": content},
                                      "finish_reason": finish_reason}]})


def sse(chunks: list[bytes]) -> bytes:
    return b"".join(b"data: " + chunk + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def answer(tokens: list[str]) -> list[bytes]:
    return [ollama_chunk(token) for token in tokens] + [ollama_chunk("", "stop")]


TWO_FENCES = answer(["```", "python", "\n", "print(1)", "\n", "```", "\n\nand again:\n\n",
                     "```", "python", "\n", "print(2)", "\n", "```"])
LONG = answer([f" word{n}" for n in range(100)])  # longer than StartOver.RECALLED


def test_an_answer_that_opens_a_second_code_fence_the_same_way_is_complete():
    analysis = analyze_bytes(sse(TWO_FENCES), Dialect.OPENAI_CHAT)
    assert analysis.verdict.kind is VerdictKind.COMPLETE, analysis.verdict
    assert analysis.turn.text(0) == "```python\nprint(1)\n```\n\nand again:\n\n```python\nprint(2)\n```"


@pytest.mark.parametrize(("name", "cut"), [
    ("two_fences", 3), ("two_fences", 5), ("two_fences", 7), ("two_fences", 8), ("two_fences", 12),
    ("long", 3), ("long", 40), ("long", 64), ("long", 65), ("long", 99),  # StartOver.RECALLED is 64
])
def test_the_answer_replayed_from_its_start_after_a_cut_is_not_complete(name, cut):
    chunks = {"two_fences": TWO_FENCES, "long": LONG}[name]
    verdict = analyze_bytes(sse(chunks[:cut] + chunks), Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "come again, byte for byte" in verdict.reason, verdict
    assert verdict.seq == cut, verdict


def test_a_start_that_comes_back_in_part_does_not_hide_the_replay_inside_it():
    """The answer's first chunk comes back at chunks 3 and 5, and its first three at 5: cut after
    chunk 7, the replay starts while the run from 5 still matches, and must be watched on its own."""
    chunks = answer(["Go", " left", ",", "Go", " now", "Go", " left", ",", "Go", " right", "."])
    assert analyze_bytes(sse(chunks), Dialect.OPENAI_CHAT).verdict.kind is VerdictKind.COMPLETE
    verdict = analyze_bytes(sse(chunks[:8] + chunks), Dialect.OPENAI_CHAT).verdict
    assert verdict.kind is VerdictKind.UNKNOWN and "come again, byte for byte" in verdict.reason, verdict
    assert verdict.seq == 8, verdict


def test_a_long_answer_keeps_a_bounded_number_of_its_first_chunks():
    assembler = Assembler()
    for event in SSEDecoder().feed(sse(answer([f" word{n}" for n in range(5000)]))):
        assembler.feed(event, None)
    start_over = assembler._start_over
    assert not start_over.busy  # past its first chunks, a chunk costs one comparison
    assert len(start_over._digests) == StartOver.RECALLED
