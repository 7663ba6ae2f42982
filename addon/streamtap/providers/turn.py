"""The structured turn and its verdict: what every provider dialect assembles into.

A turn is never a flat string. Blocks keep the provider's order and their own kind, so
thinking never leaks into the answer and two text blocks with a tool call between
them stay two blocks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Dialect(StrEnum):
    OPENAI_CHAT = "openai-chat"
    OPENAI_RESPONSES = "openai-responses"
    ANTHROPIC = "anthropic"
    BEDROCK_INVOKE = "bedrock-invoke"
    BEDROCK_CONVERSE = "bedrock-converse"
    GEMINI = "gemini"
    OLLAMA = "ollama"
    UNKNOWN = "unknown"


class VerdictKind(StrEnum):
    COMPLETE = "complete"
    TRUNCATED = "truncated"  # no terminal signal: the transport was cut
    STOPPED_BY_LIMIT = "stopped_by_limit"  # max_tokens / length / MAX_TOKENS
    FILTERED = "filtered"  # content filter, safety, refusal, guardrail
    ERRORED = "errored"  # in-band error, exception frame, HTTP error status
    CORRUPT = "corrupt"  # the stream stopped making sense
    UNKNOWN = "unknown"


class BlockKind(StrEnum):
    TEXT = "text"
    THINKING = "thinking"
    REDACTED_THINKING = "redacted_thinking"
    TOOL_CALL = "tool_call"
    SERVER_TOOL = "server_tool"  # server-side tool use or result (web search, code execution, ...)
    REFUSAL = "refusal"
    OTHER = "other"  # a block type this version does not model (compaction, fallback, ...): kept whole in extra


class StreamEnd(StrEnum):
    """How the bytes stopped arriving, as the adapter saw it."""

    FINISHED = "finished"  # the upstream ended the body properly
    UPSTREAM_RESET = "upstream_reset"  # reset, error or timeout mid-body
    CLIENT_ABORTED = "client_aborted"  # the client went away: not the provider's fault
    PROXY_ENDED = "proxy_ended"  # mitmproxy or an addon ended it (a kill, body_size_limit): not the provider's fault


@dataclass(slots=True)
class Block:
    kind: BlockKind
    index: int  # position in the choice's block list
    text: str = ""  # text, thinking, refusal
    signature: str | None = None  # thinking signature
    data: str | None = None  # redacted thinking payload
    id: str | None = None  # tool call / server tool id
    name: str | None = None  # tool name
    arguments_raw: str | None = None  # exact concatenation of argument fragments
    arguments: Any = None  # parsed arguments (None until the block closed and parsed)
    arguments_error: str | None = None  # why arguments_raw did not parse
    citations: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # provider fields worth keeping (server tool content, ...)
    closed: bool = False  # the provider said the block ended


@dataclass(slots=True)
class Choice:
    index: int
    blocks: list[Block] = field(default_factory=list)
    stop_reason: str | None = None  # the provider's raw value for this choice


@dataclass(slots=True)
class Usage:
    input: int | None = None
    output: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    reasoning: int | None = None
    total: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Timing:
    """Seconds since the response started (the first response byte is not 0: headers came first)."""

    first_byte: float | None = None
    first_content: float | None = None
    last_byte: float | None = None
    arrivals: list[float] = field(default_factory=list)  # per wire event, in seq order


@dataclass(slots=True)
class Turn:
    dialect: Dialect
    model: str | None = None
    response_id: str | None = None
    choices: list[Choice] = field(default_factory=lambda: [Choice(0)])
    stop_reason: str | None = None  # normalized: end_turn, tool_use, max_tokens, filtered, error, ...
    stop_reason_raw: str | None = None
    usage: Usage = field(default_factory=Usage)
    error: dict[str, Any] | None = None  # {source, type, code, message}
    timing: Timing = field(default_factory=Timing)
    # events fed to the dialect's assembler: the count stops where the session stops assembling
    # (MAX_BLOCKS, a bug); Analysis.wire_events counts every event of the stream
    events: int = 0
    notes: list[str] = field(default_factory=list)  # unknown event types and other things worth a look
    extra: dict[str, Any] = field(default_factory=dict)  # provider fields worth keeping (stop details, metrics, ...)

    @property
    def blocks(self) -> list[Block]:
        return self.choices[0].blocks

    def text(self, choice: int = 0) -> str:
        return "".join(b.text for b in self.choices[choice].blocks if b.kind is BlockKind.TEXT)

    def thinking(self, choice: int = 0) -> str:
        return "".join(b.text for b in self.choices[choice].blocks if b.kind is BlockKind.THINKING)

    def tool_calls(self, choice: int = 0) -> list[Block]:
        return [b for b in self.choices[choice].blocks if b.kind is BlockKind.TOOL_CALL]

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


# how an unknown verdict begins once streamtap stopped reading the turn (a bound passed, an
# assembler failed): nothing after that event is judged, and positions.py reads it so
NOT_JUDGED = "streamtap could not judge this stream"


@dataclass(slots=True)
class Verdict:
    kind: VerdictKind
    reason: str  # one line, for a human
    seq: int | None = None  # the wire event where the stream stopped making sense
    offset: int | None = None  # its byte offset
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.kind is VerdictKind.COMPLETE

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


# values _plain gives back as they are; exact types, so a StrEnum (a str) still becomes its value
_LEAVES = frozenset((str, int, float, bool, type(None)))


def _plain(obj: Any) -> Any:
    """Dataclasses as dicts and enums as their values, the rest as it is, with an explicit stack:
    tool arguments nest as deep as the decoders read them (orjson 1024 levels, the json module
    after it a little deeper), past Python's recursion limit."""
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(root, 0, obj)]  # (container, key, value to convert into it)
    while todo:
        into, key, value = todo.pop()
        if type(value) in _LEAVES:
            into[key] = value
        elif isinstance(value, StrEnum):
            into[key] = value.value
        elif isinstance(value, list):
            into[key] = node = list(value)
            todo.extend((node, i, x) for i, x in enumerate(value) if type(x) not in _LEAVES)
        elif isinstance(value, dict):
            into[key] = node = dict(value)  # the keys in their order; values not plain yet are replaced below
            todo.extend((node, k, v) for k, v in value.items() if type(v) not in _LEAVES)
        elif dataclasses.is_dataclass(value):
            into[key] = node = {}
            for f in dataclasses.fields(value):
                node[f.name] = None  # the fields in their order
                todo.append((node, f.name, getattr(value, f.name)))
        else:
            into[key] = value
    return root[0]
