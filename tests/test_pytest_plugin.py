"""The pytest plugin, exercised the way a user would: a test file using the openai SDK
against the `streamtap_replay` fixture, parametrized over faults with the marker, run
by pytest itself (pytester, in a subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from replay_streams import openai_chat_frames, write_recording

pytest_plugins = ["pytester"]

EXAMPLE = '''
import openai
import pytest

RECORDING = "weather.jsonl"


def answer(client):
    """The app under test: the careful version checks that the answer finished."""
    text, finish = [], None
    stream = client.chat.completions.create(
        model="gpt-4.1-nano", messages=[{"role": "user", "content": "Weather in Paris?"}], stream=True
    )
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    if finish is None:
        raise RuntimeError("incomplete answer")
    return "".join(text)


def client_for(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="test", max_retries=0)


def test_full_answer(streamtap_replay):
    server = streamtap_replay(RECORDING)
    assert answer(client_for(server)).startswith("The weather in Paris")
    assert server.served[0].recording.endswith("weather.jsonl")


@pytest.mark.streamtap_faults("cut:event=5,style=clean", "cut:at=tool-args,style=abort")
def test_cut_answers_are_refused(streamtap_replay, streamtap_fault):
    server = streamtap_replay(RECORDING)
    with pytest.raises(Exception):
        answer(client_for(server))
    assert server.served[0].log[0].startswith(streamtap_fault)


@pytest.mark.streamtap_faults("cut:event=5,style=clean")
def test_a_careless_check_fails(streamtap_replay):
    """Meant to fail: a clean cut goes through the SDK without an exception."""
    server = streamtap_replay(RECORDING)
    stream = client_for(server).chat.completions.create(model="m", messages=[], stream=True)
    with pytest.raises(Exception):
        list(stream)
'''


@pytest.mark.slow
def test_fixture_and_marker_in_a_real_pytest_run(pytester, tmp_path):
    write_recording(pytester.path / "weather.jsonl", "openai", openai_chat_frames(words=12))
    pytester.makepyfile(test_example=EXAMPLE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*1 failed, 3 passed*"])
    assert "test_a_careless_check_fails" in result.stdout.str()


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
