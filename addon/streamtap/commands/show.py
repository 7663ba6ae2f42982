"""`streamtap show FILE...`: render each turn (thinking, answer, tool calls), its verdict and timing."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from streamtap.cli import UsageError, terminal_safe
from streamtap.providers import Block, BlockKind, Choice, Dialect, Turn
from streamtap.providers.common import dumps

from .verify import (
    SHOW_KEEPS, Judged, Unjudged, add_input_options, check_sentinel, exit_code, judge_inputs, print_json, report_unjudged,
    shown_path,
)


RULE = "─"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Accepts raw bodies (.sse, .ndjson, .bin/.eventstream, .json array; others are sniffed) and "
        "streamtap recordings, and directories of them. Exit codes: 0 every input shown, 2 any input could not be "
        "read (said on its own line; the others are still shown). Example: streamtap show --provider openai-chat capture.sse"
    )
    add_input_options(parser)
    parser.add_argument("--width", type=int, default=100, help="wrap long lines at this width (default 100; 0: no wrapping)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every input was shown (whatever its verdict), 2 when any could not be read."""
    if args.width < 0:
        raise UsageError(f"--width: {args.width} is negative; give a width in characters, or 0 for no wrapping")
    check_sentinel(args.sentinel)
    shown, unjudged = 0, False
    for item in judge_inputs(args, SHOW_KEEPS):  # show prints every byte of text: nothing is dropped
        if isinstance(item, Unjudged):
            report_unjudged("show", item)
            unjudged = True
            continue
        if args.json:
            print_json(item)
            continue
        if shown:
            print()
        print(terminal_safe(render(item, args.width)), flush=True)
        shown += 1
    return exit_code(True, unjudged)


def _one(text: str) -> str:
    return terminal_safe(text, one_line=True)


def render(judged: Judged, width: int = 100) -> str:
    analysis, turn, verdict = judged.analysis, judged.analysis.turn, judged.analysis.verdict
    how = "from --provider" if judged.how == "--provider" else judged.how
    lines = [
        # every wire event, as the recordings' end lines count them (turn.events stops at MAX_BLOCKS)
        f"{_one(shown_path(judged.path))}  ({judged.source}, {analysis.wire}, {analysis.bytes} bytes, "
        f"{analysis.wire_events} events)",
        f"dialect   {turn.dialect}  ({how})",
    ]
    if turn.model or turn.response_id:  # one value each, from the provider: a newline in one would start a line
        lines.append(f"model     {_one(turn.model or '-')}   response {_one(turn.response_id or '-')}")
    where = []
    if verdict.seq is not None:
        where.append(f"seq {verdict.seq}")
    if verdict.offset is not None:
        where.append(f"byte {verdict.offset}")
    lines.append(f"verdict   {str(verdict.kind).upper()}: {_one(verdict.reason)}" + (f"  [{', '.join(where)}]" if where else ""))
    if judged.injected_fault:
        lines.append(f"injected  {_one(judged.injected_fault)} (streamtap's fault injection made this answer)")
    if judged.problem:
        lines.append(f"recording {_one(judged.problem)}")
    stop = turn.stop_reason or "-"
    lines.append(f"stop      {stop}" + (f" (provider: {_one(turn.stop_reason_raw)})" if turn.stop_reason_raw else ""))
    lines.append(f"usage     {_usage(turn)}")
    lines.append(f"timing    {_timing(turn)}")
    if turn.error:
        lines.append(f"error     {_one(str(turn.error.get('message')))}")
    for note in turn.notes[:5]:
        lines.append(f"note      {_one(note)}")
    for choice in turn.choices:
        if len(turn.choices) > 1:
            lines.append("")
            lines.append(f"═══ choice {choice.index} (stop {choice.stop_reason or '-'}) ═══")
        if not choice.blocks:
            lines.append("")
            lines.append("(no content)")
        for block in choice.blocks:
            lines.append("")
            title, body = _block(block, width, turn)
            lines.append(_heading(title, _unfinished(turn, choice, block)))
            lines.extend(body)
    return "\n".join(lines)


UNFINISHED = "UNFINISHED: the stream stopped inside it"


def _unfinished(turn: Turn, choice: Choice, block: Block) -> bool:
    """The provider never ended this block: it says so itself (``closed``), or its choice got no
    stop reason and it is the choice's last block (dialects whose blocks have no end event)."""
    if not block.closed:
        return True
    stopped = choice.stop_reason is not None or (turn.stop_reason is not None and len(turn.choices) == 1)
    return not stopped and block is choice.blocks[-1]


def _heading(title: str, unfinished: bool = False) -> str:
    if unfinished:
        title = f"{title} · {UNFINISHED}"
    return f"{RULE * 3} {title} {RULE * max(3, 60 - len(title))}"


