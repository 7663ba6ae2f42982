"""The decoders' compiled loops (``_accel.c``), when this install has them.

Both loops are optional: a build without a C compiler leaves them out, and
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
    from ._accel import eventstream_known_frames, sse_lf_events
except ImportError:
    eventstream_known_frames = sse_lf_events = None

compiled = sse_lf_events is not None
