"""Thin mitmproxy adapters around the sans-IO core: one small addon class per feature.

The names below are imported when first asked for: an analysis worker imports
``streamtap.mitm.worker`` and with it this package, and needs none of mitmproxy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .flowtap import FlowTap
    from .tap import Tap

__all__ = ["FlowTap", "Tap"]


def __getattr__(name: str) -> Any:
    if name == "FlowTap":
        from .flowtap import FlowTap

        return FlowTap
    if name == "Tap":
        from .tap import Tap

        return Tap
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
