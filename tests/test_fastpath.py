"""providers.fastpath.ContentDeltas against a full JSON parse of every chunk."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtap.providers.fastpath import ContentDeltas

FRAGMENTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['"', "\\", '\\"', "\n", "a\tb", '"content":"x"', "\u2028", "é", "\U0001f600", "", " "]),
)


def chunk(content, *, index=0, extra=None, finish=None, delta=None, usage=None, error=None, id_="chatcmpl-1"):
    obj = {"id": id_, "object": "chat.completion.chunk", "created": 1770000000, "model": "gpt-x"}
    if extra:
        obj.update(extra)
    choice = {"index": index, "delta": delta if delta is not None else {"content": content}, "logprobs": None,
              "finish_reason": finish}  # fmt: skip
    obj["choices"] = [choice]
    if usage is not None:
        obj["usage"] = usage
    if error is not None:
        obj["error"] = error
    return obj


STYLES = [
    lambda o: json.dumps(o, separators=(",", ":")),
    lambda o: json.dumps(o),  # Python's ", " and ": "
    lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":")),
    lambda o: orjson.dumps(o).decode(),
]

VARIANTS = st.sampled_from(
    ["plain", "plain", "plain", "plain", "finish", "usage", "role", "tools", "error", "index1", "other-id",
     "two-choices", "extra-field", "no-index", "duplicate-content", "trailing-space"]
)  # fmt: skip


def variant_text(kind: str, content: str, style) -> str:
    if kind == "plain":
        return style(chunk(content))
    if kind == "finish":
        return style(chunk(content, finish="stop"))
    if kind == "usage":
        return style(chunk(content, usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}))
    if kind == "role":
        return style(chunk(content, delta={"role": "assistant", "content": content}))
    if kind == "tools":
        return style(chunk(content, delta={"tool_calls": [{"index": 0, "function": {"arguments": content}}]}))
    if kind == "error":
        return style(chunk(content, error={"message": "boom"}))
    if kind == "index1":
        return style(chunk(content, index=1))
    if kind == "other-id":
        return style(chunk(content, id_="chatcmpl-2"))
    if kind == "two-choices":
        obj = chunk(content)
        obj["choices"].append({"index": 1, "delta": {"content": "x"}, "finish_reason": None})
        return style(obj)
    if kind == "extra-field":
        return style(chunk(content, extra={"obfuscation": content[:3]}))
    if kind == "no-index":
        obj = chunk(content)
        del obj["choices"][0]["index"]
        return style(obj)
    if kind == "duplicate-content":  # JSON allows it; the last one wins
        text = style(chunk(content))
        return text.replace('"delta":', '"delta":{"content":"shadow"}, "delta":', 1)
    return style(chunk(content)) + " "


def full_parse_view(data: str):
    """What the assembler reads from a chunk, parsed the plain way: the fields that must
    equal the learnt chunk's, and (index, fragment) when it is a plain content chunk."""
    try:
        obj = orjson.loads(data)
    except ValueError:
        return None, None
    if type(obj) is not dict:
        return None, None
    choices = obj.get("choices")
    fields = {k: v for k, v in obj.items() if k != "choices"}
    if type(choices) is not list or len(choices) != 1:
        return fields, None
    choice = dict(choices[0])
    delta = choice.pop("delta", None)
    if type(delta) is not dict or list(delta) != ["content"] or choice.get("finish_reason"):
        return fields, None
    return (fields, choice), (choice.get("index"), delta["content"])


@settings(max_examples=300)
@given(
    style=st.sampled_from(STYLES),
    first=FRAGMENTS,
    later=st.lists(st.tuples(VARIANTS, FRAGMENTS), min_size=1, max_size=12),
)
def test_content_deltas_give_what_a_full_parse_gives(style, first, later) -> None:
    deltas = ContentDeltas()
    learnt_from = style(chunk(first))
    assert deltas.learn(learnt_from, orjson.loads(learnt_from))
    learnt_fields, _ = full_parse_view(learnt_from)
    hits = 0
    for kind, content in later:
        data = variant_text(kind, content, style)
        got = deltas.content(data)
        fields, expected = full_parse_view(data)
        if got is None:
            continue
        hits += 1
        # a hit claims: the full parse is a plain content chunk with this index and fragment,
        # and every other field is the learnt chunk's
        assert got == expected, (kind, data)
        assert fields == learnt_fields, (kind, data)
    plain_same_layout = [c for k, c in later if k == "plain"]
    if plain_same_layout:
        assert hits >= len(plain_same_layout)  # the same layout is always taken


def test_chunks_that_are_not_plain_content_are_not_learnt() -> None:
    deltas = ContentDeltas()
    for kind in ["finish", "usage", "role", "tools", "error", "two-choices"]:
        data = variant_text(kind, "x", STYLES[0])
        assert not deltas.learn(data, orjson.loads(data)), kind
    assert deltas.content(variant_text("plain", "x", STYLES[0])) is None


