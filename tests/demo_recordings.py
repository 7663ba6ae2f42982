"""Make the bundled demo recordings (addon/streamtap/data/demo/, package data) with the project's own tooling.

The provider streams are constructed here (shapes from docs/provider-streams.md); the
demo's own SDK calls send the requests through a real `mitmdump -s addon/tap.py` to the
loopback fake provider, and the recordings the Tap writes are the bundle. Run from the
repository: `.venv/bin/python tests/demo_recordings.py [OUT_DIR]` (default addon/streamtap/data/demo).
tests/test_addon_demo.py regenerates them and checks the bundle still matches.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import provider_streams as streams  # noqa: E402
from streamtap.commands.demo import TURNS  # noqa: E402
from streamtap.recording import read_recording  # noqa: E402
from streamtap.wire import encode_message  # noqa: E402
from upstream import REPO, Mitmdump, Script, Upstream  # noqa: E402

GAP = 0.03  # seconds between events: slow enough to look like a stream, fast enough for a demo

# a phrase of each request's body -> the turn it belongs to
ROUTES = {
    b"Name three rivers": "openai-complete",
    b"Summarise Hamlet": "openai-cut",
    b"weather in Lyon": "anthropic-cut",
    b"hello in French": "bedrock-complete",
}


def words(text: str) -> list[str]:
    pieces = text.split(" ")
    return [p + (" " if i < len(pieces) - 1 else "") for i, p in enumerate(pieces)]


def scripts() -> dict[str, Script]:
    hamlet = words(
        "Prince Hamlet feigns madness while he seeks proof that his uncle Claudius murdered his father "
        "and took the throne. His hesitation sets off a chain of deaths that ends with"
    )
    full_hamlet = streams.openai_chat(hamlet + ["the whole court dead."], model="gpt-4.1-mini-2025-04-14")
    cut_at = full_hamlet.index(b'"content":"with"')
    cut_at = full_hamlet.index(b"\n\n", cut_at) + 2  # a clean cut at an event boundary, before [DONE]
    anthropic = streams.anthropic(
        "The user wants the weather in Lyon; I should call get_weather.", "Let me check the weather in Lyon.",
        {"city": "Lyon", "units": "metric"}, model="claude-sonnet-4-6",
    )
    args_at = anthropic.index(b'"partial_json":"') + 30  # inside the tool call's arguments
    converse = [
        ("messageStart", {"role": "assistant"}),
        *[("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": w}}) for w in words("Bonjour ! Comment allez-vous ?")],
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn"}),
        ("metadata", {"usage": {"inputTokens": 14, "outputTokens": 9, "totalTokens": 23}, "metrics": {"latencyMs": 310}}),
    ]
    converse_body = [
        encode_message({":event-type": k, ":content-type": "application/json", ":message-type": "event"}, json.dumps(v).encode())
        for k, v in converse
    ]
    return {
        "openai-complete": Script(
            streams.openai_chat(words("The Danube, the Rhine and the Loire."), model="gpt-4.1-mini-2025-04-14"), gap=GAP
        ),
        "openai-cut": Script(full_hamlet[:cut_at], gap=GAP),
        "anthropic-cut": Script(anthropic, gap=GAP, cut_at=args_at, cut_style="reset"),
        "bedrock-complete": Script(
            b"".join(converse_body), chunks=converse_body, content_type="application/vnd.amazon.eventstream", gap=GAP
        ),
    }


def generate(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, Upstream() as upstream:
        for name, script in scripts().items():
            upstream.add(name, script)
        upstream.router = lambda path, body: next((n for phrase, n in ROUTES.items() if phrase in body), "")
        with Mitmdump(upstream.url, Path(tmp)) as proxy:
            for turn in TURNS:
                try:
                    turn.call(proxy.url)
                except Exception:
                    pass  # the cut turns make some clients raise; the recording is what counts
                proxy.wait_log("streamtap:", count=TURNS.index(turn) + 1)
        written = []
        recordings = sorted(proxy.record_dir.glob("*.jsonl"))
        assert len(recordings) == len(TURNS), recordings
        for index, (turn, path) in enumerate(zip(TURNS, recordings)):
            verdict = read_recording(path).verdict["kind"]
            assert verdict == turn.expect, (turn.name, verdict)
            target = out / f"{index + 1:02d}_{turn.name}_{verdict}.jsonl"
            shutil.copyfile(path, target)
            target.chmod(0o644)
            written.append(target)
    return written


if __name__ == "__main__":
    destination = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "addon" / "streamtap" / "data" / "demo"
    for path in generate(destination):
        print(path)
