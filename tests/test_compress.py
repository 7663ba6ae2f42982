"""streamtap_compress=zstd: real traffic through mitmdump writes .jsonl.zst recordings that
verify, show, serve, report, index and DuckDB's read_json read; a kill -9 leaves a prefix that
reads as an incomplete recording, never as a shorter complete turn."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import duckdb
import httpx
import pytest

import provider_streams as streams
from fleet_traffic import drive
from test_report import STREAMTAP, streamtap
from upstream import CHAT, STREAM_REQUEST, Mitmdump, Script, Upstream

from streamtap.recording import check_recording, read_recording


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("zstd"), options={"streamtap_compress": "zstd"}) as mitm:
            mitm.upstream = upstream
            recordings = drive(mitm)
            yield mitm, recordings


def test_recordings_are_zstd_and_read_back_whole(recorded):
    proxy, recordings = recorded
    for rec in recordings:
        assert rec.path.name.endswith(".jsonl.zst")
        assert rec.path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # the zstd frame magic
        assert rec.complete_file and check_recording(rec) == []
        name = rec.header["request"]["url"].split("/s/")[1].split("/")[0]
        assert rec.body == proxy.upstream.last(name).wire  # uncompressed bodies: what the client got


def test_verify_and_show_read_them(recorded):
    _, recordings = recorded
    paths = [str(r.path) for r in recordings]
    verify = streamtap("verify", "--json", *paths)
    results = [json.loads(line) for line in verify.stdout.splitlines()]
    assert [r["verdict"]["kind"] for r in results] == [rec.verdict["kind"] for rec in recordings]
    assert all(r["problem"] is None for r in results) and all(r["source"] == "recording" for r in results)
    assert verify.returncode == 1  # some turns are cut
    show = streamtap("show", paths[0])
    assert show.returncode == 0 and recordings[0].verdict["kind"].upper() in show.stdout


def test_report_and_index_read_them(recorded, tmp_path):
    proxy, recordings = recorded
    report = json.loads(streamtap("report", "--json", str(proxy.record_dir)).stdout)
    assert report["recordings"] == len(recordings) and report["incomplete_files"] == 0
    counts: dict[str, int] = {}
    for rec in recordings:
        counts[rec.verdict["kind"]] = counts.get(rec.verdict["kind"], 0) + 1
    assert report["verdicts"] == counts
    out = tmp_path / "idx"
    assert streamtap("index", str(proxy.record_dir), "--out", str(out)).returncode == 0
    rows = duckdb.sql(f"SELECT path, bytes, recording_bytes FROM read_parquet('{out}/**/*.parquet')").fetchall()
    assert {r[0] for r in rows} == {str(rec.path.resolve()) for rec in recordings}
    for path, body_bytes, file_bytes in rows:
        assert file_bytes == Path(path).stat().st_size


def test_duckdb_read_json_reads_them_in_place(recorded):
    proxy, recordings = recorded
    glob = str(proxy.record_dir / "*.jsonl.zst")
    ends = duckdb.sql(
        f"SELECT filename, verdict.kind FROM read_json('{glob}', format = 'newline_delimited', filename = true, "
        "columns = {type: 'VARCHAR', verdict: 'STRUCT(kind VARCHAR)'}) WHERE type = 'end'"
    ).fetchall()
    assert {Path(f).name: kind for f, kind in ends} == {r.path.name: r.verdict["kind"] for r in recordings}
    frames = duckdb.sql(f"SELECT count(*) FROM read_json('{glob}', format = 'newline_delimited', columns = {{type: 'VARCHAR'}}) WHERE type = 'frame'").fetchall()[0][0]
    assert frames == sum(len(r.frames) for r in recordings)


def test_serve_replays_a_compressed_recording(recorded):
    proxy, recordings = recorded
    [rec] = [r for r in recordings if "/s/fleet-chat-b0/" in r.header["request"]["url"]]
    process = subprocess.Popen([*STREAMTAP, "serve", str(rec.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), process.stderr.read()
        response = httpx.post(url + "/s/fleet-chat-b0" + CHAT, content=STREAM_REQUEST, headers={"content-type": "application/json"}, timeout=10)
        assert response.status_code == 200 and response.content == rec.body
    finally:
        process.terminate()
        process.wait(10)


def test_a_file_cut_in_its_zstd_checksum_is_served_as_a_killed_proxy_s_leftover(recorded, tmp_path):
    """Every line is there, the end line too, but the zstd frame never ended: verify calls it
    incomplete, and replay served it as a whole recording, with a clean end."""
    from streamtap.replay.source import load_source

    _, recordings = recorded
    path = recordings[0].path
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(path.read_bytes()[:-2])
    assert read_recording(cut).problem is not None and read_recording(cut).end is not None
    source = load_source(cut)
    assert (source.whole, source.end_style) == (False, "abort")
    assert (load_source(path).whole, load_source(path).end_style) == (True, "clean")


def test_every_prefix_reads_as_incomplete_never_as_a_shorter_turn(recorded):
    _, recordings = recorded
    rec = max(recordings, key=lambda r: r.path.stat().st_size)
    data = rec.path.read_bytes()
    for size in range(0, len(data)):
        prefix = rec.path.with_name("prefix.jsonl.zst")
        prefix.write_bytes(data[:size])
        try:
            cut = read_recording(prefix)
        except Exception as exc:  # an empty file or a cut header line: "incomplete at byte 0"
            assert "incomplete" in str(exc) or "empty" in str(exc), (size, exc)
            continue
        finally:
            prefix.unlink()
        if cut.complete_file:  # only the frame's last bytes (its checksum) are missing: every line is there
            assert cut.body == rec.body and cut.end == rec.end, size
            assert size >= len(data) - 4
        else:
            assert cut.problem.startswith("recording incomplete at byte"), (size, cut.problem)


def frames_on_disk(record_dir: Path) -> int:
    """Frames an open compressed recording holds so far, as a reader finds them."""
    for path in record_dir.glob("*.partial.jsonl.zst"):
        try:
            return len(read_recording(path).frames)
        except Exception:  # not readable yet
            return 0
    return 0


def test_kill_9_mid_stream_leaves_an_incomplete_recording(tmp_path):
    body = streams.openai_chat([f"piece {i} " for i in range(60)])
    with Upstream() as upstream:
        mitm = Mitmdump(upstream.url, tmp_path, options={"streamtap_compress": "zstd"}).start()
        try:
            upstream.arm_pause()
            upstream.add("killed", Script(body, chunk_size=120, pause_after=2000))
            client = subprocess.Popen(["curl", "-sS", "-N", "--max-time", "20", "-H", "content-type: application/json",
                                       "--data", STREAM_REQUEST, f"{mitm.url}/s/killed{CHAT}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert upstream.wait_paused()
            deadline = time.monotonic() + 15  # the open stream's lines reach the OS every 0.1 s (a worker's too)
            while time.monotonic() < deadline and frames_on_disk(mitm.record_dir) < 10:
                time.sleep(0.1)
            mitm.kill9()
            client.kill()
            client.wait(5)
        finally:
            upstream.release()
            mitm.stop()
    [path] = mitm.record_dir.glob("*.partial.jsonl.zst")
    rec = read_recording(path)
    assert "/s/killed/" in rec.header["request"]["url"]
    assert not rec.complete_file and rec.end is None and rec.problem.startswith("recording incomplete at byte")
    assert len(rec.frames) >= 10 and body.startswith(rec.body)
    verify = streamtap("verify", str(rec.path))
    assert verify.returncode == 1 and "recording incomplete" in verify.stdout
    report = json.loads(streamtap("report", "--json", str(mitm.record_dir)).stdout)
    assert report["verdicts"] == {} and report["incomplete_files"] == 1
    assert report["incomplete"][0]["problem"].startswith("recording incomplete")


def test_a_small_file_that_decodes_to_half_a_gigabyte_is_reported_in_bounded_memory(recorded, tmp_path):
    """report reads a recording's first and last lines: a .jsonl.zst was decoded whole for them,
    so 200 KB of zstd holding 512 MiB of lines took twice that. It is now decoded through once."""
    import sys
    import zstandard

    _, recordings = recorded
    lines = zstandard.ZstdDecompressor().decompressobj().decompress(recordings[0].path.read_bytes()).splitlines(keepends=True)
    bomb = tmp_path / "20261206T000000.000Z_openai-chat_complete_b0b0b0b0b0b0.jsonl.zst"
    filler = b'{"type":"note","kind":"x","message":"' + b"y" * 4000 + b'","t":null}\n'
    with bomb.open("wb") as raw:
        with zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as out:
            out.write(lines[0])
            chunk = filler * 256  # 1 MiB
            for _ in range(512):
                out.write(chunk)
            out.write(b"".join(lines[1:]))
    assert bomb.stat().st_size < 4 * 2**20
    measure = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.stdout)")
    ran = subprocess.run([sys.executable, "-c", measure, *STREAMTAP, "report", "--json", str(bomb)],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    code, peak_kib, out = ran.stdout.split(" ", 2)
    assert code == "0" and json.loads(out)["verdicts"] == {recordings[0].verdict["kind"]: 1}, ran.stdout + ran.stderr
    assert int(peak_kib) < 256 * 1024, f"report peaked at {int(peak_kib) / 1024:.0f} MiB for 512 MiB of lines"


def test_the_readmes_read_json_query_keeps_every_field_past_32_files(tmp_path):
    """DuckDB takes a glob's columns from its first 32 files unless told otherwise: a fleet folder
    of mostly one provider would lose the fields only later files have (an event-stream frame's
    bytes). The README's query, as written there, reads all of them."""
    import re
    from importlib.resources import files

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    query = re.search(r"`(SELECT \* FROM read_json\('recordings/live/\*\.jsonl\.zst'[^`]*)`", readme)[1]
    demo = files("streamtap") / "data" / "demo"
    live = tmp_path / "recordings" / "live"
    live.mkdir(parents=True)
    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        from backports import zstd

    def packed(source, name):
        (live / name).write_bytes(zstd.compress(source.read_bytes()))

    for i in range(40):
        packed(demo / "01_openai-complete_complete.jsonl", f"a{i:02}.jsonl.zst")
    packed(demo / "04_bedrock-complete_complete.jsonl", "z.jsonl.zst")
    rows = duckdb.connect().execute(f"SELECT * FROM ({query.replace('recordings/live', str(live))}) WHERE type = 'frame'")
    names = [d[0] for d in rows.description]
    frames = [dict(zip(names, row)) for row in rows.fetchall()]
    assert frames and all(f["raw"] is not None or f.get("raw_b64") is not None for f in frames)
