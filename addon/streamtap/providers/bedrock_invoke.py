"""Bedrock InvokeModelWithResponseStream: ``chunk`` frames carrying the model's own events.

Each ``:event-type chunk`` frame's payload is ``{"bytes": <base64>, "p": <padding>}``;
the decoded bytes are one JSON event in the model family's native format:
- Anthropic Claude: the Messages events (``type`` member) -> the Anthropic logic;
- Amazon Nova: ConverseStream-shaped events (``{"contentBlockDelta": {...}}``) -> the
  ConverseStream logic;
- Titan (``outputText``/``completionReason``), Llama (``generation``/``stop_reason``),
  Mistral (``outputs``), legacy Claude text completions (``completion``): one text block
  and the family's stop reason; the chunk carrying the stop reason is terminal.
Bedrock adds ``amazon-bedrock-invocationMetrics`` (token counts, latencies) to the last
chunk, and ``amazon-bedrock-guardrailAction`` when a guardrail is attached.

Choices this module makes:
- ``amazon-bedrock-guardrailAction: INTERVENED`` on any chunk makes an otherwise
  finished turn ``filtered``: the guardrail blocked or rewrote (masked) the output, so
  the text is not what the model produced. A stream cut before its end stays
  ``truncated``.
- Exception frames (``modelStreamErrorException``, ``throttlingException``, ...) are
  ``errored`` with the exception type, message and ``originalStatusCode``.
- Closed units as in the Anthropic and ConverseStream modules, but one invocation answers
  once: a second message after the first one ended is stitched on (corrupt), where those
  modules take messages back to back. For the plain text families the chunk carrying the
  stop reason closes the response, and any chunk after it is corrupt.
- A Nova chunk is one ConverseStream event: one that carries two of its members is corrupt (an
  app reads the one it looks for). A Mistral chunk with more than one output is read for the
  first, and a finished turn is then ``unknown``: the others' ends are not judged.
- A chunk of no known family among a known family's chunks makes a finished turn
  ``unknown``: what it carried cannot be told. Chunks of only Bedrock's own members
  (``amazon-bedrock-...``) are Bedrock's, not a model's.
"""

from __future__ import annotations

from typing import Any

from streamtap.wire import EventStreamMessage, WireEvent

from .anthropic import USAGE_FIELDS, MessageBuilder
from .judge import Judge, Pieces, as_text, decode_event_json, stop_verdict
from .bedrock_converse import ConverseBuilder, blob_bytes, event_frame, foreign_event
from .common import StartOver
from .turn import Block, BlockKind, Dialect, StreamEnd, Turn, Verdict, VerdictKind

_BEDROCK_PREFIX = "amazon-bedrock-"  # the members Bedrock adds to a model's chunks
_CONVERSE_KEYS = ("messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop",
                  "metadata")

# family -> (text member, stop member, stop reason table)
_TEXT_FAMILIES: dict[str, tuple[str, str, dict[str, tuple[VerdictKind, str]]]] = {
    "titan": ("outputText", "completionReason", {
        "FINISH": (VerdictKind.COMPLETE, "end_turn"),
        "STOP_CRITERIA_MET": (VerdictKind.COMPLETE, "stop_sequence"),
        "LENGTH": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
        "CONTENT_FILTERED": (VerdictKind.FILTERED, "filtered"),
    }),
    "llama": ("generation", "stop_reason", {
        "stop": (VerdictKind.COMPLETE, "end_turn"),
        "length": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
    }),
    "claude-text": ("completion", "stop_reason", {
        "stop_sequence": (VerdictKind.COMPLETE, "stop_sequence"),
        "end_turn": (VerdictKind.COMPLETE, "end_turn"),
        "max_tokens": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
    }),
    "mistral": ("text", "stop_reason", {
        "stop": (VerdictKind.COMPLETE, "end_turn"),
        "length": (VerdictKind.STOPPED_BY_LIMIT, "max_tokens"),
        "model_length": (VerdictKind.STOPPED_BY_LIMIT, "context_window"),
        "tool_calls": (VerdictKind.COMPLETE, "tool_use"),
    }),
}


