"""Turns and verdicts: each provider's stream reassembled and judged (sans-IO).

The surface the addon, replay and CLI use::

    detection = detect_dialect(RequestInfo(method, url, headers, body), content_type)
    session = StreamSession(detection.dialect, detection.wire, http_status=200, sentinel=None)
    session.feed(chunk, t)            # -> the wire events this chunk completed
    analysis = session.close(end)     # -> .events, .turn, .verdict

plus ``analyze_bytes`` for a whole body, ``analyze_error_document`` for a body of only the
provider's error, ``sniff_dialect`` for raw files,
``compare_strands`` for two streams of the same turn and ``check_request`` for
request-side findings.
"""

from .detect import Detection, RequestInfo, answers_a_stream, detect_dialect, sniff_dialect
from .request import check_request
from .session import Analysis, StreamSession, analyze_bytes, analyze_error_document, sentinel_problem
from .strands import StrandComparison, compare_strands
from .turn import Block, BlockKind, Choice, Dialect, StreamEnd, Timing, Turn, Usage, Verdict, VerdictKind

__all__ = [
    "Analysis",
    "Block",
    "BlockKind",
    "Choice",
    "Detection",
    "Dialect",
    "RequestInfo",
    "StrandComparison",
    "StreamEnd",
    "StreamSession",
    "Timing",
    "Turn",
    "Usage",
    "Verdict",
    "VerdictKind",
    "analyze_bytes",
    "analyze_error_document",
    "check_request",
    "compare_strands",
    "answers_a_stream",
    "detect_dialect",
    "sentinel_problem",
    "sniff_dialect",
]
