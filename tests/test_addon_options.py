"""Every streamtap_* option is checked when mitmdump starts: a bad value stops a real
mitmdump at start with a message naming the option, instead of being found per flow."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from replay_streams import openai_chat_frames, write_recording

from upstream import CHAT, Mitmdump, Script, Upstream, curl


def a_file(tmp: Path) -> str:
    path = tmp / "a-file"
    path.write_text("not a directory")
    return str(path)


def no_tool_recordings(tmp: Path) -> str:
    directory = tmp / "recs"
    directory.mkdir()
    write_recording(directory / "a.jsonl", "openai", openai_chat_frames(words=3, tool=False))
    write_recording(directory / "b.jsonl", "openai", openai_chat_frames(words=4, tool=False))
    return str(directory)


def empty_dir(tmp: Path) -> str:
    (tmp / "empty").mkdir()
    return str(tmp / "empty")


# option -> (its bad values: a value, or a function of tmp_path returning the --set items, and what the message says)
BAD = [
    ("streamtap_dir", lambda tmp: {"streamtap_dir": a_file(tmp)}, "is not one"),
    ("streamtap_dir", lambda tmp: {"streamtap_dir": a_file(tmp) + "/recordings"}, "cannot be a directory"),
    ("streamtap_dir", "/proc/streamtap-recordings", "cannot be created: /proc is not writable"),  # even as root
    # pathlib raised on these (RuntimeError, OSError): a traceback at start, and at runtime a set that was kept but not applied
    ("streamtap_dir", "~no-such-user-of-streamtap/recordings", "no home folder for '~no-such-user-of-streamtap'"),
    ("streamtap_dir", "/tmp/" + "a" * 300 + "/recordings", "cannot be a directory (File name too long)"),
    ("streamtap_fsync", "sometimes", "not one of always, end, never"),
    ("streamtap_filter", "~q ~~~(", "Invalid filter expression"),
    ("streamtap_filter", "~u /v1/ & ~bs done", "~bs (the response body) can never match"),
    ("streamtap_redact", "x-one,x-two", "is not a header or query parameter name"),
    ("streamtap_redact_allow", "x-one x-two", "is not a header or query parameter name"),
    ("streamtap_sentinel", "", "empty; an empty sentinel"),  # an unset shell variable: mitmproxy takes "" for no option
    ("streamtap_sentinel", "   ", "only whitespace"),
    ("streamtap_sentinel", "END\nEND", "spans lines"),
    ("streamtap_record", "maybe", "boolean must be"),
    ("streamtap_max_event", "0", "outside 1.."),
    ("streamtap_max_event", "lots", "not an integer"),
    ("streamtap_workers", "-1", "-1 is outside 0..64 processes"),
    ("streamtap_workers", "many", "not an integer"),
    ("streamtap_replay", lambda tmp: {"streamtap_replay": str(tmp / "missing")}, "no such file or directory"),
    ("streamtap_replay", lambda tmp: {"streamtap_replay": empty_dir(tmp)}, "no recordings"),
    ("streamtap_replay", "", "an empty path (an unset shell variable?)"),  # not the folder mitmdump runs in
    ("streamtap_replay_unmatched", "sometimes", "not one of 404, upstream"),
    ("streamtap_replay_timing", "slow", "timing is fast, original or scale=N"),
    ("streamtap_replay_ignore", "messages..content", "not a dotted JSON field path"),
    ("streamtap_replay_once", "twice", "boolean must be"),
    ("streamtap_replay_assign_ids", "yes", "boolean must be"),
    ("streamtap_fault", "cut:nowhere=1", "cut takes"),
    ("streamtap_fault", "stall:after=1,secs=2", "works on replays only"),
    # refused whatever the stream, as serve --fault and the fault header refuse them
    ("streamtap_fault", "drop:event=-1", "event -1 does not exist"),
    ("streamtap_fault", "cut:at=tool-args,event=1", "event= picks the message of at=prelude or at=crc"),
    ("streamtap_fault", "cut:at=crc,event=-1", "event -1 is no message"),
    (
        "streamtap_fault",
        lambda tmp: {"streamtap_replay": no_tool_recordings(tmp), "streamtap_fault": "cut:at=tool-args"},
        "has no tool-args position (nor any of the other 1 recordings)",
    ),
    ("streamtap_fault_header", "x", "boolean must be"),
    # a name no addon declares: mitmproxy keeps it aside without a word
    ("streamtap_faults", "cut:event=1", "no such option; did you mean streamtap_fault?"),
    ("streamtap_zzzzzzzzzzzzzzzzzzzzzz", "1", "no such option; streamtap's options are streamtap_compress, "),
]


def _start_with(tmp: Path, option: str, value) -> tuple[dict, subprocess.CompletedProcess | None]:
    """mitmdump started with one bad value, run to its end: (the --set items, its result; None if it kept running)."""
    options = value(tmp) if callable(value) else {option: value}
    proxy = Mitmdump("http://127.0.0.1:9", tmp / "m", options=options)
    try:
        return options, subprocess.run(proxy.args, capture_output=True, text=True, timeout=40, cwd=proxy.workdir)
    except subprocess.TimeoutExpired:
        return options, None


@pytest.fixture(scope="module")
def started_with_bad_values(tmp_path_factory) -> list:
    """Every BAD case's mitmdump, a few at a time: each is a process that stops at its start, so
    they need not wait for one another (one by one, they took a sixth of this file's time each)."""
    from concurrent.futures import ThreadPoolExecutor

    folders = [tmp_path_factory.mktemp("bad") for _ in BAD]  # made here: mktemp numbers its folders racily
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda case, tmp: _start_with(tmp, case[0], case[1]), BAD, folders))


