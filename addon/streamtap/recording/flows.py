"""What streamtap reads off a mitmproxy flow: the request as detection sees it, whether its
answer can be a turn at all and whether the flow is a streamed LLM answer, which side ended it
(the live Tap and the capture importer ask the same), and whether streamtap's own fault
injection produced the answer.

The flow is used by duck typing (``request``/``response`` as mitmproxy has them), so this
module imports no mitmproxy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from streamtap.providers import RequestInfo, StreamEnd
from streamtap.providers.detect import wire_from_content_type
from streamtap.providers.detect import is_llm_stream as _is_llm_stream

from .content import decoded_body

# A compressed request body is decoded to read its "stream" on the proxy's loop only up to this:
# a few milliseconds of gzip at most, for a request that is rare (no SDK compresses by default)
STREAM_FLAG_DECODED_UP_TO = 1 << 20


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
    request = request or request_info(flow)
    content_type = response.headers.get("content-type")
    coding = request.headers.get("content-encoding")
    if coding and request.body and wire_from_content_type(content_type) in (None, "json-array"):  # no stream
        # an answer that is no stream (an HTTP error) is tapped when the request asked for one: its
        # "stream" is read decoded, or the errors of compressed streaming calls would go unseen
        decoded = decoded_body(request.body, coding, STREAM_FLAG_DECODED_UP_TO)
        if decoded is not None:
            request = replace(request, body=decoded)
    return _is_llm_stream(request, content_type)


def may_have_body(flow: Any) -> bool:
    """Whether the flow's answer can be a turn to judge, whatever chooses the flows (the Tap's
    filter, import's ``--filter``): a HEAD request's answer and 1xx, 204 and 304 answers have no
    body (RFC 9110), and a redirect's body is no answer (the client follows it, to a flow of its
    own). Asked by the Tap at every response's headers: it reads no header."""
    status = flow.response.status_code if flow.response else 0
    return flow.request.method != "HEAD" and status >= 200 and status not in (204, 304) and not 300 <= status < 400


INJECTED = "streamtap_injected_fault"  # flow.metadata key: the live faults applied to this flow
INJECTED_END = "streamtap_injected_end"  # flow.metadata key: the style of the cut streamtap's live fault made
INJECTED_HEADER = "x-streamtap-injected-fault"  # response header: the faults a replay server served with


def injected_fault(flow: Any) -> str | None:
    """The fault specs streamtap injected into this flow's answer (live, or by the replay server
    that answered it), joined with "; "; None for an answer as the upstream sent it."""
    specs = []
    response = flow.response
    if response is not None:
        specs += map(unquote, response.headers.get_all(INJECTED_HEADER))  # the replay server percent-encodes it
    live = flow.metadata.get(INJECTED)
    if live:
        specs.append(live)
    return "; ".join(specs) or None


def closed_when_saved(conn: Any) -> bool:
    """Whether a connection of a flow read from a capture had closed. A capture keeps each
    connection's end time but not its state (mitmproxy does not save it: every loaded connection
    reads CLOSED), so only the end time tells."""
    return conn.timestamp_end is not None


def answered_end(flow: Any) -> StreamEnd:
    """How a flow whose response ended without an error ended. A live abort or reset stands in for
    the upstream's end even when the upstream's own end came right after it (a clean cut is the
    clean end the client got)."""
    return StreamEnd.UPSTREAM_RESET if flow.metadata.get(INJECTED_END) not in (None, "clean") else StreamEnd.FINISHED


# mitmproxy's messages for the ends it makes itself: a kill (mitmweb's button, an addon's
# flow.kill()), and a body past its body_size_limit option (mitmproxy.flow.Error.KILLED_MESSAGE and
# the HTTP layer's wording; this module imports no mitmproxy)
KILLED = "Connection killed."
_OVER_LIMIT = "body exceeds mitmproxy's body_size_limit."
# mitmproxy's error for the streams of a connection whose peer sent GOAWAY: with NO_ERROR the peer
# lets the streams under way finish, but mitmproxy closes the connection on any GOAWAY
_GRACEFUL_GOAWAY = re.compile(r"HTTP/2 connection closed: <ConnectionTerminated error_code:(?:0|ErrorCodes\.NO_ERROR),")


def _cannot_tell(flow: Any) -> bool | None:
    return None


def ended_by(flow: Any, message: str, closed: Callable[[Any], bool] = closed_when_saved,
             client_reset: Callable[[Any], bool | None] = _cannot_tell) -> StreamEnd:
    """Which side ended a flow that errored. mitmproxy's error does not say, so read the signs:
    its HTTP/1 message names the client; an HTTP/2 stream reset (mitmproxy words it "reset by
    client" for either side) where one side only speaks HTTP/2 was that side's, and with HTTP/2 on
    both sides the side ``client_reset`` names; otherwise the side whose connection closed first;
    for a reset with HTTP/2 on both sides that nothing else tells, the code: clients cancel with
    CANCEL, servers cut with other codes (RFC 9113 lets either side use any code: a guess).

    ``closed(conn)``: whether that connection had closed when the flow errored; the live Tap
    reads the connection's state, a capture only has ``closed_when_saved``. ``client_reset(flow)``:
    whether the client reset the flow's HTTP/2 stream, None when that cannot be read (a capture
    keeps no stream state)."""
    if flow.metadata.get(INJECTED_END):  # streamtap cut it, standing in for the upstream, whatever the protocol shows
        return StreamEnd.UPSTREAM_RESET
    if message == KILLED or message.endswith(_OVER_LIMIT) or _GRACEFUL_GOAWAY.search(message):  # the proxy's own doing
        return StreamEnd.PROXY_ENDED
    text = message.lower()
    if "client disconnected" in text:
        return StreamEnd.CLIENT_ABORTED
    client_h2, server_h2 = flow.client_conn.alpn == b"h2", flow.server_conn.alpn == b"h2"
    one_side_h2 = client_h2 != server_h2
    if "stream reset" in text and one_side_h2:
        # only HTTP/2 resets a stream: the side that speaks it did (mitmproxy then closes the
        # HTTP/1 side to cancel it, which the closed connections below would blame)
        return StreamEnd.CLIENT_ABORTED if client_h2 else StreamEnd.UPSTREAM_RESET
    if "stream reset" in text and client_h2 and server_h2:
        by_client = client_reset(flow)
        if by_client is not None:
            return StreamEnd.CLIENT_ABORTED if by_client else StreamEnd.UPSTREAM_RESET
    client_closed = closed(flow.client_conn)
    server_closed = closed(flow.server_conn)
    if client_closed != server_closed:
        return StreamEnd.CLIENT_ABORTED if client_closed else StreamEnd.UPSTREAM_RESET
    if "stream reset" in text:
        return StreamEnd.CLIENT_ABORTED if "(cancel)" in text else StreamEnd.UPSTREAM_RESET
    if text.startswith("peer closed connection") and "protocol error" not in text and one_side_h2:
        # only mitmproxy's HTTP/2 layer words a closed connection so (HTTP/1's names the message body),
        # and by the error hook both connections read closed: the side that speaks HTTP/2 closed
        return StreamEnd.CLIENT_ABORTED if client_h2 else StreamEnd.UPSTREAM_RESET
    return StreamEnd.UPSTREAM_RESET


def stream_end(flow: Any, closed: Callable[[Any], bool] = closed_when_saved) -> tuple[StreamEnd, str | None]:
    """How the flow's stream ended, and mitmproxy's error message when it ended in one."""
    if flow.error is None:
        return answered_end(flow), None
    message = flow.error.msg
    return ended_by(flow, message, closed), message
