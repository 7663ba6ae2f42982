"""Two streams that claim the same turn (a retry, a reconnect, a resumed collection).

Compared as turns, block by block. Identical up to where the shorter ends means the
longer is a continuation; any difference is ``divergent``, located at the first
differing block and character. Longer is not righter: nothing is picked or stitched.

Gemini builds a streamed call's arguments path by path (``partialArgs``), and its
``arguments_raw`` is them written out so far, strings and braces closed: never a prefix of
the whole. While such a call is open its arguments are compared as values instead: a string
may have grown, an object gained keys after its own, an array slots after its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .common import common_prefix
from .judge import ARGUMENT_KINDS
from .turn import Block, BlockKind, Dialect, Turn


@dataclass(slots=True, frozen=True)
class StrandComparison:
    kind: str  # "identical" | "continuation" | "divergent"
    reason: str
    longer: str | None = None  # "a" or "b" for a continuation
    choice: int | None = None  # where they first differ (divergent), or where the shorter ends
    block: int | None = None
    offset: int | None = None  # character offset inside that block's payload

    @property
    def divergent(self) -> bool:
        return self.kind == "divergent"


def _payload(block: Block) -> str:
    if block.kind in ARGUMENT_KINDS:  # a server tool's input too (web search query, code to run)
        return block.arguments_raw or ""
    if block.kind is BlockKind.REDACTED_THINKING:
        return block.data or ""
    return block.text


# blocks whose content a dialect may keep in ``extra`` alone (Gemini's executableCode,
# codeExecutionResult, inlineData): compared there once both ended
_KEPT_IN_EXTRA = frozenset({BlockKind.SERVER_TOOL, BlockKind.OTHER})


def _canonical(extra: dict) -> str:
    return json.dumps(extra, sort_keys=True, default=str)


def _signatures(block: Block) -> set[str]:
    """Every signature a thinking block was issued under (Responses re-encrypts it in the final response)."""
    earlier = block.extra.get("earlier_signatures")
    return {block.signature, *(earlier if isinstance(earlier, list) else [])} - {None}


# dialects whose streamed tool calls build their arguments path by path
_BUILT_BY_PATH = frozenset({Dialect.GEMINI})


def _first_difference(short: Any, long: Any) -> str | None:
    """The JSONPath where ``long`` cannot have grown out of ``short`` (arguments built path by path,
    one of them still open), or None when it can. A later part appends to a string and adds keys
    and array slots after the others; a number, boolean or null arrives whole."""
    stack: list[tuple[str, Any, Any, bool]] = [("$", short, long, False)]
    while stack:  # not recursive: arguments may be as deep as JSON readers take
        path, s, l, open_slot = stack.pop()
        if open_slot and s is None:
            continue  # a slot made for a later index and not filled yet, or a null: they look alike
        if isinstance(s, dict):
            if not isinstance(l, dict):
                return path
            later = iter(l)
            for key in s:  # keys keep the order they came in, and new ones come after
                if next(later, None) != key:
                    return _step(path, key)
            stack.extend((_step(path, key), value, l[key], False) for key, value in reversed(s.items()))
        elif isinstance(s, list):
            if not isinstance(l, list) or len(l) < len(s):
                return path
            stack.extend((f"{path}[{i}]", s[i], l[i], i < len(s) - 1) for i in reversed(range(len(s))))
        elif isinstance(s, str):
            if not (isinstance(l, str) and l.startswith(s)):
                return path
        elif type(s) is not type(l) or s != l:
            return path
    return None


def _step(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _grown(x: Block, y: Block) -> tuple[str | None, str]:
    """Which of two blocks of a call built path by path ends first ("a" for ``x``, "b" for ``y``),
    or None with the JSONPath where they differ. Only an open one can be the shorter."""
    where = None
    for side, short, long in (("a", x, y), ("b", y, x)):
        if not short.closed:
            found = _first_difference(short.arguments, long.arguments)
            if found is None:
                return side, ""
            where = where or found
    return None, where or "$"


def _header(block: Block) -> tuple:
    return (block.kind, block.id, block.name) if block.kind is not BlockKind.TEXT else (block.kind,)


def compare_strands(a: Turn, b: Turn) -> StrandComparison:
    """Compare two turns block by block (every choice)."""
    shorter_side: str | None = None  # which strand ended first, once known
    shorter_at: tuple[int, int, int] | None = None
    by_path = a.dialect in _BUILT_BY_PATH and b.dialect in _BUILT_BY_PATH
    for ci in range(max(len(a.choices), len(b.choices))):
        blocks_a = a.choices[ci].blocks if ci < len(a.choices) else []
        blocks_b = b.choices[ci].blocks if ci < len(b.choices) else []
        for bi in range(max(len(blocks_a), len(blocks_b))):
            if bi >= len(blocks_a) or bi >= len(blocks_b):
                side = "a" if bi >= len(blocks_a) else "b"
                if shorter_side not in (None, side):
                    return _diverge(ci, bi, 0, "each strand has content the other lacks")
                shorter_side = side
                shorter_at = shorter_at or (ci, bi, 0)
                break
            x, y = blocks_a[bi], blocks_b[bi]
            if _header(x) != _header(y):
                return _diverge(ci, bi, 0, f"block {bi} is {_describe(x)} in a but {_describe(y)} in b")
            if x.kind is BlockKind.THINKING and x.signature and y.signature and not _signatures(x) & _signatures(y):
                return _diverge(ci, bi, 0, f"block {bi} thinking signatures differ")
            if x.closed and y.closed and x.kind in _KEPT_IN_EXTRA and _canonical(x.extra) != _canonical(y.extra):
                return _diverge(ci, bi, 0, f"block {bi} ({x.kind}) differs in what it carries")
            pa, pb = _payload(x), _payload(y)
            if pa == pb:
                continue
            at = common_prefix(pa, pb)
            if by_path and x.kind is BlockKind.TOOL_CALL and not (x.closed and y.closed) and \
                    isinstance(x.arguments, dict) and isinstance(y.arguments, dict):
                side, where = _grown(x, y)
                if side is None:
                    return _diverge(ci, bi, at, f"block {bi} ({x.kind}) arguments differ at {where}")
            elif at < min(len(pa), len(pb)):
                return _diverge(ci, bi, at, f"block {bi} ({x.kind}) differs at character {at}")
            else:
                side = "a" if len(pa) < len(pb) else "b"
            last = bi == len(blocks_a if side == "a" else blocks_b) - 1
            if not last or shorter_side not in (None, side):
                return _diverge(ci, bi, at, f"block {bi} ({x.kind}) is cut short in {side} but {side} goes on")
            shorter_side = side
            shorter_at = shorter_at or (ci, bi, at)
    if shorter_side is None:
        return StrandComparison("identical", "the two strands carry the same blocks")
    longer = "b" if shorter_side == "a" else "a"
    ci, bi, at = shorter_at
    return StrandComparison(
        "continuation",
        f"{longer} continues {shorter_side}: identical up to where {shorter_side} ends (choice {ci}, block {bi}, character {at})",
        longer,
        ci,
        bi,
        at,
    )


def _diverge(choice: int, block: int, offset: int, reason: str) -> StrandComparison:
    return StrandComparison("divergent", reason, None, choice, block, offset)


def _describe(block: Block) -> str:
    if block.kind is BlockKind.TOOL_CALL:
        return f"tool call {block.name} ({block.id})"
    return str(block.kind)
