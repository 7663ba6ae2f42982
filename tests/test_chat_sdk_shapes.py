"""Chat Completions chunks whose shape the openai SDK reads otherwise than a plain JSON reading: a tool
call index sent as a string, a chunk whose ``object`` its stream helper skips, a choice without a
``delta`` or an ``index``. The real SDK, served the same bytes in process, is the oracle."""

from __future__ import annotations

import json

import httpx
import openai
import orjson
import pytest
from provider_streams import C, X, chunk_lines, frame_chat, vercel

from streamtap.providers import analyze_bytes

CHAT = "openai-chat"
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(delta: dict | None, finish: str | None = None, **top) -> dict:
    return {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **top}


def _chat(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _client(body: bytes) -> openai.OpenAI:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(upstream)))


def _helper(body: bytes):
    """What an app on the SDK's stream helper gets."""
    with _client(body).chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}]) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def _raw(body: bytes) -> list:
    """The chunks an app's own ``create(stream=True)`` loop gets."""
    return list(_client(body).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))


def _call(index, call_id: str, name: str, arguments) -> dict:
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


# ---------------------------------------------------------------------------------------
# a tool call's index, read as the SDK reads it


@pytest.mark.parametrize("index", ["0", " 0", "0.0"])
def test_a_tool_index_the_sdk_reads_as_the_first_calls_is_that_call_reused(index):
    """The SDK validates a delta's tool calls leniently and hands the app index 0 for "0": the second
    call joins the first, as when it is sent with 0 itself (corrupt). Read as no index, it was a
    separate call, and the stream was judged complete."""
    body = _chat(_chunk({"role": "assistant", "content": None}),
                 _chunk(_call(0, "call_a", "get_weather", '{"city":"Paris"}')),
                 _chunk(_call(index, "call_b", "get_time", '{"tz":"CET"}')), _chunk({}, "tool_calls"))
    assert [c.choices[0].delta.tool_calls[0].index for c in _raw(body) if c.choices[0].delta.tool_calls] == [0, 0]
    joined = _helper(body).choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in joined] == [
        ("call_acall_b", "get_weatherget_time", '{"city":"Paris"}{"tz":"CET"}')]
    verdict = analyze_bytes(body, CHAT).verdict
    assert verdict.kind is X, verdict
    assert "index 0 of choice 0 reused for a new call" in verdict.reason and "call_acall_b" in verdict.reason


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic's, as the SDK serializes what it did not validate
@pytest.mark.parametrize(("index", "arguments"), [(None, "{}"), ("x", "{}"), ("0", {"a": 1})],
                         ids=["null", "not a number", "a number, beside arguments sent as an object"])
def test_a_tool_index_the_sdk_reads_as_no_integer_fails_its_stream_helper(index, arguments):
    """Where the delta's calls do not validate (arguments as an object), the SDK leaves "0" as sent:
    its helper raises, as on null, and a raw loop's app gets the string. Noted, as for a call without
    an index."""
    body = _chat(_chunk({"role": "assistant", **_call(index, "call_a", "get_weather", arguments)}),
                 _chunk({}, "tool_calls"))
    assert [c.choices[0].delta.tool_calls[0].index for c in _raw(body) if c.choices[0].delta.tool_calls] == [index]
    with pytest.raises(TypeError, match="not an integer"):
        _helper(body)
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert len(analysis.turn.tool_calls()) == 1
    assert any("does not read as an integer: its stream helper raises TypeError" in n for n in analysis.turn.notes), \
        analysis.turn.notes


# ---------------------------------------------------------------------------------------
# chunks the SDK's stream helper skips: their object is not chat.completion.chunk


def _skips_note(notes: list[str]) -> list[str]:
    return [n for n in notes if "stream helper (chat.completions.stream) skips it" in n]


def test_a_chunk_the_stream_helper_skips_is_read_and_noted():
    """A raw loop reads every chunk; the helper only those of object chat.completion.chunk. The turn
    is the raw loop's, and says what the helper's app loses."""
    body = _chat(_chunk({"role": "assistant", "content": "Hel"}),
                 _chunk({"content": "lo"}, object="chat.completion.done"), _chunk({}, "stop"))
    assert _helper(body).choices[0].message.content == "Hel"
    assert "".join(c.choices[0].delta.content or "" for c in _raw(body)) == "Hello"
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C and analysis.turn.text() == "Hello", analysis.verdict
    notes = _skips_note(analysis.turn.notes)
    assert len(notes) == 1 and 'seq 1 has object "chat.completion.done"' in notes[0] and "loses its content" in notes[0]


