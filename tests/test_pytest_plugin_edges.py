"""The pytest plugin at its edges: faults that fit a recording one by one but not together,
and ``ignore_fields`` given as one name. Run by pytest itself (pytester, in a subprocess),
against real replay servers."""

from __future__ import annotations

import pytest
from replay_streams import WORDS, openai_chat_frames, write_recording

pytest_plugins = ["pytester"]

TESTS = '''
import json, urllib.request
import pytest

BODY = {"model": "gpt-4.1-nano", "stream": True, "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def fetch(server, **changes):
    request = urllib.request.Request(
        server.base_url + "/v1/chat/completions",
        data=json.dumps(BODY | changes).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


# each fits weather.jsonl alone; together they do not: the error ends the stream after
# event 3, a corrupt event leaves no before-terminal position, short.jsonl's tail is 3 events
@pytest.mark.streamtap_faults(
    "error:kind=openai,after=3;cut:event=12",
    "corrupt:frame=3;cut:at=before-terminal",
    "swap-tail:with=short.jsonl,at=1;cut:event=12",
)
def test_misfit_together(streamtap_replay):
    """Meant to fail at set-up: served, the request would get an HTTP 400, which the
    pytest.raises below would take for the failure under test."""
    with pytest.raises(Exception):
        fetch(streamtap_replay("weather.jsonl"))


@pytest.mark.streamtap_faults("error:kind=openai,after=3;cut:event=2", "swap-tail:with=short.jsonl,at=1;cut:event=3")
def test_fit_together(streamtap_replay):
    status, body = fetch(streamtap_replay("weather.jsonl"))
    assert status == 200 and body


def test_one_ignored_field_as_a_str(streamtap_replay):
    assert fetch(streamtap_replay("weather.jsonl", ignore_fields="model"), model="another-model")[0] == 200
'''


@pytest.mark.slow
def test_faults_are_checked_together_and_a_str_is_one_field(pytester):
    write_recording(pytester.path / "weather.jsonl", "openai", openai_chat_frames(words=12))  # 20 events
    write_recording(pytester.path / "short.jsonl", "openai", openai_chat_frames(words=2, tool=False))  # 5 events
    pytester.makepyfile(test_edges=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rf")
    out = result.stdout.str()
    result.assert_outcomes(passed=3, failed=3)
    for spec, reason in [
        ("error:kind=openai,after=3;cut:event=12", "'cut:event=12': event 12 does not exist"),
        ("corrupt:frame=3;cut:at=before-terminal", "'cut:at=before-terminal': this sse recording has no before-terminal position"),
        ("swap-tail:with=short.jsonl,at=1;cut:event=12", "'cut:event=12': event 12 does not exist"),
    ]:
        result.stdout.fnmatch_lines([f"*test_misfit_together?{spec}?*", f"streamtap_replay: *{reason}*"])
    assert "test_fit_together" not in out.split("short test summary")[-1], out
    assert "test_one_ignored_field_as_a_str" not in out.split("short test summary")[-1], out


SWAP_TEST = '''
import json, urllib.request

BODY = {"model": "gpt-4.1-nano", "stream": True, "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def test_swap_tail_names_the_file_beside_this_test(streamtap_replay):
    server = streamtap_replay("weather.jsonl", fault="swap-tail:with=other.jsonl,at=2")
    request = urllib.request.Request(server.base_url + "/v1/chat/completions", data=json.dumps(BODY).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    assert b"zebra" in body and b"garbage" not in body
'''


def marked(frames: list[bytes], word: bytes) -> list[bytes]:
    """The frames with every word of the answer replaced by ``word``."""
    for original in WORDS[:6]:
        frames = [frame.replace(original.encode(), word) for frame in frames]
    return frames


def test_a_swap_tail_recording_resolves_beside_the_test_not_in_the_current_directory(pytester):
    """README: paths resolve against the test file's folder, whatever the current directory; a
    file of the same name there must not be served instead."""
    tests = pytester.mkdir("tests")
    write_recording(tests / "weather.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    write_recording(tests / "other.jsonl", "openai", marked(openai_chat_frames(words=6, tool=False), b"zebra"))
    write_recording(pytester.path / "other.jsonl", "openai", marked(openai_chat_frames(words=6, tool=False), b"garbage"))
    (tests / "test_swap.py").write_text(SWAP_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "tests/test_swap.py")
    result.assert_outcomes(passed=1)


def test_a_swap_tail_recording_only_in_the_current_directory_is_not_taken(pytester):
    """Not beside the test nor beside the served recordings: the test fails naming the path beside
    the test, from whatever directory pytest runs (it passed run from the folder holding it)."""
    tests = pytester.mkdir("tests")
    write_recording(tests / "weather.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    write_recording(pytester.path / "other.jsonl", "openai", marked(openai_chat_frames(words=6, tool=False), b"garbage"))
    (tests / "test_swap.py").write_text(SWAP_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "tests/test_swap.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*no recording '{tests / 'other.jsonl'}'*"])


def test_a_swap_tail_recording_beside_the_served_recordings_is_taken(pytester):
    tests = pytester.mkdir("tests")
    recordings = tests / "recordings"
    recordings.mkdir()
    write_recording(recordings / "weather.jsonl", "openai", openai_chat_frames(words=6, tool=False))
    write_recording(recordings / "other.jsonl", "openai", marked(openai_chat_frames(words=6, tool=False), b"zebra"))
    write_recording(pytester.path / "other.jsonl", "openai", marked(openai_chat_frames(words=6, tool=False), b"garbage"))
    (tests / "test_swap.py").write_text(SWAP_TEST.replace('streamtap_replay("weather.jsonl"', 'streamtap_replay("recordings"'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "tests/test_swap.py")
    result.assert_outcomes(passed=1)


WRONG_ARGUMENTS = {  # (the call, what the failure says, what the traceback it gave named)
    "fault as a list": ('fault=["cut:event=3"]',
                        "fault= takes one spec string (several joined with ';') or None, not list ['cut:event=3']", "TypeError"),
    "timing None": ("timing=None", "timing= takes a string (fast, original or scale=N), not NoneType None", "AttributeError"),
}


@pytest.mark.parametrize("name", sorted(WRONG_ARGUMENTS))
def test_an_argument_of_the_wrong_type_fails_the_test_in_one_line_as_on_the_marker(pytester, name):
    """A list for fault= failed inside the fault parser with `ord() expected a character`, and None
    for timing= with an AttributeError: tracebacks of streamtap's, where the marker given a list
    says what it takes."""
    call, said, raised = WRONG_ARGUMENTS[name]
    write_recording(pytester.path / "weather.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    pytester.makepyfile(test_call=f'def test_call(streamtap_replay):\n    streamtap_replay("weather.jsonl", {call})\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rf")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"streamtap_replay: {said}" in out
    assert raised not in out and "faults.py" not in out, out