def test_an_escaped_fragment_is_decoded_exactly() -> None:
    deltas = ContentDeltas()
    first = STYLES[0](chunk("hi"))
    assert deltas.learn(first, orjson.loads(first))
    for fragment in ['say "hi"', "back\\slash", "line\nbreak", "\u0001", "é\U0001f600"]:
        assert deltas.content(STYLES[0](chunk(fragment))) == (0, fragment)
    raw_control = STYLES[0](chunk("a")).replace('"content":"a"', '"content":"a\u0001"')
    assert deltas.content(raw_control) is None  # JSON forbids it raw: a full parse fails too
    try:
        orjson.loads(raw_control)
        raise AssertionError("orjson accepted a raw control character")
    except ValueError:
        pass


# -- OpenAI's obfuscation padding, and delta keys the assembler reads as absent -------------------
PADDINGS = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", max_size=16),
    st.sampled_from(['"', "\\", "", '"},"obfuscation":"', "\n", "é"]),
)
PADDED_FRAGMENTS = st.one_of(FRAGMENTS, st.sampled_from(['"},"usage":null,"obfuscation":"', '","obfuscation":"x']))


def padded_chunk(content, padding, *, sort=False, nulls=(), **kwargs):
    obj = chunk(content, **kwargs)
    obj["usage"] = None
    obj["obfuscation"] = padding
    for key in nulls:
        obj["choices"][0]["delta"][key] = None
    if sort:  # Azure's order: keys sorted, so the padding sits between the choices and "object"
        obj = json.loads(json.dumps(obj, sort_keys=True))
    return obj


def padded_view(data: str):
    """``full_parse_view`` of a chunk with the padding left out and null delta keys read as absent."""
    try:
        obj = orjson.loads(data)
    except ValueError:
        return None, None
    if type(obj) is dict:
        obj.pop("obfuscation", None)
        for choice in obj.get("choices") or []:
            if type(choice) is dict and type(choice.get("delta")) is dict:
                choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None or k == "content"}
    return full_parse_view(orjson.dumps(obj).decode())


@settings(max_examples=300)
@given(
    style=st.sampled_from(STYLES),
    sort=st.booleans(),
    nulls=st.sampled_from([(), ("reasoning_content",), ("role", "refusal")]),
    first=st.tuples(FRAGMENTS, PADDINGS),
    later=st.lists(st.tuples(st.sampled_from(["same", "same", "same", "other-nulls", "no-padding", "finish", "usage",
                                              "other-id", "padding-number"]),
                             PADDED_FRAGMENTS, PADDINGS), min_size=1, max_size=12),
)
def test_padded_chunks_give_what_a_full_parse_gives(style, sort, nulls, first, later) -> None:
    deltas = ContentDeltas()
    learnt_from = style(padded_chunk(first[0], first[1], sort=sort, nulls=nulls))
    learnt = deltas.learn(learnt_from, orjson.loads(learnt_from))
    if first[1] == "" or (first[1].isascii() and first[1].isalnum()):
        assert learnt, learnt_from  # a plain padding is always learnt
    learnt_fields, _ = padded_view(learnt_from)
    for kind, content, padding in later:
        if kind == "same":
            obj = padded_chunk(content, padding, sort=sort, nulls=nulls)
        elif kind == "other-nulls":
            obj = padded_chunk(content, padding, sort=sort, nulls=("tool_calls",))
        elif kind == "no-padding":
            obj = chunk(content)
        elif kind == "finish":
            obj = padded_chunk(content, padding, sort=sort, nulls=nulls, finish="stop")
        elif kind == "usage":
            obj = padded_chunk(content, padding, sort=sort, nulls=nulls)
            obj["usage"] = {"prompt_tokens": 1}
        elif kind == "other-id":
            obj = padded_chunk(content, padding, sort=sort, nulls=nulls, id_="chatcmpl-2")
        else:
            obj = padded_chunk(content, 7, sort=sort, nulls=nulls)
        data = style(obj)
        got = deltas.content(data)
        fields, expected = padded_view(data)
        if got is None:
            assert not (learnt and kind == "same" and padding.isascii() and padding.isalnum() and content == first[0]), data
            continue
        assert got == expected, (kind, data)
        assert fields == learnt_fields, (kind, data)


def test_real_openai_padding_layout_is_taken() -> None:
    deltas = ContentDeltas()
    base = ('{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1-nano","service_tier":'
            '"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,'
            '"finish_reason":null}],"usage":null,"obfuscation":"%s"}')
    assert deltas.learn(base % ("**", "yhjoJbEF"), orjson.loads(base % ("**", "yhjoJbEF")))
    assert deltas.content(base % ("Holiday", "dTh")) == (0, "Holiday")
    assert deltas.content(base % ('a \\"quoted\\" word', "")) == (0, 'a "quoted" word')
    assert deltas.content(base % ("x", 'a"b')) is None  # not JSON: a full parse fails too
    deepseek = ('{"id":"c","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner","choices":'
                '[{"index":0,"delta":{"content":"%s","reasoning_content":null},"logprobs":null,"finish_reason":null}],'
                '"usage":null}')
    deltas = ContentDeltas()
    assert deltas.learn(deepseek % "The", orjson.loads(deepseek % "The"))
    assert deltas.content(deepseek % " word") == (0, " word")
    reasoning = deepseek.replace('"content":"%s","reasoning_content":null', '"content":null,"reasoning_content":"x"')
    assert deltas.content(reasoning) is None