def family_of(event: dict[str, Any]) -> str | None:
    kind = event.get("type")
    if kind == "completion" and "completion" in event:
        return "claude-text"  # Bedrock passes on Anthropic's text-completion event, its type member too
    if isinstance(kind, str):
        return "anthropic"
    if any(key in event for key in _CONVERSE_KEYS):
        return "nova"
    if "outputText" in event:
        return "titan"
    if "generation" in event:
        return "llama"
    if "completion" in event:
        return "claude-text"
    if isinstance(event.get("outputs"), list):
        return "mistral"
    return None


class TextFamilyBuilder:
    """One growing text block and a stop reason: the plain completion families."""

    def __init__(self, turn: Turn, judge: Judge, family: str) -> None:
        self.turn = turn
        self.judge = judge
        self.text_key, self.stop_key, self.table = _TEXT_FAMILIES[family]
        self.family = family
        self.block: Block | None = None
        self.pieces = Pieces(self.judge)
        self.terminal = False
        self.chunks = 0
        self.generated: float | None = None  # Llama's cumulative generation_token_count so far
        self.prompt_dropped = False  # a Llama chunk after the first came with prompt_token_count null

    def apply(self, event: dict[str, Any], seq: int | None, offset: int | None, t: float | None) -> None:
        if self.judge.reopened("the response", "a chunk", seq, offset):
            return
        if self.family == "mistral":
            outputs = event.get("outputs") or [{}]
            event = outputs[0] if isinstance(outputs[0], dict) else {}
        self.chunks += 1
        if self._begins_again(event, seq, offset):
            return
        text = event.get(self.text_key)
        if isinstance(text, str):
            if self.block is None:
                self.block = Block(BlockKind.TEXT, 0)
                self.turn.choices[0].blocks.append(self.block)
            self.pieces.content(self.block, text, t)
        usage = self.turn.usage
        for key, field in (("inputTextTokenCount", "input"), ("totalOutputTextTokenCount", "output"),
                           ("prompt_token_count", "input"), ("generation_token_count", "output")):
            value = event.get(key)
            if isinstance(value, (int, float)):
                setattr(usage, field, int(value))
                usage.raw[key] = value
        raw = as_text(event.get(self.stop_key))
        if raw is not None or (self.family == "titan" and event.get("totalOutputTextTokenCount") is not None):
            # Titan names the last chunk by its output count even when a guardrail blocked the
            # input and no completionReason came (the chunks before it carry the count as null)
            self.terminal = True
            self.judge.terminal_at = (seq, offset)
            self.judge.close("the response", f"the chunk with {self.stop_key}", seq, offset)
            if self.block is not None:
                self.block.closed = True
            self.judge.stop_reason(raw, self.table.get(raw, (None, raw))[1] if raw is not None else None)

    def _begins_again(self, event: dict[str, Any], seq: int | None, offset: int | None) -> bool:
        """A second generation before the first one's stop chunk (a cut attempt and its retry in
        one body): Titan and Llama count the input on an invocation's first chunk only, and Llama's
        count of generated tokens only grows."""
        if self.family == "titan" and self.chunks > 1 and event.get("inputTextTokenCount") is not None:
            self.judge.corrupt(f"inputTextTokenCount again at seq {seq}: Titan sends it with an invocation's first chunk "
                               "only, so a second generation begins here (spliced stream)", seq, offset)
            return True
        count = event.get("generation_token_count")
        counted = isinstance(count, (int, float)) and not isinstance(count, bool)
        if self.family == "llama" and self.chunks > 1:
            if event.get("prompt_token_count") is None:
                self.prompt_dropped = True
            elif event.get(self.stop_key) is None and (self.prompt_dropped or (
                    counted and self.generated is not None and count <= self.generated)):
                # Llama counts the prompt on an invocation's first chunk only (the stop chunk may
                # repeat it); where a server sends it on every chunk, the generated count still grows
                self.judge.corrupt(f"prompt_token_count again at seq {seq}: Llama sends it with an invocation's first "
                                   "chunk, so a second generation begins here (spliced stream)", seq, offset)
                return True
        if counted:
            if self.generated is not None and count < self.generated:
                self.judge.corrupt(f"generation_token_count falls from {self.generated:g} to {count:g} at seq {seq}: "
                                   "the count only grows, so a second generation begins here (spliced stream)", seq, offset,
                                   counts=[self.generated, count])
                return True
            self.generated = count
        return False

    def ended(self, what: str, seq: int | None, offset: int | None) -> bool:
        """True (and the stream is corrupt) when ``what`` came after the chunk with the stop reason."""
        return self.judge.reopened("the response", what, seq, offset)

    def verdict(self, end: StreamEnd) -> Verdict:
        self.pieces.flush()
        early = self.judge.early_verdict()
        if early is not None:
            return early
        if not self.terminal:
            return self.judge.truncated(f"no chunk carried {self.stop_key}", end)
        return stop_verdict(self.turn, self.judge, f"the last {self.family} chunk", self.table)


