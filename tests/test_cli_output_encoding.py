"""`show`, `verify` and `report` on an output that is not UTF-8 (PYTHONIOENCODING, a legacy locale):
a character the output cannot encode is written as its escape, never a traceback (exit 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtap.providers import Dialect, StreamSession
from streamtap.recording import RecordingWriter, read_recording
from test_verify_end_line_claims import finish_as_the_proxy

REAL_RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "openai-chat.jsonl"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder whose name is not ASCII, holding a real recording re-recorded with a model and an
    answer that are not ASCII either."""
    folder = tmp_path_factory.mktemp("enc") / "日本"
    folder.mkdir()
    source = read_recording(REAL_RECORDING)
    body = source.body.replace(b"gpt-4.1-nano", "qwen-中文".encode()).replace(b"Paris", "Paris ☀😀 café".encode())
    writer = RecordingWriter(folder / "20231114T221320.200Z_openai-chat_complete_0123456789ab.jsonl")
    writer.header({key: value for key, value in source.header.items() if key not in ("type", "format", "streamtap")})
    finish_as_the_proxy(writer, StreamSession(Dialect.OPENAI_CHAT), body)
    return folder


def run(verb: str, folder: Path, encoding: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    env.pop("PYTHONUTF8", None)
    result = subprocess.run([sys.executable, "-m", "streamtap.cli", verb, str(folder)], capture_output=True, env=env, timeout=60)
    return result.returncode, result.stdout.decode(encoding), result.stderr.decode(encoding)


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
@pytest.mark.parametrize("verb, shows", [
    ("show", ["\\u2500\\u2500\\u2500 answer", "qwen-\\u4e2d\\u6587", "Paris \\u2600"]),  # the rule, the model, the answer
    ("verify", ["\\u65e5\\u672c", ": complete (openai-chat)"]),  # the folder's name
    ("report", ["qwen-\\u4e2d\\u6587"]),
])  # fmt: skip
def test_what_the_output_cannot_encode_is_shown_escaped(folder, encoding, verb, shows):
    code, out, err = run(verb, folder, encoding)
    assert code == 0 and "Traceback" not in err, (out, err)
    for text in shows:
        assert text in out, (text, out)


def test_a_utf_8_output_is_written_as_it_was(folder):
    code, out, err = run("show", folder, "utf-8")
    assert code == 0 and "─── answer" in out and "qwen-中文" in out and "\\u" not in out, (out, err)


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
@pytest.mark.parametrize("verb", ["show", "verify", "report"])
def test_json_output_stays_json_whatever_the_output_cannot_encode(folder, encoding, verb):
    """Beyond the BMP too: a JSON escape (a surrogate pair), never the Python one; and UTF-8 (RFC
    8259), so a character the output could write in its own encoding (latin-1's é) is escaped too."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    env.pop("PYTHONUTF8", None)
    result = subprocess.run([sys.executable, "-m", "streamtap.cli", verb, "--json", str(folder)], capture_output=True, env=env, timeout=60)
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr
    out = result.stdout.decode("utf-8")
    documents = [json.loads(line) for line in out.splitlines()] if verb != "report" else [json.loads(out)]
    text = json.dumps(documents, ensure_ascii=False)
    assert "qwen-中文" in text, out
    if verb != "report":
        assert "Paris ☀😀 café" in text, out
