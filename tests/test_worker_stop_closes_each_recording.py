"""At STOP the analysis worker closes every open recording: one that fails to close (a full disk)
no longer leaves the others open and the worker running until it is killed."""

from __future__ import annotations

import asyncio

import provider_streams as streams
from test_workers import _until, openai_flow, tap_settings

from streamtap.mitm.worker import Workers
from streamtap.recording.compress import decompress_checked


def test_a_recording_that_fails_to_close_at_stop_leaves_the_others_closed(tmp_path, monkeypatch):
    import abandon_failing_worker

    import streamtap.mitm.worker as worker_module
    from streamtap.mitm.flowspec import FlowSpec

    monkeypatch.setattr(worker_module, "serve", abandon_failing_worker.serve)
    settings = tap_settings(tmp_path, compress="zstd")  # a closed zstd recording ends its frame
    cut = streams.openai_chat(["Paris ", "is ", "sunny."])[:120]

    async def run():
        workers = Workers(1, asyncio.get_running_loop(), verdict=lambda *a: None, lost=lambda *a: None)
        try:
            await _until(lambda: workers.pids[0] is not None)
            for _ in range(3):  # mid-stream at shutdown
                workers.stream(workers.open(FlowSpec.of(openai_flow(), None), settings))(cut)
            workers.send()
            await _until(lambda: len(list(tmp_path.glob("*.partial.jsonl.zst"))) == 3)
        finally:
            workers.stop(timeout=5)  # the rest, then STOP
        return workers.processes[0].process

    process = asyncio.run(run())
    assert process.exitcode == 0  # it took its STOP, not killed at the deadline
    ended = []
    for path in tmp_path.glob("*.partial.jsonl.zst"):
        with path.open("rb") as handle:
            ended.append(decompress_checked(handle)[1])
    assert sorted(ended) == [False, True, True]  # all but the one that failed closed
