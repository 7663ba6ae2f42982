"""The command line where a user's input or a signal meets it:

- show wraps an answer line indented deeper than the width without hanging (textwrap never
  returns when the indent leaves no room), and a long line without spaces in linear time;
- demo stopped by SIGTERM ends its replay server and mitmdump and removes its folder, as Ctrl-C does;
- import prints a capture's model name and URL escaped, as show and report do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interception import openai_chat_stream


def streamtap(*args, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtap.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


@pytest.mark.parametrize("indent, width", [(" " * 120, 100), ("\t" * 101, 100), (" " * 48, 40), (" " * 30, 40)])
def test_show_prints_a_line_indented_past_the_width(tmp_path, indent, width):
    answer = f"code:\n{indent}x = 1  # a comment long enough to need wrapping at this width, one way or the other"
    body = tmp_path / "indented.sse"
    body.write_bytes(openai_chat_stream([answer]))
    result = streamtap("show", body, "--width", width, timeout=20)
    assert result.returncode == 0, result.stderr
    assert "x = 1" in result.stdout and "other" in result.stdout
    assert all(len(line) <= width + 8 for line in result.stdout.splitlines() if "x = 1" in line and len(indent) < width // 2)


def test_show_wraps_an_indented_line_at_its_own_indent(tmp_path):
    body = tmp_path / "wrapped.sse"
    body.write_bytes(openai_chat_stream(["    alpha beta gamma delta epsilon zeta eta theta"]))
    lines = streamtap("show", body, "--width", 24).stdout.splitlines()
    wrapped = [line for line in lines if any(word in line for word in ("alpha", "epsilon", "theta"))]
    assert wrapped and all(line.split("alpha")[0].endswith("    ") and not line.split("alpha")[0].endswith("     ")
                           for line in wrapped if "alpha" in line), lines  # the indent once, not twice


def test_show_wraps_a_long_line_without_spaces_in_the_time_a_spaced_one_takes():
    """A line of CJK text (base64, minified JSON) has no space to wrap at: textwrap cut it one line
    at a time, copying the rest each time, and took minutes for millions of characters."""
    from streamtap.commands.show import _wrap

    def seconds(text: str) -> float:
        start = time.perf_counter()
        assert len(_wrap(text, 100)) >= len(text) // 100
        return time.perf_counter() - start

    chars = 2_000_000
    spaced = seconds("lorem ipsum dolor sit amet " * (chars // 27))
    unspaced = seconds("这是一个没有空格的中文句子" * (chars // 13))
    assert unspaced < 3 * spaced + 0.5, (unspaced, spaced)  # it was 10 times the spaced line's, and growing with its square


def test_show_wraps_every_line_as_textwrap_does():
    """The faster cut of a long word changes no line: random lines of long words, hyphens, dashes,
    tabs, wide characters and spaces that are not ASCII, at widths and indents, wrap as textwrap wraps them."""
    import random
    import textwrap

    from streamtap.commands.show import _Wrapper

    rng = random.Random(5)
    pieces = ["a", "-", " ", "中", "\u3000", "\xa0", "\t", "x-y", "--", "b.", "—"]
    for _ in range(20_000):
        width = rng.randint(1, 14)
        indent = " " * rng.randint(0, (width - 1) // 2)
        line = "".join(rng.choice(pieces) * rng.choice([1, 1, 2, 5, 13, 40]) for _ in range(rng.randint(0, 10)))
        expected = textwrap.wrap(line, width, initial_indent=indent, subsequent_indent=indent)
        assert _Wrapper(width, initial_indent=indent, subsequent_indent=indent).wrap(line) == expected, (line, width, indent)


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stopped_by_a_signal_leaves_nothing_running_or_on_disk(tmp_path, signum):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    demo = subprocess.Popen([sys.executable, "-m", "streamtap.cli", "demo", "--dir", str(tmp_path / "rec")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    children: set[int] = set()
    try:
        for line in demo.stdout:  # the first question is asked: the replay server and mitmdump run
            if line.startswith("-> "):
                break
        children = _children(demo.pid)
        assert len(children) >= 2, children
        demo.send_signal(signum)
        ended = demo.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [child for child in children if _alive(child)]
    finally:  # whatever failed, nothing of the demo outlives the test
        if demo.poll() is None:
            demo.kill()
        for child in children:
            if _alive(child):
                os.kill(child, signal.SIGKILL)
    assert ended == 128 + signum
    assert not left, "the demo left its children running"
    assert list(temp.iterdir()) == [], "the demo left its temporary folder"


def test_import_prints_a_captures_text_escaped(tmp_path):
    from mitmproxy import http, io
    from mitmproxy.test import tflow

    model = "gpt-4o\x1b[2K\x1b[1Ainjected line\r\x1b]0;title\x07\u202eevil"
    chunk = lambda delta, finish=None: "data: " + json.dumps(  # noqa: E731
        {"id": "c1", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"
    body = (chunk({"role": "assistant", "content": "hi"}) + chunk({}, "stop") + "data: [DONE]\n\n").encode()
    capture = tmp_path / "capture.mitm"
    with capture.open("wb") as file:
        flow = tflow.tflow(resp=True)
        flow.request.host, flow.request.path = "api.openai.com", "/v1/chat/completions?note=\x1b[31mred"
        flow.request.content = b'{"model":"gpt-4o","stream":true,"messages":[]}'
        flow.response = http.Response.make(200, body, {"content-type": "text/event-stream"})
        io.FlowWriter(file).add(flow)
    result = streamtap("import", capture, "--out", tmp_path / "out", "--quiet")
    assert result.returncode == 0, result.stderr
    for control in ("\x1b", "\x07", "\r", "\u202e"):
        assert control not in result.stdout + result.stderr
    assert "gpt-4o\\x1b[2K\\x1b[1Ainjected line\\r\\x1b]0;title\\x07\\u202eevil" in result.stdout, result.stdout
