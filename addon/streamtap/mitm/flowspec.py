"""What the Tap takes of a flow when its response headers arrive, for a tap in this process or
in an analysis worker.

A module of its own: ``mitmdump -s .../streamtap/mitm/tap.py`` executes tap.py as a script that
is not registered in ``sys.modules``, where a dataclass cannot be defined.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import http

from streamtap.providers import detect_dialect
from streamtap.recording import flow_header
from streamtap.recording.header import RequestBody, request_body, request_body_fields
from streamtap.recording.flows import request_info


@dataclass
class FlowSpec:
    """What streamtap needs of a flow to tap it, taken on the proxy side once, when its response
    headers arrive: it crosses to a worker process, so it holds no mitmproxy objects."""

    flow_id: str
    started: float  # wall clock when the tap started
    status: int
    encoding: str | None
    sentinel: str | None
    detection: Any = None  # providers.Detection, None when detection failed
    header: dict[str, Any] | None = None  # the recording's header, None when it could not be made
    # the request body, not yet parsed into the header: see complete_header()
    body: RequestBody | None = None
    errors: list[tuple[str, str]] = field(default_factory=list)  # (part, message) of what failed here

    @classmethod
    def of(cls, flow: http.HTTPFlow, sentinel: str | None) -> FlowSpec:
        response = flow.response
        assert response is not None
        spec = cls(flow.id, time.time(), response.status_code, response.headers.get("content-encoding"), sentinel)
        try:
            spec.detection = detect_dialect(request_info(flow), response.headers.get("content-type"))
        except Exception as exc:
            spec.errors.append(("analysis", described(exc)))
        detection = spec.detection
        try:
            spec.header = flow_header(
                flow,
                started=spec.started,
                dialect=detection.dialect.value if detection else "unknown",
                why=detection.why if detection else None,
                wire_format=detection.wire if detection else None,
                content_encoding=spec.encoding or None,
                sentinel=sentinel,
                with_body=False,
            )
            spec.body = request_body(flow.request)
        except Exception as exc:
            spec.errors.append(("recording", described(exc)))
        return spec

    def complete_header(self) -> dict[str, Any] | None:
        """The header with the request body parsed into it. Called where the flow is analysed
        (a worker), not on the proxy's loop: a spec crosses to the worker with the body as bytes,
        which cost a copy, not a parse and the pickling of a large parsed prompt."""
        if self.header is not None and self.body is not None:
            self.header["request"].update(request_body_fields(self.body))
            self.body = None
        return self.header


def described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
