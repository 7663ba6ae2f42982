"""The pytest plugin, exercised the way a user would: a test file using the openai SDK
against the `streamtap_replay` fixture, parametrized over faults with the marker, run
by pytest itself (pytester, in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from replay_streams import openai_chat_frames, write_recording

pytest_plugins = ["pytester"]

def documented_example() -> str:
    """The complete example in the plugin's docstring (the README points there), as a test file."""
    from streamtap.replay import pytest_plugin

    doc = pytest_plugin.__doc__
    block = doc[doc.index("::\n\n") + 4 :]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


MORE = '''
import pytest

from suite.test_example import IncompleteAnswer, answer, client_for


@pytest.mark.streamtap_faults("cut:event=5,style=clean")
def test_a_careless_check_fails(streamtap_replay):
    """Meant to fail: a clean cut goes through the SDK without an exception."""
    server = streamtap_replay("weather.jsonl")
    stream = client_for(server).chat.completions.create(model="m", messages=[], stream=True)
    with pytest.raises(Exception):
        list(stream)


@pytest.mark.streamtap_faults("cut:at=tool-args,style=abort")
def test_a_fault_that_fits_no_recording(streamtap_replay):
    """Meant to fail at set-up: this answer has no tool call to cut inside."""
    with pytest.raises(Exception):
        answer(client_for(streamtap_replay("plain.jsonl")))


@pytest.mark.streamtap_faults("cut:at=tool-args,style=abort")
def test_a_fault_that_misses_one_of_the_recordings(streamtap_replay):
    """Meant to fail at set-up: a request matching plain.jsonl would get an HTTP 400."""
    with pytest.raises(Exception):
        answer(client_for(streamtap_replay("weather.jsonl", "plain.jsonl")))


def test_served_log_names_the_fault(streamtap_replay):
    server = streamtap_replay("weather.jsonl", fault="cut:event=5,style=abort")
    with pytest.raises(IncompleteAnswer, match="connection broken"):
        answer(client_for(server))
    assert server.served[0].recording.endswith("weather.jsonl")
    assert server.served[0].log[0].startswith("cut:event=5,style=abort")


def test_a_missing_recording(streamtap_replay):
    streamtap_replay("nowhere.jsonl")
'''


@pytest.mark.slow
def test_fixture_and_marker_in_a_real_pytest_run(pytester):
    """The documented example passes as written; recordings resolve beside the test file, not
    in the current directory (pytest runs from the folder above); a fault that fits no recording
    fails the test at set-up with its reason, even inside ``pytest.raises(Exception)``."""
    here = pytester.mkpydir("suite")
    write_recording(here / "weather.jsonl", "openai", openai_chat_frames(words=12))
    write_recording(here / "plain.jsonl", "openai", openai_chat_frames(words=12, tool=False))
    (here / "test_example.py").write_text(documented_example())
    (here / "test_more.py").write_text(MORE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rf", "suite")
    result.assert_outcomes(passed=4, failed=4)
    out = result.stdout.str()
    for name in ("test_full_answer", "test_cut_answers_are_refused[cut:event=5,style=clean]",
                 "test_cut_answers_are_refused[cut:at=tool-args,style=abort]", "test_served_log_names_the_fault"):
        assert f"FAILED suite/test_example.py::{name}" not in out and f"FAILED suite/test_more.py::{name}" not in out, out
    result.stdout.fnmatch_lines(["FAILED suite/test_more.py::test_a_careless_check_fails*"])
    result.stdout.fnmatch_lines([
        "*test_a_fault_that_fits_no_recording*",
        "streamtap_replay: a fault does not fit the recording (plain.jsonl: 'cut:at=tool-args,style=abort': *tool*",
    ])
    result.stdout.fnmatch_lines([
        "*test_a_fault_that_misses_one_of_the_recordings*",
        "streamtap_replay: a fault does not fit the recording (plain.jsonl: *",
    ])
    result.stdout.fnmatch_lines(["*test_a_missing_recording*", "streamtap_replay: */suite/nowhere.jsonl: no such file or directory"])
    assert "During handling" not in out


def test_the_marker_needs_a_spec(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.streamtap_faults()
        def test_x(streamtap_replay):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    assert "needs at least one fault spec" in result.stdout.str() + result.stderr.str()


def test_the_plugin_module_imports_nothing_heavy():
    code = (
        "import sys, streamtap.replay.pytest_plugin as p; "
        "heavy = [m for m in ('streamtap.replay.server', 'mitmproxy', 'asyncio', 'openai') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "streamtap.replay.server" not in out.stdout and "mitmproxy" not in out.stdout