@pytest.mark.parametrize(("index", "option", "message"), [(i, o, m) for i, (o, _, m) in enumerate(BAD)],
                         ids=[f"{o}-{i}" for i, (o, _, _) in enumerate(BAD)])
def test_a_bad_value_stops_mitmdump_at_start_naming_the_option(started_with_bad_values, index, option, message):
    options, result = started_with_bad_values[index]
    if result is None:
        pytest.fail(f"mitmdump took --set {options} and kept running")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert f"{option}:" in out and message in out, out
    assert "Traceback" not in out, out  # a user's mistake is one line, not a stack


def test_a_wrongly_typed_value_in_config_yaml_stops_mitmdump_at_start_naming_it_without_a_traceback(tmp_path):
    """mitmproxy applies config.yaml's streamtap_* values only once the script has loaded, and a
    value of the wrong type then failed in its script loader with a stack; each is named instead."""
    proxy = Mitmdump("http://127.0.0.1:9", tmp_path)
    proxy.confdir.mkdir(parents=True, exist_ok=True)
    (proxy.confdir / "config.yaml").write_text(
        'streamtap_workers: "two"\nstreamtap_record: maybe\nstreamtap_redact: x-one\nstreamtap_sentinel: 5\n'
        "streamtap_max_event: true\nstreamtap_fsync: end\n"
    )
    result = subprocess.run(proxy.args, capture_output=True, text=True, timeout=40, cwd=proxy.workdir)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    file = "in mitmproxy's options file"
    assert f"streamtap_workers: 'two' {file} is not an integer" in out, out
    assert f"streamtap_record: 'maybe' {file} is not true or false" in out, out
    assert f"streamtap_redact: 'x-one' {file} is not a list of strings" in out, out
    assert f"streamtap_sentinel: 5 {file} is not a string" in out, out
    assert f"streamtap_max_event: True {file} is not an integer" in out, out  # YAML's true: an int to Python
    assert "streamtap_fsync" not in out, out  # a good value says nothing
    assert "Traceback" not in out, out


def test_good_values_of_every_option_start_and_tap(tmp_path):
    recordings = tmp_path / "recs"
    recordings.mkdir()
    write_recording(recordings / "tool.jsonl", "openai", openai_chat_frames(words=3, tool=True))
    options = {
        "streamtap_dir": str(tmp_path / "not" / "yet" / "there"),  # created with the first recording
        "streamtap_fsync": "never",
        "streamtap_filter": "~u /s/",
        "streamtap_redact": "x-secret",
        "streamtap_sentinel": "END",
        "streamtap_record": "true",
        "streamtap_max_event": "65536",
        "streamtap_workers": "2",
        "streamtap_replay": str(recordings),
        "streamtap_replay_unmatched": "upstream",
        "streamtap_replay_timing": "scale=0.5",
        "streamtap_replay_ignore": "metadata.user_id",
        "streamtap_replay_once": "false",
        "streamtap_replay_assign_ids": "true",
        "streamtap_fault": "cut:at=tool-args",  # the recording has a tool call
        "streamtap_fault_header": "true",
    }
    body = b"data: {}\n\n"
    with Upstream() as up:
        up.add("good", Script(body, content_type="text/event-stream"))
        with Mitmdump(up.url, tmp_path / "m", options=options) as proxy:
            out = curl(f"{proxy.url}/s/good{CHAT}", max_time=20)
            assert out.returncode == 0 and out.stdout == body
            proxy.wait_log("streamtap: ")
    assert list((tmp_path / "not" / "yet" / "there").glob("*.jsonl"))


def test_values_no_start_option_can_hold_are_refused_when_set_at_runtime():
    """An options file loaded at runtime (mitmproxy's options.load) is typed by YAML and checked by
    mitmproxy, which takes true for an integer and a NUL inside a path: the addon's own checks,
    which configure() runs on every update, refuse both."""
    from mitmproxy.exceptions import OptionsError

    from streamtap.mitm import option_checks

    with pytest.raises(OptionsError, match="True is not an integer"):
        option_checks.size("streamtap_max_event", True, 1, 10)
    with pytest.raises(OptionsError, match="holds a NUL character"):
        option_checks.writable_dir("streamtap_dir", "/tmp/recordings\0x")
