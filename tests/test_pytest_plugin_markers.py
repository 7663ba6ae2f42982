"""The pytest plugin's marker as pytest users stack it: a module's ``pytestmark`` and the test's
own marker both count, and a marker given the wrong arguments fails its test alone, saying how
to write it. Run by pytest itself (pytester, in a subprocess), against real replay servers."""

from __future__ import annotations

from replay_streams import openai_chat_frames, write_recording

pytest_plugins = ["pytester"]

STACKED = '''
import pytest

pytestmark = pytest.mark.streamtap_faults("cut:event=3,style=clean")


@pytest.mark.streamtap_faults("cut:event=5,style=abort")
def test_module_and_own(streamtap_fault, streamtap_replay):
    print("SERVED", streamtap_fault, streamtap_replay("weather.jsonl").base_url.startswith("http://"))


@pytest.mark.streamtap_faults(None)
@pytest.mark.streamtap_faults("cut:event=4,style=clean", "cut:event=3,style=clean")
def test_stacked(streamtap_fault):
    print("SERVED", streamtap_fault)
'''

MISUSED = '''
import pytest


@pytest.mark.streamtap_faults(["cut:event=3", "cut:event=4"])
def test_a_list(streamtap_fault):
    pass


@pytest.mark.streamtap_faults(5)
def test_a_number(streamtap_fault):
    pass


def test_unmarked_still_runs():
    pass
'''


def test_every_marker_on_a_test_gives_its_runs(pytester):
    write_recording(pytester.path / "weather.jsonl", "openai", openai_chat_frames(words=12))
    pytester.makepyfile(test_stacked=STACKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-s")
    result.assert_outcomes(passed=5)
    served = sorted(line[line.index("SERVED"):] for line in result.stdout.lines if "SERVED" in line)  # after -q's dots
    assert served == sorted([
        "SERVED cut:event=5,style=abort True", "SERVED cut:event=3,style=clean True",  # the test's and the module's
        "SERVED None", "SERVED cut:event=4,style=clean", "SERVED cut:event=3,style=clean",  # once each
    ]), result.stdout.str()


def test_a_marker_given_the_wrong_arguments_fails_its_test_alone(pytester):
    pytester.makepyfile(test_misused=MISUSED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, errors=2)  # failed at setup, as a marker without specs is
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_a_list*",
        "*streamtap_faults takes fault specs as separate strings (or None), not list*",
        "*ERROR at setup of test_a_number*",
        "*streamtap_faults takes fault specs as separate strings (or None), not int 5",
    ])
    assert "Traceback" not in result.stdout.str() and "AttributeError" not in result.stdout.str()


IN_PARAMS = '''
import pytest


@pytest.mark.parametrize("case", ["plain", pytest.param("cut", marks=pytest.mark.streamtap_faults("cut:event=3,style=clean"))])
def test_per_case(case, streamtap_fault, streamtap_replay):
    print("SERVED", case, streamtap_fault, streamtap_replay("weather.jsonl").base_url.startswith("http://"))


@pytest.mark.parametrize("case", [pytest.param("two", marks=pytest.mark.streamtap_faults("cut:event=3", "cut:event=4"))])
def test_two_specs_in_one_case(case, streamtap_fault):
    pass


@pytest.mark.streamtap_faults("cut:event=4")
@pytest.mark.parametrize("case", [pytest.param("both", marks=pytest.mark.streamtap_faults("cut:event=3"))])
def test_marked_twice(case, streamtap_fault):
    pass
'''


def test_a_marker_in_a_pytest_params_marks_gives_that_case_its_fault(pytester):
    """Parametrization does not see a pytest.param's marks: the case's one spec is its fault (it
    was silently left out); several specs, or a marker on the test too, fail the case saying so."""
    write_recording(pytester.path / "weather.jsonl", "openai", openai_chat_frames(words=12))
    pytester.makepyfile(test_params=IN_PARAMS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-s", "-rE")
    result.assert_outcomes(passed=2, errors=2)
    served = sorted(line[line.index("SERVED"):] for line in result.stdout.lines if "SERVED" in line)
    assert served == ["SERVED cut cut:event=3,style=clean True", "SERVED plain None True"], result.stdout.str()
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_two_specs_in_one_case*", "*streamtap_faults on a pytest.param takes one fault spec*",
        "*ERROR at setup of test_marked_twice*", "*streamtap_faults on a pytest.param cannot be combined with one on the test*",
    ])
