"""OpenAI Chat Completions streams (and the OpenAI-compatible servers that copy them).

``[DONE]`` is only a transport signal: the turn is judged by every choice's
``finish_reason``. An error object anywhere makes the turn errored even when ``[DONE]``
follows (OpenAI, vLLM and OpenRouter all do that). Reasoning from compatible servers
(``reasoning_content`` / ``reasoning``, Mistral's typed content parts) becomes thinking.

Closed units: a ``finish_reason`` closes its choice and ``[DONE]`` closes the response.
Content for a finished choice (text, reasoning, refusal, a tool call, another finish
reason) is a second generation: corrupt. So is a second assistant start (a ``role``
chunk again, once the choice has had content without one; OpenRouter and Perplexity put
the role on every chunk, and some servers on the finish chunk, which is not a start), and a
change of chunk id. An empty delta
after the finish (OpenRouter's usage chunk) contradicts nothing.

Tool calls are keyed by their index, as the openai SDK joins their fragments (every string, the id
and name too). A tool index reused for a new call (another id), or a call's name sent again on a
later fragment (as vLLM-style servers and the LiteLLM proxy do), is corrupt: the turn keeps the
calls the stream meant, but the app gets one call under the joined name (and, for a reused index,
both calls' arguments run together). An id sent again alone is only noted: the app's call still runs.

The SDK's stream helper (``chat.completions.stream``) reads only chunks whose ``object`` is
``chat.completion.chunk``; a raw ``create(stream=True)`` loop reads them all. The turn is the raw loop's:
a chunk the helper skips (Perplexity's last, ``chat.completion.done``, with the finish_reason) is noted
when it carries content or a finish_reason. A choice the helper reads fails it, and the usual loop
(``chunk.choices[0].delta.content``) too, when its ``delta`` is no object: corrupt.

A UTF-8 BOM at byte 0 before the first chunk's ``data:`` line is corrupt: the SSE rules drop it, the
SDK keeps it and ignores that line, so the app never gets the first chunk.
"""

from __future__ import annotations

from typing import Any

from streamtap.wire import SSEEvent, WireEvent

from .fastpath import ContentDeltas
from .common import (
    RESPONSE, AssemblerBase, StartOver, as_dict, as_int, as_list, as_str, dumps, error_fields, error_fields_of_text, loads,
    not_a_json_object, worst_stop,
)
from .turn import BlockKind, Dialect, StreamEnd, Turn, Verdict, VerdictKind

FINISH = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "filtered",
    "refusal": "refusal",
    "error": "error",
}


MAX_NAME = 256  # characters of a tool call's name kept from its fragments (OpenAI allows 64)
CHUNK = "chat.completion.chunk"  # the only ``object`` the SDK's stream helper reads (_is_valid_chat_completion_chunk_weak)
CARRIED = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")  # a delta's content fields


def _counted_choice(index: Any) -> int:
    """The choice a usage chunk's count is kept for, as ``AssemblerBase.choice`` reads its index: one
    that is no whole number from 0 is choice 0, so a stream of ever new such indexes keeps one count.
    (An index past MAX_CHOICES keeps its own: that chunk halts the assembly.)"""
    return index if type(index) is int and index >= 0 else 0


def _sdk_tool_indexes(calls: list[Any]) -> list[Any]:
    """Each tool call's ``index`` as the openai SDK's chunk hands it to the app (and its stream helper),
    for a list where one is no int. The SDK validates a delta's whole ``tool_calls`` list leniently
    (pydantic) and, only when that passes, gets ints for ``"0"``, ``" 1"``, ``"0.0"`` or ``true``;
    otherwise every value stays as sent. Asked of the SDK itself, as a copy of pydantic's rules would drift."""
    from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall

    read = ChoiceDelta.construct(tool_calls=calls).tool_calls
    return [call.index if isinstance(call, ChoiceDeltaToolCall) else None for call in read]


