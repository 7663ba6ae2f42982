"""A recording that cannot be read keeps `report` and `index` from saying all is well, and a
killed proxy's leftover that cannot be loaded (empty, or cut inside its header) does not keep
`serve` or mitmdump's replay from serving the whole recordings beside it. Real processes: the
console script, a real server on loopback, a real mitmdump."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from replay_streams import OPENAI_REQUEST, openai_chat_frames, write_recording

from test_fleet_edges import unprivileged
from upstream import CHAT, Mitmdump

REPO = Path(__file__).resolve().parents[1]
STREAMTAP = [sys.executable, "-m", "streamtap.cli"]
OPENAI_BODY = json.dumps(OPENAI_REQUEST).encode()
WHOLE = "20261204T170733.542Z_openai-chat_complete_8e546580a39c.jsonl"  # named as the proxy names recordings
LEFTOVERS = {  # a killed proxy's leftovers whose header never got out whole
    "20261204T170000.000Z_openai-chat_unknown_bbbbbbbbbbbb.partial.jsonl": lambda whole: b"",
    "20261204T170001.000Z_openai-chat_unknown_cccccccccccc.partial.jsonl": lambda whole: whole[:100],
}


# --- report and index ------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["report", "index"])
def test_a_recording_that_cannot_be_read_is_named_and_keeps_report_and_index_from_passing(tmp_path, verb):
    """Taken for a recording by its name, its verdict is unknown: exit 1, and a line names it.
    So is a file of another name that cannot be read: a recording copied or renamed may be one."""
    folder = tmp_path / "rec"
    folder.mkdir()
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", folder / WHOLE)
    locked = folder / "20261204T170740.000Z_openai-chat_truncated_aaaaaaaaaaaa.jsonl"
    other = folder / "notes.jsonl"  # not a recording by its name
    shutil.copy(REPO / "recordings" / "openai-chat.jsonl", locked)
    other.write_text('{"note": 1}\n')
    locked.chmod(0)
    other.chmod(0)
    args = ("report", "--json", folder) if verb == "report" else ("index", folder, "--out", tmp_path / "idx")
    try:
        got = subprocess.run(unprivileged(*args), capture_output=True, text=True, timeout=60)
    finally:
        locked.chmod(0o644)
        other.chmod(0o644)
    assert got.returncode == 1, (got.returncode, got.stderr)
    assert f"streamtap {verb}: {locked}: cannot read this recording: Permission denied\n" in got.stderr, got.stderr
    assert f"streamtap {verb}: {other}: cannot read this file, which may be a recording: Permission denied\n" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr
    if verb == "report":
        assert json.loads(got.stdout)["verdicts"] == {"complete": 1}  # the readable one is still reported
    else:
        assert "1 new recording(s) indexed" in got.stderr, got.stderr


# --- serve and mitmdump's replay ---------------------------------------------------------------


def live_folder(tmp_path: Path) -> Path:
    """A whole recording and a killed proxy's two leftovers that cannot be loaded."""
    folder = tmp_path / "live"
    folder.mkdir()
    whole = write_recording(folder / WHOLE, "openai", openai_chat_frames(words=3)).read_bytes()
    for name, content in LEFTOVERS.items():
        (folder / name).write_bytes(content(whole))
    return folder


def serve_result(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([*STREAMTAP, "serve", *map(str, paths)], capture_output=True, text=True, timeout=30)


def test_serve_skips_leftovers_it_cannot_load_naming_them_and_serves_the_rest(tmp_path):
    live = live_folder(tmp_path)
    process = subprocess.Popen([*STREAMTAP, "serve", str(live)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.communicate(timeout=10)
        answer = httpx.post(url + "/v1/chat/completions", content=OPENAI_BODY, timeout=10)
        assert answer.status_code == 200 and b"[DONE]" in answer.content
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert "streamtap serve: 1 recording(s)" in err, err
    empty, cut = (live / name for name in LEFTOVERS)
    assert ("streamtap serve: warning: skipped a killed proxy's leftover that cannot be served "
            f"({empty}: recording incomplete at byte 0: the file is empty)") in err, err
    assert f"({cut}: recording incomplete at byte 0: the header line is cut)" in err, err
    # a broken file that is no leftover is still refused, and so are leftovers with nothing else
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"")
    refused = serve_result(live, broken)
    assert refused.returncode == 2 and refused.stderr == f"streamtap serve: {broken}: recording incomplete at byte 0: the file is empty\n"
    (live / WHOLE).unlink()
    alone = serve_result(live)
    assert alone.returncode == 2 and alone.stderr == f"streamtap serve: {empty}: recording incomplete at byte 0: the file is empty\n"


def test_mitmdump_replay_skips_leftovers_it_cannot_load_with_a_warning(tmp_path):
    live = live_folder(tmp_path)
    with Mitmdump("http://127.0.0.1:9", tmp_path / "m", options={"streamtap_replay": str(live)}) as proxy:
        answer = httpx.post(proxy.url + CHAT, content=OPENAI_BODY, timeout=10)
        log = proxy.wait_log("streamtap: replaying 1 recording(s)")
    assert answer.status_code == 200 and b"[DONE]" in answer.content, answer.text
    for name in LEFTOVERS:
        assert f"streamtap: skipped a killed proxy's leftover that cannot be served ({live / name}: " in log, log
