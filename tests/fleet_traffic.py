"""Real streaming traffic through a real mitmdump for the fleet tests (metrics, report, index).

``drive(proxy)`` sends a fixed mix of turns with curl: complete answers from three dialects
and several models, a cut answer, an upstream reset, a limit stop and an HTTP 500. It waits
until every recording is finished and returns the recordings, read back with the reader
(the independent path the tests compare the fleet views against).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import provider_streams as streams
from upstream import CHAT, STREAM_REQUEST, Script

CONVERSE = "/model/amazon.nova-lite-v1:0/converse-stream"
MESSAGES = "/v1/messages"
CONVERSE_REQUEST = '{"messages":[{"role":"user","content":[{"text":"hi"}]}]}'  # Bedrock names the model in the path only


def post(url: str, body: str) -> None:
    subprocess.run(["curl", "-sS", "-N", "--max-time", "10", "-H", "content-type: application/json", "--data", body, url], capture_output=True)


def _cut_inside_last_event(body: bytes) -> int:
    return body.rindex(b"data:") + 8


def turns() -> list[tuple[str, str, Script]]:
    """(name, path after /s/name, script) of every turn ``drive`` sends."""
    chat_a = streams.openai_chat(["one ", "two ", "three"], model="gpt-fleet-a")
    chat_b = streams.openai_chat(["alpha ", "beta"], model="gpt-fleet-b")
    cut = streams.openai_chat(["never ", "finished ", "answer"], model="gpt-fleet-a")
    limit = streams.openai_chat(["long ", "answer"], finish="length", model="gpt-fleet-b")
    claude = streams.anthropic("", "Sunny.", {"city": "Paris"}, model="claude-fleet-4")
    claude_reset = streams.anthropic("", "Rain later.", {"city": "Oslo"}, model="claude-fleet-4")
    error = b'{"error":{"message":"The server had an error processing your request.","type":"server_error"}}'
    converse = streams.bedrock_converse(["Hello ", "there"], {"city": "Rome"})
    out = []
    for i in range(3):
        out.append((f"fleet-chat-a{i}", CHAT, Script(chat_a, chunk_size=60, gap=0.002)))
    out.append(("fleet-chat-b0", CHAT, Script(chat_b, chunk_size=80, gap=0.002)))
    out.append(("fleet-cut", CHAT, Script(cut, chunk_size=50, cut_at=_cut_inside_last_event(cut))))
    out.append(("fleet-limit", CHAT, Script(limit, gap=0.001)))
    for i in range(2):
        out.append((f"fleet-claude{i}", MESSAGES, Script(claude, gap=0.001)))
    out.append(("fleet-claude-reset", MESSAGES, Script(claude_reset, chunk_size=90, cut_at=_cut_inside_last_event(claude_reset), cut_style="reset")))
    out.append(("fleet-500", CHAT, Script(error, status=500, content_type="application/json")))
    out.append(("fleet-converse", CONVERSE, Script(converse, content_type="application/vnd.amazon.eventstream")))
    return out


def drive(proxy, record_dir: Path | None = None, timeout: float = 20) -> list:
    """Send every turn through ``proxy`` (a Mitmdump whose ``upstream`` is set); the recordings."""
    from streamtap.recording import read_recording

    record_dir = record_dir or proxy.record_dir
    sent = turns()
    for name, path, script in sent:
        proxy.upstream.add(name, script)
        post(f"{proxy.url}/s/{name}{path}", CONVERSE_REQUEST if path == CONVERSE else STREAM_REQUEST)
    deadline = time.monotonic() + timeout
    while True:
        # a writer's temporary file (.streamtap-creating-...) is no recording, finished or not
        finished = [p for p in Path(record_dir).glob("*") if p.is_file() and ".partial." not in p.name and not p.name.startswith(".")]
        if len(finished) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(finished) == len(sent), f"{len(finished)} recordings for {len(sent)} turns: {sorted(p.name for p in finished)}"
    return [read_recording(p) for p in sorted(finished)]
