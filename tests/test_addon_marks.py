"""The Tap inside mitmproxy's own addon test harness: flow marks, comments, metadata, fail-open hooks."""

from __future__ import annotations

from mitmproxy import flow as mitmflow
from mitmproxy.test import taddons, tflow

import provider_streams as streams
from streamtap.mitm.tap import MARK, Tap
from streamtap.recording import read_recording


def streaming_flow(path: str = "/v1/chat/completions", content_type: str = "text/event-stream", status: int = 200):
    f = tflow.tflow(resp=True)
    f.request.method, f.request.path = "POST", path
    f.request.content = b'{"model":"m","stream":true,"messages":[]}'
    f.response.status_code = status
    f.response.headers["content-type"] = content_type
    f.response.content = None
    return f


def run_flow(tap: Tap, f, chunks: list[bytes]) -> list[bytes]:
    tap.responseheaders(f)
    assert callable(f.response.stream)
    return [f.response.stream(chunk) for chunk in chunks] + [f.response.stream(b"")]


def test_a_complete_turn_is_not_marked_and_shows_its_verdict(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        body = streams.openai_chat(["hi"])
        chunks = [body[i : i + 10] for i in range(0, len(body), 10)]
        assert run_flow(tap, f, chunks) == chunks + [b""]  # every chunk handed on unchanged
        tap.response(f)
    assert not f.marked
    summary = f.metadata["streamtap"]
    assert f.comment == f"streamtap: complete: {summary['reason']}"  # no [how it ended]: it finished
    assert f.metadata["streamtap"]["verdict"] == "complete"
    assert read_recording(f.metadata["streamtap"]["recording"]).body == body


def test_a_cut_turn_is_marked_with_its_verdict(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        body = streams.openai_chat(["hi", "there"])
        run_flow(tap, f, [body[:200]])
        f.error = mitmflow.Error("server closed connection")
        tap.error(f)
    assert f.marked == MARK
    assert f.comment.startswith("streamtap: truncated: ") and f.comment.endswith(" [upstream_reset]")
    assert f.metadata["streamtap"]["stream_end"] == "upstream_reset"
    assert f.response.raw_content is None  # store_streamed_bodies is off: nothing kept


def test_a_cut_turn_shows_the_body_forwarded_when_streamed_bodies_are_stored(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.options.add_option("store_streamed_bodies", bool, False, "the proxy server addon's option")
        tctx.configure(tap, streamtap_dir=str(tmp_path), store_streamed_bodies=True)
        f = streaming_flow()
        body = streams.openai_chat(["hi", "there"])
        run_flow(tap, f, [body[:100], body[100:200]])
        f.error = mitmflow.Error("server closed connection")
        tap.error(f)
    assert f.marked == MARK
    assert f.response.raw_content == body[:200]


def test_a_body_mitmproxy_stored_is_left_as_it_is(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.options.add_option("store_streamed_bodies", bool, False, "the proxy server addon's option")
        tctx.configure(tap, streamtap_dir=str(tmp_path), store_streamed_bodies=True)
        f = streaming_flow()
        body = streams.openai_chat(["hi"])
        run_flow(tap, f, [body])
        f.response.raw_content = b"what mitmproxy stored"
        tap.response(f)
    assert f.response.raw_content == b"what mitmproxy stored"


def test_unmatched_flows_are_left_alone(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow(path="/index.html", content_type="text/html")
        f.request.content = b""
        tap.responseheaders(f)
        assert f.response.stream is False
        tap.response(f)
    assert not list(tmp_path.iterdir())


def test_a_broken_session_never_breaks_the_stream(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        tap.responseheaders(f)
        flow_tap = tap.open[f.id]

        class Exploding:
            def feed(self, *args):
                raise RuntimeError("a bug in streamtap")

        flow_tap.session = Exploding()
        body = streams.openai_chat(["x"])
        assert f.response.stream(body[:50]) == body[:50]
        assert f.response.stream(body[50:]) == body[50:]
        tap.response(f)
    summary = f.metadata["streamtap"]
    assert summary["verdict"] == "unknown" and "a bug in streamtap" in summary["errors"][0]
    rec = read_recording(summary["recording"])
    assert rec.body == body  # the bytes after the failure are kept as unframed "raw" lines
    assert any("a bug in streamtap" in note["message"] for note in rec.notes)


def test_bytes_the_decoder_held_are_kept_when_analysis_fails(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        tap.responseheaders(f)
        body = streams.openai_chat(["a", "b", "c"])
        second_event = body.index(b"data:", 10)
        f.response.stream(body[: second_event + 30])  # one whole event and the start of the next

        class Exploding:
            def feed(self, *args):
                raise RuntimeError("boom")

        tap.open[f.id].session = Exploding()
        f.response.stream(body[second_event + 30 :])
        tap.response(f)
    rec = read_recording(f.metadata["streamtap"]["recording"])
    assert rec.body == body
    assert [s.kind for s in rec.segments] == ["frame", "raw"]
    assert rec.segments[1].offset == second_event


def test_the_commands_answer_for_streaming_finished_and_untapped_flows(tmp_path):
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        commands = tctx.master.commands
        f, other = streaming_flow(), streaming_flow(path="/index.html", content_type="text/html")
        tap.responseheaders(f)
        tap.responseheaders(other)
        assert commands.call("streamtap.verdict", [f, other]) == ["streaming", "not tapped"]
        partial = commands.call("streamtap.recording", [f, other])
        assert partial[0].endswith(".partial.jsonl") and partial[1] == ""
        f.response.stream(streams.openai_chat(["hi"]))
        tap.response(f)
        verdict = commands.call("streamtap.verdict", [f])
        assert verdict == [f"complete: {f.metadata['streamtap']['reason']}"]
        [path] = commands.call("streamtap.recording", [f])
        assert path == f.metadata["streamtap"]["recording"] and read_recording(path).verdict["kind"] == "complete"


def test_a_flow_read_from_a_file_keeps_its_verdict_mark_and_comment(tmp_path):
    """mitmproxy runs every hook of a flow it reads from a file (mitmdump -r, mitmweb's open),
    requestheaders too, which took it for a flow sent again and cleared its verdict: a capture
    opened and saved again with streamtap loaded lost every verdict, mark and comment."""
    import asyncio

    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        run_flow(tap, f, [streams.openai_chat(["hi", "there"])[:200]])
        f.error = mitmflow.Error("server closed connection")
        tap.error(f)
        verdict = (f.comment, f.marked, f.metadata["streamtap"])
        assert verdict[1] == MARK
        loaded = mitmflow.Flow.from_state(f.get_state())
        loaded.live = False
        asyncio.run(tctx.master.load_flow(loaded))
        assert (loaded.comment, loaded.marked, loaded.metadata.get("streamtap")) == verdict
        assert tctx.master.commands.call("streamtap.verdict", [loaded]) == [f"truncated: {verdict[2]['reason']}"]
        f.live = True  # the control: a flow sent again (client replay) is live, and its old verdict goes
        tap.requestheaders(f)
        assert (f.comment, f.marked, f.metadata.get("streamtap")) == ("", "", None)


def test_the_verdict_command_gives_one_line_per_flow_whatever_the_reason_quotes(tmp_path):
    """The reason quotes the provider's error: a newline in it made a line of its own in
    mitmproxy's command output, and an ESC acted on the terminal, where the comment escapes both."""
    tap = Tap()
    with taddons.context(tap) as tctx:
        tctx.configure(tap, streamtap_dir=str(tmp_path))
        f = streaming_flow()
        run_flow(tap, f, [streams.openai_chat(["hi"])])
        tap.response(f)
        f.metadata["streamtap"]["reason"] = "Overloaded\n\x1b[31mforged line\u202e"
        [line] = tctx.master.commands.call("streamtap.verdict", [f])
    assert line == "complete: Overloaded\\n\\x1b[31mforged line\\u202e", line
