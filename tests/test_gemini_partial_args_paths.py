"""Gemini's streamed call arguments (``partialArgs``) build an object path by path: a path that
steps into the arguments with the wrong kind of step conflicts with them.

An index (``$[0]``) into the object the call built so far used to put an integer key in it,
which no JSON holds: the end of the turn then raised inside streamtap, and the verdict became
"internal error", even for a stream that had carried an in-band error. A name stepping into an
array raised an error the assembler did not expect. Both are now the stream contradicting itself.
"""

from __future__ import annotations

import json

import pytest

from streamtap.providers import Dialect, VerdictKind, analyze_bytes


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n" for chunk in chunks)


def parts(*items: dict, finish: str | None = None) -> dict:
    candidate = {"content": {"role": "model", "parts": list(items)}}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "responseId": "r1"}


def partial(path: str, value: str) -> dict:
    return {"functionCall": {"partialArgs": [{"jsonPath": path, "stringValue": value}], "willContinue": True}}


OPEN = parts({"functionCall": {"name": "weather", "willContinue": True}})
CITY = parts(partial("$.city", "Paris"))
CLOSE = parts({"functionCall": {}})
STOP = parts(finish="STOP")


@pytest.mark.parametrize("conflict", [
    parts(partial("$[0]", "x")),  # an index into the object
    parts(partial("$[0].a", "x")),  # an index, then a name
])
def test_an_index_into_the_arguments_object_is_corrupt(conflict):
    analysis = analyze_bytes(sse(OPEN, CITY, conflict, CLOSE, STOP), Dialect.GEMINI)
    assert analysis.verdict.kind is VerdictKind.CORRUPT, analysis.verdict
    assert "conflicts with the arguments so far" in analysis.verdict.reason
    assert "bug" not in analysis.verdict.evidence


def test_a_name_into_an_array_is_corrupt():
    items = parts(partial("$.days[0]", "mon"))
    analysis = analyze_bytes(sse(OPEN, items, parts(partial("$.days.first", "x")), CLOSE, STOP), Dialect.GEMINI)
    assert analysis.verdict.kind is VerdictKind.CORRUPT and "bug" not in analysis.verdict.evidence, analysis.verdict


def test_an_in_band_error_after_a_conflicting_path_is_still_errored_and_the_text_is_kept():
    text = parts({"text": "Here is the call."})
    text["usageMetadata"] = {"promptTokenCount": 5, "totalTokenCount": 9}
    error = {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
    analysis = analyze_bytes(sse(text, OPEN, CITY, parts(partial("$[0]", "x")), error), Dialect.GEMINI)
    assert analysis.verdict.kind is VerdictKind.ERRORED, analysis.verdict
    assert analysis.turn.text() == "Here is the call." and analysis.turn.usage.total == 9
