"""Chat Completions content deltas without a JSON parse.

Nearly every event of an OpenAI-style chat stream is the same chunk with another text
fragment: ``{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
"choices":[{"index":0,"delta":{"content":"<fragment>"},"logprobs":null,
"finish_reason":null}],"obfuscation":"<padding>"}``. Only the fragment (and OpenAI's
``obfuscation`` padding, a string of random length the assembler never reads) changes
from event to event, so the characters before the fragment (the prefix), between it and
the padding (the middle) and after the padding (the tail) repeat exactly.

``ContentDeltas`` learns that layout from one chunk the assembler has parsed fully, and
then takes the fragment of a later chunk straight from the text: when the data starts
with the learned prefix, ends with the learned tail, holds the middle in between, and
what lies around it are well-formed JSON string bodies, the chunk parses to the learned
object with only the fragment (and the padding) replaced: the string literals' bounds are
where they were, so every other token is the same. The fragment is then the body as is
(no quote, backslash or control character in it), or the decoding of that one string
literal. Anything else returns None, and the caller parses the chunk fully, as before.

A layout is learnt only from a chunk whose every field the assembler reads says "plain
text fragment": no error, no usage, one choice whose delta is ``{"content": str}`` (other
delta keys may be present only as ``null``, which the assembler reads as absent: DeepSeek
sends ``"reasoning_content":null`` beside the text) and no finish reason. Learning checks
itself: the layout around sentinels must parse to the parsed chunk with the sentinels as
its fragment and padding, and must give back the learnt chunk's own fragment.

How an assembler uses it (providers/openai_chat.py is the one it is written for): after
the ``[DONE]`` and blank-data checks, for an event whose SSE type is not ``error``, call
``content(data)``; on a hit, resolve the choice index as for a parsed chunk and append the
fragment as text, nothing else (the learnt chunk already set model, id and response id,
and a chunk in its layout carries the same values). After a full parse, call
``learn(data, obj)`` only when that chunk changed nothing but its fragment (no error, and
its id was the stream's id, so no corruption was noted that later chunks must repeat).
"""

from __future__ import annotations

from typing import Any

import orjson

_SENTINEL = "streamtap-fastpath-sentinel-0d1f"
_PADDING_SENTINEL = "streamtap-fastpath-padding-7c2e"
_PADDING = '"obfuscation"'  # OpenAI's per-chunk padding (stream_options.include_obfuscation)
_MAX_LEARNS = 8  # chunks that do not fit after this many layouts are simply parsed


class ContentDeltas:
    """One stream's plain content chunks: ``learn`` from a parsed chunk, then ``content``."""

    __slots__ = ("_prefix", "_middle", "_tail", "_index", "_learns")

    def __init__(self) -> None:
        self._prefix: str | None = None
        self._middle: str | None = None  # None: no padding, ``_tail`` follows the fragment
        self._tail = ""
        self._index: Any = None
        self._learns = 0

    def content(self, data: str) -> tuple[Any, str] | None:
        """(the choice's raw ``index``, the text fragment) of a chunk in the learnt layout,
        exactly what a full parse gives; None when ``data`` is not in that layout."""
        prefix = self._prefix
        if prefix is None or not data.startswith(prefix):
            return None
        tail = self._tail
        if not data.endswith(tail) or len(data) < len(prefix) + len(tail):
            return None
        end = len(data) - len(tail)
        middle = self._middle
        if middle is not None:
            at = data.rfind(middle, len(prefix), end)
            if at < 0:
                return None
            padding = data[at + len(middle) : end]
            if '"' in padding or "\\" in padding or not padding.isprintable():
                return None  # a padding the assembler never reads, but it must be a plain string body
            end = at
        body = data[len(prefix) : end]
        if '"' not in body and "\\" not in body and body.isprintable():
            return self._index, body  # printable: no control character, which JSON forbids raw
        try:
            text = orjson.loads('"' + body + '"')
        except ValueError:
            return None  # also where ``rfind`` met the middle inside the fragment: the quote before it is bare
        if type(text) is not str:  # cannot happen for a quoted body, but never guess
            return None
        return self._index, text

    def learn(self, data: str, obj: Any) -> bool:
        """Learn the layout of ``data``, which parsed to ``obj``, if it is a plain content
        chunk. Returns whether ``content`` now knows it."""
        if self._learns >= _MAX_LEARNS or not _plain_chunk(obj):
            return False
        self._learns += 1
        fragment = obj["choices"][0]["delta"]["content"]
        padded = type(obj.get("obfuscation")) is str
        try:
            expected = orjson.loads(data)
        except ValueError:  # read by the json module (a lone surrogate escape): no layout to learn
            return False
        expected["choices"][0]["delta"]["content"] = _SENTINEL
        if padded:
            expected["obfuscation"] = _PADDING_SENTINEL
        at = data.find('"content"')
        while at >= 0:
            layout = _layout_at(data, at + len('"content"'))
            if layout is not None:
                prefix, suffix = layout
                for middle, tail in _padding_splits(suffix) if padded else [(None, suffix)]:
                    text = prefix + _SENTINEL + (suffix if middle is None else middle + _PADDING_SENTINEL + tail)
                    try:
                        candidate = orjson.loads(text)
                    except ValueError:
                        continue
                    if candidate == expected:
                        self._prefix, self._middle, self._tail = prefix, middle, tail
                        self._index = obj["choices"][0].get("index")
                        if self.content(data) == (self._index, fragment):
                            return True
                        self._prefix = None  # never trust a layout that does not give back its own chunk
                        return False
            at = data.find('"content"', at + 1)
        return False


def _plain_chunk(obj: Any) -> bool:
    """Is ``obj`` a chunk whose only effect on the turn is one text fragment?"""
    if type(obj) is not dict or "error" in obj or "x_groq" in obj or obj.get("usage") is not None:
        return False
    if obj.get("object") == "error":
        return False
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return False
    choice = choices[0]
    delta = choice.get("delta")
    return (
        type(delta) is dict
        and type(delta.get("content")) is str
        and all(value is None for key, value in delta.items() if key != "content")
        and not choice.get("finish_reason")
        and type(choice.get("index", 0)) is int
    )


def _padding_splits(suffix: str) -> list[tuple[str, str]]:
    """Every (middle, tail) the suffix splits into around the string value of a padding key."""
    splits = []
    at = suffix.find(_PADDING)
    while at >= 0:
        layout = _layout_at(suffix, at + len(_PADDING))
        if layout is not None:
            splits.append(layout)
        at = suffix.find(_PADDING, at + 1)
    return splits


def _layout_at(data: str, after_key: int) -> tuple[str, str] | None:
    """The prefix up to and including the opening quote of the string value that follows
    the key ending at ``after_key``, and the suffix from its closing quote on."""
    pos = after_key
    while pos < len(data) and data[pos] in " \t\r\n":
        pos += 1
    if data[pos : pos + 1] != ":":
        return None
    pos += 1
    while pos < len(data) and data[pos] in " \t\r\n":
        pos += 1
    if data[pos : pos + 1] != '"':
        return None
    start = pos + 1
    pos = start
    while pos < len(data):  # the closing quote: the first one not escaped
        char = data[pos]
        if char == "\\":
            pos += 2
            continue
        if char == '"':
            return data[:start], data[pos:]
        pos += 1
    return None
