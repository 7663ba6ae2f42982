"""Request-side findings: a tool result whose call is missing from the history.

That orphan is what makes a provider reject a resumed or edited conversation
("tool_result block(s) without a corresponding tool_use"). Each finding is one line
naming the id and where it sits in the request body.

And what the request says of its answer's start (``may_resume``), and of the client that reads
the answer (``user_agent``, ``takes_a_short_body_whole``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from .detect import RESPONSES_PATH
from .turn import Dialect


def may_resume(method: str | None, url: str | None) -> bool:
    """Could the answer to a request (its method and URL) start after its first events? An OpenAI
    Responses retrieve (``GET /v1/responses/{id}?stream=true&starting_after=N``) replays from event
    N+1; a create (``POST /v1/responses``) streams from ``response.created``. False only for a
    create: any other request, or one not known, may be such a replay (StreamSession's ``may_resume``)."""
    if not method or not url or method.upper() != "POST":
        return True
    try:
        path = urlsplit(url).path.rstrip("/")
    except ValueError:  # a URL detection cannot read either
        return True
    found = RESPONSES_PATH.search(path)
    return found is None or found.group(1) is not None


def check_request(dialect: Dialect | str, body_json: Any) -> list[str]:
    dialect = Dialect(dialect)
    if not isinstance(body_json, dict):
        return []
    walker = _WALKERS.get(dialect)
    if walker is None:
        return []
    findings, calls = [], set()
    for kind, call_id, where in walker(body_json):
        if isinstance(call_id, list | dict):  # JSON's unhashable values: no real id is one, but a set needs a key
            call_id = repr(call_id)
        if kind == "call":
            calls.add(call_id)
        elif call_id not in calls:
            label = _RESULT_NAME[dialect]
            findings.append(f"orphan {label} at {where}: call id {call_id!r} has no matching call earlier in the history")
    return findings


Item = tuple[str, Any, str]  # ("call" | "result", id, where)


def _dicts(value: Any) -> list[tuple[int, dict]]:
    return [(i, v) for i, v in enumerate(value) if isinstance(v, dict)] if isinstance(value, list) else []


def _anthropic(body: dict) -> Iterator[Item]:
    for mi, message in _dicts(body.get("messages")):
        for bi, block in _dicts(message.get("content")):
            if block.get("type") in ("tool_use", "server_tool_use", "mcp_tool_use"):
                yield "call", block.get("id"), ""
            elif block.get("type") == "tool_result":
                yield "result", block.get("tool_use_id"), f"messages[{mi}].content[{bi}]"


def _openai_chat(body: dict) -> Iterator[Item]:
    for mi, message in _dicts(body.get("messages")):
        for _, call in _dicts(message.get("tool_calls")):
            yield "call", call.get("id"), ""
        if message.get("role") == "tool":
            yield "result", message.get("tool_call_id"), f"messages[{mi}]"


def _openai_responses(body: dict) -> Iterator[Item]:
    if body.get("previous_response_id") or body.get("conversation"):
        return  # the history lives on the server: nothing to check here
    items = body.get("input")
    for ii, item in _dicts(items):
        kind = item.get("type")
        if kind == "item_reference" or (kind is None and "id" in item and "role" not in item):
            return  # a stored item, a call perhaps, whose call_id is on the server: later results cannot be checked
        if not isinstance(kind, str):
            continue
        if kind.endswith("_call") and item.get("call_id"):
            yield "call", item["call_id"], ""
        elif kind.endswith("_call_output"):
            yield "result", item.get("call_id"), f"input[{ii}]"


def _bedrock_converse(body: dict) -> Iterator[Item]:
    for mi, message in _dicts(body.get("messages")):
        for bi, block in _dicts(message.get("content")):
            if isinstance(block.get("toolUse"), dict):
                yield "call", block["toolUse"].get("toolUseId"), ""
            elif isinstance(block.get("toolResult"), dict):
                yield "result", block["toolResult"].get("toolUseId"), f"messages[{mi}].content[{bi}]"


def _gemini(body: dict) -> Iterator[Item]:
    for ci, content in _dicts(body.get("contents")):
        for pi, part in _dicts(content.get("parts")):
            call = part.get("functionCall")
            response = part.get("functionResponse")
            if isinstance(call, dict):
                yield "call", call.get("id") or call.get("name"), ""
                if call.get("id") and call.get("name"):
                    yield "call", call.get("name"), ""
            elif isinstance(response, dict):
                yield "result", response.get("id") or response.get("name"), f"contents[{ci}].parts[{pi}]"


def _ollama(body: dict) -> Iterator[Item]:
    for mi, message in _dicts(body.get("messages")):
        for _, call in _dicts(message.get("tool_calls")):
            function = call.get("function")
            if call.get("id"):
                yield "call", call["id"], ""
            yield "call", function.get("name") if isinstance(function, dict) else None, ""
        result_id = message.get("tool_call_id") or message.get("tool_name")
        if message.get("role") == "tool" and result_id:  # Ollama takes a tool message naming no call: none to miss
            yield "result", result_id, f"messages[{mi}]"


_WALKERS = {
    Dialect.ANTHROPIC: _anthropic,
    Dialect.BEDROCK_INVOKE: _anthropic,
    Dialect.OPENAI_CHAT: _openai_chat,
    Dialect.OPENAI_RESPONSES: _openai_responses,
    Dialect.BEDROCK_CONVERSE: _bedrock_converse,
    Dialect.GEMINI: _gemini,
    Dialect.OLLAMA: _ollama,
}

_RESULT_NAME = {
    Dialect.ANTHROPIC: "tool_result",
    Dialect.BEDROCK_INVOKE: "tool_result",
    Dialect.OPENAI_CHAT: "tool message",
    Dialect.OPENAI_RESPONSES: "function_call_output",
    Dialect.BEDROCK_CONVERSE: "toolResult",
    Dialect.GEMINI: "functionResponse",
    Dialect.OLLAMA: "tool message",
}


def user_agent(request: dict[str, Any] | None) -> str | None:
    """The User-Agent of a request as a recording's header keeps it (``headers``: [name, value]
    pairs, or a name -> value map as dialect detection reads them)."""
    headers = (request or {}).get("headers") if isinstance(request, dict) else None
    pairs = headers.items() if isinstance(headers, dict) else headers if isinstance(headers, list) else ()
    for pair in pairs:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and str(pair[0]).lower() == "user-agent":
            return str(pair[1])
    return None


def takes_a_short_body_whole(agent: str | None) -> bool | None:
    """Does the client (by its User-Agent) take a body that stops short of its Content-Length for
    its end? True for botocore (boto3: urllib3 with ``enforce_content_length`` off); False for
    the anthropic SDK's Bedrock client, which reads with httpx and raises; None for any other
    client, or none named: not known."""
    if not agent:
        return None
    lowered = agent.lower()
    if "botocore/" in lowered and "aiobotocore/" not in lowered:
        return True
    if lowered.startswith("anthropicbedrock/"):
        return False
    return None