class Assembler(AssemblerBase):
    dialect = Dialect.OPENAI_CHAT
    wire = "sse"
    sdk_dispatches_empty_events = True

    def __init__(self, wire: str | None = None) -> None:
        super().__init__(wire)
        self._finish: dict[int, str] = {}  # choice -> raw finish_reason
        self._done: WireEvent | None = None
        self._asked_usage = False  # the request asked for a usage chunk (stream_options.include_usage)
        self._asked_choices = 1  # the request's n
        self._tool_keys: dict[tuple[int, int], int] = {}  # (choice, tool index) -> generation, for reused indexes
        self._chunk_id: str | None = None  # every chunk of one generation carries the same id
        self._chunk_id_at: WireEvent | None = None  # the first chunk that carried it
        self._started: dict[int, tuple[int, int]] = {}  # choice -> its first role chunk's seq and byte
        self._bare_content: set[int] = set()  # choices that had content in a chunk without a role
        self._deltas = ContentDeltas()  # plain content chunks without a JSON parse
        # compatible servers that name the role on every chunk send a refrain's chunks again byte for
        # byte: only a repeat of the first three, after them, is taken for the answer starting over
        self._start_over = StartOver(self, least=StartOver.KEPT)
        # the last usage's completion_tokens, where chunks count, by the choice the chunk carries
        # (vLLM counts each choice's own on its chunks, and all of them on the last): None for all.
        # Count, seq and byte: the chunk itself would keep its data alive
        self._output_tokens: dict[int | None, tuple[int, int, int]] = {}
        self._helper_read = False  # a chunk the SDK's stream helper reads (its object is chat.completion.chunk)
        self._helper_lost = False  # it skipped a chunk that carries content or a finish_reason
        # the choices the SDK's stream helper has put in its snapshot (None: before its first chunk;
        # False: it failed on a chunk, said once)
        self._helper_choices: int | bool | None = None

    def feed(self, event: WireEvent, t: float | None) -> None:
        if self.judge.halt_verdict is not None:  # a bound passed: the rest is not read (see AssemblerBase.choice)
            return
        if not isinstance(event, SSEEvent):
            self.seen(event, type(event).__name__)
            self.corrupt(f"unexpected {type(event).__name__} in an SSE dialect", event)
            return
        data = event.data
        if data.startswith("[DONE]"):  # as the SDK tests it: " [DONE]" is data it parses as JSON, and fails on
            self.seen(event, "[DONE]")
            if self._done is None:
                self._done = event
                self._end(event)
                self.close_unit(RESPONSE, "data: [DONE]", event)
            return
        self.seen(event, "chunk" if event.event == "message" else event.event)
        if event.start == 0:
            self.first_event_lost_to_bom(event)
        if event.event == "error" and not_a_json_object(data):
            self.errored(event, error_fields_of_text(data))
            return
        if not data or data.isspace():
            self.empty_data(event, "openai")
            return
        start_over = self._start_over
        if start_over.busy or data == start_over.first:
            start_over.see(data, event)
        if event.event != "error" and self._content_delta(data, t):
            return
        judge = self.judge
        findings = (judge.problem, judge.error_at, len(self.turn.notes))
        try:
            obj = loads(data)
        except ValueError:
            obj = self.payload(event, data)  # records why, as corruption
        if type(obj) is not dict:
            if obj is not None:
                self.corrupt("event data is JSON but not an object", event)
            return
        self._parsed(obj, event, t)
        if findings == (judge.problem, judge.error_at, len(self.turn.notes)) and obj.get("id") == self._chunk_id:
            self._deltas.learn(data, obj)  # only a chunk that changed nothing but the text is a layout

    def _content_delta(self, data: str, t: float | None) -> bool:
        """Take a plain content chunk in the layout learnt from a parsed one, without parsing it.

        True when done. It declines (False, and the chunk is parsed) in every state where the
        full path would find something: a finished choice (content after its finish_reason is
        a second generation), a choice without an index, or an index that is not yet a choice
        (resolving it may note).
        The learnt chunk raised nothing and carried the stream's chunk id, and a chunk in its
        layout carries the same id, model, error and usage fields, so those checks hold too."""
        hit = self._deltas.content(data)
        if hit is None:
            return False
        index = hit[0]  # None: the layout has no index, which is corrupt (the full path says so)
        if index is None or not 0 <= index < len(self.turn.choices) or index in self._finish:
            return False
        text = hit[1]
        if text:
            self._bare_content.add(index)
            self.append(index, BlockKind.TEXT, text, t)
        return True

    def _parsed(self, obj: dict[str, Any], event: SSEEvent, t: float | None) -> None:
        if ("error" in obj and obj["error"]) or event.event == "error" or obj.get("object") == "error":
            self.errored(event, error_fields(obj))
        turn = self.turn
        if not turn.model:  # Azure's preamble chunk has model "" too
            turn.model = as_str(obj.get("model")) or None
        chunk_id = obj.get("id")
        if chunk_id and type(chunk_id) is str:  # Azure's preamble chunk has id ""
            if self._chunk_id is None:
                self._chunk_id, self._chunk_id_at = chunk_id, event
            elif chunk_id != self._chunk_id:
                self.second_generation("chunk id", (self._chunk_id, self._chunk_id_at), chunk_id, event)
        if turn.response_id is None:
            turn.response_id = self._chunk_id
        usage = obj.get("usage")
        if usage is None and "x_groq" in obj:
            usage = as_dict(obj["x_groq"]).get("usage")
        choices = obj.get("choices")
        helper_reads = obj.get("object") == CHUNK
        if helper_reads:
            self._helper_read = True
            if self._helper_choices is not False:
                self._helper_fails_on_choices(obj, choices, event)
        elif not self._helper_lost:
            self._helper_skips(obj, choices, event)
        if usage and isinstance(usage, dict):
            only = choices[0] if type(choices) is list and len(choices) == 1 and type(choices[0]) is dict else None
            self._usage(usage, event, _counted_choice(only.get("index")) if only is not None else None)
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict and not self.halted:
                    self._choice(choice, event, t, helper_reads)

    def _helper_fails_on_choices(self, obj: dict[str, Any], choices: Any, event: SSEEvent) -> None:
        """The openai SDK's stream helper (chat.completions.stream) puts each chunk's choices in its
        snapshot by index: it raises on a chunk whose choices are null or missing, on a first chunk
        whose choice index is past that chunk's choices, and on a choice whose index skips one it
        has not seen, where a raw create(stream=True) loop that checks each chunk reads the whole
        answer: noted, as a tool call the helper fails on is (``_helper_fails``)."""
        why = None
        if type(choices) is not list:
            why = "its choices are null" if "choices" in obj else "it has no choices"
        else:
            first = self._helper_choices is None
            count = len(choices) if first else int(self._helper_choices)
            for choice in choices:
                index = choice.get("index") if type(choice) is dict else None
                if type(index) is not int:  # no whole number: the index rules say what it is
                    continue
                if first and not 0 <= index < len(choices):
                    why = f"its choice index {index} is past its {len(choices)} choice(s), the first chunk the helper reads"
                elif not first and index > count:
                    why = f"its choice index {index} skips index {count}"
                elif not first and index == count:
                    count += 1
                if why:
                    break
            self._helper_choices = count
        if why:
            self._helper_choices = False
            self.note(f"the chunk at seq {event.seq} (byte {event.start}): {why}: the openai SDK's stream helper "
                      "(chat.completions.stream) raises there, where a raw create(stream=True) loop that checks "
                      "each chunk reads the whole answer")

    def _helper_skips(self, obj: dict[str, Any], choices: Any, event: SSEEvent) -> None:
        """Note the first chunk the SDK's stream helper skips (its object is not chat.completion.chunk)
        that carries something the turn takes; a raw loop reads it. (Azure's filter chunks carry nothing.)"""
        lost: list[str] = []
        for choice in as_list(choices):
            if type(choice) is dict:
                delta = as_dict(choice.get("delta"))
                lost += [key for key in CARRIED if delta.get(key) and key not in lost]
                finish = as_str(choice.get("finish_reason"))
                if finish and f"finish_reason {finish}" not in lost:
                    lost.append(f"finish_reason {finish}")
        if lost:
            self._helper_lost = True
            shown = f"object {dumps(obj['object'])[:40]}" if "object" in obj else "no object field"
            self.note(f"the chunk at seq {event.seq} has {shown}, not {CHUNK}: the openai SDK's stream helper "
                      f"(chat.completions.stream) skips it and loses its {', '.join(lost)}; a raw "
                      "create(stream=True) loop reads it")

    def _choice(self, choice: dict[str, Any], event: WireEvent, t: float | None, helper_reads: bool = True) -> None:
        if choice.get("index") is None:  # the SDK's choice has index None when the key is missing too
            shown = "index null" if "index" in choice else "no index"
            self.corrupt(f"a choice with {shown}: the SDK indexes its choices with it and fails", event)
            return
        index = choice["index"] or 0
        if type(index) is not int or not 0 <= index < len(self.turn.choices):
            index = self.choice(index).index
            if self.halted:
                return
        delta = choice.get("delta")
        if type(delta) is dict and len(delta) == 1 and type(delta.get("content")) is str and not choice.get("finish_reason") \
                and index not in self._finish:
            if delta["content"]:  # the common chunk: one text fragment
                self._bare_content.add(index)
                self.append(index, BlockKind.TEXT, delta["content"], t)
            return
        if delta is None and "text" in choice:  # legacy /v1/completions
            delta = {"content": choice.get("text")}
        elif type(delta) is not dict and helper_reads:
            # (the helper skips Azure's filter chunks, which have no delta: only a raw loop reading it fails there)
            shown = "no delta" if "delta" not in choice else f"delta {dumps(delta)[:20]}"
            self.corrupt(f"a choice with {shown} (choice {index}): the SDK's stream helper calls delta.to_dict() and "
                         "fails, and so does a loop reading chunk.choices[0].delta.content", event, choice=index)
            return
        delta = as_dict(delta)
        if not self._one_generation(index, choice, delta, event):
            return
        # servers send either name, some both (the same text twice, or an empty reasoning_content beside
        # the text in reasoning): the first that carries text is the reasoning, taken once
        reasoning = delta.get("reasoning_content")
        if not (isinstance(reasoning, str) and reasoning):
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.append(index, BlockKind.THINKING, reasoning, t)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.append(index, BlockKind.TEXT, content, t)
        elif isinstance(content, list):
            self._parts(index, content, t)
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self.append(index, BlockKind.REFUSAL, refusal, t)
        transcript = as_dict(delta.get("audio")).get("transcript")
        if isinstance(transcript, str) and transcript:  # a spoken answer's words (the SDK's message.audio.transcript)
            self.append(index, BlockKind.TEXT, transcript, t)
        calls = as_list(delta.get("tool_calls"))
        read = None
        for number, call in enumerate(calls):
            if isinstance(call, dict):
                sdk_index = call.get("index")
                if type(sdk_index) is not int:
                    read = read or _sdk_tool_indexes(calls)
                    sdk_index = read[number]
                self._tool_fragment(index, call, sdk_index, event, t)
        legacy = delta.get("function_call")
        if isinstance(legacy, dict):
            self._tool_fragment(index, {"index": -1, "function": legacy}, -1, event, t)
        for note in as_list(delta.get("annotations")):
            blocks = self.choice(index).blocks
            if blocks:
                self.judge.listed(blocks[-1], "citations", note)
        finish = as_str(choice.get("finish_reason"))
        if finish:
            self._finish[index] = finish
            self.choice(index).stop_reason = finish
            self.close_unit(f"choice {index}", f"finish_reason {finish}", event)

    def _one_generation(self, index: int, choice: dict[str, Any], delta: dict[str, Any], event: WireEvent) -> bool:
        """False (and corrupt) when this chunk starts or continues a second generation of the choice."""
        carries = [k for k in ("content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call")
                   if delta.get(k)]
        if index in self._finish:
            finish = as_str(choice.get("finish_reason"))
            if carries or (finish and finish != self._finish[index]) or (delta.get("role") and index in self._bare_content):
                what = f"a delta with {', '.join(carries)}" if carries else (
                    f"finish_reason {finish}" if finish and finish != self._finish[index] else "a role chunk")
                self.reopened(f"choice {index}", f"{what} (a second generation)", event)
                return False
            return True
        if delta.get("role"):
            first = self._started.get(index)
            if first is None:
                self._started[index] = (event.seq, event.start)
            elif index in self._bare_content and not choice.get("finish_reason"):
                # (a role on the finish chunk, as some servers send, starts nothing)
                first_seq, first_offset = first
                self.corrupt(
                    f"a second assistant start (role chunk) at seq {event.seq} (byte {event.start}) for choice {index}, "
                    f"which started at seq {first_seq} (byte {first_offset}): two generations in one stream",
                    event, choice=index, first_seq=first_seq, first_offset=first_offset)
                return False
        elif carries:
            self._bare_content.add(index)
        return True

    def _parts(self, index: int, parts: list[Any], t: float | None) -> None:
        """Typed content parts (Mistral): route by the part's own type."""
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "thinking":
                inner = part.get("thinking")
                pieces = [as_str(p.get("text")) or "" for p in as_list(inner) if isinstance(p, dict)]
                text = "".join(pieces) if isinstance(inner, list) else as_str(inner) or ""
                self.append(index, BlockKind.THINKING, text, t)
            elif isinstance(part.get("text"), str):
                self.append(index, BlockKind.TEXT, part["text"], t)

    def _tool_fragment(self, index: int, call: dict[str, Any], sdk_index: Any, event: WireEvent, t: float | None) -> None:
        """``sdk_index``: the call's index as the openai SDK reads it (``_sdk_tool_indexes``)."""
        # (a bool is an int to the SDK and to a dict of calls keyed by index: true is call 1)
        position = int(sdk_index) if isinstance(sdk_index, int) else None
        if position is None:
            position = len([b for b in self.choice(index).blocks if b.kind is BlockKind.TOOL_CALL])
        function = as_dict(call.get("function"))
        generation = self._tool_keys.get((index, position), 0)
        block = self.block(index, ("tool", position, generation))
        new_id = as_str(call.get("id"))
        if block is not None and new_id and block.id and new_id != block.id:
            # a gateway reusing one index for parallel calls: a new id is a new call, which the turn keeps
            # apart; the openai SDK (its stream helper, and the usual loop that joins by index) does not
            name = as_str(function.get("name")) or ""
            self.corrupt(f"tool call index {position} of choice {index} reused for a new call (id {new_id} at seq "
                         f"{event.seq}, after {block.id}): the openai SDK joins the fragments of one index into one "
                         f"call, so the app gets id {block.id}{new_id}, name {block.name or ''}{name} and both calls' "
                         f"arguments run together", event, choice=index, tool_index=position,
                         ids=[block.id, new_id])
            generation += 1
            self._tool_keys[(index, position)] = generation
            block = None
        if block is None:
            self._helper_fails(index, call, sdk_index, position, event)
            name = as_str(function.get("name"))
            if not name:  # (a gap in the indexes proves nothing: a real compatible server leaves one)
                self.corrupt(f"tool call index {position} of choice {index} begins without a function name: the "
                             f"chunk that opened it was lost", event, choice=index)
            block = self.tool_block(index, ("tool", position, generation), id=new_id, name=name, t=t)
        else:
            # the openai SDK joins every string fragment of a call, ids and names too (accumulate_delta)
            name = as_str(function.get("name"))
            if name and name == block.name:
                # vLLM-style servers (Fireworks) and the LiteLLM proxy repeat it on every fragment, and a
                # chunk sent twice does too: the app's call names a tool the stream never called
                self.corrupt(f"the name of tool call index {position} of choice {index} ({name}) is sent again at seq "
                             f"{event.seq}: the openai SDK joins every name fragment, so the app's call is named "
                             f"{name}{name}", event, choice=index, tool_index=position, name=name)
            elif name:  # a name sent in several fragments: joined, as the SDK joins it (within a bound)
                joined = (block.name or "") + name
                if len(joined) > MAX_NAME:
                    self.corrupt(f"tool call index {position} of choice {index} has a name longer than {MAX_NAME} "
                                 f"characters, sent in fragments", event, choice=index)
                else:
                    block.name = joined
            if new_id and new_id == block.id:
                # harmless to the app: its call runs, and the joined id is the one it answers and sends back
                self.note(f"the id of tool call index {position} of choice {index} ({new_id}) is repeated on later "
                          f"fragments: the openai SDK joins every id fragment, so the app's call id comes out repeated")
            block.id = block.id or new_id
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            if arguments:
                self.grow(block, "arguments_raw", arguments)
                self.content(t)
        elif isinstance(arguments, dict):  # some servers send whole objects
            if not block.arguments_raw:  # once per call
                self.note(f"tool call index {position} of choice {index} sends its arguments as a JSON object (seq "
                          f"{event.seq}), not a string: the openai SDK hands the app that object, on which json.loads, "
                          "or joining the fragments as strings, raises TypeError; the turn holds it as JSON text")
            self.grow(block, "arguments_raw", dumps(arguments))

    def _helper_fails(self, index: int, call: dict[str, Any], sdk_index: Any, position: int, event: WireEvent) -> None:
        """A call the openai SDK's stream helper (``chat.completions.stream``) fails on, though a
        raw stream's app may join it: one without an index the SDK reads as an int (TypeError) or past a
        gap (IndexError)."""
        calls = sum(1 for block in self.choice(index).blocks if block.kind is BlockKind.TOOL_CALL)
        if "index" not in call:
            self.note(f"a tool call of choice {index} without an index (seq {event.seq}): the openai SDK's stream "
                      "helper raises TypeError on it")
        elif not isinstance(sdk_index, int):
            self.note(f"a tool call of choice {index} with index {dumps(call['index'])[:20]} (seq {event.seq}), which "
                      "the openai SDK does not read as an integer: its stream helper raises TypeError on it")
        elif position > calls:
            self.note(f"tool call index {position} of choice {index} after {calls} call(s) (seq {event.seq}): the openai "
                      "SDK's stream helper raises IndexError on the gap")

    def _usage(self, raw: dict[str, Any], event: WireEvent, choice: int | None = None) -> None:
        usage = self.turn.usage
        usage.raw = raw
        usage.input = as_int(raw.get("prompt_tokens"))
        usage.output = as_int(raw.get("completion_tokens"))
        if usage.output is not None:
            # servers that count on every chunk (Perplexity, vLLM's continuous usage) count the
            # generation so far: a count that falls is a second generation's
            last = self._output_tokens.get(choice)
            if last is not None and usage.output < last[0]:
                self.corrupt(f"usage.completion_tokens falls from {last[0]} (seq {last[1]}) to {usage.output} at seq "
                             f"{event.seq} (byte {event.start}): the count of one generation only grows, so a second "
                             "generation begins here (spliced stream)", event, counts=[last[0], usage.output])
            self._output_tokens[choice] = (usage.output, event.seq, event.start)
        usage.total = as_int(raw.get("total_tokens"))
        usage.cache_read = as_int(as_dict(raw.get("prompt_tokens_details")).get("cached_tokens"))
        usage.reasoning = as_int(as_dict(raw.get("completion_tokens_details")).get("reasoning_tokens"))

    def _end(self, event: WireEvent) -> None:
        stops = self._stops()
        if stops is None:
            return  # [DONE] without a finish_reason proves nothing: judged truncated in finish()
        self.terminal(event, *stops, "data: [DONE]")

    def _stops(self) -> tuple[str, str] | None:
        """Once every choice has its finish_reason: each choice's stop, and the turn's (raw, normalized),
        the worst of them; else None."""
        choices = [c.index for c in self.turn.choices]
        if not self._finish or any(i not in self._finish for i in choices):
            return None
        normalized = []
        for index in choices:
            raw = self._finish[index]
            norm = FINISH.get(raw, "other")
            if norm == "end_turn" and any(b.kind is BlockKind.REFUSAL for b in self.choice(index).blocks):
                norm = "refusal"
            normalized.append(norm)
        self.choice_stops(dict(zip(choices, normalized)))
        worst = worst_stop(normalized)
        return next(self._finish[i] for i, n in zip(choices, normalized) if n == worst), worst

    @property
    def sdk_stopped_reading(self) -> bool:
        """The openai SDK stops reading at [DONE] and closes the response (``Stream.__stream__``; the
        async client drains at most 0.1 s after it and ignores errors), so a body cut after [DONE]
        never reaches the app."""
        return self._done is not None

    def asked(self, body: dict[str, Any]) -> None:
        self._asked_usage = as_dict(body.get("stream_options")).get("include_usage") is True
        n = body.get("n")
        self._asked_choices = n if type(n) is int and n > 1 else 1

    def _what_was_asked(self) -> None:
        """An answer that ended without what its request asked for: OpenAI sends it, a compatible
        server that ignores the option does not (Ollama's /v1 ignores both), so it is noted, not judged."""
        if self._asked_usage and not self.turn.usage.raw:
            self.note("the request asked for usage (stream_options.include_usage) and no chunk before [DONE] "
                      "carried it: the app's usage is null (a server that ignores the option, or the chunk lost)")
        if len(self.turn.choices) < self._asked_choices:
            self.note(f"the request asked for {self._asked_choices} choices (n) and the stream carried "
                      f"{len(self.turn.choices)} (a server that ignores n, or choices lost)")

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        self.close_blocks()
        if self._done is not None and self.judge.error_at is None:
            self._what_was_asked()
        if self._helper_lost and not self._helper_read and self.judge.error_at is None:
            self.note("no chunk has object chat.completion.chunk: the openai SDK's stream helper reads none, and its "
                      "get_final_completion() fails (AssertionError)")
        if self._done is not None and not self.terminal_seen and not self.troubled:
            missing = [c.index for c in self.turn.choices if c.index not in self._finish]
            return self.turn, Verdict(
                VerdictKind.TRUNCATED,
                f"[DONE] arrived but choice {missing[0]} never got a finish_reason",
                self._done.seq,
                self._done.start,
                {"end": end.value, "choices_without_finish": missing},
            )
        turn, verdict = self.verdict(end, expected="data: [DONE]")
        if verdict.kind is VerdictKind.TRUNCATED and self._finish and len(self._finish) == len(turn.choices):
            verdict.evidence["content_complete"] = True  # only the usage chunk / [DONE] went missing
            verdict.reason += " (every choice had its finish_reason)"
            stops = self._stops()
            if stops is not None and turn.stop_reason_raw is None:  # what the SDK hands the app: its finish_reason
                self.judge.stop_reason(*stops)
        return turn, verdict

