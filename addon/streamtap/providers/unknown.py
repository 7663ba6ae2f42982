"""Streams of no known dialect: the framing is judged, the content is not.

Complete framing (every byte formed an event) still cannot say whether a model
finished, so the verdict is ``unknown``; a cut (a ``Tail``) or broken framing is judged
by the session as truncated or corrupt.
"""

from __future__ import annotations

from streamtap.wire import WireEvent

from .common import AssemblerBase
from .turn import Dialect, StreamEnd, Turn, Verdict, VerdictKind


class Assembler(AssemblerBase):
    dialect = Dialect.UNKNOWN

    def feed(self, event: WireEvent, t: float | None) -> None:
        self.seen(event)

    def finish(self, end: StreamEnd) -> tuple[Turn, Verdict]:
        if self.turn.events == 0:
            reason = "no complete event in the body"
            kind = VerdictKind.TRUNCATED if end is not StreamEnd.FINISHED else VerdictKind.UNKNOWN
        else:
            reason = f"framing complete ({self.turn.events} {self.wire} events); the dialect is unknown, so whether the model finished cannot be judged"
            kind = VerdictKind.UNKNOWN
        return self.turn, Verdict(kind, reason, self.last_seq, self.last_offset, {"end": end.value})
