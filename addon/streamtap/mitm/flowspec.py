"""What the Tap takes of a flow when its response headers arrive, for a tap in this process or
in an analysis worker.

A module of its own: ``mitmdump -s .../streamtap/mitm/tap.py`` executes tap.py as a script that
is not registered in ``sys.modules``, where a dataclass cannot be defined.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from streamtap.providers import RequestInfo, answers_a_stream, detect_dialect
from streamtap.providers.model import model_of
from streamtap.recording import flow_header
from streamtap.recording.content import delimited_by_length
from streamtap.recording.header import RequestBody, request_as_read, request_body, request_body_fields
from streamtap.recording.flows import request_info

if TYPE_CHECKING:  # an analysis worker imports this module, and none of mitmproxy
    from mitmproxy import http


@dataclass
class FlowSpec:
    """What streamtap needs of a flow to tap it, taken on the proxy side once, when its response
    headers arrive: it crosses to a worker process, so it holds no mitmproxy objects.

    The proxy parses no JSON here (``is_llm_stream`` does, before, only for an answer that is
    not a stream, to see whether the request asked for one). The dialect follows from the URL
    and the content type; the request body only says whether the call asked for a stream, and
    goes into the recording's header. Both need the body parsed, which costs about a
    millisecond per MB of prompt (and as much again to pickle the parsed prompt), so
    ``complete()`` does it where the flow is analysed: in a worker, or in the proxy with
    ``streamtap_workers=0``."""

    flow_id: str
    started: float  # wall clock when the tap started
    status: int
    encoding: str | None
    sentinel: str | None
    detection: Any = None  # providers.Detection, None when detection failed
    header: dict[str, Any] | None = None  # the recording's header, None when it could not be made
    errors: list[tuple[str, str]] = field(default_factory=list)  # (part, message) of what failed here
    # what complete() needs: the request as detection sees it, the answer's content type, and
    # the request body as sent and decoded
    request: RequestInfo | None = None
    content_type: str | None = None
    body: RequestBody | None = None
    completed: bool = False
    requested_model: str | None = None  # set by complete(): the model the request names (body or URL)
    streamed: bool = True  # set by complete(): False for a plain JSON answer (providers.answers_a_stream)
    accept_encoding: str | None = None  # the request's: a coding it did not accept may be unreadable to the client
    length_framed: bool = False  # the body is delimited by its Content-Length (how a cut reaches the client)

    @classmethod
    def of(cls, flow: http.HTTPFlow, sentinel: str | None, request: RequestInfo | None = None) -> FlowSpec:
        """``request``: the flow's ``request_info``, where the caller has it already."""
        response = flow.response
        assert response is not None
        spec = cls(flow.id, time.time(), response.status_code, response.headers.get("content-encoding"), sentinel)
        spec.content_type = response.headers.get("content-type")
        spec.accept_encoding = flow.request.headers.get("accept-encoding")
        headers = response.headers
        spec.length_framed = delimited_by_length(headers.get("content-length"), headers.get("transfer-encoding"))
        try:
            spec.request = request or request_info(flow)
            spec.detection = detect_dialect(replace(spec.request, body=None), spec.content_type)
        except Exception as exc:
            spec.errors.append(("analysis", described(exc)))
        try:
            spec.header = flow_header(
                flow,
                started=spec.started,
                dialect=None,  # these three are set by complete()
                why=None,
                wire_format=None,
                content_encoding=spec.encoding or None,
                sentinel=sentinel,
                with_body=False,
                url=spec.request.url if spec.request else None,
            )
            spec.body = request_body(flow.request)
        except Exception as exc:
            spec.errors.append(("recording", described(exc)))
        return spec

    def request_body_apart(self) -> tuple[FlowSpec, bytes | None]:
        """This spec without its request body, and the body; (self, None) when it has none to
        part with. The body is one bytes object, held twice: as detection sees the request, and
        as the recording keeps it."""
        request, body = self.request, self.body
        if request is None or body is None or request.body is not body[0]:
            return self, None
        return replace(self, request=replace(request, body=None), body=(b"", body[1])), body[0]

    def take_request_body(self, raw: bytes) -> None:
        """The body ``request_body_apart`` took, back in place."""
        assert self.request is not None and self.body is not None
        self.request = replace(self.request, body=raw)
        self.body = (raw, self.body[1])

    def complete(self) -> None:
        """Detection with the request body, and the header with the detection and the body in
        it: once, where the flow is analysed."""
        if self.completed:
            return
        self.completed = True
        if self.detection is not None and self.request is not None:
            try:
                self.detection = detect_dialect(request_as_read(self.request, self.body), self.content_type)
                self.streamed = answers_a_stream(self.detection, self.content_type)
            except Exception as exc:
                self.detection = None
                self.errors.append(("analysis", described(exc)))
        try:
            body_fields = request_body_fields(self.body)
            self.requested_model = model_of(None, self.request.url if self.request else None, body_fields.get("body"))
        except Exception as exc:
            body_fields = {}
            self.errors.append(("recording", described(exc)))
        if self.header is not None:
            detection = self.detection
            self.header["dialect"] = detection.dialect.value if detection else "unknown"
            self.header["why"] = detection.why if detection else None
            self.header["wire"]["format"] = detection.wire if detection else None
            self.header["request"].update(body_fields)
            if not self.streamed:
                self.header["streamed"] = False
        self.request = self.body = None


def described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
