"""`streamtap demo`: the whole product in half a minute, offline, no API key.

A replay server (`streamtap serve`) plays the bundled recordings as a provider would;
`mitmdump -s "$(streamtap addon)"` sits in front of it in reverse mode; the real openai,
anthropic and boto3 clients talk to the proxy. Some turns arrive whole, some are cut —
one so cleanly that the SDK returns as if nothing happened. streamtap says which is which,
writes a recording per turn, and `streamtap verify` checks every recording.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import streamtap
from streamtap.cli import named_folder
from streamtap.commands.addon import script_path


PACKAGE = Path(streamtap.__file__).resolve().parent
ADDON = script_path()  # the mitmproxy script inside the installed package
BUNDLED = PACKAGE / "data" / "demo"  # package data: travels in the wheel
FAKE_KEY = "sk-demo-not-a-real-key"


@dataclass(frozen=True)
class DemoTurn:
    """One request the demo makes, and what streamtap should say about its answer."""

    name: str
    client: str  # what a person would call it
    expect: str  # the verdict the bundled recording holds
    story: str  # one line for the reader
    call: Callable[[str], str]  # base URL of the proxy -> what the app got (text), raises on a client error


def _openai_chat(prompt: str) -> Callable[[str], str]:
    def call(base: str) -> str:
        import openai

        client = openai.OpenAI(base_url=f"{base}/v1", api_key=FAKE_KEY, max_retries=0, timeout=20,
                               http_client=openai.DefaultHttpxClient(trust_env=False))  # (see _loopback_only)
        stream = client.chat.completions.create(
            model="gpt-4.1-mini", messages=[{"role": "user", "content": prompt}], stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    return call


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _anthropic_tools(prompt: str) -> Callable[[str], str]:
    def call(base: str) -> str:
        import anthropic

        client = anthropic.Anthropic(base_url=base, api_key=FAKE_KEY, max_retries=0, timeout=20,
                                     http_client=anthropic.DefaultHttpxClient(trust_env=False))  # (see _loopback_only)
        with client.messages.stream(
            model="claude-sonnet-4-6",
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=[WEATHER_TOOL],
            messages=[{"role": "user", "content": prompt}],
        ) as stream:
            message = stream.get_final_message()
        parts = []
        for block in message.content:
            if block.type == "text":
                parts.append(block.text)
            elif block.type == "tool_use":
                parts.append(f"[tool {block.name}({json.dumps(block.input)})]")
        return " ".join(parts)

    return call


def _bedrock_converse(prompt: str) -> Callable[[str], str]:
    def call(base: str) -> str:
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "bedrock-runtime",
            region_name="us-east-1",
            endpoint_url=base,
            aws_access_key_id="AKIADEMONOTAREALKEY0",
            aws_secret_access_key="demo-not-a-real-secret",
            config=Config(retries={"max_attempts": 1}, read_timeout=20),
        )
        response = client.converse_stream(
            modelId="anthropic.claude-3-5-haiku-20241022-v1:0", messages=[{"role": "user", "content": [{"text": prompt}]}]
        )
        return "".join(
            e["contentBlockDelta"]["delta"].get("text", "") for e in response["stream"] if "contentBlockDelta" in e
        )

    return call


TURNS = [
    DemoTurn(
        "openai-complete", "openai SDK, chat completions", "complete",
        "a whole answer", _openai_chat("Name three rivers in Europe."),
    ),
    DemoTurn(
        "openai-cut", "openai SDK, chat completions", "truncated",
        "the connection ended cleanly mid-answer: the SDK returns without an error", _openai_chat("Summarise Hamlet in two sentences."),
    ),
    DemoTurn(
        "anthropic-cut", "anthropic SDK, messages with thinking and a tool", "truncated",
        "the provider reset the connection inside the tool call's arguments", _anthropic_tools("What's the weather in Lyon?"),
    ),
    DemoTurn(
        "bedrock-complete", "boto3 bedrock-runtime, converse_stream", "complete",
        "a whole answer over AWS event-stream", _bedrock_converse("Say hello in French."),
    ),
]


# --- processes ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, process: subprocess.Popen, what: str, log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {timeout} s")


def _mitmdump() -> str:
    candidate = Path(sys.executable).with_name("mitmdump")
    found = str(candidate) if candidate.exists() else shutil.which("mitmdump")
    if not found:
        from streamtap.cli import UsageError

        raise UsageError("mitmdump is not installed next to this Python (pip install mitmproxy)")
    return found


class Proxy:
    """mitmdump with the streamtap addon, reverse mode in front of ``upstream``."""

    def __init__(self, upstream: str, workdir: Path, record_dir: Path) -> None:
        self.port = _free_port()
        self.log_path = workdir / "mitmdump.log"
        self.record_dir = record_dir
        self.args = [
            _mitmdump(), "--mode", f"reverse:{upstream}", "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
            "-s", str(ADDON), "--set", f"streamtap_dir={record_dir}", "--set", f"confdir={workdir / 'mitmproxy'}",
            "--set", "flow_detail=0",
        ]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Proxy:
        self._log = open(self.log_path, "wb")
        # its log goes to a file, which Python would fill a block at a time: the demo reads each
        # turn's line as it comes
        # PYTHONSAFEPATH: the analysis worker is a new Python, which would import a socket.py of the
        # user's folder in place of the standard one. Its own session: a Ctrl-C at the terminal
        # reaches the demo alone, which ends mitmdump so that it finishes its recordings
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"})
        try:
            _wait_port(self.port, self.process, "mitmdump", self.log_path)
        except BaseException:  # `with` calls __exit__ only after __enter__ returned
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()

    def tap_lines(self) -> list[str]:
        text = self.log_path.read_text(errors="replace")
        lines = [line.split("] ", 1)[-1] for line in text.splitlines() if "] streamtap:" in line]
        return [line for line in lines if not line.startswith("streamtap: analysis worker")]


class Replay:
    """`streamtap serve` on the bundled recordings, original timing."""

    def __init__(self, recordings: Path, workdir: Path) -> None:
        self.recordings = recordings
        self.log_path = workdir / "serve.log"

    def __enter__(self) -> Replay:
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            # -P: the folder the demo runs in is not put first on the path, where a streamtap.py or
            # a checkout's streamtap/ of its own would be imported in place of this one
            [sys.executable, "-P", "-m", "streamtap.cli", "serve", "--timing", "original", str(self.recordings)],
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True,
        )
        line = self.process.stdout.readline().decode().strip()
        if not line.startswith("http"):
            self.__exit__()
            raise RuntimeError(f"streamtap serve did not start: {self.log_path.read_text(errors='replace')[-2000:]}")
        self.url = line.rstrip("/")
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.stdout.close()
        self._log.close()


# --- the show ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Runs offline on loopback: `streamtap serve` plays the bundled recordings as the providers,\n"
        "`mitmdump -s \"$(streamtap addon)\"` taps the traffic, real SDK clients make the calls.\n"
        "Exit 0 when every turn got the verdict its recording holds and every recording verified, 1 when not, "
        "2 when --dir or a temporary folder cannot be written."
    )
    parser.add_argument("--dir", type=named_folder, default=None, help="keep the recordings the demo writes here (default: a temporary directory)")
    parser.add_argument("--recordings", type=Path, default=BUNDLED, help=argparse.SUPPRESS)


@contextmanager
def _ended_by_signals():
    """SIGTERM and SIGHUP (``kill``, a closed terminal) end the demo as Ctrl-C does: their default
    would end Python at once, leaving the replay server and mitmdump running and the temporary
    folder behind; raised as an exit, they unwind the blocks that stop and remove them."""
    def stop(signum: int, frame) -> None:
        raise SystemExit(128 + signum)  # as a shell reports a process the signal ended

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _loopback_only() -> None:
    """The demo's SDK clients talk to the proxy on loopback, with keys of their own: the user's
    settings for real calls must not reach them. The openai and anthropic clients read none of
    the environment (trust_env=False: httpx would build a transport for a SOCKS ALL_PROXY, and
    load SSL_CERT_FILE, whatever NO_PROXY says); boto3 follows HTTP(S)_PROXY, bypassed here for
    loopback, and reads the user's AWS profile and config, which a wrong one makes it refuse."""
    for name in ("NO_PROXY", "no_proxy"):
        listed = [host for host in os.environ.get(name, "").split(",") if host.strip()]
        os.environ[name] = ",".join([*listed, "127.0.0.1", "localhost"])
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(name, None)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ[name] = os.devnull