def test_perplexitys_last_chunk_is_skipped_by_the_stream_helper_with_its_finish_reason():
    """Perplexity marks its last chunk, which carries the finish_reason, chat.completion.done."""
    path = vercel("perplexity", "perplexity-text.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_chat(chunk_lines(path))
    final = _helper(body).choices[0]
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert (final.message.content, final.finish_reason) == (analysis.turn.text(), None)
    assert analysis.turn.choices[0].stop_reason == "stop"  # what a raw loop gets
    notes = _skips_note(analysis.turn.notes)
    assert len(notes) == 1 and "loses its finish_reason stop" in notes[0], analysis.turn.notes


def test_no_chunk_the_stream_helper_reads_fails_it():
    chunks = [_chunk({"role": "assistant", "content": "Hello"}), _chunk({}, "stop")]
    for chunk in chunks:
        del chunk["object"]
    body = _chat(*chunks)
    with pytest.raises(AssertionError):
        _helper(body)
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert any("no object field" in n for n in _skips_note(analysis.turn.notes))
    assert any("get_final_completion() fails (AssertionError)" in n for n in analysis.turn.notes), analysis.turn.notes


def test_azures_preamble_the_stream_helper_skips_loses_nothing():
    path = vercel("openai", "chat", "azure-model-router.1.chunks.txt")
    if not path.exists():
        pytest.skip(f"{path} is absent")
    body = frame_chat(chunk_lines(path))
    assert orjson.loads(chunk_lines(path)[0])["object"] == ""
    final = _helper(body).choices[0]
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C and final.message.content == analysis.turn.text()
    assert not _skips_note(analysis.turn.notes)


# ---------------------------------------------------------------------------------------
# choices the SDK fails on


@pytest.mark.parametrize("drop", [False, True], ids=["delta null", "no delta"])
def test_a_choice_without_a_delta_object_is_corrupt(drop):
    """The SDK hands the app a choice whose delta is None: its helper calls delta.to_dict(), and the
    usual loop reads chunk.choices[0].delta.content; both raise."""
    last = _chunk(None, "stop")
    if drop:
        del last["choices"][0]["delta"]
    body = _chat(_chunk({"role": "assistant", "content": "Hello"}), last)
    with pytest.raises(AttributeError):
        _helper(body)
    with pytest.raises(AttributeError):
        "".join(c.choices[0].delta.content or "" for c in _raw(body))
    verdict = analyze_bytes(body, CHAT).verdict
    assert verdict.kind is X, verdict
    assert f"a choice with {'no delta' if drop else 'delta null'} (choice 0)" in verdict.reason and verdict.seq == 1


def test_a_choice_without_a_delta_in_a_chunk_the_helper_skips_is_not_corrupt():
    """Azure's asynchronous filter sends chunks of object "" whose choices have no delta: the helper
    skips them."""
    screen = {"id": "", "object": "", "created": 0, "model": "",
              "choices": [{"index": 0, "finish_reason": None, "content_filter_results": {}}]}
    body = _chat(_chunk({"role": "assistant", "content": "Hello"}), screen, _chunk({}, "stop"))
    assert _helper(body).choices[0].message.content == "Hello"
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C and analysis.turn.text() == "Hello", analysis.verdict


def test_a_choice_without_an_index_is_corrupt_as_one_with_index_null():
    """The SDK's choice has index None either way, and its helper indexes its choices with it."""
    middle = _chunk({"content": "lo"})
    del middle["choices"][0]["index"]
    body = _chat(_chunk({"role": "assistant", "content": "Hel"}), middle, _chunk({}, "stop"))
    with pytest.raises(TypeError):
        _helper(body)
    assert [c.choices[0].index for c in _raw(body)] == [0, None, 0]
    verdict = analyze_bytes(body, CHAT).verdict
    assert verdict.kind is X, verdict
    assert verdict.reason.startswith("a choice with no index: the SDK indexes its choices with it and fails")
    assert verdict.seq == 1


# ---------------------------------------------------------------------------------------
# reasoning under either name, as compatible servers send it


@pytest.mark.parametrize(("first", "second"), [
    ({"reasoning_content": "", "reasoning": "think A"}, {"reasoning_content": "", "reasoning": " B"}),
    ({"reasoning_content": "think A", "reasoning": ""}, {"reasoning_content": " B", "reasoning": None}),
    ({"reasoning_content": "think A", "reasoning": "think A"}, {"reasoning_content": " B", "reasoning": " B"}),
    ({"reasoning": "think A"}, {"reasoning_content": None, "reasoning": " B"}),
], ids=["empty reasoning_content beside reasoning", "empty reasoning beside reasoning_content", "the same text twice",
        "reasoning alone"])
def test_reasoning_is_the_text_of_whichever_name_carries_it_once(first, second):
    """The SDK keeps both fields on the message, joined as sent: a server that sends an empty
    reasoning_content beside the text in reasoning gives the app its reasoning there, and it is the
    turn's thinking; one that sends the same text under both names thinks it once."""
    body = _chat(_chunk({"role": "assistant", "content": ""}), _chunk(first), _chunk(second), _chunk({"content": "Answer"}),
                 _chunk({}, "stop"))
    message = _helper(body).choices[0].message
    sent = [message.model_extra.get(name) for name in ("reasoning_content", "reasoning")]
    assert "think A B" in sent, sent
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind is C, analysis.verdict
    assert (analysis.turn.thinking(), analysis.turn.text()) == ("think A B", "Answer")


# ---------------------------------------------------------------------------------------
# choices the stream helper puts in its snapshot by index


def _choice(index: int, content: str | None = None, finish: str | None = None) -> dict:
    return {"index": index, "delta": {"content": content} if content is not None else {}, "finish_reason": finish}


HELPER_FAILS_ON_CHOICES = {
    "choices null": (_chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({}, "stop"),
                           {**HEAD, "choices": None, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
                     "its choices are null"),
    "no choices": (_chat(_chunk({"role": "assistant", "content": "Hi"}), _chunk({}, "stop"),
                         {**HEAD, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
                   "it has no choices"),
    "first chunk holds choice 1 alone": (_chat({**HEAD, "choices": [_choice(1, "B")]}, {**HEAD, "choices": [_choice(0, "A")]},
                                               {**HEAD, "choices": [_choice(0, None, "stop"), _choice(1, None, "stop")]}),
                                         "its choice index 1 is past its 1 choice(s)"),
    "an index skipped": (_chat({**HEAD, "choices": [_choice(0, "A")]}, {**HEAD, "choices": [_choice(2, "C")]},
                               {**HEAD, "choices": [_choice(1, "B")]},
                               {**HEAD, "choices": [_choice(i, None, "stop") for i in range(3)]}),
                         "its choice index 2 skips index 1"),
}


@pytest.mark.parametrize("shape", list(HELPER_FAILS_ON_CHOICES))
def test_choices_the_stream_helper_fails_on_are_noted_where_a_raw_loop_reads_the_whole_answer(shape):
    body, says = HELPER_FAILS_ON_CHOICES[shape]
    with pytest.raises((TypeError, IndexError, AttributeError)):
        _helper(body)
    texts: dict[int, str] = {}  # a loop that checks each chunk's choices reads every one
    for chunk in _raw(body):
        for choice in chunk.choices or ():
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind.value == "complete", analysis.verdict
    assert {c.index: "".join(b.text for b in c.blocks) for c in analysis.turn.choices} == texts
    assert [note for note in analysis.turn.notes if says in note and "stream helper" in note], analysis.turn.notes


def test_choices_in_order_leave_no_note_of_the_helper():
    body = _chat({**HEAD, "choices": [_choice(0, "A"), _choice(1, "B")]}, {**HEAD, "choices": [_choice(1, "b")]},
                 {**HEAD, "choices": [_choice(0, None, "stop"), _choice(1, None, "stop")]}, {**HEAD, "choices": []})
    assert len(_helper(body).choices) == 2
    assert not [note for note in analyze_bytes(body, CHAT).turn.notes if "stream helper" in note]


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the SDK's own, on the object where it expects text
def test_arguments_sent_as_a_json_object_are_noted_as_what_the_app_gets():
    """Some servers send a call's arguments whole, as an object: the SDK hands the app that object,
    where json.loads (what apps call on arguments) raises. The turn holds it as JSON text, noted."""
    body = _chat(_chunk({"role": "assistant", **_call(0, "call_1", "f", {"a": 1})}), _chunk({}, "tool_calls"))
    [call] = _helper(body).choices[0].message.tool_calls
    assert call.function.arguments == {"a": 1}
    with pytest.raises(TypeError):
        json.loads(call.function.arguments)
    analysis = analyze_bytes(body, CHAT)
    assert analysis.verdict.kind.value == "complete", analysis.verdict
    assert [note for note in analysis.turn.notes if "as a JSON object" in note and "TypeError" in note], analysis.turn.notes
