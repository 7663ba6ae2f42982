"""`streamtap demo` runs offline and shows both verdicts; the bundled recordings are reproducible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo_recordings import generate
from streamtap.recording import check_recording, read_recording
from upstream import MITMDUMP, REPO

BUNDLED = REPO / "addon" / "streamtap" / "data" / "demo"  # package data: the wheel carries them


@pytest.mark.slow
def test_demo_shows_a_complete_and_a_cut_turn(tmp_path):
    # a machine behind a company proxy: the SDKs follow these, and the demo must stay on loopback
    dead_proxy = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": dead_proxy, "HTTPS_PROXY": dead_proxy, "http_proxy": dead_proxy, "https_proxy": dead_proxy}
    env.pop("PYTHONUNBUFFERED", None)  # a user's shell: mitmdump's log reaches its file a block at a time unless the demo asks
    result = subprocess.run(
        [sys.executable, "-m", "streamtap.cli", "demo", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120, env=env
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "demo: OK" in out
    taps = [line for line in out.splitlines() if line.strip().startswith("streamtap: ")]
    assert len(taps) == 4
    assert sum(" complete" in line for line in taps) == 2 and sum(" truncated (" in line for line in taps) == 2
    assert "<- no error raised" in out  # the clean cut the SDK swallowed
    written = sorted(tmp_path.glob("*.jsonl"))
    assert len(written) == 4
    for path in written:
        assert check_recording(read_recording(path)) == []


@pytest.mark.slow
def test_demo_runs_from_a_folder_holding_a_streamtap_of_its_own_and_with_the_user_s_settings(tmp_path):
    """The demo's replay server is a Python process of its own: a streamtap.py in the folder the
    demo runs from (someone's script, a checkout's addon/) is not what it imports."""
    here = tmp_path / "work"
    here.mkdir()
    (here / "streamtap.py").write_text("raise SystemExit('the wrong streamtap was imported')\n")
    # the analysis worker is a new Python too, and imports the standard library's socket
    (here / "socket.py").write_text("raise SystemExit('the wrong socket was imported')\n")
    # the user's settings for real calls: a SOCKS proxy httpx cannot use, a CA file and an AWS
    # profile that are not there; the demo's clients talk to loopback with keys of their own
    env = {**os.environ, "ALL_PROXY": "socks5://127.0.0.1:9", "SSL_CERT_FILE": str(tmp_path / "none.pem"),
           "AWS_PROFILE": "no-such-profile"}
    out = tmp_path / "out"
    out.mkdir()
    (out / "19990101T000000.000Z_openai-chat_x.partial.jsonl").write_text("")  # another writer's, not the demo's
    result = subprocess.run([str(Path(sys.executable).with_name("streamtap")), "demo", "--dir", str(out)],
                            capture_output=True, text=True, timeout=120, cwd=here, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo: OK" in result.stdout


@pytest.mark.slow
def test_bundled_recordings_are_what_the_tooling_makes(tmp_path):
    bundled = sorted(BUNDLED.glob("*.jsonl"))
    fresh = generate(tmp_path)
    assert [p.name for p in fresh] == [p.name for p in bundled]
    for old_path, new_path in zip(bundled, fresh):
        old, new = read_recording(old_path), read_recording(new_path)
        assert old.body == new.body, old_path.name
        assert old.verdict["kind"] == new.verdict["kind"]
        # an SDK that stops reading at [DONE] may close before the proxy sees the body end: a
        # race between client and upstream, so only the provider's own reset must repeat
        assert (old.end["stream_end"] == "upstream_reset") == (new.end["stream_end"] == "upstream_reset")
        assert old.header["request"]["body"] == new.header["request"]["body"]
        assert check_recording(old) == []


def test_demo_dir_that_is_a_file_is_a_usage_error(tmp_path):
    not_a_dir = tmp_path / "recordings"
    not_a_dir.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "streamtap.cli", "demo", "--dir", str(not_a_dir)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.strip() == f"streamtap demo: --dir {not_a_dir}: exists and is not a directory"


def test_demo_proxy_that_fails_to_start_is_stopped(tmp_path, monkeypatch):
    """Ctrl-C (or a start timeout) while waiting for mitmdump's port: the process is not left running."""
    from streamtap.commands import demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_wait_port", interrupted)
    proxy = demo.Proxy("http://127.0.0.1:9", tmp_path, tmp_path / "rec")
    with pytest.raises(KeyboardInterrupt):
        with proxy:
            pass
    try:
        assert proxy.process.poll() is not None, "mitmdump still running after a failed start"
        assert proxy._log.closed
    finally:
        if proxy.process.poll() is None:
            proxy.process.kill()
            proxy.process.wait()


def test_addon_verb_prints_the_script_mitmproxy_loads(tmp_path):
    """`streamtap addon` prints an absolute path to the package's script, whatever the cwd."""
    result = subprocess.run([sys.executable, "-m", "streamtap.cli", "addon"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    script = Path(result.stdout.strip())
    as_module = subprocess.run([sys.executable, "-m", "streamtap", "addon"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert as_module.returncode == 0 and as_module.stdout == result.stdout, as_module.stderr
    assert script.is_absolute() and script.is_file()
    import streamtap

    assert script.is_relative_to(Path(streamtap.__file__).resolve().parent)
    listed = subprocess.run([str(MITMDUMP), "-s", str(script), "--options"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "streamtap_dir:" in listed.stdout, listed.stderr