def run(args: argparse.Namespace) -> int:
    from streamtap.cli import UsageError
    from streamtap.recording import check_recording, read_recording

    if not ADDON.exists():
        raise UsageError(f"the mitmproxy addon is missing: {ADDON}")
    if not sorted(args.recordings.glob("*.jsonl")):
        raise UsageError(f"no bundled recordings in {args.recordings}")
    if args.dir is not None:
        if args.dir.exists() and not args.dir.is_dir():
            raise UsageError(f"--dir {args.dir}: exists and is not a directory")
        try:
            args.dir.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=args.dir).close()  # the proxy would refuse a folder it cannot write
        except OSError as exc:
            raise UsageError(f"--dir {args.dir}: {exc.strerror or exc}") from None
    _loopback_only()
    with _ended_by_signals(), tempfile.TemporaryDirectory(prefix="streamtap-demo-") as tmp:
        workdir = Path(tmp)
        record_dir = (args.dir or workdir / "recordings").resolve()
        record_dir.mkdir(parents=True, exist_ok=True)
        before = set(record_dir.glob("*.jsonl"))
        print("streamtap demo: a replay server plays recorded provider streams; mitmdump + streamtap sits in front;")
        print("real SDK clients ask their questions through it.\n")
        with Replay(args.recordings, workdir) as replay, Proxy(replay.url, workdir, record_dir) as proxy:
            seen = 0
            for turn in TURNS:
                print(f"-> {turn.client}: {turn.story}")
                try:
                    got = turn.call(f"{proxy.url}")
                    print(f"   the app got: {_short(got)!r}" + ("   <- no error raised" if turn.expect != "complete" else ""))
                except Exception as exc:  # the client noticed: that is part of the story
                    print(f"   the app got an error: {type(exc).__name__}: {_short(str(exc))}")
                lines = _wait_lines(proxy, seen + 1)
                for line in lines[seen:]:
                    print(f"   {line.split(' -> ')[0]}")
                if len(lines) == seen:
                    print(f"   (no streamtap line for this turn in {proxy.log_path} within 10 s)")
                seen = len(lines)
            print()
        # the recordings this demo's proxy named, not whatever else came into the folder meanwhile
        # (another demo's, or a live mitmdump's, in the same --dir)
        named = {Path(line.split(" -> ", 1)[1].strip()).name for line in proxy.tap_lines() if " -> " in line}
        written = sorted(path for path in set(record_dir.glob("*.jsonl")) - before if path.name in named)
        print(f"recordings written ({record_dir}):")
        ok = len(written) == len(TURNS)
        verdicts = []
        for path in written:
            recording = read_recording(path)
            problems = check_recording(recording)
            verdicts.append(recording.verdict["kind"] if recording.verdict else "incomplete")
            print(f"   {path.name}  ({recording.end['bytes'] if recording.end else '?'} bytes, {len(recording.frames)} frames"
                  + (f"; PROBLEMS: {'; '.join(problems)}" if problems else "") + ")")
            ok = ok and not problems
        if not written:
            print("   none: see the lines above")
            print("demo: UNEXPECTED RESULT (see above)")
            return 1
        print("\nstreamtap verify (rechecks every frame sum, offset and the body hash, and judges each turn again):")
        out = io.StringIO()
        with redirect_stdout(out):
            from streamtap.cli import main as cli_main

            verify_exit = cli_main(["verify", *map(str, written)])
        for line in out.getvalue().splitlines():
            print(f"   {Path(line.split(':', 1)[0]).name}:{line.split(':', 1)[1]}" if ":" in line else f"   {line}")
        expected = sorted(t.expect for t in TURNS)
        ok = ok and sorted(verdicts) == expected and verify_exit == (0 if set(expected) == {"complete"} else 1)
        ok = ok and seen == len(TURNS)  # each turn's line was shown as it came
        print(
            "\nverify exits 1 because some turns are incomplete: that is the finding." if verify_exit == 1 else ""
        )
        if args.dir is None:
            print("(the recordings above were in a temporary directory; keep them with --dir DIR)")
        print("demo: " + ("OK, every turn got the verdict its stream deserved" if ok else "UNEXPECTED RESULT (see above)"))
        return 0 if ok else 1


def _wait_lines(proxy: Proxy, count: int, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = proxy.tap_lines()
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
