"""Real SDK clients through a real `mitmdump -s addon/tap.py` to a loopback fake provider.

For each client: the bytes the client received == the bytes the upstream sent == the
body rebuilt from the recording; the SDK's final message equals the recorded turn; the
verdict is right; no credential the client used reaches the disk.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import anthropic
import boto3
import httpx
import httpx2
import openai
import pytest
from botocore.config import Config

import provider_streams as streams
from streamtap.recording import check_recording
from upstream import Mitmdump, Script, TeeTransport, Upstream, find_recording

OPENAI_KEY = "sk-proj-SDKSECRET0penai1234567890"
ANTHROPIC_KEY = "sk-ant-api03-SDKSECRETanthr0pic987"
AWS_KEY_ID = "AKIASDKSECRETKEYID77"
AWS_SECRET = "SDKSECRETawsSecretAccessKey0123456789abc"
AWS_TOKEN = "IQoJSDKSECRETsessionToken4444"
SECRETS = [OPENAI_KEY, ANTHROPIC_KEY, AWS_KEY_ID, AWS_SECRET, AWS_TOKEN]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with Upstream() as upstream:
        with Mitmdump(upstream.url, tmp_path_factory.mktemp("sdk")) as mitm:
            mitm.upstream = upstream
            yield mitm


def assert_recorded_exactly(proxy, name, client_bytes=None):
    rec = find_recording(proxy.record_dir, name)
    served = proxy.upstream.last_done(name)
    assert served.done, "the upstream did not finish sending"
    sent = served.wire
    if client_bytes is not None:
        assert bytes(client_bytes) == sent, "the client did not receive the upstream's bytes unchanged"
    assert rec.body == sent, "the recording does not rebuild the body byte-exact"
    assert rec.complete_file and check_recording(rec) == []
    assert sum(length for _, length, _ in rec.reads) == len(sent)
    return rec


def turn_blocks(rec, kind):
    return [b for b in rec.end["turn"]["choices"][0]["blocks"] if b["kind"] == kind]


def record_openai_chat(proxy, name: str) -> tuple:
    """An openai chat answer streamed through the proxy from the upstream's script ``name``: its
    recording, the text the SDK read, and its chunks."""
    body = streams.openai_chat(["The ", "answer ", "is ", "42."])
    proxy.upstream.add(name, Script(body, gap=0.002))
    tee = TeeTransport()
    client = openai.OpenAI(base_url=f"{proxy.url}/s/{name}/v1", api_key=OPENAI_KEY, max_retries=0, http_client=httpx.Client(transport=tee))
    stream = client.chat.completions.create(
        model="gpt-test-1", messages=[{"role": "user", "content": "q"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return assert_recorded_exactly(proxy, name, tee.bodies[-1]), text, chunks


def test_a_chat_answer_without_the_usage_and_choices_its_request_asked_for_says_so_live_and_in_verify(proxy):
    """OpenAI sends a usage chunk before [DONE] when asked, and n choices; a compatible server
    that ignores the options does not: the verdict stands, the turn notes what the app lacks."""
    import sys

    without_usage = b"".join(line + b"\n\n" for line in streams.openai_chat(["Hi."]).split(b"\n\n")
                             if line and b'"usage"' not in line)
    proxy.upstream.add("oai-asked", Script(without_usage))
    client = openai.OpenAI(base_url=f"{proxy.url}/s/oai-asked/v1", api_key=OPENAI_KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-test-1", messages=[{"role": "user", "content": "q"}], n=2,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(chunk.usage is None for chunk in chunks)  # what the app got
    rec = find_recording(proxy.record_dir, "oai-asked")
    notes = rec.end["turn"]["notes"]
    assert rec.verdict["kind"] == "complete", rec.verdict
    assert any("asked for usage (stream_options.include_usage)" in note for note in notes), notes
    assert any("asked for 2 choices (n) and the stream carried 1" in note for note in notes), notes
    judged = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", "--json", str(rec.path)], capture_output=True, text=True)
    assert json.loads(judged.stdout)["turn"]["notes"] == notes, judged.stdout


def test_openai_chat_completions(proxy):
    rec, text, chunks = record_openai_chat(proxy, "oai-chat")
    assert text == "The answer is 42."
    assert rec.verdict["kind"] == "complete"
    assert "".join(b["text"] for b in turn_blocks(rec, "text")) == text
    assert rec.end["turn"]["usage"]["total"] == chunks[-1].usage.total_tokens
    assert rec.header["dialect"] == "openai-chat"
    assert rec.header["request"]["body"]["stream"] is True


def test_openai_responses(proxy):
    body = streams.openai_responses(["Hello", ", ", "world"])
    proxy.upstream.add("oai-resp", Script(body, chunk_size=97))
    tee = TeeTransport()
    client = openai.OpenAI(base_url=f"{proxy.url}/s/oai-resp/v1", api_key=OPENAI_KEY, max_retries=0, http_client=httpx.Client(transport=tee))
    with client.responses.stream(model="gpt-test-5", input="q") as stream:
        final = stream.get_final_response()
    rec = assert_recorded_exactly(proxy, "oai-resp", tee.bodies[-1])
    assert final.output_text == "Hello, world"
    assert rec.verdict["kind"] == "complete"
    assert "".join(b["text"] for b in turn_blocks(rec, "text")) == final.output_text
    assert rec.end["turn"]["response_id"] == final.id


def test_anthropic_messages_with_thinking_and_tool_use(proxy):
    body = streams.anthropic("The user wants weather.", "Let me check. \u00e9\u4e2d", {"city": "Paris", "unit": "C"})
    proxy.upstream.add("ant", Script(body, chunk_size=33, gap=0.001))
    tee = TeeTransport(httpx2)
    client = anthropic.Anthropic(base_url=f"{proxy.url}/s/ant", api_key=ANTHROPIC_KEY, max_retries=0, http_client=httpx2.Client(transport=tee))
    with client.messages.stream(
        model="claude-test-4", max_tokens=1024, messages=[{"role": "user", "content": "weather?"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        final = stream.get_final_message()
    rec = assert_recorded_exactly(proxy, "ant", tee.bodies[-1])
    assert rec.verdict["kind"] == "complete"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert turn_blocks(rec, "thinking")[0]["text"] == final.content[0].thinking
    assert turn_blocks(rec, "thinking")[0]["signature"] == final.content[0].signature
    assert turn_blocks(rec, "text")[0]["text"] == final.content[1].text
    tool = turn_blocks(rec, "tool_call")[0]
    assert (tool["id"], tool["name"], tool["arguments"]) == (final.content[2].id, final.content[2].name, final.content[2].input)
    assert rec.end["turn"]["stop_reason_raw"] == final.stop_reason == "tool_use"


def bedrock(proxy, name):
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=f"{proxy.url}/s/{name}",
        aws_access_key_id=AWS_KEY_ID,
        aws_secret_access_key=AWS_SECRET,
        aws_session_token=AWS_TOKEN,
        config=Config(retries={"max_attempts": 1}),
    )


def tee_boto3(client) -> bytearray:
    """Keep a copy of the event-stream bytes botocore reads from the wire (before it parses them)."""
    captured = bytearray()

    class Tee:
        def __init__(self, raw):
            self._raw = raw

        def stream(self, *args, **kwargs):
            for chunk in self._raw.stream(*args, **kwargs):
                captured.extend(chunk)
                yield chunk

        def __getattr__(self, name):
            return getattr(self._raw, name)

    def wrap(response_dict, **kwargs):
        if hasattr(response_dict.get("body"), "stream"):
            response_dict["body"] = Tee(response_dict["body"])

    client.meta.events.register("before-parse.bedrock-runtime.*", wrap)
    return captured


def test_bedrock_invoke_model_with_response_stream(proxy):
    body = streams.bedrock_invoke("Thinking it over.", "Sunny.", {"city": "Oslo"})
    proxy.upstream.add("br-invoke", Script(body, content_type="application/vnd.amazon.eventstream", chunk_size=100))
    client = bedrock(proxy, "br-invoke")
    received = tee_boto3(client)
    response = client.invoke_model_with_response_stream(
        modelId="anthropic.claude-test-v1:0", body=json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 100, "messages": []})
    )
    events = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]
    rec = assert_recorded_exactly(proxy, "br-invoke", received)
    assert rec.verdict["kind"] == "complete"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")
    args = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert turn_blocks(rec, "text")[0]["text"] == text == "Sunny."
    assert turn_blocks(rec, "tool_call")[0]["arguments"] == json.loads(args)
    assert rec.header["dialect"] == "bedrock-invoke"
    # frames are event-stream messages: base64 on disk, decoded headers alongside
    assert rec.frames[0].event["headers"][":event-type"] == "chunk"
    assert json.loads(base64.b64decode(json.loads(rec.frames[0].event["payload"])["bytes"]))["type"] == "message_start"
    check_no_aws_secrets(proxy, "br-invoke")


def test_bedrock_converse_stream(proxy):
    body = streams.bedrock_converse(["It is ", "sunny."], {"city": "Oslo"})
    proxy.upstream.add("br-conv", Script(body, content_type="application/vnd.amazon.eventstream", chunk_size=61, gap=0.001))
    client = bedrock(proxy, "br-conv")
    received = tee_boto3(client)
    response = client.converse_stream(modelId="anthropic.claude-test-v1:0", messages=[{"role": "user", "content": [{"text": "q"}]}])
    events = list(response["stream"])
    rec = assert_recorded_exactly(proxy, "br-conv", received)
    assert rec.verdict["kind"] == "complete"
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    assert turn_blocks(rec, "text")[0]["text"] == text == "It is sunny."
    stop = next(e["messageStop"]["stopReason"] for e in events if "messageStop" in e)
    assert rec.end["turn"]["stop_reason_raw"] == stop
    usage = next(e["metadata"]["usage"] for e in events if "metadata" in e)
    assert rec.end["turn"]["usage"]["total"] == usage["totalTokens"]
    check_no_aws_secrets(proxy, "br-conv")


def check_no_aws_secrets(proxy, name):
    authorization = proxy.upstream.last(name).headers["authorization"]
    signature = authorization.rsplit("Signature=", 1)[1]
    assert len(signature) == 64
    written = b"".join(p.read_bytes() for p in proxy.record_dir.iterdir())
    for secret in [signature, AWS_TOKEN, AWS_KEY_ID]:
        assert secret.encode() not in written


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_curl_gets_the_exact_bytes(proxy, framing):
    body = streams.openai_chat(["a", "\u00fc", "b"] * 20)
    name = f"curl-{framing}"
    proxy.upstream.add(name, Script(body, chunk_size=13, framing=framing))
    out = subprocess.run(
        ["curl", "-sS", "-N", "--max-time", "10", "-H", "content-type: application/json", "-H", f"Authorization: Bearer {OPENAI_KEY}",
         "--data", '{"model":"m","stream":true,"messages":[]}', f"{proxy.url}/s/{name}/v1/chat/completions"],
        capture_output=True,
    )
    assert out.returncode == 0, out.stderr
    rec = assert_recorded_exactly(proxy, name, out.stdout)
    assert rec.verdict["kind"] == "complete"
    assert [r[1] for r in rec.reads][:3] == [13, 13, 13] or framing != "chunked"


def _everything_written(folder: Path) -> bytes:
    """Every file's bytes, read again when a recording still being finished (an earlier test's)
    is renamed from its .partial name between the listing and the read."""
    for _ in range(50):
        try:
            return b"".join(p.read_bytes() for p in folder.iterdir())
        except FileNotFoundError:
            time.sleep(0.1)
    raise AssertionError(f"the files in {folder} kept being renamed")


def test_no_client_secret_on_disk(proxy):
    written = _everything_written(proxy.record_dir)
    assert written, "no recordings were written"
    for secret in SECRETS:
        assert secret.encode() not in written
    assert b"[redacted]" in written


def test_each_turn_logs_one_line(proxy):
    log = proxy.wait_log("streamtap: anthropic claude-test-4 complete")
    line = next(line for line in log.splitlines() if "streamtap: anthropic claude-test-4 complete" in line)
    assert "events" in line and "bytes" in line and "ttft" in line and " ms" in line
    assert "Traceback" not in log


def test_verify_rechecks_a_recording_and_catches_tampering(proxy, tmp_path):
    import sys

    good = record_openai_chat(proxy, "oai-verify")[0].path
    ok = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and ": complete " in ok.stdout, ok.stdout + ok.stderr

    lines = good.read_text().splitlines(keepends=True)
    frame = next(i for i, line in enumerate(lines) if '"type":"frame"' in line and 'answer ' in line)
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines[:frame] + [lines[frame].replace("answer ", "ANSWER ")] + lines[frame + 1 :]))
    bad = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(tampered)], capture_output=True, text=True)
    assert bad.returncode == 1 and "does not match its bytes" in bad.stdout and "sha256" in bad.stdout, bad.stdout

    relabelled = tmp_path / "relabelled.jsonl"
    relabelled.write_text("".join(lines[:-1] + [lines[-1].replace('"kind":"complete"', '"kind":"truncated"', 1)]))
    wrong = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", str(relabelled)], capture_output=True, text=True)
    assert wrong.returncode == 1 and "the recording says truncated" in wrong.stdout, wrong.stdout


def test_a_coding_boto3_did_not_ask_for_is_not_told_as_complete(proxy):
    """botocore asks for ``identity`` and reads the event stream as it comes: a gateway that
    gzips it anyway leaves boto3 with bytes it cannot read, though streamtap's decoded copy is
    a whole answer. An httpx client that asked for gzip reads the same body: complete."""
    import sys

    from botocore.eventstream import ParserError

    body = streams.bedrock_converse(["It is ", "sunny."], {"city": "Oslo"})
    proxy.upstream.add("br-gz", Script(body, content_type="application/vnd.amazon.eventstream", encoding="gzip"))
    client = bedrock(proxy, "br-gz")
    with pytest.raises(ParserError):  # the gzip header read as a prelude
        response = client.converse_stream(modelId="anthropic.claude-test-v1:0", messages=[{"role": "user", "content": [{"text": "q"}]}])
        list(response["stream"])
    assert proxy.upstream.last("br-gz").headers["accept-encoding"] == "identity"
    rec = find_recording(proxy.record_dir, "br-gz")
    assert rec.verdict["kind"] == "unknown"
    assert "does not accept gzip" in rec.verdict["reason"] and rec.verdict["evidence"]["decoded_body_read_as"] == "complete"
    judged = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", "--json", str(rec.path)], capture_output=True, text=True)
    assert json.loads(judged.stdout)["verdict"]["kind"] == "unknown", judged.stdout + judged.stderr
    assert "the recording says" not in judged.stdout

    proxy.upstream.add("br-gz-asked", Script(body, content_type="application/vnd.amazon.eventstream", encoding="gzip"))
    got = httpx.post(f"{proxy.url}/s/br-gz-asked/model/anthropic.claude-test-v1:0/converse-stream", json={"messages": []},
                     headers={"accept-encoding": "gzip"}, timeout=30)
    assert got.content == body  # httpx decoded it
    assert find_recording(proxy.record_dir, "br-gz-asked").verdict["kind"] == "complete"


@pytest.mark.parametrize("api", ["converse", "invoke"])
def test_a_bedrock_body_short_of_its_content_length_after_the_end_is_what_boto3_read(proxy, api):
    """botocore reads with urllib3's enforce_content_length off: a body that stops short of its
    Content-Length after the end signal is the whole answer to boto3, not an exception. A chunked
    body cut the same way does make it raise (truncated, content_complete)."""
    import sys

    if api == "converse":
        body = streams.bedrock_converse(["It is ", "sunny."], {"city": "Oslo"})
    else:
        body = streams.bedrock_invoke("Thinking it over.", "Sunny.", {"city": "Oslo"})
    content_type = "application/vnd.amazon.eventstream"
    name = f"br-short-{api}"
    proxy.upstream.add(name, Script(body, content_type=content_type, framing="close",
                                    headers=[("content-length", str(len(body) + 3))]))
    client = bedrock(proxy, name)
    if api == "converse":
        events = list(client.converse_stream(modelId="anthropic.claude-test-v1:0",
                                             messages=[{"role": "user", "content": [{"text": "q"}]}])["stream"])
        assert "metadata" in events[-1]  # boto3 raised nothing and got every event
    else:
        events = list(client.invoke_model_with_response_stream(modelId="anthropic.claude-test-v1:0", body=b"{}")["body"])
        assert json.loads(events[-1]["chunk"]["bytes"])["type"] == "message_stop"
    rec = find_recording(proxy.record_dir, name)
    assert rec.end["stream_end"] == "upstream_reset"
    assert rec.verdict["kind"] == "complete" and rec.verdict["evidence"]["content_length_short"] is True, rec.verdict
    judged = subprocess.run([sys.executable, "-m", "streamtap.cli", "verify", "--json", str(rec.path)], capture_output=True, text=True)
    assert json.loads(judged.stdout)["verdict"]["kind"] == "complete" and judged.returncode == 0, judged.stdout

    chunked = f"br-reset-{api}"
    proxy.upstream.add(chunked, Script(body, content_type=content_type, cut_at=len(body), cut_style="reset"))
    client = bedrock(proxy, chunked)
    with pytest.raises(Exception):
        if api == "converse":
            list(client.converse_stream(modelId="anthropic.claude-test-v1:0",
                                        messages=[{"role": "user", "content": [{"text": "q"}]}])["stream"])
        else:
            list(client.invoke_model_with_response_stream(modelId="anthropic.claude-test-v1:0", body=b"{}")["body"])
    cut = find_recording(proxy.record_dir, chunked).verdict
    assert cut["kind"] == "truncated" and cut["evidence"]["content_complete"] is True, cut


def test_a_bedrock_body_short_of_its_content_length_is_cut_for_the_anthropic_sdk_and_unknown_for_a_client_not_known(proxy):
    """The anthropic SDK's Bedrock client reads with httpx, which checks the Content-Length: it
    raises where boto3 takes the same bytes whole. A client neither is known of: unknown."""
    body = streams.bedrock_invoke("Thinking it over.", "Sunny.", {"city": "Oslo"})
    script = dict(content_type="application/vnd.amazon.eventstream", framing="close",
                  headers=[("content-length", str(len(body) + 3))])
    proxy.upstream.add("br-short-anthropic", Script(body, **script))
    client = anthropic.AnthropicBedrock(aws_access_key=AWS_KEY_ID, aws_secret_key=AWS_SECRET, aws_region="us-east-1",
                                        base_url=f"{proxy.url}/s/br-short-anthropic", max_retries=0)
    with pytest.raises(anthropic.APIConnectionError):
        list(client.messages.create(model="anthropic.claude-test-v1:0", max_tokens=50, stream=True,
                                    messages=[{"role": "user", "content": "q"}]))
    cut = find_recording(proxy.record_dir, "br-short-anthropic").verdict
    assert cut["kind"] == "truncated" and cut["evidence"]["content_complete"] is True, cut

    proxy.upstream.add("br-short-other", Script(body, **script))
    with pytest.raises(httpx.RemoteProtocolError):  # this client checks the length too, but is not known to
        httpx.post(f"{proxy.url}/s/br-short-other/model/anthropic.claude-test-v1:0/invoke-with-response-stream",
                   content=b"{}", headers={"user-agent": "in-house-gateway/2.1"}, timeout=30)
    other = find_recording(proxy.record_dir, "br-short-other").verdict
    assert other["kind"] == "unknown" and "in-house-gateway/2.1" in other["reason"], other
    assert other["evidence"]["content_length_short"] is True and other["evidence"]["was"] == "complete"
