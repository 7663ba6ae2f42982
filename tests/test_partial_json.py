"""IncrementalJSON: fragments in, one parse of the exact concatenation out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamtap.wire import IncrementalJSON, JSONIncomplete


def fed(*fragments: str) -> IncrementalJSON:
    document = IncrementalJSON()
    for fragment in fragments:
        document.feed(fragment)
    return document


def test_fragments_of_anthropic_partial_json_parse_at_the_end():
    # the first input_json_delta is often "" (provider-streams.md section 3.2)
    document = fed("", '{"location": "San Fra', 'ncisco, CA"}')
    assert document.raw == '{"location": "San Francisco, CA"}'
    assert document.complete()
    assert document.value() == {"location": "San Francisco, CA"}


def test_a_prefix_that_parses_is_not_the_document():
    document = fed("1")
    assert document.value() == 1
    document.feed("2")
    assert document.value() == 12
    document.feed(" ")
    document.feed("3")
    with pytest.raises(JSONIncomplete) as failure:
        document.value()
    assert failure.value.position == 3 and not failure.value.truncated


@pytest.mark.parametrize("fragments", [(), ("",), ("", ""), (" ", "\n")])
def test_no_arguments_mean_an_empty_object(fragments):
    assert fed(*fragments).value() == {}


def test_cut_off_text_reports_where_and_that_it_was_cut():
    document = fed('{"city": "Par')
    assert not document.complete()
    with pytest.raises(JSONIncomplete) as failure:
        document.value()
    assert failure.value.truncated and failure.value.position == len(document.raw)
    assert isinstance(failure.value, ValueError)


def test_broken_text_is_not_called_truncated():
    with pytest.raises(JSONIncomplete) as failure:
        fed('{"a": 1', ", ]", "}").value()
    assert not failure.value.truncated
    assert failure.value.position == 9


def test_positions_count_characters_not_bytes():
    document = fed('{"v": "\u00e9\u00e9', '\u00e9"', ", x}")
    with pytest.raises(JSONIncomplete) as failure:
        document.value()
    assert document.raw[failure.value.position] == "x"


def test_raw_is_kept_exactly_even_when_it_is_not_json():
    document = fed("not ", "json")
    assert document.raw == "not json" and not document.complete()


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=12,
    ),
    st.lists(st.integers(0, 200), max_size=8),
)
def test_any_split_of_a_document_gives_the_document(value, cuts):
    text = json.dumps(value, ensure_ascii=False)
    document = IncrementalJSON()
    last = 0
    for cut in sorted(set(cut % (len(text) + 1) for cut in cuts)) + [len(text)]:
        document.feed(text[last:cut])
        last = cut
    assert document.raw == text
    assert document.value() == value


@pytest.mark.parametrize("text", ['{"a": 1}\u00a0', '{"a": 1,\u2028', "[1, 2\x0b"])
def test_text_ending_in_what_is_not_json_whitespace_is_broken_not_truncated(text):
    """U+00A0, U+2028 and VT are whitespace to Python but not to JSON: no continuation repairs them."""
    with pytest.raises(JSONIncomplete) as failure:
        fed(text).value()
    assert not failure.value.truncated