class Assembler:
    """Bedrock InvokeModelWithResponseStream over AWS event-stream frames."""

    # boto3 takes a body that stops short of its Content-Length for its end (botocore's urllib3
    # responses have enforce_content_length off): a cut there after the end signal costs the app nothing
    sdk_ignores_content_length = True

    dialect = Dialect.BEDROCK_INVOKE
    wire = "eventstream"

    def __init__(self) -> None:
        self.turn = Turn(Dialect.BEDROCK_INVOKE)
        self.judge = Judge(self.turn)
        self.family: str | None = None
        self.builder: MessageBuilder | ConverseBuilder | TextFamilyBuilder | None = None
        self.guardrail: tuple[int, int, Any] | None = None  # seq, offset, trace
        self.unknown_family: tuple[int, int] | None = None  # the first chunk of a family not known here
        self.more_outputs: tuple[int, int, int] | None = None  # the first Mistral chunk with more than one output
        # A plain completion family has no second message start to show a response replayed from its
        # start and stitched on: its chunks coming back byte for byte do (Bedrock pads each with a
        # random `p`, but a server that does not sends the same chunk for the same token: from the
        # third chunk on, as Chat Completions)
        self._start_over = StartOver(self, least=StartOver.KEPT)

    def feed(self, event: WireEvent, t: float | None) -> None:
        judge = self.judge
        if not isinstance(event, EventStreamMessage):
            foreign_event(event, judge)
            return
        if not event_frame(event, judge):
            return
        headers = event.headers
        if headers.get(":event-type") != "chunk":
            what = f"event type {headers.get(':event-type')!r}"
            if not self._ended(what, event):
                judge.note(f"{what} at seq {event.seq} is not a chunk")
            return
        payload = decode_event_json(event.payload, judge, event.seq, event.start, "chunk payload")
        if payload is None:
            return
        encoded = payload.get("bytes")
        if not isinstance(encoded, str):
            judge.corrupt("chunk payload without a base64 'bytes' member", event.seq, event.start)
            return
        try:
            decoded = blob_bytes(encoded, judge, "chunk bytes", event.seq)
        except ValueError as exc:
            judge.corrupt(f"chunk bytes are not base64 ({exc})", event.seq, event.start)
            return
        # a Claude tool_use block may come with its input whole: its integers are read exactly
        inner = decode_event_json(decoded, judge, event.seq, event.start, "decoded chunk", exact_integers=b'"input"' in decoded)
        if inner is None:
            return
        self._route(inner, event, t)

    def _route(self, inner: dict[str, Any], event: EventStreamMessage, t: float | None) -> None:
        judge = self.judge
        family = family_of(inner)
        if family is None:
            bedrock_only = bool(inner) and all(key.startswith(_BEDROCK_PREFIX) for key in inner)  # metrics, trace
            if self._ended("a chunk of Bedrock's own members" if bedrock_only else "a chunk of an unknown model family", event):
                return
            if bedrock_only:
                self._bedrock_fields(inner, event)
                return
            judge.note(f"chunk of an unknown model family at seq {event.seq}: {sorted(inner)[:5]}")
            self.unknown_family = self.unknown_family or (event.seq, event.start)
            return
        if self.family is None:
            self.family = family
            self.turn.extra["family"] = family
            # one invocation answers once: a second message after the first ended is stitched on
            if family == "anthropic":
                self.builder = MessageBuilder(self.turn, judge, one_response=True)
            elif family == "nova":
                self.builder = ConverseBuilder(self.turn, judge, one_response=True)
            else:
                self.builder = TextFamilyBuilder(self.turn, judge, family)
        elif family != self.family:
            judge.corrupt(f"a {family} chunk in a {self.family} stream", event.seq, event.start)
            return
        builder = self.builder
        if isinstance(builder, ConverseBuilder):
            kinds = [key for key in _CONVERSE_KEYS if key in inner]
            if len(kinds) > 1:  # an app reads the member it looks for, streamtap another: they disagree
                judge.corrupt(f"one chunk carries {' and '.join(kinds)}: a ConverseStream event is one of them",
                              event.seq, event.start)
                return
            kind = kinds[0]
            body = inner[kind]
            if isinstance(body, dict):
                builder.apply(kind, body, event.seq, event.start, t)
            else:
                judge.corrupt(f"{kind} is not an object", event.seq, event.start)
        else:
            outputs = inner.get("outputs") if family == "mistral" else None
            if isinstance(outputs, list) and len(outputs) > 1 and self.more_outputs is None:
                judge.note(f"a chunk with {len(outputs)} outputs at seq {event.seq}: the first is read")
                self.more_outputs = (event.seq, event.start, len(outputs))
            start_over = self._start_over
            if start_over.busy or event.payload == start_over.first:
                start_over.see(event.payload, event)
            builder.apply(inner, event.seq, event.start, t)  # type: ignore[union-attr]
        self._bedrock_fields(inner, event)

    def _ended(self, what: str, event: EventStreamMessage) -> bool:
        """True (and the stream is corrupt) when ``what``, a frame no builder uses, came after the response ended."""
        return self.builder is not None and self.builder.ended(what, event.seq, event.start)

    def _bedrock_fields(self, inner: dict[str, Any], event: EventStreamMessage) -> None:
        metrics = inner.get("amazon-bedrock-invocationMetrics")
        if isinstance(metrics, dict) and self.judge.usage({"amazon-bedrock-invocationMetrics": metrics}, USAGE_FIELDS):
            usage = self.turn.usage
            if usage.input is None and metrics.get("inputTokenCount") is not None:
                usage.input = metrics["inputTokenCount"]
            if usage.output is None and metrics.get("outputTokenCount") is not None:
                usage.output = metrics["outputTokenCount"]
        if inner.get("amazon-bedrock-trace") is not None:
            self.turn.extra["trace"] = inner["amazon-bedrock-trace"]
        action = inner.get("amazon-bedrock-guardrailAction")
        if action is not None:
            self.turn.extra["guardrail_action"] = action
            if action == "INTERVENED" and self.guardrail is None:
                self.guardrail = (event.seq, event.start, action)

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        if self.builder is None:
            early = self.judge.early_verdict()
            if early is None and self.unknown_family is not None:  # chunks came, in a shape not known here
                seq, offset = self.unknown_family
                early = Verdict(VerdictKind.UNKNOWN, "every chunk is of a model family streamtap does not know, so it "
                                "cannot tell whether the answer finished", seq, offset, {"end": end.value})
            return self.turn, early or self.judge.truncated("no chunk arrived", end)
        verdict = self.builder.verdict(end)
        if self.unknown_family is not None and verdict.kind in (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT):
            seq, offset = self.unknown_family
            verdict = Verdict(VerdictKind.UNKNOWN,
                              f"a chunk of a shape streamtap does not know came among the {self.family} chunks: it "
                              "cannot tell what it carried (another model's answer stitched in, or part of this one)",
                              seq, offset, {"end": end.value, "was": verdict.kind.value})
        if self.more_outputs is not None and verdict.kind in (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT):
            seq, offset, count = self.more_outputs
            verdict = Verdict(VerdictKind.UNKNOWN,
                              f"a chunk carried {count} outputs and streamtap reads the first: it cannot tell whether "
                              "the others finished", seq, offset, {"end": end.value, "was": verdict.kind.value})
        if self.guardrail is not None and verdict.kind in (VerdictKind.COMPLETE, VerdictKind.STOPPED_BY_LIMIT,
                                                           VerdictKind.UNKNOWN):
            seq, offset, _ = self.guardrail
            raw = self.turn.stop_reason_raw
            self.turn.stop_reason = "filtered"
            model = f"model stop reason {raw}" if raw is not None else "no model stop reason"
            verdict = Verdict(VerdictKind.FILTERED,
                              "a guardrail intervened (amazon-bedrock-guardrailAction INTERVENED): the output was "
                              f"blocked or masked ({model})", seq, offset,
                              {"stop_reason": raw, "guardrail_action": "INTERVENED", "was": verdict.kind.value})
        return self.turn, verdict
