"""The decoders' compiled loops (``_accel.c``), and the compiled bases that give each decoder
its ``feed`` for reads that complete no event, when this install has them.

All are optional: a build without a C compiler leaves them out, and
``STREAMTAP_PURE_PYTHON=1`` (any value but empty, 0, false, no or off) makes every decoder
run its Python loops instead (for debugging, and for tests that compare the two).
"""

from __future__ import annotations

import os

# any STREAMTAP_PURE_PYTHON but empty, 0, false, no or off asks for the Python loops
pure_python_asked = os.environ.get("STREAMTAP_PURE_PYTHON", "").strip().lower() not in ("", "0", "false", "no", "off")

try:
    if pure_python_asked:
        raise ImportError("STREAMTAP_PURE_PYTHON is set")
    from ._accel import EventStreamFeed, SSEFeed, eventstream_known_frames, sse_lf_events
except ImportError:
    eventstream_known_frames = sse_lf_events = None
    SSEFeed = EventStreamFeed = object  # the decoders then define feed in Python

compiled = sse_lf_events is not None
