"""Text deltas without a JSON parse: Chat Completions content, ConverseStream text, Anthropic deltas.

Nearly every event of an OpenAI-style chat stream is the same chunk with another text
fragment: ``{"id":"chatcmpl-…","object":"chat.completion.chunk","created":…,"model":…,
"choices":[{"index":0,"delta":{"content":"<fragment>"},"logprobs":null,
"finish_reason":null}],"obfuscation":"<padding>"}``. Only the fragment (and OpenAI's
``obfuscation`` padding, a string of random length the assembler never reads) changes
from event to event, so the characters before the fragment (the prefix), between it and
the padding (the middle) and after the padding (the tail) repeat exactly. Bedrock's
ConverseStream text deltas have the same build:
``{"contentBlockIndex":0,"delta":{"text":"<fragment>"},"p":"<padding>"}``.

``ContentDeltas`` learns that layout from one chunk the assembler has parsed fully, and
then takes the fragment of a later chunk straight from the text: when the data starts
with the learned prefix, ends with the learned tail, holds the middle in between, and
what lies around it are well-formed JSON string bodies, the chunk parses to the learned
object with only the fragment (and the padding) replaced: the string literals' bounds are
where they were, so every other token is the same. The fragment is then the body as is
(no quote, backslash or control character in it), or the decoding of that one string
literal. Anything else returns None, and the caller parses the chunk fully, as before.

A layout is learnt only from a chunk whose every field the assembler reads says "plain
text fragment" (``DeltaShape.plain``). For chat: no error, no usage, one choice whose delta is
``{"content": str}`` (other delta keys may be present only as ``null``, which the assembler
reads as absent: DeepSeek sends ``"reasoning_content":null`` beside the text) and no finish
reason. For ConverseStream: an integer block index, a delta that is ``{"text": str}``, the
padding, and nothing else. For Anthropic: the event type, an integer index and a delta of its
type and fragment alone. The fragment's key and the padding's must each stand once in the text
(a key written twice, whose last value the parse keeps, teaches nothing). Learning checks
itself: the layout around sentinels must parse to the parsed chunk with the sentinels as its
fragment and padding, and must give back the learnt chunk's own fragment.

How an assembler uses it (providers/openai_chat.py, bedrock_converse.py, anthropic.py): for an
event the full path would hand to the same handler, call ``content(data)``; on a hit, take the
fragment only where the state makes it a plain append (the index is an open block or choice of
the fragment's kind), else parse as before. After a full parse, call ``learn(data, obj)``: a
layout fixes the JSON, and the state is checked at each hit. The chat assembler learns only from
a chunk that raised no finding and carried the stream's chunk id, which its hits do not check
again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

_SENTINEL = "streamtap-fastpath-sentinel-0d1f"
_PADDING_SENTINEL = "streamtap-fastpath-padding-7c2e"
_MAX_LEARNS = 8  # chunks that do not fit after this many layouts are simply parsed


@dataclass(frozen=True)
class DeltaShape:
    """Where a dialect's plain text delta keeps its fragment, its index and its padding."""

    key: str  # the fragment's member name
    padding: str | None  # the top-level member a provider pads chunks with, never read by the assembler
    plain: Callable[[Any], bool]  # is a parsed chunk one whose only effect is its fragment?
    holder: Callable[[Any], dict]  # the object that holds the fragment under ``key``
    index: Callable[[Any], Any]  # the raw index the fragment belongs to

    @property
    def quoted_key(self) -> str:
        return '"' + self.key + '"'

    @property
    def quoted_padding(self) -> str:
        return '"' + (self.padding or "") + '"'


