"""The header line of a recording, from a mitmproxy flow (the live Tap and the capture importer).

The flow is used by duck typing (``request``/``response`` as mitmproxy has them), so this
module imports no mitmproxy; the writer redacts secrets when it writes the line.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from streamtap.providers import RequestInfo
from streamtap.wire.partial_json import may_hold_long_integer

from .content import content_encoded, decoded_body


RequestBody = tuple[bytes, str | None]  # as sent, and its Content-Encoding

# The most bytes a request body takes in the header line per byte of its own: redacting a
# one-letter name (``streamtap_redact``) turns ``a=&`` (3 bytes) into ``a=%5Bredacted%5D&`` (17),
# and base64 (a body that is not JSON) adds 4/3. JSON written anew grows less: ``1e15,`` comes
# back as ``1000000000000000.0,`` (5 bytes to 19).
BODY_GROWTH = 17 / 3 * 4 / 3
# The largest request body a header keeps (decoded from its Content-Encoding: JSON, else its
# bytes); a larger one is kept as its length and hash. Grown by BODY_GROWTH it still leaves the
# header line under the format's MAX_LINE_BYTES (193 MiB) with room for the URL and headers, so
# verify reads it.
MAX_RECORDED_BODY = 24 * 1024 * 1024


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


def request_body_fields(body: RequestBody | None, limit: int = MAX_RECORDED_BODY) -> dict[str, Any]:
    """The header's ``body`` (the JSON it holds), ``body_b64`` (a body that is not JSON to orjson,
    decoded from its Content-Encoding, which ``body_decoded_from`` then names), or ``body_omitted``
    (its length and SHA-256 as sent): a body over ``limit`` bytes, or one whose coding could not be
    undone within them. Compressed bytes are never kept: redaction could not read the secrets in them."""
    if body is None:
        return {}
    raw, encoding = body
    decoded = decoded_body(raw, encoding, limit)  # (a body sent as is comes back whole, at any size)
    if decoded is not None and len(decoded) <= limit:
        try:
            value = orjson.loads(decoded)
            if may_hold_long_integer(decoded):
                # an integer past 64 bits, which orjson reads as a double (2**64 as 1.8e19), and cannot
                # write as it was: the bytes keep it as sent, as an app's json module reads it
                try:
                    orjson.dumps(json.loads(decoded))
                except orjson.JSONEncodeError:
                    raise orjson.JSONDecodeError("an integer past 64 bits", "", 0) from None
            return {"body": value}
        except orjson.JSONDecodeError:  # not JSON to orjson (an app's parser may take it): its bytes
            fields = {"body_b64": base64.b64encode(decoded).decode("ascii")}
            if content_encoded(encoding):
                fields["body_decoded_from"] = encoding
            return fields
    if content_encoded(encoding):
        reason = (f"the body's {encoding} content-encoding could not be undone within the {limit} bytes a "
                  "recording keeps of a request (an unknown coding, damaged bytes, or more once decoded)")
    else:
        reason = f"the body is larger than the {limit} bytes a recording keeps of a request"
    return {"body_omitted": {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "reason": reason}}


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