def _wrap(text: str, width: int) -> list[str]:
    if width <= 0:
        return text.split("\n")
    out: list[str] = []
    for line in text.split("\n"):
        line = terminal_safe(line)  # before wrapping, which would turn a CR or a form feed into a space
        words = line.lstrip()
        indent = line[: len(line) - len(words)]
        if len(indent.expandtabs()) >= width // 2:  # no room left to wrap in (textwrap never returns past the width)
            out.append(line)
            continue
        out.extend(_Wrapper(width, initial_indent=indent, subsequent_indent=indent).wrap(words) or [line])
    return out


class _Wrapper(textwrap.TextWrapper):
    """textwrap, with a word longer than a line (CJK text, base64, minified JSON: no spaces) cut
    in one pass. textwrap cuts one line off it at a time and copies what is left each time, which
    takes minutes for a line of millions of characters."""

    def _handle_long_word(self, reversed_chunks: list[str], cur_line: list[str], cur_len: int, width: int) -> None:
        super()._handle_long_word(reversed_chunks, cur_line, cur_len, width)  # the part that fits this line
        rest, line = reversed_chunks[-1], max(self.width - len(self.subsequent_indent), 1)
        text_ends = len(rest.rstrip())  # textwrap drops a rest that is blank (str.isspace) whole
        pieces, start = [], 0
        while start < text_ends and len(rest) - start > line:
            # the cut textwrap makes on a fresh line depends only on the line's width + 1 characters
            cut: list[str] = []
            super()._handle_long_word([rest[start : start + line + 1]], cut, 0, line)
            pieces.append(cut[0])
            start += len(cut[0])
        if pieces:  # each a line of its own, as textwrap cuts them; the last may share its line
            # (a blank end stays too long to join that line, and is dropped as textwrap drops it)
            pieces.append(rest[start : start + line] if start >= text_ends else rest[start:])
            reversed_chunks[-1:] = reversed(pieces)


def _block(block: Block, width: int, turn: Turn) -> tuple[str, list[str]]:
    """The block's title and its lines."""
    kind = block.kind
    if kind is BlockKind.THINKING:
        title = "thinking" + (" (signed)" if block.signature else "")
        body = [f"│ {line}" for line in _wrap(block.text, width)] if block.text else ["│ (no visible text)"]
        return title, body
    if kind is BlockKind.REDACTED_THINKING:
        return "redacted thinking", [f"│ ({_encrypted(block.data, turn)})"]
    if kind is BlockKind.TEXT:
        return "answer", _wrap(block.text, width)
    if kind is BlockKind.REFUSAL:
        return "refusal", _wrap(block.text, width)
    if kind is BlockKind.TOOL_CALL:
        # the name and id are the provider's text: a newline in one would start a line of its own
        if block.extra.get("generated_id"):  # Gemini sends calls without ids: the app gets None
            title = f"tool call {_one(block.name or '?')} (no id from the provider; streamtap's {_one(block.id)})"
        else:
            title = f"tool call {_one(block.name or '?')}" + (f" (id {_one(block.id)})" if block.id else "")
        if block.arguments_error and not block.closed:  # cut: what came, however it reads
            args = [f"NOT PARSED ({block.arguments_error}):", block.arguments_raw or ""]
        elif block.arguments_error:
            args = [f"INVALID JSON ({block.arguments_error}):", block.arguments_raw or ""]
        elif block.arguments is not None:
            args = [dumps(block.arguments) if not isinstance(block.arguments, str) else block.arguments]
        else:
            args = [block.arguments_raw or ""]
        return title, [f"  {line}" for line in args]
    label = f"{kind} {_one(block.name or '')}".strip()
    summary = block.text or block.arguments_raw or ""
    return label, [f"  {line}" for line in _wrap(summary, width)] if summary else []


def _encrypted(data: Any, turn: Turn) -> str:
    """How much a redacted thinking block holds, in what the app gets: Anthropic's data is a string
    it gets as sent, Bedrock's redactedContent a blob of bytes, kept as the base64 of those bytes."""
    if data is None:
        return "no encrypted data"
    if not isinstance(data, str):  # a provider's data of another JSON type, handed to the app as it is
        return f"encrypted data that is not a string: {_one(dumps(data))[:40]}"
    if turn.dialect is Dialect.BEDROCK_CONVERSE or turn.extra.get("family") == "nova":
        padding = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
        return f"{len(data) * 3 // 4 - padding} bytes of encrypted data"
    return f"{len(data)} characters of encrypted data"


def _usage(turn: Turn) -> str:
    usage = turn.usage
    parts = [
        f"{name} {value}"
        for name, value in (
            ("in", usage.input),
            ("out", usage.output),
            ("reasoning", usage.reasoning),
            ("cache read", usage.cache_read),
            ("cache write", usage.cache_write),
            ("total", usage.total),
        )
        if value is not None
    ]
    return ", ".join(parts) or "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _timing(turn: Turn) -> str:
    timing = turn.timing
    if timing.first_byte is None and timing.last_byte is None:
        return "no arrival times (a raw body carries none; recordings do)"
    return (
        f"first byte {_seconds(timing.first_byte)}, first content {_seconds(timing.first_content)}, "
        f"last byte {_seconds(timing.last_byte)}, {len(timing.arrivals)} events timed"
    )
