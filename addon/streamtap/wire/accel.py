"""The decoders' compiled loops (``_accel.c``), and the compiled bases that give each decoder
its ``feed`` for reads that complete no event, when this install has them.

All are optional: a build without a C compiler leaves them out, and
``STREAMTAP_PURE_PYTHON=1`` (any value but empty, 0, false, no or off) makes every decoder
run its Python loops instead (for debugging, and for tests that compare the two).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import GetSetDescriptorType, MemberDescriptorType

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


def copied_with(base: type) -> tuple[Callable, Callable]:
    """``__getstate__`` and ``__setstate__`` for a decoder derived from the compiled ``base``:
    ``copy.deepcopy`` (fault positions and prefix probes copy sessions mid-stream) sees only
    ``__dict__``, and the base keeps its fields outside it. The fields are read off the base
    itself, so one the C code adds is copied too; on ``object`` there are none."""
    fields = tuple(
        name for name, value in vars(base).items()
        if not name.startswith("__") and isinstance(value, (MemberDescriptorType, GetSetDescriptorType))
    )  # fmt: skip

    def getstate(self) -> tuple:
        return self.__dict__, tuple(getattr(self, name) for name in fields)

    def setstate(self, state: tuple) -> None:
        attributes, values = state
        for name, value in zip(fields, values, strict=True):
            setattr(self, name, value)
        self.__dict__.update(attributes)

    return getstate, setstate
