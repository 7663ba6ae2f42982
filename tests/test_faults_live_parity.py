"""One fault spec, one served body: live in a real `mitmdump -s addon/tap.py` (the fault in
``x-streamtap-fault``, a plain `streamtap serve` as the upstream, sending the recording's
bytes) and in replay (`streamtap serve --fault-header`). Event positions count the events as
served in both, also after a drop or a duplicate. A live spec that would need the middle of
a stream still arriving, or an error kind the stream's dialect never carries, is refused: the
flow passes untouched with one log line, and `serve` exits 2 at start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from upstream import Mitmdump

import streamtap as streamtap_package
from streamtap.replay.faults import parse_faults, plan
from streamtap.replay.source import load_source

pytestmark = pytest.mark.slow

STREAMTAP = Path(sys.executable).with_name("streamtap")
REPO = Path(__file__).resolve().parents[1]
RECORDINGS = {
    "anthropic": REPO / "recordings" / "anthropic.jsonl",
    "openai": REPO / "recordings" / "openai-chat.jsonl",
    "bedrock": Path(streamtap_package.__file__).parent / "data" / "demo" / "04_bedrock-complete_complete.jsonl",
}


class Serve:
    """`streamtap serve` on a free loopback port, for the recordings above."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.log_path = workdir / "serve.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([str(STREAMTAP), "serve", *args, *map(str, RECORDINGS.values())],
                                            stdout=subprocess.PIPE, stderr=log, text=True)
        self.url = self.process.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.log_path.read_text()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    work = tmp_path_factory.mktemp("live-parity")
    upstream = Serve(work / "upstream")
    replay = Serve(work / "replay", "--fault-header")
    try:
        with Mitmdump(upstream.url, work / "mitm", options={"streamtap_fault_header": "true"}) as mitm:
            yield replay, mitm
    finally:
        upstream.stop()
        replay.stop()


def ask(base_url: str, name: str, fault: str) -> bytes:
    """The body a client gets for the recording's own request, with ``fault`` in the header."""
    request = json.loads(RECORDINGS[name].read_text().split("\n", 1)[0])["request"]
    path = httpx.URL(request["url"]).raw_path.decode()
    response = httpx.request(request["method"], base_url + path, content=json.dumps(request["body"]).encode(),
                             headers={"content-type": "application/json", "x-streamtap-fault": fault}, timeout=15)
    assert response.status_code == 200, response.text
    return response.content


SPECS = ["drop:event=1;cut:event=3", "duplicate:event=1;cut:event=3", "duplicate:event=1;drop:event=3;cut:event=4"]


@pytest.mark.parametrize("name", list(RECORDINGS))
@pytest.mark.parametrize("fault", SPECS)
def test_live_and_replay_serve_the_same_body_for_one_spec(servers, name, fault):
    replay, mitm = servers
    expected = plan(load_source(RECORDINGS[name]), parse_faults(fault)).body
    assert ask(replay.url, name, fault) == expected
    assert ask(mitm.url, name, fault) == expected, mitm.log()[-3000:]


@pytest.mark.parametrize(
    "name, fault, give",
    [
        ("anthropic", "error:kind=overloaded_error", "after"),
        ("openai", "corrupt:field=payload", "frame"),
        ("bedrock", "cut:at=prelude", "event"),
    ],
)
def test_live_refuses_a_spec_that_would_need_the_middle_of_the_stream(servers, name, fault, give):
    _replay, mitm = servers
    assert ask(mitm.url, name, fault) == load_source(RECORDINGS[name]).body
    mitm.wait_log(f"fault not applied: '{fault}': give {give}=N on live traffic")


def test_live_refuses_an_error_kind_the_dialect_never_carries(servers):
    _replay, mitm = servers
    fault = "error:kind=openai,after=3"
    assert ask(mitm.url, "anthropic", fault) == load_source(RECORDINGS["anthropic"]).body
    mitm.wait_log(f"fault not applied: '{fault}': error kind 'openai' does not fit the anthropic dialect; use one of overloaded_error")


@pytest.mark.parametrize(
    "recording, fault",
    [("anthropic", "error:kind=openai,after=14"), ("openai", "error:kind=overloaded_error,after=3")],
)
def test_serve_refuses_an_error_kind_the_dialect_never_carries_at_start(recording, fault):
    got = subprocess.run([str(STREAMTAP), "serve", "--port", "0", "--fault", fault, str(RECORDINGS[recording])],
                         capture_output=True, text=True, timeout=30)
    assert got.returncode == 2, (got.returncode, got.stdout, got.stderr)
    assert got.stderr.startswith("streamtap serve: ") and got.stderr.count("\n") == 1, got.stderr
    assert "does not fit the" in got.stderr and "dialect; use one of" in got.stderr, got.stderr
