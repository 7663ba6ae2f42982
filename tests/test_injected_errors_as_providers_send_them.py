"""Injected errors and refusals as each provider's own SDK reads them, against `streamtap serve`:
a Responses error in OpenAI's nested shape, then ``response.failed`` (the openai SDK raises); a
Gemini SSE error in Gemini's shape with no ``[DONE]``; each Bedrock operation takes the exceptions
of its own botocore union; the 404 and 400 bodies carry the top-level ``message`` and ``__type``
botocore reads, and the 404's log line its reason; a body value that differs only in number form
is named in ``differs_in``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import shared_path
from replay_streams import OPENAI_REQUEST, bedrock_invoke_frames, openai_chat_frames, write_recording

from streamtap.providers import analyze_bytes
from streamtap.providers.turn import VerdictKind
from streamtap.recording import RecordingWriter
from streamtap.replay.faults import LiveFaults, parse_faults, plan
from streamtap.replay.source import load_source
from streamtap.wire import EventStreamDecoder, SSEDecoder

STREAMTAP = [sys.executable, "-c", "import sys; from streamtap.cli import main; sys.exit(main())"]
# captures under ../shared/fixtures (a test that needs one skips, saying why, where it is absent)
RESPONSES_BODY = "pydantic-ai/bodies/openai-responses/test_openai_responses_stream.0.sse"
RESPONSES_ERROR = "vercel-ai/openai/responses/openai-error.1.chunks.txt"
GEMINI_BODY = "pydantic-ai/bodies/google/test_google_model_stream.0.sse"
CONVERSE_BODY = "openllmetry/bodies/converse_stream_anthropic_tool_use.0.bin"


def fixture(name: str) -> Path:
    return shared_path("fixtures", name)

RESPONSES_REQUEST = {"model": "gpt-4o", "stream": True, "input": "Capital of France?"}
CONVERSE_MODEL = "anthropic.claude-test"
CONVERSE_REQUEST = {"messages": [{"role": "user", "content": [{"text": "Capital of France?"}]}]}
GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse"
BEDROCK = "https://bedrock-runtime.us-east-1.amazonaws.com"


def record(path: Path, body: bytes, url: str, request: dict, wire: str, dialect: str, content_type: str) -> Path:
    """``body`` (a capture) as the recorded answer to ``request``, one read per event."""
    writer = RecordingWriter(path)
    writer.header(
        {
            "request": {"method": "POST", "url": url, "headers": [["content-type", "application/json"]], "body": request},
            "response": {"status": 200, "headers": [["content-type", content_type]]},
            "dialect": dialect,
            "wire": {"format": wire, "content_encoding": None},
        }
    )
    decoder = EventStreamDecoder() if wire == "eventstream" else SSEDecoder()
    for i, event in enumerate([*decoder.feed(body), *decoder.close()]):
        writer.read(event.raw, float(i))
        writer.frame(event, float(i))
    writer.finish({"stream_end": "finished"})
    return path


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("recordings")
    record(folder / "responses.jsonl", fixture(RESPONSES_BODY).read_bytes(), "https://api.openai.com/v1/responses",
           RESPONSES_REQUEST, "sse", "openai-responses", "text/event-stream")
    record(folder / "gemini.jsonl", fixture(GEMINI_BODY).read_bytes(), GEMINI_URL,
           {"contents": [{"role": "user", "parts": [{"text": "Capital of France?"}]}]}, "sse", "gemini", "text/event-stream")
    record(folder / "converse.jsonl", fixture(CONVERSE_BODY).read_bytes(), f"{BEDROCK}/model/{CONVERSE_MODEL}/converse-stream",
           CONVERSE_REQUEST, "eventstream", "bedrock-converse", "application/vnd.amazon.eventstream")
    write_recording(folder / "invoke.jsonl", "bedrock", bedrock_invoke_frames())
    write_recording(folder / "chat.jsonl", "openai", openai_chat_frames(), request=OPENAI_REQUEST | {"temperature": 1})
    return folder


class Serve:
    """`streamtap serve --fault-header` on a free loopback port; its log goes to a file."""

    def __init__(self, recordings: Path, log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen([*STREAMTAP, "serve", "--fault-header", str(recordings)],
                                            stdout=subprocess.PIPE, stderr=log, text=True)
        self.url = self.process.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), log_path.read_text()

    def log_line(self, says: str) -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for line in self.log_path.read_text().splitlines():
                if says in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no log line with {says!r}:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def serve(recordings, tmp_path_factory):
    server = Serve(recordings, tmp_path_factory.mktemp("serve") / "serve.log")
    yield server
    server.stop()


def sse_payloads(body: bytes) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    return [(event.event, event.data) for event in [*decoder.feed(body), *decoder.close()]]


def live_body(source, spec: str, chunk: int = 7) -> bytes:
    faults = LiveFaults(parse_faults(spec), source.wire, source.dialect)
    out = []
    for i in range(0, len(source.body), chunk):
        out += faults.feed(source.body[i : i + chunk])
    return b"".join(out + faults.close())


def serve_at_start(fault: str, recording: Path) -> tuple[int, str]:
    """``streamtap serve --fault FAULT RECORDING``'s exit code and stderr: a fault it should refuse
    before serving (one it serves instead is stopped after 30 s)."""
    process = subprocess.Popen([*STREAMTAP, "serve", "--port", "0", "--fault", fault, str(recording)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # it started serving the fault instead of refusing it
        process.kill()
        _, stderr = process.communicate()
    return process.returncode, stderr


def _bedrock(url: str, fault: str | None = None):
    import boto3
    from botocore.config import Config

    client = boto3.client("bedrock-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="AKIDTEST",
                          aws_secret_access_key="secret", config=Config(retries={"max_attempts": 0}))
    if fault:
        client.meta.events.register("before-send.*", lambda request, **kw: request.headers.__setitem__("x-streamtap-fault", fault))
    return client


# --- 1. Responses: the nested error, then response.failed -----------------------------------


def test_the_injected_responses_error_takes_openais_recorded_shape(recordings):
    source = load_source(recordings / "responses.jsonl")
    spec = "error:kind=openai,after=3,message=boom"
    body = plan(source, parse_faults(spec)).body
    (error_event, error_data), (failed_event, failed_data) = sse_payloads(body)[-2:]
    error, failed = json.loads(error_data), json.loads(failed_data)
    real_error, real_failed = (json.loads(line) for line in fixture(RESPONSES_ERROR).read_text().splitlines()[2:4])
    assert (error_event, failed_event) == ("error", "response.failed")
    assert error.keys() == real_error.keys() and error["error"].keys() == real_error["error"].keys()
    assert error["error"]["message"] == "boom" and error["sequence_number"] == 3 + 1
    assert failed["sequence_number"] == error["sequence_number"] + 1 and failed.keys() == real_failed.keys()
    assert failed["response"]["status"] == "failed" and failed["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert failed["response"]["id"] == json.loads(sse_payloads(source.body)[0][1])["response"]["id"]
    assert analyze_bytes(body, "openai-responses").verdict.kind is VerdictKind.ERRORED
    assert live_body(source, spec) == body  # the live fault writes the same bytes


def test_openai_sdk_raises_the_injected_responses_error(serve):
    import openai

    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="sk-test", max_retries=0,
                           default_headers={"x-streamtap-fault": "error:kind=openai,after=2,message=injected boom"})
    seen = []
    with pytest.raises(openai.APIError, match="injected boom"):
        for event in client.responses.create(**RESPONSES_REQUEST):
            seen.append(event.type)
    assert seen == ["response.created", "response.in_progress", "response.output_item.added"]


# --- 2. Gemini over SSE: Gemini's own error object, no [DONE] -----------------------------


def test_the_injected_gemini_sse_error_is_geminis_with_no_done(recordings):
    source = load_source(recordings / "gemini.jsonl")
    spec = "error:kind=openai,after=1,message=boom"
    body = plan(source, parse_faults(spec)).body
    last = body[len(b"".join(f.raw for f in source.frames[:2])) :]
    assert last == b'data: {"error":{"code":500,"message":"boom","status":"INTERNAL"}}\r\n\r\n'  # CRLF, as the recording's
    assert b"[DONE]" not in body
    assert analyze_bytes(body, "gemini").verdict.kind is VerdictKind.ERRORED
    assert live_body(source, spec) == body


# --- 2b. Chat Completions: no error after [DONE], where the openai SDK stops reading --------

CHAT_REQUEST = OPENAI_REQUEST | {"temperature": 1}  # the request chat.jsonl answers
DONE = len(openai_chat_frames()) - 1  # the event that is data: [DONE]


def test_openai_sdk_raises_an_error_injected_before_done_and_one_after_is_refused(serve):
    """An error after [DONE] was served: the openai SDK stops reading at [DONE] and returns the
    whole answer without raising, while the Tap judges the body errored. It is refused (a 400
    for the header, as for any fault that does not fit its recording); one before [DONE] raises."""
    import openai

    def chat(fault: str) -> str:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="sk-test", max_retries=0,
                               default_headers={"x-streamtap-fault": fault})
        return "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(**CHAT_REQUEST)
                       if chunk.choices)

    with pytest.raises(openai.APIError, match="injected boom"):
        chat(f"error:kind=openai,after={DONE - 1},message=injected boom")
    with pytest.raises(openai.BadRequestError) as raised:
        chat(f"error:kind=openai,after={DONE},message=injected boom")
    message = raised.value.body["message"]
    assert f"SDK stops reading at event {DONE} (data: [DONE])" in message and f"use after={DONE - 1} or earlier" in message


def test_serve_refuses_an_error_after_done_at_start_and_a_live_one_is_not_applied(recordings):
    spec = f"error:kind=openai,after={DONE}"
    returncode, stderr = serve_at_start(spec, recordings / "chat.jsonl")
    assert returncode == 2, stderr
    assert f"SDK stops reading at event {DONE} (data: [DONE])" in stderr, stderr
    # live traffic is not known at start: the fault is not applied, and the answer passes as it came
    source = load_source(recordings / "chat.jsonl")
    faults = LiveFaults(parse_faults(spec), source.wire, source.dialect)
    body = b"".join([*faults.feed(source.body), *faults.close()])
    faults.ended()
    assert body == source.body and faults.end is None
    assert faults.log == [f"not applied: {spec!r}: the openai-chat dialect's SDK stops reading at event {DONE} "
                          f"(data: [DONE]), so an error after it never reaches the app; use after={DONE - 1} or earlier"]


# --- 3. each Bedrock operation takes the exceptions of its own union ------------------------


def _union_exceptions(shape_name: str) -> set[str]:
    from botocore.loaders import Loader

    model = Loader().load_service_model("bedrock-runtime", "service-2")
    members = model["shapes"][shape_name]["members"]
    return {name for name, member in members.items() if model["shapes"][member["shape"]].get("exception")}


@pytest.mark.parametrize(
    "recording, union", [("converse.jsonl", "ConverseStreamOutput"), ("invoke.jsonl", "ResponseStream")]
)
def test_each_bedrock_operation_takes_exactly_its_unions_exceptions(recordings, recording, union):
    from streamtap.replay.faults import BEDROCK_EXCEPTIONS, FaultSpecError

    source = load_source(recordings / recording)
    accepted = set()
    for kind in BEDROCK_EXCEPTIONS:
        try:
            plan(source, parse_faults(f"error:kind={kind},after=1"))
            accepted.add(kind)
        except FaultSpecError:
            pass
    assert accepted == _union_exceptions(union)


def test_serve_refuses_model_timeout_on_a_converse_stream_at_start(recordings):
    returncode, stderr = serve_at_start("error:kind=modelTimeoutException,after=1", recordings / "converse.jsonl")
    assert returncode == 2, stderr
    assert "does not fit the bedrock-converse dialect; use one of " in stderr, stderr
    offered = stderr.partition("use one of ")[2].strip().split(", ")
    assert set(offered) == _union_exceptions("ConverseStreamOutput"), stderr  # no kind the operation lacks


# --- 4. the 404 and 400 reasons reach boto3, and the 404's log line ------------------------


def test_boto3_reads_the_reason_of_a_404(serve):
    from botocore.exceptions import ClientError

    other = [{"role": "user", "content": [{"text": "Capital of Spain?"}]}]
    with pytest.raises(ClientError) as raised:
        _bedrock(serve.url).converse_stream(modelId=CONVERSE_MODEL, messages=other)
    error = raised.value.response["Error"]
    assert error["Code"] == "streamtap_no_recording", error
    assert "no recording answers POST" in error["Message"] and "converse.jsonl (differs in body.messages)" in error["Message"]


def test_the_404_log_line_names_the_nearest_recording_and_how_it_differs(serve):
    r = httpx.post(serve.url + "/v1/responses", json=RESPONSES_REQUEST | {"input": "Capital of Peru?"}, timeout=10)
    assert r.status_code == 404
    line = serve.log_line("/v1/responses -> 404")
    assert "responses.jsonl (differs in body.input)" in line, line


def test_boto3_reads_the_reason_of_a_400_for_a_bad_fault_header(serve):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as raised:
        _bedrock(serve.url, "cut:evnt=3").converse_stream(modelId=CONVERSE_MODEL, messages=CONVERSE_REQUEST["messages"])
    error = raised.value.response["Error"]
    assert error["Code"] == "streamtap_bad_fault" and "cut takes" in error["Message"], error


def test_openai_and_anthropic_sdks_still_show_the_404_message(serve):
    import anthropic
    import openai

    with pytest.raises(openai.NotFoundError, match="no recording answers POST /v1/chat/completions") as raised:
        openai.OpenAI(base_url=serve.url + "/v1", api_key="sk-test", max_retries=0).chat.completions.create(
            model="gpt-other", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.type == "streamtap_no_recording"
    with pytest.raises(anthropic.NotFoundError, match="no recording answers POST /v1/messages") as raised:
        anthropic.Anthropic(base_url=serve.url, api_key="sk-ant-test", max_retries=0).messages.create(
            model="claude-other", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.body["error"]["type"] == "streamtap_no_recording"


# --- 5. a value that differs only in number form is named ----------------------------------


@pytest.mark.parametrize("change, field", [({"temperature": 1.0}, "body.temperature"), ({"stream": 1}, "body.stream")])
def test_a_number_form_difference_is_named_and_still_does_not_match(serve, change, field):
    same = httpx.post(serve.url + "/v1/chat/completions", json=OPENAI_REQUEST | {"temperature": 1}, timeout=10)
    assert same.status_code == 200
    r = httpx.post(serve.url + "/v1/chat/completions", json=OPENAI_REQUEST | {"temperature": 1} | change, timeout=10)
    assert r.status_code == 404  # what matches is unchanged: JSON text 1.0 is not the recorded 1
    nearest = r.json()["error"]["nearest"][0]
    assert nearest["recording"].endswith("chat.jsonl") and nearest["differs_in"] == [field], nearest
