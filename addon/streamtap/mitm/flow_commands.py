"""mitmproxy commands for tapped flows, as mitmproxy's own addons offer theirs: from the
mitmweb/mitmproxy command bar (``streamtap.verdict @focus``), key bindings, scripts
(``ctx.master.commands.call("streamtap.verdict", flows)``) and mitmweb's /commands API.

Each command takes flows (``@focus``, ``@marked``, ``@all``, a filter expression) and
returns one line per flow, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mitmproxy import command, flow

from streamtap.cli import terminal_safe

if TYPE_CHECKING:
    from streamtap.mitm.tap import Tap

NOT_TAPPED = "not tapped"
STREAMING = "streaming"
ANALYSING = "analysing"  # ended; its analysis worker has not sent the verdict yet


class FlowCommands:
    def __init__(self, tap: Tap) -> None:
        self.tap = tap

    @command.command("streamtap.verdict")
    def verdict(self, flows: Sequence[flow.Flow]) -> Sequence[str]:
        """Each flow's verdict and its reason ("complete: ...", "truncated: ..."), "streaming" while it streams, "analysing" until its worker's verdict arrives, "not tapped"."""
        lines = []
        analysing = self.tap.analysing
        for f in flows:
            summary = f.metadata.get("streamtap")
            if f.id in self.tap.open:
                lines.append(STREAMING)
            elif f.id in analysing:
                lines.append(ANALYSING)
            else:
                # the reason quotes the provider's error: a newline in it would make a line of its own
                lines.append(f"{summary['verdict']}: {terminal_safe(summary['reason'], one_line=True)}" if summary else NOT_TAPPED)
        return lines

    @command.command("streamtap.recording")
    def recording(self, flows: Sequence[flow.Flow]) -> Sequence[str]:
        """Each flow's recording path (a .partial.jsonl one while it streams), "" where none is kept or it is being analysed."""
        lines = []
        analysing = self.tap.analysing
        for f in flows:
            open_tap = self.tap.open.get(f.id)
            summary = f.metadata.get("streamtap")
            if open_tap is not None:
                lines.append(open_tap.partial_path() or "")
            elif f.id in analysing or not summary:
                lines.append("")
            else:
                lines.append(summary.get("recording") or "")
        return lines
