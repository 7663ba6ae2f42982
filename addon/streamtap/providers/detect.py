"""Which dialect and wire a response speaks.

``detect_dialect`` decides from the request (host, path, query, the body's ``stream``
flag) and the response content-type, never from body text alone. ``sniff_dialect`` is
for raw files that come without a request; callers must say that they sniffed.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import orjson

from streamtap.wire import EventStreamDecoder
from streamtap.wire.eventstream import MIN_MESSAGE_LENGTH, PRELUDE_LENGTH

from .turn import Dialect


@dataclass(slots=True)
class RequestInfo:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes | None = None


@dataclass(slots=True)
class Detection:
    dialect: Dialect
    wire: str  # "sse" | "eventstream" | "ndjson" | "json-array"
    why: str
    streaming: bool = True  # False when the request asked for a plain JSON answer


_CONTENT_TYPE_WIRE = {
    "text/event-stream": "sse",
    "application/vnd.amazon.eventstream": "eventstream",
    "application/x-ndjson": "ndjson",
    "application/ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "application/x-jsonlines": "ndjson",
}


def wire_from_content_type(content_type: str | None) -> str | None:
    if not content_type:
        return None
    mime = content_type.split(";")[0].strip().lower()
    if mime == "application/json":
        return "json-array"
    return _CONTENT_TYPE_WIRE.get(mime)


def _body_json(body: bytes | None) -> dict | None:
    if not body:
        return None
    try:
        value = orjson.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _split_url(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError:  # an unbalanced "[" or "]" in the host, which comes from the client's Host header
        return urlsplit(url.replace("[", "%5B").replace("]", "%5D"))


# Paths that answer chat.completion.chunk or text_completion chunks: Chat Completions, legacy Completions
# (/v1, and Azure OpenAI's /openai/deployments/{deployment} without /v1), Mistral FIM and agents,
# DeepSeek's FIM (/beta), and the un-versioned /completions a LiteLLM proxy serves at its root
CHAT_COMPLETIONS_PATH = re.compile(r"(^|/chat|/v1|/fim|/agents|/beta|/openai/deployments/[^/]+)/completions$")
# Responses: create at /responses, and retrieve (a stream resumed with ?stream=true) at /responses/{id}, whose
# ids are resp_... (resp-... at some gateways); any other /responses/<segment> is some other app's
RESPONSES_PATH = re.compile(r"/responses(/resp[_-][^/]+)?$")


def _not_an_ollama_call(request: RequestInfo, body: dict | None) -> str:
    """Why a request to /api/chat or /api/generate is no call to Ollama ("" where it may be one).
    Every Ollama call is a POST whose JSON object names its model; where the body is not known
    (None: the proxy's first look, at the response headers) the method alone decides."""
    if request.body is None:
        return "" if request.method.upper() == "POST" else f"a {request.method} request, where Ollama answers POST"
    if not (body and isinstance(body.get("model"), str) and body["model"]):
        return "the request body is no JSON object naming a model, as every Ollama call's is"
    return ""


def _loads_the_model(path: str, body: dict | None) -> bool:
    """Ollama answers a generate call with no prompt, or a chat call with no messages, by loading the
    model (or unloading it, with keep_alive 0): one JSON object, "done_reason" "load" or "unload",
    whatever "stream" says (server/routes.go)."""
    if body is None:
        return False
    return not body.get("prompt") if path.endswith("/api/generate") else not body.get("messages")


def detect_dialect(request: RequestInfo | None, content_type: str | None) -> Detection:
    ct_wire = wire_from_content_type(content_type)
    ct_note = f"content-type {content_type.split(';')[0].strip()}" if content_type else "no content-type"
    if request is None:
        wire = ct_wire if ct_wire not in (None, "json-array") else "sse"
        return Detection(Dialect.UNKNOWN, wire, f"no request; {ct_note}", ct_wire not in (None, "json-array"))
    url = _split_url(request.url)
    host = (url.hostname or request.headers.get("host", "").rpartition("@")[2]).lower()  # (never its userinfo: "why" shows it)
    path = url.path.rstrip("/")
    # Google's servers decode the path before reading its ":method" suffix, so a client may send the colon as %3A
    google_path = unquote(path)
    query = parse_qs(url.query)
    body = _body_json(request.body)
    stream_flag = body.get("stream") if body else None

    def found(dialect: Dialect, wire: str, why: str, streaming: bool = True) -> Detection:
        return Detection(dialect, wire, f"{why}; {ct_note}", streaming)

    if path.endswith("/invoke-with-response-stream") and "/model/" in path:
        return found(Dialect.BEDROCK_INVOKE, "eventstream", f"path {path} (Bedrock InvokeModelWithResponseStream)")
    if path.endswith("/converse-stream") and "/model/" in path:
        return found(Dialect.BEDROCK_CONVERSE, "eventstream", f"path {path} (Bedrock ConverseStream)")
    if ":streamGenerateContent" in google_path:
        # Google reads the system parameter as `alt` or `$alt` (its REST client libraries send
        # `$alt=json;enum-encoding=int`); the media type is what comes before any ";"
        alt = (query.get("alt") or query.get("$alt") or [""])[0]
        sse = alt.split(";", 1)[0].strip() == "sse" or ct_wire == "sse"
        why = "path :streamGenerateContent" + (" with alt=sse" if sse else " without alt=sse (JSON array)")
        return found(Dialect.GEMINI, "sse" if sse else "json-array", why)
    # Mistral on Vertex AI streams chat chunks
    if ":streamRawPredict" in google_path and "/publishers/mistralai/" in google_path:
        return found(Dialect.OPENAI_CHAT, "sse", f"path {path} (Mistral on Vertex AI: Chat Completions chunks)")
    # the path, not the host, decides: api.anthropic.com also serves the OpenAI SDK compatibility
    # endpoint (base_url https://api.anthropic.com/v1/), which answers Chat Completions chunks
    # llama.cpp's server answers its own chunks (no choices, no [DONE]) at the root /completions too, asked
    # with no model; the OpenAI API, LiteLLM's among them, needs one. Without one it is no known API
    root_only = path == "/completions" and not (body and isinstance(body.get("model"), str) and body["model"])
    if CHAT_COMPLETIONS_PATH.search(path) and not root_only:
        return found(
            Dialect.OPENAI_CHAT, "sse", f"path {path} (OpenAI Chat Completions), stream={stream_flag}",
            stream_flag is True,
        )
    if RESPONSES_PATH.search(path):
        streaming = stream_flag is True or query.get("stream", [""])[0] == "true"
        return found(Dialect.OPENAI_RESPONSES, "sse", f"path {path} (OpenAI Responses), stream={stream_flag}", streaming)
    # the path decides on api.anthropic.com too: its legacy /v1/complete streams `completion` events, which
    # no Messages stream holds, and its other paths (count_tokens, batches, models) answer JSON
    anthropic_on_vertex = ":streamRawPredict" in google_path and "/publishers/anthropic/" in google_path
    if anthropic_on_vertex or path.endswith("/v1/messages"):
        return found(Dialect.ANTHROPIC, "sse", f"host {host}, path {path} (Anthropic Messages)", stream_flag is True)
    ollama_path = path.endswith("/api/chat") or path.endswith("/api/generate")
    not_ollama = ""
    if ollama_path:
        # Ollama answers NDJSON (JSON when not streaming or for an error). Other apps serve /api/chat too (the
        # Vercel AI SDK's useChat default) with SSE or plain text, which read as NDJSON would be called corrupt,
        # or with plain JSON, which read as NDJSON would be called cut
        if content_type and ct_wire not in ("ndjson", "json-array"):
            not_ollama = " (not Ollama, which never answers with this content-type)"
        elif reason := _not_an_ollama_call(request, body):
            not_ollama = f" (not Ollama: {reason})"
        elif _loads_the_model(path, body):
            what = "prompt" if path.endswith("/api/generate") else "messages"
            why = f"path {path} (Ollama native), a call with no {what}: Ollama only loads (or unloads) the model " \
                  "and answers one JSON object"
            return found(Dialect.OLLAMA, "ndjson", why, False)
        else:
            # Ollama streams unless the body says "stream": false
            return found(Dialect.OLLAMA, "ndjson", f"path {path} (Ollama native)", stream_flag is not False)
    wire = ct_wire if ct_wire not in (None, "json-array") else "sse"
    why = f"no known API at host {host} path {path}{not_ollama}"
    return found(Dialect.UNKNOWN, wire, why, ct_wire not in (None, "json-array"))


def answers_a_stream(detection: Detection, content_type: str | None) -> bool:
    """Is the answer a stream? The request asked for one, or the answer says it is one (a server
    that streams whatever the request said). A plain JSON answer (``"stream": false``) that a
    ``streamtap_filter`` taps is no stream to judge."""
    return detection.streaming or wire_from_content_type(content_type) not in (None, "json-array")  # JSON: a document


# --- which responses are streamed LLM answers ----------------------------------------------

STREAM_CONTENT_TYPES = tuple(_CONTENT_TYPE_WIRE)  # every NDJSON name too (application/ndjson, ...)
PROVIDER_HOSTS = re.compile(
    r"(^|\.)(api\.openai\.com|api\.anthropic\.com|openai\.azure\.com|generativelanguage\.googleapis\.com"
    r"|aiplatform\.googleapis\.com|amazonaws\.com|api\.mistral\.ai|api\.groq\.com|openrouter\.ai)$"
)


def is_llm_stream(request: RequestInfo, content_type: str | None) -> bool:
    """A streamed answer (by its content-type), or a streaming call to a known LLM API answered
    with something else, e.g. an HTTP error body (so that error is judged too)."""
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime in STREAM_CONTENT_TYPES:
        return True
    host = (_split_url(request.url).hostname or "").lower()
    if not PROVIDER_HOSTS.search(host) and mime not in ("", "application/json", "text/plain"):
        return False
    detection = detect_dialect(request, content_type)
    return detection.dialect is not Dialect.UNKNOWN and detection.streaming


# --- sniffing raw bodies -----------------------------------------------------------------

_SSE_FIELD = re.compile(rb"^(data|event|id|retry)?:", re.M)


def _eventstream_types(body: bytes) -> list[str] | None:
    """The ``:event-type`` values of the first messages, or None if this is not event-stream."""
    # the first prelude must pass the decoder's own checks (bounds and CRC); it reports a bad one at once
    if len(body) < MIN_MESSAGE_LENGTH or EventStreamDecoder().feed(body[:PRELUDE_LENGTH]):
        return None
    types, pos = [], 0
    while pos + PRELUDE_LENGTH <= len(body) and len(types) < 5:
        total, headers_len = struct.unpack(">II", body[pos : pos + 8])
        if total < MIN_MESSAGE_LENGTH or pos + total > len(body):
            break
        headers = body[pos + PRELUDE_LENGTH : pos + PRELUDE_LENGTH + headers_len]
        match = re.search(rb":(event|exception)-type\x07\x00(.)", headers, re.S)
        if match:
            n = match.group(2)[0]
            start = match.end()
            types.append(headers[start : start + n].decode("utf-8", "replace"))
        pos += total
    return types


# the names of the headers event-stream messages carry (the AWS SDK test vectors use a bare content-type),
# each as it is encoded: its length byte, the name, then the string type (7)
_EVENTSTREAM_HEADER = re.compile(
    rb"(\x0b:event-type|\x0d:message-type|\x0f:exception-type|\x0d:content-type|\x0ccontent-type)\x07"
)
_EVENT_TYPE_VALUE = re.compile(rb":(?:event|exception)-type\x07\x00(.)", re.S)
HEADER_SEARCH_BYTES = 512  # far more than the header block of any message a provider sends


def _damaged_eventstream_types(body: bytes) -> list[str] | None:
    """The ``:event-type`` of a first message whose prelude fails its checks, or None if the bytes
    after the prelude hold no event-stream header. Such a body is an event-stream whose first frame
    is damaged (corrupt), not something that was never a stream. The header block's length may be
    the damaged field, so its names are searched for instead of read."""
    if len(body) < MIN_MESSAGE_LENGTH:
        return None
    window = body[PRELUDE_LENGTH : PRELUDE_LENGTH + HEADER_SEARCH_BYTES]
    if not _EVENTSTREAM_HEADER.search(window):
        return None
    match = _EVENT_TYPE_VALUE.search(window)
    if match is None:
        return []
    start = match.end()
    return [window[start : start + match.group(1)[0]].decode("utf-8", "replace")]


def _eventstream_detection(types: list[str], damage: str) -> Detection:
    if "chunk" in types:
        return Detection(Dialect.BEDROCK_INVOKE, "eventstream", f"sniffed: event-stream with chunk frames{damage}")
    converse = {"messageStart", "contentBlockDelta", "contentBlockStart", "messageStop", "metadata"}
    if converse & set(types):
        why = f"sniffed: event-stream with ConverseStream events{damage}"
        return Detection(Dialect.BEDROCK_CONVERSE, "eventstream", why)
    return Detection(Dialect.UNKNOWN, "eventstream", f"sniffed: event-stream with unknown event types{damage}")


def _sse_payloads(body: bytes, limit: int = 8) -> tuple[list[str], list[str]]:
    events, datas = [], []
    for line in body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if line.startswith(b"event:"):
            events.append(line[6:].strip().decode("utf-8", "replace"))
        elif line.startswith(b"data:"):
            datas.append(line[5:].strip().decode("utf-8", "replace"))
            if len(datas) >= limit:
                break
    return events, datas


def _dialect_of_json(obj: object) -> tuple[Dialect, str] | None:
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type")
    if isinstance(kind, str):
        if kind.startswith("response.") or ("sequence_number" in obj and kind == "error"):
            numbered = " with sequence_number" if "sequence_number" in obj else ""
            return Dialect.OPENAI_RESPONSES, f"a Responses \"{kind}\" event{numbered}"
        if kind in ("message_start", "content_block_start", "content_block_delta", "message_delta", "ping"):
            return Dialect.ANTHROPIC, f"an Anthropic \"{kind}\" event"
    if obj.get("object") in ("chat.completion.chunk", "text_completion") or "choices" in obj:
        named = obj.get("object")
        return Dialect.OPENAI_CHAT, f"a {named}" if named in ("chat.completion.chunk", "chat.completion", "text_completion") else "an object with choices"
    if "candidates" in obj or "promptFeedback" in obj:
        return Dialect.GEMINI, "a Gemini GenerateContentResponse"
    if "done" in obj and ("message" in obj or "response" in obj):
        return Dialect.OLLAMA, "an Ollama object with done"
    return None


# dialects whose every stream is SSE (Gemini's JSON lines are read as its SSE; Ollama's are NDJSON)
SSE_ONLY_DIALECTS = (Dialect.ANTHROPIC, Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES)


def sniff_dialect(body: bytes) -> Detection:
    """Guess dialect and wire from the bytes alone (raw files with no request)."""
    types = _eventstream_types(body)
    if types is not None:
        return _eventstream_detection(types, "")
    damaged = _damaged_eventstream_types(body)
    if damaged is not None:
        return _eventstream_detection(damaged, " (the first message's prelude fails its checks)")
    head = body.lstrip()[:1]
    if head == b"[":
        element = _first_array_element(body)
        guess = _dialect_of_json(element)
        if guess and guess[0] is Dialect.GEMINI:
            return Detection(Dialect.GEMINI, "json-array", f"sniffed: JSON array of {guess[1]}s")
        return Detection(Dialect.UNKNOWN, "json-array", "sniffed: a JSON array")
    if _SSE_FIELD.search(body[:4096]):
        events, datas = _sse_payloads(body)
        for data in datas:
            if data == "[DONE]":
                continue
            try:
                guess = _dialect_of_json(orjson.loads(data))
            except ValueError:
                continue
            if guess:
                return Detection(guess[0], "sse", f"sniffed: SSE whose first recognisable data is {guess[1]}")
        return Detection(Dialect.UNKNOWN, "sse", "sniffed: SSE with no recognisable payload")
    first = body.lstrip().split(b"\n", 1)[0]
    try:
        guess = _dialect_of_json(orjson.loads(first))
    except ValueError:
        guess = None
    if guess and guess[0] in SSE_ONLY_DIALECTS:
        # no judge of these reads JSON lines (their SDKs read SSE only): judged as such, every line would
        # be dropped or called corrupt, and a body that ended cleanly with all its events called cut
        return Detection(Dialect.UNKNOWN, "ndjson", f"sniffed: NDJSON whose first line is {guess[1]}, but "
                         f"{guess[0].value} streams SSE, never NDJSON: its judge cannot read this body")
    if guess:
        return Detection(guess[0], "ndjson", f"sniffed: NDJSON whose first line is {guess[1]}")
    if head == b"{":
        return Detection(Dialect.UNKNOWN, "ndjson", "sniffed: JSON lines")
    return Detection(Dialect.UNKNOWN, "sse", "sniffed: nothing recognisable; reading as SSE")


def _first_array_element(body: bytes) -> object:
    """Decode the first element of a JSON array without trusting the rest of the body."""
    text = body.lstrip()[1:]
    depth, in_string, escape = 0, False, False
    for i, byte in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            depth += 1
        elif byte in (0x7D, 0x5D):
            depth -= 1
            if depth == 0:
                try:
                    return orjson.loads(text[: i + 1])
                except ValueError:
                    return None
    return None