class ContentDeltas:
    """One stream's plain content chunks: ``learn`` from a parsed chunk, then ``content``."""

    __slots__ = ("_shape", "_prefix", "_middle", "_tail", "_index", "_learns")

    def __init__(self, shape: DeltaShape | None = None) -> None:
        self._shape = shape or CHAT
        self._prefix: str | None = None
        self._middle: str | None = None  # None: no padding, ``_tail`` follows the fragment
        self._tail = ""
        self._index: Any = None
        self._learns = 0

    def content(self, data: str) -> tuple[Any, str] | None:
        """(the raw index, a choice's or a block's, the text fragment) of a chunk in the learnt layout,
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
        shape = self._shape
        if self._learns >= _MAX_LEARNS or not shape.plain(obj):
            return False
        if self.content(data) is not None:  # the layout it has (a hit the caller's state declined)
            return True
        self._learns += 1
        key, padding = shape.quoted_key, shape.quoted_padding
        padded = shape.padding is not None and type(obj.get(shape.padding)) is str
        # One place for the fragment and one for the padding, or no layout: a key written twice
        # (the parse keeps the last) could pass the check below on the wrong one, and trying every
        # place costs a parse each, which a chunk full of them makes quadratic.
        if data.count(key) != 1 or (padded and data.count(padding) != 1):
            return False
        fragment = shape.holder(obj)[shape.key]
        try:
            expected = orjson.loads(data)
        except ValueError:  # read by the json module (a lone surrogate escape): no layout to learn
            return False
        shape.holder(expected)[shape.key] = _SENTINEL
        if padded:
            expected[shape.padding] = _PADDING_SENTINEL
        layout = _layout_at(data, data.find(key) + len(key))
        if layout is None:
            return False
        prefix, suffix = layout
        if padded:
            split = _layout_at(suffix, suffix.find(padding) + len(padding)) if padding in suffix else None
            if split is None:  # the padding stands before the fragment: not a layout this class reads
                return False
            middle, tail = split
            text = prefix + _SENTINEL + middle + _PADDING_SENTINEL + tail
        else:
            middle, tail = None, suffix
            text = prefix + _SENTINEL + suffix
        try:
            candidate = orjson.loads(text)
        except ValueError:
            return False
        if candidate != expected:
            return False
        self._prefix, self._middle, self._tail = prefix, middle, tail
        self._index = shape.index(obj)
        if self.content(data) == (self._index, fragment):
            return True
        self._prefix = None  # never trust a layout that does not give back its own chunk
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


def _plain_converse_delta(obj: Any) -> bool:
    """Is ``obj`` a ConverseStream ``contentBlockDelta`` whose only effect is one text fragment?"""
    if type(obj) is not dict or not obj.keys() <= {"contentBlockIndex", "delta", "p"}:
        return False
    delta = obj.get("delta")
    return (
        type(obj.get("contentBlockIndex")) is int
        and type(delta) is dict
        and delta.keys() == {"text"}
        and type(delta["text"]) is str
        and type(obj.get("p", "")) is str
    )


def _plain_anthropic_delta(delta_type: str, key: str) -> Callable[[Any], bool]:
    """Is ``obj`` an Anthropic ``content_block_delta`` whose only effect is one ``delta_type`` fragment?"""

    def plain(obj: Any) -> bool:
        if type(obj) is not dict or obj.keys() != {"type", "index", "delta"} or obj["type"] != "content_block_delta":
            return False
        delta = obj["delta"]
        return (
            type(obj["index"]) is int
            and type(delta) is dict
            and delta.keys() == {"type", key}
            and delta["type"] == delta_type
            and type(delta[key]) is str
        )

    return plain


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


# OpenAI's per-chunk padding is ``obfuscation`` (stream_options.include_obfuscation)
CHAT = DeltaShape("content", "obfuscation", _plain_chunk, lambda obj: obj["choices"][0]["delta"],
                  lambda obj: obj["choices"][0].get("index"))
# Bedrock pads each ConverseStream event with ``p``
CONVERSE = DeltaShape("text", "p", _plain_converse_delta, lambda obj: obj["delta"],
                      lambda obj: obj["contentBlockIndex"])

# Anthropic sends no padding: ``{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"…"}}``
ANTHROPIC = {
    delta_type: DeltaShape(key, None, _plain_anthropic_delta(delta_type, key), lambda obj: obj["delta"],
                           lambda obj: obj["index"])
    for delta_type, key in (("text_delta", "text"), ("input_json_delta", "partial_json"), ("thinking_delta", "thinking"))
}
