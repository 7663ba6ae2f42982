"""What streamtap reads off a mitmproxy flow: the request as detection sees it, whether the
flow is a streamed LLM answer (the live Tap and the capture importer ask the same), and
whether streamtap's own fault injection produced the answer.

The flow is used by duck typing (``request``/``response`` as mitmproxy has them), so this
module imports no mitmproxy.
"""

from __future__ import annotations

from typing import Any

from streamtap.providers import RequestInfo
from streamtap.providers.detect import is_llm_stream as _is_llm_stream


def request_info(flow: Any) -> RequestInfo:
    """The request as dialect detection sees it."""
    request = flow.request
    return RequestInfo(request.method, request.pretty_url, _headers(request.headers.fields), request.raw_content)


def _headers(fields: Any) -> dict[str, str]:
    """Header names in lower case, each with its values joined by ", ": what ``headers.items()``
    gives, read off the raw fields in one pass (``items()`` scans all of them for each name, ~20 µs a flow)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in fields:
        name = raw_name.decode("utf-8", "surrogateescape").lower()
        value = raw_value.decode("utf-8", "surrogateescape")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def is_llm_stream(flow: Any, request: RequestInfo | None = None) -> bool:
    """The flows tapped when ``streamtap_filter`` is empty (and imported by ``streamtap import``);
    ``request``: the flow's ``request_info``, where the caller has it already."""
    response = flow.response
    assert response is not None
    return _is_llm_stream(request or request_info(flow), response.headers.get("content-type"))


INJECTED = "streamtap_injected_fault"  # flow.metadata key: the live faults applied to this flow
INJECTED_HEADER = "x-streamtap-injected-fault"  # response header: the faults a replay server served with


def injected_fault(flow: Any) -> str | None:
    """The fault specs streamtap injected into this flow's answer (live, or by the replay server
    that answered it), joined with "; "; None for an answer as the upstream sent it."""
    specs = []
    response = flow.response
    if response is not None:
        specs += response.headers.get_all(INJECTED_HEADER)
    live = flow.metadata.get(INJECTED)
    if live:
        specs.append(live)
    return "; ".join(specs) or None
