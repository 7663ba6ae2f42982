"""The header line of a recording, from a mitmproxy flow (the live Tap and the capture importer).

The flow is used by duck typing (``request``/``response`` as mitmproxy has them), so this
module imports no mitmproxy; the writer redacts secrets when it writes the line.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from streamtap.providers import RequestInfo

from .content import decoded_body


RequestBody = tuple[bytes, str | None]  # as sent, and its Content-Encoding


def request_body(request: Any) -> RequestBody | None:
    """The request's body bytes as sent, or None when it has none: cheap, no decoding (on the
    proxy's loop, a small compressed body could take seconds and gigabytes to decode)."""
    raw = request.raw_content
    if not raw:
        return None
    return raw, request.headers.get("content-encoding")


def request_as_read(request: RequestInfo, body: RequestBody | None) -> RequestInfo:
    """The request as its server reads it, for detection: the body decoded from its
    Content-Encoding (gzip, say) where it can be, else as sent."""
    if body is None or not body[1]:
        return request
    return replace(request, body=decoded_body(*body) or request.body)


def request_body_fields(body: RequestBody | None) -> dict[str, Any]:
    """The header's ``body`` (the JSON it holds) or ``body_b64`` (a body that is not JSON)."""
    if body is None:
        return {}
    raw, encoding = body
    try:
        return {"body": orjson.loads(decoded_body(raw, encoding) or b"")}
    except Exception:  # not JSON, or not decoded (see decoded_body): the bytes as sent
        return {"body_b64": base64.b64encode(raw).decode("ascii")}


def flow_header(flow: Any, *, started: float | None, dialect: str | None, why: str | None,
                sentinel: str | None, wire_format: str | None, content_encoding: str | None,
                imported_from: Path | None = None, with_body: bool = True, url: str | None = None) -> dict[str, Any]:
    """The header fields, in the order the format lists them.

    ``sentinel`` is the one the verdict was judged with (``verify`` judges with it again);
    ``imported_from`` names the capture a recording was imported from. ``with_body=False``
    leaves the request body out, for the caller to add with ``request_body_fields`` (last in
    ``request``, where this puts it) somewhere other than the proxy's event loop: parsing a
    large prompt costs about a millisecond per MB. ``url``: the request's ``pretty_url``, where
    the caller has it already (mitmproxy builds it anew on each read)."""
    request, response = flow.request, flow.response
    body = request_body_fields(request_body(request)) if with_body else {}
    header: dict[str, Any] = {
        "flow_id": flow.id,
        "started": started,
        "request_started": request.timestamp_start,
    }
    if imported_from is not None:
        header["imported_from"] = str(imported_from)
    header["request"] = {
        "method": request.method,
        "url": request.pretty_url if url is None else url,
        "http_version": request.http_version,
        "headers": list(request.headers.items(multi=True)),
        **body,
    }
    header["response"] = {
        "status": response.status_code,
        "reason": response.reason,
        "http_version": response.http_version,
        "headers": list(response.headers.items(multi=True)),
    }
    header["dialect"] = dialect
    header["why"] = why
    header["sentinel"] = sentinel
    header["wire"] = {"format": wire_format, "content_encoding": content_encoding}
    return header
