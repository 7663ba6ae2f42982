"""Recordings: one JSONL file per flow, rebuilt byte-exact, secrets redacted.

The format is described in docs/recording-format.md.
"""

from .header import flow_header
from .reader import (
    MAX_LINE_BYTES,
    Frame,
    HeaderCut,
    NetworkReads,
    Recording,
    RecordingCheck,
    RecordingLines,
    check_recording,
    open_recording,
    read_recording,
    shown_path,
)
from .redact import REDACTED, SECRET_HEADERS, SECRET_QUERY, redact_header_value, redact_headers, redact_url
from .writer import (
    FORMAT,
    FSYNC_POLICIES,
    PARTIAL_SUFFIX,
    RecordingBusy,
    RecordingError,
    RecordingWriter,
    SpanNotKept,
    describe,
    final_name,
    frame_sum,
    note_unfinished,
    partial_name,
    partial_recordings,
)

__all__ = [
    "FORMAT",
    "FSYNC_POLICIES",
    "MAX_LINE_BYTES",
    "PARTIAL_SUFFIX",
    "REDACTED",
    "SECRET_HEADERS",
    "SECRET_QUERY",
    "Frame",
    "HeaderCut",
    "NetworkReads",
    "Recording",
    "RecordingBusy",
    "RecordingCheck",
    "RecordingError",
    "SpanNotKept",
    "RecordingLines",
    "RecordingWriter",
    "check_recording",
    "describe",
    "final_name",
    "flow_header",
    "frame_sum",
    "note_unfinished",
    "open_recording",
    "partial_name",
    "partial_recordings",
    "read_recording",
    "redact_header_value",
    "redact_headers",
    "redact_url",
    "shown_path",
]
